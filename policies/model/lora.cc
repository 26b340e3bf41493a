#include "policies/model/lora.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/splitmix64.h"
#include "policies/model/llama.h"

namespace strata::policies {

namespace {

at::Tensor& Projection(LlamaLayerWeights& w, LoraModule m) {
  switch (m) {
    case LoraModule::kQ:
      return w.q_proj;
    case LoraModule::kK:
      return w.k_proj;
    case LoraModule::kV:
      return w.v_proj;
    case LoraModule::kO:
      return w.o_proj;
    case LoraModule::kGate:
      return w.gate_proj;
    case LoraModule::kUp:
      return w.up_proj;
    case LoraModule::kDown:
      return w.down_proj;
  }
  return w.q_proj;
}

// The mask key of one projection of one layer in a pass keyed `key`.
uint64_t MaskKey(uint64_t key, int64_t layer, LoraModule module) {
  return SplitMix64(SplitMix64(key ^ SplitMix64(static_cast<uint64_t>(layer))) + static_cast<uint64_t>(module));
}

// Inverted dropout whose mask is a function of the key alone. Drawn on the
// CPU so that every device draws the same mask.
at::Tensor KeyedDropout(const at::Tensor& x, double p, uint64_t key) {
  at::Generator gen = at::detail::createCPUGenerator(key);
  const at::Tensor keep = at::empty(x.sizes(), at::kFloat).bernoulli_(1.0 - p, gen);
  return x * (keep / (1.0 - p)).to(x.device(), x.scalar_type());
}

}  // namespace

uint64_t LoraDropoutKey(uint64_t seed, int64_t step, int64_t micro_batch) {
  return SplitMix64(SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(step))) + static_cast<uint64_t>(micro_batch));
}

at::Tensor LoraLinear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const LoraApply* lora,
                      LoraModule module) {
  at::Tensor y = at::linear(x, weight, bias);
  for (const LoraApply* apply = lora; apply != nullptr; apply = apply->frozen) {
    if (apply->layer == nullptr) continue;
    const LoraPair& pair = apply->layer->at(module);
    if (!pair.a.defined()) continue;
    const at::Tensor input = apply->dropout > 0 ? KeyedDropout(x, apply->dropout,
                                                               MaskKey(apply->dropout_key, apply->layer_index, module))
                                                : x;
    y = y + at::linear(at::linear(input, pair.a), pair.b) * apply->scaling;
  }
  return y;
}

absl::StatusOr<std::unique_ptr<LoraAdapters>> LoraAdapters::Zeros(const LoraConfig& lora, const LlamaConfig& model,
                                                                  at::ScalarType dtype, at::Device device) {
  if (absl::Status s = lora.Validate(); !s.ok()) return s;
  auto modules = lora.Modules();
  if (!modules.ok()) return modules.status();
  std::unique_ptr<LoraAdapters> adapters(new LoraAdapters(lora, *modules));
  const at::TensorOptions options = at::TensorOptions().dtype(dtype).device(device);
  adapters->layers_.resize(static_cast<size_t>(model.num_hidden_layers));
  for (LoraLayer& layer : adapters->layers_) {
    for (LoraModule m : *modules) {
      const auto [out, in] = LoraModuleShape(model, m);
      layer.at(m) = {at::zeros({lora.rank, in}, options), at::zeros({out, lora.rank}, options)};
    }
  }
  return adapters;
}

absl::StatusOr<std::unique_ptr<LoraAdapters>> LoraAdapters::Init(const LoraConfig& lora, const LlamaConfig& model,
                                                                 at::ScalarType dtype, at::Device device,
                                                                 uint64_t seed) {
  auto adapters = Zeros(lora, model, dtype, device);
  if (!adapters.ok()) return adapters;
  c10::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (LoraLayer& layer : (*adapters)->layers_) {
    for (LoraModule m : (*adapters)->modules_) {
      at::Tensor& a = layer.at(m).a;
      const double bound = 1.0 / std::sqrt(static_cast<double>(a.size(1)));
      a.copy_(at::empty(a.sizes(), at::kFloat).uniform_(-bound, bound, gen));
    }
  }
  return adapters;
}

std::vector<std::pair<std::string, at::Tensor*>> LoraAdapters::NamedInLayer(int64_t l) {
  std::vector<std::pair<std::string, at::Tensor*>> out;
  LoraLayer& layer = layers_.at(static_cast<size_t>(l));
  for (LoraModule m : modules_) {
    const std::string prefix = absl::StrCat("model.layers.", l, ".", LoraModuleParent(m), ".", LoraModuleName(m));
    out.emplace_back(prefix + ".lora_A.weight", &layer.at(m).a);
    out.emplace_back(prefix + ".lora_B.weight", &layer.at(m).b);
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor*>> LoraAdapters::Named() {
  std::vector<std::pair<std::string, at::Tensor*>> out;
  for (int64_t l = 0; l < num_layers(); ++l) {
    auto layer = NamedInLayer(l);
    out.insert(out.end(), layer.begin(), layer.end());
  }
  return out;
}

int64_t LoraAdapters::num_parameters() const {
  int64_t n = 0;
  for (const LoraLayer& layer : layers_) {
    for (LoraModule m : modules_) n += layer.at(m).a.numel() + layer.at(m).b.numel();
  }
  return n;  // LoraConfig::Parameters, counted from the tensors
}

std::unique_ptr<LoraAdapters> LoraAdapters::Stacked(const LoraAdapters& below, const LoraAdapters& above) {
  LoraConfig config;
  config.rank = below.config_.rank + above.config_.rank;
  config.alpha = static_cast<double>(config.rank);  // scale 1: the scales live in B
  config.dropout = above.config_.dropout;
  std::vector<LoraModule> modules = below.modules_;
  for (LoraModule m : above.modules_) {
    if (std::find(modules.begin(), modules.end(), m) == modules.end()) modules.push_back(m);
  }
  std::sort(modules.begin(), modules.end());
  config.target_modules.clear();
  for (LoraModule m : modules) config.target_modules.emplace_back(LoraModuleName(m));
  std::unique_ptr<LoraAdapters> out(new LoraAdapters(config, modules));
  c10::NoGradGuard no_grad;
  out->layers_.resize(below.layers_.size());
  for (size_t l = 0; l < out->layers_.size(); ++l) {
    for (LoraModule m : modules) {
      std::vector<at::Tensor> as, bs;
      for (const LoraAdapters* part : {&below, &above}) {
        const LoraPair& pair = part->layers_[l].at(m);
        if (pair.a.defined()) {
          as.push_back(pair.a);
          bs.push_back(pair.b * part->scaling());
          continue;
        }
        // A module one part does not adapt contributes rank zeros.
        const LoraPair& other = (part == &below ? above : below).layers_[l].at(m);
        as.push_back(at::zeros({part->config_.rank, other.a.size(1)}, other.a.options()));
        bs.push_back(at::zeros({other.b.size(0), part->config_.rank}, other.b.options()));
      }
      out->layers_[l].at(m) = {at::cat(as, 0), at::cat(bs, 1)};
    }
  }
  return out;
}

void LoraAdapters::MergeInto(int64_t l, LlamaLayerWeights& w) const {
  c10::NoGradGuard no_grad;
  const LoraLayer& layer = layers_.at(static_cast<size_t>(l));
  for (LoraModule m : modules_) {
    at::Tensor& weight = Projection(w, m);
    const LoraPair& pair = layer.at(m);
    // In fp32, then rounded once to the weight's dtype, as PEFT's merge does.
    const at::Tensor delta = at::matmul(pair.b.to(at::kFloat), pair.a.to(at::kFloat)) * scaling();
    weight = (weight.to(at::kFloat) + delta.to(weight.device())).to(weight.scalar_type());
  }
}

}  // namespace strata::policies
