// Losses and advantage estimators against values worked out by hand.
#include "policies/rl/rl_losses.h"

#include <cmath>

#include "gtest/gtest.h"

namespace strata::policies {
namespace {

at::Tensor T(std::vector<float> v, std::vector<int64_t> shape) { return at::tensor(v).view(shape); }

void ExpectNear(const at::Tensor& got, std::vector<float> want, double tol = 1e-5) {
  const at::Tensor flat = got.reshape({-1}).to(at::kFloat).contiguous();
  ASSERT_EQ(flat.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(flat[static_cast<int64_t>(i)].item<float>(), want[i], tol) << "element " << i;
  }
}

TEST(RlLossesTest, MaskedMeanIgnoresMaskedAndEmptyRows) {
  const at::Tensor x = T({1, 2, 3, 4, 5, 6}, {2, 3});
  const at::Tensor m = T({1, 1, 0, 0, 0, 0}, {2, 3});
  EXPECT_FLOAT_EQ(MaskedMean(x, m).item<float>(), 1.5f);
  ExpectNear(MaskedMean(x, m, 1), {1.5f, 0.0f});  // an empty row is 0, not NaN
}

TEST(RlLossesTest, ResponseMaskStopsAfterFirstEosAndAtPadding) {
  // EOS = 2. Row 0: tokens after the first EOS do not count; row 1 is padded.
  const at::Tensor ids = at::tensor(std::vector<int64_t>{5, 2, 7, 2, 9, 9, 0, 0}, at::kLong).view({2, 4});
  const at::Tensor valid = T({1, 1, 1, 1, 1, 1, 0, 0}, {2, 4});
  ExpectNear(ResponseMask(ids, valid, 2), {1, 1, 0, 0, 1, 1, 0, 0});
}

TEST(RlLossesTest, KlEstimatorsByHand) {
  const at::Tensor logp = T({std::log(0.5f)}, {1, 1});
  const at::Tensor ref = T({std::log(0.25f)}, {1, 1});
  const float d = std::log(2.0f);
  EXPECT_NEAR(KlPenalty(logp, ref, KlEstimator::kK1).item<float>(), d, 1e-6);
  EXPECT_NEAR(KlPenalty(logp, ref, KlEstimator::kK2).item<float>(), 0.5f * d * d, 1e-6);
  EXPECT_NEAR(KlPenalty(logp, ref, KlEstimator::kK3).item<float>(), 0.5f - 1.0f + d, 1e-6);
  EXPECT_FALSE(ParseKlEstimator("k4").ok());
}

TEST(RlLossesTest, TokenRewardsPutTheScoreOnTheLastCountedToken) {
  const at::Tensor kl = T({0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f}, {2, 3});
  const at::Tensor mask = T({1, 1, 0, 0, 0, 0}, {2, 3});
  const at::Tensor score = T({2.0f, 7.0f}, {2});
  // Row 0: -0.5*kl on counted tokens, +2 on token 1. Row 1 has no tokens: nothing.
  ExpectNear(TokenRewards(score, kl, mask, 0.5), {-0.05f, -0.1f + 2.0f, 0, 0, 0, 0});
}

TEST(RlLossesTest, DiscountedReturnsByHand) {
  const at::Tensor r = T({1, 0, 2}, {1, 3});
  const at::Tensor m = T({1, 1, 1}, {1, 3});
  // gamma 0.5: G2 = 2, G1 = 0 + 0.5*2 = 1, G0 = 1 + 0.5*1 = 1.5
  ExpectNear(DiscountedReturns(r, m, 0.5), {1.5f, 1.0f, 2.0f});
}

TEST(RlLossesTest, RemaxAdvantageIsSampledReturnMinusGreedyScore) {
  const at::Tensor kl = T({0.2f, 0.4f, 9.0f}, {1, 3});
  const at::Tensor mask = T({1, 1, 0}, {1, 3});
  const at::Tensor sampled = T({1.0f}, {1});
  const at::Tensor greedy = T({0.25f}, {1});
  // kl_coef 0.5, gamma 1: rewards = [-0.1, -0.2 + 1.0, 0]; returns = [0.7, 0.8, 0]
  // advantages = returns - 0.25 on counted tokens.
  ExpectNear(RemaxAdvantages(sampled, greedy, kl, mask, 0.5, 1.0), {0.45f, 0.55f, 0.0f});
}

TEST(RlLossesTest, GaeByHand) {
  const at::Tensor r = T({0, 1}, {1, 2});
  const at::Tensor v = T({0.5f, 0.25f}, {1, 2});
  const at::Tensor m = T({1, 1}, {1, 2});
  // gamma 0.9, lambda 0.8:
  // delta1 = 1 + 0 - 0.25 = 0.75; A1 = 0.75
  // delta0 = 0 + 0.9*0.25 - 0.5 = -0.275; A0 = -0.275 + 0.72*0.75 = 0.265
  auto [adv, ret] = Gae(r, v, m, 0.9, 0.8);
  ExpectNear(adv, {0.265f, 0.75f});
  ExpectNear(ret, {0.765f, 1.0f});
}

TEST(RlLossesTest, GaeTreatsValuesPastTheEndAsZero) {
  const at::Tensor r = T({1, 5}, {1, 2});
  const at::Tensor v = T({0.5f, 100.0f}, {1, 2});
  const at::Tensor m = T({1, 0}, {1, 2});
  auto [adv, ret] = Gae(r, v, m, 1.0, 1.0);
  ExpectNear(adv, {0.5f, 0.0f});  // 1 - 0.5, masked reward and value ignored
}

TEST(RlLossesTest, WhitenHasZeroMeanUnitVarianceOverMask) {
  const at::Tensor x = T({1, 2, 3, 100}, {1, 4});
  const at::Tensor m = T({1, 1, 1, 0}, {1, 4});
  // mean 2, unbiased var 1 -> [-1, 0, 1], masked entry 0.
  ExpectNear(Whiten(x, m), {-1, 0, 1, 0}, 1e-4);
  ExpectNear(Whiten(x, m, /*shift_mean=*/false), {1, 2, 3, 0}, 1e-4);
}

TEST(RlLossesTest, GroupBaselinesByHand) {
  const at::Tensor s = T({1, 2, 3}, {1, 3});
  ExpectNear(RlooAdvantages(s), {1 - 2.5f, 2 - 2.0f, 3 - 1.5f});
  ExpectNear(GrpoAdvantages(s), {-1, 0, 1}, 1e-4);  // std (unbiased) = 1
}

TEST(RlLossesTest, ReinforceLossByHand) {
  const at::Tensor logp = T({-1.0f, -2.0f, -3.0f}, {1, 3});
  const at::Tensor adv = T({1.0f, 0.5f, 9.0f}, {1, 3});
  const at::Tensor m = T({1, 1, 0}, {1, 3});
  EXPECT_NEAR(ReinforceLoss(logp, adv, m).item<float>(), -(-1.0f - 1.0f) / 2, 1e-6);
}

TEST(RlLossesTest, PpoClipAndClipFraction) {
  // ratio 2 with A = +1 clips to 1.2; ratio 0.5 with A = +1 is not clipped
  // (min picks the unclipped 0.5).
  const at::Tensor old = T({0.0f, 0.0f}, {1, 2});
  const at::Tensor logp = T({std::log(2.0f), std::log(0.5f)}, {1, 2});
  const at::Tensor adv = T({1.0f, 1.0f}, {1, 2});
  const at::Tensor m = T({1, 1}, {1, 2});
  const auto out = PpoClippedLoss(logp, old, adv, m, 0.2);
  EXPECT_NEAR(out.loss.item<float>(), -(1.2f + 0.5f) / 2, 1e-6);
  EXPECT_NEAR(out.clipfrac.item<float>(), 0.5f, 1e-6);
  // approx KL: (2 - 1 - ln 2 + 0.5 - 1 + ln 2) / 2 = 0.25
  EXPECT_NEAR(out.approx_kl.item<float>(), 0.25f, 1e-6);
}

TEST(RlLossesTest, PpoValueLossTakesTheWorseOfClippedAndUnclipped) {
  const at::Tensor v = T({2.0f}, {1, 1});
  const at::Tensor old = T({0.0f}, {1, 1});
  const at::Tensor ret = T({1.0f}, {1, 1});
  // unclipped (2-1)^2 = 1, clipped (0.5-1)^2 = 0.25 -> max 1 -> 0.5
  const auto out = PpoValueLossClipped(v, old, ret, T({1.0f}, {1, 1}), 0.5);
  EXPECT_NEAR(out.loss.item<float>(), 0.5f, 1e-6);
  EXPECT_NEAR(out.clipfrac.item<float>(), 0.0f, 1e-6);
}

// A value inside the clip range is not clipped, even where old + (v - old)
// rounds away from v and makes the "clipped" loss larger by an ulp (such
// tokens used to be counted, differently on another CPU or gang size).
TEST(RlLossesTest, ValueClipFractionIgnoresRounding) {
  const float v = -0.31392282247543335f, o = 1.4580206871032715f, r = 1.9602583646774292f;
  const volatile float through_old = o + (v - o);
  ASSERT_NE(through_old, v) << "the case needs a value that does not survive old + (v - old)";
  ASSERT_GT((through_old - r) * (through_old - r), (v - r) * (v - r));
  const auto out = PpoValueLossClipped(T({v}, {1, 1}), T({o}, {1, 1}), T({r}, {1, 1}), T({1.0f}, {1, 1}), 10.0);
  EXPECT_EQ(out.clipfrac.item<float>(), 0.0f);
  // Clipped and taken: v moved 2 from old (clip 0.5) towards a return of
  // 3, so the clipped loss (0.5 - 3)^2 is the larger; 0.1 is not clipped.
  const auto clipped = PpoValueLossClipped(T({2.0f, 0.1f}, {1, 2}), T({0.0f, 0.0f}, {1, 2}), T({3.0f, 0.0f}, {1, 2}),
                                           T({1.0f, 1.0f}, {1, 2}), 0.5);
  EXPECT_NEAR(clipped.clipfrac.item<float>(), 0.5f, 1e-6);
}

TEST(RlLossesTest, CrossEntropyByHand) {
  EXPECT_NEAR(CrossEntropyLoss(T({-1.0f, -3.0f, -100.0f}, {1, 3}), T({1, 1, 0}, {1, 3})).item<float>(), 2.0f, 1e-6);
}

}  // namespace
}  // namespace strata::policies
