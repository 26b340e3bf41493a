// A response and, after "\n----\n", a label, as a tenant's data and its
// model's output reach the built-in verifiers: the math answer's extraction
// (both modes) and number parsing, and the math and exact verifiers over
// them. The response is also tried as a tenant's RE2 pattern. The scans are
// linear, so libFuzzer's -timeout catches any that is not.
#include "fuzz/fuzz_util.h"
#include "rewards/verifiers/verifiers.h"

#include <cmath>
#include <string>
#include <utility>

namespace {

using strata::fuzz::Check;
namespace rewards = strata::rewards;

bool IsTrimmed(const std::string& s) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  return !s.empty() && !space(s.front()) && !space(s.back());
}

rewards::VerifierSpec Spec(std::string check, std::string pattern = "", bool strict = false) {
  rewards::VerifierSpec spec;
  spec.check = std::move(check);
  spec.pattern = std::move(pattern);
  spec.strict = strict;
  return spec;
}

void CheckScore(double score, const char* what) { Check(score == 0.0 || score == 1.0, what); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto [response_view, label_view] = strata::fuzz::SplitOnce(in);
  const std::string response(response_view), label(label_view);

  const auto strict = rewards::ExtractFinalAnswer(response, /*strict=*/true);
  const auto loose = rewards::ExtractFinalAnswer(response, /*strict=*/false);
  Check(!strict || loose == strict, "a strict answer is the non-strict answer too");
  Check(!strict || IsTrimmed(*strict), "strict answer trimmed and not empty");
  Check(!loose || IsTrimmed(*loose), "answer trimmed and not empty");
  Check(!loose || response.find(*loose) != std::string::npos, "answer is a part of the response");
  if (loose && !strict) {
    // The last number, as written: it reads back as a number unless its
    // value is not finite (overflow, a zero denominator).
    const bool parsed = rewards::ParseMathNumber(*loose).has_value();
    Check(parsed || loose->find_first_of("/eE") != std::string::npos || loose->find("frac") != std::string::npos ||
              loose->size() > 300,
          "the last number parses");
  }

  for (const std::string* text : {&response, &label}) {
    if (auto value = rewards::ParseMathNumber(*text)) {
      Check(std::isfinite(*value), "a parsed number is finite");
      Check(rewards::MathEqual(*value, *value), "MathEqual is reflexive");
    }
    Check(rewards::TextAnswersEqual(*text, *text), "TextAnswersEqual is reflexive");
  }

  for (bool strict_mode : {false, true}) {
    auto math = rewards::MakeVerifier(Spec("math", "", strict_mode));
    Check(math.ok(), "math verifier");
    CheckScore((*math)("", response, label), "math score");
  }
  auto exact = rewards::MakeVerifier(Spec("exact"));
  Check(exact.ok(), "exact verifier");
  CheckScore((*exact)("", response, label), "exact score");
  Check((*exact)("", response, response) == 1.0, "exact is reflexive");

  if (!response.empty() && response.size() <= 256) {
    auto regex = rewards::MakeVerifier(Spec("regex", response));
    Check(regex.ok() == Spec("regex", response).Validate().ok(), "MakeVerifier fails exactly where Validate does");
    if (regex.ok()) CheckScore((*regex)("", label, ""), "regex score");
  }
  return 0;
}
