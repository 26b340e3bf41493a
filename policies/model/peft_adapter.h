// LoRA adapters in PEFT's on-disk layout, so that PEFT (and anything built
// on it: vLLM, TRL, OpenRLHF) loads what strata trains and strata loads
// what they wrote:
//   DIR/adapter_config.json        peft_type LORA, r, lora_alpha, ...
//   DIR/adapter_model.safetensors  base_model.model.model.layers.<i>.<sub>.<proj>.lora_{A,B}.weight,
//                                  and base_model.model.score.weight for a
//                                  scalar head (modules_to_save)
#ifndef STRATA_POLICIES_MODEL_PEFT_ADAPTER_H_
#define STRATA_POLICIES_MODEL_PEFT_ADAPTER_H_

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "policies/config/llama_config.h"
#include "policies/config/lora_config.h"
#include "policies/model/llama.h"
#include "policies/model/lora.h"

namespace strata::policies {

inline constexpr char kPeftConfigFile[] = "adapter_config.json";
inline constexpr char kPeftWeightsFile[] = "adapter_model.safetensors";

// True when `dir` holds an adapter_config.json.
bool IsPeftAdapterDir(const std::string& dir);

// Writes `adapters` (and `score`, a scalar head's weight, when defined) to
// `dir` (created if missing) in PEFT's layout; `base_model` goes to
// base_model_name_or_path. The weights are written before the config, so a
// directory with a config has its weights.
absl::Status SavePeftAdapter(const std::string& dir, LoraAdapters& adapters, LlamaHead head, const at::Tensor& score,
                             const std::string& base_model);

// The config of a PEFT LoRA directory. INVALID_ARGUMENT naming the file and
// the field for a setting strata does not implement (use_dora, rank_pattern,
// alpha_pattern, layers_to_transform, ...) or a malformed value.
absl::StatusOr<LoraConfig> ReadPeftConfig(const std::string& dir);

struct PeftAdapter {
  LoraConfig config;
  std::unique_ptr<LoraAdapters> adapters;
  at::Tensor score;  // a scalar head's weight, when the adapter saved one
};

// Loads a PEFT LoRA directory for a base model of `model`'s shape, in
// `dtype` on `device`. INVALID_ARGUMENT naming the file and tensor for a
// missing tensor, a shape that does not match the base, or a tensor strata
// would not use.
absl::StatusOr<PeftAdapter> LoadPeftAdapter(const std::string& dir, const LlamaConfig& model, LlamaHead head,
                                            at::ScalarType dtype, at::Device device);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_MODEL_PEFT_ADAPTER_H_
