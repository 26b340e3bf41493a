// Low-rank adapters on a Llama-family model's projections: each targeted
// W [out, in] gains A [r, in] and B [out, r], and computes
//   y = x W^T + b + s * dropout(x) A^T B^T,   s = alpha / r (or / sqrt(r)).
// The base weights stay frozen wherever they live (resident or streamed);
// the adapters are small and stay on the compute device. A model with
// adapters off is its own base: the reference of a LoRA job.
#ifndef STRATA_POLICIES_MODEL_LORA_H_
#define STRATA_POLICIES_MODEL_LORA_H_

#include <ATen/ATen.h>

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/config/llama_config.h"
#include "policies/config/lora_config.h"

namespace strata::policies {

struct LlamaLayerWeights;

// One projection's adapter; undefined tensors for a module not targeted.
struct LoraPair {
  at::Tensor a;  // [r, in]
  at::Tensor b;  // [out, r]
};

// The adapters of one decoder layer, indexed by LoraModule.
struct LoraLayer {
  std::array<LoraPair, kLoraModuleCount> modules;
  LoraPair& at(LoraModule m) { return modules[static_cast<size_t>(m)]; }
  const LoraPair& at(LoraModule m) const { return modules[static_cast<size_t>(m)]; }
};

// How one layer's forward applies its adapters.
struct LoraApply {
  const LoraLayer* layer = nullptr;
  double scaling = 1.0;
  // Training passes only: the dropout probability, and the key its masks
  // derive from with the layer and module, so that a recomputation of the
  // layer draws the masks its forward pass drew.
  double dropout = 0.0;
  uint64_t dropout_key = 0;
  int64_t layer_index = 0;
  // A starting adapter under this one, applied too (never dropped out);
  // null: none.
  const LoraApply* frozen = nullptr;
};

// The dropout key of a training pass: a function of the adapters' seed, the
// optimizer step and the micro-batch within it, so that a resumed run draws
// the masks an uninterrupted one would.
uint64_t LoraDropoutKey(uint64_t seed, int64_t step, int64_t micro_batch);

// The projection of `x` through `weight` (and `bias`, when defined) plus
// `module`'s adapter when `lora` has one.
at::Tensor LoraLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const LoraApply* lora,
                      LoraModule module);

class LoraAdapters {
 public:
  // Fresh adapters as PEFT makes them: A uniform in +-1/sqrt(in) (Kaiming
  // uniform with a = sqrt(5)), B zero, so the adapted model starts equal to
  // its base. Reproducible for a seed. INVALID_ARGUMENT naming the field
  // for a config that does not validate.
  static absl::StatusOr<std::unique_ptr<LoraAdapters>> Init(const LoraConfig& lora, const LlamaConfig& model,
                                                            at::ScalarType dtype, at::Device device, uint64_t seed);
  // Zero adapters of the right shapes, to be filled (a PEFT load).
  static absl::StatusOr<std::unique_ptr<LoraAdapters>> Zeros(const LoraConfig& lora, const LlamaConfig& model,
                                                             at::ScalarType dtype, at::Device device);

  const LoraConfig& config() const { return config_; }
  const std::vector<LoraModule>& modules() const { return modules_; }
  double scaling() const { return config_.scaling(); }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  const LoraLayer& layer(int64_t l) const { return layers_.at(static_cast<size_t>(l)); }
  // Every adapter tensor of layer `l` with its name relative to the model
  // ("model.layers.<l>.self_attn.q_proj.lora_A.weight": PEFT's names less
  // its "base_model.model." prefix), A before B, in LoraModule order.
  std::vector<std::pair<std::string, at::Tensor*>> NamedInLayer(int64_t l);
  // Every layer's, in layer order.
  std::vector<std::pair<std::string, at::Tensor*>> Named();
  int64_t num_parameters() const;

  // The apply of layer `l` for inference (no dropout).
  LoraApply ApplyFor(int64_t l) const { return {&layers_.at(static_cast<size_t>(l)), scaling(), 0.0, 0, l}; }
  // One adapter computing what `below` and `above` compute together:
  // rank r1 + r2 over the union of their modules, A stacked, B scaled into
  // [s1 B1, s2 B2] with alpha = rank (scale 1). Exact, so a stack of a
  // starting adapter and the one trained over it is written as one PEFT
  // adapter.
  static std::unique_ptr<LoraAdapters> Stacked(const LoraAdapters& below, const LoraAdapters& above);

  // Replaces each targeted projection of `w` (layer `l`'s base) with
  // W + s B A, computed in fp32 and rounded once; new tensors, so the base
  // `w` was copied from is untouched.
  void MergeInto(int64_t l, LlamaLayerWeights& w) const;

 private:
  LoraAdapters(LoraConfig config, std::vector<LoraModule> modules) : config_(std::move(config)), modules_(modules) {}

  LoraConfig config_;
  std::vector<LoraModule> modules_;
  std::vector<LoraLayer> layers_;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_MODEL_LORA_H_
