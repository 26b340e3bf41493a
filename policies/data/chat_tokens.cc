#include "policies/data/chat_tokens.h"

#include <algorithm>

namespace strata::policies {
size_t CommonPrefixLength(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

MarkedTokens EncodeMarked(const Tokenizer& tokenizer, const std::string& text,
                          const std::vector<std::pair<size_t, size_t>>& spans) {
  MarkedTokens out;
  out.ids = tokenizer.Encode(text);
  out.assistant.assign(out.ids.size(), 0);
  // The tokens of text[0, b) agree with the whole's up to the token that
  // holds byte b (tokenizers cut at the same places before a merge can reach
  // across b): the first disagreement is where b's token starts, or earlier
  // when b cuts a word the tokenizer merged differently whole.
  for (const auto& [begin, end] : spans) {
    if (begin >= end || end > text.size()) continue;
    const std::vector<int32_t> before = tokenizer.Encode(text.substr(0, begin));
    const size_t first = CommonPrefixLength(before, out.ids);
    const std::vector<int32_t> upto = tokenizer.Encode(text.substr(0, end));
    const size_t shared = CommonPrefixLength(upto, out.ids);
    // A clean cut: the span's tokens end where text[0, end)'s do. Otherwise
    // the token holding byte end-1 straddles the end and is marked too.
    const size_t last = shared == upto.size() ? shared : std::min(shared + 1, out.ids.size());
    for (size_t k = first; k < last; ++k) out.assistant[k] = 1;
  }
  return out;
}

std::string ResponseText(const Tokenizer& tokenizer, const std::vector<int32_t>& response,
                         const std::vector<int64_t>& stop_ids) {
  if (!response.empty() && std::find(stop_ids.begin(), stop_ids.end(), response.back()) != stop_ids.end()) {
    return tokenizer.Decode(std::vector<int32_t>(response.begin(), response.end() - 1));
  }
  return tokenizer.Decode(response);
}

std::string DecodeWithSpecialTokens(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  std::string text;
  std::vector<int32_t> run;
  for (int32_t id : ids) {
    // Decode drops special tokens: one that decodes to nothing alone but
    // has a piece is one.
    const std::string piece = tokenizer.IdToPiece(id);
    if (!piece.empty() && tokenizer.Decode({id}).empty()) {
      text += tokenizer.Decode(run);
      run.clear();
      text += piece;
    } else {
      run.push_back(id);
    }
  }
  return text + tokenizer.Decode(run);
}

}  // namespace strata::policies
