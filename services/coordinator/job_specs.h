// The parsed specs of the jobs a coordinator handles: each spec is parsed
// once per process (at admission, or at first use for a job a previous
// coordinator admitted), and the scheduler and the job loop share it.
#ifndef STRATA_SERVICES_COORDINATOR_JOB_SPECS_H_
#define STRATA_SERVICES_COORDINATOR_JOB_SPECS_H_

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "policies/job/job_spec.h"
#include "services/store/job_store.h"

namespace strata::services {

class JobSpecs {
 public:
  // The job's spec. An ended job's is parsed but not kept: it never runs again.
  absl::StatusOr<std::shared_ptr<const policies::JobSpec>> Of(const JobRecord& job);
  void Remember(const std::string& job_id, std::shared_ptr<const policies::JobSpec> spec);
  // Once the job has ended here.
  void Forget(const std::string& job_id);
  // Forgets every job but `live` (the queued and running ones): a spec a
  // scheduler pass cached from a copy of a job cancelled meanwhile goes too.
  void KeepOnly(const std::set<std::string>& live);

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const policies::JobSpec>> specs_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_COORDINATOR_JOB_SPECS_H_
