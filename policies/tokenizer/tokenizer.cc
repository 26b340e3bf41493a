#include "policies/tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "policies/tokenizer/bpe_tokenizer.h"
#include "policies/tokenizer/sentencepiece_model.h"

namespace strata::policies {
namespace {

using Json = nlohmann::json;

absl::Status FieldError(const std::string& path, const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": field \"", field, "\" ", what));
}

absl::Status ReadOptionalBool(const Json& root, const std::string& field, const std::string& path,
                              std::optional<bool>* out) {
  const auto it = root.find(field);
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return FieldError(path, field, "must be a boolean");
  *out = it->get<bool>();
  return absl::OkStatus();
}

// Special tokens appear either as a plain string or as a serialized
// AddedToken object ({"__type": "AddedToken", "content": "<s>", ...}).
absl::Status ReadOptionalToken(const Json& root, const std::string& field, const std::string& path,
                               std::optional<std::string>* out) {
  const auto it = root.find(field);
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  if (it->is_string()) {
    *out = it->get<std::string>();
    return absl::OkStatus();
  }
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) {
      *out = content->get<std::string>();
      return absl::OkStatus();
    }
  }
  return FieldError(path, field, "must be a string or an object with a string \"content\"");
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

absl::StatusOr<TokenizerConfig> ParseTokenizerConfig(const std::string& json_text, const std::string& path) {
  const Json root = Json::parse(json_text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON"));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected a JSON object"));
  }
  TokenizerConfig config;
  for (absl::Status status : {
           ReadOptionalBool(root, "add_bos_token", path, &config.add_bos_token),
           ReadOptionalBool(root, "add_eos_token", path, &config.add_eos_token),
           ReadOptionalToken(root, "bos_token", path, &config.bos_token),
           ReadOptionalToken(root, "eos_token", path, &config.eos_token),
           ReadOptionalToken(root, "pad_token", path, &config.pad_token),
       }) {
    if (!status.ok()) return status;
  }
  return config;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  std::string tokenizer_path;
  std::optional<TokenizerConfig> config;
  if (IsDirectory(path)) {
    const std::string config_path = JoinPath(path, "tokenizer_config.json");
    if (IsRegularFile(config_path)) {
      STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(config_path));
      STRATA_ASSIGN_OR_RETURN(config, ParseTokenizerConfig(text, config_path));
    }
    // tokenizer.json carries the added tokens and pre-tokenizer exactly as
    // the model was trained with, so it wins over tokenizer.model.
    for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
      const std::string candidate = JoinPath(path, name);
      if (IsRegularFile(candidate)) {
        tokenizer_path = candidate;
        break;
      }
    }
    if (tokenizer_path.empty()) {
      return absl::NotFoundError(absl::StrCat(path, ": no tokenizer.json or tokenizer.model in this directory"));
    }
  } else if (IsRegularFile(path)) {
    tokenizer_path = path;
  } else {
    return absl::NotFoundError(absl::StrCat(path, ": no such tokenizer file or directory"));
  }

  std::unique_ptr<Tokenizer> tokenizer;
  if (EndsWith(tokenizer_path, ".json")) {
    STRATA_ASSIGN_OR_RETURN(tokenizer, HfBpeTokenizer::FromFile(tokenizer_path));
  } else {
    absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> sp = SentencePieceTokenizer::FromFile(tokenizer_path);
    if (!sp.ok()) return sp.status();
    tokenizer = *std::move(sp);
  }
  if (config.has_value()) tokenizer->ApplyConfig(*config);
  return tokenizer;
}

void Tokenizer::ApplyConfig(const TokenizerConfig& config) {
  if (config.add_bos_token.has_value()) add_bos_ = *config.add_bos_token;
  if (config.add_eos_token.has_value()) add_eos_ = *config.add_eos_token;
}

std::vector<int32_t> Tokenizer::EncodeForPrompt(const std::string& text) const {
  std::vector<int32_t> ids = Encode(text);
  if (add_bos_ && bos_id() >= 0) ids.insert(ids.begin(), bos_id());
  return ids;
}

}  // namespace strata::policies
