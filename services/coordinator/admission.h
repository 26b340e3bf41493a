// Who may see which job, and what a submission must pass before it is
// stored: its spec parses, fits what the workers accept and what the
// largest worker offers, and a continuation writes where the job it
// continues wrote. Admission reads the store but writes nothing.
#ifndef STRATA_SERVICES_COORDINATOR_ADMISSION_H_
#define STRATA_SERVICES_COORDINATOR_ADMISSION_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "policies/job/job_spec.h"
#include "services/coordinator/job_specs.h"
#include "services/rpc/auth.h"
#include "services/store/job_store.h"
#include "strata/v1/coordinator.pb.h"

namespace strata::services {

// Tenants and admins use jobs; a worker credential only registers and heartbeats.
bool MayUseJobs(const Caller& caller);

// The job if `caller` may see it; otherwise the NOT_FOUND a missing job
// gets (another tenant's job ids are not confirmed to exist).
absl::StatusOr<JobRecord> VisibleJob(JobStore& store, const Caller& caller, const std::string& id);

// What the workers say of themselves, as admission needs it.
struct WorkerOffer {
  // The largest figure any registered worker reported, by tier ("host",
  // "device", "nvme"), since any of them may be picked.
  std::map<std::string, int64_t> largest_bytes;
  // Where a worker resolves relative spec paths; "" when none said.
  std::string directory;
  // Each registered worker's working directory and the directories it
  // serves (none: it did not say, and admission does not check paths).
  struct Paths {
    std::string directory;
    std::vector<std::string> roots;
  };
  std::vector<Paths> paths;
};

struct AdmissionLimits {
  int64_t max_rollout_rows = 0;  // CoordinatorOptions' rollout limits
  int64_t max_rollout_tokens = 0;
};

struct AdmittedJob {
  JobRecord record;  // to create; the store assigns its id
  std::shared_ptr<const policies::JobSpec> spec;
};

// Parses and checks a submission. INVALID_ARGUMENT naming the spec key,
// RESOURCE_EXHAUSTED when no worker (or too few) can take it,
// PERMISSION_DENIED naming the key of a path no worker serves,
// FAILED_PRECONDITION for another tenant's continuation. A spec without
// data.template_date gets the submission time (`submitted_unix_ms`).
absl::StatusOr<AdmittedJob> AdmitJob(JobStore& store, JobSpecs& specs, const Caller& caller,
                                     const strata::v1::SubmitJobRequest& request, const WorkerOffer& offer,
                                     const AdmissionLimits& limits, int64_t submitted_unix_ms);

}  // namespace strata::services

#endif  // STRATA_SERVICES_COORDINATOR_ADMISSION_H_
