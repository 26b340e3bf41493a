#include "rewards/reward_model.h"

namespace strata::rewards {

at::Tensor BradleyTerryLoss(const at::Tensor& chosen, const at::Tensor& rejected) {
  return -at::log_sigmoid(chosen - rejected).mean();
}

PreferenceObjective PreferenceFromScores(const at::Tensor& scores, int64_t pairs) {
  const at::Tensor chosen = scores.narrow(0, 0, pairs), rejected = scores.narrow(0, pairs, pairs);
  return {BradleyTerryLoss(chosen, rejected), chosen.gt(rejected).to(at::kFloat).mean().item<double>()};
}

PreferenceObjective PreferenceFromTokenScores(const at::Tensor& token_scores, const at::Tensor& attention_mask,
                                              int64_t pairs) {
  return PreferenceFromScores(policies::AtLastToken(token_scores, attention_mask).select(1, 0), pairs);
}

std::unique_ptr<policies::LlamaModel> WithFreshScalarHead(const policies::LlamaModel& lm, uint64_t seed) {
  policies::LlamaWeights w = lm.weights();
  w.lm_head = at::Tensor();
  at::Generator gen = at::detail::createCPUGenerator(seed);
  w.score = (at::randn({lm.config().num_labels, lm.config().hidden_size}, gen) * 0.02).to(lm.dtype());
  return std::make_unique<policies::LlamaModel>(lm.config(), policies::LlamaHead::kScalar, std::move(w));
}

}  // namespace strata::rewards
