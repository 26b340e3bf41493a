// The coordinator's recovery paths against the in-memory store and a fleet
// of scripted workers: a restart requeues what was running, a lost gang
// goes back to the queue with a backoff (and fails when retrying is the
// same try), a silent worker is deregistered, a continuation starts from
// the ended job's checkpoints, and a job's end is written once the store is
// back. Each runs in milliseconds; tests/e2e/service_test.cc runs the same
// paths with real processes and Redis.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "services/coordinator/admission.h"
#include "services/coordinator/coordinator.h"
#include "services/store/memory_job_store.h"

namespace strata::services {
namespace {

// What the scheduler reads of a job: one worker; what the workers would
// load stays unread (the fleet is scripted).
constexpr char kSpec[] = R"(
algorithm: grpo
models:
  actor: {path: sft}
  reward: {rule: length_ratio}
data: {train: train.jsonl}
train: {iterations: 3}
output: {dir: runs/grpo}
)";

// Workers as a test scripts them: every gang start returns what `start`
// says, and the workers in `silent` do not answer a health check.
struct ScriptedWorkers {
  std::mutex mu;
  absl::Status start = absl::UnavailableError("rank 0 (w0): connection refused");
  std::set<std::string> silent;
  std::vector<JobRecord> started;  // the job of each gang start
};

class ScriptedFleet final : public WorkerFleet {
 public:
  explicit ScriptedFleet(std::shared_ptr<ScriptedWorkers> workers) : workers_(std::move(workers)) {}

  absl::StatusOr<std::unique_ptr<JobGang>> StartGang(const JobRecord& job, const std::vector<WorkerRecord>&) override {
    std::lock_guard<std::mutex> lock(workers_->mu);
    workers_->started.push_back(job);
    return workers_->start;
  }

  std::vector<bool> Answering(const std::string&, const std::vector<WorkerRecord>& workers) override {
    std::lock_guard<std::mutex> lock(workers_->mu);
    std::vector<bool> answering;
    for (const WorkerRecord& w : workers) answering.push_back(!workers_->silent.count(w.id));
    return answering;
  }

 private:
  std::shared_ptr<ScriptedWorkers> workers_;
};

// A store whose first `failing` transitions to `to` fail as an unreachable
// Redis does (the write did not land); everything else goes through.
class OutageStore final : public JobStore {
 public:
  OutageStore(JobStore& store, JobState to, int failing) : store_(store), to_(to), failing_(failing) {}
  int refused() const { return refused_.load(); }

  absl::StatusOr<JobRecord> Transition(const std::string& id, std::vector<JobState> from, JobState to,
                                       const std::map<std::string, std::string>& fields,
                                       const std::map<std::string, std::string>& expect) override {
    if (to == to_ && refused_.load() < failing_) {
      ++refused_;
      return absl::UnavailableError("redis at 127.0.0.1:6379: connection refused");
    }
    return store_.Transition(id, std::move(from), to, fields, expect);
  }
  absl::StatusOr<JobRecord> Create(JobRecord job, bool* created) override {
    return store_.Create(std::move(job), created);
  }
  absl::StatusOr<JobRecord> Get(const std::string& id) override { return store_.Get(id); }
  absl::StatusOr<std::pair<std::vector<JobRecord>, std::string>> List(int page_size, const std::string& token,
                                                                      std::optional<JobState> state) override {
    return store_.List(page_size, token, state);
  }
  absl::Status SetProgress(const std::string& id, int64_t iteration) override {
    return store_.SetProgress(id, iteration);
  }
  absl::Status RecordCheckpoint(const std::string& id, int64_t iteration, const std::string& dir) override {
    return store_.RecordCheckpoint(id, iteration, dir);
  }
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> ListCheckpoints(const std::string& id) override {
    return store_.ListCheckpoints(id);
  }
  absl::StatusOr<std::string> AppendEvent(const std::string& id, const std::string& type,
                                          const std::string& json) override {
    return store_.AppendEvent(id, type, json);
  }
  absl::StatusOr<std::vector<JobEventRecord>> ReadEvents(const std::string& id, const std::string& after, int count,
                                                         int block_ms) override {
    return store_.ReadEvents(id, after, count, block_ms);
  }
  absl::StatusOr<std::optional<JobEventRecord>> LastEvent(const std::string& id) override {
    return store_.LastEvent(id);
  }
  absl::StatusOr<std::vector<JobRecord>> ListByState(JobState state) override { return store_.ListByState(state); }
  absl::StatusOr<std::map<std::string, int64_t>> CountByState() override { return store_.CountByState(); }
  absl::Status RegisterWorker(const WorkerRecord& worker, int ttl_ms) override {
    return store_.RegisterWorker(worker, ttl_ms);
  }
  absl::Status Heartbeat(const std::string& worker_id, const std::string& job_id, int ttl_ms) override {
    return store_.Heartbeat(worker_id, job_id, ttl_ms);
  }
  absl::StatusOr<std::vector<WorkerRecord>> ListWorkers() override { return store_.ListWorkers(); }
  absl::Status RemoveWorker(const std::string& worker_id) override { return store_.RemoveWorker(worker_id); }
  absl::Status Ping() override { return store_.Ping(); }

 private:
  JobStore& store_;
  const JobState to_;
  const int failing_;
  std::atomic<int> refused_{0};
};

CoordinatorOptions FastOptions() {
  CoordinatorOptions options;
  options.rpc_threads = 2;
  options.scheduler_interval_ms = 2;
  options.backoff.first = std::chrono::milliseconds(1);
  options.backoff.cap = std::chrono::milliseconds(8);
  options.record_retry_first = std::chrono::milliseconds(1);
  return options;
}

JobRecord QueuedJob() {
  JobRecord job;
  job.algorithm = "grpo";
  job.spec_yaml = kSpec;
  job.output_dir = "runs/grpo";
  job.iterations = 3;
  return job;
}

// The job's events up to and including the first "state" event that
// announces `state` after `after` of them; blocks on the store's stream
// (no sleeping), for at most 20 s when the test is failing.
std::vector<nlohmann::json> EventsUntil(JobStore& store, const std::string& id, const std::string& state,
                                        int after = 0) {
  std::vector<nlohmann::json> events;
  std::string last;
  int seen = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    auto batch = store.ReadEvents(id, last, 100, 200);
    if (!batch.ok()) {
      ADD_FAILURE() << batch.status();
      return events;
    }
    for (const JobEventRecord& e : *batch) {
      last = e.id;
      nlohmann::json j = nlohmann::json::parse(e.json);
      j["type"] = e.type;
      events.push_back(j);
      if (e.type == "state" && j.value("state", "") == state && seen++ >= after) return events;
    }
  }
  ADD_FAILURE() << "job " << id << " never announced " << state;
  return events;
}

int CountState(const std::vector<nlohmann::json>& events, const std::string& state) {
  int n = 0;
  for (const auto& e : events) n += e["type"] == "state" && e.value("state", "") == state;
  return n;
}

class CoordinatorRecoveryTest : public ::testing::Test {
 protected:
  void StartCoordinator(JobStore& store, CoordinatorOptions options = FastOptions()) {
    coordinator_ = std::make_unique<CoordinatorService>(&store, options, std::make_unique<ScriptedFleet>(workers_));
    ASSERT_TRUE(coordinator_->Start().ok());
  }

  void TearDown() override {
    if (coordinator_ != nullptr) coordinator_->Stop();
  }

  std::string Create(JobStore& store, JobRecord job = QueuedJob()) {
    auto created = store.Create(std::move(job), nullptr);
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? created->id : "";
  }

  MemoryJobStore store_;
  std::shared_ptr<ScriptedWorkers> workers_ = std::make_shared<ScriptedWorkers>();
  std::unique_ptr<CoordinatorService> coordinator_;
};

TEST_F(CoordinatorRecoveryTest, ARestartRequeuesTheJobsAPreviousCoordinatorRan) {
  const std::string id = Create(store_);
  ASSERT_TRUE(store_.Transition(id, {JobState::kQueued}, JobState::kRunning, {{"worker", "w0"}}, {}).ok());
  StartCoordinator(store_);  // no worker registered: the job stays queued
  auto job = store_.Get(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state, JobState::kQueued);
  EXPECT_EQ(job->worker, "");
  // Told among its events (the scheduler may add why it waits).
  auto events = store_.ReadEvents(id, "", 100, 0);
  ASSERT_TRUE(events.ok());
  EXPECT_TRUE(std::any_of(events->begin(), events->end(), [](const JobEventRecord& e) {
    return absl::StrContains(e.json, "coordinator restarted; job requeued");
  }));
}

TEST_F(CoordinatorRecoveryTest, ALostGangRequeuesUntilRetryingIsTheSameTryThenFails) {
  ASSERT_TRUE(store_.RegisterWorker({"w0", "127.0.0.1:1", "", 0}, 600000).ok());
  const std::string id = Create(store_);
  StartCoordinator(store_);
  const auto events = EventsUntil(store_, id, "FAILED");
  // Four requeues, each announced with its cause and its wait, then the
  // fifth loss with every worker answering fails the job.
  EXPECT_EQ(CountState(events, "RUNNING"), 5);
  EXPECT_EQ(CountState(events, "QUEUED"), 4);  // the requeues (the store made the job, not SubmitJob)
  int requeue_logs = 0;
  for (const auto& e : events) {
    const std::string message = e.value("message", "");
    if (e["type"] != "log" || !absl::StrContains(message, " lost: ")) continue;  // not why it waits
    EXPECT_TRUE(absl::StrContains(message, "gang (w0) lost: rank 0 (w0): connection refused")) << message;
    EXPECT_TRUE(absl::StrContains(message, "; job requeued, retried in ")) << message;
    ++requeue_logs;
  }
  EXPECT_EQ(requeue_logs, 4);
  auto job = store_.Get(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state, JobState::kFailed);
  EXPECT_EQ(job->error_code, "UNAVAILABLE");
  EXPECT_TRUE(absl::StrContains(job->error_message,
                                "failed 5 times in a row before an iteration, every worker "
                                "answering"))
      << job->error_message;
  std::lock_guard<std::mutex> lock(workers_->mu);
  EXPECT_EQ(workers_->started.size(), 5u);
}

TEST_F(CoordinatorRecoveryTest, ASilentWorkerIsDeregisteredAndItsJobRequeued) {
  ASSERT_TRUE(store_.RegisterWorker({"w0", "127.0.0.1:1", "", 0}, 600000).ok());
  workers_->silent = {"w0"};
  const std::string id = Create(store_);
  StartCoordinator(store_);
  const auto events = EventsUntil(store_, id, "QUEUED");
  EXPECT_TRUE(std::any_of(events.begin(), events.end(), [](const nlohmann::json& e) {
    return e["type"] == "log" && absl::StrContains(e.value("message", ""), "; not answering: w0; job requeued");
  }));
  // Deregistered: with no worker left the job waits in the queue.
  auto registered = store_.ListWorkers();
  ASSERT_TRUE(registered.ok());
  EXPECT_TRUE(registered->empty());
  coordinator_->Stop();
  auto job = store_.Get(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state, JobState::kQueued);
}

TEST_F(CoordinatorRecoveryTest, TheTemplateDateIsFixedAtSubmissionAndKeptByAContinuation) {
  JobSpecs specs;
  const Caller admin{"", /*admin=*/true, /*worker=*/false};
  strata::v1::SubmitJobRequest request;
  request.set_spec_yaml(kSpec);
  const int64_t submitted = 1795794000000;  // 2026-11-27T15:40:00Z
  auto first = AdmitJob(store_, specs, admin, request, WorkerOffer(), AdmissionLimits{4096, 1 << 22}, submitted);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->spec->data.template_date, "2026-11-27T15:40:00+00:00");
  // What the workers get (the stored spec) carries it.
  auto stored_spec = policies::ParseJobSpec(first->record.spec_yaml, {}, "stored");
  ASSERT_TRUE(stored_spec.ok()) << stored_spec.status();
  EXPECT_EQ(stored_spec->data.template_date, "2026-11-27T15:40:00+00:00");
  // A spec that names its date keeps it.
  strata::v1::SubmitJobRequest named = request;
  named.add_overrides("data.template_date=2025-01-02");
  auto pinned = AdmitJob(store_, specs, admin, named, WorkerOffer(), AdmissionLimits{4096, 1 << 22}, submitted);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_EQ(pinned->spec->data.template_date, "2025-01-02");
  // A continuation a day later renders as the job it continues did.
  const std::string ended = Create(store_, first->record);
  ASSERT_TRUE(store_.Transition(ended, {JobState::kQueued}, JobState::kRunning, {{"worker", "w0"}}, {}).ok());
  ASSERT_TRUE(store_.Transition(ended, {JobState::kRunning}, JobState::kCancelled, {}, {}).ok());
  strata::v1::SubmitJobRequest later = request;
  later.set_continue_job_id(ended);
  auto continued = AdmitJob(store_, specs, admin, later, WorkerOffer(), AdmissionLimits{4096, 1 << 22},
                            submitted + 86400000);
  ASSERT_TRUE(continued.ok()) << continued.status();
  EXPECT_EQ(continued->spec->data.template_date, "2026-11-27T15:40:00+00:00");
}

// A spec path that no registered worker serves is refused at submit, with
// PERMISSION_DENIED naming the key, instead of failing the job when a
// worker starts it. One worker serving it is enough; a worker that did not
// say what it serves lets the spec through (it still checks at start).
TEST_F(CoordinatorRecoveryTest, ASpecPathNoWorkerServesIsRefusedAtSubmit) {
  JobSpecs specs;
  const Caller admin{"", /*admin=*/true, /*worker=*/false};
  strata::v1::SubmitJobRequest request;
  request.set_spec_yaml(kSpec);
  request.add_overrides("data.train=/etc/passwd");
  WorkerOffer offer;
  offer.paths = {{"/srv/jobs", {"/srv/jobs"}}, {"/srv/other", {"/srv/other", "/scratch/nvme"}}};
  auto refused = AdmitJob(store_, specs, admin, request, offer, AdmissionLimits{4096, 1 << 22}, 0);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "spec key 'data.train'")) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "none of the other 1 registered workers"))
      << refused.status();
  // Relative paths resolve in each worker's directory: inside its root.
  strata::v1::SubmitJobRequest relative;
  relative.set_spec_yaml(kSpec);
  EXPECT_TRUE(AdmitJob(store_, specs, admin, relative, offer, AdmissionLimits{4096, 1 << 22}, 0).ok());
  // A ".." that escapes is refused like an absolute path.
  strata::v1::SubmitJobRequest escaping = relative;
  escaping.add_overrides("output.dir=../../etc/x");
  EXPECT_EQ(AdmitJob(store_, specs, admin, escaping, offer, AdmissionLimits{4096, 1 << 22}, 0).status().code(),
            absl::StatusCode::kPermissionDenied);
  // One worker serving every path of the spec, /etc among them: admitted.
  offer.paths.push_back({"/srv/third", {"/srv/third", "/etc"}});
  EXPECT_TRUE(AdmitJob(store_, specs, admin, request, offer, AdmissionLimits{4096, 1 << 22}, 0).ok());
  // Compared as written: a root with a trailing slash is the same root, and
  // roots the coordinator cannot see are no reason to refuse.
  offer.paths = {{"/nonexistent/jobs", {"/nonexistent/jobs/", "/etc/"}}};
  EXPECT_TRUE(AdmitJob(store_, specs, admin, request, offer, AdmissionLimits{4096, 1 << 22}, 0).ok());
  // A worker that reported no roots: admitted (it checks when it starts the job).
  offer.paths = {{"/srv/jobs", {"/srv/jobs"}}, {"/srv/old", {}}};
  EXPECT_TRUE(AdmitJob(store_, specs, admin, request, offer, AdmissionLimits{4096, 1 << 22}, 0).ok());
}

TEST_F(CoordinatorRecoveryTest, AContinuationStartsFromTheEndedJobsCheckpoint) {
  const std::string ended = Create(store_);
  ASSERT_TRUE(store_.Transition(ended, {JobState::kQueued}, JobState::kRunning, {{"worker", "w0"}}, {}).ok());
  ASSERT_TRUE(store_.RecordCheckpoint(ended, 4, "ckpt/iter-000004").ok());
  ASSERT_TRUE(store_.Transition(ended, {JobState::kRunning}, JobState::kCancelled, {}, {}).ok());

  JobSpecs specs;
  strata::v1::SubmitJobRequest request;
  request.set_spec_yaml(kSpec);
  request.set_continue_job_id(ended);
  const Caller admin{"", /*admin=*/true, /*worker=*/false};
  auto admitted = AdmitJob(store_, specs, admin, request, WorkerOffer(), AdmissionLimits{4096, 1 << 22}, 0);
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  EXPECT_EQ(admitted->record.resumable_run_ids, std::vector<std::string>{ended});
  EXPECT_EQ(admitted->record.checkpoint_iteration, 4);
  EXPECT_EQ(admitted->record.iteration, 4);
  // A continuation writes where the ended job wrote.
  strata::v1::SubmitJobRequest elsewhere = request;
  elsewhere.add_overrides("output.dir=out/other");
  auto moved = AdmitJob(store_, specs, admin, elsewhere, WorkerOffer(), AdmissionLimits{4096, 1 << 22}, 0);
  EXPECT_EQ(moved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(moved.status().message(), "output.dir")) << moved.status();

  const std::string continuation = Create(store_, admitted->record);
  EXPECT_EQ(store_.Create(admitted->record, nullptr).status().code(), absl::StatusCode::kFailedPrecondition)
      << "an ended job is continued once";
  workers_->start = absl::InvalidArgumentError("data.train: train.jsonl: no such file");
  ASSERT_TRUE(store_.RegisterWorker({"w0", "127.0.0.1:1", "", 0}, 600000).ok());
  StartCoordinator(store_);
  EventsUntil(store_, continuation, "FAILED");
  std::lock_guard<std::mutex> lock(workers_->mu);
  ASSERT_EQ(workers_->started.size(), 1u);
  EXPECT_EQ(workers_->started[0].resumable_run_ids, std::vector<std::string>{ended});
  EXPECT_EQ(workers_->started[0].checkpoint_dir, "ckpt/iter-000004");
}

TEST_F(CoordinatorRecoveryTest, AJobsEndIsWrittenOnceTheStoreIsBack) {
  OutageStore store(store_, JobState::kFailed, /*failing=*/3);
  ASSERT_TRUE(store.RegisterWorker({"w0", "127.0.0.1:1", "", 0}, 600000).ok());
  workers_->start = absl::InvalidArgumentError("models.actor.path: sft: no such directory");
  const std::string id = Create(store);
  StartCoordinator(store);
  const auto events = EventsUntil(store, id, "FAILED");
  EXPECT_EQ(store.refused(), 3);
  auto job = store.Get(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state, JobState::kFailed);
  EXPECT_EQ(job->error_code, "INVALID_ARGUMENT");
  EXPECT_EQ(job->error_message, "models.actor.path: sft: no such directory");
  EXPECT_EQ(CountState(events, "FAILED"), 1) << "announced once, after the write landed";
  coordinator_->Stop();  // before `store`, which it uses, goes
}

}  // namespace
}  // namespace strata::services
