#include "services/cli/train_command.h"

#include <unistd.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "services/driver/job_runner.h"
#include "services/rank/local_gang.h"

namespace strata::services {

absl::StatusOr<std::string> RunTrain(const TrainRequest& request) {
  std::vector<std::string> overrides = request.overrides;
  if (!request.out_dir.empty()) overrides.push_back("output.dir=" + request.out_dir);
  if (request.workers > 0) overrides.push_back(absl::StrCat("parallel.workers=", request.workers));
  STRATA_ASSIGN_OR_RETURN(auto spec, policies::LoadJobSpec(request.spec_path, overrides));
  if (!request.resume) {
    // A fresh run's checkpoints would sit beside the earlier run's, and a
    // later --resume would take the newest of either run's.
    STRATA_ASSIGN_OR_RETURN(auto earlier, LatestCheckpoint(spec.checkpoint.dir));
    if (!earlier.first.empty() && !request.overwrite) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint.dir ", spec.checkpoint.dir, " holds an earlier run's checkpoints (newest: ", earlier.first,
          "): pass --resume to continue that run, or --overwrite to start over and ", "remove them"));
    }
    if (!earlier.first.empty()) STRATA_RETURN_IF_ERROR(RemoveCheckpoints(spec.checkpoint.dir));
  }
  const auto start = std::chrono::steady_clock::now();
  JobRankOptions rank;
  rank.metrics_path = request.metrics_path;
  STRATA_ASSIGN_OR_RETURN(auto gang, LocalGang::Create(spec, static_cast<int>(spec.parallel.workers), rank,
                                                       std::chrono::milliseconds(request.collective_timeout_ms)));
  JobRunOptions options;
  options.resume = request.resume;
  options.progress = stderr;
  options.progress_bar = ::isatty(STDERR_FILENO) != 0;
  STRATA_RETURN_IF_ERROR(RunJob(spec, *gang, options));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return absl::StrFormat("%s job done in %.1f s: model in %s\n", policies::AlgorithmName(spec.algorithm), seconds,
                         spec.output_dir);
}

}  // namespace strata::services
