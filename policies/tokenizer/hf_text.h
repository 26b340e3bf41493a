// Text primitives shared by the tokenizer.json components (normalizers,
// pre-tokenizers, decoders) and HfBpeTokenizer. Private to policies/tokenizer.
#ifndef STRATA_POLICIES_TOKENIZER_HF_TEXT_H_
#define STRATA_POLICIES_TOKENIZER_HF_TEXT_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "policies/tokenizer/unicode.h"

namespace strata::policies::internal {

// Replaces every occurrence of `from` (non-empty) in `text`, left to right.
void ReplaceAll(std::string* text, std::string_view from, std::string_view to);

// The last character of `text`; valid=false when there is none or it is not
// well-formed UTF-8.
Utf8Char LastChar(std::string_view text);

// GPT-2's reversible map from bytes to printable characters: printable
// Latin-1 bytes stand for themselves, the other 68 get U+0100.. in order.
class ByteLevelAlphabet {
 public:
  ByteLevelAlphabet();

  const std::string& Encode(uint8_t byte) const { return utf8_of_[byte]; }
  // The byte a character stands for, or -1.
  int Decode(char32_t cp) const { return cp < byte_of_.size() ? byte_of_[cp] : -1; }

 private:
  std::array<std::string, 256> utf8_of_;
  std::array<int16_t, 324> byte_of_;  // 256 + 68 code points
};

// The one alphabet, built on first use; thread-safe.
const ByteLevelAlphabet& Alphabet();

}  // namespace strata::policies::internal

#endif  // STRATA_POLICIES_TOKENIZER_HF_TEXT_H_
