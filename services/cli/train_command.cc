#include "services/cli/train_command.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "services/driver/job_runner.h"
#include "services/rank/local_gang.h"

namespace strata::services {

namespace {

// The chat template's strftime_now() date of a local run: the spec's, else
// the first run's, kept in output.dir so that --resume renders what the
// first run rendered.
absl::Status FixTemplateDate(bool resume, policies::JobSpec* spec) {
  if (!spec->data.template_date.empty()) return absl::OkStatus();
  const std::string path = JoinPath(spec->output_dir, "template_date");
  if (resume && IsRegularFile(path)) {
    STRATA_ASSIGN_OR_RETURN(auto date, ReadFileToString(path));
    spec->data.template_date = std::string(absl::StripAsciiWhitespace(date));
    return absl::OkStatus();
  }
  spec->data.template_date = policies::TemplateDateOf(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  std::error_code ec;
  std::filesystem::create_directories(spec->output_dir, ec);
  if (ec)
    return absl::PermissionDeniedError(
        absl::StrCat("output.dir: cannot create ", spec->output_dir, ": ", ec.message()));
  return WriteFileAtomically(path, spec->data.template_date + "\n");
}

}  // namespace

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
  STRATA_RETURN_IF_ERROR(FixTemplateDate(request.resume, &spec));
  const auto start = std::chrono::steady_clock::now();
  JobRankOptions rank;
  rank.metrics_path = request.metrics_path;
  STRATA_ASSIGN_OR_RETURN(auto access, LoadRewardAccess(request.allow_reward_hosts, request.reward_secrets));
  STRATA_ASSIGN_OR_RETURN(auto gang,
                          LocalGang::Create(spec, static_cast<int>(spec.parallel.workers), rank,
                                            std::chrono::milliseconds(request.collective_timeout_ms), access));
  JobRunOptions options;
  options.resume = request.resume;
  options.progress = stderr;
  options.progress_bar = ::isatty(STDERR_FILENO) != 0;
  STRATA_RETURN_IF_ERROR(RunJob(spec, *gang, options));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // With LoRA the output is an adapter, which needs its base to be used.
  const policies::ModelSpec& trained = spec.algorithm == policies::Algorithm::kRewardModel ? spec.reward : spec.actor;
  const std::string what = trained.trains_adapters() ? absl::StrCat("LoRA adapter (PEFT) of ", trained.path, " in ")
                                                     : std::string("model in ");
  return absl::StrFormat("%s job done in %.1f s: %s%s\n", policies::AlgorithmName(spec.algorithm), seconds, what,
                         spec.output_dir);
}

}  // namespace strata::services
