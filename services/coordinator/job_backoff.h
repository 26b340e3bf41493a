// What the coordinator does after a job's gang was lost, decided without
// I/O: how long the job and the workers that stopped answering wait before
// they are scheduled again (both back off exponentially, so a dead worker
// cannot drive a requeue storm while its registration lives on), and when
// retrying is pointless and the job fails instead.
#ifndef STRATA_SERVICES_COORDINATOR_JOB_BACKOFF_H_
#define STRATA_SERVICES_COORDINATOR_JOB_BACKOFF_H_

#include <chrono>

#include "absl/status/status.h"

namespace strata::services {

struct BackoffPolicy {
  // The wait after the first failure; it doubles with each failure in a
  // row, up to `cap`.
  std::chrono::milliseconds first{500};
  std::chrono::milliseconds cap{30000};
  // Gang losses in a row, before an iteration and with every worker
  // answering, after which a job fails instead of going back to the queue:
  // about 8 s of retries at the default 0.5, 1, 2, 4 s.
  int max_losses_with_all_answering = 5;

  // The wait after `failures` failures in a row (1 for the first).
  std::chrono::milliseconds Delay(int failures) const;
};

// A job's or a worker's failures in a row and when its wait ends.
struct Backoff {
  int failures = 0;
  std::chrono::steady_clock::time_point until;
  // Jobs: runs lost in a row, without an iteration done, while every
  // worker of the gang still answered (no worker was lost).
  int losses_with_all_answering = 0;

  bool Waiting(std::chrono::steady_clock::time_point now) const { return until > now; }
};

struct LossDecision {
  // Every worker answered, yet the gang failed again and again before an
  // iteration: another try is the same try (ranks that cannot reach rank
  // 0's rendezvous address, a port blocked between them).
  bool fail = false;
  int losses_with_all_answering = 0;
  std::chrono::milliseconds retry_in{0};  // when the job is requeued
};

// Records a lost gang on the job's backoff: `worker_lost` when a worker of
// the gang no longer answers, `progressed` when the run completed an
// iteration.
LossDecision OnGangLost(const BackoffPolicy& policy, Backoff& job, bool worker_lost, bool progressed,
                        std::chrono::steady_clock::time_point now);
// A rank failed because its worker's disk is full (ENOSPC in its NVMe
// directory): the machine's fault, retried elsewhere like a lost worker.
bool WorkerDiskFull(const absl::Status& status);
// Keeps a worker that stopped answering out of gangs for its next wait.
void KeepOut(const BackoffPolicy& policy, Backoff& worker, std::chrono::steady_clock::time_point now);

}  // namespace strata::services

#endif  // STRATA_SERVICES_COORDINATOR_JOB_BACKOFF_H_
