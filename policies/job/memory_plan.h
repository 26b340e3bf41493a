// Model-state memory of a job by tier: the weights, gradients and Adam
// states of every model under its placement (activations excluded; they
// depend on batch and sequence and are measured per phase instead). This
// answers "how much memory do PPO and ReMax need" before anything loads.
#ifndef STRATA_POLICIES_JOB_MEMORY_PLAN_H_
#define STRATA_POLICIES_JOB_MEMORY_PLAN_H_

#include <array>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/job/job_spec.h"
#include "policies/model/llama_config.h"

namespace strata::policies {

struct ModelFootprint {
  std::string role;          // actor, reference, reward, critic
  int64_t parameters = 0;
  bool trainable = false;
  // Bytes per tier (device, host, nvme) for each kind of state.
  std::array<int64_t, 3> weights{}, gradients{}, optimizer{};
  int64_t total(int tier) const { return weights[tier] + gradients[tier] + optimizer[tier]; }
};

struct MemoryPlan {
  std::vector<ModelFootprint> models;
  std::array<int64_t, 3> total{};  // per tier
};

// Plans `spec`'s models. Each model's config.json is read from its `path`
// (or its `init` file); a rule reward has no model. Streamed weights count
// their home tier in full and (prefetch + 1) layers on the device; gradients
// and Adam states are fp32 (4 and 12 bytes per parameter).
absl::StatusOr<MemoryPlan> PlanModelStates(const JobSpec& spec);

// The same for one model, given its config.
ModelFootprint PlanModel(const std::string& role, const LlamaConfig& config, const ModelSpec& model, bool trainable,
                         bool scalar_head);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_JOB_MEMORY_PLAN_H_
