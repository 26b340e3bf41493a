// The arithmetic of RLHF: masked reductions, KL estimators, advantage
// estimators (ReMax, GAE, group baselines), whitening and the losses of
// SFT, reward modelling, REINFORCE and PPO. Pure tensor functions, no
// models: each is tested against hand-computed values.
//
// Shapes: B sequences, T response tokens. A `mask` is 1.0 for response
// tokens that count (not padding, not after EOS) and 0.0 otherwise.
#ifndef STRATA_POLICIES_RL_RL_LOSSES_H_
#define STRATA_POLICIES_RL_RL_LOSSES_H_

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::policies {

// Ragged per-token rows <-> a zero-padded [rows, width] float tensor.
at::Tensor PadRows(const std::vector<std::vector<float>>& rows, int64_t width);
std::vector<std::vector<float>> UnpadRows(const at::Tensor& padded, const std::vector<size_t>& lengths);

// sum(x * mask) / max(sum(mask), 1); over all elements or along `dim`.
at::Tensor MaskedMean(const at::Tensor& x, const at::Tensor& mask);
at::Tensor MaskedMean(const at::Tensor& x, const at::Tensor& mask, int64_t dim);

// Per-token KL(policy || reference) estimate from log-probs of the sampled
// tokens (Schulman's estimators): k1 = logp - logp_ref, k2 = (logp -
// logp_ref)^2 / 2, k3 = exp(logp_ref - logp) - 1 - (logp_ref - logp).
enum class KlEstimator { kK1, kK2, kK3 };
absl::StatusOr<KlEstimator> ParseKlEstimator(const std::string& name);
at::Tensor KlPenalty(const at::Tensor& logprobs, const at::Tensor& ref_logprobs, KlEstimator estimator);

// Mask of the tokens up to and including the first EOS of each row, and
// only where `valid` (padding) is 1. [B, T] float.
at::Tensor ResponseMask(const at::Tensor& response_ids, const at::Tensor& valid, int64_t eos_id);

// Per-token rewards: -kl_coef * kl at every response token, plus `score` at
// the last counted token of each row. [B, T].
at::Tensor TokenRewards(const at::Tensor& score, const at::Tensor& kl, const at::Tensor& mask, double kl_coef);

// Discounted reward-to-go: returns[t] = sum_{k>=t} gamma^(k-t) r[k], masked.
at::Tensor DiscountedReturns(const at::Tensor& rewards, const at::Tensor& mask, double gamma);

// ReMax: REINFORCE returns whose baseline is the greedy response's score.
// The sampled response's reward-to-go (score, KL-penalised, discounted)
// minus `greedy_score` (no KL: the baseline is the bare score). [B, T].
at::Tensor RemaxAdvantages(const at::Tensor& sampled_score, const at::Tensor& greedy_score, const at::Tensor& kl,
                           const at::Tensor& mask, double kl_coef, double gamma);

// Generalised advantage estimation over per-token rewards and critic values
// (values past the last counted token count as 0). Returns {advantages,
// returns}, both [B, T] and masked.
std::pair<at::Tensor, at::Tensor> Gae(const at::Tensor& rewards, const at::Tensor& values, const at::Tensor& mask,
                                      double gamma, double lambda);

// (x - mean) / (std + 1e-8) over masked elements; `shift_mean` false keeps
// the mean (as TRL does for advantages it does not centre).
at::Tensor Whiten(const at::Tensor& x, const at::Tensor& mask, bool shift_mean = true);

// Group baselines for several samples per prompt (scores [P, G]):
// GRPO: (s - mean_g) / (std_g + eps); RLOO: s - mean of the other samples.
at::Tensor GrpoAdvantages(const at::Tensor& scores, double eps = 1e-6);
at::Tensor RlooAdvantages(const at::Tensor& scores);

// REINFORCE: -mean(advantage * logprob) over counted tokens.
at::Tensor ReinforceLoss(const at::Tensor& logprobs, const at::Tensor& advantages, const at::Tensor& mask);

struct PpoPolicyLoss {
  at::Tensor loss;       // scalar
  at::Tensor clipfrac;   // fraction of counted tokens where the clip was active
  at::Tensor approx_kl;  // mean (ratio - 1) - log ratio: KL(old || new) estimate
};
// Clipped surrogate: -mean(min(r A, clip(r, 1-eps, 1+eps) A)), r = exp(logp - old_logp).
PpoPolicyLoss PpoClippedLoss(const at::Tensor& logprobs, const at::Tensor& old_logprobs, const at::Tensor& advantages,
                             const at::Tensor& mask, double clip_range);

struct PpoValueLoss {
  at::Tensor loss;
  at::Tensor clipfrac;  // fraction of counted tokens where the clipped loss was taken
};
// 0.5 * mean(max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2)).
PpoValueLoss PpoValueLossClipped(const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                                 const at::Tensor& mask, double clip_range);

// SFT: mean negative log-likelihood of the counted tokens.
at::Tensor CrossEntropyLoss(const at::Tensor& logprobs, const at::Tensor& mask);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_RL_RL_LOSSES_H_
