#include "policies/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "policies/tokenizer/unicode.h"

namespace strata::policies {
namespace {

using Json = nlohmann::json;

// U+2581, the visible space of SentencePiece-converted vocabularies.
constexpr std::string_view kMetaspace = "\xE2\x96\x81";

// Reading tokenizer.json is a deep walk over optional fields; it reports
// problems by throwing this (and nlohmann's type errors), and FromJson is the
// one place that turns both into INVALID_ARGUMENT. Nothing escapes this file.
struct SchemaError {
  std::string message;
};

[[noreturn]] void Fail(std::string message) { throw SchemaError{std::move(message)}; }

// Member `key` of object `obj`, or nullptr when absent or null.
const Json* Find(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

const Json& Require(const Json& obj, const char* key, const std::string& where) {
  const Json* value = Find(obj, key);
  if (value == nullptr) Fail(absl::StrCat(where, " has no \"", key, "\""));
  return *value;
}

std::string RequireString(const Json& obj, const char* key, const std::string& where) {
  const Json& value = Require(obj, key, where);
  if (!value.is_string()) Fail(absl::StrCat(where, ".", key, " must be a string"));
  return value.get<std::string>();
}

bool OptionalBool(const Json& obj, const char* key, bool default_value, const std::string& where) {
  const Json* value = Find(obj, key);
  if (value == nullptr) return default_value;
  if (!value->is_boolean()) Fail(absl::StrCat(where, ".", key, " must be a boolean"));
  return value->get<bool>();
}

std::string TypeOf(const Json& component, const std::string& where) {
  if (!component.is_object()) Fail(absl::StrCat(where, " must be an object"));
  return RequireString(component, "type", where);
}

[[noreturn]] void Unsupported(const std::string& where, const std::string& type) {
  Fail(absl::StrCat("unsupported ", where, " type \"", type, "\""));
}

// {"String": " "} -> " ". Regex patterns are only supported where a
// recognized pre-tokenizer regex is expected, so they are rejected here.
std::string StringPattern(const Json& component, const std::string& where) {
  const Json& pattern = Require(component, "pattern", where);
  if (const Json* s = Find(pattern, "String"); s != nullptr && s->is_string()) {
    return s->get<std::string>();
  }
  Fail(absl::StrCat(where, ".pattern: only {\"String\": ...} patterns are supported, got ",
                    pattern.dump()));
}

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

// GPT-2's reversible map from bytes to printable characters: printable
// Latin-1 bytes stand for themselves, the other 68 get U+0100.. in order.
class ByteLevelAlphabet {
 public:
  ByteLevelAlphabet() {
    char32_t next = 256;
    byte_of_.fill(-1);
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
      AppendUtf8(cp, &utf8_of_[static_cast<size_t>(b)]);
      byte_of_[cp] = static_cast<int16_t>(b);
    }
  }

  const std::string& Encode(uint8_t byte) const { return utf8_of_[byte]; }
  // The byte a character stands for, or -1.
  int Decode(char32_t cp) const { return cp < byte_of_.size() ? byte_of_[cp] : -1; }

 private:
  std::array<std::string, 256> utf8_of_;
  std::array<int16_t, 324> byte_of_;  // 256 + 68 code points
};

const ByteLevelAlphabet& Alphabet() {
  static const ByteLevelAlphabet* const alphabet = new ByteLevelAlphabet();
  return *alphabet;
}

// ---------------------------------------------------------------------------
// Components.

struct NormalizerStep {
  enum class Kind { kPrepend, kReplace, kStrip, kUnicode };
  Kind kind = Kind::kReplace;
  UnicodeForm form = UnicodeForm::kNfc;  // kUnicode
  std::string from;    // kReplace
  std::string to;      // kReplace; kPrepend: the prefix
  bool left = false;   // kStrip
  bool right = false;  // kStrip
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class PrependScheme { kAlways, kFirst, kNever };

struct PreTokenizerStep {
  enum class Kind { kByteLevel, kSplitRegex, kSplitString, kMetaspace, kDigits };
  Kind kind = Kind::kByteLevel;
  bool add_prefix_space = false;                       // kByteLevel
  bool use_regex = true;                               // kByteLevel
  PretokenizerRegex regex = PretokenizerRegex::kGpt2;  // kSplitRegex
  std::string pattern;                                 // kSplitString
  SplitBehavior behavior = SplitBehavior::kIsolated;   // kSplit*
  bool invert = false;                                 // kSplit*
  std::string replacement;                             // kMetaspace
  PrependScheme prepend = PrependScheme::kAlways;      // kMetaspace
  bool split = true;                                   // kMetaspace
  bool individual_digits = false;                      // kDigits
};

struct DecoderStep {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind = Kind::kFuse;
  std::string from;               // kReplace; kMetaspace: the replacement character
  std::string to;                 // kReplace
  char32_t strip_char = ' ';      // kStrip
  size_t strip_start = 0;         // kStrip
  size_t strip_stop = 0;          // kStrip
  bool strip_first_space = true;  // kMetaspace (prepend_scheme != never)
};

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// A pre-tokenized piece; `at_start` when it begins at offset 0 of the input
// (Metaspace's prepend_scheme "first" only prefixes that one).
struct Piece {
  std::string text;
  bool at_start = false;
};

SplitBehavior ParseBehavior(const Json& step, const std::string& where) {
  const Json* value = Find(step, "behavior");
  if (value == nullptr) return SplitBehavior::kIsolated;
  if (!value->is_string()) Fail(absl::StrCat(where, ".behavior must be a string"));
  const std::string name = value->get<std::string>();
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  Fail(absl::StrCat(where, ": unknown split behavior \"", name, "\""));
}

// Metaspace's prefix rule: "prepend_scheme" in newer files, the boolean
// "add_prefix_space" in older ones.
PrependScheme ParsePrependScheme(const Json& step, const std::string& where) {
  if (const Json* scheme = Find(step, "prepend_scheme"); scheme != nullptr) {
    const std::string name = scheme->is_string() ? scheme->get<std::string>() : "";
    if (name == "always") return PrependScheme::kAlways;
    if (name == "first") return PrependScheme::kFirst;
    if (name == "never") return PrependScheme::kNever;
    Fail(absl::StrCat(where, ": unknown prepend_scheme ", scheme->dump()));
  }
  return OptionalBool(step, "add_prefix_space", true, where) ? PrependScheme::kAlways
                                                             : PrependScheme::kNever;
}

std::string ParseReplacement(const Json& step, const std::string& where) {
  const Json* value = Find(step, "replacement");
  if (value == nullptr) return std::string(kMetaspace);
  if (!value->is_string() || value->get<std::string>().empty()) {
    Fail(absl::StrCat(where, ".replacement must be a non-empty string"));
  }
  return value->get<std::string>();
}

void ParseNormalizer(const Json& n, const std::string& where, std::vector<NormalizerStep>* out) {
  const std::string type = TypeOf(n, where);
  NormalizerStep step;
  if (type == "Sequence") {
    const Json& list = Require(n, "normalizers", where);
    if (!list.is_array()) Fail(absl::StrCat(where, ".normalizers must be an array"));
    for (size_t i = 0; i < list.size(); ++i) {
      ParseNormalizer(list[i], absl::StrCat(where, ".normalizers[", i, "]"), out);
    }
    return;
  } else if (type == "Prepend") {
    step.kind = NormalizerStep::Kind::kPrepend;
    step.to = RequireString(n, "prepend", where);
  } else if (type == "Replace") {
    step.kind = NormalizerStep::Kind::kReplace;
    step.from = StringPattern(n, where);
    step.to = RequireString(n, "content", where);
  } else if (type == "Strip") {
    step.kind = NormalizerStep::Kind::kStrip;
    step.left = OptionalBool(n, "strip_left", true, where);
    step.right = OptionalBool(n, "strip_right", true, where);
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD" || type == "Lowercase") {
    step.kind = NormalizerStep::Kind::kUnicode;
    step.form = type == "NFC"    ? UnicodeForm::kNfc
                : type == "NFD"  ? UnicodeForm::kNfd
                : type == "NFKC" ? UnicodeForm::kNfkc
                : type == "NFKD" ? UnicodeForm::kNfkd
                                 : UnicodeForm::kLowercase;
  } else {
    Unsupported("normalizer", type);
  }
  out->push_back(std::move(step));
}

void ParsePreTokenizer(const Json& p, const std::string& where,
                       std::vector<PreTokenizerStep>* out) {
  const std::string type = TypeOf(p, where);
  PreTokenizerStep step;
  if (type == "Sequence") {
    const Json& list = Require(p, "pretokenizers", where);
    if (!list.is_array()) Fail(absl::StrCat(where, ".pretokenizers must be an array"));
    for (size_t i = 0; i < list.size(); ++i) {
      ParsePreTokenizer(list[i], absl::StrCat(where, ".pretokenizers[", i, "]"), out);
    }
    return;
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    step.add_prefix_space = OptionalBool(p, "add_prefix_space", true, where);
    step.use_regex = OptionalBool(p, "use_regex", true, where);
  } else if (type == "Split") {
    const Json& pattern = Require(p, "pattern", where);
    if (const Json* regex = Find(pattern, "Regex"); regex != nullptr && regex->is_string()) {
      step.kind = PreTokenizerStep::Kind::kSplitRegex;
      if (!RecognizePretokenizerRegex(regex->get<std::string>(), &step.regex)) {
        Fail(absl::StrCat(where, ": unsupported Split regex ", regex->dump(),
                          " (only the GPT-2, Llama-3 and Qwen2 patterns are implemented)"));
      }
    } else {
      step.kind = PreTokenizerStep::Kind::kSplitString;
      step.pattern = StringPattern(p, where);
      if (step.pattern.empty()) Fail(absl::StrCat(where, ": empty Split pattern"));
    }
    step.behavior = ParseBehavior(p, where);
    step.invert = OptionalBool(p, "invert", false, where);
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerStep::Kind::kMetaspace;
    step.replacement = ParseReplacement(p, where);
    step.prepend = ParsePrependScheme(p, where);
    step.split = OptionalBool(p, "split", true, where);
  } else if (type == "Digits") {
    step.kind = PreTokenizerStep::Kind::kDigits;
    step.individual_digits = OptionalBool(p, "individual_digits", false, where);
  } else {
    Unsupported("pre_tokenizer", type);
  }
  out->push_back(std::move(step));
}

void ParseDecoder(const Json& d, const std::string& where, std::vector<DecoderStep>* out) {
  const std::string type = TypeOf(d, where);
  DecoderStep step;
  if (type == "Sequence") {
    const Json& list = Require(d, "decoders", where);
    if (!list.is_array()) Fail(absl::StrCat(where, ".decoders must be an array"));
    for (size_t i = 0; i < list.size(); ++i) {
      ParseDecoder(list[i], absl::StrCat(where, ".decoders[", i, "]"), out);
    }
    return;
  } else if (type == "ByteLevel") {
    step.kind = DecoderStep::Kind::kByteLevel;
  } else if (type == "Replace") {
    step.kind = DecoderStep::Kind::kReplace;
    step.from = StringPattern(d, where);
    step.to = RequireString(d, "content", where);
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = DecoderStep::Kind::kStrip;
    const std::string content = RequireString(d, "content", where);
    const Utf8Char c = DecodeUtf8Char(content);
    if (content.empty() || !c.valid || c.length != content.size()) {
      Fail(absl::StrCat(where, ".content must be one character"));
    }
    step.strip_char = c.code_point;
    const Json& start = Require(d, "start", where);
    const Json& stop = Require(d, "stop", where);
    if (!start.is_number_unsigned() || !stop.is_number_unsigned()) {
      Fail(absl::StrCat(where, ": start and stop must be non-negative integers"));
    }
    step.strip_start = start.get<size_t>();
    step.strip_stop = stop.get<size_t>();
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::Kind::kMetaspace;
    step.from = ParseReplacement(d, where);
    step.strip_first_space = ParsePrependScheme(d, where) != PrependScheme::kNever;
  } else {
    Unsupported("decoder", type);
  }
  out->push_back(std::move(step));
}

// Byte spans of the matches of a literal pattern, left to right.
std::vector<std::pair<size_t, size_t>> FindLiteral(std::string_view text,
                                                   std::string_view pattern) {
  std::vector<std::pair<size_t, size_t>> matches;
  for (size_t pos = text.find(pattern); pos != std::string_view::npos;
       pos = text.find(pattern, pos + pattern.size())) {
    matches.emplace_back(pos, pos + pattern.size());
  }
  return matches;
}

// Hugging Face's NormalizedString::split: turns the matches into pieces
// according to `behavior`; empty pieces are dropped.
void SplitPiece(const Piece& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                SplitBehavior behavior, bool invert, std::vector<Piece>* out) {
  struct Span {
    size_t begin;
    size_t end;
    bool is_match;
  };
  std::vector<Span> spans;
  size_t prev = 0;
  for (const auto& [begin, end] : matches) {
    if (prev != begin) spans.push_back({prev, begin, invert});
    spans.push_back({begin, end, !invert});
    prev = end;
  }
  if (prev != piece.text.size()) spans.push_back({prev, piece.text.size(), invert});

  std::vector<Span> kept;  // is_match is reused as "removed"
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) kept.push_back({s.begin, s.end, s.is_match});
      break;
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) kept.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back({s.begin, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty()) {
          kept.back().begin = it->begin;
        } else {
          kept.push_back({it->begin, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case SplitBehavior::kContiguous:
      for (size_t i = 0; i < spans.size(); ++i) {
        if (i > 0 && spans[i].is_match == previous_match) {
          kept.back().end = spans[i].end;
        } else {
          kept.push_back({spans[i].begin, spans[i].end, false});
        }
        previous_match = spans[i].is_match;
      }
      break;
  }
  for (const Span& s : kept) {
    if (s.is_match || s.begin == s.end) continue;
    out->push_back({piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
  }
}

void ApplyPreTokenizer(const PreTokenizerStep& step, std::vector<Piece>* pieces) {
  std::vector<Piece> out;
  out.reserve(pieces->size());
  for (Piece& piece : *pieces) {
    switch (step.kind) {
      case PreTokenizerStep::Kind::kByteLevel: {
        if (step.add_prefix_space && !piece.text.starts_with(' ')) piece.text.insert(0, " ");
        std::vector<Piece> split;
        if (step.use_regex) {
          SplitPiece(piece, FindPretokenizerMatches(piece.text, PretokenizerRegex::kGpt2),
                     SplitBehavior::kIsolated, false, &split);
        } else {
          split.push_back(std::move(piece));
        }
        for (Piece& p : split) {
          std::string mapped;
          mapped.reserve(p.text.size() * 2);
          for (char b : p.text) mapped.append(Alphabet().Encode(static_cast<uint8_t>(b)));
          out.push_back({std::move(mapped), p.at_start});
        }
        break;
      }
      case PreTokenizerStep::Kind::kSplitRegex:
        SplitPiece(piece, FindPretokenizerMatches(piece.text, step.regex), step.behavior,
                   step.invert, &out);
        break;
      case PreTokenizerStep::Kind::kSplitString:
        SplitPiece(piece, FindLiteral(piece.text, step.pattern), step.behavior, step.invert, &out);
        break;
      case PreTokenizerStep::Kind::kMetaspace: {
        ReplaceAll(&piece.text, " ", step.replacement);
        const bool prepend = step.prepend == PrependScheme::kAlways ||
                             (step.prepend == PrependScheme::kFirst && piece.at_start);
        if (prepend && !piece.text.starts_with(step.replacement)) {
          piece.text.insert(0, step.replacement);
        }
        if (step.split) {
          SplitPiece(piece, FindLiteral(piece.text, step.replacement),
                     SplitBehavior::kMergedWithNext, false, &out);
        } else if (!piece.text.empty()) {
          out.push_back(std::move(piece));
        }
        break;
      }
      case PreTokenizerStep::Kind::kDigits: {
        // Every numeric character is a match; Contiguous merges runs.
        std::vector<std::pair<size_t, size_t>> digits;
        std::string_view rest = piece.text;
        size_t pos = 0;
        while (pos < rest.size()) {
          const Utf8Char c = DecodeUtf8Char(rest.substr(pos));
          if (c.valid && IsUnicodeNumber(c.code_point)) digits.emplace_back(pos, pos + c.length);
          pos += c.length;
        }
        SplitPiece(piece, digits,
                   step.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
                   false, &out);
        break;
      }
    }
  }
  *pieces = std::move(out);
}

// "<0x41>" -> 0x41 (either hex case, as Hugging Face's ByteFallback); -1 else.
int ByteFallbackValue(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return -1;
  int value = 0;
  for (char c : token.substr(3, 2)) {
    value <<= 4;
    if (c >= '0' && c <= '9') {
      value |= c - '0';
    } else if (c >= 'a' && c <= 'f') {
      value |= c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      value |= c - 'A' + 10;
    } else {
      return -1;
    }
  }
  return value;
}

void ApplyDecoder(const DecoderStep& step, std::vector<std::string>* tokens) {
  switch (step.kind) {
    case DecoderStep::Kind::kReplace:
      for (std::string& t : *tokens) ReplaceAll(&t, step.from, step.to);
      return;
    case DecoderStep::Kind::kFuse: {
      std::string fused;
      for (const std::string& t : *tokens) fused += t;
      tokens->assign(1, std::move(fused));
      return;
    }
    case DecoderStep::Kind::kByteFallback: {
      // A run of <0xNN> tokens becomes its UTF-8 text when valid; otherwise
      // every byte of the run becomes U+FFFD (Hugging Face's rule, coarser
      // than sentencepiece's per-character one).
      std::vector<std::string> out;
      std::string bytes;
      size_t run = 0;
      auto flush = [&] {
        if (run == 0) return;
        if (ToValidUtf8Lossy(bytes) == bytes) {
          out.push_back(bytes);
        } else {
          for (size_t i = 0; i < run; ++i) out.emplace_back(kReplacementUtf8);
        }
        bytes.clear();
        run = 0;
      };
      for (std::string& t : *tokens) {
        const int byte = ByteFallbackValue(t);
        if (byte >= 0) {
          bytes.push_back(static_cast<char>(byte));
          ++run;
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      *tokens = std::move(out);
      return;
    }
    case DecoderStep::Kind::kStrip:
      for (std::string& t : *tokens) {
        std::vector<std::pair<size_t, size_t>> chars;  // byte span of each character
        for (size_t pos = 0; pos < t.size();) {
          const size_t len = DecodeUtf8Char(std::string_view(t).substr(pos)).length;
          chars.emplace_back(pos, len);
          pos += len;
        }
        auto is_strip = [&](size_t i) {
          const Utf8Char c = DecodeUtf8Char(std::string_view(t).substr(chars[i].first));
          return c.valid && c.code_point == step.strip_char;
        };
        size_t first = 0;
        while (first < chars.size() && first < step.strip_start && is_strip(first)) ++first;
        size_t last = chars.size();
        for (size_t k = 0; k < step.strip_stop && last > first && is_strip(last - 1); ++k) --last;
        const size_t begin = first < chars.size() ? chars[first].first : t.size();
        const size_t end = last < chars.size() ? chars[last].first : t.size();
        t = t.substr(begin, end - begin);
      }
      return;
    case DecoderStep::Kind::kMetaspace:
      for (size_t i = 0; i < tokens->size(); ++i) {
        // Hugging Face drops every replacement character of the first token
        // (not only a leading one) unless prepend_scheme is "never".
        ReplaceAll(&(*tokens)[i], step.from, i == 0 && step.strip_first_space ? "" : " ");
      }
      return;
    case DecoderStep::Kind::kByteLevel: {
      std::string bytes;
      for (const std::string& t : *tokens) {
        // Tokens outside the byte alphabet (added tokens) pass through as-is.
        std::string decoded;
        bool all_mapped = true;
        for (size_t pos = 0; pos < t.size();) {
          const Utf8Char c = DecodeUtf8Char(std::string_view(t).substr(pos));
          const int b = c.valid ? Alphabet().Decode(c.code_point) : -1;
          if (b < 0) {
            all_mapped = false;
            break;
          }
          decoded.push_back(static_cast<char>(b));
          pos += c.length;
        }
        bytes += all_mapped ? decoded : t;
      }
      tokens->assign(1, ToValidUtf8Lossy(bytes));
      return;
    }
  }
}

bool IsWordChar(char32_t cp) { return cp == '_' || IsUnicodeLetter(cp) || IsUnicodeNumber(cp); }

// The last character of `text`; valid=false when there is none or it is not
// well-formed UTF-8.
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

// The BPE model of tokenizer.json.
struct BpeModel {
  std::unordered_map<std::string, int32_t> vocab;
  // (left id << 32 | right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  std::array<int32_t, 256> byte_ids{};  // <0xNN> ids, -1 when absent

  // Appends the ids of one pre-tokenized word.
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids) const;

 private:
  const std::pair<int32_t, int32_t>* FindMerge(int32_t left, int32_t right) const {
    const auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
                                static_cast<uint32_t>(right));
    return it == merges.end() ? nullptr : &it->second;
  }
};

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (ignore_merges) {
    if (const auto it = vocab.find(std::string(word)); it != vocab.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  // Hugging Face's Word: a linked list of symbols merged by lowest merge
  // rank, leftmost first.
  struct Symbol {
    int32_t id;
    int prev;
    int next;
    size_t length;  // bytes; 0 once merged away
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id, size_t length) {
    const int index = static_cast<int>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back({id, index - 1, -1, length});
  };
  // Bytes covered by the unknown token not yet added (0: none); consecutive
  // unknown characters share one token when fuse_unk.
  size_t pending_unk = 0;
  const std::string_view w = word;
  for (size_t pos = 0; pos < w.size();) {
    const size_t length = DecodeUtf8Char(w.substr(pos)).length;
    std::string s(w.substr(pos, length));
    if (pos > 0 && !continuing_subword_prefix.empty()) s.insert(0, continuing_subword_prefix);
    if (pos + length == w.size()) s += end_of_word_suffix;
    pos += length;
    if (const auto it = vocab.find(s); it != vocab.end()) {
      if (pending_unk > 0) add(unk_id, pending_unk);
      pending_unk = 0;
      add(it->second, length);
      continue;
    }
    if (byte_fallback && std::all_of(s.begin(), s.end(), [&](char b) {
          return byte_ids[static_cast<uint8_t>(b)] >= 0;
        })) {
      for (char b : s) add(byte_ids[static_cast<uint8_t>(b)], 1);
      continue;
    }
    if (unk_id >= 0) {
      if (pending_unk > 0 && !fuse_unk) {
        add(unk_id, pending_unk);
        pending_unk = 0;
      }
      pending_unk += length;
    }
    // Without an unk token an unknown character is dropped, as in Hugging Face.
  }
  if (pending_unk > 0) add(unk_id, pending_unk);

  struct Merge {
    int pos;
    int32_t rank;
    int32_t new_id;
  };
  struct Later {
    bool operator()(const Merge& a, const Merge& b) const {
      return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
    }
  };
  std::priority_queue<Merge, std::vector<Merge>, Later> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const auto* m = FindMerge(symbols[i].id, symbols[i + 1].id); m != nullptr) {
      queue.push({static_cast<int>(i), m->first, m->second});
    }
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& current = symbols[static_cast<size_t>(top.pos)];
    if (current.length == 0 || current.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(current.next)];
    // Stale entry: the pair at this position changed since it was queued.
    const auto* m = FindMerge(current.id, right.id);
    if (m == nullptr || m->second != top.new_id) continue;
    current.id = top.new_id;
    current.length += right.length;
    current.next = right.next;
    right.length = 0;
    if (current.next >= 0) symbols[static_cast<size_t>(current.next)].prev = top.pos;
    if (current.prev >= 0) {
      const Symbol& prev = symbols[static_cast<size_t>(current.prev)];
      if (const auto* pm = FindMerge(prev.id, current.id); pm != nullptr) {
        queue.push({current.prev, pm->first, pm->second});
      }
    }
    if (current.next >= 0) {
      const Symbol& next = symbols[static_cast<size_t>(current.next)];
      if (const auto* nm = FindMerge(current.id, next.id); nm != nullptr) {
        queue.push({top.pos, nm->first, nm->second});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.length > 0) ids->push_back(s.id);
  }
}

// BOS / EOS as the post_processor would add them to a single sequence.
struct TemplateTokens {
  std::optional<std::string> bos;  // token names, resolved later
  std::optional<std::string> eos;
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
};

void ParsePostProcessor(const Json& p, const std::string& where, TemplateTokens* out) {
  const std::string type = TypeOf(p, where);
  if (type == "Sequence") {
    const Json& list = Require(p, "processors", where);
    if (!list.is_array()) Fail(absl::StrCat(where, ".processors must be an array"));
    for (size_t i = 0; i < list.size(); ++i) {
      ParsePostProcessor(list[i], absl::StrCat(where, ".processors[", i, "]"), out);
    }
  } else if (type == "ByteLevel") {
    // Only adjusts offsets.
  } else if (type == "TemplateProcessing") {
    const Json& single = Require(p, "single", where);
    // Items: (is_special, name). Serialized templates are arrays of
    // {"SpecialToken": {"id": ...}} / {"Sequence": {"id": "A"}}; the string
    // form "<s> $A" is accepted too.
    std::vector<std::pair<bool, std::string>> items;
    if (single.is_string()) {
      std::string_view rest = single.get_ref<const std::string&>();
      while (!rest.empty()) {
        const size_t space = rest.find(' ');
        std::string item(rest.substr(0, space));
        rest = space == std::string_view::npos ? std::string_view() : rest.substr(space + 1);
        if (item.empty()) continue;
        if (const size_t colon = item.rfind(':'); colon != std::string::npos && colon > 0) {
          item.resize(colon);
        }
        items.emplace_back(!item.starts_with("$"), item);
      }
    } else if (single.is_array()) {
      for (const Json& item : single) {
        if (const Json* special = Find(item, "SpecialToken"); special != nullptr) {
          items.emplace_back(true, RequireString(*special, "id", where + ".single"));
        } else if (Find(item, "Sequence") != nullptr) {
          items.emplace_back(false, "");
        } else {
          Fail(absl::StrCat(where, ".single has an unknown item ", item.dump()));
        }
      }
    } else {
      Fail(absl::StrCat(where, ".single must be an array or a string"));
    }
    const Json* special_tokens = Find(p, "special_tokens");
    auto resolve = [&](const std::string& name) -> std::optional<int32_t> {
      if (special_tokens == nullptr) return std::nullopt;
      const Json* entry = Find(*special_tokens, name.c_str());
      if (entry == nullptr) return std::nullopt;
      const Json* ids = Find(*entry, "ids");
      if (ids == nullptr || !ids->is_array() || ids->empty() || !(*ids)[0].is_number_integer()) {
        return std::nullopt;
      }
      return (*ids)[0].get<int32_t>();
    };
    if (!items.empty() && items.front().first) {
      out->bos = items.front().second;
      out->bos_id = resolve(items.front().second);
    }
    if (items.size() > 1 && items.back().first) {
      out->eos = items.back().second;
      out->eos_id = resolve(items.back().second);
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const auto& [key, slot, slot_id] :
         {std::tuple{"cls", &out->bos, &out->bos_id}, std::tuple{"sep", &out->eos, &out->eos_id}}) {
      const Json& pair = Require(p, key, where);
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_string() ||
          !pair[1].is_number_integer()) {
        Fail(absl::StrCat(where, ".", key, " must be [token, id]"));
      }
      *slot = pair[0].get<std::string>();
      *slot_id = pair[1].get<int32_t>();
    }
  } else {
    Unsupported("post_processor", type);
  }
}

int32_t CheckedId(const Json& value, const std::string& where) {
  if (!value.is_number_integer()) Fail(absl::StrCat(where, " must be an integer id"));
  const auto id = value.get<int64_t>();
  if (id < 0 || id >= INT32_MAX) Fail(absl::StrCat(where, " is out of range: ", id));
  return static_cast<int32_t>(id);
}

void ParseModel(const Json& model, BpeModel* bpe) {
  const std::string where = "model";
  if (!model.is_object()) Fail("model must be an object");
  const Json* type = Find(model, "type");
  if (type != nullptr && (!type->is_string() || type->get<std::string>() != "BPE")) {
    Unsupported("model", type->is_string() ? type->get<std::string>() : type->dump());
  }
  if (type == nullptr && Find(model, "merges") == nullptr) {
    Fail("model has no \"type\" and no \"merges\"; only BPE models are supported");
  }
  if (const Json* dropout = Find(model, "dropout");
      dropout != nullptr && (!dropout->is_number() || dropout->get<double>() > 0.0)) {
    Fail("model.dropout is set; BPE dropout is not supported");
  }
  const Json& vocab = Require(model, "vocab", where);
  if (!vocab.is_object()) Fail("model.vocab must be an object");
  for (const auto& [token, id] : vocab.items()) {
    bpe->vocab[token] = CheckedId(id, absl::StrCat("model.vocab[\"", token, "\"]"));
  }
  bpe->byte_fallback = OptionalBool(model, "byte_fallback", false, where);
  bpe->fuse_unk = OptionalBool(model, "fuse_unk", false, where);
  bpe->ignore_merges = OptionalBool(model, "ignore_merges", false, where);
  if (const Json* prefix = Find(model, "continuing_subword_prefix"); prefix != nullptr) {
    bpe->continuing_subword_prefix = RequireString(model, "continuing_subword_prefix", where);
  }
  if (const Json* suffix = Find(model, "end_of_word_suffix"); suffix != nullptr) {
    bpe->end_of_word_suffix = RequireString(model, "end_of_word_suffix", where);
  }
  if (Find(model, "unk_token") != nullptr) {
    const std::string unk = RequireString(model, "unk_token", where);
    const auto it = bpe->vocab.find(unk);
    if (it == bpe->vocab.end())
      Fail(absl::StrCat("model.unk_token \"", unk, "\" is not in the vocab"));
    bpe->unk_id = it->second;
  }
  bpe->byte_ids.fill(-1);
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const std::string name =
        absl::StrCat("<0x", std::string(1, kHex[b >> 4]), std::string(1, kHex[b & 15]), ">");
    if (const auto it = bpe->vocab.find(name); it != bpe->vocab.end()) {
      bpe->byte_ids[static_cast<size_t>(b)] = it->second;
    }
  }

  const Json& merges = Require(model, "merges", where);
  if (!merges.is_array()) Fail("model.merges must be an array");
  const size_t prefix_len = bpe->continuing_subword_prefix.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Json& m = merges[rank];
    std::string left, right;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos)
        Fail(absl::StrCat("model.merges[", rank, "] has no space: \"", s, "\""));
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      Fail(absl::StrCat("model.merges[", rank, "] must be \"a b\" or [\"a\", \"b\"]"));
    }
    const auto l = bpe->vocab.find(left);
    const auto r = bpe->vocab.find(right);
    if (l == bpe->vocab.end() || r == bpe->vocab.end()) {
      Fail(absl::StrCat("model.merges[", rank, "] uses a token that is not in the vocab"));
    }
    // The right part's continuing-subword prefix is not repeated in the merge.
    const std::string merged =
        left + (right.size() >= prefix_len ? right.substr(prefix_len) : right);
    const auto n = bpe->vocab.find(merged);
    if (n == bpe->vocab.end()) {
      Fail(absl::StrCat("model.merges[", rank, "]: merged token \"", merged,
                        "\" is not in the vocab"));
    }
    bpe->merges[(static_cast<uint64_t>(static_cast<uint32_t>(l->second)) << 32) |
                static_cast<uint32_t>(r->second)] = {static_cast<int32_t>(rank), n->second};
  }
}

}  // namespace

// ---------------------------------------------------------------------------

struct HfBpeTokenizer::Impl {
  std::vector<NormalizerStep> normalizers;
  std::vector<PreTokenizerStep> pre_tokenizers;
  bool has_decoder = false;
  std::vector<DecoderStep> decoders;
  BpeModel model;

  // Added tokens and the id -> string table.
  std::vector<AddedToken> added;
  std::array<std::vector<size_t>, 256> added_by_first_byte;  // longest first
  std::unordered_map<int32_t, size_t> added_by_id;
  std::unordered_map<std::string, int32_t> added_by_content;
  std::vector<std::string> id_to_token;

  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t pad_id = -1;

  int32_t Lookup(const std::string& piece) const {
    if (const auto it = added_by_content.find(piece); it != added_by_content.end()) {
      return it->second;
    }
    const auto it = model.vocab.find(piece);
    return it == model.vocab.end() ? -1 : it->second;
  }

  // Normalizes, pre-tokenizes and BPE-encodes text between added tokens.
  void EncodeText(std::string_view text, bool at_start, std::vector<int32_t>* ids) const;
};

void HfBpeTokenizer::Impl::EncodeText(std::string_view text, bool at_start,
                                      std::vector<int32_t>* ids) const {
  std::string normalized(text);
  for (const NormalizerStep& step : normalizers) {
    switch (step.kind) {
      case NormalizerStep::Kind::kPrepend:
        if (!normalized.empty()) normalized.insert(0, step.to);
        break;
      case NormalizerStep::Kind::kReplace:
        ReplaceAll(&normalized, step.from, step.to);
        break;
      case NormalizerStep::Kind::kUnicode:
        normalized = NormalizeUnicode(normalized, step.form);
        break;
      case NormalizerStep::Kind::kStrip: {
        std::string_view view = normalized;
        while (step.left && !view.empty()) {
          const Utf8Char c = DecodeUtf8Char(view);
          if (!c.valid || !IsUnicodeWhitespace(c.code_point)) break;
          view.remove_prefix(c.length);
        }
        while (step.right && !view.empty()) {
          const Utf8Char c = LastChar(view);
          if (!c.valid || !IsUnicodeWhitespace(c.code_point)) break;
          view.remove_suffix(c.length);
        }
        normalized = std::string(view);
        break;
      }
    }
  }
  if (normalized.empty()) return;
  std::vector<Piece> pieces;
  pieces.push_back({std::move(normalized), at_start});
  for (const PreTokenizerStep& step : pre_tokenizers) ApplyPreTokenizer(step, &pieces);
  for (const Piece& piece : pieces) {
    if (!piece.text.empty()) model.EncodeWord(piece.text, ids);
  }
}

// ---------------------------------------------------------------------------

HfBpeTokenizer::HfBpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HfBpeTokenizer::~HfBpeTokenizer() = default;

absl::StatusOr<std::unique_ptr<HfBpeTokenizer>> HfBpeTokenizer::FromFile(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(path));
  return FromJson(text, path);
}

absl::StatusOr<std::unique_ptr<HfBpeTokenizer>> HfBpeTokenizer::FromJson(
    const std::string& json_text, const std::string& source) {
  const Json root = Json::parse(json_text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON"));
  auto impl = std::make_unique<Impl>();
  TemplateTokens template_tokens;
  try {
    if (!root.is_object()) Fail("expected a JSON object");
    ParseModel(Require(root, "model", "tokenizer.json"), &impl->model);
    if (const Json* n = Find(root, "normalizer"); n != nullptr) {
      ParseNormalizer(*n, "normalizer", &impl->normalizers);
    }
    if (const Json* p = Find(root, "pre_tokenizer"); p != nullptr) {
      ParsePreTokenizer(*p, "pre_tokenizer", &impl->pre_tokenizers);
    }
    if (const Json* d = Find(root, "decoder"); d != nullptr) {
      impl->has_decoder = true;
      ParseDecoder(*d, "decoder", &impl->decoders);
    }
    if (const Json* p = Find(root, "post_processor"); p != nullptr) {
      ParsePostProcessor(*p, "post_processor", &template_tokens);
    }
    if (const Json* added = Find(root, "added_tokens"); added != nullptr) {
      if (!added->is_array()) Fail("added_tokens must be an array");
      for (size_t i = 0; i < added->size(); ++i) {
        const Json& t = (*added)[i];
        const std::string where = absl::StrCat("added_tokens[", i, "]");
        AddedToken token;
        token.id = CheckedId(Require(t, "id", where), where + ".id");
        token.content = RequireString(t, "content", where);
        if (token.content.empty()) Fail(where + ".content is empty");
        token.special = OptionalBool(t, "special", false, where);
        token.lstrip = OptionalBool(t, "lstrip", false, where);
        token.rstrip = OptionalBool(t, "rstrip", false, where);
        token.single_word = OptionalBool(t, "single_word", false, where);
        impl->added.push_back(std::move(token));
      }
    }
  } catch (const SchemaError& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.message));
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }

  // The id -> string table covers the vocab and the added tokens.
  int32_t max_id = -1;
  for (const auto& [token, id] : impl->model.vocab) max_id = std::max(max_id, id);
  for (const AddedToken& t : impl->added) max_id = std::max(max_id, t.id);
  // Ids index a table; a stray huge id must not allocate gigabytes.
  const size_t entries = impl->model.vocab.size() + impl->added.size();
  if (static_cast<size_t>(max_id) >= 2 * entries + 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": token id ", max_id, " is far beyond the ", entries, " vocabulary entries"));
  }
  impl->id_to_token.resize(static_cast<size_t>(max_id) + 1);
  for (const auto& [token, id] : impl->model.vocab)
    impl->id_to_token[static_cast<size_t>(id)] = token;
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const AddedToken& t = impl->added[i];
    impl->id_to_token[static_cast<size_t>(t.id)] = t.content;
    impl->added_by_id[t.id] = i;
    impl->added_by_content[t.content] = t.id;
    impl->added_by_first_byte[static_cast<uint8_t>(t.content[0])].push_back(i);
  }
  for (auto& bucket : impl->added_by_first_byte) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](size_t a, size_t b) {
      return impl->added[a].content.size() > impl->added[b].content.size();
    });
  }

  auto resolve = [&](const std::optional<std::string>& name, const std::optional<int32_t>& id) {
    if (id.has_value() && *id >= 0 && static_cast<size_t>(*id) < impl->id_to_token.size()) {
      return *id;
    }
    return name.has_value() ? impl->Lookup(*name) : -1;
  };
  impl->bos_id = resolve(template_tokens.bos, template_tokens.bos_id);
  impl->eos_id = resolve(template_tokens.eos, template_tokens.eos_id);
  const bool template_adds_bos = impl->bos_id >= 0;
  const bool template_adds_eos = impl->eos_id >= 0;
  // No template (e.g. Llama-3 base without a post_processor): fall back to
  // the names these vocabularies conventionally use.
  auto first_present = [&](std::initializer_list<const char*> names) {
    for (const char* name : names) {
      if (const int32_t id = impl->Lookup(name); id >= 0) return id;
    }
    return -1;
  };
  if (impl->bos_id < 0) {
    impl->bos_id =
        first_present({"<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "<|endoftext|>"});
  }
  if (impl->eos_id < 0) {
    impl->eos_id = first_present({"</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>"});
  }
  impl->pad_id = first_present({"<pad>", "<|pad|>", "[PAD]"});

  auto tokenizer = std::unique_ptr<HfBpeTokenizer>(new HfBpeTokenizer(std::move(impl)));
  tokenizer->set_add_bos(template_adds_bos);
  tokenizer->set_add_eos(template_adds_eos);
  return tokenizer;
}

void HfBpeTokenizer::ApplyConfig(const TokenizerConfig& config) {
  Tokenizer::ApplyConfig(config);
  auto resolve = [&](const std::optional<std::string>& name, int32_t* id) {
    if (!name.has_value()) return;
    if (const int32_t found = impl_->Lookup(*name); found >= 0) *id = found;
  };
  resolve(config.bos_token, &impl_->bos_id);
  resolve(config.eos_token, &impl_->eos_id);
  resolve(config.pad_token, &impl_->pad_id);
}

std::vector<int32_t> HfBpeTokenizer::Encode(const std::string& text) const {
  std::vector<int32_t> ids;
  const std::string_view t = text;
  const Impl& impl = *impl_;
  // Added tokens first: leftmost-longest literal matches, the text between
  // them goes through the model (Hugging Face's AddedVocabulary split).
  size_t start_offset = 0;
  size_t search = 0;
  while (search < t.size()) {
    size_t match_begin = t.size();
    const AddedToken* match = nullptr;
    for (size_t i = search; i < t.size() && match == nullptr; ++i) {
      for (const size_t k : impl.added_by_first_byte[static_cast<uint8_t>(t[i])]) {
        if (t.substr(i).starts_with(impl.added[k].content)) {
          match = &impl.added[k];
          match_begin = i;
          break;
        }
      }
    }
    if (match == nullptr) break;
    size_t begin = match_begin;
    size_t end = match_begin + match->content.size();
    search = end;
    if (match->single_word) {
      const Utf8Char before = LastChar(t.substr(0, begin));
      const Utf8Char after = end < t.size() ? DecodeUtf8Char(t.substr(end)) : Utf8Char{};
      if ((before.valid && IsWordChar(before.code_point)) ||
          (after.valid && IsWordChar(after.code_point))) {
        continue;
      }
    }
    if (match->lstrip) {
      size_t strip = begin;
      while (strip > start_offset) {
        const Utf8Char c = LastChar(t.substr(0, strip));
        if (!c.valid || !IsUnicodeWhitespace(c.code_point)) break;
        strip -= c.length;
      }
      begin = strip;
    }
    if (match->rstrip) {
      while (end < t.size()) {
        const Utf8Char c = DecodeUtf8Char(t.substr(end));
        if (!c.valid || !IsUnicodeWhitespace(c.code_point)) break;
        end += c.length;
      }
      search = end;
    }
    if (start_offset < begin) {
      impl.EncodeText(t.substr(start_offset, begin - start_offset), start_offset == 0, &ids);
    }
    ids.push_back(match->id);
    start_offset = end;
  }
  if (start_offset < t.size()) impl.EncodeText(t.substr(start_offset), start_offset == 0, &ids);
  return ids;
}

std::string HfBpeTokenizer::Decode(const std::vector<int32_t>& ids) const {
  const Impl& impl = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= impl.id_to_token.size()) continue;
    if (const auto it = impl.added_by_id.find(id); it != impl.added_by_id.end()) {
      if (impl.added[it->second].special) continue;
    }
    const std::string& token = impl.id_to_token[static_cast<size_t>(id)];
    if (!token.empty()) tokens.push_back(token);
  }
  std::string text;
  if (!impl.has_decoder) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) text += ' ';
      text += tokens[i];
    }
    return text;
  }
  for (const DecoderStep& step : impl.decoders) ApplyDecoder(step, &tokens);
  for (const std::string& t : tokens) text += t;
  return text;
}

int32_t HfBpeTokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->id_to_token.size());
}
int32_t HfBpeTokenizer::bos_id() const { return impl_->bos_id; }
int32_t HfBpeTokenizer::eos_id() const { return impl_->eos_id; }
int32_t HfBpeTokenizer::pad_id() const { return impl_->pad_id; }

int32_t HfBpeTokenizer::PieceToId(const std::string& piece) const { return impl_->Lookup(piece); }

std::string HfBpeTokenizer::IdToPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return impl_->id_to_token[static_cast<size_t>(id)];
}

}  // namespace strata::policies
