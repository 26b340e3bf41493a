#include "policies/tokenizer/hf_components.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "policies/tokenizer/hf_text.h"
#include "policies/tokenizer/piece_syntax.h"

namespace strata::policies::internal {

void ParseDecoder(const Json& d, const std::string& where, std::vector<DecoderStep>* out) {
  const std::string type = TypeOf(d, where);
  if (ExpandSequence(d, type, "decoders", where, &ParseDecoder, out)) return;
  DecoderStep step;
  if (type == "ByteLevel") {
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
        const int byte = BytePieceValue(t);
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

}  // namespace strata::policies::internal
