// Byte budgets and current / peak usage for the three memory tiers, per
// phase (rollout, score, update, ...). The device budget is enforced even when
// the "device" is the CPU, so streaming is exercised on machines without a GPU.
#ifndef STRATA_OFFLOAD_TIERS_TIER_ACCOUNTING_H_
#define STRATA_OFFLOAD_TIERS_TIER_ACCOUNTING_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::offload {

enum class Tier { kDevice = 0, kHost = 1, kNvme = 2 };
constexpr int kNumTiers = 3;

// "device", "host", "nvme".
const char* TierName(Tier tier);
absl::StatusOr<Tier> ParseTier(const std::string& name);

struct TierBudgets {
  // Bytes each tier may hold at once; 0 means unlimited.
  std::array<size_t, kNumTiers> bytes = {0, 0, 0};
  size_t& operator[](Tier t) { return bytes[static_cast<int>(t)]; }
  size_t operator[](Tier t) const { return bytes[static_cast<int>(t)]; }
};

struct TierUsage {
  std::array<size_t, kNumTiers> current = {0, 0, 0};
  std::array<size_t, kNumTiers> peak = {0, 0, 0};
  size_t current_of(Tier t) const { return current[static_cast<int>(t)]; }
  size_t peak_of(Tier t) const { return peak[static_cast<int>(t)]; }
};

// Thread-safe ledger. Reserve fails (RESOURCE_EXHAUSTED naming the tier,
// the request and the budget) instead of letting a tier overflow.
class TierAccountant {
 public:
  explicit TierAccountant(TierBudgets budgets) : budgets_(budgets) {}

  // Records `bytes` more on `tier`; `what` names the tensor for the error.
  absl::Status Reserve(Tier tier, size_t bytes, const std::string& what);
  void Release(Tier tier, size_t bytes);
  // Records usage that happened outside Reserve (e.g. libtorch's own
  // allocations seen by a counting allocator); never fails, but counts
  // towards the peaks, so a budget overrun is visible afterwards.
  void Observe(Tier tier, size_t current_bytes);

  // Starts a phase: its peaks begin at the current usage.
  void BeginPhase(const std::string& name);
  // Peaks of the named phase (zero usage if it never ran).
  TierUsage PhaseUsage(const std::string& name) const;
  // Usage since construction.
  TierUsage Usage() const;
  const TierBudgets& budgets() const { return budgets_; }

 private:
  void UpdatePeaksLocked(Tier tier, size_t value);

  const TierBudgets budgets_;
  mutable std::mutex mu_;
  TierUsage total_;
  std::array<size_t, kNumTiers> observed_ = {0, 0, 0};
  std::string phase_;
  std::map<std::string, TierUsage> phases_;
};

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_TIERS_TIER_ACCOUNTING_H_
