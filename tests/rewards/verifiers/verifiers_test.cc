#include "rewards/verifiers/verifiers.h"

#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace strata::rewards {
namespace {

VerifierSpec Spec(std::string check, std::string pattern = "", bool strict = false) {
  VerifierSpec spec;
  spec.check = std::move(check);
  spec.pattern = std::move(pattern);
  spec.strict = strict;
  return spec;
}

double Score(const VerifierSpec& spec, const std::string& response, const std::string& label) {
  auto verifier = MakeVerifier(spec);
  EXPECT_TRUE(verifier.ok()) << verifier.status();
  return verifier.ok() ? (*verifier)("a prompt", response, label) : -1.0;
}

struct MathCase {
  std::string response;
  std::string label;
  bool strict;
  double want;
};

TEST(MathVerifierTest, ScoresTheTable) {
  const std::vector<MathCase> cases = {
      // Thousands separators, in the answer or in the label.
      {"#### 1,234", "1234", false, 1},
      {"The answer is 1,234.", "1234", false, 1},
      {"#### 1234567", "1,234,567", false, 1},
      {"\\boxed{1{,}000}", "1000", false, 1},
      {"I count 1,23", "23", false, 1},  // "1,23" is no thousands separator: 1, then 23
      {"The numbers are 1, 2, and 3.", "3", false, 1},
      // The same number written as a decimal, a fraction, a LaTeX fraction.
      {"\\boxed{0.5}", "1/2", false, 1},
      {"\\boxed{1/2}", "\\frac{1}{2}", false, 1},
      {"\\boxed{\\frac{1}{2}}", "0.5", false, 1},
      {"\\boxed{\\dfrac12}", "0.5", false, 1},
      {"about .5 of them", "0.5", false, 1},
      {"The answer: 3/4", "0.75", false, 1},
      {"\\boxed{1e3}", "1000", false, 1},
      {"3.0", "3", false, 1},
      {"\\boxed{3}", "3.00", false, 1},
      // Boxes: nested braces, the last box wins, a box beats later numbers.
      {"so $\\boxed{\\frac{3}{4}}$", "0.75", false, 1},
      {"\\boxed{\\frac{-3}{4}}", "-0.75", false, 1},
      {"First \\boxed{3}, then \\boxed{4}", "4", false, 1},
      {"First \\boxed{3}, then \\boxed{4}", "3", false, 0},
      {"\\boxed{\\boxed{7}}", "7", false, 1},
      {"\\boxed{5}. Check: 5 + 1 = 6", "5", false, 1},
      {"\\boxed{5 and then 7", "7", false, 1},  // a box that never closes is ignored
      {"\\boxed{} so 5", "5", false, 1},        // so is a blank one
      // "####" answers: the last one wins; a sentence's period is no part of it.
      {"#### 1,000\nWait, let me recount.\n#### 72", "72", false, 1},
      {"#### 1,000\nWait, let me recount.\n#### 72", "1000", false, 0},
      {"#### 5.", "5", false, 1},
      {"#### $1,000.00", "1000", false, 1},
      {"#### The answer is 5", "5", false, 0},  // the whole line is the answer, and it is no number
      // Signs.
      {"The temperature fell to -3 degrees", "-3", false, 1},
      {"x = -3", "3", false, 0},
      {"so x = -\\frac{1}{2}", "-0.5", false, 1},
      {"from 3-4", "4", false, 1},  // a minus after a digit is no sign
      {"3-4 is -1", "-1", false, 1},
      {"\xE2\x88\x92"
       "3",
       "3", false, 1},  // U+2212 is no sign
      // The documented trap: without a box or "####", the last number wins.
      {"the answer is 12 apples, not 13", "12", false, 0},
      {"the answer is 12 apples, not 13", "13", false, 1},
      // Strict mode ignores bare numbers.
      {"the answer is 12", "12", true, 0},
      {"the answer is \\boxed{12}", "12", true, 1},
      {"the answer is\n#### 12", "12", true, 1},
      // Nothing to extract.
      {"", "5", false, 0},
      {"I don't know", "5", false, 0},
      {"", "", false, 0},
      // Tolerance: relative 1e-6.
      {"\\boxed{1000000.1}", "1000000", false, 1},  // 1e-7 apart
      {"\\boxed{100.001}", "100", false, 0},        // 1e-5 apart
      {"\\boxed{0.0000000001}", "0", false, 1},     // absolute 1e-9 near 0
      // Huge numbers.
      {"\\boxed{123456789012345678901234567890}", "1.2345678901234568e29", false, 1},
      {"\\boxed{1000000000000000000000000000000}", "2000000000000000000000000000000", false, 0},
      // Dollar and percent signs.
      {"It costs $4.", "4", false, 1},
      {"\\boxed{\\$18}", "18", false, 1},
      {"#### 5", "\\$5", false, 1},
      {"\\boxed{50\\%}", "50", false, 1},
      {"The rate is 50%", "50", false, 1},
      {"#### 5", "5%", false, 1},
      // Text answers: equal without spaces, wrappers removed.
      {"\\boxed{x+1}", "x + 1", false, 1},
      {"\\boxed{\\text{Paris}}", "Paris", false, 1},
      {"\\boxed{x+2}", "x+1", false, 0},
      {"\\boxed{\\{1,2\\}}", "\\{1, 2\\}", false, 1},
      {"\\boxed{1/0}", "0", false, 0},  // no number (a zero denominator): compared as text
  };
  ASSERT_GE(cases.size(), 40u);
  for (const MathCase& c : cases) {
    EXPECT_EQ(Score(Spec("math", "", c.strict), c.response, c.label), c.want)
        << "response '" << c.response << "' label '" << c.label << "' strict " << c.strict;
  }
}

TEST(MathVerifierTest, ExtractsTheFinalAnswer) {
  struct Case {
    std::string response;
    bool strict;
    std::optional<std::string> want;
  };
  const std::vector<Case> cases = {
      {"\\boxed{\\frac{3}{4}}", false, "\\frac{3}{4}"},
      {"\\boxed{ 12 } and 13", false, "12"},
      {"\\boxed{3} \\boxed{4}", true, "4"},
      {"#### 1,000", false, "1,000"},
      {"#### 5 ####", false, "5"},
      {"#### 5\n####   \n", false, "5"},
      {"##### 6", false, "6"},
      {"### 6", true, std::nullopt},  // 3 '#' are no marker
      {"costs $1,234.50 today", false, "1,234.50"},
      {"x = -\\frac{1}{2}.", false, "-\\frac{1}{2}"},
      {"(-2)", false, "-2"},
      {"x-1", false, "1"},
      {"1234,567", false, "567"},
      {"12/25/2023", false, "2023"},
      {"speed 3e8 m/s", false, "3e8"},
      {"no digits", false, std::nullopt},
      {"12 apples", true, std::nullopt},
      {"", false, std::nullopt},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ExtractFinalAnswer(c.response, c.strict), c.want) << "'" << c.response << "' strict " << c.strict;
  }
}

TEST(MathVerifierTest, ParsesNumbers) {
  struct Case {
    std::string text;
    std::optional<double> want;
  };
  const std::vector<Case> cases = {
      {"1,234", 1234},
      {"1,234,567.5", 1234567.5},
      {"-3", -3},
      {"+2", 2},
      {"0.5", 0.5},
      {".5", 0.5},
      {"1/2", 0.5},
      {"-1/4", -0.25},
      {"\\frac{1}{2}", 0.5},
      {"\\dfrac12", 0.5},
      {"\\tfrac{ 3 }{ 4 }", 0.75},
      {"-\\frac{1}{2}", -0.5},
      {"$4", 4},
      {"\\$4", 4},
      {"$4$", 4},
      {"4%", 4},
      {"3.0", 3},
      {"1e3", 1000},
      {"2.5E-4", 0.00025},
      {"  7. ", 7},
      {"\\text{7}", 7},
      {"\\mathbf{\\text{$7$}}", 7},
      {"1\\,000", 1000},
      {"", std::nullopt},
      {"abc", std::nullopt},
      {"1 2", std::nullopt},
      {"1,23", std::nullopt},
      {"3 apples", std::nullopt},
      {"--3", std::nullopt},
      {"1/0", std::nullopt},
      {"\\frac{1}{0}", std::nullopt},
      {"1e999", std::nullopt},
      {"1e-999", std::nullopt},
      {"x+1", std::nullopt},
      {"\\text{a}b{7}", std::nullopt},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ParseMathNumber(c.text), c.want) << "'" << c.text << "'";
  }
}

TEST(MathVerifierTest, EqualWithinRelativeOneInAMillion) {
  EXPECT_TRUE(MathEqual(3, 3));
  EXPECT_TRUE(MathEqual(1.0, 1.0 + 1e-7));
  EXPECT_FALSE(MathEqual(1.0, 1.0 + 1e-5));
  EXPECT_TRUE(MathEqual(-1e12, -1e12 - 1e5));
  EXPECT_TRUE(MathEqual(0, 5e-10));
  EXPECT_FALSE(MathEqual(0, 1e-8));
  EXPECT_FALSE(MathEqual(NAN, NAN));
  EXPECT_FALSE(MathEqual(INFINITY, 1e300));
  EXPECT_FALSE(MathEqual(1, -1));
}

TEST(MathVerifierTest, LongInputsScanInLinearTime) {
  // Shapes that make a naive scan quadratic: boxes that never close, a
  // marker per character, \frac prefixes that never complete.
  const std::vector<std::string> inputs = {
      [] {
        std::string s;
        for (int i = 0; i < 100000; ++i) s += "\\boxed{";
        return s;
      }(),
      std::string(400000, '#') + std::string(100000, ' '),
      [] {
        std::string s;
        for (int i = 0; i < 50000; ++i) s += "\\frac{1 ";
        return s;
      }(),
      std::string(500000, '9'),
  };
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& in : inputs) {
    (void)ExtractFinalAnswer(in, false);
    (void)ParseMathNumber(in);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(ExactVerifierTest, ScoresTheTable) {
  struct Case {
    std::string response;
    std::string label;
    double want;
  };
  const std::vector<Case> cases = {
      {"Paris", "Paris", 1},
      {"Paris", "paris", 1},
      {"  PARIS\n", "paris\t", 1},
      {"Paris.", "Paris", 0},
      {"Pa ris", "Paris", 0},
      {"\xC3\xA9"
       "cole",
       "\xC3\xA9"
       "COLE",
       1},  // ASCII folded, UTF-8 bytes kept
      {"\xC3\x89"
       "COLE",
       "\xC3\xA9"
       "cole",
       0},  // É and é differ: no Unicode folding
      {"", "", 1},
      {"", "x", 0},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Score(Spec("exact"), c.response, c.label), c.want) << "'" << c.response << "' '" << c.label << "'";
  }
}

TEST(RegexVerifierTest, ScoresTheTable) {
  struct Case {
    std::string pattern;
    std::string response;
    double want;
  };
  const std::vector<Case> cases = {
      {"\\d+", "abc 123", 1},
      {"\\d+", "abc", 0},
      {"^yes$", "yes", 1},
      {"^yes$", "yes sir", 0},
      {"(?i)answer", "ANSWER: 4", 1},
      {"answer", "ANSWER: 4", 0},
      {"\\bcat\\b", "concatenate", 0},
      {"[[:upper:]]{3}", "the ABC", 1},
      {"\xC3\xA9{2}", "caf\xC3\xA9\xC3\xA9", 1},  // RE2 reads UTF-8: {2} repeats the rune
  };
  for (const Case& c : cases) {
    // The label is not read.
    EXPECT_EQ(Score(Spec("regex", c.pattern), c.response, "ignored"), c.want)
        << "/" << c.pattern << "/ on '" << c.response << "'";
  }
}

TEST(RegexVerifierTest, CatastrophicBacktrackingPatternReturnsQuickly) {
  const std::string response = std::string(100000, 'a') + "b";
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(Score(Spec("regex", "(a+)+$"), response, ""), 0.0);
  EXPECT_EQ(Score(Spec("regex", "(a|aa)+b"), response, ""), 1.0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST(RegexVerifierTest, InvalidOrOversizedPatternFailsAtMake) {
  auto invalid = MakeVerifier(Spec("regex", "(a"));
  ASSERT_FALSE(invalid.ok());
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(invalid.status().message().find("pattern"), std::string::npos) << invalid.status();
  EXPECT_NE(invalid.status().message().find("missing )"), std::string::npos) << invalid.status();

  // Within RE2's repetition limit (1000), but each letter class is hundreds
  // of instructions: beyond kRegexMaxMemBytes.
  auto oversized = MakeVerifier(Spec("regex", "\\pL{1000}"));
  ASSERT_FALSE(oversized.ok());
  EXPECT_NE(oversized.status().message().find("pattern too large"), std::string::npos) << oversized.status();
}

TEST(RegexVerifierTest, OneVerifierServesManyThreads) {
  auto verifier = MakeVerifier(Spec("regex", "#+ *\\d+$"));
  ASSERT_TRUE(verifier.ok());
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const bool match = i % 2 == 0;
        const std::string response = match ? "#### " + std::to_string(i) : "no " + std::to_string(i) + " x";
        wrong[t] += (*verifier)("", response, "") != (match ? 1.0 : 0.0);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
}

TEST(RuleVerifierTest, RulesScoreTheResponseAndIgnoreTheLabel) {
  EXPECT_DOUBLE_EQ(Score(Spec("vowel_fraction"), "aeiou", "xyz"), 1.0);
  EXPECT_DOUBLE_EQ(Score(Spec("length_ratio"), std::string(16, 'x'), ""), 0.5);
  EXPECT_DOUBLE_EQ(Score(Spec("contains:cat"), "a cat", "dog"), 1.0);
  EXPECT_DOUBLE_EQ(Score(Spec("contains:cat"), "a dog", "cat"), 0.0);
}

TEST(VerifierSpecTest, ValidateNamesTheField) {
  struct Case {
    VerifierSpec spec;
    std::string field;  // "" when valid
  };
  const std::vector<Case> cases = {
      {Spec("math"), ""},
      {Spec("math", "", true), ""},
      {Spec("exact"), ""},
      {Spec("regex", "a+"), ""},
      {Spec("vowel_fraction"), ""},
      {Spec("contains:cat"), ""},
      {Spec(""), "check is empty"},
      {Spec("sparkle"), "check 'sparkle' is unknown"},
      {Spec("contains:"), "check 'contains:' is unknown"},
      {Spec("regex"), "pattern is required"},
      {Spec("regex", "(a"), "pattern '(a' is not a valid RE2 pattern: missing )"},
      {Spec("regex", "a", true), "strict"},
      {Spec("math", "a"), "pattern is given but check 'math'"},
      {Spec("exact", "", true), "strict is set but check 'exact'"},
      {Spec("vowel_fraction", "", true), "strict is set"},
      {Spec("contains:cat", "cat"), "pattern is given"},
  };
  for (const Case& c : cases) {
    const absl::Status status = c.spec.Validate();
    const auto made = MakeVerifier(c.spec);
    if (c.field.empty()) {
      EXPECT_TRUE(status.ok()) << c.spec.check << ": " << status;
      EXPECT_TRUE(made.ok()) << c.spec.check << ": " << made.status();
      continue;
    }
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.spec.check;
    EXPECT_NE(status.message().find(c.field), std::string::npos) << status;
    EXPECT_EQ(made.status(), status) << c.spec.check;
  }
}

}  // namespace
}  // namespace strata::rewards
