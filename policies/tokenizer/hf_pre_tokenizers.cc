#include "policies/tokenizer/hf_components.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "policies/tokenizer/hf_text.h"
#include "policies/tokenizer/piece_syntax.h"

namespace strata::policies::internal {
namespace {

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

// Byte spans of the matches of a literal pattern, left to right.
std::vector<std::pair<size_t, size_t>> FindLiteral(std::string_view text, std::string_view pattern) {
  std::vector<std::pair<size_t, size_t>> matches;
  for (size_t pos = text.find(pattern); pos != std::string_view::npos; pos = text.find(pattern, pos + pattern.size())) {
    matches.emplace_back(pos, pos + pattern.size());
  }
  return matches;
}

// Hugging Face's NormalizedString::split: turns the matches into pieces
// according to `behavior`; empty pieces are dropped.
void SplitPiece(const Piece& piece, const std::vector<std::pair<size_t, size_t>>& matches, SplitBehavior behavior,
                bool invert, std::vector<Piece>* out) {
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

}  // namespace

PrependScheme ParsePrependScheme(const Json& step, const std::string& where) {
  if (const Json* scheme = Find(step, "prepend_scheme"); scheme != nullptr) {
    const std::string name = scheme->is_string() ? scheme->get<std::string>() : "";
    if (name == "always") return PrependScheme::kAlways;
    if (name == "first") return PrependScheme::kFirst;
    if (name == "never") return PrependScheme::kNever;
    Fail(absl::StrCat(where, ": unknown prepend_scheme ", scheme->dump()));
  }
  return OptionalBool(step, "add_prefix_space", true, where) ? PrependScheme::kAlways : PrependScheme::kNever;
}

std::string ParseReplacement(const Json& step, const std::string& where) {
  const Json* value = Find(step, "replacement");
  if (value == nullptr) return std::string(kSpaceSymbol);
  if (!value->is_string() || value->get<std::string>().empty()) {
    Fail(absl::StrCat(where, ".replacement must be a non-empty string"));
  }
  return value->get<std::string>();
}

void ParsePreTokenizer(const Json& p, const std::string& where, std::vector<PreTokenizerStep>* out) {
  const std::string type = TypeOf(p, where);
  if (ExpandSequence(p, type, "pretokenizers", where, &ParsePreTokenizer, out)) return;
  PreTokenizerStep step;
  if (type == "ByteLevel") {
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

void ApplyPreTokenizer(const PreTokenizerStep& step, std::vector<Piece>* pieces) {
  std::vector<Piece> out;
  out.reserve(pieces->size());
  for (Piece& piece : *pieces) {
    switch (step.kind) {
      case PreTokenizerStep::Kind::kByteLevel: {
        if (step.add_prefix_space && !piece.text.starts_with(' ')) piece.text.insert(0, " ");
        std::vector<Piece> split;
        if (step.use_regex) {
          SplitPiece(piece, FindPretokenizerMatches(piece.text, PretokenizerRegex::kGpt2), SplitBehavior::kIsolated,
                     false, &split);
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
        SplitPiece(piece, FindPretokenizerMatches(piece.text, step.regex), step.behavior, step.invert, &out);
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
          SplitPiece(piece, FindLiteral(piece.text, step.replacement), SplitBehavior::kMergedWithNext, false, &out);
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
        SplitPiece(piece, digits, step.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, false,
                   &out);
        break;
      }
    }
  }
  *pieces = std::move(out);
}

}  // namespace strata::policies::internal
