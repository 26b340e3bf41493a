// Built-in verifiers (a reward source of kind "verifier"): a response scored
// against its record's label, with no model. A verifier is a pure function
// of its three strings, linear in their length, and safe to call from many
// threads at once.
//
//   math    the response's final answer (ExtractFinalAnswer) against the
//           label: 1 when both parse as numbers (ParseMathNumber) and are
//           MathEqual; when either does not, 1 when both are equal as text
//           (TextAnswersEqual); 0 when the response has no answer.
//   exact   1 when the response equals the label after trimming ASCII
//           whitespace at both ends, ASCII letters compared without case
//           (other bytes, UTF-8 included, compared as they are).
//   regex   1 when the RE2 `pattern` matches anywhere in the response
//           (RE2::PartialMatch); the label is not read. The pattern is
//           compiled once, with its memory bounded (kRegexMaxMemBytes), so a
//           tenant's pattern cannot backtrack or grow without bound.
//   a rule  vowel_fraction, length_ratio, contains:WORD (rule_rewards.h):
//           a score of (prompt, response); the label is not read.
//
// The grammar of numbers, shared by the last-number scan and by
// ParseMathNumber:
//
//   integer   digits, or 1-3 digits then groups of "," and exactly 3 digits
//             ("1,234,567"; "1,23" is 1 then 23; "1234,567" is 1234 then 567)
//   decimal   (integer ["." digits] | "." digits) [exponent]
//             ("3.0", ".5", "1,234.5", "1e3", "2.5E-4"); exponent is
//             "e" or "E", an optional sign, and digits
//   fraction  decimal "/" decimal                       ("1/2", "3/4")
//   latex     \frac, \dfrac or \tfrac with two arguments, each "{" [sign]
//             decimal "}" (spaces allowed inside) or one digit
//             ("\frac{1}{2}", "\dfrac12", "\frac{-3}{4}")
//   number    ["-"] (latex | fraction | decimal)
//
// The last number in a text (ExtractFinalAnswer's last resort) is the last
// match of that grammar found by one left-to-right scan that takes the
// longest match at each place it can start:
//   - a match starts at a digit not preceded by a digit, at a "."
//     followed by a digit and not preceded by a digit, or at \frac, \dfrac
//     or \tfrac;
//   - "-" is the number's sign only when it directly precedes it and follows
//     neither a letter, a digit, nor ")", "]", "}" (so "3-4" is 3 then 4,
//     "x-1" is 1, "= -2" and "(-2)" are -2); "+" is never part of it;
//   - a "." with no digit after it ends the number ("5." at a sentence's end
//     is 5); a "," not followed by exactly 3 digits and then a non-digit
//     ends it too ("1, 2 and 3" is three numbers);
//   - no spaces inside, and the Unicode minus sign is not a sign; "$",
//     "%", units and words around a number are skipped.
// So "the answer is 12 apples, not 13" answers 13: without a \boxed{} or
// "####" answer the last number wins, even where the text says otherwise.
//
// ParseMathNumber reads a whole answer (a \boxed{} content, a "####" line,
// a label) as one number. Before the grammar above it removes, repeatedly:
// ASCII whitespace at both ends; one wrapper \text{...}, \textbf{...},
// \mathrm{...}, \mathbf{...} or \boxed{...} around the whole text; "$" or
// "\$" at either end; "%" or "\%" at the end (so "4%" is 4: labels hold the
// bare number, as GSM8K's do); one "." at the end. At most 4 wrappers are
// removed. It also reads "{,}" and "\," as "," and a leading "+" as no
// sign. Anything else left over (units, words, a second number, spaces
// inside) makes it not a number.
#ifndef STRATA_REWARDS_VERIFIERS_VERIFIERS_H_
#define STRATA_REWARDS_VERIFIERS_VERIFIERS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::rewards {

// RE2's memory budget for one tenant's compiled pattern (RE2::Options::max_mem);
// a pattern that needs more is invalid.
inline constexpr int64_t kRegexMaxMemBytes = int64_t{8} << 20;

// One verifier, as a job spec's reward source of kind "verifier" gives it.
struct VerifierSpec {
  // "math", "exact", "regex", or a rule's name (vowel_fraction,
  // length_ratio, contains:WORD).
  std::string check;
  // regex only, and required there: the pattern, in RE2 syntax.
  std::string pattern;
  // math only: when true, only a \boxed{...} or "#### N" answer counts (never
  // the last number of the text).
  bool strict = false;

  // INVALID_ARGUMENT naming the field: `check` empty or unknown, `pattern`
  // missing for regex or not valid RE2 (with RE2's error, or too large for
  // kRegexMaxMemBytes), `pattern` or `strict` given to a check that takes none.
  absl::Status Validate() const;
};

// Scores a response against the record's label, in [0, 1]. Thread-safe.
using VerifierFn =
    std::function<double(const std::string& prompt, const std::string& response, const std::string& label)>;

// The verifier `spec` names; Validate()'s error when it is not valid. A
// regex is compiled here, once; the function holds it.
absl::StatusOr<VerifierFn> MakeVerifier(const VerifierSpec& spec);

// math's parts, exposed for tests and the fuzzer.

// The response's final answer, trimmed of ASCII whitespace, from the first
// of these that the response has:
//   1. the content of its last \boxed{...} (last by where it opens, so in
//      nested boxes the inner one; braces inside it balanced, e.g.
//      "\boxed{\frac{3}{4}}" gives "\frac{3}{4}"); a box that never closes,
//      or holds only whitespace, is ignored;
//   2. the text after its last "####" marker (4 or more '#') up to the end
//      of the line or the next marker, where that text is not blank
//      ("#### 1,000" gives "1,000");
//   3. unless `strict`: its last number (see the grammar above), as written
//      ("1,234", "-3", "1/2", "\frac{1}{2}").
// nullopt when none of them is there.
std::optional<std::string> ExtractFinalAnswer(std::string_view response, bool strict);

// `text` as one number (see the grammar above), or nullopt when it is not
// one, or when its value is not finite or divides by zero.
std::optional<double> ParseMathNumber(std::string_view text);

// Whether two answers are the same number: within a relative 1e-6 of the
// larger magnitude, or an absolute 1e-9 (for values near 0). NaN equals
// nothing.
bool MathEqual(double a, double b);

// Whether two answers that are not both numbers are the same text: equal
// after ParseMathNumber's removals at the ends (wrappers, "$", "%", a
// trailing ".") and with every ASCII whitespace character removed
// ("\boxed{x+1}"'s "x+1" equals "x + 1").
bool TextAnswersEqual(std::string_view a, std::string_view b);

}  // namespace strata::rewards

#endif  // STRATA_REWARDS_VERIFIERS_VERIFIERS_H_
