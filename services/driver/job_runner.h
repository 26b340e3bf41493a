// Drives one job: which phase runs next on the job's gang of ranks, the
// scalars carried between iterations (PPO's KL coefficient), evaluation and
// checkpoint cadence, cancellation between phases, progress. The driver
// opens no job file and holds no tensor: data, tokenizer, checkpoints and
// the metrics file belong to the ranks (JobRank). Used by `strata train`
// (a LocalGang) and by the coordinator (a gang of remote workers).
#ifndef STRATA_SERVICES_DRIVER_JOB_RUNNER_H_
#define STRATA_SERVICES_DRIVER_JOB_RUNNER_H_

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "policies/job/job_spec.h"
#include "services/phase/phase.h"

namespace strata::services {

// The ranks of one job, as the driver sees them.
class Gang {
 public:
  virtual ~Gang() = default;
  // Sends `request` to every rank and waits for all of them: MergeReplies of
  // their replies, or the error that ended the phase (a rank's own error is
  // preferred to the timeouts it caused on the others).
  virtual absl::StatusOr<PhaseReply> Run(const PhaseRequest& request) = 0;
};

// Of several ranks' errors (in rank order), the one that explains the
// others: a rank's own failure rather than the DEADLINE_EXCEEDED /
// UNAVAILABLE it caused elsewhere; else the first of those. Ranks that
// share a process (`strata train --workers N`) cannot have died, so there
// a closed connection (UNAVAILABLE) follows a peer's deadline, which is
// the cause.
absl::Status FirstCause(const std::vector<absl::Status>& statuses, bool ranks_share_a_process = false);

struct JobRunOptions {
  // Continue from the newest checkpoint this run may continue, if any.
  bool resume = false;
  // A checkpoint the job store knows this run wrote (see JobRank's
  // find_checkpoint).
  std::string own_checkpoint;
  // Draw a progress bar with \r (a terminal); otherwise print plain lines.
  bool progress_bar = false;
  // Where progress goes; null for none.
  std::FILE* progress = nullptr;
  // Called with each metrics line after the ranks recorded it.
  std::function<void(const nlohmann::json&)> on_metrics;
  // Called after a checkpoint is complete on every rank (the iteration it
  // resumes at, its directory on the ranks).
  std::function<void(int64_t, const std::string&)> on_checkpoint;
  // Polled between phases; true stops the job with CANCELLED.
  std::function<bool()> cancelled;
};

// Runs `spec` to completion on `gang`: `spec.train.iterations` iterations,
// checkpoints every `checkpoint.every`, the trained model written to
// `output.dir` by rank 0.
absl::Status RunJob(const policies::JobSpec& spec, Gang& gang, const JobRunOptions& options);

}  // namespace strata::services

#endif  // STRATA_SERVICES_DRIVER_JOB_RUNNER_H_
