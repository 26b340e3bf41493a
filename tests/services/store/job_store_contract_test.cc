// The JobStore contract, run against Redis (what deployments run) and the
// memory store (what the coordinator's unit tests run), so that the two
// cannot drift. Redis-only behaviour (restarts, outages, timeouts) is in
// redis_job_store_test.cc.
#include <atomic>
#include <chrono>
#include <latch>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/store/memory_job_store.h"
#include "services/store/redis_job_store.h"
#include "tests/services/store/redis_probe.h"
#include "tests/services/store/test_jobs.h"
#include "tests/testutil/redis_server.h"

namespace strata::services {
namespace {

using ::strata::testing::RedisServer;

class JobStoreContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "memory") {
      MemoryStoreOptions options;
      options.now_unix_ms = [this] { return SystemNowMs() + clock_offset_ms_.load(); };
      store_ = std::make_unique<MemoryJobStore>(options);
      return;
    }
    if (!RedisServer::Available()) GTEST_SKIP() << "redis-server is not installed; the job store needs a real Redis";
    auto server = RedisServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    RedisStoreOptions options;
    options.redis_url = server_->url();
    options.key_prefix = "test:";
    options.connect_timeout_ms = 1000;
    options.command_timeout_ms = 2000;
    auto store = ConnectRedisJobStore(options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    probe_ = std::make_unique<RedisProbe>(server_->port());
  }

  static int64_t SystemNowMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  // Lets time pass for the store: the memory store's clock moves on at
  // once, Redis's by waiting.
  void AdvanceClock(std::chrono::milliseconds by) {
    if (probe_ == nullptr) {
      clock_offset_ms_ += by.count();
    } else {
      std::this_thread::sleep_for(by);
    }
  }

  std::unique_ptr<RedisServer> server_;
  std::unique_ptr<RedisProbe> probe_;  // Redis only: looks behind the store's back
  std::unique_ptr<JobStore> store_;
  std::atomic<int64_t> clock_offset_ms_{0};
};

TEST_P(JobStoreContractTest, CreateGetRoundTrip) {
  JobRecord in = NewJob("round-trip");
  in.spec_yaml = std::string("binary\0safe: \"quotes\" % %s\n", 28);
  bool created = false;
  auto job = store_->Create(in, &created);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(created);
  EXPECT_TRUE(absl::StartsWith(job->id, "job-")) << job->id;
  EXPECT_EQ(job->state, JobState::kQueued);
  EXPECT_GT(job->created_unix_ms, 1600000000000);
  EXPECT_EQ(job->created_unix_ms, job->updated_unix_ms);

  auto got = store_->Get(job->id);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->id, job->id);
  EXPECT_EQ(got->state, JobState::kQueued);
  EXPECT_EQ(got->algorithm, "remax");
  EXPECT_EQ(got->name, "round-trip");
  EXPECT_EQ(got->spec_yaml, in.spec_yaml);
  EXPECT_EQ(got->output_dir, "/tmp/out/round-trip");
  EXPECT_EQ(got->iterations, 10);
  EXPECT_EQ(got->iteration, 0);
  EXPECT_EQ(got->created_unix_ms, job->created_unix_ms);

  // Two creates without a request id are two jobs.
  auto other = store_->Create(in, &created);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(created);
  EXPECT_NE(other->id, job->id);
}

TEST_P(JobStoreContractTest, GetUnknownJobIsNotFoundNamingTheId) {
  auto got = store_->Get("job-000000000000");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(got.status().message(), "job-000000000000")) << got.status();
  // An id that could name another key (a job's event stream) is refused outright.
  EXPECT_EQ(store_->Get("job-1:events").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(JobStoreContractTest, CreateWithSameRequestIdReturnsTheFirstJob) {
  bool created = false;
  auto first = store_->Create(NewJob("idem", "req-1"), &created);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(created);
  auto retry = store_->Create(NewJob("idem-retry", "req-1"), &created);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_FALSE(created);
  EXPECT_EQ(retry->id, first->id);
  EXPECT_EQ(retry->name, "idem");
  auto other = store_->Create(NewJob("idem", "req-2"), &created);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(created);
  EXPECT_NE(other->id, first->id);
}

// A request id is one tenant's: another tenant's (or the admin's) same id
// makes another job, and no id of a caller without a tenant can stand for
// a tenant's.
TEST_P(JobStoreContractTest, RequestIdsAreKeptApartByTenant) {
  JobRecord alice = NewJob("alice", "b");
  alice.tenant = "a";
  auto first = store_->Create(alice, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  bool created = false;
  auto admin = store_->Create(NewJob("admin", "b"), &created);
  ASSERT_TRUE(admin.ok()) << admin.status();
  EXPECT_TRUE(created);
  EXPECT_NE(admin->id, first->id);
  auto lookalike = store_->Create(NewJob("admin", "a:b"), &created);
  EXPECT_EQ(lookalike.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(lookalike.status().message(), "request_id")) << lookalike.status();
  JobRecord colon = NewJob("alice-colon", "x:y");
  colon.tenant = "a";
  EXPECT_TRUE(store_->Create(colon, nullptr).ok()) << "a tenant's ids may hold ':'";
}

TEST_P(JobStoreContractTest, ConcurrentCreatesWithSameRequestIdMakeOneJob) {
  constexpr int kThreads = 12;
  std::latch start(kThreads);
  std::vector<std::string> ids(kThreads);
  std::vector<int> created_flags(kThreads, 0);
  std::vector<absl::Status> statuses(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      bool created = false;
      auto job = store_->Create(NewJob(absl::StrCat("racer-", i), "same-request"), &created);
      statuses[i] = job.status();
      if (job.ok()) ids[i] = job->id;
      created_flags[i] = created ? 1 : 0;
    });
  }
  for (auto& t : threads) t.join();
  int created_count = 0;
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << statuses[i];
    EXPECT_EQ(ids[i], ids[0]);
    created_count += created_flags[i];
  }
  EXPECT_EQ(created_count, 1);
  auto page = store_->List(100, "", std::nullopt);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->first.size(), 1u);
}

TEST_P(JobStoreContractTest, ListPagesNewestFirstWithoutDuplicates) {
  std::vector<std::string> ids;
  for (int i = 0; i < 25; ++i) ids.push_back(CreateJob(*store_, absl::StrCat("page-", i)));

  std::vector<std::string> seen;
  std::string token;
  std::vector<size_t> sizes;
  bool inserted = false;
  do {
    auto page = store_->List(10, token, std::nullopt);
    ASSERT_TRUE(page.ok()) << page.status();
    sizes.push_back(page->first.size());
    for (const auto& job : page->first) seen.push_back(job.id);
    token = page->second;
    // A job created mid-listing must not shift later pages.
    if (!inserted) {
      CreateJob(*store_, "late");
      inserted = true;
    }
  } while (!token.empty() && sizes.size() < 10);

  EXPECT_EQ(sizes, (std::vector<size_t>{10, 10, 5}));
  ASSERT_EQ(seen.size(), 25u);
  for (int i = 0; i < 25; ++i) EXPECT_EQ(seen[i], ids[24 - i]) << "position " << i;
  EXPECT_EQ(std::set<std::string>(seen.begin(), seen.end()).size(), 25u);

  // Page size 0 is the default (50): everything, including the late job, on one page.
  auto all = store_->List(0, "", std::nullopt);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->first.size(), 26u);
  EXPECT_EQ(all->first[0].name, "late");
  EXPECT_TRUE(all->second.empty());

  EXPECT_EQ(store_->List(10, "not-a-token", std::nullopt).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->List(-1, "", std::nullopt).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(JobStoreContractTest, ListFiltersByState) {
  std::vector<std::string> ids;
  for (int i = 0; i < 12; ++i) ids.push_back(CreateJob(*store_, absl::StrCat("filter-", i)));
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(store_->Transition(ids[i], {JobState::kQueued}, JobState::kRunning).ok());
  }
  auto first = store_->List(5, "", JobState::kRunning);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->first.size(), 5u);
  EXPECT_EQ(first->first[0].id, ids[6]);
  for (const auto& job : first->first) EXPECT_EQ(job.state, JobState::kRunning);
  ASSERT_FALSE(first->second.empty());
  auto second = store_->List(5, first->second, JobState::kRunning);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->first.size(), 2u);
  EXPECT_EQ(second->first[1].id, ids[0]);
  EXPECT_TRUE(second->second.empty());

  auto queued = store_->List(100, "", JobState::kQueued);
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_EQ(queued->first.size(), 5u);
  auto done = store_->List(100, "", JobState::kSucceeded);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(done->first.empty());
  EXPECT_TRUE(done->second.empty());

  auto running = store_->ListByState(JobState::kRunning);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(running->size(), 7u);
  EXPECT_EQ(running->front().id, ids[0]);  // oldest first for recovery
}

TEST_P(JobStoreContractTest, TransitionsFollowTheStateMachine) {
  const std::string id = CreateJob(*store_, "machine");
  auto running = store_->Transition(id, {JobState::kQueued}, JobState::kRunning, {{"worker", "worker-a"}});
  ASSERT_TRUE(running.ok()) << running.status();
  EXPECT_EQ(running->state, JobState::kRunning);
  EXPECT_EQ(running->worker, "worker-a");
  EXPECT_GE(running->updated_unix_ms, running->created_unix_ms);

  // Not from the listed state: rejected, naming where the job is.
  auto wrong = store_->Transition(id, {JobState::kQueued}, JobState::kRunning);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(wrong.status().message(), "RUNNING")) << wrong.status();

  auto done = store_->Transition(id, {JobState::kRunning}, JobState::kSucceeded, {{"iteration", "10"}});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state, JobState::kSucceeded);
  EXPECT_EQ(done->iteration, 10);

  auto back = store_->Transition(id, {JobState::kSucceeded, JobState::kRunning}, JobState::kRunning);
  EXPECT_EQ(back.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(back.status().message(), "SUCCEEDED")) << back.status();
  auto got = store_->Get(id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->state, JobState::kSucceeded);

  auto failed_id = CreateJob(*store_, "fails");
  auto failed = store_->Transition(failed_id, {JobState::kQueued, JobState::kRunning}, JobState::kFailed,
                                   {{"error_code", "RESOURCE_EXHAUSTED"}, {"error_message", "out of memory"}});
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->error_code, "RESOURCE_EXHAUSTED");
  EXPECT_EQ(failed->error_message, "out of memory");

  EXPECT_EQ(store_->Transition("job-000000000000", {JobState::kQueued}, JobState::kRunning).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->Transition(failed_id, {}, JobState::kRunning).status().code(), absl::StatusCode::kInvalidArgument);
  auto bad_field = store_->Transition(CreateJob(*store_, "f"), {JobState::kQueued}, JobState::kRunning,
                                      {{"state", "X"}});
  EXPECT_EQ(bad_field.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad_field.status().message(), "state")) << bad_field.status();
}

// A job's first start is kept through a requeue: the queue-wait metric
// counts a job once, from its submission to that start.
TEST_P(JobStoreContractTest, TheFirstStartIsKeptThroughARequeue) {
  const std::string id = CreateJob(*store_, "starts");
  auto queued = store_->Get(id);
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_EQ(queued->started_unix_ms, 0);
  auto first = store_->Transition(id, {JobState::kQueued}, JobState::kRunning, {{"worker", "a"}});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->first_start);
  EXPECT_EQ(first->started_unix_ms, first->updated_unix_ms);
  EXPECT_GE(first->started_unix_ms, first->created_unix_ms);
  // Back-dated, so that a start that overwrote it would show within the
  // same millisecond too.
  int64_t first_start = first->started_unix_ms;
  if (probe_ != nullptr) {
    ASSERT_EQ(probe_->Integer({"HSET", "test:job:" + id, "started_unix_ms", "1"}), 0);
    first_start = 1;
  } else {
    AdvanceClock(std::chrono::seconds(1));
  }
  ASSERT_TRUE(store_->Transition(id, {JobState::kRunning}, JobState::kQueued, {{"worker", ""}}).ok());
  auto again = store_->Transition(id, {JobState::kQueued}, JobState::kRunning, {{"worker", "b"}});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->started_unix_ms, first_start);
  EXPECT_FALSE(again->first_start);
  EXPECT_EQ(again->worker, "b");
}

// A run records its end only on its own claim: a retry whose first attempt
// landed (its reply lost) must not move the next run's claim.
TEST_P(JobStoreContractTest, ATransitionCanRequireTheGangThatClaimedTheJob) {
  const std::string id = CreateJob(*store_, "claimed");
  ASSERT_TRUE(store_->Transition(id, {JobState::kQueued}, JobState::kRunning, {{"worker", "w0,w1"}}).ok());
  // The first run's requeue lands; the next run claims the job on another gang.
  ASSERT_TRUE(
      store_->Transition(id, {JobState::kRunning}, JobState::kQueued, {{"worker", ""}}, {{"worker", "w0,w1"}}).ok());
  ASSERT_TRUE(store_->Transition(id, {JobState::kQueued}, JobState::kRunning, {{"worker", "w0,w2"}}).ok());
  // The first run's retry of its requeue finds the job RUNNING on w0,w2: refused.
  auto retry = store_->Transition(id, {JobState::kRunning}, JobState::kQueued, {{"worker", ""}}, {{"worker", "w0,w1"}});
  EXPECT_EQ(retry.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(retry.status().message(), "RUNNING with worker \"w0,w2\", not \"w0,w1\""))
      << retry.status();
  auto got = store_->Get(id);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->state, JobState::kRunning);
  EXPECT_EQ(got->worker, "w0,w2");
  // The current run's own end is recorded.
  auto done = store_->Transition(id, {JobState::kRunning}, JobState::kSucceeded, {}, {{"worker", "w0,w2"}});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state, JobState::kSucceeded);
  auto bad = store_->Transition(CreateJob(*store_, "bad"), {JobState::kQueued}, JobState::kRunning, {},
                                {{"state", "QUEUED"}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(JobStoreContractTest, CancelledIsTerminal) {
  const std::string id = CreateJob(*store_, "cancel");
  ASSERT_TRUE(store_->Transition(id, {JobState::kQueued, JobState::kRunning}, JobState::kCancelled).ok());
  for (const JobState to :
       {JobState::kQueued, JobState::kRunning, JobState::kSucceeded, JobState::kFailed, JobState::kCancelled}) {
    auto moved = store_->Transition(
        id, {JobState::kQueued, JobState::kRunning, JobState::kSucceeded, JobState::kFailed, JobState::kCancelled}, to);
    EXPECT_EQ(moved.status().code(), absl::StatusCode::kFailedPrecondition) << JobStateName(to);
    EXPECT_TRUE(absl::StrContains(moved.status().message(), "CANCELLED")) << moved.status();
  }
  auto cancelled = store_->ListByState(JobState::kCancelled);
  ASSERT_TRUE(cancelled.ok());
  ASSERT_EQ(cancelled->size(), 1u);
  auto queued = store_->ListByState(JobState::kQueued);
  ASSERT_TRUE(queued.ok());
  EXPECT_TRUE(queued->empty());
  EXPECT_TRUE(IsTerminal(JobState::kCancelled));
  EXPECT_FALSE(IsTerminal(JobState::kRunning));
}

// A job that ended FAILED or CANCELLED is continued by at most one new job,
// claimed in the same step that creates it; a queued, running or
// succeeded job is not continued, and nor is one that does not exist.
TEST_P(JobStoreContractTest, AnEndedJobIsContinuedOnce) {
  const std::string running = CreateJob(*store_, "running");
  ASSERT_TRUE(store_->Transition(running, {JobState::kQueued}, JobState::kRunning).ok());
  JobRecord next = NewJob("next");
  next.resumable_run_ids = {running};
  auto refused = store_->Create(next, nullptr);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "is RUNNING")) << refused.status();

  ASSERT_TRUE(store_->Transition(running, {JobState::kRunning}, JobState::kFailed).ok());
  next.checkpoint_dir = "/tmp/out/running/checkpoints/iter-000002";
  next.checkpoint_iteration = 2;
  next.resumable_run_ids = {running, "job-older"};
  next.request_id = "continue-1";
  auto first = store_->Create(next, nullptr);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->continues(), running);
  EXPECT_EQ(first->resumable_run_ids, next.resumable_run_ids);
  // A retry of the same request (its reply was lost) is the same job, not
  // a second continuation.
  auto retried = store_->Create(next, nullptr);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->id, first->id);
  next.request_id.clear();
  EXPECT_EQ(first->checkpoint_dir, next.checkpoint_dir);
  EXPECT_EQ(first->checkpoint_iteration, 2);
  EXPECT_EQ(first->state, JobState::kQueued);
  auto ended = store_->Get(running);
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ(ended->continued_by, first->id);
  EXPECT_EQ(ended->state, JobState::kFailed);  // an ended job's state never changes

  auto second = store_->Create(next, nullptr);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), "continued already, by job " + first->id))
      << second.status();

  next.resumable_run_ids = {"job-doesnotexist"};
  EXPECT_EQ(store_->Create(next, nullptr).status().code(), absl::StatusCode::kNotFound);
  const std::string succeeded = CreateJob(*store_, "done");
  ASSERT_TRUE(store_->Transition(succeeded, {JobState::kQueued}, JobState::kRunning).ok());
  ASSERT_TRUE(store_->Transition(succeeded, {JobState::kRunning}, JobState::kSucceeded).ok());
  next.resumable_run_ids = {succeeded};
  EXPECT_EQ(store_->Create(next, nullptr).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(JobStoreContractTest, ConcurrentTransitionsHaveExactlyOneWinner) {
  const std::string id = CreateJob(*store_, "contended");
  constexpr int kThreads = 16;
  std::latch start(kThreads);
  std::atomic<int> winners{0};
  std::atomic<int> rejected{0};
  std::vector<std::string> winner_worker(1);
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      const std::string worker = absl::StrCat("worker-", i);
      auto result = store_->Transition(id, {JobState::kQueued}, JobState::kRunning, {{"worker", worker}});
      if (result.ok()) {
        ++winners;
        std::lock_guard<std::mutex> lock(mu);
        winner_worker[0] = worker;
      } else if (result.status().code() == absl::StatusCode::kFailedPrecondition) {
        ++rejected;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(winners.load(), 1);
  EXPECT_EQ(rejected.load(), kThreads - 1);
  auto job = store_->Get(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->worker, winner_worker[0]);
}

TEST_P(JobStoreContractTest, EventsAppendAndResumeAfterId) {
  const std::string id = CreateJob(*store_, "events");
  auto no_event = store_->LastEvent(id);
  ASSERT_TRUE(no_event.ok()) << no_event.status();
  EXPECT_FALSE(no_event->has_value());
  std::vector<std::string> event_ids;
  for (int i = 0; i < 5; ++i) {
    auto event_id = store_->AppendEvent(id, "metrics", absl::StrCat(R"({"iteration":)", i, "}"));
    ASSERT_TRUE(event_id.ok()) << event_id.status();
    event_ids.push_back(*event_id);
  }
  auto first = store_->ReadEvents(id, "", 3, 0);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->size(), 3u);
  EXPECT_EQ((*first)[0].id, event_ids[0]);
  EXPECT_EQ((*first)[0].type, "metrics");
  EXPECT_EQ((*first)[0].json, R"({"iteration":0})");
  auto rest = store_->ReadEvents(id, first->back().id, 100, 0);
  ASSERT_TRUE(rest.ok()) << rest.status();
  ASSERT_EQ(rest->size(), 2u);
  EXPECT_EQ((*rest)[0].id, event_ids[3]);
  EXPECT_EQ((*rest)[1].json, R"({"iteration":4})");
  auto none = store_->ReadEvents(id, event_ids.back(), 100, 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  auto last = store_->LastEvent(id);
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_TRUE(last->has_value());
  EXPECT_EQ((*last)->id, event_ids.back());
  EXPECT_EQ((*last)->type, "metrics");
  EXPECT_EQ((*last)->json, R"({"iteration":4})");
  EXPECT_EQ(store_->LastEvent("job-000000000000").status().code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(store_->AppendEvent("job-000000000000", "metrics", "{}").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->ReadEvents("job-000000000000", "", 10, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->ReadEvents(id, "bogus", 10, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(JobStoreContractTest, BlockingReadReturnsWhenAnotherThreadAppends) {
  const std::string id = CreateJob(*store_, "watch");
  auto first = store_->AppendEvent(id, "state", R"({"state":"QUEUED"})");
  ASSERT_TRUE(first.ok());

  absl::StatusOr<std::vector<JobEventRecord>> result;
  std::chrono::milliseconds waited{0};
  std::thread reader([&] {
    const auto start = std::chrono::steady_clock::now();
    result = store_->ReadEvents(id, *first, 10, 10000);
    waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  });
  // Append only once Redis has the reader parked in XREAD BLOCK, so the test
  // proves the wake-up rather than a read that happened to come second (the
  // memory store offers no such view: there a late read passes too).
  if (probe_ != nullptr) {
    bool blocked = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!blocked && std::chrono::steady_clock::now() < deadline) {
      blocked = absl::StrContains(probe_->String({"INFO", "clients"}), "blocked_clients:1");
    }
    EXPECT_TRUE(blocked) << "the reader never blocked in Redis";
  }
  // Other calls go on while the reader holds its connection.
  EXPECT_TRUE(store_->Ping().ok());
  auto second = store_->AppendEvent(id, "metrics", R"({"iteration":1})");
  ASSERT_TRUE(second.ok());
  reader.join();
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->size(), 1u);
  EXPECT_EQ((*result)[0].id, *second);
  EXPECT_LT(waited.count(), 9000) << "woke by timeout, not by the append";

  // Nothing new: a short block ends empty, not in error.
  auto empty = store_->ReadEvents(id, *second, 10, 50);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());
}

TEST_P(JobStoreContractTest, CheckpointsAreRecordedAndListed) {
  const std::string id = CreateJob(*store_, "ckpt");
  ASSERT_TRUE(store_->SetProgress(id, 3).ok());
  ASSERT_TRUE(store_->RecordCheckpoint(id, 4, "/ckpt/iter-4").ok());
  ASSERT_TRUE(store_->RecordCheckpoint(id, 12, "/ckpt/iter-12").ok());
  ASSERT_TRUE(store_->RecordCheckpoint(id, 8, "/ckpt/iter-8").ok());  // late report of an older one
  auto job = store_->Get(id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->iteration, 3);
  EXPECT_EQ(job->checkpoint_iteration, 12);
  EXPECT_EQ(job->checkpoint_dir, "/ckpt/iter-12");
  auto list = store_->ListCheckpoints(id);
  ASSERT_TRUE(list.ok()) << list.status();
  const std::vector<std::pair<int64_t, std::string>> expected = {{4, "/ckpt/iter-4"},
                                                                 {8, "/ckpt/iter-8"},
                                                                 {12, "/ckpt/iter-12"}};
  EXPECT_EQ(*list, expected);
  EXPECT_EQ(store_->RecordCheckpoint("job-000000000000", 1, "/x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->SetProgress("job-000000000000", 1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->ListCheckpoints("job-000000000000").status().code(), absl::StatusCode::kNotFound);
}

TEST_P(JobStoreContractTest, WorkerRegistrationExpiresAfterItsTtl) {
  ASSERT_TRUE(store_->RegisterWorker({"w-short", "10.0.0.1:7000", "", 0}, 200).ok());
  ASSERT_TRUE(store_->RegisterWorker({"w-long", "10.0.0.2:7000", "", 0}, 60000).ok());
  if (probe_ != nullptr) {
    const long long pttl = probe_->Integer({"PTTL", "test:worker:w-short"});
    EXPECT_GT(pttl, 0);
    EXPECT_LE(pttl, 200);
  }

  auto workers = store_->ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 2u);
  EXPECT_EQ((*workers)[1].id, "w-short");
  EXPECT_EQ((*workers)[1].address, "10.0.0.1:7000");
  EXPECT_GT((*workers)[1].last_heartbeat_unix_ms, 0);

  ASSERT_TRUE(store_->Heartbeat("w-long", "job-abc", 60000).ok());
  // Bounded poll: the short registration lapses about 200 ms after it was made.
  bool expired = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!expired && std::chrono::steady_clock::now() < deadline) {
    workers = store_->ListWorkers();
    ASSERT_TRUE(workers.ok()) << workers.status();
    expired = workers->size() == 1;
    if (!expired) AdvanceClock(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(expired);
  EXPECT_EQ((*workers)[0].id, "w-long");
  EXPECT_EQ((*workers)[0].job_id, "job-abc");

  auto late = store_->Heartbeat("w-short", "", 200);
  EXPECT_EQ(late.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(late.message(), "w-short")) << late;
  if (probe_ != nullptr) {
    EXPECT_EQ(probe_->Integer({"SISMEMBER", "test:workers", "w-short"}), 0);  // pruned from the registry
  }
  EXPECT_EQ(store_->RegisterWorker({"w", "a", "", 0}, 0).code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobStateTest, NamesRoundTrip) {
  for (const JobState state :
       {JobState::kQueued, JobState::kRunning, JobState::kSucceeded, JobState::kFailed, JobState::kCancelled}) {
    auto parsed = ParseJobState(JobStateName(state));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, state);
  }
  EXPECT_EQ(*ParseJobState("running"), JobState::kRunning);
  EXPECT_EQ(ParseJobState("PAUSED").status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Stores, JobStoreContractTest, ::testing::Values("redis", "memory"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace strata::services
