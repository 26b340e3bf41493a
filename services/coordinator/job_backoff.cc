#include "services/coordinator/job_backoff.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"

namespace strata::services {

std::chrono::milliseconds BackoffPolicy::Delay(int failures) const {
  const int shift = std::clamp(failures - 1, 0, 20);
  return std::min(first * (int64_t{1} << shift), cap);
}

LossDecision OnGangLost(const BackoffPolicy& policy, Backoff& job, bool worker_lost, bool progressed,
                        std::chrono::steady_clock::time_point now) {
  LossDecision decision;
  decision.retry_in = policy.Delay(++job.failures);
  job.until = now + decision.retry_in;
  job.losses_with_all_answering = worker_lost ? 0 : (progressed ? 0 : job.losses_with_all_answering) + 1;
  decision.losses_with_all_answering = job.losses_with_all_answering;
  decision.fail = job.losses_with_all_answering >= policy.max_losses_with_all_answering;
  return decision;
}

bool WorkerDiskFull(const absl::Status& status) {
  // ErrnoToStatus (base/file.h) makes ENOSPC RESOURCE_EXHAUSTED with its
  // strerror text; host memory limits are RESOURCE_EXHAUSTED too, and
  // fail the job wherever it runs.
  return status.code() == absl::StatusCode::kResourceExhausted &&
         absl::StrContains(status.message(), std::strerror(ENOSPC));
}

void KeepOut(const BackoffPolicy& policy, Backoff& worker, std::chrono::steady_clock::time_point now) {
  worker.until = now + policy.Delay(++worker.failures);
}

}  // namespace strata::services
