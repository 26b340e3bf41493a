#include "policies/tokenizer/unicode.h"

#include <string>

#include "gtest/gtest.h"

namespace strata::policies {
namespace {

// The normalization forms of tokenizer.json normalizers, through ICU; bytes
// that are not UTF-8 pass through where they were.
TEST(UnicodeTest, NormalizationFormsAndInvalidBytes) {
  const std::string decomposed = "Cafe\xCC\x81";  // e + COMBINING ACUTE ACCENT
  const std::string composed = "Caf\xC3\xA9";     // U+00E9
  EXPECT_EQ(NormalizeUnicode(decomposed, UnicodeForm::kNfc), composed);
  EXPECT_EQ(NormalizeUnicode(composed, UnicodeForm::kNfd), decomposed);
  EXPECT_EQ(NormalizeUnicode("\xEF\xAC\x81", UnicodeForm::kNfkc), "fi");           // U+FB01 LATIN SMALL LIGATURE FI
  EXPECT_EQ(NormalizeUnicode("\xEF\xAC\x81", UnicodeForm::kNfc), "\xEF\xAC\x81");  // canonical forms keep it
  EXPECT_EQ(NormalizeUnicode("\xE2\x91\xA0", UnicodeForm::kNfkd), "1");            // U+2460 CIRCLED DIGIT ONE
  EXPECT_EQ(NormalizeUnicode("StRa\xC3\x9F"
                             "E",
                             UnicodeForm::kLowercase),
            "stra\xC3\x9F"
            "e");
  EXPECT_EQ(NormalizeUnicode("\xCE\x9F\xCE\xA3", UnicodeForm::kLowercase), "\xCE\xBF\xCF\x82");  // final sigma
  const std::string broken = decomposed + "\xFF" + decomposed;
  EXPECT_EQ(NormalizeUnicode(broken, UnicodeForm::kNfc), composed + "\xFF" + composed);
  EXPECT_EQ(NormalizeUnicode("", UnicodeForm::kNfc), "");
}

}  // namespace
}  // namespace strata::policies
