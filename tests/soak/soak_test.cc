// The soak's checks catch what they are for (each against a planted
// fault), and a soak of a few minutes with a fixed seed keeps every
// invariant. It fails on a broken invariant only, never on slowness: the
// drain waits as long as the jobs take.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "gtest/gtest.h"
#include "tests/soak/invariants.h"
#include "tests/soak/soak.h"
#include "tests/testutil/child_process.h"
#include "tests/testutil/redis_server.h"
#include "tests/testutil/testutil.h"

namespace strata::soak {
namespace {

bool Has(const std::vector<Violation>& found, const std::string& invariant) {
  return std::any_of(found.begin(), found.end(), [&](const Violation& v) { return v.invariant == invariant; });
}

std::string Describe(const std::vector<Violation>& found) {
  std::string out;
  for (const Violation& v : found) absl::StrAppend(&out, v.invariant, ": ", v.detail, "\n");
  return out;
}

JobOutcome Job(const std::string& id, const std::string& state, const std::string& error_message = "") {
  JobOutcome job;
  job.id = id;
  job.state = state;
  job.error_message = error_message;
  return job;
}

std::string MetricsLine(int iteration, double loss) {
  return nlohmann::json{{"iteration", iteration}, {"loss", loss}, {"time/iteration_s", 0.1 * iteration}}.dump() + "\n";
}

TEST(SoakInvariantsTest, AMetricsLineWrittenTwiceOrMissingIsCaught) {
  testing::TempDir dir;
  const std::string path = dir.Join("metrics.jsonl");
  testing::WriteTextFile(path, MetricsLine(0, 1) + MetricsLine(1, 0.9) + MetricsLine(2, 0.8));
  EXPECT_TRUE(CheckMetricsOnce(path, 3).empty()) << Describe(CheckMetricsOnce(path, 3));
  EXPECT_TRUE(Has(CheckMetricsOnce(path, 4), "missing iteration"));
  // A resumed run that appended instead of replacing.
  testing::WriteTextFile(path, MetricsLine(0, 1) + MetricsLine(1, 0.9) + MetricsLine(1, 0.9) + MetricsLine(2, 0.8));
  EXPECT_TRUE(Has(CheckMetricsOnce(path, -1), "duplicated iteration")) << Describe(CheckMetricsOnce(path, -1));
  testing::WriteTextFile(path, MetricsLine(0, 1) + MetricsLine(2, 0.8));
  EXPECT_TRUE(Has(CheckMetricsOnce(path, -1), "missing iteration"));
  testing::WriteTextFile(path, MetricsLine(0, 1) + "{not json\n");
  EXPECT_TRUE(Has(CheckMetricsOnce(path, -1), "corrupt metrics"));
}

TEST(SoakInvariantsTest, MetricsThatLeaveTheFaultFreeRunsToleranceAreCaught) {
  testing::TempDir dir;
  const std::string want = dir.Join("want.jsonl"), got = dir.Join("got.jsonl");
  testing::WriteTextFile(want, MetricsLine(0, 1.0) + MetricsLine(1, 0.9));
  // Wall clock differs freely; the loss within a float sum's reordering.
  testing::WriteTextFile(got, MetricsLine(0, 1.0 + 1e-7) + MetricsLine(1, 0.9 * (1 + 1e-3)));
  EXPECT_TRUE(CheckSameMetrics(want, got, "job-1", 4, 2).empty())
      << Describe(CheckSameMetrics(want, got, "job-1", 4, 2));
  testing::WriteTextFile(got, MetricsLine(0, 1.0) + MetricsLine(1, 0.5));
  EXPECT_TRUE(Has(CheckSameMetrics(want, got, "job-1", 4, 2), "metrics diverge"));
  testing::WriteTextFile(got, MetricsLine(0, 1.0));
  EXPECT_TRUE(Has(CheckSameMetrics(want, got, "job-1", 4, 2), "metrics diverge"));
}

TEST(SoakInvariantsTest, AJobWhoseRecordIsGoneIsLostAndItsKeysAreOrphans) {
  std::map<std::string, JobOutcome> listed = {{"a", Job("a", "SUCCEEDED")}, {"b", Job("b", "RUNNING")}};
  listed["b"].progressing = true;
  EXPECT_TRUE(CheckNoJobLostOrStuck({"a", "b"}, listed).empty());
  listed["b"].progressing = false;
  EXPECT_TRUE(Has(CheckNoJobLostOrStuck({"a", "b"}, listed), "stuck job"));
  listed.erase("b");
  EXPECT_TRUE(Has(CheckNoJobLostOrStuck({"a", "b"}, listed), "lost job"));

  const std::vector<std::string> keys = {
      "strata:job:a",     "strata:job:a:events", "strata:jobs",      "strata:jobs:seq", "strata:jobs:state:SUCCEEDED",
      "strata:worker:w0", "strata:workers",      "strata:request:r1"};
  std::map<std::string, std::vector<std::string>> members = {{"SUCCEEDED", {"a"}}};
  EXPECT_TRUE(CheckRedisKeys("strata:", keys, listed, members, {"a"}).empty())
      << Describe(CheckRedisKeys("strata:", keys, listed, members, {"a"}));
  // b's record deleted: what is left of it belongs to no job.
  std::vector<std::string> with_b = keys;
  with_b.push_back("strata:job:b:events");
  members["RUNNING"] = {"b"};
  const auto found = CheckRedisKeys("strata:", with_b, listed, members, {"a", "b"});
  EXPECT_EQ(std::count_if(found.begin(), found.end(),
                          [](const Violation& v) { return v.invariant == "orphan Redis key"; }),
            3)
      << Describe(found);
  // A job in two state sets, or in the wrong one.
  members = {{"SUCCEEDED", {"a"}}, {"FAILED", {"a"}}};
  EXPECT_TRUE(Has(CheckRedisKeys("strata:", keys, listed, members, {}), "state sets disagree"));
}

TEST(SoakInvariantsTest, DirectoriesLeftBehindAreCaught) {
  testing::TempDir dir;
  const std::string nvme = dir.Join("nvme");
  std::filesystem::create_directories(nvme);
  testing::WriteTextFile(JoinPath(nvme, ".soak-ballast"), "");
  EXPECT_TRUE(CheckNvmeDirectoryEmpty(nvme, {".soak-ballast"}).empty());
  std::filesystem::create_directories(JoinPath(nvme, "strata-job-abc123"));
  EXPECT_TRUE(Has(CheckNvmeDirectoryEmpty(nvme, {".soak-ballast"}), "leftover NVMe data"));

  const std::string checkpoints = dir.Join("checkpoints");
  std::filesystem::create_directories(JoinPath(checkpoints, "iter-000002"));
  testing::WriteTextFile(JoinPath(checkpoints, "iter-000002/state.json"),
                         R"({"iteration": 2, "metrics_lines": 2, "run_id": "job-1"})");
  EXPECT_TRUE(CheckCheckpoints(checkpoints, {"job-1"}).empty()) << Describe(CheckCheckpoints(checkpoints, {"job-1"}));
  EXPECT_TRUE(Has(CheckCheckpoints(checkpoints, {"job-2"}), "checkpoint of another run"));
  std::filesystem::create_directories(JoinPath(checkpoints, "iter-000004.tmp-0badf00d"));
  EXPECT_TRUE(Has(CheckCheckpoints(checkpoints, {"job-1"}), "leftover checkpoint"));
  std::filesystem::create_directories(JoinPath(checkpoints, "iter-000006"));
  testing::WriteTextFile(JoinPath(checkpoints, "iter-000006/state.json"),
                         R"({"iteration": 6, "metrics_lines": 7, "run_id": "job-1"})");
  EXPECT_TRUE(Has(CheckCheckpoints(checkpoints, {"job-1"}), "checkpoint out of step"));
}

TEST(SoakInvariantsTest, AProcessOutsideTheStackIsCaught) {
  testing::TempDir dir;
  const std::string marker = dir.Join("marker");
  testing::WriteTextFile(marker, "");
  // `tail -f` waits on the file for ever: a stray that names the soak's directory.
  auto stray = testing::ChildProcess::Spawn({"tail", "-f", marker}, dir.Join("tail.log"), dir.path());
  ASSERT_TRUE(stray.ok()) << stray.status();
  // posix_spawn returns before the child execs: until then its command line
  // is this test's.
  const std::string cmdline = absl::StrCat("/proc/", (*stray)->pid(), "/cmdline");
  for (int i = 0; i < 5000; ++i) {
    auto text = ReadFileToString(cmdline);
    if (text.ok() && text->find(marker) != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // waits for another process's exec
  }
  EXPECT_TRUE(Has(CheckNoStrayProcesses(dir.path(), {}), "stray process"));
  EXPECT_TRUE(CheckNoStrayProcesses(dir.path(), {(*stray)->pid()}).empty());
  (*stray)->Kill(SIGKILL);
  EXPECT_TRUE(CheckNoStrayProcesses(dir.path(), {}).empty());
}

TEST(SoakInvariantsTest, AFailureMustSayWhy) {
  EXPECT_TRUE(Has(CheckFailedSaysWhy(Job("j", "FAILED", "INTERNAL")), "failure without a reason"));
  EXPECT_TRUE(CheckFailedSaysWhy(Job("j", "FAILED", "memory.nvme_dir /x: no space left on device (ENOSPC)")).empty());
}

// The soak itself: every fault kind this machine allows, a stream of jobs
// of every algorithm, then the invariants; then the planted faults, which
// the same checks must find.
TEST(SoakTest, AFewMinutesOfRandomFaultsLoseNothing) {
  if (!testing::RedisServer::Available()) GTEST_SKIP() << "needs redis-server (Debian package redis-server)";
  testing::TempDir dir;
  SoakOptions options{.dir = dir.path(), .duration = std::chrono::seconds(120), .seed = 7, .plant_faults = true};
  auto report = RunSoak(options);
  ASSERT_TRUE(report.ok()) << report.status();
  std::cout << report->Summary();
  ::testing::Test::RecordProperty("soak", report->ToJson());
  EXPECT_TRUE(report->violations.empty()) << report->ToJson();
  EXPECT_GT(report->succeeded, 0) << report->ToJson();
  // Each kind had its turn (the first faults go through them all).
  for (const std::string kind : {"kill -9 worker", "kill -9 coordinator", "kill -9 redis", "pause worker"}) {
    EXPECT_GE(report->faults[kind].injected, 1) << kind;
  }
  EXPECT_TRUE(Has(report->planted, "lost job")) << Describe(report->planted);
  EXPECT_TRUE(Has(report->planted, "duplicated iteration")) << Describe(report->planted);
  EXPECT_TRUE(Has(report->planted, "leftover NVMe data")) << Describe(report->planted);
}

}  // namespace
}  // namespace strata::soak
