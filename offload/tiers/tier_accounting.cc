#include "offload/tiers/tier_accounting.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace strata::offload {

const char* TierName(Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return "device";
    case Tier::kHost:
      return "host";
    case Tier::kNvme:
      return "nvme";
  }
  return "?";
}

absl::StatusOr<Tier> ParseTier(const std::string& name) {
  if (name == "device") return Tier::kDevice;
  if (name == "host") return Tier::kHost;
  if (name == "nvme") return Tier::kNvme;
  return absl::InvalidArgumentError(absl::StrCat("tier '", name, "' is not one of device, host, nvme"));
}

absl::Status TierAccountant::Reserve(Tier tier, size_t bytes, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  const int t = static_cast<int>(tier);
  const size_t budget = budgets_.bytes[t];
  const size_t in_use = total_.current[t] + observed_[t];
  if (budget != 0 && in_use + bytes > budget) {
    return absl::ResourceExhaustedError(absl::StrCat(TierName(tier), " tier: ", what, " needs ", bytes, " bytes, but ",
                                                     in_use, " of the ", budget, "-byte budget are in use"));
  }
  total_.current[t] += bytes;
  UpdatePeaksLocked(tier, total_.current[t] + observed_[t]);
  return absl::OkStatus();
}

void TierAccountant::Release(Tier tier, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const int t = static_cast<int>(tier);
  total_.current[t] -= std::min(bytes, total_.current[t]);
  if (!phase_.empty()) phases_[phase_].current[t] = total_.current[t] + observed_[t];
}

void TierAccountant::Observe(Tier tier, size_t current_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const int t = static_cast<int>(tier);
  observed_[t] = current_bytes;
  UpdatePeaksLocked(tier, total_.current[t] + observed_[t]);
}

void TierAccountant::UpdatePeaksLocked(Tier tier, size_t value) {
  const int t = static_cast<int>(tier);
  total_.peak[t] = std::max(total_.peak[t], value);
  if (!phase_.empty()) {
    TierUsage& phase = phases_[phase_];
    phase.current[t] = value;
    phase.peak[t] = std::max(phase.peak[t], value);
  }
}

void TierAccountant::BeginPhase(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = name;
  TierUsage& phase = phases_[name];
  for (int t = 0; t < kNumTiers; ++t) {
    phase.current[t] = total_.current[t] + observed_[t];
    phase.peak[t] = phase.current[t];
  }
}

TierUsage TierAccountant::PhaseUsage(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = phases_.find(name);
  return it == phases_.end() ? TierUsage{} : it->second;
}

TierUsage TierAccountant::Usage() const {
  std::lock_guard<std::mutex> lock(mu_);
  TierUsage usage = total_;
  for (int t = 0; t < kNumTiers; ++t) usage.current[t] += observed_[t];
  return usage;
}

}  // namespace strata::offload
