#include "rewards/verifiers/rule_rewards.h"

#include "gtest/gtest.h"

namespace strata::rewards {
namespace {

TEST(RuleRewardsTest, VowelFractionByHand) {
  auto rule = MakeRule("vowel_fraction");
  ASSERT_TRUE(rule.ok());
  EXPECT_DOUBLE_EQ((*rule)("p", "aeiou"), 1.0);
  EXPECT_DOUBLE_EQ((*rule)("p", "ab cd"), 0.25);  // spaces and punctuation do not count
  EXPECT_DOUBLE_EQ((*rule)("p", "A!"), 1.0);
  EXPECT_DOUBLE_EQ((*rule)("p", ""), 0.0);
  EXPECT_DOUBLE_EQ((*rule)("p", "123"), 0.0);
}

TEST(RuleRewardsTest, OtherRulesAndUnknownNames) {
  EXPECT_DOUBLE_EQ((*MakeRule("contains:cat"))("", "a cat"), 1.0);
  EXPECT_DOUBLE_EQ((*MakeRule("contains:cat"))("", "a dog"), 0.0);
  EXPECT_DOUBLE_EQ((*MakeRule("length_ratio"))("", std::string(16, 'x')), 0.5);
  const auto unknown = MakeRule("sparkle");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("sparkle"), std::string::npos);
}

}  // namespace
}  // namespace strata::rewards
