// Reward models: a Llama backbone with a scalar `score` head (HF
// LlamaForSequenceClassification names), trained on preference pairs with
// the Bradley-Terry objective. The worker trains and runs them through its
// placed models; this file holds what makes them reward models.
#ifndef STRATA_REWARDS_REWARD_MODEL_H_
#define STRATA_REWARDS_REWARD_MODEL_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>

#include "policies/model/llama.h"

namespace strata::rewards {

// Bradley-Terry: -mean(log sigmoid(r_chosen - r_rejected)).
at::Tensor BradleyTerryLoss(const at::Tensor& chosen, const at::Tensor& rejected);

// The preference objective on a batch of 2n rows: the chosen responses of n
// pairs first, then their rejected responses in the same order.
struct PreferenceObjective {
  at::Tensor loss;  // Bradley-Terry, differentiable when the scores are
  double accuracy;  // fraction of pairs whose chosen response scores higher
};

// From final scores [2n] (one per row).
PreferenceObjective PreferenceFromScores(const at::Tensor& scores, int64_t pairs);

// From the scalar head at every position ([2n, T, L], as TokenScores gives)
// and the batch's attention mask [2n, T]: read at each row's last real token.
PreferenceObjective PreferenceFromTokenScores(const at::Tensor& token_scores, const at::Tensor& attention_mask,
                                              int64_t pairs);

// A causal LM turned into a reward model (or critic): its backbone, no LM
// head, and a fresh `score` head [num_labels, hidden] drawn from N(0, 0.02)
// with `seed`, as HF does when a causal LM is loaded for sequence
// classification. The weights are shared with `lm`, not copied.
std::unique_ptr<policies::LlamaModel> WithFreshScalarHead(const policies::LlamaModel& lm, uint64_t seed);

}  // namespace strata::rewards

#endif  // STRATA_REWARDS_REWARD_MODEL_H_
