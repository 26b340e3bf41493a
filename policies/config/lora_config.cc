#include "policies/config/lora_config.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::policies {

namespace {
constexpr LoraModule kAll[] = {LoraModule::kQ,    LoraModule::kK,  LoraModule::kV,   LoraModule::kO,
                               LoraModule::kGate, LoraModule::kUp, LoraModule::kDown};
}  // namespace

const char* LoraModuleName(LoraModule module) {
  switch (module) {
    case LoraModule::kQ:
      return "q_proj";
    case LoraModule::kK:
      return "k_proj";
    case LoraModule::kV:
      return "v_proj";
    case LoraModule::kO:
      return "o_proj";
    case LoraModule::kGate:
      return "gate_proj";
    case LoraModule::kUp:
      return "up_proj";
    case LoraModule::kDown:
      return "down_proj";
  }
  return "";
}

const char* LoraModuleParent(LoraModule module) {
  return module == LoraModule::kGate || module == LoraModule::kUp || module == LoraModule::kDown ? "mlp" : "self_attn";
}

std::pair<int64_t, int64_t> LoraModuleShape(const LlamaConfig& c, LoraModule module) {
  const int64_t h = c.hidden_size, i = c.intermediate_size;
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  switch (module) {
    case LoraModule::kQ:
      return {q, h};
    case LoraModule::kK:
    case LoraModule::kV:
      return {kv, h};
    case LoraModule::kO:
      return {h, q};
    case LoraModule::kGate:
    case LoraModule::kUp:
      return {i, h};
    case LoraModule::kDown:
      return {h, i};
  }
  return {0, 0};
}

std::vector<int64_t> LoraConfig::TensorElements(const LlamaConfig& model) const {
  std::vector<int64_t> out;
  if (!enabled()) return out;
  auto modules = Modules();
  if (!modules.ok()) return out;
  for (int64_t l = 0; l < model.num_hidden_layers; ++l) {
    for (LoraModule m : *modules) {
      const auto [rows, cols] = LoraModuleShape(model, m);
      out.insert(out.end(), {rank * cols, rows * rank});
    }
  }
  return out;
}

int64_t LoraConfig::Parameters(const LlamaConfig& model) const {
  int64_t n = 0;
  for (int64_t elements : TensorElements(model)) n += elements;
  return n;
}

double LoraConfig::scaling() const {
  const double a = alpha > 0 ? alpha : 2.0 * static_cast<double>(rank);
  return use_rslora ? a / std::sqrt(static_cast<double>(rank)) : a / static_cast<double>(rank);
}

absl::StatusOr<std::vector<LoraModule>> LoraConfig::Modules() const {
  std::vector<LoraModule> out;
  for (const std::string& name : target_modules) {
    if (name == "all-linear") {
      out.assign(std::begin(kAll), std::end(kAll));
      continue;
    }
    const auto* found = std::find_if(std::begin(kAll), std::end(kAll),
                                     [&](LoraModule m) { return name == LoraModuleName(m); });
    if (found == std::end(kAll)) {
      std::vector<std::string> names = {"all-linear"};
      for (LoraModule m : kAll) names.emplace_back(LoraModuleName(m));
      return absl::InvalidArgumentError(absl::StrCat(
          "target module '", name, "' is not a projection of a Llama-family layer (", absl::StrJoin(names, ", "), ")"));
    }
    if (std::find(out.begin(), out.end(), *found) == out.end()) out.push_back(*found);
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status LoraConfig::Validate(const std::string& key) const {
  auto error = [&](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("'", key, ".", field, "' ", why));
  };
  if (rank < 1) return error("rank", absl::StrCat("must be at least 1, got ", rank));
  if (alpha < 0 || !std::isfinite(alpha)) return error("alpha", absl::StrCat("must be positive, got ", alpha));
  if (!(dropout >= 0 && dropout < 1)) return error("dropout", absl::StrCat("must be in [0, 1), got ", dropout));
  if (target_modules.empty()) return error("target_modules", "is empty");
  if (auto modules = Modules(); !modules.ok()) return error("target_modules", std::string(modules.status().message()));
  return absl::OkStatus();
}

}  // namespace strata::policies
