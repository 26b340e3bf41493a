// Runs one job's loop against a WorkerGroup: data, batches, the algorithm's
// iterations, evaluation, metrics lines, checkpoints and resume. Used by
// `strata train` (in-process workers) and by the coordinator.
#ifndef STRATA_SERVICES_RUNTIME_JOB_RUNNER_H_
#define STRATA_SERVICES_RUNTIME_JOB_RUNNER_H_

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "policies/job/job_spec.h"
#include "policies/tokenizer/tokenizer.h"
#include "policies/rl/worker_group.h"

namespace strata::services {

struct JobRunOptions {
  // One JSON object per iteration is appended here; "" = <output.dir>/metrics.jsonl.
  std::string metrics_path;
  // Continue from the latest checkpoint under checkpoint.dir, if any.
  bool resume = false;
  // Names this run in its checkpoints (the service uses the job id). When
  // set, resume continues only this run's checkpoints; finding another
  // run's is FAILED_PRECONDITION naming both, so a new job never silently
  // continues an old one that wrote to the same directory.
  std::string run_id;
  // A checkpoint this run is known to have written (the job store's record)
  // is accepted even without a run_id: written before checkpoints had one.
  std::string own_checkpoint;
  // Draw a progress bar with \r (a terminal); otherwise print plain lines.
  bool progress_bar = false;
  // Where progress goes; null for none.
  std::FILE* progress = nullptr;
  // Called with each metrics line after it is written.
  std::function<void(const nlohmann::json&)> on_metrics;
  // Called after a checkpoint is complete (iteration it resumes at, directory).
  std::function<void(int64_t, const std::string&)> on_checkpoint;
  // Polled between iterations; true stops the job with CANCELLED.
  std::function<bool()> cancelled;
};

// Runs `spec` to completion: `spec.train.iterations` iterations, checkpoints
// every `checkpoint.every`, the trained model written to `output.dir`.
absl::Status RunJob(const policies::JobSpec& spec, policies::WorkerGroup& workers, const policies::Tokenizer& tokenizer,
                    const JobRunOptions& options);

// The newest complete checkpoint under `dir` ("" if none) and its iteration.
std::pair<std::string, int64_t> LatestCheckpoint(const std::string& dir);

}  // namespace strata::services

#endif  // STRATA_SERVICES_RUNTIME_JOB_RUNNER_H_
