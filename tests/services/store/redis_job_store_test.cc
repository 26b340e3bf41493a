// What only the Redis store does: survive a Redis restart, report an
// outage, time out, and check its options. The contract both stores keep is
// job_store_contract_test.cc.
#include "services/store/redis_job_store.h"

#include <chrono>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/services/store/redis_probe.h"
#include "tests/services/store/test_jobs.h"
#include "tests/testutil/redis_server.h"

namespace strata::services {
namespace {

using ::strata::testing::RedisServer;

class RedisJobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!RedisServer::Available()) GTEST_SKIP() << "redis-server is not installed; the job store needs a real Redis";
    auto server = RedisServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto store = ConnectRedisJobStore(Options());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  RedisStoreOptions Options() const {
    RedisStoreOptions options;
    options.redis_url = server_->url();
    options.key_prefix = "test:";
    options.connect_timeout_ms = 1000;
    options.command_timeout_ms = 2000;
    return options;
  }

  std::unique_ptr<RedisServer> server_;
  std::unique_ptr<JobStore> store_;
};

TEST_F(RedisJobStoreTest, RedisRestartWithAppendOnlyFileKeepsJobsAndEvents) {
  bool created = false;
  auto job = store_->Create(NewJob("durable", "req-durable"), &created);
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(store_->Transition(job->id, {JobState::kQueued}, JobState::kRunning).ok());
  ASSERT_TRUE(store_->RecordCheckpoint(job->id, 5, "/ckpt/5").ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store_->AppendEvent(job->id, "metrics", absl::StrCat(i)).ok());

  ASSERT_TRUE(server_->Stop().ok());
  ASSERT_TRUE(server_->Restart().ok()) << server_->Log();

  // The same store carries on: its pooled connections are dead and get replaced.
  auto got = store_->Get(job->id);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->state, JobState::kRunning);
  EXPECT_EQ(got->checkpoint_iteration, 5);
  auto events = store_->ReadEvents(job->id, "", 10, 0);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 3u);
  EXPECT_EQ((*events)[2].json, "2");
  auto running = store_->ListByState(JobState::kRunning);
  ASSERT_TRUE(running.ok());
  EXPECT_EQ(running->size(), 1u);
  // Scripts are reloaded transparently (the restarted server's cache is empty).
  ASSERT_TRUE(store_->Transition(job->id, {JobState::kRunning}, JobState::kSucceeded).ok());
  auto retry = store_->Create(NewJob("durable", "req-durable"), &created);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_FALSE(created);
  EXPECT_EQ(retry->id, job->id);

  auto fresh = ConnectRedisJobStore(Options());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE((*fresh)->Get(job->id).ok());
}

TEST_F(RedisJobStoreTest, RedisDownIsUnavailableNamingTheAddressThenRecovers) {
  const std::string id = CreateJob(*store_, "outage");
  ASSERT_TRUE(server_->Stop().ok());

  auto got = store_->Get(id);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(got.status().message(), server_->address())) << got.status();
  EXPECT_EQ(store_->Ping().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(store_->AppendEvent(id, "metrics", "{}").status().code(), absl::StatusCode::kUnavailable);
  auto connect = ConnectRedisJobStore(Options());
  EXPECT_EQ(connect.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(connect.status().message(), server_->address())) << connect.status();

  ASSERT_TRUE(server_->Restart().ok()) << server_->Log();
  EXPECT_TRUE(store_->Ping().ok());
  auto back = store_->Get(id);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->name, "outage");
}

TEST_F(RedisJobStoreTest, CommandTimeoutIsUnavailableAndTheLateReplyIsNeverRead) {
  const std::string id = CreateJob(*store_, "slow");
  RedisStoreOptions options = Options();
  options.command_timeout_ms = 100;
  auto store = ConnectRedisJobStore(options);
  ASSERT_TRUE(store.ok()) << store.status();
  RedisProbe probe(server_->port());
  // Redis holds every other client's commands while paused: the store's reply
  // arrives only after its socket timeout.
  ASSERT_EQ(probe.String({"CLIENT", "PAUSE", "400", "ALL"}), "OK");
  auto slow = (*store)->Get(id);
  EXPECT_EQ(slow.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(slow.status().message(), "timed out")) << slow.status();
  EXPECT_TRUE(absl::StrContains(slow.status().message(), server_->address())) << slow.status();
  // Bounded poll until the pause lifts. Had the timed-out connection been
  // reused, these calls would read the HGETALL reply meant for the Get above.
  bool back = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!back && std::chrono::steady_clock::now() < deadline) back = (*store)->Ping().ok();
  ASSERT_TRUE(back);
  auto checkpoints = (*store)->ListCheckpoints(id);
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  EXPECT_TRUE(checkpoints->empty());
  auto got = (*store)->Get(id);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->name, "slow");
}

TEST(RedisStoreOptionsTest, MalformedRedisUrlIsInvalidArgumentNamingTheField) {
  for (const std::string url :
       {"", "localhost:6379", "http://127.0.0.1:6379", "redis://", "redis://:6379", "redis://host:notaport",
        "redis://host:70000", "redis://host:", "redis://host/db0", "redis://secret@host:6379", "redis://[::1:6379"}) {
    RedisStoreOptions options;
    options.redis_url = url;
    const absl::Status status = options.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << url;
    EXPECT_TRUE(absl::StrContains(status.message(), "redis_url")) << status;
    auto store = ConnectRedisJobStore(options);
    EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument) << url;
  }
  RedisStoreOptions options;
  options.redis_url = "redis://user:hunter2@host:6379/0";
  EXPECT_TRUE(options.Validate().ok());
  options.redis_url = "redis://user:hunter2@host:bad";
  EXPECT_FALSE(absl::StrContains(options.Validate().message(), "hunter2")) << "the password leaked into a message";
  for (const std::string url :
       {"redis://127.0.0.1", "redis://localhost:6380/3", "redis://[::1]:6379", "redis://:pw@10.0.0.1:6379"}) {
    options.redis_url = url;
    EXPECT_TRUE(options.Validate().ok()) << url << ": " << options.Validate();
  }
  options = RedisStoreOptions();
  options.command_timeout_ms = 0;
  EXPECT_TRUE(absl::StrContains(options.Validate().message(), "command_timeout_ms"));
  options = RedisStoreOptions();
  options.connect_timeout_ms = -1;
  EXPECT_TRUE(absl::StrContains(options.Validate().message(), "connect_timeout_ms"));
}

}  // namespace
}  // namespace strata::services
