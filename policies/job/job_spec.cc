#include "policies/job/job_spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <functional>
#include <optional>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "policies/tokenizer/unicode.h"

namespace strata::policies {
namespace {

absl::Status KeyError(const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("spec key '", path, "' ", why));
}

// Bad input quoted back in an error, cut short: a 10 MB value must not
// become a 10 MB error that hides the message around it.
// YYYY-MM-DD, optionally followed by THH:MM[:SS[.ffffff]] and an offset
// (Z or +HH:MM): the forms Python's datetime.fromisoformat reads.
bool IsIsoDateTime(const std::string& text) {
  static const std::regex kIso(R"(\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:\d{2})?)?)");
  return std::regex_match(text, kIso);
}

std::string Shown(const std::string& text) {
  constexpr size_t kMax = 64;
  if (text.size() <= kMax) return text;
  return absl::StrCat(text.substr(0, kMax), "... (", text.size(), " bytes)");
}

// yaml-cpp keeps every entry of a mapping that repeats a key, and lookups
// see only the first: a repeated key would silently drop the later value.
absl::Status CheckNoDuplicateKeys(const YAML::Node& node, const std::string& path) {
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      STRATA_RETURN_IF_ERROR(CheckNoDuplicateKeys(node[i], absl::StrCat(path, "[", i, "]")));
    }
  }
  if (!node.IsMap()) return absl::OkStatus();
  std::set<std::string> seen;
  for (const auto& entry : node) {
    const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : "<complex key>";
    const std::string child = path.empty() ? key : absl::StrCat(path, ".", key);
    if (!seen.insert(key).second) return KeyError(Shown(child), "appears twice");
    STRATA_RETURN_IF_ERROR(CheckNoDuplicateKeys(entry.second, child));
  }
  return absl::OkStatus();
}

// Where text a spec may not hold starts: a byte that is not well-formed
// UTF-8, or a control character YAML does not allow in a document (C0 other
// than tab and line breaks, DEL, C1 other than NEL; the emitter would write
// it back raw, and the stored spec would no longer parse). `one_line` also
// refuses line breaks (an override is one line).
struct TextFault {
  size_t offset = 0;
  bool not_utf8 = false;  // else a control character
};
std::optional<TextFault> FirstTextFault(const std::string& text, bool one_line) {
  for (size_t i = 0; i < text.size();) {
    const Utf8Char c = DecodeUtf8Char(std::string_view(text).substr(i));
    if (!c.valid) return TextFault{i, true};
    const char32_t cp = c.code_point;
    const bool c0 = cp < 0x20 && (one_line || (cp != '\t' && cp != '\n' && cp != '\r'));
    if (c0 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F && cp != 0x85)) return TextFault{i, false};
    i += c.length;
  }
  return std::nullopt;
}

// Loads a spec document: at most kMaxJobSpecBytes, a mapping, no repeated keys.
absl::StatusOr<YAML::Node> LoadDocument(const std::string& yaml_text, const std::string& source) {
  if (yaml_text.size() > kMaxJobSpecBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the spec is ", yaml_text.size(), " bytes; a spec may have at most ", kMaxJobSpecBytes));
  }
  if (const auto fault = FirstTextFault(yaml_text, /*one_line=*/false)) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, fault->not_utf8 ? ": the spec is not UTF-8 text (byte " : ": the spec holds a control character (byte ",
        fault->offset, ")"));
  }
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid YAML: ", e.what()));
  }
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) return absl::InvalidArgumentError(absl::StrCat(source, ": the spec must be a YAML mapping"));
  if (auto s = CheckNoDuplicateKeys(root, ""); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  return root;
}

// Reads one YAML mapping, remembering which keys were used so that anything
// left over is reported as unknown.
nlohmann::json YamlToJson(const YAML::Node& node) {
  if (node.IsMap()) {
    nlohmann::json object = nlohmann::json::object();
    for (const auto& entry : node) object[entry.first.Scalar()] = YamlToJson(entry.second);
    return object;
  }
  if (node.IsSequence()) {
    nlohmann::json array = nlohmann::json::array();
    for (const auto& item : node) array.push_back(YamlToJson(item));
    return array;
  }
  if (!node.IsScalar()) return nullptr;
  const std::string& text = node.Scalar();
  if (node.Tag() == "!") return text;  // quoted
  if (text == "~" || text == "null" || text == "Null" || text == "NULL") return nullptr;
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  int64_t integer = 0;
  if (absl::SimpleAtoi(text, &integer)) return integer;
  double number = 0;
  if (absl::SimpleAtod(text, &number) && std::isfinite(number) &&
      text.find_first_of("0123456789") != std::string::npos) {
    return number;
  }
  return text;
}

class MapReader {
 public:
  MapReader(YAML::Node node, std::string path) : node_(std::move(node)), path_(std::move(path)) {}

  absl::Status CheckIsMap() const {
    if (node_ && !node_.IsNull() && !node_.IsMap())
      return KeyError(path_.empty() ? "<root>" : path_, "must be a mapping");
    return absl::OkStatus();
  }

  std::string Path(const std::string& key) const { return path_.empty() ? key : absl::StrCat(path_, ".", key); }

  // Child mapping; absent gives an empty reader.
  absl::StatusOr<MapReader> Child(const std::string& key) {
    used_.insert(key);
    YAML::Node child = node_ && node_.IsMap() ? node_[key] : YAML::Node();
    MapReader reader(child, Path(key));
    STRATA_RETURN_IF_ERROR(reader.CheckIsMap());
    return reader;
  }

  template <typename T>
  absl::Status Read(const std::string& key, T* out) {
    used_.insert(key);
    if (!node_ || !node_.IsMap()) return absl::OkStatus();
    YAML::Node value = node_[key];
    if (!value || value.IsNull()) return absl::OkStatus();
    if (!value.IsScalar()) return KeyError(Path(key), "must be a scalar");
    try {
      *out = value.as<T>();
    } catch (const YAML::Exception&) {
      if constexpr (std::is_unsigned_v<T> && !std::is_same_v<T, bool>) {
        if (!value.Scalar().empty() && value.Scalar()[0] == '-') {
          return KeyError(Path(key), absl::StrCat("must be >= 0, got ", Shown(value.Scalar())));
        }
      }
      return KeyError(Path(key),
                      absl::StrCat("has the wrong type ('", Shown(value.Scalar()), "' is not ", TypeName<T>(), ")"));
    }
    if constexpr (std::is_floating_point_v<T>) {
      // YAML spells infinity and NaN .inf and .nan; no setting wants them.
      if (!std::isfinite(*out))
        return KeyError(Path(key), absl::StrCat("must be a finite number, got ", value.Scalar()));
    }
    return absl::OkStatus();
  }

  // A sequence of scalars of type T; absent or null leaves `out` as it is.
  template <typename T>
  absl::Status ReadList(const std::string& key, std::vector<T>* out) {
    used_.insert(key);
    if (!node_ || !node_.IsMap()) return absl::OkStatus();
    YAML::Node value = node_[key];
    if (!value || value.IsNull()) return absl::OkStatus();
    if (!value.IsSequence()) return KeyError(Path(key), absl::StrCat("must be a list, each item ", TypeName<T>()));
    std::vector<T> items;
    for (size_t i = 0; i < value.size(); ++i) {
      try {
        if (!value[i].IsScalar()) throw YAML::Exception(YAML::Mark(), "");
        items.push_back(value[i].as<T>());
      } catch (const YAML::Exception&) {
        return KeyError(absl::StrCat(Path(key), "[", i, "]"), absl::StrCat("must be ", TypeName<T>()));
      }
    }
    *out = std::move(items);
    return absl::OkStatus();
  }

  // A sequence of mappings, each read by `read` (its reader's path is
  // key[i]); absent or null reads none.
  absl::Status ReadMaps(const std::string& key, const std::function<absl::Status(MapReader&)>& read) {
    used_.insert(key);
    if (!node_ || !node_.IsMap()) return absl::OkStatus();
    YAML::Node value = node_[key];
    if (!value || value.IsNull()) return absl::OkStatus();
    if (!value.IsSequence()) return KeyError(Path(key), "must be a list of mappings");
    for (size_t i = 0; i < value.size(); ++i) {
      MapReader item(value[i], absl::StrCat(Path(key), "[", i, "]"));
      if (!value[i].IsMap()) return KeyError(absl::StrCat(Path(key), "[", i, "]"), "must be a mapping");
      STRATA_RETURN_IF_ERROR(read(item));
      STRATA_RETURN_IF_ERROR(item.CheckNoUnknownKeys());
    }
    return absl::OkStatus();
  }

  // A mapping of any YAML values, as the text of a JSON object: plain
  // scalars that read as null, true/false, integers or numbers become those,
  // quoted ones stay strings.
  absl::Status ReadJsonObject(const std::string& key, std::string* out) {
    used_.insert(key);
    if (!node_ || !node_.IsMap()) return absl::OkStatus();
    YAML::Node value = node_[key];
    if (!value || value.IsNull()) return absl::OkStatus();
    if (!value.IsMap()) return KeyError(Path(key), "must be a mapping");
    *out = YamlToJson(value).dump();
    return absl::OkStatus();
  }

  // Whether the mapping exists (a Child that is absent reads as empty).
  bool present() const { return node_ && node_.IsMap(); }
  bool IsScalar(const std::string& key) const { return present() && node_[key] && node_[key].IsScalar(); }

  absl::Status CheckNoUnknownKeys() const {
    if (!node_ || !node_.IsMap()) return absl::OkStatus();
    for (const auto& entry : node_) {
      const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : "<complex key>";
      if (!used_.count(key)) return KeyError(Shown(Path(key)), "is unknown");
    }
    return absl::OkStatus();
  }

 private:
  template <typename T>
  static const char* TypeName() {
    if constexpr (std::is_same_v<T, bool>) return "true or false";
    if constexpr (std::is_integral_v<T>) return "an integer";
    if constexpr (std::is_floating_point_v<T>) return "a number";
    return "a string";
  }

  YAML::Node node_;
  std::string path_;
  std::set<std::string> used_;
};

absl::Status ReadTier(MapReader& r, const std::string& key, offload::Tier* out) {
  std::string name;
  STRATA_RETURN_IF_ERROR(r.Read(key, &name));
  if (name.empty()) return absl::OkStatus();
  auto tier = offload::ParseTier(name);
  if (!tier.ok()) return KeyError(r.Path(key), absl::StrCat("must be device, host or nvme, got '", Shown(name), "'"));
  *out = *tier;
  return absl::OkStatus();
}

// A model's `lora` mapping, when present. target_modules is a list of
// PEFT's names or the one string "all-linear".
absl::Status ReadLora(MapReader& model, LoraConfig* lora) {
  STRATA_ASSIGN_OR_RETURN(auto r, model.Child("lora"));
  if (!r.present()) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(r.Read("rank", &lora->rank));
  STRATA_RETURN_IF_ERROR(r.Read("alpha", &lora->alpha));
  STRATA_RETURN_IF_ERROR(r.Read("dropout", &lora->dropout));
  STRATA_RETURN_IF_ERROR(r.Read("use_rslora", &lora->use_rslora));
  std::string all;
  if (r.IsScalar("target_modules")) {
    STRATA_RETURN_IF_ERROR(r.Read("target_modules", &all));
    lora->target_modules = {all};
  } else {
    STRATA_RETURN_IF_ERROR(r.ReadList("target_modules", &lora->target_modules));
  }
  STRATA_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  if (absl::Status s = lora->Validate(model.Path("lora")); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec key ", s.message()));
  }
  return absl::OkStatus();
}

// A model's `galore` mapping, when present.
absl::Status ReadGalore(MapReader& model, GaloreConfig* galore) {
  STRATA_ASSIGN_OR_RETURN(auto r, model.Child("galore"));
  if (!r.present()) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(r.Read("rank", &galore->rank));
  STRATA_RETURN_IF_ERROR(r.Read("update_proj_gap", &galore->update_proj_gap));
  STRATA_RETURN_IF_ERROR(r.Read("scale", &galore->scale));
  STRATA_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  if (absl::Status s = galore->Validate(model.Path("galore")); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec key ", s.message()));
  }
  return absl::OkStatus();
}

// path, dtype, placement, adapters and GaLore of a model, in the mapping `r` reads.
absl::Status ReadModelFields(MapReader& r, ModelSpec* model) {
  STRATA_RETURN_IF_ERROR(r.Read("path", &model->path));
  STRATA_RETURN_IF_ERROR(r.Read("dtype", &model->dtype));
  if (model->dtype != "fp32" && model->dtype != "bf16") {
    return KeyError(r.Path("dtype"), absl::StrCat("must be fp32 or bf16, got '", Shown(model->dtype), "'"));
  }
  STRATA_ASSIGN_OR_RETURN(auto p, r.Child("placement"));
  STRATA_RETURN_IF_ERROR(ReadTier(p, "weights", &model->placement.weights));
  STRATA_RETURN_IF_ERROR(ReadTier(p, "optimizer", &model->placement.optimizer));
  STRATA_RETURN_IF_ERROR(ReadTier(p, "gradients", &model->placement.gradients));
  STRATA_RETURN_IF_ERROR(ReadTier(p, "activations", &model->placement.activations));
  STRATA_RETURN_IF_ERROR(p.Read("prefetch", &model->placement.prefetch_depth));
  STRATA_RETURN_IF_ERROR(p.Read("step_in_backward", &model->placement.step_in_backward));
  STRATA_RETURN_IF_ERROR(p.CheckNoUnknownKeys());
  if (auto s = model->placement.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec key '", r.Path("placement"), "': ", s.message()));
  }
  STRATA_RETURN_IF_ERROR(r.Read("adapter", &model->adapter));
  STRATA_RETURN_IF_ERROR(ReadGalore(r, &model->galore));
  return ReadLora(r, &model->lora);
}

absl::Status ReadModel(MapReader& parent, const std::string& key, ModelSpec* model) {
  STRATA_ASSIGN_OR_RETURN(auto r, parent.Child(key));
  STRATA_RETURN_IF_ERROR(r.Read("init", &model->init));
  STRATA_RETURN_IF_ERROR(r.Read("rule", &model->rule));
  STRATA_RETURN_IF_ERROR(ReadModelFields(r, model));
  return r.CheckNoUnknownKeys();
}

// One entry of reward.sources; what its kind does not read is refused.
absl::Status ReadRewardSource(MapReader& r, RewardSourceSpec* source) {
  STRATA_RETURN_IF_ERROR(r.Read("name", &source->name));
  STRATA_RETURN_IF_ERROR(r.Read("kind", &source->kind));
  STRATA_RETURN_IF_ERROR(r.Read("weight", &source->weight));
  if (source->kind == "model") {
    STRATA_RETURN_IF_ERROR(ReadModelFields(r, &source->model));
  } else if (source->kind == "verifier") {
    STRATA_RETURN_IF_ERROR(r.Read("check", &source->check));
    STRATA_RETURN_IF_ERROR(r.Read("pattern", &source->pattern));
    STRATA_RETURN_IF_ERROR(r.Read("strict", &source->strict));
  } else if (source->kind == "remote") {
    STRATA_RETURN_IF_ERROR(r.Read("url", &source->url));
    STRATA_RETURN_IF_ERROR(r.Read("batch_size", &source->batch_size));
    STRATA_RETURN_IF_ERROR(r.Read("max_in_flight", &source->max_in_flight));
    STRATA_RETURN_IF_ERROR(r.Read("timeout_s", &source->timeout_s));
    STRATA_RETURN_IF_ERROR(r.Read("retries", &source->retries));
    STRATA_RETURN_IF_ERROR(r.Read("token_secret", &source->token_secret));
    STRATA_RETURN_IF_ERROR(r.Read("ca_file", &source->ca_file));
  } else {
    return KeyError(r.Path("kind"), source->kind.empty() ? "is required (model, verifier or remote)"
                                                         : absl::StrCat("must be model, verifier or remote, got '",
                                                                        Shown(source->kind), "'"));
  }
  return absl::OkStatus();
}

// models.reward, the shorthand for one reward source, as that source.
std::optional<RewardSourceSpec> ShorthandSource(const ModelSpec& reward) {
  RewardSourceSpec source;
  if (!reward.rule.empty()) {
    source.name = reward.rule;
    source.kind = "verifier";
    source.check = reward.rule;
  } else if (!reward.path.empty()) {
    source.name = "reward_model";
    source.kind = "model";
    source.model = reward;
  } else {
    return std::nullopt;
  }
  return source;
}

// Applies "a.b.c=value" to the document, creating mappings on the way.
absl::Status ApplyOverride(YAML::Node& root, const std::string& assignment) {
  if (const auto fault = FirstTextFault(assignment, /*one_line=*/true)) {
    if (fault->not_utf8) {
      return absl::InvalidArgumentError(absl::StrCat("--set '", Shown(assignment), "' is not UTF-8 text"));
    }
    return absl::InvalidArgumentError(absl::StrCat("--set ", Shown(assignment.substr(0, fault->offset)),
                                                   "...: a control character or line break at byte ", fault->offset));
  }
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--set '", Shown(assignment), "' is not key.path=value"));
  }
  const std::string path = Shown(assignment.substr(0, eq));
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("--set ", path, ": value is not valid YAML: ", e.what()));
  }
  std::vector<std::string> keys = absl::StrSplit(assignment.substr(0, eq), '.');
  // yaml-cpp nodes are handles: walking with operator[] on copies mutates root.
  // A number indexes an existing list (reward.sources.0.weight); a string
  // key on a list would turn it into a mapping.
  std::vector<YAML::Node> chain = {root};
  for (size_t i = 0; i < keys.size(); ++i) {
    const YAML::Node here = chain.back();
    const bool last = i + 1 == keys.size();
    if (here.IsSequence()) {
      size_t index = 0;
      if (!absl::SimpleAtoi(keys[i], &index) || index >= here.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--set ", path, ": '", i == 0 ? "" : Shown(keys[i - 1]),
                                                       "' is a list of ", here.size(), " items; '", Shown(keys[i]),
                                                       "' is not an index into it"));
      }
      if (last) {
        chain.back()[index] = value;
        return absl::OkStatus();
      }
      chain.push_back(chain.back()[index]);
      continue;
    }
    if (last) break;
    YAML::Node next = chain.back()[keys[i]];
    if (next && !next.IsNull() && !next.IsMap() && !next.IsSequence()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--set ", path, ": '", Shown(keys[i]), "' is not a mapping or a list"));
    }
    chain.push_back(next);
  }
  chain.back()[keys.back()] = value;
  return absl::OkStatus();
}

// LoadDocument, then `overrides` (at most kMaxJobSpecBytes together) applied.
absl::StatusOr<YAML::Node> LoadWithOverrides(const std::string& yaml_text, const std::vector<std::string>& overrides,
                                             const std::string& source) {
  STRATA_ASSIGN_OR_RETURN(YAML::Node root, LoadDocument(yaml_text, source));
  size_t override_bytes = 0;
  for (const std::string& o : overrides) override_bytes += o.size();
  if (override_bytes > kMaxJobSpecBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the overrides are ", override_bytes, " bytes; at most ", kMaxJobSpecBytes));
  }
  for (const std::string& o : overrides) STRATA_RETURN_IF_ERROR(ApplyOverride(root, o));
  return root;
}

}  // namespace

const char* AlgorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kSft:
      return "sft";
    case Algorithm::kRewardModel:
      return "reward_model";
    case Algorithm::kRemax:
      return "remax";
    case Algorithm::kPpo:
      return "ppo";
    case Algorithm::kGrpo:
      return "grpo";
    case Algorithm::kRloo:
      return "rloo";
  }
  return "?";
}

namespace {

absl::Status ValidateRewardSources(const std::vector<RewardSourceSpec>& sources) {
  std::set<std::string> names;
  for (size_t i = 0; i < sources.size(); ++i) {
    const RewardSourceSpec& s = sources[i];
    auto key = [&](const char* field) { return absl::StrCat("reward.sources[", i, "].", field); };
    static const std::regex kName(R"([A-Za-z0-9_.:-]{1,64})");
    if (!std::regex_match(s.name, kName)) {
      return KeyError(key("name"), absl::StrCat("must be 1 to 64 letters, digits or _.:- (it names metrics), got '",
                                                Shown(s.name), "'"));
    }
    if (!names.insert(s.name).second) return KeyError(key("name"), absl::StrCat("'", s.name, "' appears twice"));
    // reward/<name> must not be one of the reward statistics' own metrics.
    if (s.name == "raw_mean" || s.name == "batch_var" || s.name == "batch_count") {
      return KeyError(key("name"), absl::StrCat("'", s.name, "' is taken by the metric reward/", s.name));
    }
    if (!std::isfinite(s.weight)) return KeyError(key("weight"), "must be a finite number");
    if (s.kind == "model" && s.model.path.empty()) return KeyError(key("path"), "is required for kind model");
    if (s.kind == "verifier") {
      if (s.check.empty())
        return KeyError(key("check"), "is required for kind verifier (math, exact, regex or a rule)");
      if (s.check == "regex" && s.pattern.empty()) return KeyError(key("pattern"), "is required for check regex");
    }
    if (s.kind == "remote") {
      if (!absl::StartsWith(s.url, "http://") && !absl::StartsWith(s.url, "https://")) {
        return KeyError(key("url"), absl::StrCat("must be an http:// or https:// URL, got '", Shown(s.url), "'"));
      }
      if (s.batch_size < 1) return KeyError(key("batch_size"), "must be >= 1");
      if (s.max_in_flight < 1) return KeyError(key("max_in_flight"), "must be >= 1");
      if (!(s.timeout_s > 0)) return KeyError(key("timeout_s"), "must be > 0");
      if (s.retries < 0) return KeyError(key("retries"), "must be >= 0");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status JobSpec::ValidateLora() const {
  const bool rl = algorithm != Algorithm::kSft && algorithm != Algorithm::kRewardModel;
  if (!reference.adapter.empty()) {
    return KeyError("models.reference.adapter",
                    "is not allowed: with models.actor.adapter, the reference is the actor's base with that adapter");
  }
  if (reference.lora.enabled()) {
    return KeyError("models.reference.lora",
                    "is not allowed: the reference never trains (with models.actor.lora, the reference is the "
                    "actor's own frozen base)");
  }
  bool any = false;
  for (const auto& [role, model] :
       {std::pair{"actor", &actor}, std::pair{"reward", &reward}, std::pair{"critic", &critic}}) {
    if (!model->adapter.empty() && model->path.empty()) {
      return KeyError(absl::StrCat("models.", role, ".adapter"),
                      absl::StrCat("needs models.", role, ".path: the base model it adapts"));
    }
    if (!model->trains_adapters()) continue;
    if (rl && std::string(role) == "reward") {
      return KeyError(absl::StrCat("models.reward.", reward.lora.enabled() ? "lora" : "adapter"),
                      "is for a reward_model job, which trains the reward model");
    }
    any = true;
    if (model->placement.step_in_backward) {
      return KeyError(absl::StrCat("models.", role, ".placement.step_in_backward"),
                      "steps whole layers; with models." + std::string(role) +
                          ".lora only the adapters train (set it false)");
    }
  }
  for (const RewardSourceSpec& source : reward_sources) {
    if (source.model.lora.enabled()) {
      return KeyError(absl::StrCat("reward.sources (", source.name, ").lora"),
                      "is not allowed: a reward source never trains");
    }
  }
  if (merge_lora && !any) return KeyError("output.merge_lora", "needs LoRA (models.<role>.lora) on the trained model");
  return absl::OkStatus();
}

absl::Status JobSpec::ValidateGalore() const {
  const bool rl = algorithm != Algorithm::kSft && algorithm != Algorithm::kRewardModel;
  if (reference.galore.enabled())
    return KeyError("models.reference.galore", "is not allowed: the reference never trains");
  for (const auto& [role, model] :
       {std::pair{"actor", &actor}, std::pair{"reward", &reward}, std::pair{"critic", &critic}}) {
    if (!model->galore.enabled()) continue;
    const std::string key = absl::StrCat("models.", role, ".galore");
    if (rl && std::string(role) == "reward")
      return KeyError(key, "is for a reward_model job, which trains the reward model");
    if (model->trains_adapters()) {
      return KeyError(key, absl::StrCat("trains every parameter; with models.", role, ".",
                                        model->lora.enabled() ? "lora" : "adapter", " only the adapters train"));
    }
  }
  for (const RewardSourceSpec& source : reward_sources) {
    if (source.model.galore.enabled()) {
      return KeyError(absl::StrCat("reward.sources (", source.name, ").galore"),
                      "is not allowed: a reward source never trains");
    }
  }
  return absl::OkStatus();
}

absl::Status JobSpec::Validate() const {
  auto need = [](const std::string& key, const std::string& value) -> absl::Status {
    if (value.empty()) return KeyError(key, "is required");
    return absl::OkStatus();
  };
  STRATA_RETURN_IF_ERROR(need("output.dir", output_dir));
  STRATA_RETURN_IF_ERROR(need("data.train", data.train));
  if (train.iterations < 1) return KeyError("train.iterations", absl::StrCat("must be >= 1, got ", train.iterations));
  if (train.batch_size < 1) return KeyError("train.batch_size", absl::StrCat("must be >= 1, got ", train.batch_size));
  // Far past any machine, and products of these counts cannot overflow
  // (the service's row limits multiply them).
  constexpr int64_t kMaxCount = int64_t{1} << 24;
  if (train.batch_size > kMaxCount) {
    return KeyError("train.batch_size", absl::StrCat("must be <= ", kMaxCount, ", got ", train.batch_size));
  }
  if (!(train.lr >= 0)) return KeyError("train.lr", absl::StrCat("must be >= 0, got ", train.lr));
  if (!(train.weight_decay >= 0)) return KeyError("train.weight_decay", "must be >= 0");
  if (!(train.max_grad_norm >= 0)) return KeyError("train.max_grad_norm", "must be >= 0 (0: no clipping)");
  if (train.lr_schedule != "constant" && train.lr_schedule != "linear" && train.lr_schedule != "cosine") {
    return KeyError("train.lr_schedule",
                    absl::StrCat("must be constant, linear or cosine, got '", Shown(train.lr_schedule), "'"));
  }
  if (train.micro_batch_size < 0) return KeyError("train.micro_batch_size", "must be >= 0 (0: the whole batch)");
  if (train.reward_normalization != "none" && train.reward_normalization != "batch" &&
      train.reward_normalization != "running") {
    return KeyError("train.reward_normalization",
                    absl::StrCat("must be none, batch or running, got '", Shown(train.reward_normalization), "'"));
  }
  if (train.warmup_iterations < 0 || train.warmup_iterations > train.iterations) {
    return KeyError("train.warmup_iterations", absl::StrCat("must be in [0, train.iterations (", train.iterations,
                                                            ")], got ", train.warmup_iterations));
  }
  if (train.log_every < 1) return KeyError("train.log_every", "must be >= 1");
  if (data.max_prompt_tokens < 1) return KeyError("data.max_prompt_tokens", "must be >= 1");
  if (eval.samples_per_prompt < 1 || eval.samples_per_prompt > 64) {
    return KeyError("eval.samples_per_prompt", "must be in [1, 64]");
  }
  if (eval.greedy && eval.samples_per_prompt != 1) {
    return KeyError("eval.samples_per_prompt",
                    absl::StrCat("must be 1 with eval.greedy: true (greedy responses are all the same), got ",
                                 eval.samples_per_prompt));
  }
  if (data.max_response_tokens < 1) return KeyError("data.max_response_tokens", "must be >= 1");
  for (const auto& [key, value] :
       {std::pair{"data.prompt_key", &data.prompt_key}, std::pair{"data.response_key", &data.response_key},
        std::pair{"data.chosen_key", &data.chosen_key}, std::pair{"data.rejected_key", &data.rejected_key}}) {
    if (value->empty()) return KeyError(key, "must not be empty");
  }
  if (data.overlong_prompts != "truncate_left" && data.overlong_prompts != "drop") {
    return KeyError("data.overlong_prompts",
                    absl::StrCat("must be truncate_left or drop, got '", Shown(data.overlong_prompts), "'"));
  }
  if (!data.template_date.empty() && !IsIsoDateTime(data.template_date)) {
    return KeyError("data.template_date",
                    absl::StrCat("must be an ISO 8601 date and time (2026-11-27T15:40:00+00:00), got '",
                                 Shown(data.template_date), "'"));
  }
  for (size_t i = 0; i < generation.stop_token_ids.size(); ++i) {
    if (generation.stop_token_ids[i] < 0) {
      return KeyError(absl::StrCat("generation.stop_token_ids[", i, "]"), "must be >= 0");
    }
  }
  if (generation.max_new_tokens < 1) return KeyError("generation.max_new_tokens", "must be >= 1");
  if (!(generation.temperature > 0)) return KeyError("generation.temperature", "must be > 0");
  if (!(generation.top_p > 0 && generation.top_p <= 1)) return KeyError("generation.top_p", "must be in (0, 1]");
  if (generation.top_k < 0) return KeyError("generation.top_k", "must be >= 0");
  STRATA_RETURN_IF_ERROR(generation.engine.Validate("generation"));
  if (eval.every < 0) return KeyError("eval.every", "must be >= 0");
  if (eval.prompts < 1) return KeyError("eval.prompts", "must be >= 1");
  if (checkpoint.every < 0) return KeyError("checkpoint.every", "must be >= 0");
  if (parallel.workers < 1) return KeyError("parallel.workers", absl::StrCat("must be >= 1, got ", parallel.workers));
  if (parallel.workers > train.batch_size) {
    return KeyError("parallel.workers", absl::StrCat("(", parallel.workers, ") must not exceed train.batch_size (",
                                                     train.batch_size, "): every rank needs a share of the batch"));
  }
  for (const auto& [role, model] :
       {std::pair{"actor", &actor}, std::pair{"reward", &reward}, std::pair{"critic", &critic}}) {
    if (!model->placement.step_in_backward) continue;
    const std::string key = absl::StrCat("models.", role, ".placement.step_in_backward");
    if (train.max_grad_norm > 0) {
      return KeyError(key, "needs train.max_grad_norm: 0 (clipping needs the whole gradient before any layer steps)");
    }
    if (train.micro_batch_size > 0 && train.micro_batch_size < train.batch_size) {
      return KeyError(key, "needs train.micro_batch_size: 0 (each micro-batch would step the layers)");
    }
    if (parallel.workers > 1) {
      return KeyError(key, "needs parallel.workers: 1 (a layer steps before the gang's gradient sum)");
    }
  }
  // Activations are kept by a training step only: elsewhere the key would
  // promise an offload that never happens.
  {
    const bool rl = algorithm != Algorithm::kSft && algorithm != Algorithm::kRewardModel;
    std::vector<std::pair<std::string, const ModelSpec*>> scoring = {{"models.reference", &reference}};
    if (rl) scoring.emplace_back("models.reward", &reward);
    for (const RewardSourceSpec& source : reward_sources) {
      scoring.emplace_back(absl::StrCat("reward.sources (", source.name, ")"), &source.model);
    }
    for (const auto& [key, model] : scoring) {
      if (model->placement.activations != offload::Tier::kDevice) {
        return KeyError(key + ".placement.activations", "is for a model that trains; this one only scores");
      }
    }
  }
  STRATA_RETURN_IF_ERROR(ValidateLora());
  STRATA_RETURN_IF_ERROR(ValidateGalore());
  const absl::StatusOr<int> device = offload::ParseDeviceName(memory.device);  // -1: the CPU
  if (!device.ok()) return KeyError("memory.device", std::string(device.status().message()));
  if (*device != memory.device_index) {
    return KeyError("memory.device",
                    absl::StrCat("'", memory.device, "' names device ", *device, " but the spec carries device_index ",
                                 memory.device_index, " (set both when building a spec in code)"));
  }
  if (parallel.backend != "auto" && parallel.backend != "gloo" && parallel.backend != "nccl") {
    return KeyError("parallel.backend", absl::StrCat("'", parallel.backend, "' is not one of auto, gloo, nccl"));
  }
  if (parallel.backend == "nccl" && *device < 0) {
    return KeyError("parallel.backend",
                    absl::StrCat("nccl needs a GPU (memory.device: cuda), got memory.device: ", memory.device));
  }
  // At most 2^30 MiB (1 PiB): byte counts stay far inside int64.
  constexpr int64_t kMaxMib = int64_t{1} << 30;
  if (memory.device_mib < 0 || memory.device_mib > kMaxMib) {
    return KeyError("memory.device_mib", "must be in [0, 1073741824] (MiB)");
  }
  if (memory.host_mib < 1 || memory.host_mib > kMaxMib) {
    return KeyError("memory.host_mib", "must be in [1, 1073741824] (MiB)");
  }
  if (!(remax.discount > 0 && remax.discount <= 1)) return KeyError("remax.discount", "must be in (0, 1]");
  if (!(remax.kl_coef >= 0)) return KeyError("remax.kl_coef", "must be >= 0");
  if (!(ppo.kl_coef >= 0)) return KeyError("ppo.kl_coef", "must be >= 0");
  if (!(ppo.gamma > 0 && ppo.gamma <= 1)) return KeyError("ppo.gamma", "must be in (0, 1]");
  if (!(ppo.lambda >= 0 && ppo.lambda <= 1)) return KeyError("ppo.lambda", "must be in [0, 1]");
  if (!(ppo.clip_range > 0)) return KeyError("ppo.clip_range", "must be > 0");
  if (!(ppo.value_clip > 0)) return KeyError("ppo.value_clip", "must be > 0");
  if (ppo.epochs < 1) return KeyError("ppo.epochs", "must be >= 1");
  if (ppo.minibatches < 1) return KeyError("ppo.minibatches", "must be >= 1");
  if (train.batch_size % ppo.minibatches != 0 && algorithm == Algorithm::kPpo) {
    return KeyError("ppo.minibatches", absl::StrCat("must divide train.batch_size (", train.batch_size, ")"));
  }
  if (!(ppo.critic_lr >= 0)) return KeyError("ppo.critic_lr", "must be >= 0");
  if (group.samples_per_prompt < 2) return KeyError("group.samples_per_prompt", "must be >= 2");
  if (group.samples_per_prompt > kMaxCount) {
    return KeyError("group.samples_per_prompt", absl::StrCat("must be <= ", kMaxCount));
  }
  for (const auto& [key, name] :
       {std::pair{"remax.kl_estimator", remax.kl_estimator}, std::pair{"ppo.kl_estimator", ppo.kl_estimator},
        std::pair{"group.kl_estimator", group.kl_estimator}}) {
    if (name != "k1" && name != "k2" && name != "k3") {
      return KeyError(key, absl::StrCat("must be k1, k2 or k3, got '", Shown(name), "'"));
    }
  }
  switch (algorithm) {
    case Algorithm::kSft:
      if (actor.path.empty() && actor.init.empty())
        return KeyError("models.actor.path", "or models.actor.init is required");
      break;
    case Algorithm::kRewardModel:
      if (reward.path.empty() && reward.init.empty()) {
        return KeyError("models.reward.path", "or models.reward.init is required");
      }
      if (!reward.rule.empty()) return KeyError("models.reward.rule", "cannot be trained: give a path or init");
      break;
    case Algorithm::kPpo:
    case Algorithm::kRemax:
    case Algorithm::kGrpo:
    case Algorithm::kRloo:
      STRATA_RETURN_IF_ERROR(need("models.actor.path", actor.path));
      if (!reward.path.empty() && !reward.rule.empty()) {
        return KeyError("models.reward", "takes a path or a rule, not both");
      }
      if (reward_sources.empty()) {
        return KeyError("reward.sources", "(or the shorthand models.reward.path or models.reward.rule) is required");
      }
      STRATA_RETURN_IF_ERROR(ValidateRewardSources(reward_sources));
      break;
  }
  if (algorithm == Algorithm::kRewardModel && !reward_sources.empty()) {
    return KeyError("reward.sources", "is for RL jobs; a reward_model job trains models.reward");
  }
  return absl::OkStatus();
}

std::string DefaultCriticPath(const JobSpec& spec) {
  if (!spec.critic.path.empty()) return spec.critic.path;
  for (const RewardSourceSpec& source : spec.reward_sources) {
    if (source.kind == "model") return source.model.path;
  }
  return spec.actor.path;
}

bool JobSpec::UsesNvme() const {
  std::vector<const ModelSpec*> models = {&actor, &reference, &reward, &critic};
  for (const RewardSourceSpec& source : reward_sources) models.push_back(&source.model);
  for (const ModelSpec* m : models) {
    const offload::ModelPlacement& p = m->placement;
    if (p.weights == offload::Tier::kNvme || p.optimizer == offload::Tier::kNvme ||
        p.activations == offload::Tier::kNvme) {
      return true;
    }
  }
  return false;
}

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text, const std::vector<std::string>& overrides,
                                     const std::string& source) {
  STRATA_ASSIGN_OR_RETURN(YAML::Node root, LoadWithOverrides(yaml_text, overrides, source));

  auto with_source = [&](absl::Status s) {
    return s.ok() ? s : absl::Status(s.code(), absl::StrCat(source, ": ", s.message()));
  };
  JobSpec spec;
  MapReader r(root, "");
  std::string algorithm;
  if (auto s = r.Read("algorithm", &algorithm); !s.ok()) return with_source(s);
  const std::map<std::string, Algorithm> algorithms = {
      {"sft", Algorithm::kSft},     {"reward_model", Algorithm::kRewardModel},
      {"remax", Algorithm::kRemax}, {"ppo", Algorithm::kPpo},
      {"grpo", Algorithm::kGrpo},   {"rloo", Algorithm::kRloo}};
  if (algorithm.empty()) return with_source(KeyError("algorithm", "is required"));
  auto it = algorithms.find(algorithm);
  if (it == algorithms.end()) {
    return with_source(KeyError(
        "algorithm", absl::StrCat("'", Shown(algorithm), "' is not one of sft, reward_model, remax, ppo, grpo, rloo")));
  }
  spec.algorithm = it->second;

  auto body = [&]() -> absl::Status {
    STRATA_RETURN_IF_ERROR(r.Read("name", &spec.name));
    STRATA_ASSIGN_OR_RETURN(auto models, r.Child("models"));
    STRATA_RETURN_IF_ERROR(ReadModel(models, "actor", &spec.actor));
    STRATA_RETURN_IF_ERROR(ReadModel(models, "reference", &spec.reference));
    STRATA_RETURN_IF_ERROR(ReadModel(models, "reward", &spec.reward));
    STRATA_RETURN_IF_ERROR(ReadModel(models, "critic", &spec.critic));
    STRATA_RETURN_IF_ERROR(models.CheckNoUnknownKeys());
    STRATA_ASSIGN_OR_RETURN(auto reward, r.Child("reward"));
    STRATA_RETURN_IF_ERROR(reward.ReadMaps("sources", [&](MapReader& m) {
      spec.reward_sources.emplace_back();
      return ReadRewardSource(m, &spec.reward_sources.back());
    }));
    STRATA_RETURN_IF_ERROR(reward.CheckNoUnknownKeys());
    const bool shorthand = !spec.reward.path.empty() || !spec.reward.rule.empty();
    if (!spec.reward_sources.empty() && shorthand) {
      return absl::InvalidArgumentError(
          "spec keys 'models.reward' and 'reward.sources': give one (models.reward is the shorthand for one reward "
          "model or rule)");
    }

    STRATA_ASSIGN_OR_RETURN(auto data, r.Child("data"));
    STRATA_RETURN_IF_ERROR(data.Read("train", &spec.data.train));
    STRATA_RETURN_IF_ERROR(data.Read("eval", &spec.data.eval));
    STRATA_RETURN_IF_ERROR(data.Read("tokenizer", &spec.data.tokenizer));
    STRATA_RETURN_IF_ERROR(data.Read("max_prompt_tokens", &spec.data.max_prompt_tokens));
    STRATA_RETURN_IF_ERROR(data.Read("max_response_tokens", &spec.data.max_response_tokens));
    STRATA_RETURN_IF_ERROR(data.Read("prompt_key", &spec.data.prompt_key));
    STRATA_RETURN_IF_ERROR(data.Read("label_key", &spec.data.label_key));
    STRATA_RETURN_IF_ERROR(data.Read("response_key", &spec.data.response_key));
    STRATA_RETURN_IF_ERROR(data.Read("chosen_key", &spec.data.chosen_key));
    STRATA_RETURN_IF_ERROR(data.Read("rejected_key", &spec.data.rejected_key));
    STRATA_RETURN_IF_ERROR(data.Read("apply_chat_template", &spec.data.apply_chat_template));
    STRATA_RETURN_IF_ERROR(data.Read("chat_template_file", &spec.data.chat_template_file));
    STRATA_RETURN_IF_ERROR(data.Read("chat_template_name", &spec.data.chat_template_name));
    STRATA_RETURN_IF_ERROR(data.ReadJsonObject("template_args", &spec.data.template_args_json));
    STRATA_RETURN_IF_ERROR(data.Read("template_date", &spec.data.template_date));
    STRATA_RETURN_IF_ERROR(data.Read("overlong_prompts", &spec.data.overlong_prompts));
    STRATA_RETURN_IF_ERROR(data.CheckNoUnknownKeys());

    STRATA_ASSIGN_OR_RETURN(auto train, r.Child("train"));
    STRATA_RETURN_IF_ERROR(train.Read("iterations", &spec.train.iterations));
    STRATA_RETURN_IF_ERROR(train.Read("batch_size", &spec.train.batch_size));
    STRATA_RETURN_IF_ERROR(train.Read("lr", &spec.train.lr));
    STRATA_RETURN_IF_ERROR(train.Read("weight_decay", &spec.train.weight_decay));
    STRATA_RETURN_IF_ERROR(train.Read("max_grad_norm", &spec.train.max_grad_norm));
    STRATA_RETURN_IF_ERROR(train.Read("lr_schedule", &spec.train.lr_schedule));
    STRATA_RETURN_IF_ERROR(train.Read("warmup_iterations", &spec.train.warmup_iterations));
    STRATA_RETURN_IF_ERROR(train.Read("reward_normalization", &spec.train.reward_normalization));
    STRATA_RETURN_IF_ERROR(train.Read("micro_batch_size", &spec.train.micro_batch_size));
    STRATA_RETURN_IF_ERROR(train.Read("seed", &spec.train.seed));
    STRATA_RETURN_IF_ERROR(train.Read("log_every", &spec.train.log_every));
    STRATA_RETURN_IF_ERROR(train.CheckNoUnknownKeys());

    STRATA_ASSIGN_OR_RETURN(auto gen, r.Child("generation"));
    STRATA_RETURN_IF_ERROR(gen.Read("max_new_tokens", &spec.generation.max_new_tokens));
    STRATA_RETURN_IF_ERROR(gen.Read("temperature", &spec.generation.temperature));
    STRATA_RETURN_IF_ERROR(gen.Read("top_p", &spec.generation.top_p));
    STRATA_RETURN_IF_ERROR(gen.Read("top_k", &spec.generation.top_k));
    STRATA_RETURN_IF_ERROR(gen.ReadList("stop_token_ids", &spec.generation.stop_token_ids));
    STRATA_RETURN_IF_ERROR(gen.Read("kv_block_tokens", &spec.generation.engine.kv_block_tokens));
    STRATA_RETURN_IF_ERROR(gen.Read("kv_pool_mib", &spec.generation.engine.kv_pool_mib));
    STRATA_RETURN_IF_ERROR(gen.Read("max_concurrency", &spec.generation.engine.max_concurrency));
    STRATA_RETURN_IF_ERROR(gen.Read("share_prefixes", &spec.generation.engine.share_prefixes));
    STRATA_RETURN_IF_ERROR(gen.Read("cuda_graphs", &spec.generation.engine.cuda_graphs));
    STRATA_RETURN_IF_ERROR(gen.CheckNoUnknownKeys());

    STRATA_ASSIGN_OR_RETURN(auto remax, r.Child("remax"));
    STRATA_RETURN_IF_ERROR(remax.Read("kl_coef", &spec.remax.kl_coef));
    STRATA_RETURN_IF_ERROR(remax.Read("kl_estimator", &spec.remax.kl_estimator));
    STRATA_RETURN_IF_ERROR(remax.Read("reward_clip", &spec.remax.reward_clip));
    STRATA_RETURN_IF_ERROR(remax.Read("discount", &spec.remax.discount));
    STRATA_RETURN_IF_ERROR(remax.CheckNoUnknownKeys());

    STRATA_ASSIGN_OR_RETURN(auto ppo, r.Child("ppo"));
    STRATA_RETURN_IF_ERROR(ppo.Read("kl_coef", &spec.ppo.kl_coef));
    STRATA_RETURN_IF_ERROR(ppo.Read("kl_estimator", &spec.ppo.kl_estimator));
    STRATA_RETURN_IF_ERROR(ppo.Read("kl_target", &spec.ppo.kl_target));
    STRATA_RETURN_IF_ERROR(ppo.Read("kl_horizon", &spec.ppo.kl_horizon));
    STRATA_RETURN_IF_ERROR(ppo.Read("reward_clip", &spec.ppo.reward_clip));
    STRATA_RETURN_IF_ERROR(ppo.Read("gamma", &spec.ppo.gamma));
    STRATA_RETURN_IF_ERROR(ppo.Read("lambda", &spec.ppo.lambda));
    STRATA_RETURN_IF_ERROR(ppo.Read("clip_range", &spec.ppo.clip_range));
    STRATA_RETURN_IF_ERROR(ppo.Read("value_clip", &spec.ppo.value_clip));
    STRATA_RETURN_IF_ERROR(ppo.Read("epochs", &spec.ppo.epochs));
    STRATA_RETURN_IF_ERROR(ppo.Read("minibatches", &spec.ppo.minibatches));
    STRATA_RETURN_IF_ERROR(ppo.Read("whiten_advantages", &spec.ppo.whiten_advantages));
    STRATA_RETURN_IF_ERROR(ppo.Read("critic_lr", &spec.ppo.critic_lr));
    STRATA_RETURN_IF_ERROR(ppo.CheckNoUnknownKeys());

    STRATA_ASSIGN_OR_RETURN(auto group, r.Child("group"));
    STRATA_RETURN_IF_ERROR(group.Read("samples_per_prompt", &spec.group.samples_per_prompt));
    STRATA_RETURN_IF_ERROR(group.Read("kl_coef", &spec.group.kl_coef));
    STRATA_RETURN_IF_ERROR(group.Read("kl_estimator", &spec.group.kl_estimator));
    STRATA_RETURN_IF_ERROR(group.Read("reward_clip", &spec.group.reward_clip));
    STRATA_RETURN_IF_ERROR(group.CheckNoUnknownKeys());

    STRATA_ASSIGN_OR_RETURN(auto eval, r.Child("eval"));
    STRATA_RETURN_IF_ERROR(eval.Read("every", &spec.eval.every));
    STRATA_RETURN_IF_ERROR(eval.Read("rule", &spec.eval.rule));
    STRATA_RETURN_IF_ERROR(eval.Read("prompts", &spec.eval.prompts));
    STRATA_RETURN_IF_ERROR(eval.Read("samples_per_prompt", &spec.eval.samples_per_prompt));
    STRATA_RETURN_IF_ERROR(eval.Read("greedy", &spec.eval.greedy));
    STRATA_RETURN_IF_ERROR(eval.CheckNoUnknownKeys());

    STRATA_ASSIGN_OR_RETURN(auto checkpoint, r.Child("checkpoint"));
    STRATA_RETURN_IF_ERROR(checkpoint.Read("every", &spec.checkpoint.every));
    STRATA_RETURN_IF_ERROR(checkpoint.Read("dir", &spec.checkpoint.dir));
    STRATA_RETURN_IF_ERROR(checkpoint.CheckNoUnknownKeys());

    STRATA_ASSIGN_OR_RETURN(auto memory, r.Child("memory"));
    STRATA_RETURN_IF_ERROR(memory.Read("device", &spec.memory.device));
    if (auto index = offload::ParseDeviceName(spec.memory.device); index.ok()) spec.memory.device_index = *index;
    STRATA_RETURN_IF_ERROR(memory.Read("device_mib", &spec.memory.device_mib));
    STRATA_RETURN_IF_ERROR(memory.Read("host_mib", &spec.memory.host_mib));
    STRATA_RETURN_IF_ERROR(memory.Read("nvme_dir", &spec.memory.nvme_dir));
    STRATA_RETURN_IF_ERROR(memory.Read("pin_host", &spec.memory.pin_host));
    STRATA_RETURN_IF_ERROR(memory.CheckNoUnknownKeys());

    STRATA_ASSIGN_OR_RETURN(auto parallel, r.Child("parallel"));
    STRATA_RETURN_IF_ERROR(parallel.Read("workers", &spec.parallel.workers));
    STRATA_RETURN_IF_ERROR(parallel.Read("backend", &spec.parallel.backend));
    STRATA_RETURN_IF_ERROR(parallel.CheckNoUnknownKeys());

    STRATA_ASSIGN_OR_RETURN(auto output, r.Child("output"));
    STRATA_RETURN_IF_ERROR(output.Read("dir", &spec.output_dir));
    STRATA_RETURN_IF_ERROR(output.Read("merge_lora", &spec.merge_lora));
    STRATA_RETURN_IF_ERROR(output.CheckNoUnknownKeys());
    STRATA_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
    if (spec.checkpoint.dir.empty() && !spec.output_dir.empty()) spec.checkpoint.dir = spec.output_dir + "/checkpoints";
    const bool rl = spec.algorithm != Algorithm::kSft && spec.algorithm != Algorithm::kRewardModel;
    if (rl && spec.reward_sources.empty()) {
      if (auto source = ShorthandSource(spec.reward)) spec.reward_sources.push_back(*std::move(source));
    }
    return spec.Validate();
  };
  if (auto s = body(); !s.ok()) return with_source(s);
  return spec;
}

JobSpec ResolvePaths(const JobSpec& spec, const std::string& base) {
  JobSpec out = spec;
  auto fix = [&](std::string& path) {
    if (!path.empty() && path[0] != '/') path = JoinPath(base, path);
  };
  for (ModelSpec* m : {&out.actor, &out.reference, &out.reward, &out.critic}) {
    fix(m->path);
    fix(m->init);
    fix(m->adapter);
  }
  fix(out.data.train);
  fix(out.data.eval);
  fix(out.data.tokenizer);
  fix(out.data.chat_template_file);
  for (RewardSourceSpec& source : out.reward_sources) {
    fix(source.model.path);
    fix(source.ca_file);
  }
  fix(out.output_dir);
  fix(out.checkpoint.dir);
  fix(out.memory.nvme_dir);
  return out;
}

std::string TemplateDateOf(int64_t unix_ms) {
  const std::time_t seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S+00:00", &utc);
  return text;
}

int64_t RowsPerIteration(const JobSpec& spec) {
  switch (spec.algorithm) {
    case Algorithm::kRemax:
      return spec.train.batch_size * 2;
    case Algorithm::kGrpo:
    case Algorithm::kRloo:
      return spec.train.batch_size * spec.group.samples_per_prompt;
    case Algorithm::kRewardModel:
      return spec.train.batch_size * 2;
    case Algorithm::kSft:
    case Algorithm::kPpo:
      return spec.train.batch_size;
  }
  return spec.train.batch_size;
}

int64_t RowsPerRank(const JobSpec& spec) {
  const int64_t workers = std::max<int64_t>(spec.parallel.workers, 1);
  const int64_t prompts = (spec.train.batch_size + workers - 1) / workers;
  return RowsPerIteration(spec) / std::max<int64_t>(spec.train.batch_size, 1) * prompts;
}

absl::Status CheckJobLimits(const JobSpec& spec, const JobLimits& limits, const std::string& who) {
  const int64_t rows = RowsPerRank(spec);
  // "rows (train.batch_size B over parallel.workers N x group.samples_per_prompt S)"
  const bool group = spec.algorithm == Algorithm::kGrpo || spec.algorithm == Algorithm::kRloo;
  const int64_t responses = RowsPerIteration(spec) / std::max<int64_t>(spec.train.batch_size, 1);
  const std::string counted =
      absl::StrCat(rows, " rows (train.batch_size ", spec.train.batch_size,
                   spec.parallel.workers > 1 ? absl::StrCat(" over parallel.workers ", spec.parallel.workers) : "",
                   group ? absl::StrCat(" x group.samples_per_prompt ", spec.group.samples_per_prompt)
                         : (responses > 1 ? absl::StrCat(" x ", responses, " responses") : ""),
                   ")");
  if (limits.max_rows > 0 && rows > limits.max_rows) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "spec key '", group ? "group.samples_per_prompt" : "train.batch_size", "': an iteration would decode ", counted,
        " on a worker; ", who, " at most ", limits.max_rows, " (more parallel.workers spread them)"));
  }
  // Activations, logits and the KV cache grow with tokens, not rows.
  const int64_t per_row = spec.data.max_prompt_tokens +
                          std::max(spec.generation.max_new_tokens, spec.data.max_response_tokens);
  if (limits.max_tokens > 0 && rows > limits.max_tokens / std::max<int64_t>(per_row, 1)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("spec keys 'data.max_prompt_tokens' + 'generation.max_new_tokens' (", per_row, " tokens a row) x ",
                     counted, " on a worker exceed what ", who, " (", limits.max_tokens, " tokens)"));
  }
  if (limits.max_host_mib > 0 && spec.memory.host_mib > limits.max_host_mib) {
    return absl::ResourceExhaustedError(absl::StrCat("spec key 'memory.host_mib' (", spec.memory.host_mib,
                                                     ") exceeds what ", who, " (", limits.max_host_mib, " MiB)"));
  }
  if (limits.max_device_mib > 0 && spec.memory.device_mib > limits.max_device_mib) {
    return absl::ResourceExhaustedError(absl::StrCat("spec key 'memory.device_mib' (", spec.memory.device_mib,
                                                     ") exceeds what ", who, " (", limits.max_device_mib, " MiB)"));
  }
  return absl::OkStatus();
}

absl::Status CheckPathsWithin(const JobSpec& spec, const std::string& base, const std::vector<std::string>& roots,
                              bool lexical) {
  namespace fs = std::filesystem;
  // "/a/b/" and "/a/b" name one directory.
  auto normal = [](const fs::path& p) {
    fs::path n = p.lexically_normal();
    return !n.has_filename() && n != n.root_path() ? n.parent_path() : n;
  };
  std::vector<fs::path> allowed;
  for (const std::string& root : roots) {
    std::error_code ec;
    fs::path canonical = lexical ? normal(fs::path(base) / root) : fs::weakly_canonical(fs::absolute(root, ec), ec);
    if (!ec) allowed.push_back(canonical);
  }
  auto inside = [&](const std::string& path) {
    std::error_code ec;
    const fs::path p = path[0] == '/' ? fs::path(path) : fs::path(base) / path;
    // Symlinks are followed as far as the path exists; ".." is folded after.
    const fs::path resolved = lexical ? normal(p) : fs::weakly_canonical(p, ec);
    if (ec) return false;
    for (const fs::path& root : allowed) {
      const fs::path rel = resolved.lexically_relative(root);
      if (!rel.empty() && *rel.begin() != "..") return true;
    }
    return false;
  };
  std::vector<std::pair<std::string, const std::string*>> keys = {
      {"data.train", &spec.data.train},          {"data.eval", &spec.data.eval},
      {"data.tokenizer", &spec.data.tokenizer},  {"data.chat_template_file", &spec.data.chat_template_file},
      {"output.dir", &spec.output_dir},          {"checkpoint.dir", &spec.checkpoint.dir},
      {"memory.nvme_dir", &spec.memory.nvme_dir}};
  for (const auto& [name, model] : {std::pair<const char*, const ModelSpec*>{"actor", &spec.actor},
                                    {"reference", &spec.reference},
                                    {"reward", &spec.reward},
                                    {"critic", &spec.critic}}) {
    keys.push_back({absl::StrCat("models.", name, ".path"), &model->path});
    keys.push_back({absl::StrCat("models.", name, ".init"), &model->init});
    keys.push_back({absl::StrCat("models.", name, ".adapter"), &model->adapter});
  }
  for (size_t i = 0; i < spec.reward_sources.size(); ++i) {
    keys.push_back({absl::StrCat("reward.sources[", i, "].path"), &spec.reward_sources[i].model.path});
    keys.push_back({absl::StrCat("reward.sources[", i, "].ca_file"), &spec.reward_sources[i].ca_file});
  }
  for (const auto& [key, path] : keys) {
    if (path->empty() || inside(*path)) continue;
    return absl::PermissionDeniedError(absl::StrCat("spec key '", key, "': ", Shown(*path),
                                                    " is outside the directories this worker serves (",
                                                    absl::StrJoin(roots, ", "), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ApplyOverrides(const std::string& yaml_text, const std::vector<std::string>& overrides,
                                           const std::string& source) {
  STRATA_ASSIGN_OR_RETURN(YAML::Node root, LoadWithOverrides(yaml_text, overrides, source));
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str());
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path, const std::vector<std::string>& overrides) {
  STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(path));
  return ParseJobSpec(text, overrides, path);
}

double LearningRateScale(const TrainSpec& train, int64_t iteration) {
  const int64_t warmup = train.warmup_iterations;
  if (iteration < warmup) return static_cast<double>(iteration + 1) / static_cast<double>(warmup);
  if (train.lr_schedule == "constant") return 1.0;
  const double span = static_cast<double>(std::max<int64_t>(1, train.iterations - warmup));
  const double progress = std::clamp(static_cast<double>(iteration - warmup) / span, 0.0, 1.0);
  if (train.lr_schedule == "linear") return 1.0 - progress;
  return 0.5 * (1.0 + std::cos(M_PI * progress));  // cosine
}

}  // namespace strata::policies
