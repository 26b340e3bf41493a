#include "tests/soak/soak.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "services/rpc/auth.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/worker.grpc.pb.h"
#include "tests/soak/stack.h"
#include "tests/testutil/health.h"
#include "tests/testutil/testutil.h"

namespace strata::soak {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// A job takes a few seconds on 2 cores: long enough for faults to meet it
// mid-phase, mid-checkpoint and mid-gang.
constexpr int kIterations = 40;
constexpr int kCheckpointEvery = 4;
constexpr int kBatch = 4;
constexpr int kPpoEpochs = 2;  // the job spec's default
constexpr auto kTick = std::chrono::milliseconds(100);
constexpr auto kCallDeadline = std::chrono::seconds(5);
// A job still running when the drain ends is "progressing" if its
// iteration moved this recently.
constexpr auto kProgressWindow = std::chrono::seconds(60);
constexpr const char* kKeyPrefix = "strata:";  // RedisStoreOptions::key_prefix
constexpr const char* kBallast = ".soak-ballast";

const std::vector<std::string>& Kinds() {
  static const std::vector<std::string> kinds = {"sft", "reward_model", "remax", "grpo", "ppo"};
  return kinds;
}

// The nemesis's faults, and how often each comes up once every kind has
// had its turn.
const std::map<std::string, double>& FaultWeights() {
  static const std::map<std::string, double> weights = {{"kill -9 worker", 3},   {"kill -9 coordinator", 1},
                                                        {"kill -9 redis", 1},    {"pause worker", 2},
                                                        {"partition worker", 2}, {"full disk", 1}};
  return weights;
}

bool Retryable(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
         code == grpc::StatusCode::ABORTED || code == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t index = static_cast<size_t>(std::ceil(p * static_cast<double>(values.size()))) - 1;
  return values[std::min(index, values.size() - 1)];
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// One job as submitted (or to be submitted) by the stream.
struct Tracked {
  std::string request_id;
  std::string id;  // "" until the coordinator acknowledged it
  std::string kind;
  int ranks = 1;
  std::string output_dir;
  std::string continues;   // the cancelled job this one continues
  int64_t cancel_at = -1;  // cancel once it reached this iteration
  bool cancel_sent = false;
  bool continue_after_cancel = false;
  bool continuation_made = false;
  bool reference = false;  // a fault-free run, for comparison
  v1::Job last;
  Clock::time_point last_answer{};  // of the last GetJob that succeeded
  Clock::time_point last_progress = Clock::now();
  bool Ended() const { return !id.empty() && last.state() >= v1::SUCCEEDED; }
};

// A fault as dealt: the jobs it hit and when each moved again.
struct FaultEvent {
  std::string kind;
  int worker = -1;
  Clock::time_point start, hold_until;
  bool held = false;  // undone at hold_until (pause, partition, full disk)
  // Affected job -> its iteration once the fault struck: read right after
  // a worker fault, at the first answer after a control-plane one (before
  // it, the last poll may be an iteration or two behind). kUnknown until then.
  std::map<std::string, int64_t> baseline;
};
constexpr int64_t kUnknown = -1;

class Soak {
 public:
  explicit Soak(SoakOptions options) : options_(std::move(options)), rng_(options_.seed) {}

  absl::StatusOr<SoakReport> Run();

 private:
  absl::Status PrepareModel();
  absl::Status WaitUntilReady();
  // One pass of the loop: supervise, deal faults, stream jobs, poll them.
  void Tick(bool stream, bool faults);
  void DealFaults();
  void EndFault(FaultEvent& f);
  void Submit(Tracked& t);
  void Poll(Tracked& t);
  void TrackRecovery();
  std::vector<std::string> Overrides(const Tracked& t) const;
  std::string BaseSpec(const std::string& output_dir) const;
  Tracked& NewJob(const std::string& kind, int ranks, const std::string& output_dir);
  void WaitForIdleWorkers();
  void RunReferences();
  std::vector<Violation> Check();
  void Plant();
  grpc::Status Call(const std::string& method, const std::function<grpc::Status(grpc::ClientContext*)>& call);
  std::vector<std::string> RedisLines(const std::vector<std::string>& args) const;
  double Uniform(double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng_); }
  bool Chance(double p) { return Uniform(0, 1) < p; }
  std::string ReferenceDir(const std::string& kind, int ranks) const {
    return JoinPath(options_.dir, absl::StrCat("reference/", kind, "-", ranks));
  }

  SoakOptions options_;
  std::mt19937_64 rng_;
  std::unique_ptr<Stack> stack_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::string model_;
  std::vector<std::unique_ptr<Tracked>> jobs_;
  int next_job_ = 0;
  std::vector<FaultEvent> faults_;
  std::vector<std::string> first_round_;  // kinds not dealt yet, in the seed's order
  Clock::time_point next_fault_at_, faults_matter_until_;
  std::vector<std::string> api_errors_;
  SoakReport report_;
};

grpc::Status Soak::Call(const std::string& method, const std::function<grpc::Status(grpc::ClientContext*)>& call) {
  grpc::ClientContext context;
  services::AddBearer(&context, stack_->token());
  context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  const auto start = Clock::now();
  const grpc::Status status = call(&context);
  const double ms = 1e3 * Seconds(Clock::now() - start);
  const bool during_fault = start <= faults_matter_until_;
  for (ApiFigures* f : {&report_.api_all, during_fault ? &report_.api_during_faults : nullptr}) {
    if (f == nullptr) continue;
    ++f->calls;
    f->latency_ms.push_back(ms);
    // FAILED_PRECONDITION answers a cancel of a job that just ended, or a
    // continuation of one that has no checkpoint: a reply, not an outage.
    if (status.ok() || status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      ++f->ok;
    } else if (Retryable(status.error_code())) {
      ++f->retryable;
    } else {
      ++f->other;
    }
  }
  if (!status.ok() && !Retryable(status.error_code()) && status.error_code() != grpc::StatusCode::FAILED_PRECONDITION &&
      status.error_code() != grpc::StatusCode::NOT_FOUND) {
    api_errors_.push_back(absl::StrCat(method, ": code ", status.error_code(), ": ", status.error_message()));
  }
  return status;
}

absl::Status Soak::PrepareModel() {
  model_ = JoinPath(options_.dir, "model");
  testing::WriteTextFile(JoinPath(options_.dir, "config.json"), R"({"vocab_size": 259, "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "max_position_embeddings": 64, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})");
  auto init = testing::RunCommand({testing::StrataBinary(), "init-model", "--config",
                                   JoinPath(options_.dir, "config.json"), "--out", model_, "--seed", "3"});
  if (!init.ok()) return init.status();
  if (init->exit_code != 0) return absl::InternalError("strata init-model: " + init->error);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(testing::SourcePath(std::string("examples/tiny/data/") + f), JoinPath(model_, f),
                               std::filesystem::copy_options::overwrite_existing);
  }
  return absl::OkStatus();
}

absl::Status Soak::WaitUntilReady() {
  channel_ = grpc::CreateChannel(stack_->coordinator_address(), grpc::InsecureChannelCredentials());
  if (!channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30))) {
    return absl::UnavailableError("the coordinator did not come up:\n" + stack_->LogTail(2000));
  }
  stub_ = v1::Coordinator::NewStub(channel_);
  // A worker's health turns SERVING once it registered.
  for (int i = 0; i < stack_->workers(); ++i) {
    if (absl::Status s = testing::WaitUntilServing(stack_->worker_address(i), std::chrono::seconds(60)); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("worker ", i, ": ", s.message(), "\n", stack_->LogTail(2000)));
    }
  }
  return absl::OkStatus();
}

std::string Soak::BaseSpec(const std::string& output_dir) const {
  return absl::StrCat("algorithm: remax\nmodels:\n  actor: {path: ", model_,
                      "}\n  reward: {rule: vowel_fraction}\ndata:\n  train: ",
                      testing::SourcePath("examples/tiny/data/prompts.jsonl"),
                      "\n  max_prompt_tokens: 16\ntrain: {iterations: ", kIterations, ", batch_size: ", kBatch,
                      ", lr: 1.0e-3, seed: 5}\ngeneration: {max_new_tokens: 8}\ncheckpoint: {every: ", kCheckpointEvery,
                      "}\nmemory: {host_mib: 128}\noutput: {dir: ", output_dir, "}\n");
}

// The stream's five algorithms on the same small model; ReMax and PPO keep
// the actor's optimizer on NVMe, so a full disk meets real I/O.
std::vector<std::string> Soak::Overrides(const Tracked& t) const {
  std::vector<std::string> set = {"algorithm=" + t.kind};
  if (t.kind == "sft") set.push_back("data.train=" + testing::SourcePath("examples/tiny/data/sft.jsonl"));
  if (t.kind == "reward_model") {
    set.push_back("models.reward={path: " + model_ + "}");
    set.push_back("data.train=" + testing::SourcePath("examples/tiny/data/preferences.jsonl"));
  }
  if (t.kind == "ppo") set.push_back("models.critic={path: " + model_ + "}");
  if (t.kind == "remax" || t.kind == "ppo") set.push_back("models.actor.placement.optimizer=nvme");
  if (t.ranks > 1) set.push_back(absl::StrCat("parallel.workers=", t.ranks));
  return set;
}

Tracked& Soak::NewJob(const std::string& kind, int ranks, const std::string& output_dir) {
  auto t = std::make_unique<Tracked>();
  t->request_id = absl::StrFormat("soak-%d-%d", options_.seed, next_job_++);
  t->kind = kind;
  t->ranks = ranks;
  t->output_dir = output_dir;
  jobs_.push_back(std::move(t));
  return *jobs_.back();
}

void Soak::Submit(Tracked& t) {
  v1::SubmitJobRequest request;
  request.set_spec_yaml(BaseSpec(t.output_dir));
  for (const std::string& o : Overrides(t)) request.add_overrides(o);
  request.set_request_id(t.request_id);  // a retry after a lost reply returns the same job
  request.set_continue_job_id(t.continues);
  v1::Job job;
  const grpc::Status s = Call("SubmitJob", [&](grpc::ClientContext* c) { return stub_->SubmitJob(c, request, &job); });
  if (s.ok()) {
    t.id = job.id();
    t.last = job;
    t.last_progress = Clock::now();
    if (!t.reference) ++report_.submitted;
    if (!t.continues.empty()) ++report_.continued;
  } else if (!Retryable(s.error_code())) {
    // A continuation of a job that had no checkpoint yet is refused: the
    // stream moves on. Anything else was recorded by Call.
    report_.notes.push_back(absl::StrCat("submit ", t.request_id, " refused: ", s.error_message()));
    t.request_id.clear();
  }
}

void Soak::Poll(Tracked& t) {
  v1::GetJobRequest request;
  request.set_job_id(t.id);
  v1::Job job;
  if (!Call("GetJob", [&](grpc::ClientContext* c) { return stub_->GetJob(c, request, &job); }).ok()) return;
  if (job.iteration() != t.last.iteration() || job.state() != t.last.state()) t.last_progress = Clock::now();
  t.last = job;
  t.last_answer = Clock::now();
  if (t.cancel_at >= 0 && !t.cancel_sent && job.state() == v1::RUNNING && job.iteration() >= t.cancel_at) {
    v1::CancelJobRequest cancel;
    cancel.set_job_id(t.id);
    v1::Job cancelled;
    const grpc::Status s = Call("CancelJob",
                                [&](grpc::ClientContext* c) { return stub_->CancelJob(c, cancel, &cancelled); });
    if (s.ok() || s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) t.cancel_sent = true;
  }
}

void Soak::TrackRecovery() {
  const auto now = Clock::now();
  for (FaultEvent& f : faults_) {
    for (auto it = f.baseline.begin(); it != f.baseline.end();) {
      auto job = std::find_if(jobs_.begin(), jobs_.end(), [&](const auto& t) { return t->id == it->first; });
      if (job == jobs_.end()) {
        ++it;
        continue;
      }
      const Tracked& t = **job;
      if (it->second == kUnknown) {
        if (t.last_answer <= f.start) {
          ++it;
          continue;
        }
        it->second = t.last.iteration();
        // A job whose first answer after the fault is its end recovered
        // then: the drain may stop before another tick would see it.
        if (!t.Ended()) {
          ++it;
          continue;
        }
      }
      // Moved: an iteration completed after the fault (a resumed run
      // reports its checkpoint's iteration first, which differs too).
      if (t.Ended() || t.last.iteration() != it->second) {
        report_.faults[f.kind].recovery_seconds.push_back(Seconds(now - f.start));
        it = f.baseline.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void Soak::EndFault(FaultEvent& f) {
  if (!f.held) return;
  f.held = false;
  if (f.kind == "pause worker") stack_->ResumeWorker(f.worker);
  if (f.kind == "partition worker") (void)stack_->HealWorker(f.worker);
  if (f.kind == "full disk") (void)stack_->FreeDisk(f.worker);
  faults_matter_until_ = std::max(faults_matter_until_, Clock::now() + std::chrono::seconds(5));
}

void Soak::DealFaults() {
  const auto now = Clock::now();
  int held = 0;
  std::set<int> busy;
  for (FaultEvent& f : faults_) {
    if (f.held && now >= f.hold_until) EndFault(f);
    if (f.held) {
      ++held;
      busy.insert(f.worker);
    }
  }
  if (now < next_fault_at_ || held >= 2) return;
  next_fault_at_ = now +
                   std::chrono::milliseconds(static_cast<int64_t>(
                       1e3 * std::exponential_distribution<double>(1.0 / options_.mean_seconds_between_faults)(rng_)));
  auto available = [&](const std::string& kind) {
    if (kind == "partition worker") return stack_->network_isolated();
    if (kind == "full disk") return stack_->small_disks();
    return true;
  };
  std::string kind;
  while (!first_round_.empty() && kind.empty()) {
    if (available(first_round_.back())) kind = first_round_.back();
    first_round_.pop_back();
  }
  if (kind.empty()) {
    std::vector<std::string> kinds;
    std::vector<double> weights;
    for (const auto& [k, w] : FaultWeights()) {
      if (available(k)) {
        kinds.push_back(k);
        weights.push_back(w);
      }
    }
    kind = kinds[std::discrete_distribution<size_t>(weights.begin(), weights.end())(rng_)];
  }
  FaultEvent f;
  f.kind = kind;
  f.start = now;
  const bool on_worker = kind.find("worker") != std::string::npos || kind == "full disk";
  if (on_worker) {
    std::vector<int> free;
    for (int i = 0; i < stack_->workers(); ++i) {
      if (!busy.contains(i)) free.push_back(i);
    }
    if (free.empty()) return;
    f.worker = free[std::uniform_int_distribution<size_t>(0, free.size() - 1)(rng_)];
  }
  // The jobs it hits: those running on its worker, or all for the control plane.
  for (const auto& t : jobs_) {
    if (t->id.empty() || t->last.state() != v1::RUNNING) continue;
    bool hit = !on_worker;
    if (on_worker) {
      for (absl::string_view w : absl::StrSplit(t->last.worker(), ',')) hit = hit || w == stack_->worker_id(f.worker);
    }
    if (hit) f.baseline[t->id] = t->last.iteration();
  }
  const auto hold = std::chrono::milliseconds(options_.collective_timeout_ms) +
                    std::chrono::milliseconds(static_cast<int64_t>(Uniform(1000, 4000)));
  const auto down = std::chrono::milliseconds(static_cast<int64_t>(Uniform(500, 3000)));
  absl::Status dealt;
  if (kind == "kill -9 worker") {
    stack_->KillWorker(f.worker, down);
  } else if (kind == "kill -9 coordinator") {
    stack_->KillCoordinator(down);
  } else if (kind == "kill -9 redis") {
    stack_->KillRedis(down);
  } else if (kind == "pause worker") {
    stack_->PauseWorker(f.worker);
    f.held = true;
    f.hold_until = now + hold;
  } else if (kind == "partition worker") {
    dealt = stack_->CutWorker(f.worker);
    f.held = dealt.ok();
    f.hold_until = now + hold;
  } else if (kind == "full disk") {
    dealt = stack_->FillDisk(f.worker);
    f.held = dealt.ok();
    f.hold_until = now + std::chrono::milliseconds(static_cast<int64_t>(Uniform(5000, 15000)));
  }
  if (!dealt.ok()) {
    report_.notes.push_back(absl::StrCat(kind, " not dealt: ", dealt.message()));
    return;
  }
  for (auto& [id, iteration] : f.baseline) iteration = kUnknown;
  if (on_worker) {
    for (const auto& t : jobs_) {
      if (f.baseline.contains(t->id)) Poll(*t);
    }
  }
  faults_matter_until_ = std::max(faults_matter_until_, (f.held ? f.hold_until : now + down) + std::chrono::seconds(5));
  FaultFigures& figures = report_.faults[kind];
  ++figures.injected;
  figures.affected_jobs += static_cast<int>(f.baseline.size());
  // The timeline, for reading the processes' logs against.
  STRATA_LOG(Info) << "soak: " << kind << (f.worker >= 0 ? absl::StrCat(" on ", stack_->worker_id(f.worker)) : "")
                   << (f.held ? absl::StrCat(" for ", Seconds(f.hold_until - now), " s") : "") << ", hitting "
                   << f.baseline.size() << " running jobs";
  faults_.push_back(std::move(f));
}

void Soak::Tick(bool stream, bool faults) {
  report_.restarts += static_cast<int>(stack_->Supervise().size());
  if (faults) DealFaults();
  if (stream) {
    int in_flight = 0;
    for (const auto& t : jobs_) in_flight += !t->request_id.empty() && !t->Ended() && !t->reference;
    while (in_flight < options_.max_jobs_in_flight) {
      const std::string& kind = Kinds()[std::uniform_int_distribution<size_t>(0, Kinds().size() - 1)(rng_)];
      const int ranks = Chance(0.4) ? 2 : 1;
      Tracked& t = NewJob(kind, ranks, JoinPath(options_.dir, absl::StrCat("jobs/", next_job_)));
      if (Chance(0.2)) {
        t.cancel_at = std::uniform_int_distribution<int>(1, kIterations - 2)(rng_);
        t.continue_after_cancel = Chance(0.6);
      }
      ++in_flight;
    }
  }
  // Index loop: a continuation may be added while it runs.
  for (size_t i = 0; i < jobs_.size(); ++i) {
    Tracked& t = *jobs_[i];
    if (t.request_id.empty()) continue;  // refused at submit
    if (t.id.empty()) {
      Submit(t);
    } else if (!t.Ended()) {
      Poll(t);
    } else if (t.last.state() == v1::CANCELLED && t.continue_after_cancel && !t.continuation_made) {
      t.continuation_made = true;
      Tracked& c = NewJob(t.kind, t.ranks, t.output_dir);
      c.continues = t.id;
    }
  }
  TrackRecovery();
  std::this_thread::sleep_for(kTick);  // the pace of the loop: polls other processes
}

void Soak::WaitForIdleWorkers() {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  for (int i = 0; i < stack_->workers(); ++i) {
    auto worker = v1::Worker::NewStub(
        grpc::CreateChannel(stack_->worker_address(i), grpc::InsecureChannelCredentials()));
    std::string held = "?";
    while (Clock::now() < deadline) {
      v1::WorkerStats stats;
      grpc::ClientContext context;
      services::AddBearer(&context, stack_->token());
      context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
      held = worker->GetStats(&context, v1::GetStatsRequest(), &stats).ok() ? stats.job_id() : "?";
      if (held.empty()) break;
      report_.restarts += static_cast<int>(stack_->Supervise().size());
      std::this_thread::sleep_for(kTick);  // polls another process
    }
    if (!held.empty()) {
      report_.violations.push_back({"fencing", absl::StrCat("worker ", stack_->worker_id(i), " still holds job \"",
                                                            held, "\" a minute after every job ended")});
    }
  }
}

void Soak::RunReferences() {
  std::set<std::pair<std::string, int>> wanted;
  for (const auto& t : jobs_) {
    if (!t->reference && t->last.state() == v1::SUCCEEDED) wanted.insert({t->kind, t->ranks});
  }
  std::vector<Tracked*> refs;
  for (const auto& [kind, ranks] : wanted) {
    Tracked& r = NewJob(kind, ranks, ReferenceDir(kind, ranks));
    r.reference = true;
    refs.push_back(&r);
  }
  const auto deadline = Clock::now() + options_.drain_limit;
  auto pending = [&] {
    return std::any_of(refs.begin(), refs.end(),
                       [](const Tracked* r) { return !r->request_id.empty() && !r->Ended(); });
  };
  while (pending() && Clock::now() < deadline) Tick(/*stream=*/false, /*faults=*/false);
  for (const Tracked* r : refs) {
    if (r->last.state() != v1::SUCCEEDED) {
      report_.violations.push_back(
          {"reference failed", absl::StrCat(r->kind, " on ", r->ranks, " ranks without faults: ",
                                            v1::JobState_Name(r->last.state()), " ", r->last.error_message())});
    }
  }
}

std::vector<std::string> Soak::RedisLines(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {"redis-cli", "-p", std::to_string(stack_->redis_port())};
  argv.insert(argv.end(), args.begin(), args.end());
  auto result = testing::RunCommand(argv);
  std::vector<std::string> lines;
  if (!result.ok()) return lines;
  for (absl::string_view line : absl::StrSplit(result->output, '\n', absl::SkipWhitespace())) {
    lines.emplace_back(line);
  }
  return lines;
}

std::vector<Violation> Soak::Check() {
  std::vector<Violation> out;
  auto add = [&](std::vector<Violation> v) { out.insert(out.end(), v.begin(), v.end()); };
  auto outcome = [](const v1::Job& j) {
    return JobOutcome{.id = j.id(),
                      .state = v1::JobState_Name(j.state()),
                      .error_message = j.error_message(),
                      .output_dir = j.output_dir(),
                      .continues = j.continues(),
                      .continued_by = j.continued_by(),
                      .iteration = j.iteration(),
                      .iterations = j.iterations()};
  };
  // Every job the coordinator lists, and each acknowledged one by id.
  std::map<std::string, JobOutcome> listed;
  std::string page;
  do {
    v1::ListJobsRequest request;
    request.set_page_size(200);
    request.set_page_token(page);
    v1::ListJobsResponse response;
    if (!Call("ListJobs", [&](grpc::ClientContext* c) { return stub_->ListJobs(c, request, &response); }).ok()) break;
    for (const v1::Job& j : response.jobs()) listed[j.id()] = outcome(j);
    page = response.next_page_token();
  } while (!page.empty());
  std::map<std::string, JobOutcome> known;
  std::vector<std::string> acknowledged;
  for (const auto& t : jobs_) {
    if (t->id.empty()) continue;
    acknowledged.push_back(t->id);
    v1::GetJobRequest request;
    request.set_job_id(t->id);
    v1::Job job;
    if (Call("GetJob", [&](grpc::ClientContext* c) { return stub_->GetJob(c, request, &job); }).ok()) {
      known[t->id] = outcome(job);
      known[t->id].progressing = Clock::now() - t->last_progress < kProgressWindow;
    }
  }
  add(CheckNoJobLostOrStuck(acknowledged, known));
  for (const auto& [id, job] : known) add(CheckFailedSaysWhy(job));

  // Each chain of continuations shares one output: check it at its end.
  for (const auto& t : jobs_) {
    auto it = known.find(t->id);
    if (it == known.end() || !it->second.continued_by.empty()) continue;
    const JobOutcome& job = it->second;
    std::set<std::string> chain;
    for (std::string id = job.id; !id.empty();) {
      chain.insert(id);
      auto prior = known.find(id);
      id = prior == known.end() ? "" : prior->second.continues;
    }
    const std::string metrics = JoinPath(t->output_dir, "metrics.jsonl");
    add(CheckMetricsOnce(metrics, job.state == "SUCCEEDED" ? job.iterations : -1));
    add(CheckCheckpoints(JoinPath(t->output_dir, "checkpoints"), chain));
    if (job.state == "SUCCEEDED" && !t->reference) {
      add(CheckSameMetrics(JoinPath(ReferenceDir(t->kind, t->ranks), "metrics.jsonl"), metrics, t->id, kBatch,
                           kPpoEpochs));
    }
  }
  for (int i = 0; i < stack_->workers(); ++i) add(CheckNvmeDirectoryEmpty(stack_->nvme_dir(i), {kBallast}));

  // Redis: every key belongs to a listed job or to the store itself.
  std::map<std::string, JobOutcome> all = listed;
  all.insert(known.begin(), known.end());
  const std::vector<std::string> keys = RedisLines({"--scan", "--pattern", std::string(kKeyPrefix) + "*"});
  std::map<std::string, std::vector<std::string>> members;
  for (const char* state : {"QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"}) {
    members[state] = RedisLines({"ZRANGE", absl::StrCat(kKeyPrefix, "jobs:state:", state), "0", "-1"});
  }
  std::vector<std::string> targets;
  for (const std::string& key : keys) {
    if (key.rfind(std::string(kKeyPrefix) + "request:", 0) == 0) {
      for (const std::string& v : RedisLines({"GET", key})) targets.push_back(v);
    }
  }
  add(CheckRedisKeys(kKeyPrefix, keys, all, members, targets));
  add(CheckNoStrayProcesses(options_.dir, stack_->LivePids()));
  for (const std::string& e : api_errors_) out.push_back({"API error not retryable", e});
  return out;
}

// The faults the checks must catch, planted after a clean run.
void Soak::Plant() {
  std::vector<const Tracked*> done;
  for (const auto& t : jobs_) {
    if (!t->reference && t->last.state() == v1::SUCCEEDED && t->last.continued_by().empty()) done.push_back(t.get());
  }
  if (!done.empty()) {
    RedisLines({"DEL", absl::StrCat(kKeyPrefix, "job:", done.front()->id)});  // the job's record
    const std::string metrics = JoinPath(done.back()->output_dir, "metrics.jsonl");
    auto text = ReadFileToString(metrics);
    if (text.ok() && !text->empty()) {
      const size_t last = text->rfind('\n', text->size() - 2);
      std::ofstream(metrics, std::ios::app) << text->substr(last == std::string::npos ? 0 : last + 1);
    }
  }
  const std::string left = JoinPath(stack_->nvme_dir(0), "strata-job-planted");
  std::filesystem::create_directories(left);
  testing::WriteTextFile(JoinPath(left, "tile-0"), "left behind");
}

absl::StatusOr<SoakReport> Soak::Run() {
  const auto begin = Clock::now();
  report_.seed = options_.seed;
  STRATA_RETURN_IF_ERROR(PrepareModel());
  STRATA_ASSIGN_OR_RETURN(stack_, Stack::Start({.dir = options_.dir,
                                                .model_dir = model_,
                                                .workers = options_.workers,
                                                .collective_timeout_ms = options_.collective_timeout_ms,
                                                .isolate_network = options_.isolate_network,
                                                .small_disks = options_.small_disks}));
  for (const std::string& note : {stack_->network_note(), stack_->disk_note()}) {
    if (!note.empty()) report_.notes.push_back(note);
  }
  STRATA_RETURN_IF_ERROR(WaitUntilReady());

  for (const auto& [kind, weight] : FaultWeights()) first_round_.push_back(kind);
  std::shuffle(first_round_.begin(), first_round_.end(), rng_);
  const auto stream_start = Clock::now();
  next_fault_at_ = stream_start + std::chrono::seconds(3);
  while (Clock::now() - stream_start < options_.duration) Tick(/*stream=*/true, /*faults=*/true);
  for (FaultEvent& f : faults_) EndFault(f);
  stack_->HealAll();
  const auto drain_start = Clock::now();
  report_.stream_seconds = Seconds(drain_start - stream_start);
  auto running = [&] {
    return std::any_of(jobs_.begin(), jobs_.end(), [&](const auto& t) {
      return !t->request_id.empty() &&
             (!t->Ended() || (t->last.state() == v1::CANCELLED && t->continue_after_cancel && !t->continuation_made));
    });
  };
  while (running() && Clock::now() - drain_start < options_.drain_limit) Tick(/*stream=*/false, /*faults=*/false);
  report_.drain_seconds = Seconds(Clock::now() - drain_start);
  for (FaultEvent& f : faults_) report_.faults[f.kind].unrecovered += static_cast<int>(f.baseline.size());

  WaitForIdleWorkers();
  RunReferences();
  for (const auto& t : jobs_) {
    if (t->reference || t->id.empty()) continue;
    report_.succeeded += t->last.state() == v1::SUCCEEDED;
    report_.failed += t->last.state() == v1::FAILED;
    report_.cancelled += t->last.state() == v1::CANCELLED;
    if (t->last.continued_by().empty()) report_.iterations_completed += t->last.iteration();
    if (t->last.state() == v1::FAILED)
      report_.notes.push_back(
          absl::StrCat(t->id, " (", t->kind, ", ", t->ranks, " ranks) FAILED: ", t->last.error_message()));
  }
  std::vector<Violation> found = Check();
  for (const auto& t : jobs_) {
    if (!t->reference && t->last.state() == v1::SUCCEEDED && t->last.continued_by().empty()) {
      ++report_.compared_with_reference;
    }
  }
  report_.violations.insert(report_.violations.end(), found.begin(), found.end());
  if (options_.plant_faults) {
    Plant();
    std::set<std::string> before;
    for (const Violation& v : found) before.insert(v.invariant + "|" + v.detail);
    for (const Violation& v : Check()) {
      if (!before.contains(v.invariant + "|" + v.detail)) report_.planted.push_back(v);
    }
  }
  report_.unexpected_exits = stack_->unexpected_exits();
  for (const std::string& e : stack_->exits()) report_.notes.push_back("exited on its own: " + e);
  if (!report_.violations.empty()) report_.notes.push_back("logs:\n" + stack_->LogTail(3000));
  stack_.reset();
  report_.total_seconds = Seconds(Clock::now() - begin);
  return report_;
}

json ApiJson(const ApiFigures& f) {
  return {{"calls", f.calls},
          {"ok", f.ok},
          {"retryable", f.retryable},
          {"other", f.other},
          {"availability", f.calls == 0 ? 1.0 : static_cast<double>(f.ok) / static_cast<double>(f.calls)},
          {"p50_ms", Percentile(f.latency_ms, 0.5)},
          {"p99_ms", Percentile(f.latency_ms, 0.99)}};
}

}  // namespace

std::string SoakReport::ToJson() const {
  json faults_json = json::object();
  for (const auto& [kind, f] : faults) {
    faults_json[kind] = {{"injected", f.injected},
                         {"affected_jobs", f.affected_jobs},
                         {"recovered", f.recovery_seconds.size()},
                         {"unrecovered", f.unrecovered},
                         {"recovery_p50_s", Percentile(f.recovery_seconds, 0.5)},
                         {"recovery_max_s", Percentile(f.recovery_seconds, 1.0)}};
  }
  auto violations_json = [](const std::vector<Violation>& vs) {
    json out = json::array();
    for (const Violation& v : vs) out.push_back({{"invariant", v.invariant}, {"detail", v.detail}});
    return out;
  };
  return json{{"seed", seed},
              {"stream_seconds", stream_seconds},
              {"drain_seconds", drain_seconds},
              {"total_seconds", total_seconds},
              {"jobs",
               {{"submitted", submitted},
                {"succeeded", succeeded},
                {"failed", failed},
                {"cancelled", cancelled},
                {"continuations", continued},
                {"compared_with_fault_free_run", compared_with_reference},
                {"iterations_completed", iterations_completed}}},
              {"restarts", restarts},
              {"unexpected_exits", unexpected_exits},
              {"faults", faults_json},
              {"api", {{"all", ApiJson(api_all)}, {"during_faults", ApiJson(api_during_faults)}}},
              {"violations", violations_json(violations)},
              {"planted_found", violations_json(planted)},
              {"notes", notes}}
      .dump(2);
}

std::string SoakReport::Summary() const {
  std::string out = absl::StrFormat(
      "soak seed %d: %.0f s of faults, %.0f s to drain; %d jobs submitted: %d succeeded, %d failed, %d cancelled, %d "
      "continuations; %d compared with a fault-free run\n",
      seed, stream_seconds, drain_seconds, submitted, succeeded, failed, cancelled, continued, compared_with_reference);
  for (const auto& [kind, f] : faults) {
    absl::StrAppendFormat(&out, "  %-20s %3d dealt, %3d jobs hit, recovered p50 %.1f s max %.1f s, %d never moved\n",
                          kind, f.injected, f.affected_jobs, Percentile(f.recovery_seconds, 0.5),
                          Percentile(f.recovery_seconds, 1.0), f.unrecovered);
  }
  absl::StrAppendFormat(
      &out, "  API: %d calls, availability %.4f (during faults %.4f), p99 %.1f ms (during faults %.1f ms)\n",
      api_all.calls, api_all.calls ? double(api_all.ok) / double(api_all.calls) : 1.0,
      api_during_faults.calls ? double(api_during_faults.ok) / double(api_during_faults.calls) : 1.0,
      Percentile(api_all.latency_ms, 0.99), Percentile(api_during_faults.latency_ms, 0.99));
  absl::StrAppendFormat(&out, "  %d invariant violations\n", violations.size());
  for (const Violation& v : violations) absl::StrAppend(&out, "    ", v.invariant, ": ", v.detail, "\n");
  return out;
}

absl::StatusOr<SoakReport> RunSoak(const SoakOptions& options) {
  if (options.dir.empty() || !IsDirectory(options.dir)) {
    return absl::InvalidArgumentError(absl::StrCat("soak dir \"", options.dir, "\" is not a directory"));
  }
  Soak soak(options);
  return soak.Run();
}

}  // namespace strata::soak
