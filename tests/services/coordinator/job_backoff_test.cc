#include "services/coordinator/job_backoff.h"

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "base/file.h"

#include "gtest/gtest.h"

namespace strata::services {
namespace {

using std::chrono::milliseconds;

TEST(JobBackoffTest, DelaysDoubleFromTheFirstUpToTheCap) {
  const BackoffPolicy policy;
  EXPECT_EQ(policy.Delay(1), milliseconds(500));
  EXPECT_EQ(policy.Delay(2), milliseconds(1000));
  EXPECT_EQ(policy.Delay(4), milliseconds(4000));
  EXPECT_EQ(policy.Delay(7), milliseconds(30000));
  EXPECT_EQ(policy.Delay(1000), milliseconds(30000));
}

TEST(JobBackoffTest, AJobFailsAfterLossesInARowWithEveryWorkerAnswering) {
  const BackoffPolicy policy;
  const auto now = std::chrono::steady_clock::now();
  Backoff job;
  for (int loss = 1; loss < policy.max_losses_with_all_answering; ++loss) {
    const LossDecision decision = OnGangLost(policy, job, /*worker_lost=*/false, /*progressed=*/false, now);
    EXPECT_FALSE(decision.fail) << loss;
    EXPECT_EQ(decision.retry_in, policy.Delay(loss));
    EXPECT_EQ(job.until, now + decision.retry_in);
    EXPECT_TRUE(job.Waiting(now));
  }
  EXPECT_TRUE(OnGangLost(policy, job, false, false, now).fail);
}

TEST(JobBackoffTest, ALostWorkerOrAnIterationDoneStartsTheCountAgain) {
  const BackoffPolicy policy;
  const auto now = std::chrono::steady_clock::now();
  Backoff job;
  for (int i = 0; i < 3; ++i) OnGangLost(policy, job, false, false, now);
  EXPECT_EQ(OnGangLost(policy, job, /*worker_lost=*/true, false, now).losses_with_all_answering, 0);
  for (int i = 0; i < 3; ++i) OnGangLost(policy, job, false, false, now);
  // A run that completed an iteration was not the same try: it counts as the first.
  const LossDecision decision = OnGangLost(policy, job, false, /*progressed=*/true, now);
  EXPECT_EQ(decision.losses_with_all_answering, 1);
  EXPECT_FALSE(decision.fail);
  // The job's wait keeps growing across all of them.
  EXPECT_EQ(decision.retry_in, policy.Delay(8));
}

TEST(JobBackoffTest, AWorkerKeptOutWaitsLongerEachTime) {
  const BackoffPolicy policy;
  const auto now = std::chrono::steady_clock::now();
  Backoff worker;
  KeepOut(policy, worker, now);
  EXPECT_EQ(worker.until, now + milliseconds(500));
  KeepOut(policy, worker, now);
  EXPECT_EQ(worker.until, now + milliseconds(1000));
  EXPECT_FALSE(worker.Waiting(now + milliseconds(1000)));
}

// A rank's error that carries ENOSPC is the worker's disk; a host memory
// limit (also RESOURCE_EXHAUSTED) is the job's.
TEST(JobBackoffTest, AFullDiskIsTheWorkersFaultAndAMemoryLimitIsNot) {
  const absl::Status enospc = ErrnoToStatus(ENOSPC, "write /nvme/strata-rank0-x/JOURNAL");
  EXPECT_TRUE(WorkerDiskFull(enospc));
  EXPECT_TRUE(
      WorkerDiskFull(absl::Status(enospc.code(), absl::StrCat("worker 10.0.0.2:50100: RunPhase: ", enospc.message()))));
  EXPECT_FALSE(WorkerDiskFull(ErrnoToStatus(ENOMEM, "allocate 8 GiB")));
  EXPECT_FALSE(WorkerDiskFull(absl::ResourceExhaustedError("memory.host_mib 9000 is above this worker's 4096")));
  // The same words under another code were not ENOSPC from a write.
  EXPECT_FALSE(WorkerDiskFull(absl::InvalidArgumentError(enospc.message())));
}

}  // namespace
}  // namespace strata::services
