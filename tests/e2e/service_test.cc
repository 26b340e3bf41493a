// The job service end to end: a real redis-server, a real coordinator and
// two real workers on loopback, driven through the gRPC API; then faults
// (kill -9 of a worker and of the coordinator, a Redis restart) and bad
// input.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include <grpcpp/health_check_service_interface.h>
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/file.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "policies/checkpoint/safetensors.h"
#include "services/coordinator/service_bench.h"
#include "services/driver/job_runner.h"
#include "services/rpc/auth.h"
#include "services/rpc/wire.h"
#include "services/store/redis_job_store.h"
#include "strata/v1/coordinator.grpc.pb.h"
#include "strata/v1/worker.grpc.pb.h"
#include "tests/e2e/run_metrics.h"
#include "tests/testutil/child_process.h"
#include "tests/testutil/health.h"
#include "tests/testutil/redis_server.h"
#include "tests/testutil/reward_server.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

namespace v1 = strata::v1;
using nlohmann::json;
using testing::ChildProcess;

constexpr char kToken[] = "e2e-token-0123456789";

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::RedisServer::Available()) GTEST_SKIP() << "needs redis-server (Debian package redis-server)";
    auto redis = testing::RedisServer::Start();
    ASSERT_TRUE(redis.ok()) << redis.status();
    redis_ = std::move(*redis);
    testing::WriteTextFile(dir_.Join("token"), kToken);
    ::chmod(dir_.Join("token").c_str(), 0600);  // servers refuse a token others can read
    // A small model and the tiny task's tokenizer.
    model_ = dir_.Join("model");
    testing::WriteTextFile(dir_.Join("config.json"), R"({"vocab_size": 259, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})");
    auto init = testing::RunCommand(
        {testing::StrataBinary(), "init-model", "--config", dir_.Join("config.json"), "--out", model_, "--seed", "3"});
    ASSERT_TRUE(init.ok() && init->exit_code == 0);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      std::filesystem::copy_file(testing::SourcePath(std::string("examples/tiny/data/") + f), JoinPath(model_, f));
    }
    auto port = testing::RedisServer::FreePort();
    ASSERT_TRUE(port.ok());
    coordinator_addr_ = absl::StrCat("127.0.0.1:", *port);
    StartCoordinator();
    for (int i = 0; i < RealWorkers(); ++i) StartWorker(i);
    for (int i = 0; i < RealWorkers(); ++i) WaitUntilRegistered(i);
    channel_ = grpc::CreateChannel(coordinator_addr_, grpc::InsecureChannelCredentials());
    ASSERT_TRUE(channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(20)))
        << coordinator_->Log();
    stub_ = v1::Coordinator::NewStub(channel_);
  }

  // Worker processes the fixture starts.
  virtual int RealWorkers() const { return 2; }
  // Flags every worker gets besides the fixture's own.
  virtual std::vector<std::string> WorkerFlags() const { return {}; }
  // Whether the coordinator and workers serve Prometheus metrics (on free
  // ports: metrics_addr_[0] the coordinator's, [1 + i] worker i's).
  virtual bool ServeMetrics() const { return false; }

  // --metrics-listen on a free port, or nothing.
  std::vector<std::string> MetricsFlag(size_t slot) {
    if (!ServeMetrics()) return {};
    while (metrics_addr_.size() <= slot) {
      auto port = testing::RedisServer::FreePort();
      EXPECT_TRUE(port.ok());
      metrics_addr_.push_back(absl::StrCat("127.0.0.1:", port.ok() ? *port : 0));
    }
    return {"--metrics-listen", metrics_addr_[slot]};
  }
  // How the coordinator authenticates; the workers use dir_/token (kToken).
  virtual std::vector<std::string> CoordinatorAuth() { return {"--token-file", dir_.Join("token")}; }

  // The coordinator runs elsewhere than the workers: spec paths must
  // resolve where the workers run.
  std::string CoordinatorDirectory() {
    const std::string d = dir_.Join("coordinator_cwd");
    std::filesystem::create_directories(d);
    return d;
  }

  // `prefix` runs the coordinator through another program (setpriv);
  // `cwd` and `token_file` default to the fixture's.
  void StartCoordinator(std::vector<std::string> prefix = {}, std::string cwd = "", std::string token_file = "") {
    std::vector<std::string> argv = std::move(prefix);
    argv.insert(argv.end(),
                {testing::StrataBinary(), "coordinator", "--listen", coordinator_addr_, "--redis", redis_->url(),
                 // A gang's ranks give up on a lost rank within 5 s.
                 "--collective-timeout-ms", "5000"});
    for (const std::string& a : MetricsFlag(0)) argv.push_back(a);
    if (token_file.empty()) {
      for (const std::string& a : CoordinatorAuth()) argv.push_back(a);
    } else {
      argv.insert(argv.end(), {"--token-file", token_file});
    }
    auto p = ChildProcess::Spawn(argv, dir_.Join("coordinator.log"), cwd.empty() ? CoordinatorDirectory() : cwd);
    ASSERT_TRUE(p.ok()) << p.status();
    coordinator_ = std::move(*p);
  }

  // `env`: NAME=VALUE settings for this worker's process only.
  void StartWorker(int i, const std::vector<std::string>& env = {}) {
    if (worker_addr_.size() <= static_cast<size_t>(i)) {
      auto port = testing::RedisServer::FreePort();
      ASSERT_TRUE(port.ok());
      worker_addr_.push_back(absl::StrCat("127.0.0.1:", *port));
      workers_.emplace_back();
    }
    std::vector<std::string> argv;
    if (!env.empty()) {  // env(1) execs the worker in its own place: the pid stays the worker's
      argv.push_back("/usr/bin/env");
      argv.insert(argv.end(), env.begin(), env.end());
    }
    argv.insert(argv.end(), {testing::StrataBinary(), "worker", "--listen", worker_addr_[i], "--coordinator",
                             coordinator_addr_, "--token-file", dir_.Join("token"), "--id", absl::StrCat("w", i),
                             // Job paths: the fixture's directory (the working directory) and
                             // the repository's example data.
                             "--allow-path", testing::SourcePath("examples")});
    for (const std::string& a : MetricsFlag(1 + static_cast<size_t>(i))) argv.push_back(a);
    for (const std::string& a : WorkerFlags()) argv.push_back(a);
    auto p = ChildProcess::Spawn(argv, dir_.Join(absl::StrCat("worker", i, ".log")), dir_.path());
    ASSERT_TRUE(p.ok()) << p.status();
    workers_[i] = std::move(*p);
  }

  // A worker's health turns SERVING once it has registered with the
  // coordinator; the health stream reports the change (no polling).
  void WaitUntilRegistered(int i) {
    const absl::Status serving = testing::WaitUntilServing(worker_addr_[i], std::chrono::seconds(60));
    EXPECT_TRUE(serving.ok()) << "worker " << i << " never registered: " << serving.message();
  }

  std::string Spec(int iterations, const std::string& out, int checkpoint_every = 2) const {
    return absl::StrCat(R"(
algorithm: remax
models:
  actor: {path: )",
                        model_, R"(}
  reward: {rule: vowel_fraction}
data:
  train: )",
                        testing::SourcePath("examples/tiny/data/prompts.jsonl"), R"(
  max_prompt_tokens: 16
train: {iterations: )",
                        iterations, R"(, batch_size: 4, lr: 1.0e-3, seed: 5}
generation: {max_new_tokens: 8}
checkpoint: {every: )",
                        checkpoint_every, R"(}
memory: {host_mib: 128}
output: {dir: )",
                        dir_.Join(out), "}\n");
  }

  void Auth(grpc::ClientContext* context, const std::string& token = kToken) {
    services::AddBearer(context, token);
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  }

  grpc::Status Submit(const std::string& spec, v1::Job* job, const std::string& request_id = "",
                      std::vector<std::string> overrides = {}, const std::string& token = kToken) {
    v1::SubmitJobRequest request;
    request.set_spec_yaml(spec);
    request.set_request_id(request_id);
    for (const auto& o : overrides) request.add_overrides(o);
    grpc::ClientContext context;
    Auth(&context, token);
    return stub_->SubmitJob(&context, request, job);
  }

  grpc::Status Cancel(const std::string& id, v1::Job* job, const std::string& token = kToken) {
    v1::CancelJobRequest request;
    request.set_job_id(id);
    grpc::ClientContext context;
    Auth(&context, token);
    return stub_->CancelJob(&context, request, job);
  }

  v1::Job Get(const std::string& id, const std::string& token = kToken) {
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::Job job;
    grpc::ClientContext context;
    Auth(&context, token);
    EXPECT_TRUE(stub_->GetJob(&context, request, &job).ok());
    return job;
  }

  // Reads the job's events until `stop` says so or the job ends; returns
  // them. No sleeping: the stream delivers events as they happen.
  std::vector<v1::JobEvent> Watch(const std::string& id, const std::function<bool(const v1::JobEvent&)>& stop,
                                  std::string after = "", const std::string& token = kToken) {
    std::vector<v1::JobEvent> events;
    for (int attempt = 0; attempt < 20; ++attempt) {
      v1::WatchJobRequest request;
      request.set_job_id(id);
      request.set_after_event_id(after);
      grpc::ClientContext context;
      services::AddBearer(&context, token);
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
      auto reader = stub_->WatchJob(&context, request);
      v1::JobEvent e;
      while (reader->Read(&e)) {
        events.push_back(e);
        after = e.id();
        if (stop(e)) {
          context.TryCancel();
          reader->Finish();
          return events;
        }
      }
      const grpc::Status status = reader->Finish();
      if (status.ok()) return events;
      // UNAVAILABLE while a coordinator restarts: reconnect and resume.
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE) {
        ADD_FAILURE() << status.error_message();
        return events;
      }
      channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
    }
    return events;
  }

  // The job worker i holds ("" when idle, "?" when it does not answer).
  std::string HeldJob(size_t i) {
    auto worker = v1::Worker::NewStub(grpc::CreateChannel(worker_addr_[i], grpc::InsecureChannelCredentials()));
    v1::WorkerStats stats;
    grpc::ClientContext context;
    Auth(&context);
    return worker->GetStats(&context, v1::GetStatsRequest(), &stats).ok() ? stats.job_id() : std::string("?");
  }

  // Restarts `workers` with STRATA_FAILPOINT=`failpoint` in their
  // environment, then runs a 3-iteration ReMax job (with `overrides`) on a
  // 2-rank gang into `out`: it must succeed with no gang lost on the way (no
  // requeue logged).
  void ExpectTwoRankJobSucceedsWithoutRequeue(const std::string& out, const std::string& failpoint,
                                              const std::vector<int>& workers,
                                              std::vector<std::string> overrides = {}) {
    for (int i : workers) {
      workers_[static_cast<size_t>(i)]->Kill(SIGKILL);
      StartWorker(i, {"STRATA_FAILPOINT=" + failpoint});
      WaitUntilRegistered(i);
    }
    v1::Job job;
    overrides.push_back("parallel.workers=2");
    const grpc::Status submitted = Submit(Spec(3, out), &job, "", overrides);
    ASSERT_TRUE(submitted.ok()) << submitted.error_message();
    const auto events = Watch(job.id(), Ended);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back().state(), v1::SUCCEEDED) << Get(job.id()).error_message() << "\n" << coordinator_->Log();
    EXPECT_EQ(Count(events, "log"), 0) << "a rank was given up: " << coordinator_->Log();
  }

  // Two workers: a long job of one runs, an older gang job of two waits
  // with one worker free, and a younger job of one (submitted with
  // `younger_token`) must wait behind it, told so once, instead of taking
  // that worker (it would, each time a worker freed, and the gang job could
  // wait for ever); it runs after the gang job. `named`: whether the
  // younger job's owner may see the gang job's id.
  void ExpectYoungerJobWaitsBehindTheGangJob(const std::string& older_token, const std::string& younger_token,
                                             bool named) {
    v1::Job long_job, gang_job, small_job;
    ASSERT_TRUE(Submit(Spec(500, "holder_long"), &long_job, "", {}, older_token).ok());
    Watch(long_job.id(), AtIteration(1), "", older_token);
    ASSERT_TRUE(Submit(Spec(2, "holder_gang"), &gang_job, "", {"parallel.workers=2"}, older_token).ok());
    ASSERT_TRUE(Submit(Spec(2, "holder_small"), &small_job, "", {}, younger_token).ok());
    std::string told;
    Watch(
        small_job.id(),
        [&](const v1::JobEvent& e) {
          if (e.type() == "log" && e.json().find("queued behind") != std::string::npos) told = e.json();
          return !told.empty() || Ended(e);
        },
        "", younger_token);
    ASSERT_FALSE(told.empty()) << "the younger job ran on the gang job's free worker\n" << coordinator_->Log();
    EXPECT_EQ(told.find(gang_job.id()) != std::string::npos, named) << told;
    EXPECT_EQ(Get(small_job.id(), younger_token).state(), v1::QUEUED);
    EXPECT_EQ(Get(gang_job.id(), older_token).state(), v1::QUEUED);
    v1::Job cancelled;
    ASSERT_TRUE(Cancel(long_job.id(), &cancelled, older_token).ok());
    const auto gang_events = Watch(gang_job.id(), Ended, "", older_token);
    EXPECT_EQ(gang_events.back().state(), v1::SUCCEEDED) << Get(gang_job.id(), older_token).error_message();
    const auto small_events = Watch(small_job.id(), Ended, "", younger_token);
    EXPECT_EQ(small_events.back().state(), v1::SUCCEEDED) << Get(small_job.id(), younger_token).error_message();
    // The small job started only once the gang job had ended (event ids
    // begin with Redis's clock in milliseconds).
    auto started_ms = [](const std::vector<v1::JobEvent>& events) {
      int64_t ms = -1;
      for (const auto& e : events) {
        if (e.type() == "state" && e.state() == v1::RUNNING && ms < 0) {
          EXPECT_TRUE(absl::SimpleAtoi(e.id().substr(0, e.id().find('-')), &ms)) << e.id();
        }
      }
      return ms;
    };
    int64_t gang_ended_ms = -1;
    ASSERT_TRUE(absl::SimpleAtoi(gang_events.back().id().substr(0, gang_events.back().id().find('-')), &gang_ended_ms));
    EXPECT_GE(started_ms(small_events), gang_ended_ms);
  }

  // Polls the worker processes until none holds a job (true) or `limit`
  // passes (false).
  bool WaitUntilWorkersIdle(std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (true) {
      bool idle = true;
      for (size_t i = 0; i < worker_addr_.size(); ++i) idle = idle && HeldJob(i).empty();
      if (idle) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // polls other processes
    }
  }

  // Registers a worker the fixture did not start (a ghost, an in-process fake).
  grpc::Status RegisterWorker(const v1::RegisterWorkerRequest& request) {
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    Auth(&context);
    return stub_->RegisterWorker(&context, request, &response);
  }

  static bool Ended(const v1::JobEvent& e) { return e.type() == "state" && e.state() >= v1::SUCCEEDED; }
  // The job's events until it went from RUNNING back to QUEUED (or ended),
  // once it has reported iteration `past` (0-based; -1: at once). A test's
  // fault point requeues the job late in a run; a loaded machine can requeue
  // it earlier too, a rank past the 5 s collective timeout, and that attempt
  // runs again.
  std::vector<v1::JobEvent> WatchUntilRequeued(const std::string& id, int64_t past = -1) {
    bool running = false, reached = past < 0;
    return Watch(id, [&](const v1::JobEvent& e) {
      if (e.type() == "metrics" && e.iteration() >= past) reached = true;
      if (e.type() != "state") return false;
      if (e.state() == v1::RUNNING) running = true;
      return (reached && running && e.state() == v1::QUEUED) || Ended(e);
    });
  }
  static std::function<bool(const v1::JobEvent&)> AtIteration(int64_t n) {
    return [n](const v1::JobEvent& e) { return (e.type() == "metrics" && e.iteration() >= n) || Ended(e); };
  }
  static int Count(const std::vector<v1::JobEvent>& events, const std::string& type) {
    return static_cast<int>(
        std::count_if(events.begin(), events.end(), [&](const auto& e) { return e.type() == type; }));
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::RedisServer> redis_;
  std::string model_, coordinator_addr_;
  std::vector<std::string> worker_addr_, metrics_addr_;
  std::unique_ptr<ChildProcess> coordinator_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(ServiceTest, SubmitWatchSucceed) {
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(4, "out1"), &job).ok());
  EXPECT_EQ(job.state(), v1::QUEUED);
  const auto events = Watch(job.id(), Ended);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().state(), v1::SUCCEEDED) << coordinator_->Log();
  EXPECT_EQ(Count(events, "metrics"), 4);
  const v1::Job done = Get(job.id());
  EXPECT_EQ(done.state(), v1::SUCCEEDED);
  EXPECT_EQ(done.iteration(), 4);
  EXPECT_TRUE(IsRegularFile(dir_.Join("out1/model.safetensors")));
}

TEST_F(ServiceTest, CancelStopsTheJobAndFreesTheWorker) {
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(500, "long"), &job).ok());
  Watch(job.id(), AtIteration(1));
  v1::Job cancelled;
  ASSERT_TRUE(Cancel(job.id(), &cancelled).ok());
  EXPECT_EQ(cancelled.state(), v1::CANCELLED);
  EXPECT_EQ(Cancel(job.id(), &cancelled).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // Both workers take new work again: two short jobs succeed.
  v1::Job a, b;
  ASSERT_TRUE(Submit(Spec(1, "after_a"), &a).ok());
  ASSERT_TRUE(Submit(Spec(1, "after_b"), &b).ok());
  EXPECT_EQ(Watch(a.id(), Ended).back().state(), v1::SUCCEEDED);
  EXPECT_EQ(Watch(b.id(), Ended).back().state(), v1::SUCCEEDED);
  EXPECT_EQ(Get(job.id()).state(), v1::CANCELLED);
}

TEST_F(ServiceTest, IdempotentResubmitAndListPaging) {
  v1::Job first, again;
  ASSERT_TRUE(Submit(Spec(1, "idem"), &first, "request-42").ok());
  ASSERT_TRUE(Submit(Spec(1, "idem"), &again, "request-42").ok());
  EXPECT_EQ(first.id(), again.id());
  std::set<std::string> ids = {first.id()};
  for (int i = 0; i < 4; ++i) {
    v1::Job job;
    ASSERT_TRUE(Submit(Spec(1, absl::StrCat("page", i)), &job).ok());
    ids.insert(job.id());
  }
  std::set<std::string> listed;
  v1::ListJobsRequest request;
  request.set_page_size(2);
  int pages = 0;
  do {
    v1::ListJobsResponse response;
    grpc::ClientContext context;
    Auth(&context);
    ASSERT_TRUE(stub_->ListJobs(&context, request, &response).ok());
    EXPECT_LE(response.jobs_size(), 2);
    for (const auto& j : response.jobs()) EXPECT_TRUE(listed.insert(j.id()).second) << "duplicate " << j.id();
    request.set_page_token(response.next_page_token());
    ++pages;
  } while (!request.page_token().empty());
  EXPECT_EQ(listed, ids);
  EXPECT_EQ(pages, 3);
}

TEST_F(ServiceTest, WorkerKilledMidJobResumesFromCheckpoint) {
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(8, "kw", /*checkpoint_every=*/2), &job).ok());
  Watch(job.id(), AtIteration(3));  // a checkpoint at iteration 2 exists now
  const v1::Job running = Get(job.id());
  ASSERT_EQ(running.state(), v1::RUNNING);
  const int victim = running.worker() == "w0" ? 0 : 1;
  workers_[victim]->Kill(SIGKILL);
  StartWorker(victim);  // it comes back
  const auto events = Watch(job.id(), Ended);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().state(), v1::SUCCEEDED) << coordinator_->Log();
  EXPECT_EQ(Get(job.id()).iteration(), 8);
  // The job went back to the queue and resumed at a checkpoint: after the
  // requeue, the first metrics line is at an even iteration (checkpoint every
  // 2), no later than the first one not yet reported, and at most one
  // interval back.
  const auto all = Watch(job.id(), Ended, "");
  bool requeued = false;
  int64_t reported = -1;  // highest iteration reported before the requeue
  int64_t resumed_at = -1;
  for (const auto& e : all) {
    if (e.type() == "state" && e.state() == v1::QUEUED && reported >= 0) requeued = true;
    if (e.type() != "metrics") continue;
    if (requeued && resumed_at < 0) resumed_at = e.iteration();
    if (!requeued) reported = std::max(reported, e.iteration());
  }
  ASSERT_TRUE(requeued) << "the job never went back to the queue";
  ASSERT_GE(resumed_at, 0);
  EXPECT_EQ(resumed_at % 2, 0);             // resumed at a checkpoint
  EXPECT_LE(resumed_at, reported + 1);      // nothing skipped
  EXPECT_GE(resumed_at, reported + 1 - 2);  // lost at most one interval
  EXPECT_EQ(all.back().state(), v1::SUCCEEDED);
}

// A new job whose output.dir holds another job's checkpoints is refused,
// naming that job, instead of silently continuing it.
TEST_F(ServiceTest, NewJobDoesNotContinueAnotherJobsCheckpoints) {
  v1::Job first;
  ASSERT_TRUE(Submit(Spec(2, "shared", /*checkpoint_every=*/1), &first).ok());
  ASSERT_EQ(Watch(first.id(), Ended).back().state(), v1::SUCCEEDED) << coordinator_->Log();
  v1::Job second;
  ASSERT_TRUE(Submit(Spec(2, "shared", /*checkpoint_every=*/1), &second).ok());
  EXPECT_EQ(Watch(second.id(), Ended).back().state(), v1::FAILED);
  const std::string error = Get(second.id()).error_message();
  EXPECT_NE(error.find("job " + first.id()), std::string::npos) << error;
  EXPECT_NE(error.find("output.dir"), std::string::npos) << error;
}

TEST_F(ServiceTest, CoordinatorKilledMidJobResumes) {
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(8, "kc", 2), &job).ok());
  Watch(job.id(), AtIteration(3));
  coordinator_->Kill(SIGKILL);
  StartCoordinator();
  ASSERT_TRUE(channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(20)));
  const auto events = Watch(job.id(), Ended);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().state(), v1::SUCCEEDED) << coordinator_->Log();
  EXPECT_EQ(Get(job.id()).iteration(), 8);
  // The worker that ran the job when the coordinator died was never told to
  // unload it. The new coordinator reconciles: a heartbeat naming a job no
  // loop of its own runs is answered "drop it", so both workers end idle.
  EXPECT_TRUE(WaitUntilWorkersIdle(std::chrono::seconds(20))) << "still held: " << HeldJob(0) << ", " << HeldJob(1);
  // A later job on both workers runs (it used to FAIL with "holds job ...",
  // every time).
  v1::Job after;
  ASSERT_TRUE(Submit(Spec(2, "kc-after", 1), &after, "", {"parallel.workers=2"}).ok());
  EXPECT_EQ(Watch(after.id(), Ended).back().state(), v1::SUCCEEDED) << Get(after.id()).error_message();
}

TEST_F(ServiceTest, RedisRestartKeepsJobsAndEvents) {
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(2, "rr"), &job).ok());
  const auto before = Watch(job.id(), Ended);
  ASSERT_EQ(before.back().state(), v1::SUCCEEDED);
  ASSERT_TRUE(redis_->Stop().ok());
  const absl::Status restarted = redis_->Restart();
  ASSERT_TRUE(restarted.ok()) << restarted;
  // The coordinator's next calls reconnect; the job and its events are there.
  v1::GetJobRequest request;
  request.set_job_id(job.id());
  v1::Job after;
  grpc::Status status;
  // Each call may land once on one of the pool's idle connections that the
  // restart dropped (up to max_idle_connections = 4 of them), and fail
  // UNAVAILABLE; under load more than two can be in the pool at once.
  for (int attempt = 0; attempt < 6; ++attempt) {
    grpc::ClientContext context;
    Auth(&context);
    status = stub_->GetJob(&context, request, &after);
    if (status.ok()) break;
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(after.state(), v1::SUCCEEDED);
  const auto replay = Watch(job.id(), Ended, "");
  EXPECT_EQ(replay.size(), before.size());
}

// Redis dies mid-job and the job ends while it is down: the coordinator
// keeps trying to record the end until Redis is back. (The job used to stay
// RUNNING forever, and the next coordinator ran it again from the start.)
TEST_F(ServiceTest, JobThatEndsWhileRedisIsDownIsRecordedOnceRedisIsBack) {
  constexpr int kIterations = 16;
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(kIterations, "redis-down", 4), &job).ok());
  Watch(job.id(), AtIteration(1));
  ASSERT_TRUE(redis_->Stop().ok());
  // The ranks need no Redis: wait for the job's last metrics line.
  const std::string metrics = dir_.Join("redis-down/metrics.jsonl");
  auto lines = [&] {
    auto text = ReadFileToString(metrics);
    return text.ok() ? static_cast<int>(std::count(text->begin(), text->end(), '\n')) : 0;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (lines() < kIterations && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // polls a file another process writes
  }
  ASSERT_EQ(lines(), kIterations) << workers_[0]->Log();
  // The last line is written before the job's end (the output model is
  // saved after it): Redis stays down until the coordinator has failed to
  // record the end at least once, however slowly the machine runs it.
  const std::string failed_attempt = "recording SUCCEEDED (attempt 1)";
  while (coordinator_->Log().find(failed_attempt) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // polls a file another process writes
  }
  ASSERT_NE(coordinator_->Log().find(failed_attempt), std::string::npos) << coordinator_->Log();
  ASSERT_TRUE(redis_->Restart().ok());
  const auto events = Watch(job.id(), Ended);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().state(), v1::SUCCEEDED) << coordinator_->Log();
  EXPECT_EQ(Get(job.id()).iteration(), kIterations);
  EXPECT_EQ(lines(), kIterations) << "the job ran again";
  // It ended while Redis was down: the first attempts to record it failed.
  EXPECT_NE(coordinator_->Log().find("SUCCEEDED recorded on attempt"), std::string::npos) << coordinator_->Log();
}

// A worker registered at a port nobody listens on (as a killed worker is
// while its registration lives on) was picked again and again until its TTL
// ran out: thousands of requeues and events. It is now probed, deregistered
// and kept out of gangs, and the job backs off and runs on a live worker.
TEST_F(ServiceTest, WorkerThatDoesNotAnswerCausesOneRequeueNotAStorm) {
  auto port = testing::RedisServer::FreePort();
  ASSERT_TRUE(port.ok());
  v1::RegisterWorkerRequest ghost;
  ghost.set_worker_id("a-ghost");  // sorts first: the scheduler tries it first
  ghost.set_address(absl::StrCat("127.0.0.1:", *port));
  ASSERT_TRUE(RegisterWorker(ghost).ok());
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(2, "ghost"), &job).ok());
  const auto events = Watch(job.id(), Ended);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().state(), v1::SUCCEEDED) << Get(job.id()).error_message();
  EXPECT_EQ(Count(events, "log"), 1) << events.size() << " events";
  for (const auto& e : events) {
    if (e.type() == "log") {
      EXPECT_NE(e.json().find("not answering: a-ghost"), std::string::npos) << e.json();
    }
  }
}

TEST_F(ServiceTest, BadInputGetsTheRightCodeAndServersKeepServing) {
  struct Case {
    std::string spec;
    std::vector<std::string> overrides;
    grpc::StatusCode code;
    std::string mentions;
  };
  // A finished job first: a worker has registered (the admission checks
  // below use what workers report).
  v1::Job warm;
  ASSERT_TRUE(Submit(Spec(1, "warm"), &warm).ok());
  ASSERT_EQ(Watch(warm.id(), Ended).back().state(), v1::SUCCEEDED);
  // A model directory holding Llama-2-7B's config: its Adam states alone
  // need ~100 GiB of host memory, more than any worker here has.
  const std::string big = dir_.Join("llama2-7b");
  std::filesystem::create_directories(big);
  std::filesystem::copy_file(testing::SourcePath("examples/llama2-7b/config.json"), JoinPath(big, "config.json"));
  // Model states that fit easily (a tiny model with a 150k vocabulary:
  // ~80M parameters) but whose scoring logits at this batch and length do
  // not (256 rows x 128 tokens x 150k x 12 bytes: ~59 GB): the planner's
  // whole prediction is what admission checks, not model states alone.
  const std::string wide = dir_.Join("wide-vocab");
  std::filesystem::create_directories(wide);
  {
    auto config = nlohmann::json::parse(*ReadFileToString(testing::SourcePath("examples/tiny/model.json")));
    config["vocab_size"] = 150000;
    testing::WriteTextFile(JoinPath(wide, "config.json"), config.dump());
  }
  const std::vector<std::string> wide_job = {"models.actor.path=" + wide, "models.reference.path=" + wide,
                                             "train.batch_size=256", "data.max_prompt_tokens=64",
                                             "generation.max_new_tokens=64"};
  const std::vector<Case> cases = {
      {Spec(1, "x"), {"models.actor.path=" + big}, grpc::StatusCode::RESOURCE_EXHAUSTED, "host memory"},
      {Spec(1, "x"), wide_job, grpc::StatusCode::RESOURCE_EXHAUSTED, "activations, KV cache"},
      {"algorithm: [remax", {}, grpc::StatusCode::INVALID_ARGUMENT, "YAML"},
      {Spec(1, "x"), {"algorithm=dpo"}, grpc::StatusCode::INVALID_ARGUMENT, "algorithm"},
      {Spec(1, "x"), {"train.lr=-0.1"}, grpc::StatusCode::INVALID_ARGUMENT, "train.lr"},
      {Spec(1, "x"), {"train.batch_size=1000000"}, grpc::StatusCode::RESOURCE_EXHAUSTED, "train.batch_size"},
      {Spec(1, "x"),
       {"algorithm=grpo", "group.samples_per_prompt=100000"},
       grpc::StatusCode::RESOURCE_EXHAUSTED,
       "spec key 'group.samples_per_prompt'"},
      {Spec(1, "x"), {"memory.host_mib=100000000"}, grpc::StatusCode::RESOURCE_EXHAUSTED, "spec key 'memory.host_mib'"},
      {Spec(1, "x"),
       {"train.batch_size=2000", "generation.max_new_tokens=4000"},
       grpc::StatusCode::RESOURCE_EXHAUSTED,
       "'generation.max_new_tokens' (4016 tokens a row) x 4000 rows"},
      // Found by a probe: each used to pass, or to fail without saying why.
      {Spec(1, "x"), {"train.lr=.inf"}, grpc::StatusCode::INVALID_ARGUMENT, "train.lr' must be a finite number"},
      {Spec(1, "x"), {"train.seed=-1"}, grpc::StatusCode::INVALID_ARGUMENT, "train.seed' must be >= 0"},
      {Spec(1, "x") + "train: {iterations: 3}\n", {}, grpc::StatusCode::INVALID_ARGUMENT, "'train' appears twice"},
      {"algorithm: remax\n\xff\xfe\x80 random bytes", {}, grpc::StatusCode::INVALID_ARGUMENT, "not UTF-8 text"},
      {Spec(1, "x") + "#" + std::string(2 << 20, 'x') + "\n",
       {},
       grpc::StatusCode::INVALID_ARGUMENT,
       "a spec may have at most 1048576"},
  };
  for (const auto& c : cases) {
    v1::Job job;
    const grpc::Status status = Submit(c.spec, &job, "", c.overrides);
    EXPECT_EQ(status.error_code(), c.code) << c.mentions << ": " << status.error_message();
    EXPECT_NE(status.error_message().find(c.mentions), std::string::npos) << status.error_message();
  }
  // Garbage bytes on the coordinator's port.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(coordinator_addr_.substr(coordinator_addr_.find(':') + 1))));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string garbage = "GET / HTTP/1.1\r\n\r\n\x00\xff\xfe garbage \x01\x02";
  ASSERT_GT(::write(fd, garbage.data(), garbage.size()), 0);
  ::close(fd);
  // No token, a wrong token.
  for (const std::string& token : {std::string(), std::string("wrong-token")}) {
    v1::ListJobsRequest request;
    v1::ListJobsResponse response;
    grpc::ClientContext context;
    Auth(&context, token);
    EXPECT_EQ(stub_->ListJobs(&context, request, &response).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // A value of 1 MiB is echoed back as a short prefix, not whole.
  {
    v1::Job job;
    const grpc::Status status = Submit(Spec(1, "x"), &job, "", {"algorithm=" + std::string(1 << 20, 'd')});
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_LT(status.error_message().size(), 400u);
  }
  // Still serving, and jobs still run.
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(1, "still"), &job).ok());
  // A page of jobs carries summaries (a big spec in every job used to push
  // the page past the client's limit); the job itself carries its spec.
  {
    v1::ListJobsRequest request;
    v1::ListJobsResponse page;
    grpc::ClientContext list_context;
    Auth(&list_context);
    ASSERT_TRUE(stub_->ListJobs(&list_context, request, &page).ok());
    ASSERT_EQ(page.jobs_size(), 2);  // warm and still: the refused submissions created nothing
    for (const auto& j : page.jobs()) EXPECT_TRUE(j.spec_yaml().empty()) << j.id();
    EXPECT_FALSE(Get(job.id()).spec_yaml().empty());
  }
  EXPECT_EQ(Watch(job.id(), Ended).back().state(), v1::SUCCEEDED);
  v1::GetJobRequest missing;
  missing.set_job_id("job-000000000000");
  v1::Job none;
  grpc::ClientContext context;
  Auth(&context);
  EXPECT_EQ(stub_->GetJob(&context, missing, &none).error_code(), grpc::StatusCode::NOT_FOUND);
}

// Confinement: a job may name only paths inside the workers' data root (or
// an allowed directory). Writing elsewhere, climbing out with "..", or
// probing a file outside is refused at submit with PERMISSION_DENIED naming
// the key (the workers report what they serve when they register), and
// nothing is created. (All three used to succeed; then they failed the job
// only when a worker started it, and the submitter learned nothing at
// submit.)
TEST_F(ServiceTest, JobPathsOutsideTheDataRootAreRefusedAtSubmit) {
  testing::TempDir outside;
  const std::string escape = outside.Join("written-here");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"output.dir=" + escape, "output.dir"},
      {"output.dir=../../../../../../../.." + escape, "output.dir"},
      {"data.train=/etc/shadow", "data.train"},
  };
  for (const auto& [override_, key] : cases) {
    v1::Job job;
    const grpc::Status submitted = Submit(Spec(1, "confined"), &job, "", {override_});
    EXPECT_EQ(submitted.error_code(), grpc::StatusCode::PERMISSION_DENIED) << override_;
    EXPECT_NE(submitted.error_message().find("spec key '" + key + "'"), std::string::npos) << submitted.error_message();
  }
  EXPECT_FALSE(std::filesystem::exists(escape));
}

// Relative paths in a spec resolve in the workers' working directory, not
// the coordinator's.
TEST_F(ServiceTest, RelativePathsResolveWhereTheWorkersRun) {
  std::filesystem::copy_file(testing::SourcePath("examples/tiny/data/prompts.jsonl"), dir_.Join("prompts.jsonl"));
  const std::string spec = R"(
algorithm: remax
models:
  actor: {path: model}
  reward: {rule: vowel_fraction}
data: {train: prompts.jsonl, max_prompt_tokens: 16}
train: {iterations: 2, batch_size: 2, lr: 1.0e-3}
generation: {max_new_tokens: 6}
checkpoint: {every: 1}
memory: {host_mib: 128}
output: {dir: relative_out}
)";
  v1::Job job;
  const grpc::Status submitted = Submit(spec, &job);
  ASSERT_TRUE(submitted.ok()) << submitted.error_message();
  EXPECT_EQ(Watch(job.id(), Ended).back().state(), v1::SUCCEEDED) << Get(job.id()).error_message();
  EXPECT_TRUE(IsRegularFile(dir_.Join("relative_out/model.safetensors")));
  EXPECT_TRUE(IsRegularFile(dir_.Join("relative_out/metrics.jsonl")));
  EXPECT_FALSE(std::filesystem::exists(JoinPath(CoordinatorDirectory(), "relative_out")));
  // A relative model path that does not exist where the workers run fails
  // the job when the workers start it, naming the model (the coordinator
  // opens no job file, so it cannot tell at submit).
  v1::Job missing;
  ASSERT_TRUE(Submit(spec, &missing, "", {"models.actor.path=no_such_model"}).ok());
  EXPECT_EQ(Watch(missing.id(), Ended).back().state(), v1::FAILED);
  const v1::Job failed = Get(missing.id());
  EXPECT_NE(failed.error_message().find("models.actor"), std::string::npos) << failed.error_message();
  EXPECT_NE(failed.error_message().find("no_such_model"), std::string::npos) << failed.error_message();
}

// Health checks need no token, on both servers; everything else does.
TEST_F(ServiceTest, HealthCheckIsServedWithoutAToken) {
  for (const std::string& addr : {coordinator_addr_, worker_addr_[0]}) {
    auto health = grpc::health::v1::Health::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    context.set_wait_for_ready(true);
    const grpc::Status status = health->Check(&context, request, &response);
    ASSERT_TRUE(status.ok()) << addr << ": " << status.error_message();
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING) << addr;
  }
}

// Secrets stay secret: a token file others can read, a Redis password in
// the URL (ps shows argv) and a server with no token at all are refused at
// start, naming what to do; --insecure is the explicit way to run open.
TEST_F(ServiceTest, ServersRefuseExposedSecretsAndMissingTokens) {
  const std::string open_token = dir_.Join("open-token");
  testing::WriteTextFile(open_token, kToken);
  ::chmod(open_token.c_str(), 0644);
  auto free_port = testing::RedisServer::FreePort();
  ASSERT_TRUE(free_port.ok());
  const std::string listen = absl::StrCat("127.0.0.1:", *free_port);
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), testing::StrataBinary());
    auto r = testing::RunCommand(args);
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : testing::CommandResult{};
  };
  auto readable = run({"coordinator", "--listen", listen, "--redis", redis_->url(), "--token-file", open_token});
  EXPECT_NE(readable.exit_code, 0);
  EXPECT_NE(readable.error.find(open_token + " is open to group or others (mode 0644)"), std::string::npos)
      << readable.error;
  auto worker = run({"worker", "--listen", listen, "--token-file", open_token});
  EXPECT_NE(worker.exit_code, 0);
  EXPECT_NE(worker.error.find("chmod 600"), std::string::npos) << worker.error;
  auto password = run({"coordinator", "--listen", listen, "--redis", "redis://:hunter2secret@127.0.0.1:1",
                       "--token-file", dir_.Join("token")});
  EXPECT_NE(password.exit_code, 0);
  EXPECT_NE(password.error.find("--redis-password-file"), std::string::npos) << password.error;
  EXPECT_EQ(password.error.find("hunter2secret"), std::string::npos) << password.error;
  auto open = run({"coordinator", "--listen", listen, "--redis", redis_->url()});
  EXPECT_NE(open.exit_code, 0);
  EXPECT_NE(open.error.find("--insecure"), std::string::npos) << open.error;
}

// Health follows Redis: NOT_SERVING while the job store is unreachable (so
// Kubernetes stops routing clients to a coordinator that cannot take jobs),
// SERVING again once it is back. The health stream reports each change.
TEST_F(ServiceTest, CoordinatorHealthIsNotServingWhileRedisIsDown) {
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(coordinator_addr_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  grpc::health::v1::HealthCheckRequest request;
  auto reader = health->Watch(&context, request);
  grpc::health::v1::HealthCheckResponse response;
  using Health = grpc::health::v1::HealthCheckResponse;
  auto wait_for = [&](Health::ServingStatus want) {
    while (reader->Read(&response)) {
      if (response.status() == want) return true;
    }
    return false;
  };
  ASSERT_TRUE(wait_for(Health::SERVING));
  ASSERT_TRUE(redis_->Stop().ok());
  EXPECT_TRUE(wait_for(Health::NOT_SERVING)) << coordinator_->Log();
  ASSERT_TRUE(redis_->Restart().ok());
  EXPECT_TRUE(wait_for(Health::SERVING)) << coordinator_->Log();
  context.TryCancel();
  reader->Finish();
}

// A coordinator that starts while Redis is down (both restarted after a
// node failure, found by the soak) waits for it instead of exiting into its
// supervisor's crash loop, then serves; the jobs Redis kept are there.
TEST_F(ServiceTest, ACoordinatorStartedWhileRedisIsDownWaitsForIt) {
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(2, "before_the_outage"), &job).ok());
  coordinator_->Kill(SIGKILL);
  ASSERT_TRUE(redis_->Stop().ok());
  StartCoordinator();
  // It says it is waiting (the log is its only sign of life until then).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (coordinator_->Log().find("trying again") == std::string::npos && coordinator_->Alive() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polls another process's log
  }
  ASSERT_TRUE(coordinator_->Alive()) << "the coordinator exited while Redis was down:\n" << coordinator_->Log();
  ASSERT_NE(coordinator_->Log().find("trying again"), std::string::npos) << coordinator_->Log();
  ASSERT_TRUE(redis_->Restart().ok());
  ASSERT_TRUE(channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30)))
      << coordinator_->Log();
  const auto events = Watch(job.id(), Ended);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().state(), v1::SUCCEEDED) << Get(job.id()).error_message() << "\n" << coordinator_->Log();
}

// Workers whose NVMe directory is a small filesystem of its own (a tmpfs,
// which needs root), so that a test can fill it.
class FullDiskServiceTest : public ServiceTest {
 protected:
  void SetUp() override {
    if (::geteuid() != 0 || !testing::HaveProgram("mount")) GTEST_SKIP() << "needs root to mount a tmpfs";
    std::filesystem::create_directories(nvme_);
    auto mounted = testing::RunCommand({"mount", "-t", "tmpfs", "-o", "size=32m", "strata-test", nvme_});
    if (!mounted.ok() || mounted->exit_code != 0) GTEST_SKIP() << "cannot mount a tmpfs here";
    mounted_ = true;
    ServiceTest::SetUp();
  }
  void TearDown() override {
    if (mounted_) (void)testing::RunCommand({"umount", "-l", nvme_});
  }
  std::vector<std::string> WorkerFlags() const override { return {"--nvme-dir", nvme_}; }

  // Takes all but a few KiB of the filesystem.
  void FillDisk() {
    struct statvfs fs {};
    ASSERT_EQ(::statvfs(nvme_.c_str(), &fs), 0);
    const int fd = ::open(Ballast().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    const off_t size = static_cast<off_t>(fs.f_bavail * fs.f_frsize) - 16 * 1024;
    EXPECT_EQ(::posix_fallocate(fd, 0, size), 0);
    ::close(fd);
  }
  std::string Ballast() const { return JoinPath(nvme_, "ballast"); }

  std::string nvme_ = dir_.Join("nvme");
  bool mounted_ = false;
};

// A full disk on the workers fails a job's rank with ENOSPC: the machine's
// fault, so the job goes back to the queue (found by the soak: one worker
// with a full disk failed every job the scheduler gave it, dozens in ten
// seconds). Once there is space it runs to the end.
TEST_F(FullDiskServiceTest, AJobThatMeetsAFullDiskIsRequeuedNotFailed) {
  FillDisk();
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(3, "full_disk"), &job, "", {"models.actor.placement.optimizer=nvme"}).ok());
  std::string requeued;
  Watch(job.id(), [&](const v1::JobEvent& e) {
    if (e.type() == "log" && e.json().find("disk full on") != std::string::npos) requeued = e.json();
    return !requeued.empty() || Ended(e);
  });
  ASSERT_FALSE(requeued.empty()) << "not requeued: " << v1::JobState_Name(Get(job.id()).state()) << " "
                                 << Get(job.id()).error_message();
  EXPECT_NE(requeued.find("No space left on device"), std::string::npos) << requeued;
  ASSERT_EQ(::unlink(Ballast().c_str()), 0);
  const auto events = Watch(job.id(), Ended);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().state(), v1::SUCCEEDED) << Get(job.id()).error_message() << "\n" << coordinator_->Log();
}

// A coordinator serving TLS: a client that trusts its CA gets through, a
// plaintext client does not.
TEST_F(ServiceTest, TlsCoordinatorServesClientsThatTrustItsCa) {
  if (!testing::HaveProgram("openssl")) GTEST_SKIP() << "needs the openssl command to make certificates";
  auto run = [&](std::vector<std::string> argv) {
    auto r = testing::RunCommand(argv);
    ASSERT_TRUE(r.ok() && r->exit_code == 0) << argv[1] << ": " << (r.ok() ? r->error : r.status().ToString());
  };
  const auto d = [&](const char* f) { return dir_.Join(f); };
  run({"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", d("ca.key"), "-out", d("ca.pem"), "-days",
       "1", "-subj", "/CN=strata-test-ca"});
  run({"openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", d("server.key"), "-out", d("server.csr"), "-subj",
       "/CN=localhost"});
  testing::WriteTextFile(d("ext.cnf"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
  run({"openssl", "x509", "-req", "-in", d("server.csr"), "-CA", d("ca.pem"), "-CAkey", d("ca.key"), "-CAcreateserial",
       "-out", d("server.pem"), "-days", "1", "-extfile", d("ext.cnf")});
  auto port = testing::RedisServer::FreePort();
  ASSERT_TRUE(port.ok());
  const std::string addr = absl::StrCat("localhost:", *port);
  auto tls = ChildProcess::Spawn({testing::StrataBinary(), "coordinator", "--listen", addr, "--redis", redis_->url(),
                                  "--token-file", d("token"), "--tls-cert", d("server.pem"), "--tls-key",
                                  d("server.key")},
                                 d("tls-coordinator.log"), dir_.path());
  ASSERT_TRUE(tls.ok());
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = *ReadFileToString(d("ca.pem"));
  auto channel = grpc::CreateChannel(addr, grpc::SslCredentials(ssl));
  ASSERT_TRUE(channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(20))) << (*tls)->Log();
  auto trusted = testing::RunCommand(
      {testing::StrataBinary(), "jobs", "--addr", addr, "--tls-ca", d("ca.pem"), "--token-file", d("token")});
  ASSERT_TRUE(trusted.ok());
  EXPECT_EQ(trusted->exit_code, 0) << trusted->error;
  auto plaintext = testing::RunCommand({testing::StrataBinary(), "jobs", "--addr", addr, "--token-file", d("token")});
  ASSERT_TRUE(plaintext.ok());
  EXPECT_NE(plaintext->exit_code, 0);
  EXPECT_NE(plaintext->error.find("UNAVAILABLE"), std::string::npos) << plaintext->error;
}

// 50 concurrent clients submitting, listing, reading and watching for a
// bounded time: every call succeeds. (Latency figures: strata bench service,
// docs/BENCHMARKS.md.)
// mTLS between every part: the coordinator and a worker each present a
// certificate and require one (--tls-ca), the coordinator dials the worker
// with its own, and a client without a certificate is turned away.
TEST_F(ServiceTest, MutualTlsJobRunsAndClientsWithoutACertificateAreRefused) {
  if (!testing::HaveProgram("openssl")) GTEST_SKIP() << "needs the openssl command to make certificates";
  auto run = [&](std::vector<std::string> argv) {
    auto r = testing::RunCommand(argv);
    ASSERT_TRUE(r.ok() && r->exit_code == 0) << argv[1] << ": " << (r.ok() ? r->error : r.status().ToString());
  };
  const auto d = [&](const std::string& f) { return dir_.Join(f); };
  run({"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", d("ca.key"), "-out", d("ca.pem"), "-days",
       "1", "-subj", "/CN=strata-test-ca"});
  testing::WriteTextFile(d("ext.cnf"),
                         "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n");
  for (const std::string name : {"node", "client"}) {
    run({"openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", d(name + ".key"), "-out", d(name + ".csr"),
         "-subj", "/CN=" + name});
    run({"openssl", "x509", "-req", "-in", d(name + ".csr"), "-CA", d("ca.pem"), "-CAkey", d("ca.key"),
         "-CAcreateserial", "-out", d(name + ".pem"), "-days", "1", "-extfile", d("ext.cnf")});
  }
  const std::vector<std::string> node_tls = {"--tls-cert",  d("node.pem"), "--tls-key",
                                             d("node.key"), "--tls-ca",    d("ca.pem")};
  // A stack of its own (Redis included), so the fixture's plaintext
  // coordinator never sees this worker.
  auto redis = testing::RedisServer::Start();
  ASSERT_TRUE(redis.ok()) << redis.status();
  auto coordinator_port = testing::RedisServer::FreePort();
  auto worker_port = testing::RedisServer::FreePort();
  ASSERT_TRUE(coordinator_port.ok() && worker_port.ok());
  const std::string coordinator = absl::StrCat("localhost:", *coordinator_port);
  std::vector<std::string> argv = {testing::StrataBinary(), "coordinator",  "--listen", coordinator, "--redis",
                                   (*redis)->url(),         "--token-file", d("token")};
  argv.insert(argv.end(), node_tls.begin(), node_tls.end());
  auto coordinator_process = ChildProcess::Spawn(argv, d("mtls-coordinator.log"), CoordinatorDirectory());
  ASSERT_TRUE(coordinator_process.ok());
  argv = {testing::StrataBinary(),
          "worker",
          "--listen",
          absl::StrCat("localhost:", *worker_port),
          "--coordinator",
          coordinator,
          "--token-file",
          d("token"),
          "--id",
          "mtls-worker",
          "--allow-path",
          testing::SourcePath("examples")};
  argv.insert(argv.end(), node_tls.begin(), node_tls.end());
  auto worker_process = ChildProcess::Spawn(argv, d("mtls-worker.log"), dir_.path());
  ASSERT_TRUE(worker_process.ok());

  const std::vector<std::string> client = {"--addr",    coordinator,  "--token-file",  d("token"),  "--tls-ca",
                                           d("ca.pem"), "--tls-cert", d("client.pem"), "--tls-key", d("client.key")};
  testing::WriteTextFile(d("mtls.yaml"), Spec(2, "mtls-run"));
  std::vector<std::string> submit = {testing::StrataBinary(), "submit", d("mtls.yaml")};
  submit.insert(submit.end(), client.begin(), client.end());
  // The worker's health turns SERVING once it has registered (over mTLS).
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = *ReadFileToString(d("ca.pem"));
  ssl.pem_cert_chain = *ReadFileToString(d("client.pem"));
  ssl.pem_private_key = *ReadFileToString(d("client.key"));
  {
    auto health = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(absl::StrCat("localhost:", *worker_port), grpc::SslCredentials(ssl)));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    context.set_wait_for_ready(true);
    auto reader = health->Watch(&context, grpc::health::v1::HealthCheckRequest());
    grpc::health::v1::HealthCheckResponse response;
    while (reader->Read(&response) && response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    }
    ASSERT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING)
        << (*coordinator_process)->Log() << (*worker_process)->Log();
    context.TryCancel();
    reader->Finish();
  }
  auto submitted = testing::RunCommand(submit);
  ASSERT_TRUE(submitted.ok());
  ASSERT_EQ(submitted->exit_code, 0) << submitted->error;
  const std::string id(absl::StripAsciiWhitespace(submitted->output));
  ASSERT_FALSE(id.empty()) << (*coordinator_process)->Log() << (*worker_process)->Log();
  std::vector<std::string> watch = {testing::StrataBinary(), "watch", id};
  watch.insert(watch.end(), client.begin(), client.end());
  auto watched = testing::RunCommand(watch);
  ASSERT_TRUE(watched.ok());
  EXPECT_EQ(watched->exit_code, 0) << watched->output << watched->error << (*worker_process)->Log();

  // Trusting the CA is not enough: the coordinator wants a certificate.
  auto anonymous = testing::RunCommand(
      {testing::StrataBinary(), "jobs", "--addr", coordinator, "--token-file", d("token"), "--tls-ca", d("ca.pem")});
  ASSERT_TRUE(anonymous.ok());
  EXPECT_NE(anonymous->exit_code, 0);
  EXPECT_NE(anonymous->error.find("UNAVAILABLE"), std::string::npos) << anonymous->error;
  auto half = testing::RunCommand(
      {testing::StrataBinary(), "jobs", "--addr", coordinator, "--tls-ca", d("ca.pem"), "--tls-cert", d("client.pem")});
  ASSERT_TRUE(half.ok());
  EXPECT_NE(half->error.find("--tls-cert and --tls-key go together"), std::string::npos) << half->error;
}

TEST_F(ServiceTest, FiftyConcurrentClientsSeeNoErrors) {
  services::ServiceBenchRequest request;
  request.addr = coordinator_addr_;
  request.token = kToken;
  request.redis = redis_->url();
  request.spec_yaml = Spec(1, "load");
  request.clients = 50;
  request.seconds = 3;
  auto result = services::RunServiceLoad(request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->total_errors, 0) << (result->error_samples.empty() ? "" : result->error_samples[0]);
  EXPECT_EQ(result->calls["submit"].calls, 50);
  EXPECT_GT(result->calls["list"].calls, 50);
  EXPECT_GT(result->calls["get"].calls, 50);
  EXPECT_GT(result->calls["watch_events"].calls, 50);  // at least the QUEUED event of each job
}

// A worker that loads any job and then answers Rollout with rows that do not
// match the batch (one rollout for every batch), as a buggy or hostile
// worker might.

// parallel.workers: 2 runs the job on both worker processes as one gang
// (Gloo over loopback between them) and computes what one worker does: the
// same metrics within float32 reduction-order noise (tests/e2e/run_metrics.h
// derives the tolerances), for each kind of training job.
class GangTest : public ServiceTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(GangTest, TwoWorkerGangMatchesOneWorker) {
  const std::string algorithm = GetParam();
  std::vector<std::string> set = {"algorithm=" + algorithm};
  if (algorithm == "sft") set.push_back("data.train=" + testing::SourcePath("examples/tiny/data/sft.jsonl"));
  if (algorithm == "reward_model") {
    set.push_back("models.reward={path: " + model_ + "}");
    set.push_back("data.train=" + testing::SourcePath("examples/tiny/data/preferences.jsonl"));
  }
  if (algorithm == "ppo") set.push_back("models.critic={path: " + model_ + "}");
  v1::Job one, two;
  ASSERT_TRUE(Submit(Spec(3, "gang1", 2), &one, "", set).ok());
  ASSERT_EQ(Watch(one.id(), Ended).back().state(), v1::SUCCEEDED) << Get(one.id()).error_message();
  set.push_back("parallel.workers=2");
  ASSERT_TRUE(Submit(Spec(3, "gang2", 2), &two, "", set).ok());
  ASSERT_EQ(Watch(two.id(), Ended).back().state(), v1::SUCCEEDED) << Get(two.id()).error_message();
  EXPECT_NE(Get(two.id()).worker().find(','), std::string::npos) << Get(two.id()).worker();
  const auto want = testing::RunMetrics(dir_.Join("gang1/metrics.jsonl"));
  const auto got = testing::RunMetrics(dir_.Join("gang2/metrics.jsonl"));
  ASSERT_EQ(want.size(), 3u);
  testing::ExpectSameMetrics(want, got, {.sequences = 4, .ppo_epochs = 2});
  EXPECT_TRUE(IsRegularFile(dir_.Join("gang2/model.safetensors")));
  // Each rank checkpointed its half of the optimizer states.
  const std::string model_dir = algorithm == "reward_model" ? "reward" : "actor";
  EXPECT_TRUE(
      IsRegularFile(dir_.Join("gang2/checkpoints/iter-000002/" + model_dir + "/optimizer-rank1-of-2.safetensors")));
}

INSTANTIATE_TEST_SUITE_P(Algorithms, GangTest, ::testing::Values("sft", "reward_model", "remax", "ppo"));

// LoRA through the service: a LoRA ReMax job on a two-worker gang computes
// what one worker does and writes a PEFT adapter; its reference is the
// actor's own base.
TEST_F(ServiceTest, ALoraGangMatchesOneWorkerAndWritesAnAdapter) {
  std::vector<std::string> set = {"algorithm=remax", "models.actor.lora={rank: 4}", "output.merge_lora=true"};
  v1::Job one, two;
  ASSERT_TRUE(Submit(Spec(3, "lora1", 2), &one, "", set).ok());
  ASSERT_EQ(Watch(one.id(), Ended).back().state(), v1::SUCCEEDED) << Get(one.id()).error_message();
  set.push_back("parallel.workers=2");
  ASSERT_TRUE(Submit(Spec(3, "lora2", 2), &two, "", set).ok());
  ASSERT_EQ(Watch(two.id(), Ended).back().state(), v1::SUCCEEDED) << Get(two.id()).error_message();
  const auto want = testing::RunMetrics(dir_.Join("lora1/metrics.jsonl"));
  const auto got = testing::RunMetrics(dir_.Join("lora2/metrics.jsonl"));
  ASSERT_EQ(want.size(), 3u);
  testing::ExpectSameMetrics(want, got, {.sequences = 4, .ppo_epochs = 2});
  EXPECT_LT(std::abs(want[0]["objective/kl"].get<double>()), 1e-4);  // fresh adapters: the actor is its reference
  for (const char* file : {"adapter_config.json", "adapter_model.safetensors", "merged/model.safetensors"}) {
    EXPECT_TRUE(IsRegularFile(dir_.Join(std::string("lora2/") + file))) << file;
  }
  EXPECT_FALSE(IsRegularFile(dir_.Join("lora2/model.safetensors")));
}

// GaLore through the service: a two-worker ReMax gang (each projection and
// its moments on the rank that owns the tensor) takes the update one worker
// takes, and the gang's checkpoint carries the projections.
TEST_F(ServiceTest, AGaloreGangMatchesOneWorkerThroughTheService) {
  std::vector<std::string> set = {"models.actor.galore={rank: 4, update_proj_gap: 2}"};
  v1::Job one, two;
  ASSERT_TRUE(Submit(Spec(3, "galore1", 2), &one, "", set).ok());
  ASSERT_EQ(Watch(one.id(), Ended).back().state(), v1::SUCCEEDED) << Get(one.id()).error_message();
  set.push_back("parallel.workers=2");
  ASSERT_TRUE(Submit(Spec(3, "galore2", 2), &two, "", set).ok());
  ASSERT_EQ(Watch(two.id(), Ended).back().state(), v1::SUCCEEDED) << Get(two.id()).error_message();
  const auto want = testing::RunMetrics(dir_.Join("galore1/metrics.jsonl"));
  const auto got = testing::RunMetrics(dir_.Join("galore2/metrics.jsonl"));
  ASSERT_EQ(want.size(), 3u);
  // The first iteration's update; past it sampling parts the runs over float
  // noise (DataParallelTest.WithGaloreTwoRanksMatchOneRank).
  testing::ExpectSameMetrics(want, got, {.sequences = 4, .ppo_epochs = 2}, "galore2", /*compared_iterations=*/1);
  int projections = 0;
  for (int rank : {0, 1}) {
    auto state = policies::SafetensorsFile::Open(
        dir_.Join(absl::StrCat("galore2/checkpoints/iter-000002/actor/optimizer-rank", rank, "-of-2.safetensors")));
    ASSERT_TRUE(state.ok()) << state.status();
    for (const auto& view : (*state)->tensors()) projections += absl::EndsWith(view.name, ".galore_projection");
  }
  // Every projection of every layer, on one rank or the other.
  const auto config = nlohmann::json::parse(*ReadFileToString(JoinPath(model_, "config.json")));
  EXPECT_EQ(projections, 7 * config["num_hidden_layers"].get<int>());
}

// Workers whose operator allows a loopback reward server (any port: the
// test's server and a port where nothing listens).
class RemoteRewardServiceTest : public ServiceTest {
 protected:
  std::vector<std::string> WorkerFlags() const override { return {"--allow-reward-host", "127.0.0.1"}; }

  // GRPO on a two-worker gang, rewarded by `url` alone.
  std::vector<std::string> Overrides(const std::string& url) const {
    return {"algorithm=grpo", "models.reward={}", "parallel.workers=2", "group.samples_per_prompt=2",
            absl::StrCat("reward.sources=[{name: server, kind: remote, url: '", url, "', retries: 1, batch_size: 3}]")};
  }
};

// Through the service, a gang's ranks each call the team's reward server,
// its rewards reach the metrics, and the job succeeds; a server that is down
// is retried by each run, the job requeued by the service's rules, and at
// last FAILED with UNAVAILABLE naming the URL, not a hint about c10d.
TEST_F(RemoteRewardServiceTest, AGangScoresWithARewardServerAndAServerThatStaysDownFailsTheJobNamingIt) {
  auto server = testing::RewardServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(2, "remote", 0), &job, "", Overrides((*server)->Url("/ok"))).ok());
  const auto events = Watch(job.id(), Ended);
  ASSERT_EQ(events.back().state(), v1::SUCCEEDED) << Get(job.id()).error_message() << coordinator_->Log();
  const auto metrics = testing::RunMetrics(dir_.Join("remote/metrics.jsonl"));
  ASSERT_EQ(metrics.size(), 2u);
  for (const auto& m : metrics) {
    ASSERT_TRUE(m.contains("reward/server"));
    EXPECT_GT(m["reward/server"].get<double>(), 0);  // /ok scores a query by its length
  }
  // 4 prompts x 2 samples an iteration, in batches of at most 3 per rank.
  size_t queries = 0;
  for (const auto& r : (*server)->Requests()) queries += r["body"]["query"].size();
  EXPECT_EQ(queries, 2u * 4 * 2);

  v1::Job down;
  ASSERT_TRUE(Submit(Spec(2, "remote_down", 0), &down, "", Overrides("http://127.0.0.1:1/score")).ok());
  const auto down_events = Watch(down.id(), Ended);
  ASSERT_EQ(down_events.back().state(), v1::FAILED);
  const v1::Job failed = Get(down.id());
  EXPECT_EQ(failed.error_code(), "UNAVAILABLE");
  EXPECT_NE(failed.error_message().find("http://127.0.0.1:1/score"), std::string::npos) << failed.error_message();
  EXPECT_NE(failed.error_message().find("reward server"), std::string::npos) << failed.error_message();
  EXPECT_EQ(failed.error_message().find("c10d"), std::string::npos) << failed.error_message();
}

// A gang larger than the registered workers is refused at submit, naming the key.
TEST_F(ServiceTest, MoreWorkersThanRegisteredIsRefused) {
  v1::Job refused;
  const grpc::Status status = Submit(Spec(3, "gang3"), &refused, "", {"parallel.workers=3"});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(status.error_message().find("parallel.workers"), std::string::npos) << status.error_message();
}

// kill -9 of one rank of a two-rank gang mid-job: the other rank's
// collective fails within the collective timeout (5 s here) instead of
// hanging, the job goes back to the queue, and when the killed worker is
// back the job resumes from its checkpoint on a new gang and succeeds. The
// survivor is part of that new gang, so it was freed, not left stuck.
TEST_F(ServiceTest, RankKilledMidJobRequeuesAndTheGangFinishes) {
  // Worker 1 kills itself (SIGKILL) as it starts iteration 3's update, while
  // its peer goes on into the update's gradient sums.
  workers_[1]->Kill(SIGKILL);
  StartWorker(1, {"STRATA_FAILPOINT=kill@update:3"});
  WaitUntilRegistered(1);
  v1::Job job;
  const grpc::Status submitted = Submit(Spec(8, "gangkill", 2), &job, "", {"parallel.workers=2"});
  ASSERT_TRUE(submitted.ok()) << submitted.error_message();
  WatchUntilRequeued(job.id(), 2);
  ASSERT_EQ(Get(job.id()).state(), v1::QUEUED) << coordinator_->Log();
  const auto died = ReadFileToString(dir_.Join("worker1.log"));
  ASSERT_TRUE(died.ok());
  EXPECT_NE(died->find("kill@update:3: this process ends now"), std::string::npos) << *died;
  StartWorker(1);  // a fresh worker, without the fault point
  WaitUntilRegistered(1);
  const auto all = Watch(job.id(), Ended, "");
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.back().state(), v1::SUCCEEDED) << Get(job.id()).error_message() << "\n" << coordinator_->Log();
  bool ran = false, requeued = false;
  for (const auto& e : all) {
    if (e.type() != "state") continue;
    if (e.state() == v1::RUNNING) ran = true;
    if (e.state() == v1::QUEUED && ran) requeued = true;
  }
  EXPECT_TRUE(requeued) << "the job never went back to the queue";
  EXPECT_EQ(Get(job.id()).iteration(), 8);
}

// A rank that is slow but alive in a phase that ends in no collective (its
// rollout takes 12 s longer than its peer's, past the 10 s a phase ending in a
// collective would allow it): the coordinator checks that it still answers
// and waits, and the job runs to the end without a requeue. (Before, the
// slow rank was given up as hung and the job requeued.)
TEST_F(ServiceTest, SlowRankInARolloutIsWaitedForWhileItAnswers) {
  ExpectTwoRankJobSucceedsWithoutRequeue("gangslow", "stall@rollout:1:12", {1});
  const auto worker_log = ReadFileToString(dir_.Join("worker1.log"));
  ASSERT_TRUE(worker_log.ok());
  EXPECT_NE(worker_log->find("stall@rollout:1:12: working 12 s longer"), std::string::npos) << *worker_log;
  EXPECT_NE(coordinator_->Log().find("still working"), std::string::npos) << coordinator_->Log();
}

// Evaluation, too, ends in no collective: each rank reports its share of
// the eval means and the coordinator adds them up, so a rank whose eval
// prompts generate 12 s longer (past the test gang's 5 s collective
// timeout) is waited for. (Reduced in a collective, as it was, the peer's
// all-reduce timed out and the job was requeued, to repeat the same slow
// evaluation.)
TEST_F(ServiceTest, SlowRankInAnEvaluationIsWaitedForWhileItAnswers) {
  ExpectTwoRankJobSucceedsWithoutRequeue("gangeval", "stall@evaluate:1:12", {1},
                                         {"data.eval=" + testing::SourcePath("examples/tiny/data/eval_prompts.jsonl"),
                                          "eval.every=2", "eval.rule=vowel_fraction", "eval.prompts=6"});
  const auto worker_log = ReadFileToString(dir_.Join("worker1.log"));
  ASSERT_TRUE(worker_log.ok());
  EXPECT_NE(worker_log->find("stall@evaluate:1:12: working 12 s longer"), std::string::npos) << *worker_log;
  // The metrics file's evaluations: the first line's (the starting policy),
  // the second's (every 2 iterations: the slow one) and the last line's.
  const auto metrics = ReadFileToString(dir_.Join("gangeval/metrics.jsonl"));
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  size_t evaluations = 0;
  for (size_t at = metrics->find("\"eval/score\""); at != std::string::npos;
       at = metrics->find("\"eval/score\"", at + 1)) {
    ++evaluations;
  }
  EXPECT_EQ(evaluations, 3u) << *metrics;
  EXPECT_EQ(metrics->find("mean_sum/"), std::string::npos) << *metrics;
}

// Rank 0 writes a checkpoint's weights 12 s slower than the disk would
// (past the test gang's 5 s collective timeout): it writes them after the
// ranks' last barrier, so its peer does not wait in a collective for them,
// and the coordinator waits for rank 0 while it answers. The job succeeds
// without a requeue. (Written before that barrier, as they were, the
// peer's barrier timed out and the job was requeued, to repeat the same
// slow save.)
TEST_F(ServiceTest, SlowCheckpointWriteOnRankZeroDoesNotTimeOutTheGang) {
  // On both workers: whichever becomes rank 0.
  ExpectTwoRankJobSucceedsWithoutRequeue("gangsave", "stall@save_weights:1:12", {0, 1});
  std::string logs;
  for (const char* name : {"worker0.log", "worker1.log"}) logs += ReadFileToString(dir_.Join(name)).value_or("");
  EXPECT_NE(logs.find("stall@save_weights:1:12: working 12 s longer"), std::string::npos) << logs;
  // The checkpoint is whole: both ranks' optimizer shards, the weights, the state.
  const std::string checkpoint = dir_.Join("gangsave/checkpoints/iter-000002");
  for (const char* file : {"state.json", "actor/model.safetensors", "actor/optimizer-rank0-of-2.safetensors",
                           "actor/optimizer-rank1-of-2.safetensors"}) {
    EXPECT_TRUE(IsRegularFile(JoinPath(checkpoint, file))) << file;
  }
}

// A rank that hangs (SIGSTOP) mid-job: the other rank's collective fails
// within the collective timeout (5 s), the coordinator gives up on the hung
// rank's call a margin (5 s) later, and the job goes back to the queue while
// the worker is still stopped; without that the phase would wait for the
// call's 10 min deadline, past this test's watch. Resumed (SIGCONT), the
// worker rejoins and the job finishes.
TEST_F(ServiceTest, RankThatHangsIsGivenUpAndTheJobRequeued) {
  v1::Job job;
  const grpc::Status submitted = Submit(Spec(8, "ganghang", 2), &job, "", {"parallel.workers=2"});
  ASSERT_TRUE(submitted.ok()) << submitted.error_message();
  Watch(job.id(), AtIteration(2));
  ASSERT_EQ(Get(job.id()).state(), v1::RUNNING);
  workers_[1]->Signal(SIGSTOP);
  const auto until_requeued = WatchUntilRequeued(job.id());
  workers_[1]->Signal(SIGCONT);
  ASSERT_FALSE(until_requeued.empty());
  EXPECT_EQ(until_requeued.back().state(), v1::QUEUED) << coordinator_->Log();
  EXPECT_EQ(Watch(job.id(), Ended).back().state(), v1::SUCCEEDED) << Get(job.id()).error_message() << "\n"
                                                                  << coordinator_->Log();
  EXPECT_EQ(Get(job.id()).iteration(), 8);
}

// A requeued job whose recorded checkpoint its new gang cannot see (a
// volume not mounted there; here, moved away) fails naming it. (It started
// over from iteration 0, emptying the metrics file the old run wrote.)
TEST_F(ServiceTest, RequeuedJobWhoseCheckpointIsGoneFailsNamingIt) {
  workers_[1]->Kill(SIGKILL);
  StartWorker(1, {"STRATA_FAILPOINT=kill@update:3"});
  WaitUntilRegistered(1);
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(8, "gangmoved", 2), &job, "", {"parallel.workers=2"}).ok());
  // The fault point's requeue: in iteration 3, after the checkpoint of 2.
  const auto until_requeued = WatchUntilRequeued(job.id(), 2);
  ASSERT_FALSE(until_requeued.empty());
  ASSERT_EQ(until_requeued.back().state(), v1::QUEUED) << coordinator_->Log();
  ASSERT_TRUE(IsDirectory(dir_.Join("gangmoved/checkpoints/iter-000002"))) << coordinator_->Log();
  std::filesystem::rename(dir_.Join("gangmoved/checkpoints"), dir_.Join("gangmoved/checkpoints.away"));
  StartWorker(1);  // a fresh worker, without the fault point
  WaitUntilRegistered(1);
  const auto events = Watch(job.id(), Ended);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().state(), v1::FAILED) << coordinator_->Log();
  const v1::Job failed = Get(job.id());
  EXPECT_EQ(failed.error_code(), "FAILED_PRECONDITION");
  EXPECT_NE(failed.error_message().find("/gangmoved/checkpoints/iter-000002 is not in checkpoint.dir"),
            std::string::npos)
      << failed.error_message();
  EXPECT_EQ(testing::RunMetrics(dir_.Join("gangmoved/metrics.jsonl")).size(), 3u)
      << "the metrics file was started over";
}

// A rank that dies in a phase that ends in no collective ends that phase
// for the gang at once: its peer, still working and answering, is given up,
// and its unload interrupts the work. (Before, the coordinator waited while
// the peer answered, up to the call's 10 min deadline, for work that was
// thrown away.)
TEST_F(ServiceTest, RankThatDiesInARolloutEndsThePhaseAtOnce) {
  for (int i : {0, 1}) workers_[static_cast<size_t>(i)]->Kill(SIGKILL);
  StartWorker(0, {"STRATA_FAILPOINT=stall@rollout:3:120"});
  StartWorker(1, {"STRATA_FAILPOINT=kill@rollout:3"});
  for (int i : {0, 1}) WaitUntilRegistered(i);
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(6, "gangdies", 2), &job, "", {"parallel.workers=2"}).ok());
  const auto until_requeued = WatchUntilRequeued(job.id(), 2);
  ASSERT_FALSE(until_requeued.empty());
  ASSERT_EQ(until_requeued.back().state(), v1::QUEUED) << coordinator_->Log();
  StartWorker(1);  // a fresh worker, without the fault point
  WaitUntilRegistered(1);
  const auto events = Watch(job.id(), Ended);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().state(), v1::SUCCEEDED) << Get(job.id()).error_message() << "\n" << coordinator_->Log();
  EXPECT_EQ(Get(job.id()).iteration(), 6);
  EXPECT_NE(coordinator_->Log().find("a rank failed; giving up the 1 still working"), std::string::npos)
      << coordinator_->Log();
  const auto survivor = ReadFileToString(dir_.Join("worker0.log"));
  ASSERT_TRUE(survivor.ok());
  EXPECT_NE(survivor->find("stall@rollout:3:120: interrupted after"), std::string::npos) << *survivor;
}

// A rank 0 told to stop (a cancel here; the Unload of a gang given up
// alike) while it writes a checkpoint does not publish it: state.json and
// the rename come after an interrupt check, so a rank 0 that wakes late
// cannot rename its copy over the checkpoint a new gang writes.
TEST_F(ServiceTest, CheckpointInterruptedMidWriteIsNotPublished) {
  // On both workers: whichever is picked for the one-rank job.
  for (int i : {0, 1}) {
    workers_[static_cast<size_t>(i)]->Kill(SIGKILL);
    StartWorker(i, {"STRATA_FAILPOINT=stall@save_weights:1:60"});
    WaitUntilRegistered(i);
  }
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(4, "cpcancel", 2), &job).ok());
  auto logs = [&] { return workers_[0]->Log() + workers_[1]->Log(); };
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
       logs().find("stall@save_weights:1:60: working 60 s longer") == std::string::npos &&
       std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polls other processes
  }
  v1::Job cancelled;
  ASSERT_TRUE(Cancel(job.id(), &cancelled).ok());
  EXPECT_TRUE(WaitUntilWorkersIdle(std::chrono::seconds(30)));
  EXPECT_NE(logs().find("stall@save_weights:1:60: interrupted after"), std::string::npos) << logs();
  EXPECT_EQ(Get(job.id()).state(), v1::CANCELLED);
  EXPECT_FALSE(IsDirectory(dir_.Join("cpcancel/checkpoints/iter-000002"))) << "an interrupted commit was published";
  // Nor left half-written: its rank 0 removed its own copy.
  for (const auto& entry : std::filesystem::directory_iterator(dir_.Join("cpcancel/checkpoints"))) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
  }
}

// A requeued job can run again on a new gang while its previous loop still
// waits for the hung rank's unload. That loop's end must leave the new gang
// alone. (The coordinator counted the loops of a job as one: the old loop's
// end made the new gang's workers look orphaned to their heartbeats, they
// dropped the job, and it stayed RUNNING with no loop. Then it freed the
// worker the two gangs share, which another job could take.)
TEST_F(ServiceTest, RequeuedJobSurvivesItsPreviousGangsLateUnload) {
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(12, "gangtwice", 2), &job, "", {"parallel.workers=2"}).ok());
  Watch(job.id(), AtIteration(2));
  ASSERT_EQ(Get(job.id()).state(), v1::RUNNING);
  workers_[1]->Signal(SIGSTOP);
  // A third worker for the second gang, started while the first gang waits
  // for its hung rank. Its rollout at iteration 6 takes 8 s longer, so that
  // the second run is still going when the first loop ends.
  StartWorker(2, {"STRATA_FAILPOINT=stall@rollout:6:8"});
  WaitUntilRegistered(2);
  int running = 0;
  Watch(job.id(), [&](const v1::JobEvent& e) {
    if (e.type() == "state" && e.state() == v1::RUNNING) ++running;
    return running == 2 || Ended(e);
  });
  ASSERT_EQ(running, 2) << coordinator_->Log();
  // A second two-worker job waits: one worker is free once the hung rank
  // unloads, the other two run the requeued job. (The first loop's end used
  // to free its whole gang again, the worker the second run shares with it
  // included; this job then took that worker, whose job was dropped.)
  v1::Job next;
  ASSERT_TRUE(Submit(Spec(2, "gangnext", 2), &next, "", {"parallel.workers=2"}).ok());
  // The hung rank answers its unload now, which ends the first loop.
  workers_[1]->Signal(SIGCONT);
  const auto events = Watch(job.id(), Ended);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().state(), v1::SUCCEEDED) << Get(job.id()).error_message() << "\n" << coordinator_->Log();
  EXPECT_EQ(Get(job.id()).iteration(), 12);
  EXPECT_EQ(Watch(next.id(), Ended).back().state(), v1::SUCCEEDED) << Get(next.id()).error_message();
  const auto worker_log = ReadFileToString(dir_.Join("worker2.log"));
  ASSERT_TRUE(worker_log.ok());
  EXPECT_NE(worker_log->find("stall@rollout:6:8: working 8 s longer"), std::string::npos) << *worker_log;
}

TEST_F(ServiceTest, YoungerJobWaitsBehindAnOlderGangJobInsteadOfTakingItsWorkers) {
  ExpectYoungerJobWaitsBehindTheGangJob(kToken, kToken, /*named=*/true);
}

// A cancel reaches a gang while its ranks load their models (minutes for
// a large model): worker 1's load takes 60 s longer, and the cancel ends it
// at once instead of after the load. The loading worker reports the job,
// so the heartbeat's cancel and the unload reach it.
TEST_F(ServiceTest, CancelReachesARankWhileItLoads) {
  workers_[1]->Kill(SIGKILL);
  StartWorker(1, {"STRATA_FAILPOINT=stall@load:0:60"});
  WaitUntilRegistered(1);
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(2, "cancelload", 2), &job, "", {"parallel.workers=2"}).ok());
  // Cancelled once worker 1 is in its long load (earlier, the cancel would
  // end the load before the fault point, which the log check below needs).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto stalled = [&] {
    const auto log = ReadFileToString(dir_.Join("worker1.log"));
    return log.ok() && log->find("stall@load:0:60: working 60 s longer") != std::string::npos;
  };
  while (!stalled() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polls a file another process writes
  }
  ASSERT_TRUE(stalled()) << coordinator_->Log();
  ASSERT_EQ(HeldJob(1), job.id()) << "the loading worker does not report the job it loads";
  v1::Job cancelled;
  ASSERT_TRUE(Cancel(job.id(), &cancelled).ok());
  EXPECT_TRUE(WaitUntilWorkersIdle(std::chrono::seconds(20))) << "still held: " << HeldJob(0) << ", " << HeldJob(1);
  EXPECT_EQ(Get(job.id()).state(), v1::CANCELLED);
  const auto log = ReadFileToString(dir_.Join("worker1.log"));
  ASSERT_TRUE(log.ok());
  EXPECT_NE(log->find("stall@load:0:60: interrupted after"), std::string::npos) << *log;
  // Both workers take the next gang.
  v1::Job next;
  ASSERT_TRUE(Submit(Spec(2, "afterload", 2), &next, "", {"parallel.workers=2"}).ok());
  EXPECT_EQ(Watch(next.id(), Ended).back().state(), v1::SUCCEEDED) << Get(next.id()).error_message();
}

// A cancelled job (or a failed one) is not the end of its training: a new
// job continues it from its newest checkpoint, once, instead of starting
// over (the ended job's checkpoints are another job's, which a fresh job
// with the same checkpoint.dir refuses to touch).
TEST_F(ServiceTest, AnEndedJobContinuesFromItsCheckpointInANewJob) {
  v1::Job first;
  ASSERT_TRUE(Submit(Spec(500, "contd", 2), &first).ok());
  Watch(first.id(), AtIteration(5));  // checkpoints at 2 and 4 are recorded by now
  v1::Job cancelled;
  ASSERT_TRUE(Cancel(first.id(), &cancelled).ok());
  // The continuation runs 6 iterations past where the ended job got (its
  // run may finish one more while it stops).
  const int iterations = static_cast<int>(Get(first.id()).iteration()) + 6;
  auto submit_continuing = [&](const std::string& id, v1::Job* job) {
    v1::SubmitJobRequest request;
    request.set_spec_yaml(Spec(iterations, "contd", 2));
    request.set_continue_job_id(id);
    grpc::ClientContext context;
    Auth(&context);
    return stub_->SubmitJob(&context, request, job);
  };
  auto cli_continue = [&](const std::string& spec_file) {
    return testing::RunCommand({testing::StrataBinary(), "submit", spec_file, "--continue", first.id(), "--addr",
                                coordinator_addr_, "--token-file", dir_.Join("token")});
  };
  // Elsewhere it would not continue anything: refused, and the ended job
  // stays free to continue.
  testing::WriteTextFile(dir_.Join("elsewhere.yaml"), Spec(iterations, "contd-elsewhere", 2));
  auto elsewhere = cli_continue(dir_.Join("elsewhere.yaml"));
  ASSERT_TRUE(elsewhere.ok());
  EXPECT_NE(elsewhere->exit_code, 0);
  EXPECT_NE(elsewhere->error.find("INVALID_ARGUMENT"), std::string::npos) << elsewhere->error;
  EXPECT_NE(elsewhere->error.find("output.dir"), std::string::npos) << elsewhere->error;
  // Through the CLI, as a user would, at once: the new job waits for the
  // cancelled run to stop on its worker before it starts.
  testing::WriteTextFile(dir_.Join("contd.yaml"), Spec(iterations, "contd", 2));
  auto submitted = cli_continue(dir_.Join("contd.yaml"));
  ASSERT_TRUE(submitted.ok());
  ASSERT_EQ(submitted->exit_code, 0) << submitted->error;
  const v1::Job next = Get(std::string(absl::StripAsciiWhitespace(submitted->output)));
  EXPECT_EQ(next.continues(), first.id());
  EXPECT_GE(next.iteration(), 4);
  // Its checkpoints include those it may resume, the ended job's.
  auto checkpoint_iterations = [&](const std::string& id) {
    v1::ListCheckpointsRequest request;
    request.set_job_id(id);
    v1::ListCheckpointsResponse response;
    grpc::ClientContext context;
    Auth(&context);
    EXPECT_TRUE(stub_->ListCheckpoints(&context, request, &response).ok());
    std::vector<int64_t> out;
    for (const auto& c : response.checkpoints()) out.push_back(c.iteration());
    return out;
  };
  const std::vector<int64_t> inherited = checkpoint_iterations(first.id());
  ASSERT_GE(inherited.size(), 2u);
  const std::vector<int64_t> listed = checkpoint_iterations(next.id());
  ASSERT_GE(listed.size(), inherited.size());
  EXPECT_TRUE(std::equal(inherited.begin(), inherited.end(), listed.begin())) << listed.size();
  const auto events = Watch(next.id(), Ended);
  ASSERT_EQ(events.back().state(), v1::SUCCEEDED) << Get(next.id()).error_message() << "\n" << coordinator_->Log();
  EXPECT_EQ(Get(next.id()).iteration(), iterations);
  // It resumed: its first iteration is the checkpoint's, not 0.
  int64_t first_iteration = -1;
  for (const auto& e : events) {
    if (e.type() == "metrics" && first_iteration < 0) first_iteration = e.iteration();
  }
  EXPECT_GE(first_iteration, 4);
  // One metrics line per iteration: the ended job's up to its checkpoint,
  // then the new job's.
  EXPECT_EQ(testing::RunMetrics(dir_.Join("contd/metrics.jsonl")).size(), static_cast<size_t>(iterations));
  EXPECT_EQ(Get(first.id()).continued_by(), next.id());
  EXPECT_EQ(Get(first.id()).state(), v1::CANCELLED);
  // Once: a second continuation is refused, naming the first.
  v1::Job again;
  const grpc::Status twice = submit_continuing(first.id(), &again);
  EXPECT_EQ(twice.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(twice.error_message().find(next.id()), std::string::npos) << twice.error_message();
  // A fresh job on the same outputs would take over other jobs'
  // checkpoints: it fails, naming the newest's job, and says how to
  // continue one.
  v1::Job fresh;
  ASSERT_TRUE(Submit(Spec(iterations + 2, "contd", 2), &fresh).ok());
  ASSERT_EQ(Watch(fresh.id(), Ended).back().state(), v1::FAILED);
  EXPECT_NE(Get(fresh.id()).error_message().find("strata submit --continue " + next.id()), std::string::npos)
      << Get(fresh.id()).error_message();
}

// A continuation whose inherited checkpoints were removed does not start
// over (that would empty the ended job's metrics file): it fails, naming
// the checkpoint and the job it continues, and says how to start over.
TEST_F(ServiceTest, AContinuationWhoseCheckpointsWereRemovedFailsSayingHowToStartOver) {
  v1::Job first;
  ASSERT_TRUE(Submit(Spec(500, "contgone", 2), &first).ok());
  Watch(first.id(), AtIteration(3));  // the checkpoint at 2 is recorded by now
  v1::Job cancelled;
  ASSERT_TRUE(Cancel(first.id(), &cancelled).ok());
  ASSERT_TRUE(WaitUntilWorkersIdle(std::chrono::seconds(30)));
  const size_t lines = testing::RunMetrics(dir_.Join("contgone/metrics.jsonl")).size();
  ASSERT_GE(lines, 3u);
  ASSERT_TRUE(RemoveTree(dir_.Join("contgone/checkpoints")));
  v1::SubmitJobRequest request;
  request.set_spec_yaml(Spec(500, "contgone", 2));
  request.set_continue_job_id(first.id());
  v1::Job next;
  grpc::ClientContext context;
  Auth(&context);
  ASSERT_TRUE(stub_->SubmitJob(&context, request, &next).ok());
  ASSERT_EQ(Watch(next.id(), Ended).back().state(), v1::FAILED);
  const v1::Job failed = Get(next.id());
  EXPECT_EQ(failed.error_code(), "FAILED_PRECONDITION");
  EXPECT_NE(failed.error_message().find("/contgone/checkpoints/iter-0000"), std::string::npos)
      << failed.error_message();
  EXPECT_NE(failed.error_message().find("the job continues job " + first.id()), std::string::npos)
      << failed.error_message();
  EXPECT_NE(failed.error_message().find("without --continue"), std::string::npos) << failed.error_message();
  EXPECT_EQ(testing::RunMetrics(dir_.Join("contgone/metrics.jsonl")).size(), lines)
      << "the metrics file was started over";
}

// The coordinator opens no job file: run as an unprivileged user that
// cannot enter the directory holding the model, the data and the outputs
// (the workers run as root and can), it still runs the job to SUCCEEDED.
TEST_F(ServiceTest, CoordinatorWithoutAccessToJobFilesRunsTheJob) {
  if (::geteuid() != 0 || !testing::HaveProgram("setpriv")) GTEST_SKIP() << "needs root and setpriv";
  const std::vector<std::string> nobody = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
  auto can = [&](const std::string& test, const std::string& path) {
    std::vector<std::string> argv = nobody;
    argv.insert(argv.end(), {"test", test, path});
    auto r = testing::RunCommand(argv);
    return r.ok() && r->exit_code == 0;
  };
  if (!can("-x", testing::StrataBinary())) GTEST_SKIP() << "the strata binary is not executable by others here";
  ASSERT_FALSE(can("-r", JoinPath(model_, "config.json"))) << "the fixture's directory is readable by others";
  // The token, where the unprivileged coordinator can read it: its own
  // file, private to it.
  testing::TempDir open_dir;
  ::chmod(open_dir.path().c_str(), 0755);
  const std::string token = open_dir.Join("token");
  testing::WriteTextFile(token, kToken);
  ::chmod(token.c_str(), 0600);
  ASSERT_EQ(::chown(token.c_str(), 65534, 65534), 0);
  coordinator_->Kill(SIGKILL);
  StartCoordinator(nobody, "/", token);
  ASSERT_TRUE(channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(20)));
  // The first call may still go to the dead coordinator's connection
  // (UNAVAILABLE); a retry with the same request id is idempotent.
  v1::Job job;
  grpc::Status submitted;
  for (int attempt = 0; attempt < 5; ++attempt) {
    submitted = Submit(Spec(2, "nofiles", 1), &job, "nofiles-request");
    if (submitted.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(20));
  }
  ASSERT_TRUE(submitted.ok()) << submitted.error_message() << "\nalive " << coordinator_->Alive() << "\n"
                              << coordinator_->Log();
  EXPECT_EQ(Watch(job.id(), Ended).back().state(), v1::SUCCEEDED) << Get(job.id()).error_message() << "\n"
                                                                  << coordinator_->Log();
  EXPECT_TRUE(IsRegularFile(dir_.Join("nofiles/model.safetensors")));
  EXPECT_EQ(testing::RunMetrics(dir_.Join("nofiles/metrics.jsonl")).size(), 2u);
}

// Tenants: a tokens file maps tokens to tenants (one an admin), and the
// workers share one worker token with the coordinator.
class TenantTest : public ServiceTest {
 protected:
  static constexpr char kAlice[] = "alice-token-0123456789";
  static constexpr char kBob[] = "bob-token-0123456789";
  static constexpr char kRoot[] = "root-token-0123456789";

  std::vector<std::string> CoordinatorAuth() override {
    const std::string tokens = dir_.Join("tokens");
    testing::WriteTextFile(tokens, absl::StrCat("# token tenant [admin]\n", kAlice, " alice\n", kBob, " bob\n", kRoot,
                                                " ops admin\n"));
    ::chmod(tokens.c_str(), 0600);
    return {"--tokens-file", tokens, "--worker-token-file", dir_.Join("token")};
  }

  grpc::Status SubmitAs(const std::string& token, const std::string& out, v1::Job* job,
                        const std::string& request_id = "") {
    v1::SubmitJobRequest request;
    request.set_spec_yaml(Spec(1, out));
    request.set_request_id(request_id);
    grpc::ClientContext context;
    Auth(&context, token);
    return stub_->SubmitJob(&context, request, job);
  }
  grpc::Status GetAs(const std::string& token, const std::string& id, v1::Job* job) {
    v1::GetJobRequest request;
    request.set_job_id(id);
    grpc::ClientContext context;
    Auth(&context, token);
    return stub_->GetJob(&context, request, job);
  }
  std::vector<std::string> ListAs(const std::string& token, int page_size = 0) {
    std::vector<std::string> ids;
    std::string page_token;
    do {
      v1::ListJobsRequest request;
      request.set_page_size(page_size);
      request.set_page_token(page_token);
      v1::ListJobsResponse page;
      grpc::ClientContext context;
      Auth(&context, token);
      const grpc::Status status = stub_->ListJobs(&context, request, &page);
      EXPECT_TRUE(status.ok()) << status.error_message();
      if (!status.ok()) break;
      for (const auto& j : page.jobs()) ids.push_back(j.id());
      page_token = page.next_page_token();
    } while (!page_token.empty());
    std::sort(ids.begin(), ids.end());
    return ids;
  }
  // Polls the job (as `token`) until it ends; the service's own watch is
  // covered by the tenant checks below.
  v1::JobState WaitAs(const std::string& token, const std::string& id) {
    v1::Job job;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline && GetAs(token, id, &job).ok() && job.state() < v1::SUCCEEDED) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return job.state();
  }
};

// A tenant's job that waits behind another tenant's gang job is told so
// without that job's id (tenants see only their own jobs).
TEST_F(TenantTest, AJobWaitingBehindAnotherTenantsGangJobIsNotToldItsId) {
  ExpectYoungerJobWaitsBehindTheGangJob(kAlice, kBob, /*named=*/false);
}

TEST_F(TenantTest, EachTenantSeesOnlyItsJobsAndTenantsReachNoWorker) {
  v1::Job a1, a2, b1;
  ASSERT_TRUE(SubmitAs(kAlice, "alice-1", &a1, "same-request").ok());
  ASSERT_TRUE(SubmitAs(kAlice, "alice-2", &a2).ok());
  ASSERT_TRUE(SubmitAs(kBob, "bob-1", &b1, "same-request").ok());
  EXPECT_NE(b1.id(), a1.id()) << "one tenant's request id returned another's job";
  EXPECT_EQ(WaitAs(kAlice, a1.id()), v1::SUCCEEDED);
  EXPECT_EQ(WaitAs(kAlice, a2.id()), v1::SUCCEEDED);
  EXPECT_EQ(WaitAs(kBob, b1.id()), v1::SUCCEEDED);

  std::vector<std::string> alice = {a1.id(), a2.id()}, all = {a1.id(), a2.id(), b1.id()};
  std::sort(alice.begin(), alice.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(ListAs(kAlice), alice);
  EXPECT_EQ(ListAs(kAlice, 1), alice);  // pages of one, across bob's job
  EXPECT_EQ(ListAs(kBob), std::vector<std::string>{b1.id()});
  EXPECT_EQ(ListAs(kRoot), all);

  // Bob cannot see, watch or cancel Alice's job; it looks like no job at all.
  v1::Job seen;
  EXPECT_EQ(GetAs(kBob, a1.id(), &seen).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(GetAs(kRoot, a1.id(), &seen).ok());
  EXPECT_EQ(Cancel(a1.id(), &seen, kBob).error_code(), grpc::StatusCode::NOT_FOUND);
  {
    v1::WatchJobRequest request;
    request.set_job_id(a1.id());
    grpc::ClientContext context;
    Auth(&context, kBob);
    auto reader = stub_->WatchJob(&context, request);
    v1::JobEvent e;
    EXPECT_FALSE(reader->Read(&e));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // A tenant cannot act as a worker, and the worker credential runs no jobs.
  {
    v1::RegisterWorkerRequest request;
    request.set_worker_id("evil");
    request.set_address("127.0.0.1:1");
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    Auth(&context, kAlice);
    EXPECT_EQ(stub_->RegisterWorker(&context, request, &response).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_EQ(SubmitAs(kToken, "worker-job", &seen).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // Workers accept only the worker token: a tenant (even the admin) cannot
  // unload or inspect one directly.
  for (const char* token : {kAlice, kRoot}) {
    auto worker = v1::Worker::NewStub(grpc::CreateChannel(worker_addr_[0], grpc::InsecureChannelCredentials()));
    v1::UnloadRequest request;
    request.set_job_id(a1.id());
    v1::UnloadResponse response;
    grpc::ClientContext context;
    Auth(&context, token);
    EXPECT_EQ(worker->Unload(&context, request, &response).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
}

class MisfitWorker final : public v1::Worker::Service {
 public:
  // `phase_error`: every phase fails INTERNAL with it ("" for none).
  // `start_error`: StartRank fails UNAVAILABLE with it, as a rank that
  // cannot reach rank 0's rendezvous does ("" for none).
  explicit MisfitWorker(std::string tokenizer_path, std::string working_directory, std::string phase_error = "",
                        std::string start_error = "")
      : tokenizer_path_(std::move(tokenizer_path)),
        working_directory_(std::move(working_directory)),
        phase_error_(std::move(phase_error)),
        start_error_(std::move(start_error)) {}
  grpc::Status StartRank(grpc::ServerContext*, const v1::StartRankRequest*, v1::StartRankResponse* out) override {
    if (!start_error_.empty()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, start_error_);
    out->set_tokenizer_path(tokenizer_path_);
    out->set_working_directory(working_directory_);
    return grpc::Status::OK;
  }
  // Every phase answers with no metrics: fine for those that report none,
  // malformed for the score phase, which must report the objective.
  grpc::Status RunPhase(grpc::ServerContext*, const v1::PhaseRequest*, v1::PhaseReply*) override {
    return phase_error_.empty() ? grpc::Status::OK : grpc::Status(grpc::StatusCode::INTERNAL, phase_error_);
  }
  grpc::Status Unload(grpc::ServerContext*, const v1::UnloadRequest*, v1::UnloadResponse*) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++unloads_;
    }
    unloaded_.notify_all();
    return grpc::Status::OK;
  }
  // The coordinator records a failed job's state before it unloads the
  // gang, so the unload may still be on its way when the test sees FAILED.
  bool WaitForUnload(std::chrono::seconds limit) {
    std::unique_lock<std::mutex> lock(mu_);
    return unloaded_.wait_for(lock, limit, [this] { return unloads_ > 0; });
  }

 private:
  const std::string tokenizer_path_, working_directory_, phase_error_, start_error_;
  std::mutex mu_;
  std::condition_variable unloaded_;
  int unloads_ = 0;
};

// A coordinator with no workers: jobs stay QUEUED until a test moves them.
class NoWorkerServiceTest : public ServiceTest {
 protected:
  int RealWorkers() const override { return 0; }
};

// Submit checks that enough workers are registered; workers that leave
// afterwards leave a gang job waiting, which it now says (it sat QUEUED
// with no word). Two registered ghosts take the job, fail to start it, are
// deregistered, and the job waits for two workers with none registered.
TEST_F(NoWorkerServiceTest, AGangJobSaysWhenTooFewWorkersRemainRegistered) {
  for (const char* id : {"ghost-a", "ghost-b"}) {
    auto port = testing::RedisServer::FreePort();
    ASSERT_TRUE(port.ok());
    v1::RegisterWorkerRequest ghost;
    ghost.set_worker_id(id);
    ghost.set_address(absl::StrCat("127.0.0.1:", *port));
    ASSERT_TRUE(RegisterWorker(ghost).ok());
  }
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(2, "waits"), &job, "", {"parallel.workers=2"}).ok());
  const auto events = Watch(job.id(), [](const v1::JobEvent& e) {
    return (e.type() == "log" && e.json().find("are registered") != std::string::npos) || Ended(e);
  });
  ASSERT_FALSE(events.empty());
  EXPECT_NE(events.back().json().find(
                "waiting: the job needs 2 workers (spec key 'parallel.workers'); 0 are registered"),
            std::string::npos)
      << events.back().json();
  v1::Job cancelled;
  EXPECT_TRUE(Cancel(job.id(), &cancelled).ok());
}

// A job's end is recorded before its final state event is appended. A
// watcher that caught up in between used to end the stream without that
// state (seen under load: a job watched to its end "ended" QUEUED). Here the
// end is recorded straight in Redis, with no event, once the watcher has
// caught up: the stream must stay open (given a second to end, the old
// coordinator ended it at the scheduler's next sweep of parked watchers),
// then end with the event once it is appended.
TEST_F(NoWorkerServiceTest, AWatchWaitsForTheFinalEventOfAJobThatJustEnded) {
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(2, "ends-quietly"), &job).ok());
  services::RedisStoreOptions options;
  options.redis_url = redis_->url();
  auto store = services::ConnectRedisJobStore(options);
  ASSERT_TRUE(store.ok()) << store.status();

  std::mutex mu;
  std::condition_variable changed;
  std::vector<v1::JobEvent> events;
  bool ended = false;
  grpc::ClientContext context;
  services::AddBearer(&context, kToken);
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  std::thread watcher([&] {
    v1::WatchJobRequest request;
    request.set_job_id(job.id());
    auto reader = stub_->WatchJob(&context, request);
    v1::JobEvent e;
    while (reader->Read(&e)) {
      if (e.type() != "state") continue;  // the scheduler says it waits for a worker
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(e);
      changed.notify_all();
    }
    EXPECT_TRUE(reader->Finish().ok());
    std::lock_guard<std::mutex> lock(mu);
    ended = true;
    changed.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(changed.wait_for(lock, std::chrono::seconds(30), [&] { return !events.empty() || ended; }));
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events[0].state(), v1::QUEUED);
  }
  // The watcher has caught up: the job ends, its event not yet appended.
  ASSERT_TRUE((*store)->Transition(job.id(), {services::JobState::kQueued}, services::JobState::kFailed).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_FALSE(changed.wait_for(lock, std::chrono::seconds(1), [&] { return ended; }))
        << "the stream ended without the final state";
  }
  ASSERT_TRUE((*store)->AppendEvent(job.id(), "state", R"({"state": "FAILED"})").ok());
  watcher.join();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].state(), v1::FAILED);
}

class MisfitWorkerTest : public ServiceTest {
 protected:
  int RealWorkers() const override { return 0; }

  // Serves `misfit` on a free port and registers it with the coordinator.
  std::unique_ptr<grpc::Server> Serve(MisfitWorker& misfit) {
    int port = 0;
    grpc::ServerBuilder builder;
    // Answers health checks, as a live worker does.
    grpc::EnableDefaultHealthCheckService(true);
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&misfit);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    EXPECT_NE(server, nullptr);
    v1::RegisterWorkerRequest request;
    request.set_worker_id("misfit");
    request.set_address(absl::StrCat("127.0.0.1:", port));
    request.set_working_directory(dir_.path());
    (*request.mutable_memory_bytes())["host"] = int64_t{8} << 30;
    EXPECT_TRUE(RegisterWorker(request).ok());
    return server;
  }

  // Submits a 2-iteration job into `out` and returns it as it ended: FAILED.
  v1::Job RunToFailure(const std::string& out) {
    v1::Job job;
    EXPECT_TRUE(Submit(Spec(2, out), &job).ok());
    const auto events = Watch(job.id(), Ended);
    EXPECT_FALSE(events.empty());
    if (!events.empty()) {
      EXPECT_EQ(events.back().state(), v1::FAILED) << coordinator_->Log();
    }
    return Get(job.id());
  }
};

// A worker's error that is not UTF-8 (a path read from disk, say) fails its
// job with the message made readable, and nothing else. (It made the job
// thread's event JSON throw, outside its try: the coordinator terminated,
// and a restarted one met the same error again.)
TEST_F(MisfitWorkerTest, AnErrorThatIsNotUtf8FailsTheJobNotTheCoordinator) {
  MisfitWorker misfit(JoinPath(model_, "tokenizer.json"), dir_.path(), "cannot open /data/caf\xe9.jsonl");
  auto server = Serve(misfit);
  ASSERT_NE(server, nullptr);
  const v1::Job failed = RunToFailure("notutf8");
  EXPECT_EQ(failed.error_code(), "INTERNAL");
  EXPECT_NE(failed.error_message().find("cannot open /data/caf\xEF\xBF\xBD.jsonl"), std::string::npos)
      << failed.error_message();
  EXPECT_TRUE(coordinator_->Alive()) << coordinator_->Log();
  server->Shutdown();
}

TEST_F(MisfitWorkerTest, RepliesThatDoNotFitTheBatchFailTheJobNotTheCoordinator) {
  MisfitWorker misfit(JoinPath(model_, "tokenizer.json"), dir_.path());
  auto server = Serve(misfit);
  ASSERT_NE(server, nullptr);
  const v1::Job failed = RunToFailure("misfit");
  EXPECT_EQ(failed.error_code(), "INTERNAL");
  EXPECT_NE(failed.error_message().find("score: malformed reply: metric objective/scores is missing"),
            std::string::npos)
      << failed.error_message();
  EXPECT_TRUE(misfit.WaitForUnload(std::chrono::seconds(30))) << "the failed job's worker was not unloaded";
  // The coordinator is still there for everyone else.
  EXPECT_TRUE(coordinator_->Alive()) << coordinator_->Log();
  v1::ListJobsRequest list;
  v1::ListJobsResponse listed;
  grpc::ClientContext context;
  Auth(&context);
  EXPECT_TRUE(stub_->ListJobs(&context, list, &listed).ok());
  server->Shutdown();
}

// The coordinator and the workers serve Prometheus metrics: a scrape passes
// promtool's checks before and after a job, and the job's figures move.
// A gang that fails before its first iteration while every worker still
// answers (here a rank reports rank 0's rendezvous unreachable, as it would
// from an address other hosts cannot reach) has lost no worker: another try
// is the same try. After five the job FAILS naming the cause, where it went
// back to the queue for ever.
TEST_F(MisfitWorkerTest, AGangThatCannotFormFailsInsteadOfRequeuingForEver) {
  MisfitWorker misfit(JoinPath(model_, "tokenizer.json"), dir_.path(), "",
                      "join rendezvous at 10.255.255.1:29500: Connection refused");
  auto server = Serve(misfit);
  // The misfit's heartbeats, which keep it registered through the retries.
  std::mutex mu;
  std::condition_variable stop;
  bool done = false;
  std::thread heartbeats([&] {
    std::unique_lock<std::mutex> lock(mu);
    while (!stop.wait_for(lock, std::chrono::milliseconds(500), [&] { return done; })) {
      v1::HeartbeatRequest request;
      request.set_worker_id("misfit");
      v1::HeartbeatResponse response;
      grpc::ClientContext context;
      services::AddBearer(&context, kToken);
      (void)stub_->Heartbeat(&context, request, &response);
    }
  });
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(2, "noform"), &job).ok());
  const auto events = Watch(job.id(), Ended);
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  stop.notify_all();
  heartbeats.join();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().state(), v1::FAILED) << coordinator_->Log();
  int requeues = 0;
  for (const auto& e : events) requeues += e.type() == "state" && e.state() == v1::QUEUED;
  EXPECT_EQ(requeues, 1 + 4);  // submitted, then four requeues before the fifth loss
  const v1::Job failed = Get(job.id());
  EXPECT_EQ(failed.error_code(), "UNAVAILABLE");
  EXPECT_NE(failed.error_message().find("failed 5 times in a row"), std::string::npos) << failed.error_message();
  EXPECT_NE(failed.error_message().find("10.255.255.1:29500: Connection refused"), std::string::npos)
      << failed.error_message();
}

class MetricsTest : public ServiceTest {
 protected:
  bool ServeMetrics() const override { return true; }

  // GET /metrics of metrics_addr_[slot], checked by promtool.
  std::string Scrape(size_t slot) {
    const std::string file = dir_.Join(absl::StrCat("scrape", slot, "-", scrapes_++, ".txt"));
    auto got = testing::RunCommand(
        {"curl", "-sSf", "-o", file, absl::StrCat("http://", metrics_addr_[slot], "/metrics")});
    EXPECT_TRUE(got.ok() && got->exit_code == 0) << (got.ok() ? got->error : got.status().ToString());
    auto check = testing::RunCommand({"sh", "-c", "promtool check metrics < " + file});
    EXPECT_TRUE(check.ok() && check->exit_code == 0)
        << "promtool check metrics: " << (check.ok() ? check->output + check->error : check.status().ToString());
    auto text = ReadFileToString(file);
    return text.ok() ? *text : "";
  }

  // The value of one sample ("name{labels}" exactly as exposed), or -1.
  static double Sample(const std::string& text, const std::string& series) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
    }
    return -1;
  }

  int scrapes_ = 0;
};

TEST_F(MetricsTest, ScrapesShowTheJobMoveOnTheCoordinatorAndTheWorkers) {
  if (!testing::HaveProgram("curl") || !testing::HaveProgram("promtool")) {
    FAIL() << "needs curl and promtool (Debian packages curl, prometheus): run deploy/install-deps.sh";
  }
  const std::string coordinator_before = Scrape(0);
  const std::string worker_before = Scrape(1);
  EXPECT_EQ(Sample(coordinator_before, R"(strata_iterations_total{algorithm="remax"})"), -1);
  EXPECT_EQ(Sample(coordinator_before, R"(strata_workers{state="idle"})"), 2);
  const double adam_before = Sample(worker_before, "strata_cpu_adam_parameters_total");
  const double tokens_before = Sample(worker_before, "strata_generated_tokens_total");
  EXPECT_EQ(tokens_before, 0);

  v1::Job job;
  ASSERT_TRUE(Submit(Spec(3, "metrics-run"), &job, "", {"parallel.workers=2"}).ok());
  Watch(job.id(), Ended);
  ASSERT_EQ(Get(job.id()).state(), v1::SUCCEEDED) << Get(job.id()).error_message();

  const std::string coordinator = Scrape(0);
  EXPECT_EQ(Sample(coordinator, R"(strata_iterations_total{algorithm="remax"})"), 3) << coordinator;
  EXPECT_EQ(Sample(coordinator, R"(strata_iteration_seconds_count{algorithm="remax"})"), 3);
  EXPECT_GT(Sample(coordinator, R"(strata_iteration_seconds_sum{algorithm="remax"})"), 0);
  EXPECT_EQ(Sample(coordinator, R"(strata_jobs{state="SUCCEEDED"})"), 1);
  EXPECT_EQ(Sample(coordinator, R"(strata_jobs{state="QUEUED"})"), 0);
  EXPECT_EQ(Sample(coordinator, "strata_job_queue_wait_seconds_count"), 1);
  EXPECT_EQ(Sample(coordinator, R"(strata_rpc_server_seconds_count{code="OK",method="Coordinator/SubmitJob"})"), 1);
  EXPECT_GE(Sample(coordinator, R"(strata_rpc_server_seconds_count{code="OK",method="Coordinator/RegisterWorker"})"),
            2);
  EXPECT_EQ(Sample(coordinator, "strata_redis_errors_total"), 0);
  EXPECT_GT(Sample(coordinator, "strata_process_resident_memory_bytes"), 0);

  // Both ranks ran every phase of the 3 iterations on their half of the batch.
  for (size_t slot : {1u, 2u}) {
    const std::string worker = Scrape(slot);
    for (const char* phase : {"rollout", "score", "update"}) {
      EXPECT_EQ(Sample(worker, absl::StrCat("strata_phase_seconds_count{phase=\"", phase, "\"}")), 3)
          << "worker " << slot << " phase " << phase << "\n"
          << worker;
    }
    EXPECT_GT(Sample(worker, R"(strata_rpc_server_seconds_count{code="OK",method="Worker/RunPhase"})"), 0);
    // 2 prompts of this rank x (1 sample + 1 greedy) x at most 8 tokens, 3 times.
    const double tokens = Sample(worker, "strata_generated_tokens_total");
    EXPECT_GT(tokens, 0);
    EXPECT_LE(tokens, 3 * 2 * 2 * 8);
    EXPECT_GT(Sample(worker, "strata_generation_tokens_per_second"), 0);
    EXPECT_GT(Sample(worker, "strata_cpu_adam_parameters_total"), slot == 1 ? adam_before : 0);
    EXPECT_GT(Sample(worker, R"(strata_memory_phase_peak_bytes{tier="host"})"), 0);
    EXPECT_GT(Sample(worker, R"(strata_memory_phase_peak_bytes{tier="device"})"), 0);
    EXPECT_GE(Sample(worker, R"(strata_memory_bytes{tier="host"})"), 0);
    EXPECT_GT(Sample(worker, "strata_process_resident_memory_peak_bytes"), 0);
  }
}

TEST_F(MetricsTest, ABadMetricsAddressFailsTheCommandNamingTheFlag) {
  // `timeout`: were the address taken after all, the worker would serve on.
  auto result = testing::RunCommand({"timeout", "30", testing::StrataBinary(), "worker", "--insecure", "--listen",
                                     "127.0.0.1:0", "--metrics-listen", "no-port-here"});
  ASSERT_TRUE(result.ok());
  EXPECT_NE(result->exit_code, 0);
  EXPECT_NE(result->error.find("--metrics-listen"), std::string::npos) << result->error;
  // The port the coordinator already serves metrics on is taken.
  result = testing::RunCommand({"timeout", "30", testing::StrataBinary(), "worker", "--insecure", "--listen",
                                "127.0.0.1:0", "--metrics-listen", metrics_addr_[0]});
  ASSERT_TRUE(result.ok());
  EXPECT_NE(result->exit_code, 0);
  EXPECT_NE(result->error.find("cannot serve on " + metrics_addr_[0]), std::string::npos) << result->error;
}

// Cancel reaches into a running phase: a rollout of hundreds of decoding
// steps is interrupted at its next step (the worker learns of the cancel
// from its next heartbeat), not run to its end, and the worker is idle soon
// after. (It used to finish the phase: minutes, for a big batch.)
TEST_F(MetricsTest, CancelInterruptsARunningRollout) {
  const std::string big = dir_.Join("long-model");
  testing::WriteTextFile(dir_.Join("long.json"), R"({"vocab_size": 259, "hidden_size": 256,
      "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
      "max_position_embeddings": 1024, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})");
  auto init = testing::RunCommand(
      {testing::StrataBinary(), "init-model", "--config", dir_.Join("long.json"), "--out", big, "--seed", "3"});
  ASSERT_TRUE(init.ok() && init->exit_code == 0);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(JoinPath(model_, f), JoinPath(big, f));
  }
  // 64 prompts, each with a sample and a greedy response of up to 900
  // tokens: the greedy ones rarely stop early, so the rollout is long.
  v1::Job job;
  ASSERT_TRUE(Submit(Spec(1, "interrupted"), &job, "",
                     {"models.actor.path=" + big, "train.batch_size=64", "generation.max_new_tokens=900"})
                  .ok());
  // Cancel once a worker is decoding: its generated-token counter moved.
  // (Holding the job is not enough: a cancel that lands between the load
  // and the rollout unloads the job before anything runs.)
  auto decoding = [&] {
    for (size_t slot : {1u, 2u}) {
      auto got = testing::RunCommand({"curl", "-sf", absl::StrCat("http://", metrics_addr_[slot], "/metrics")});
      if (got.ok() && Sample(got->output, "strata_generated_tokens_total") > 0) return true;
    }
    return false;
  };
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
       !decoding() && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polls other processes
  }
  v1::Job cancelled;
  ASSERT_TRUE(Cancel(job.id(), &cancelled).ok());
  const auto cancelled_at = std::chrono::steady_clock::now();
  // Both workers end idle.
  EXPECT_TRUE(WaitUntilWorkersIdle(std::chrono::seconds(120)));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - cancelled_at).count();
  std::printf("workers idle %.2f s after the cancel\n", seconds);
  const std::string logs = workers_[0]->Log() + workers_[1]->Log();
  EXPECT_NE(logs.find("interrupted while generating"), std::string::npos) << logs;
  EXPECT_EQ(Get(job.id()).state(), v1::CANCELLED);
}

}  // namespace
}  // namespace strata
