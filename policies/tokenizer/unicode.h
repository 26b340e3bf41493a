// UTF-8 and Unicode character-class helpers for the tokenizers. No ICU: the
// letter / number tables are generated from the Unicode Character Database
// (see unicode.cc), which is all the pre-tokenizer regexes need.
#ifndef STRATA_POLICIES_TOKENIZER_UNICODE_H_
#define STRATA_POLICIES_TOKENIZER_UNICODE_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::policies {

inline constexpr char32_t kReplacementCodepoint = 0xFFFD;
// U+FFFD REPLACEMENT CHARACTER in UTF-8.
inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

// One character decoded from the front of a UTF-8 string.
struct Utf8Char {
  char32_t code_point = kReplacementCodepoint;
  size_t length = 1;  // bytes consumed; 1 for an invalid sequence
  bool valid = false;
};

// Decodes the character at the start of `text` (which must not be empty).
// Rejects overlong forms, surrogates, code points above U+10FFFF and truncated
// sequences; those report valid=false, length=1, U+FFFD (what sentencepiece's
// DecodeUTF8 does).
Utf8Char DecodeUtf8Char(std::string_view text);

// The byte length sentencepiece assumes from a lead byte alone (1 for stray
// continuation bytes), without validating the rest.
size_t Utf8LengthFromLeadByte(unsigned char lead);

// Appends `code_point` encoded as UTF-8 (U+FFFD for values that are not
// Unicode scalar values).
void AppendUtf8(char32_t code_point, std::string* out);

// Replaces every maximal ill-formed subsequence with one U+FFFD, the same
// result as Rust's String::from_utf8_lossy (what Hugging Face decoders do).
std::string ToValidUtf8Lossy(std::string_view bytes);

// Unicode general category L* (letters), N* (numbers: Nd, Nl, No), and the
// White_Space property (what `\s` means in the tokenizer regexes).
// Unicode normalization forms and lowercasing as tokenizer.json normalizers
// (NFC, NFD, NFKC, NFKD, Lowercase) apply them, through ICU. Each maximal run
// of valid UTF-8 is transformed; invalid bytes pass through unchanged, so
// byte-level models still see them.
enum class UnicodeForm { kNfc, kNfd, kNfkc, kNfkd, kLowercase };
std::string NormalizeUnicode(std::string_view text, UnicodeForm form);

bool IsUnicodeLetter(char32_t code_point);
bool IsUnicodeNumber(char32_t code_point);
bool IsUnicodeWhitespace(char32_t code_point);

// The pre-tokenization regexes used by Hugging Face tokenizer.json files that
// this library implements by hand (there is no general regex engine here).
enum class PretokenizerRegex {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
  //  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+   (Llama 3, cl100k)
  kLlama3,
  // As kLlama3 but \p{N} matches one digit at a time (Qwen2).
  kLlama3SingleDigit,
};

// Returns the regex kind whose pattern text is exactly `pattern`, or false.
bool RecognizePretokenizerRegex(std::string_view pattern, PretokenizerRegex* kind);

// Byte spans [begin, end) of the successive non-overlapping matches of the
// regex in `text`, leftmost first, with the backtracking semantics of the
// Oniguruma engine Hugging Face uses. Bytes that are not valid UTF-8 are
// treated as single characters of the "other" class.
std::vector<std::pair<size_t, size_t>> FindPretokenizerMatches(std::string_view text, PretokenizerRegex kind);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_TOKENIZER_UNICODE_H_
