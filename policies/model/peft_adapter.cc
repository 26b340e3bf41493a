#include "policies/model/peft_adapter.h"

#include <c10/core/GradMode.h>

#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "policies/checkpoint/safetensors.h"
#include "policies/checkpoint/tensor_io.h"

namespace strata::policies {

namespace {

using json = nlohmann::json;

constexpr char kPrefix[] = "base_model.model.";
constexpr char kScoreName[] = "base_model.model.score.weight";

absl::Status ConfigError(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

absl::StatusOr<LoraConfig> ParsePeftConfig(const std::string& path, const json& config);

bool IsUnset(const json& config, const char* key) {
  if (!config.contains(key)) return true;
  const json& v = config[key];
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || ((v.is_object() || v.is_array()) && v.empty());
}

}  // namespace

bool IsPeftAdapterDir(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(JoinPath(dir, kPeftConfigFile), ec);
}

absl::Status SavePeftAdapter(const std::string& dir, LoraAdapters& adapters, LlamaHead head, const at::Tensor& score,
                             const std::string& base_model) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  TensorWriteBatch batch;
  for (auto& [name, tensor] : adapters.Named()) STRATA_RETURN_IF_ERROR(batch.Add(kPrefix + name, *tensor));
  if (score.defined()) STRATA_RETURN_IF_ERROR(batch.Add(kScoreName, score));
  STRATA_RETURN_IF_ERROR(WriteSafetensors(JoinPath(dir, kPeftWeightsFile), batch.entries(), {{"format", "pt"}}));
  const LoraConfig& c = adapters.config();
  json modules = json::array();
  for (LoraModule m : adapters.modules()) modules.push_back(LoraModuleName(m));
  json config = {
      {"peft_type", "LORA"},
      {"task_type", head == LlamaHead::kScalar ? "SEQ_CLS" : "CAUSAL_LM"},
      {"r", c.rank},
      {"lora_alpha", c.alpha > 0 ? c.alpha : 2.0 * static_cast<double>(c.rank)},
      {"lora_dropout", c.dropout},
      {"target_modules", modules},
      {"modules_to_save", score.defined() ? json::array({"score"}) : json(nullptr)},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"use_rslora", c.use_rslora},
      {"use_dora", false},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", json::object()},
      {"alpha_pattern", json::object()},
      {"base_model_name_or_path", base_model},
      {"revision", nullptr},
  };
  return WriteFileAtomically(JoinPath(dir, kPeftConfigFile), config.dump(2) + "\n");
}

absl::StatusOr<LoraConfig> ReadPeftConfig(const std::string& dir) {
  const std::string path = JoinPath(dir, kPeftConfigFile);
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParsePeftConfig(path, json::parse(text, nullptr, /*allow_exceptions=*/false));
}

namespace {

// `key`'s value as a T, or `fallback` when absent or null; INVALID_ARGUMENT
// naming the key when it holds another type.
template <typename T>
absl::StatusOr<T> Field(const std::string& path, const json& config, const char* key, T fallback) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  try {
    return config[key].get<T>();
  } catch (const json::exception&) {
    return ConfigError(path, absl::StrCat(key, " = ", config[key].dump(), " has the wrong type"));
  }
}

absl::StatusOr<LoraConfig> ParsePeftConfig(const std::string& path, const json& config) {
  if (!config.is_object()) return ConfigError(path, "not a JSON object");
  STRATA_ASSIGN_OR_RETURN(const std::string peft_type, Field<std::string>(path, config, "peft_type", ""));
  if (peft_type != "LORA") {
    return ConfigError(path, absl::StrCat("peft_type is ", peft_type.empty() ? "missing" : peft_type,
                                          "; strata loads LORA adapters"));
  }
  // Settings that change what the adapter computes and that strata does not
  // implement: refused by name rather than silently ignored.
  for (const char* key : {"use_dora", "rank_pattern", "alpha_pattern", "layers_to_transform", "layers_pattern",
                          "exclude_modules", "lora_bias", "use_qalora", "megatron_config", "trainable_token_indices"}) {
    if (!IsUnset(config, key)) {
      return ConfigError(path, absl::StrCat(key, " = ", config[key].dump(), " is not supported by strata"));
    }
  }
  STRATA_ASSIGN_OR_RETURN(const bool fan_in_fan_out, Field<bool>(path, config, "fan_in_fan_out", false));
  if (fan_in_fan_out) return ConfigError(path, "fan_in_fan_out = true is not supported");
  STRATA_ASSIGN_OR_RETURN(const std::string bias, Field<std::string>(path, config, "bias", "none"));
  if (bias != "none") return ConfigError(path, absl::StrCat("bias = ", bias, " is not supported (only \"none\")"));
  LoraConfig lora;
  if (!config.contains("r")) return ConfigError(path, "r (the rank) is missing");
  STRATA_ASSIGN_OR_RETURN(lora.rank, Field<int64_t>(path, config, "r", 0));
  STRATA_ASSIGN_OR_RETURN(lora.alpha, Field<double>(path, config, "lora_alpha", 8.0));  // PEFT's default
  STRATA_ASSIGN_OR_RETURN(lora.dropout, Field<double>(path, config, "lora_dropout", 0.0));
  STRATA_ASSIGN_OR_RETURN(lora.use_rslora, Field<bool>(path, config, "use_rslora", false));
  if (config.contains("target_modules") && config["target_modules"].is_string()) {
    // PEFT reads a string as a regular expression over module names;
    // "all-linear" is the one strata takes.
    lora.target_modules = {config["target_modules"].get<std::string>()};
  } else {
    STRATA_ASSIGN_OR_RETURN(lora.target_modules, Field<std::vector<std::string>>(path, config, "target_modules", {}));
  }
  STRATA_ASSIGN_OR_RETURN(const std::vector<std::string> saved,
                          Field<std::vector<std::string>>(path, config, "modules_to_save", {}));
  for (const std::string& m : saved) {
    if (m != "score") {
      return ConfigError(path,
                         absl::StrCat("modules_to_save names ", m, "; strata saves only a scalar head, \"score\""));
    }
  }
  if (absl::Status s = lora.Validate("adapter_config"); !s.ok()) return ConfigError(path, std::string(s.message()));
  return lora;
}

}  // namespace

absl::StatusOr<PeftAdapter> LoadPeftAdapter(const std::string& dir, const LlamaConfig& model, LlamaHead head,
                                            at::ScalarType dtype, at::Device device) {
  PeftAdapter out;
  STRATA_ASSIGN_OR_RETURN(out.config, ReadPeftConfig(dir));
  STRATA_ASSIGN_OR_RETURN(out.adapters, LoraAdapters::Zeros(out.config, model, dtype, device));
  const std::string path = JoinPath(dir, kPeftWeightsFile);
  STRATA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  c10::NoGradGuard no_grad;
  std::set<std::string> used;
  for (auto& [name, tensor] : out.adapters->Named()) {
    const std::string saved = kPrefix + name;
    const TensorView* view = file->Find(saved);
    if (view == nullptr) return absl::InvalidArgumentError(absl::StrCat(path, ": no tensor ", saved));
    auto loaded = ToTensorWithShape(*view, tensor->sizes(), dtype);
    if (!loaded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", loaded.status().message(), " (does the adapter belong to another base model?)"));
    }
    tensor->copy_(*loaded);
    used.insert(saved);
  }
  if (const TensorView* score = file->Find(kScoreName); score != nullptr) {
    if (head != LlamaHead::kScalar) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": has a scalar head (", kScoreName, ") but is loaded as a causal LM"));
    }
    auto loaded = ToTensorWithShape(*score, {model.num_labels, model.hidden_size}, dtype);
    if (!loaded.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", loaded.status().message()));
    out.score = loaded->to(device);
    used.insert(kScoreName);
  }
  for (const TensorView& view : file->tensors()) {
    if (!used.contains(view.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", view.name, " is not one strata's LoRA uses (target_modules and layers)"));
    }
  }
  return out;
}

}  // namespace strata::policies
