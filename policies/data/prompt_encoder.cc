#include "policies/data/prompt_encoder.h"

namespace strata::policies {

PromptEncoder::PromptEncoder(const Tokenizer& tokenizer, const DataSpec& data)
    : tokenizer_(tokenizer),
      max_prompt_tokens_(static_cast<size_t>(data.max_prompt_tokens)),
      max_response_tokens_(static_cast<size_t>(data.max_response_tokens)),
      drop_overlong_(data.overlong_prompts == "drop"),
      eos_(tokenizer.eos_id()) {}

std::optional<std::vector<int32_t>> PromptEncoder::Prompt(const std::string& text) const {
  return FitPrompt(tokenizer_.EncodeForPrompt(text));
}

std::optional<std::vector<int32_t>> PromptEncoder::FitPrompt(std::vector<int32_t> ids) const {
  if (ids.size() <= max_prompt_tokens_) return ids;
  if (drop_overlong_) return std::nullopt;
  ids.erase(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(max_prompt_tokens_));
  return ids;
}

std::vector<int32_t> PromptEncoder::Response(const std::string& text) const {
  std::vector<int32_t> ids = tokenizer_.Encode(text);
  if (ids.size() + 1 > max_response_tokens_) ids.resize(max_response_tokens_ - 1);
  if (eos_ >= 0) ids.push_back(static_cast<int32_t>(eos_));
  return ids;
}

}  // namespace strata::policies
