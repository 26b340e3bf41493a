// Text of a job's examples -> the token ids its models see, cut to the
// lengths data.max_prompt_tokens and data.max_response_tokens allow.
#ifndef STRATA_POLICIES_DATA_PROMPT_ENCODER_H_
#define STRATA_POLICIES_DATA_PROMPT_ENCODER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "policies/job/job_spec.h"
#include "policies/tokenizer/tokenizer.h"

namespace strata::policies {

// Thread-safe once built (the tokenizer's const methods are). `tokenizer`
// must outlive the encoder.
class PromptEncoder {
 public:
  PromptEncoder(const Tokenizer& tokenizer, const DataSpec& data);

  // A prompt as the policy continues it: raw text through
  // Tokenizer::EncodeForPrompt, then FitPrompt.
  std::optional<std::vector<int32_t>> Prompt(const std::string& text) const;
  // Prompt ids within max_prompt_tokens, by data.overlong_prompts: an
  // over-long prompt keeps its last max_prompt_tokens ids (what the response
  // follows), or is dropped (std::nullopt).
  std::optional<std::vector<int32_t>> FitPrompt(std::vector<int32_t> ids) const;
  // A response to train on: at most max_response_tokens ids, the last of
  // them EOS when the tokenizer has one (so the policy learns to stop).
  std::vector<int32_t> Response(const std::string& text) const;

  size_t max_prompt_tokens() const { return max_prompt_tokens_; }
  size_t max_response_tokens() const { return max_response_tokens_; }

 private:
  const Tokenizer& tokenizer_;
  const size_t max_prompt_tokens_;
  const size_t max_response_tokens_;
  const bool drop_overlong_;
  const int64_t eos_;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_DATA_PROMPT_ENCODER_H_
