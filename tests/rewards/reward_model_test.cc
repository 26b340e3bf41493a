// The reward-model objective by hand, and a causal LM turned into a reward model.
#include "rewards/reward_model.h"

#include <cmath>

#include "gtest/gtest.h"

namespace strata::rewards {
namespace {

at::Tensor T(std::vector<float> v, std::vector<int64_t> shape) { return at::tensor(v).view(shape); }

TEST(RewardModelTest, BradleyTerryByHand) {
  const at::Tensor chosen = T({1.0f, 0.0f}, {2});
  const at::Tensor rejected = T({0.0f, 0.0f}, {2});
  const float want = -(std::log(1 / (1 + std::exp(-1.0f))) + std::log(0.5f)) / 2;
  EXPECT_NEAR(BradleyTerryLoss(chosen, rejected).item<float>(), want, 1e-6);
}

TEST(RewardModelTest, PreferenceObjectiveReadsChosenThenRejectedRows) {
  // Pairs: (2 vs 1) ranked right, (0 vs 3) ranked wrong.
  const PreferenceObjective objective = PreferenceFromScores(T({2.0f, 0.0f, 1.0f, 3.0f}, {4}), 2);
  EXPECT_DOUBLE_EQ(objective.accuracy, 0.5);
  const float want = -(std::log(1 / (1 + std::exp(-1.0f))) + std::log(1 / (1 + std::exp(3.0f)))) / 2;
  EXPECT_NEAR(objective.loss.item<float>(), want, 1e-6);
}

TEST(RewardModelTest, TokenScoresAreReadAtEachRowsLastRealToken) {
  // [2 rows, 3 positions, 1 label]; row 0 ends at position 1, row 1 at 2.
  const at::Tensor token_scores = T({9, 5, 7, 1, 2, 4}, {2, 3, 1});
  const at::Tensor mask = T({1, 1, 0, 1, 1, 1}, {2, 3}).to(at::kLong);
  const PreferenceObjective objective = PreferenceFromTokenScores(token_scores, mask, 1);
  EXPECT_DOUBLE_EQ(objective.accuracy, 1.0);  // 5 > 4
  EXPECT_NEAR(objective.loss.item<float>(), -std::log(1 / (1 + std::exp(-1.0f))), 1e-6);
}

TEST(RewardModelTest, FreshScalarHeadKeepsTheBackboneAndIsSeeded) {
  policies::LlamaConfig config;
  config.vocab_size = 32;
  config.hidden_size = 16;
  config.intermediate_size = 32;
  config.num_hidden_layers = 1;
  config.num_attention_heads = 2;
  config.num_key_value_heads = 2;
  config.head_dim = 8;
  auto lm = policies::LlamaModel::RandomInit(config, policies::LlamaHead::kLanguageModel, at::kFloat, 7);
  auto a = WithFreshScalarHead(*lm, 1), b = WithFreshScalarHead(*lm, 1), c = WithFreshScalarHead(*lm, 2);
  EXPECT_EQ(a->head(), policies::LlamaHead::kScalar);
  EXPECT_FALSE(a->weights().lm_head.defined());
  EXPECT_TRUE(a->weights().embed_tokens.is_same(lm->weights().embed_tokens));
  EXPECT_EQ(a->weights().score.sizes(), (std::vector<int64_t>{config.num_labels, config.hidden_size}));
  EXPECT_TRUE(a->weights().score.equal(b->weights().score));
  EXPECT_FALSE(a->weights().score.equal(c->weights().score));
  const at::Tensor ids = at::tensor(std::vector<int64_t>{1, 2, 3}).view({1, 3});
  EXPECT_EQ(a->Scores(ids, at::ones_like(ids)).sizes(), (std::vector<int64_t>{1, config.num_labels}));
}

}  // namespace
}  // namespace strata::rewards
