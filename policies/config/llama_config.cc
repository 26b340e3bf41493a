#include "policies/config/llama_config.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"

namespace strata::policies {
namespace {

using nlohmann::json;

absl::Status FieldError(const std::string& source, const std::string& key, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": field '", key, "' ", why));
}

// Reads an optional integer field; absent or null keeps `*out`.
absl::Status ReadInt(const json& j, const std::string& key, const std::string& source, int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer()) return FieldError(source, key, "must be an integer");
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

// An id or a list of ids (eos_token_id).
absl::StatusOr<std::vector<int64_t>> ReadIdList(const json& value, const std::string& source, const std::string& key) {
  std::vector<int64_t> ids;
  if (value.is_number_integer()) {
    ids.push_back(value.get<int64_t>());
  } else if (value.is_array()) {
    for (const auto& e : value) {
      if (!e.is_number_integer()) return FieldError(source, key, "must be an integer or a list of integers");
      ids.push_back(e.get<int64_t>());
    }
  } else {
    return FieldError(source, key, "must be an integer or a list of integers");
  }
  return ids;
}

absl::Status ReadDouble(const json& j, const std::string& key, const std::string& source, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return FieldError(source, key, "must be a number");
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status ReadRopeScaling(const json& j, const std::string& source, RopeScaling* out) {
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return FieldError(source, "rope_scaling", "must be an object or null");
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto t = it->find(key);
    if (t != it->end() && t->is_string()) {
      type = t->get<std::string>();
      break;
    }
  }
  if (type == "linear") {
    out->type = RopeScaling::Type::kLinear;
  } else if (type == "llama3") {
    out->type = RopeScaling::Type::kLlama3;
  } else if (type == "default" || type.empty()) {
    out->type = RopeScaling::Type::kNone;
  } else {
    return FieldError(source, "rope_scaling.type", absl::StrCat("'", type, "' is not supported (linear, llama3)"));
  }
  for (auto [key, field] : {std::pair{"factor", &out->factor}, std::pair{"low_freq_factor", &out->low_freq_factor},
                            std::pair{"high_freq_factor", &out->high_freq_factor}}) {
    auto f = it->find(key);
    if (f == it->end()) continue;
    if (!f->is_number()) return FieldError(source, absl::StrCat("rope_scaling.", key), "must be a number");
    *field = f->get<double>();
  }
  auto orig = it->find("original_max_position_embeddings");
  if (orig != it->end()) {
    if (!orig->is_number_integer()) {
      return FieldError(source, "rope_scaling.original_max_position_embeddings", "must be an integer");
    }
    out->original_max_position_embeddings = orig->get<int64_t>();
  }
  return absl::OkStatus();
}

struct FamilyNames {
  ModelFamily family;
  const char* model_type;
  const char* class_prefix;  // of the HF classes: "<prefix>ForCausalLM"
};

constexpr FamilyNames kFamilies[] = {{ModelFamily::kLlama, "llama", "Llama"},
                                     {ModelFamily::kMistral, "mistral", "Mistral"},
                                     {ModelFamily::kQwen2, "qwen2", "Qwen2"},
                                     {ModelFamily::kQwen3, "qwen3", "Qwen3"}};

const FamilyNames& NamesOf(ModelFamily family) {
  for (const FamilyNames& f : kFamilies) {
    if (f.family == family) return f;
  }
  return kFamilies[0];
}

absl::Status ReadBool(const json& j, const std::string& key, const std::string& source, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return FieldError(source, key, "must be true or false");
  *out = it->get<bool>();
  return absl::OkStatus();
}

// The family from model_type, or else from the first of `architectures`
// (older checkpoints); a config with neither is a Llama.
absl::Status ReadFamily(const json& j, const std::string& source, ModelFamily* out) {
  std::string supported;
  for (const FamilyNames& f : kFamilies) supported += absl::StrCat(supported.empty() ? "" : ", ", f.model_type);
  if (auto mt = j.find("model_type"); mt != j.end() && !mt->is_null()) {
    if (!mt->is_string()) return FieldError(source, "model_type", "must be a string");
    for (const FamilyNames& f : kFamilies) {
      if (mt->get<std::string>() == f.model_type) {
        *out = f.family;
        return absl::OkStatus();
      }
    }
    return FieldError(source, "model_type", absl::StrCat("is '", mt->get<std::string>(), "'; supported: ", supported));
  }
  if (auto arch = j.find("architectures"); arch != j.end() && arch->is_array() && !arch->empty()) {
    const std::string name = (*arch)[0].is_string() ? (*arch)[0].get<std::string>() : "";
    for (const FamilyNames& f : kFamilies) {
      if (name.rfind(absl::StrCat(f.class_prefix, "For"), 0) == 0) {
        *out = f.family;
        return absl::OkStatus();
      }
    }
    return FieldError(source, "architectures", absl::StrCat("names '", name, "'; supported families: ", supported));
  }
  return absl::OkStatus();
}

// What each family's config may say about its attention and MLP, beyond
// what strata implements, is refused by name rather than ignored.
absl::Status ReadFamilyFields(const json& j, const std::string& source, LlamaConfig* c) {
  if (auto act = j.find("hidden_act"); act != j.end() && !act->is_null()) {
    if (!act->is_string() || act->get<std::string>() != "silu") {
      return FieldError(source, "hidden_act", absl::StrCat("is ", act->dump(), "; only \"silu\" is supported"));
    }
  }
  bool mlp_bias = false, attention_bias = false, use_sliding_window = false;
  STRATA_RETURN_IF_ERROR(ReadBool(j, "mlp_bias", source, &mlp_bias));
  if (mlp_bias) return FieldError(source, "mlp_bias", "is true; biases in the MLP are not supported");
  STRATA_RETURN_IF_ERROR(ReadBool(j, "attention_bias", source, &attention_bias));
  if (attention_bias) {
    return FieldError(source, "attention_bias",
                      "is true; a bias on every attention projection (o_proj included) is not supported");
  }
  switch (c->family) {
    case ModelFamily::kLlama:
      break;
    case ModelFamily::kMistral: {
      auto window = j.find("sliding_window");
      if (window != j.end() && !window->is_null()) {
        if (!window->is_number_integer() || window->get<int64_t>() < 0) {
          return FieldError(source, "sliding_window", "must be a non-negative integer or null");
        }
        c->sliding_window = window->get<int64_t>();
      }
      break;
    }
    case ModelFamily::kQwen2:
    case ModelFamily::kQwen3:
      c->qkv_bias = c->family == ModelFamily::kQwen2;
      c->qk_norm = c->family == ModelFamily::kQwen3;
      // Qwen's window applies only to layers from max_window_layers on.
      STRATA_RETURN_IF_ERROR(ReadBool(j, "use_sliding_window", source, &use_sliding_window));
      if (use_sliding_window) {
        return FieldError(source, "use_sliding_window", "is true; Qwen's per-layer sliding window is not supported");
      }
      break;
  }
  return absl::OkStatus();
}

}  // namespace

const char* ModelTypeName(ModelFamily family) { return NamesOf(family).model_type; }

absl::Status LlamaConfig::Validate() const {
  auto positive = [](const char* key, int64_t v) -> absl::Status {
    if (v <= 0) return absl::InvalidArgumentError(absl::StrCat("config field '", key, "' must be positive, got ", v));
    return absl::OkStatus();
  };
  for (auto [key, value] :
       {std::pair{"vocab_size", vocab_size}, std::pair{"hidden_size", hidden_size},
        std::pair{"intermediate_size", intermediate_size}, std::pair{"num_hidden_layers", num_hidden_layers},
        std::pair{"num_attention_heads", num_attention_heads}, std::pair{"num_key_value_heads", num_key_value_heads},
        std::pair{"head_dim", head_dim}, std::pair{"max_position_embeddings", max_position_embeddings},
        std::pair{"num_labels", num_labels}}) {
    STRATA_RETURN_IF_ERROR(positive(key, value));
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config field 'num_key_value_heads' (", num_key_value_heads,
                                                   ") must divide 'num_attention_heads' (", num_attention_heads, ")"));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("config field 'head_dim' must be even for RoPE, got ", head_dim));
  }
  if (sliding_window < 0) return absl::InvalidArgumentError("config field 'sliding_window' must not be negative");
  if (!(rope_theta > 0)) return absl::InvalidArgumentError("config field 'rope_theta' must be positive");
  if (!(rms_norm_eps > 0)) return absl::InvalidArgumentError("config field 'rms_norm_eps' must be positive");
  if (rope_scaling.type != RopeScaling::Type::kNone && !(rope_scaling.factor > 0)) {
    return absl::InvalidArgumentError("config field 'rope_scaling.factor' must be positive");
  }
  for (int64_t id : eos_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("config field 'eos_token_id' ", id, " is outside the vocabulary"));
    }
  }
  if (bos_token_id >= vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("config field 'bos_token_id' ", bos_token_id, " is outside the vocabulary"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LlamaConfig> LlamaConfig::FromJson(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": expected a JSON object"));
  LlamaConfig c;
  STRATA_RETURN_IF_ERROR(ReadFamily(j, source, &c.family));
  STRATA_RETURN_IF_ERROR(ReadFamilyFields(j, source, &c));
  c.num_key_value_heads = -1;
  c.head_dim = -1;
  for (auto [key, field] :
       {std::pair{"vocab_size", &c.vocab_size}, std::pair{"hidden_size", &c.hidden_size},
        std::pair{"intermediate_size", &c.intermediate_size}, std::pair{"num_hidden_layers", &c.num_hidden_layers},
        std::pair{"num_attention_heads", &c.num_attention_heads},
        std::pair{"num_key_value_heads", &c.num_key_value_heads}, std::pair{"head_dim", &c.head_dim},
        std::pair{"max_position_embeddings", &c.max_position_embeddings}, std::pair{"bos_token_id", &c.bos_token_id},
        std::pair{"pad_token_id", &c.pad_token_id}}) {
    STRATA_RETURN_IF_ERROR(ReadInt(j, key, source, field));
  }
  for (auto [key, field] : {std::pair{"rope_theta", &c.rope_theta}, std::pair{"rms_norm_eps", &c.rms_norm_eps}}) {
    STRATA_RETURN_IF_ERROR(ReadDouble(j, key, source, field));
  }
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return FieldError(source, "tie_word_embeddings", "must be true or false");
    c.tie_word_embeddings = it->get<bool>();
  }
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    STRATA_ASSIGN_OR_RETURN(c.eos_token_ids, ReadIdList(*it, source, "eos_token_id"));
  }
  if (auto it = j.find("id2label"); it != j.end() && it->is_object() && !it->empty()) {
    c.num_labels = static_cast<int64_t>(it->size());
  }
  if (auto it = j.find("num_labels"); it != j.end() && it->is_number_integer()) c.num_labels = it->get<int64_t>();
  if (auto it = j.find("torch_dtype"); it != j.end() && it->is_string()) c.torch_dtype = it->get<std::string>();
  STRATA_RETURN_IF_ERROR(ReadRopeScaling(j, source, &c.rope_scaling));
  if (c.num_key_value_heads < 0) c.num_key_value_heads = c.num_attention_heads;
  if (c.head_dim < 0 && c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  if (auto s = c.Validate(); !s.ok()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  return c;
}

absl::StatusOr<std::vector<int64_t>> ReadGenerationEosIds(const std::string& model_dir) {
  const std::string path = JoinPath(model_dir, "generation_config.json");
  if (!IsRegularFile(path)) return std::vector<int64_t>{};
  STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(path));
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  const auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return std::vector<int64_t>{};
  return ReadIdList(*it, path, "eos_token_id");
}

absl::StatusOr<LlamaConfig> LlamaConfig::Load(const std::string& model_dir) {
  const std::string path = JoinPath(model_dir, "config.json");
  STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(path));
  return FromJson(text, path);
}

std::string LlamaConfig::ArchitectureName(bool scalar_head) const {
  return absl::StrCat(NamesOf(family).class_prefix, scalar_head ? "ForSequenceClassification" : "ForCausalLM");
}

std::string LlamaConfig::ToJson(bool scalar_head) const {
  json j;
  j["architectures"] = {ArchitectureName(scalar_head)};
  j["model_type"] = ModelTypeName(family);
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rope_theta"] = rope_theta;
  j["rms_norm_eps"] = rms_norm_eps;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = "silu";
  switch (family) {
    case ModelFamily::kLlama:
      j["attention_bias"] = false;
      j["mlp_bias"] = false;
      break;
    case ModelFamily::kMistral:
      j["sliding_window"] = sliding_window > 0 ? json(sliding_window) : json(nullptr);
      break;
    case ModelFamily::kQwen2:  // q/k/v biases are implied by the family
      j["use_sliding_window"] = false;
      break;
    case ModelFamily::kQwen3:
      j["attention_bias"] = false;
      j["use_sliding_window"] = false;
      break;
  }
  j["bos_token_id"] = bos_token_id >= 0 ? json(bos_token_id) : json(nullptr);
  j["eos_token_id"] = eos_token_ids.size() == 1 ? json(eos_token_ids[0]) : json(eos_token_ids);
  j["pad_token_id"] = pad_token_id >= 0 ? json(pad_token_id) : json(nullptr);
  j["torch_dtype"] = torch_dtype;
  if (scalar_head) j["num_labels"] = num_labels;
  switch (rope_scaling.type) {
    case RopeScaling::Type::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScaling::Type::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rope_scaling.factor}};
      break;
    case RopeScaling::Type::kLlama3:
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", rope_scaling.factor},
                           {"low_freq_factor", rope_scaling.low_freq_factor},
                           {"high_freq_factor", rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
      break;
  }
  return j.dump(2) + "\n";
}

int64_t LlamaConfig::LayerParameters() const {
  const int64_t h = hidden_size;
  const int64_t q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  const int64_t attn = h * q * 2 + h * kv * 2 + (qkv_bias ? q + 2 * kv : 0) + (qk_norm ? 2 * head_dim : 0);
  const int64_t mlp = 3 * h * intermediate_size;
  return attn + mlp + 2 * h;
}

std::vector<int64_t> LlamaConfig::TrainedTensorElements(bool scalar_head) const {
  const int64_t h = hidden_size, i = intermediate_size;
  const int64_t q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
  std::vector<int64_t> out = {vocab_size * h, h};
  if (scalar_head) {
    out.push_back(num_labels * h);
  } else if (!tie_word_embeddings) {
    out.push_back(vocab_size * h);
  }
  std::vector<int64_t> layer = {h, q * h, kv * h, kv * h};
  if (qkv_bias) layer.insert(layer.end(), {q, kv, kv});
  if (qk_norm) layer.insert(layer.end(), {head_dim, head_dim});
  layer.insert(layer.end(), {h * q, h, i * h, i * h, h * i});
  for (int64_t l = 0; l < num_hidden_layers; ++l) out.insert(out.end(), layer.begin(), layer.end());
  return out;
}

int64_t LlamaConfig::NumParameters() const {
  const int64_t embed = vocab_size * hidden_size;
  return embed * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * LayerParameters() + hidden_size;
}

}  // namespace strata::policies
