#include "offload/tiers/tier_accounting.h"

#include "gtest/gtest.h"

namespace strata::offload {
namespace {

TEST(TierAccountingTest, BudgetIsEnforcedAndNamed) {
  TierBudgets budgets;
  budgets[Tier::kDevice] = 1000;
  TierAccountant accountant(budgets);
  ASSERT_TRUE(accountant.Reserve(Tier::kDevice, 600, "layer 0").ok());
  const auto over = accountant.Reserve(Tier::kDevice, 500, "layer 1");
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.message().find("device"), std::string::npos);
  EXPECT_NE(over.message().find("layer 1"), std::string::npos);
  accountant.Release(Tier::kDevice, 600);
  EXPECT_TRUE(accountant.Reserve(Tier::kDevice, 1000, "layer 1").ok());
  EXPECT_TRUE(accountant.Reserve(Tier::kHost, size_t{1} << 40, "unlimited host").ok());
}

TEST(TierAccountingTest, PhasePeaksAreSeparate) {
  TierAccountant accountant(TierBudgets{});
  accountant.BeginPhase("rollout");
  ASSERT_TRUE(accountant.Reserve(Tier::kDevice, 300, "a").ok());
  accountant.Release(Tier::kDevice, 300);
  accountant.BeginPhase("update");
  ASSERT_TRUE(accountant.Reserve(Tier::kDevice, 100, "b").ok());
  ASSERT_TRUE(accountant.Reserve(Tier::kNvme, 50, "c").ok());
  EXPECT_EQ(accountant.PhaseUsage("rollout").peak_of(Tier::kDevice), 300u);
  EXPECT_EQ(accountant.PhaseUsage("update").peak_of(Tier::kDevice), 100u);
  EXPECT_EQ(accountant.PhaseUsage("update").peak_of(Tier::kNvme), 50u);
  EXPECT_EQ(accountant.Usage().peak_of(Tier::kDevice), 300u);
  EXPECT_EQ(accountant.PhaseUsage("never").peak_of(Tier::kDevice), 0u);
}

TEST(TierAccountingTest, ObservedBytesCountTowardsBudgetAndPeak) {
  TierBudgets budgets;
  budgets[Tier::kDevice] = 1000;
  TierAccountant accountant(budgets);
  accountant.Observe(Tier::kDevice, 900);  // e.g. libtorch activations
  EXPECT_FALSE(accountant.Reserve(Tier::kDevice, 200, "weights").ok());
  accountant.Observe(Tier::kDevice, 100);
  EXPECT_TRUE(accountant.Reserve(Tier::kDevice, 200, "weights").ok());
  EXPECT_EQ(accountant.Usage().peak_of(Tier::kDevice), 900u);
  EXPECT_EQ(accountant.Usage().current_of(Tier::kDevice), 300u);
}

TEST(TierAccountingTest, TierNamesRoundTrip) {
  for (Tier t : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
    auto parsed = ParseTier(TierName(t));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_NE(ParseTier("gpu").status().message().find("gpu"), std::string::npos);
}

}  // namespace
}  // namespace strata::offload
