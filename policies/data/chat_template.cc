#include "policies/data/chat_template.h"

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/status_macros.h"

namespace strata::policies {
namespace {

using Json = nlohmann::ordered_json;

// A special token's text: a string, or an AddedToken object by its content.
std::optional<std::string> TokenText(const Json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return std::nullopt;
}

Json SpecialTokens(const Json& config) {
  Json tokens = Json::object();
  for (const char* name :
       {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!config.contains(name)) continue;
    if (auto text = TokenText(config[name])) tokens[name] = *text;
  }
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
    Json list = Json::array();
    for (const Json& t : config["additional_special_tokens"]) {
      if (auto text = TokenText(t)) list.push_back(*text);
    }
    tokens["additional_special_tokens"] = std::move(list);
  }
  return tokens;
}

absl::StatusOr<std::string> NamedTemplate(const Json& templates, const std::string& name, const std::string& where) {
  std::vector<std::string> names;
  for (const Json& entry : templates) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
        !entry["template"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": each chat_template entry must be {\"name\": string, \"template\": string}"));
    }
    if (entry["name"] == name) return entry["template"].get<std::string>();
    names.push_back(entry["name"].get<std::string>());
  }
  return absl::NotFoundError(absl::StrCat(where, ": no chat template named '", name,
                                          "' (it has: ", absl::StrJoin(names, ", "), "); set data.chat_template_name"));
}

}  // namespace

absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& tokenizer_path, const ChatTemplateChoice& choice) {
  const std::string dir = IsDirectory(tokenizer_path) ? tokenizer_path
                                                      : std::filesystem::path(tokenizer_path).parent_path().string();
  ChatTemplate out;
  Json config = Json::object();
  const std::string config_path = JoinPath(dir, "tokenizer_config.json");
  if (IsRegularFile(config_path)) {
    STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(config_path));
    config = Json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
    }
    out.special_tokens = SpecialTokens(config);
  }
  if (!choice.file.empty()) {
    STRATA_ASSIGN_OR_RETURN(out.text, ReadFileToString(choice.file));
    out.origin = choice.file;
    return out;
  }
  const std::string name = choice.name.empty() ? "default" : choice.name;
  // transformers reads chat_template.jinja in preference to the config's.
  const std::string jinja_path = JoinPath(dir, "chat_template.jinja");
  if (name == "default" && IsRegularFile(jinja_path)) {
    STRATA_ASSIGN_OR_RETURN(out.text, ReadFileToString(jinja_path));
    out.origin = jinja_path;
    return out;
  }
  const std::string where = absl::StrCat(config_path, " (chat_template)");
  if (config.contains("chat_template") && config["chat_template"].is_string()) {
    if (name != "default") {
      return absl::NotFoundError(
          absl::StrCat(where, ": has one unnamed template, not '", name, "'; leave data.chat_template_name unset"));
    }
    out.text = config["chat_template"].get<std::string>();
  } else if (config.contains("chat_template") && config["chat_template"].is_array()) {
    STRATA_ASSIGN_OR_RETURN(out.text, NamedTemplate(config["chat_template"], name, where));
  } else if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": must be a string or a list of named templates"));
  } else {
    return absl::NotFoundError(absl::StrCat(dir,
                                            ": the model has no chat template (no chat_template in "
                                            "tokenizer_config.json, no chat_template.jinja); give one with "
                                            "data.chat_template_file"));
  }
  out.origin = where;
  return out;
}

}  // namespace strata::policies
