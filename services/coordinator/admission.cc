#include "services/coordinator/admission.h"

#include <algorithm>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/status_macros.h"
#include "policies/job/memory_plan.h"

namespace strata::services {
namespace v1 = strata::v1;

bool MayUseJobs(const Caller& caller) { return caller.admin || !caller.tenant.empty(); }

absl::StatusOr<JobRecord> VisibleJob(JobStore& store, const Caller& caller, const std::string& id) {
  if (!MayUseJobs(caller)) return absl::PermissionDeniedError("a worker credential cannot read jobs");
  STRATA_ASSIGN_OR_RETURN(auto job, store.Get(id));
  if (!caller.admin && job.tenant != caller.tenant) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  return job;
}

absl::StatusOr<AdmittedJob> AdmitJob(JobStore& store, JobSpecs& specs, const Caller& caller,
                                     const v1::SubmitJobRequest& request, const WorkerOffer& offer,
                                     const AdmissionLimits& admission, int64_t submitted_unix_ms) {
  if (!MayUseJobs(caller)) return absl::PermissionDeniedError("a worker credential cannot submit jobs");
  std::vector<std::string> overrides(request.overrides().begin(), request.overrides().end());
  STRATA_ASSIGN_OR_RETURN(auto yaml, policies::ApplyOverrides(request.spec_yaml(), overrides, "spec"));
  STRATA_ASSIGN_OR_RETURN(policies::JobSpec spec, policies::ParseJobSpec(yaml, {}, "spec"));
  if (spec.parallel.workers > 1) {
    STRATA_ASSIGN_OR_RETURN(auto registered, store.ListWorkers());
    if (static_cast<int64_t>(registered.size()) < spec.parallel.workers) {
      return absl::ResourceExhaustedError(absl::StrCat("spec key 'parallel.workers' asks for ", spec.parallel.workers,
                                                       " workers; ", registered.size(), " are registered"));
    }
  }
  // Admission against what the workers reported at registration.
  std::map<std::string, int64_t> largest = offer.largest_bytes;
  policies::JobLimits limits;
  limits.max_rows = admission.max_rollout_rows;
  limits.max_tokens = admission.max_rollout_tokens;
  limits.max_host_mib = largest["host"] >> 20;
  limits.max_device_mib = largest["device"] >> 20;
  STRATA_RETURN_IF_ERROR(policies::CheckJobLimits(spec, limits, "workers accept"));
  // A path no worker serves would fail the job only when a worker starts it
  // (each worker still checks its own roots then): refuse it now.
  std::optional<absl::Status> refused;
  for (const WorkerOffer::Paths& worker : offer.paths) {
    if (worker.roots.empty()) {
      refused = absl::OkStatus();  // a worker that did not say what it serves
      break;
    }
    // Lexical: the workers' files may be out of the coordinator's reach.
    absl::Status s = policies::CheckPathsWithin(spec, worker.directory, worker.roots, /*lexical=*/true);
    if (s.ok() || !refused.has_value()) refused = std::move(s);
    if (refused->ok()) break;
  }
  if (refused.has_value() && !refused->ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat(absl::StrReplaceAll(refused->message(), {{"this worker serves", "a worker serves"}}),
                     offer.paths.size() > 1 ? absl::StrCat(", and none of the other ", offer.paths.size() - 1,
                                                           " registered workers serves it")
                                            : ""));
  }
  // Paths resolve on the workers, which report a missing model or data file
  // when they start the job (naming the spec key); the coordinator opens no
  // job file. What the memory planner predicts at the job's peak (model
  // states, activations, KV cache, staging: `strata plan`) must fit too.
  // That needs the models' config.json and is skipped where the coordinator
  // cannot see them.
  const std::string& worker_dir = offer.directory;
  policies::JobSpec resolved = worker_dir.empty() ? spec : policies::ResolvePaths(spec, worker_dir);
  // A worker gives a spec without memory.device_mib its own device budget,
  // and its rollout decodes what fits it (RolloutConcurrency): price that.
  if (resolved.memory.device_mib == 0) resolved.memory.device_mib = largest["device"] >> 20;
  if (!worker_dir.empty()) {
    auto models = policies::JobModels(resolved);
    if (models.ok()) {
      const policies::JobPrediction plan = policies::PredictJob(resolved, *models, policies::BuiltInHardwareFigures(),
                                                                spec.parallel.workers);
      // Host: the process's predicted peak RSS (the arena, mapped model
      // files, and on a CPU device the device tier too), what the OOM
      // killer would see.
      const std::pair<const char*, int64_t> needs[] = {{"host", plan.process_rss_bytes},
                                                       {"device", plan.peak[0]},
                                                       {"nvme", plan.peak[2]}};
      for (const auto& [tier, bytes] : needs) {
        auto offer = largest.find(tier);
        if (offer != largest.end() && offer->second > 0 && bytes > offer->second) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "spec key 'models': at its peak the job needs ", bytes >> 20, " MiB of ", tier,
              std::string(tier) == "nvme" ? " space" : " memory",
              " per worker (strata plan: model states, activations, KV cache, staging), but the largest worker "
              "offers ",
              offer->second >> 20, " MiB; `strata plan SPEC --fit ...` finds a placement that fits"));
        }
      }
    }
  }

  JobRecord job;
  job.algorithm = policies::AlgorithmName(spec.algorithm);
  job.name = spec.name;
  job.spec_yaml = yaml;
  job.output_dir = spec.output_dir;
  job.iterations = spec.train.iterations;
  job.request_id = request.request_id();
  job.tenant = caller.tenant;
  if (!request.continue_job_id().empty()) {
    // A job that ended before its end (a failure, a cancel) continues in a
    // new job from its newest checkpoint, which the new job may resume as
    // its own (with those of the jobs the ended one continued). The store
    // checks the ended state and claims the continuation (once) atomically
    // with the creation.
    STRATA_ASSIGN_OR_RETURN(auto ended, VisibleJob(store, caller, request.continue_job_id()));
    if (ended.tenant != caller.tenant) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", ended.id, " belongs to tenant '", ended.tenant, "'; only its tenant can continue it"));
    }
    // It writes where the ended job wrote: its metrics file goes on from
    // the checkpoint's line, and its checkpoints join the ended job's.
    STRATA_ASSIGN_OR_RETURN(auto ended_spec, specs.Of(ended));
    for (const auto& [key, now, then] :
         {std::tuple<const char*, std::string, std::string>{"output.dir", spec.output_dir, ended_spec->output_dir},
          {"checkpoint.dir", spec.checkpoint.dir, ended_spec->checkpoint.dir}}) {
      if (now != then) {
        return absl::InvalidArgumentError(absl::StrCat("spec key '", key, "' is '", now, "' where job ", ended.id,
                                                       " had '", then,
                                                       "': a job continues where the job it "
                                                       "continues wrote"));
      }
    }
    job.resumable_run_ids = ended.resumable_run_ids;
    job.resumable_run_ids.insert(job.resumable_run_ids.begin(), ended.id);
    job.checkpoint_dir = ended.checkpoint_dir;
    job.checkpoint_iteration = ended.checkpoint_iteration;
    job.iteration = ended.checkpoint_iteration;
  }
  // The chat template's strftime_now() is fixed when the job is submitted
  // (a continuation keeps the date of the job it continues), so that every
  // run of the job renders the same prompts.
  if (spec.data.template_date.empty()) {
    spec.data.template_date = policies::TemplateDateOf(submitted_unix_ms);
    if (!request.continue_job_id().empty()) {
      STRATA_ASSIGN_OR_RETURN(auto ended, VisibleJob(store, caller, request.continue_job_id()));
      STRATA_ASSIGN_OR_RETURN(auto ended_spec, specs.Of(ended));
      if (!ended_spec->data.template_date.empty()) spec.data.template_date = ended_spec->data.template_date;
    }
    STRATA_ASSIGN_OR_RETURN(
        job.spec_yaml,
        policies::ApplyOverrides(job.spec_yaml, {absl::StrCat("data.template_date=\"", spec.data.template_date, "\"")},
                                 "spec"));
  }
  return AdmittedJob{std::move(job), std::make_shared<const policies::JobSpec>(std::move(spec))};
}

}  // namespace strata::services
