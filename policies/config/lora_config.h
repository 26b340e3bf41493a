// Low-rank adapters (LoRA, Hu et al. 2021) as a job describes them, in
// PEFT's terms. Kept free of torch: the job spec and the planner name it.
#ifndef STRATA_POLICIES_CONFIG_LORA_CONFIG_H_
#define STRATA_POLICIES_CONFIG_LORA_CONFIG_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "policies/config/llama_config.h"

namespace strata::policies {

// The projections of a Llama-family decoder layer that can carry an
// adapter, in PEFT's names and in the order strata stores them.
enum class LoraModule { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int kLoraModuleCount = 7;
// "q_proj", ..., "down_proj"; and the sublayer that holds it ("self_attn",
// "mlp"), for HF and PEFT tensor names.
const char* LoraModuleName(LoraModule module);
const char* LoraModuleParent(LoraModule module);

// The [out, in] shape of `module`'s weight in a layer of `model`.
std::pair<int64_t, int64_t> LoraModuleShape(const LlamaConfig& model, LoraModule module);

struct LoraConfig {
  // The adapters' rank r; 0: no adapters (every parameter trains).
  int64_t rank = 0;
  // The update is scaled by alpha / r (alpha / sqrt(r) with use_rslora).
  // Default: 2 x rank.
  double alpha = 0;
  // Dropout on each adapter's input while training, in [0, 1). Masks are
  // keyed by (step, layer, module), so the layer-wise recomputation replays
  // the forward pass's masks exactly. Rollouts and scoring run without it.
  double dropout = 0;
  // PEFT's module names, or "all-linear" (every projection: the default).
  std::vector<std::string> target_modules = {"all-linear"};
  // Rank-stabilised scaling (Kalajdzievski 2023): alpha / sqrt(r).
  bool use_rslora = false;

  bool enabled() const { return rank > 0; }
  double scaling() const;
  // The targeted modules, "all-linear" expanded, in LoraModule order;
  // INVALID_ARGUMENT naming a name no Llama-family layer has.
  absl::StatusOr<std::vector<LoraModule>> Modules() const;
  // The elements of each adapter tensor over all of `model`'s layers: per
  // layer and targeted projection, A's rank x in and B's out x rank (none
  // when disabled or invalid).
  std::vector<int64_t> TensorElements(const LlamaConfig& model) const;
  // Their sum: the adapters' parameters.
  int64_t Parameters(const LlamaConfig& model) const;
  // INVALID_ARGUMENT naming the field, quoted as '`key`.field'.
  absl::Status Validate(const std::string& key = "lora") const;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_CONFIG_LORA_CONFIG_H_
