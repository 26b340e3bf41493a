#include "policies/tokenizer/hf_text.h"

#include <utility>

namespace strata::policies::internal {

void ReplaceAll(std::string* text, std::string_view from, std::string_view to) {
  if (from.empty() || text->find(from) == std::string::npos) return;
  std::string out;
  out.reserve(text->size());
  size_t pos = 0;
  while (true) {
    const size_t hit = text->find(from, pos);
    if (hit == std::string::npos) break;
    out.append(*text, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  out.append(*text, pos);
  *text = std::move(out);
}

Utf8Char LastChar(std::string_view text) {
  size_t begin = text.size();
  while (begin > 0 && text.size() - begin < 4) {
    --begin;
    if ((static_cast<uint8_t>(text[begin]) & 0xC0) != 0x80) break;
  }
  if (begin == text.size()) return Utf8Char{};
  const Utf8Char c = DecodeUtf8Char(text.substr(begin));
  return c.valid && c.length == text.size() - begin ? c : Utf8Char{};
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  char32_t next = 256;
  byte_of_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
    AppendUtf8(cp, &utf8_of_[static_cast<size_t>(b)]);
    byte_of_[cp] = static_cast<int16_t>(b);
  }
}

const ByteLevelAlphabet& Alphabet() {
  static const ByteLevelAlphabet* const alphabet = new ByteLevelAlphabet();
  return *alphabet;
}

}  // namespace strata::policies::internal
