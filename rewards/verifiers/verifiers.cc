#include "rewards/verifiers/verifiers.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "re2/re2.h"
#include "rewards/verifiers/rule_rewards.h"

namespace strata::rewards {
namespace {

// Every scan below moves forward only, and a failed attempt at one place
// covers text no other attempt covers (see MatchNumber), so each verifier is
// linear in its input: the fuzzer feeds them arbitrary bytes.

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

char At(std::string_view s, size_t i) { return i < s.size() ? s[i] : '\0'; }

// Debian's Abseil has its own string_view, apart from std's: these few
// helpers keep to std::string_view.
bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

bool IsAlnum(char c) { return IsDigit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'); }

char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c | 0x20) : c; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

bool ConsumePrefix(std::string_view& s, std::string_view prefix) {
  if (!s.starts_with(prefix)) return false;
  s.remove_prefix(prefix.size());
  return true;
}

bool ConsumeSuffix(std::string_view& s, std::string_view suffix) {
  if (!s.ends_with(suffix)) return false;
  s.remove_suffix(suffix.size());
  return true;
}

bool EqualsIgnoreAsciiCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

void SkipSpaces(std::string_view s, size_t& i) {
  while (IsSpace(At(s, i))) ++i;
}

// integer: digits, or 1-3 digits then groups of "," and exactly 3 digits.
// Appends the digits (without commas) to `out`.
bool MatchInteger(std::string_view s, size_t& i, std::string& out) {
  const size_t start = i;
  while (IsDigit(At(s, i))) ++i;
  if (i == start) return false;
  out.append(s.substr(start, i - start));
  if (i - start > 3) return true;
  while (At(s, i) == ',' && IsDigit(At(s, i + 1)) && IsDigit(At(s, i + 2)) && IsDigit(At(s, i + 3)) &&
         !IsDigit(At(s, i + 4))) {
    out.append(s.substr(i + 1, 3));
    i += 4;
  }
  return true;
}

// decimal: integer ["." digits] | "." digits, then an optional exponent
// ([eE] [+-] digits). Appends its text in from_chars' syntax to `out`.
bool MatchDecimal(std::string_view s, size_t& i, std::string& out) {
  if (IsDigit(At(s, i))) {
    MatchInteger(s, i, out);
  } else if (At(s, i) == '.' && IsDigit(At(s, i + 1))) {
    out.push_back('0');
  } else {
    return false;
  }
  if (At(s, i) == '.' && IsDigit(At(s, i + 1))) {
    const size_t start = i++;
    while (IsDigit(At(s, i))) ++i;
    out.append(s.substr(start, i - start));
  }
  if (At(s, i) == 'e' || At(s, i) == 'E') {
    size_t j = i + 1;
    if (At(s, j) == '+' || At(s, j) == '-') ++j;
    if (IsDigit(At(s, j))) {
      while (IsDigit(At(s, j))) ++j;
      out.append(s.substr(i, j - i));
      i = j;
    }
  }
  return true;
}

double DecimalValue(const std::string& text) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  // Out of range (over- or underflow) too: the answer is then no finite
  // number, and compares as text.
  return ec == std::errc() && end == text.data() + text.size() ? value : NAN;
}

// One argument of \frac: "{" [sign] decimal "}" (spaces inside), or one digit.
bool MatchFracArgument(std::string_view s, size_t& i, double& value) {
  SkipSpaces(s, i);
  std::string text;
  if (IsDigit(At(s, i))) {
    text.push_back(s[i++]);
    value = DecimalValue(text);
    return true;
  }
  if (At(s, i) != '{') return false;
  ++i;
  SkipSpaces(s, i);
  bool negative = false;
  if (At(s, i) == '-' || At(s, i) == '+') negative = s[i++] == '-';
  if (!MatchDecimal(s, i, text)) return false;
  SkipSpaces(s, i);
  if (At(s, i) != '}') return false;
  ++i;
  value = negative ? -DecimalValue(text) : DecimalValue(text);
  return true;
}

// number without its sign: latex | decimal ["/" decimal]. On a match, moves
// `i` past it and sets `value` (NaN or infinite when it has no finite value).
bool MatchNumber(std::string_view s, size_t& i, double& value) {
  size_t j = i;
  if (At(s, j) == '\\') {
    for (std::string_view name : {"\\frac", "\\dfrac", "\\tfrac"}) {
      if (s.substr(j, name.size()) != name) continue;
      j += name.size();
      double numerator = 0, denominator = 0;
      if (!MatchFracArgument(s, j, numerator) || !MatchFracArgument(s, j, denominator)) return false;
      value = denominator == 0 ? NAN : numerator / denominator;
      i = j;
      return true;
    }
    return false;
  }
  std::string text;
  if (!MatchDecimal(s, j, text)) return false;
  value = DecimalValue(text);
  if (At(s, j) == '/') {
    size_t k = j + 1;
    std::string denominator;
    if (MatchDecimal(s, k, denominator)) {
      const double d = DecimalValue(denominator);
      value = d == 0 ? NAN : value / d;
      j = k;
    }
  }
  i = j;
  return true;
}

bool SignMayPrecede(std::string_view s, size_t minus) {
  if (minus == 0) return true;
  const char c = s[minus - 1];
  return !IsAlnum(c) && c != ')' && c != ']' && c != '}';
}

// The last number of `s` (see the header's grammar), as written.
std::optional<std::string_view> LastNumber(std::string_view s) {
  std::optional<std::string_view> last;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    const bool after_digit = i > 0 && IsDigit(s[i - 1]);
    const bool may_start = ((IsDigit(c) || (c == '.' && IsDigit(At(s, i + 1)))) && !after_digit) || c == '\\';
    size_t end = i;
    double value = 0;
    if (may_start && MatchNumber(s, end, value)) {
      const size_t begin = i > 0 && s[i - 1] == '-' && SignMayPrecede(s, i - 1) ? i - 1 : i;
      last = s.substr(begin, end - begin);
      i = end;
    } else {
      ++i;
    }
  }
  return last;
}

// The content of the last \boxed{...} (by where it opens) that closes and is
// not blank. One pass: `open` holds, per unclosed brace, where a box's
// content starts (npos for any other brace).
std::optional<std::string_view> LastBoxed(std::string_view s) {
  constexpr std::string_view kBox = "\\boxed{";
  std::vector<size_t> open;
  std::optional<std::string_view> best;
  size_t best_start = 0;
  for (size_t i = 0; i < s.size();) {
    if (s[i] == '\\') {
      if (s.substr(i, kBox.size()) == kBox) {
        i += kBox.size();
        open.push_back(i);
      } else {
        i += At(s, i + 1) == '{' || At(s, i + 1) == '}' ? 2 : 1;  // \{ and \} are not braces
      }
      continue;
    }
    if (s[i] == '{') {
      open.push_back(std::string_view::npos);
    } else if (s[i] == '}' && !open.empty()) {
      const size_t start = open.back();
      open.pop_back();
      if (start != std::string_view::npos && (!best || start > best_start)) {
        const std::string_view content = Trim(s.substr(start, i - start));
        if (!content.empty()) {
          best = content;
          best_start = start;
        }
      }
    }
    ++i;
  }
  return best;
}

// The text after the last "####" marker (4 or more '#') up to the end of
// its line or the next marker, where that text is not blank.
std::optional<std::string_view> LastHashAnswer(std::string_view s) {
  std::optional<std::string_view> best;
  size_t segment = std::string_view::npos;  // where the current marker's text starts
  auto close = [&](size_t end) {
    if (segment == std::string_view::npos) return;
    const std::string_view text = Trim(s.substr(segment, end - segment));
    if (!text.empty()) best = text;
    segment = std::string_view::npos;
  };
  for (size_t i = 0; i < s.size();) {
    if (s[i] == '#') {
      size_t end = i;
      while (At(s, end) == '#') ++end;
      if (end - i >= 4) {
        close(i);
        segment = end;
      }
      i = end;
      continue;
    }
    if (s[i] == '\n') close(i);
    ++i;
  }
  close(s.size());
  return best;
}

// ParseMathNumber's removals at the ends. Unwrapping costs a scan of the
// content, so at most kMaxWrappers are removed (linear time).
constexpr int kMaxWrappers = 4;

bool UnwrapOnce(std::string_view& s) {
  for (std::string_view name : {"\\text{", "\\textbf{", "\\mathrm{", "\\mathbf{", "\\boxed{"}) {
    if (!s.starts_with(name) || !s.ends_with("}")) continue;
    int depth = 1;
    for (size_t i = name.size(); i < s.size(); ++i) {
      if (s[i] == '{') ++depth;
      if (s[i] == '}' && --depth == 0) {
        if (i + 1 != s.size()) return false;  // "\text{a}b{c}": the wrapper is not around all of it
        s = s.substr(name.size(), s.size() - name.size() - 1);
        return true;
      }
    }
    return false;
  }
  return false;
}

void DropEither(std::string_view& s, bool suffix, std::string_view a, std::string_view b) {
  if (suffix) {
    if (!ConsumeSuffix(s, a)) ConsumeSuffix(s, b);
  } else if (!ConsumePrefix(s, a)) {
    ConsumePrefix(s, b);
  }
}

std::string_view StripAnswerEnds(std::string_view s) {
  int wrappers = 0;
  while (true) {
    const size_t before = s.size();
    s = Trim(s);
    if (wrappers < kMaxWrappers && UnwrapOnce(s)) ++wrappers;
    DropEither(s, /*suffix=*/false, "\\$", "$");
    DropEither(s, /*suffix=*/true, "\\$", "$");
    DropEither(s, /*suffix=*/true, "\\%", "%");
    ConsumeSuffix(s, ".");
    if (s.size() == before) return s;
  }
}

std::string WithoutSpaces(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (!IsSpace(c)) out.push_back(c);
  }
  return out;
}

double MathScore(std::string_view response, const std::string& label, bool strict) {
  const std::optional<std::string> answer = ExtractFinalAnswer(response, strict);
  if (!answer) return 0.0;
  const std::optional<double> got = ParseMathNumber(*answer);
  const std::optional<double> want = ParseMathNumber(label);
  if (got && want) return MathEqual(*got, *want) ? 1.0 : 0.0;
  return TextAnswersEqual(*answer, label) ? 1.0 : 0.0;
}

RE2::Options RegexOptions() {
  RE2::Options options;
  options.set_max_mem(kRegexMaxMemBytes);
  options.set_log_errors(false);
  return options;
}

constexpr char kChecks[] = "math, exact, regex, or a rule: vowel_fraction, length_ratio, contains:WORD";

}  // namespace

absl::Status VerifierSpec::Validate() const {
  if (check.empty()) return absl::InvalidArgumentError(absl::StrCat("check is empty; expected ", kChecks));
  const bool is_rule = check != "math" && check != "exact" && check != "regex";
  if (is_rule && !MakeRule(check).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("check '", check, "' is unknown; expected ", kChecks));
  }
  if (check == "regex") {
    if (pattern.empty()) return absl::InvalidArgumentError("pattern is required by check 'regex'");
    const RE2 re(pattern, RegexOptions());
    if (!re.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("pattern '", pattern, "' is not a valid RE2 pattern: ", re.error()));
    }
  } else if (!pattern.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pattern is given but check '", check, "' takes none (only regex reads it)"));
  }
  if (strict && check != "math") {
    return absl::InvalidArgumentError(
        absl::StrCat("strict is set but check '", check, "' takes none (only math reads it)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<VerifierFn> MakeVerifier(const VerifierSpec& spec) {
  STRATA_RETURN_IF_ERROR(spec.Validate());
  if (spec.check == "math") {
    return VerifierFn([strict = spec.strict](const std::string&, const std::string& response,
                                             const std::string& label) { return MathScore(response, label, strict); });
  }
  if (spec.check == "exact") {
    return VerifierFn([](const std::string&, const std::string& response, const std::string& label) {
      return EqualsIgnoreAsciiCase(Trim(response), Trim(label)) ? 1.0 : 0.0;
    });
  }
  if (spec.check == "regex") {
    // RE2's matching is const and thread-safe; the verifier's copies share it.
    auto re = std::make_shared<const RE2>(spec.pattern, RegexOptions());
    if (!re->ok()) return absl::InvalidArgumentError(absl::StrCat("pattern: ", re->error()));
    return VerifierFn([re](const std::string&, const std::string& response, const std::string&) {
      return RE2::PartialMatch(response, *re) ? 1.0 : 0.0;
    });
  }
  STRATA_ASSIGN_OR_RETURN(RuleFn rule, MakeRule(spec.check));
  return VerifierFn([rule = std::move(rule)](const std::string& prompt, const std::string& response,
                                             const std::string&) { return rule(prompt, response); });
}

std::optional<std::string> ExtractFinalAnswer(std::string_view response, bool strict) {
  if (auto boxed = LastBoxed(response)) return std::string(*boxed);
  if (auto hashed = LastHashAnswer(response)) return std::string(*hashed);
  if (strict) return std::nullopt;
  if (auto number = LastNumber(response)) return std::string(*number);
  return std::nullopt;
}

std::optional<double> ParseMathNumber(std::string_view text) {
  // LaTeX's thousands separators "{,}" and "\\," read as ",".
  std::string replaced;
  if (text.find("{,}") != std::string_view::npos || text.find("\\,") != std::string_view::npos) {
    replaced.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      if (text.substr(i, 3) == "{,}" || text.substr(i, 2) == "\\,") {
        replaced.push_back(',');
        i += text[i] == '{' ? 3 : 2;
      } else {
        replaced.push_back(text[i++]);
      }
    }
    text = replaced;
  }
  std::string_view s = StripAnswerEnds(text);
  size_t i = 0;
  bool negative = false;
  if (At(s, i) == '-' || At(s, i) == '+') negative = s[i++] == '-';
  double value = 0;
  if (!MatchNumber(s, i, value) || i != s.size() || !std::isfinite(value)) return std::nullopt;
  return negative ? -value : value;
}

bool MathEqual(double a, double b) {
  if (a == b) return true;
  if (!std::isfinite(a) || !std::isfinite(b)) return false;
  const double diff = std::fabs(a - b);
  return diff <= 1e-9 || diff <= 1e-6 * std::max(std::fabs(a), std::fabs(b));
}

bool TextAnswersEqual(std::string_view a, std::string_view b) {
  return WithoutSpaces(StripAnswerEnds(a)) == WithoutSpaces(StripAnswerEnds(b));
}

}  // namespace strata::rewards
