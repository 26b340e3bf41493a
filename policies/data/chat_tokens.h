// Rendered text -> token ids, with the ids of the assistant's turns marked,
// as `apply_chat_template(tokenize=True, return_assistant_tokens_mask=True)`
// gives them: no special tokens added beyond what the template wrote.
#ifndef STRATA_POLICIES_DATA_CHAT_TOKENS_H_
#define STRATA_POLICIES_DATA_CHAT_TOKENS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "policies/tokenizer/tokenizer.h"

namespace strata::policies {

struct MarkedTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> assistant;  // 1 where the token is the assistant's; same length as ids
};

// How many leading ids `a` and `b` share.
size_t CommonPrefixLength(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

// Encodes `text` (Tokenizer::Encode) and marks the tokens of each byte span
// [begin, end). A span boundary that falls inside a token (the tokenizer
// merged across it) marks that token: a token is the assistant's when any of
// its text is, as transformers' char_to_token mapping has it.
MarkedTokens EncodeMarked(const Tokenizer& tokenizer, const std::string& text,
                          const std::vector<std::pair<size_t, size_t>>& spans);

// The text of a sampled response for rewards and metrics: its ids decoded
// without the end-of-turn id it stopped at (one of `stop_ids`), which the
// actor still trains on.
std::string ResponseText(const Tokenizer& tokenizer, const std::vector<int32_t>& response,
                         const std::vector<int64_t>& stop_ids);

// Ids -> text with the special tokens kept as their text (<|im_end|>, ...),
// as Hugging Face decodes with skip_special_tokens=False: what a reward
// server in OpenRLHF's protocol receives. Runs of ordinary ids decode
// together, so a character split over several byte tokens stays whole.
std::string DecodeWithSpecialTokens(const Tokenizer& tokenizer, const std::vector<int32_t>& ids);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_DATA_CHAT_TOKENS_H_
