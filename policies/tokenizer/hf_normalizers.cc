#include "policies/tokenizer/hf_components.h"

#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "policies/tokenizer/hf_text.h"

namespace strata::policies::internal {

void ParseNormalizer(const Json& n, const std::string& where, std::vector<NormalizerStep>* out) {
  const std::string type = TypeOf(n, where);
  if (ExpandSequence(n, type, "normalizers", where, &ParseNormalizer, out)) return;
  NormalizerStep step;
  if (type == "Prepend") {
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

void ApplyNormalizer(const NormalizerStep& step, std::string* text) {
  switch (step.kind) {
    case NormalizerStep::Kind::kPrepend:
      if (!text->empty()) text->insert(0, step.to);
      return;
    case NormalizerStep::Kind::kReplace:
      ReplaceAll(text, step.from, step.to);
      return;
    case NormalizerStep::Kind::kUnicode:
      *text = NormalizeUnicode(*text, step.form);
      return;
    case NormalizerStep::Kind::kStrip: {
      std::string_view view = *text;
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
      *text = std::string(view);
      return;
    }
  }
}

}  // namespace strata::policies::internal
