#include "services/coordinator/job_specs.h"

#include "absl/strings/str_cat.h"

namespace strata::services {

absl::StatusOr<std::shared_ptr<const policies::JobSpec>> JobSpecs::Of(const JobRecord& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto known = specs_.find(job.id); known != specs_.end()) return known->second;
  }
  auto parsed = policies::ParseJobSpec(job.spec_yaml, {}, absl::StrCat("job ", job.id));
  if (!parsed.ok()) return parsed.status();
  auto spec = std::make_shared<const policies::JobSpec>(std::move(*parsed));
  if (!IsTerminal(job.state)) Remember(job.id, spec);
  return spec;
}

void JobSpecs::Remember(const std::string& job_id, std::shared_ptr<const policies::JobSpec> spec) {
  std::lock_guard<std::mutex> lock(mu_);
  specs_[job_id] = std::move(spec);
}

void JobSpecs::Forget(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  specs_.erase(job_id);
}

void JobSpecs::KeepOnly(const std::set<std::string>& live) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(specs_, [&](const auto& entry) { return !live.count(entry.first); });
}

}  // namespace strata::services
