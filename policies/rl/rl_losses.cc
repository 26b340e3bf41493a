#include "policies/rl/rl_losses.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace strata::policies {

at::Tensor PadRows(const std::vector<std::vector<float>>& rows, int64_t width) {
  at::Tensor out = at::zeros({static_cast<int64_t>(rows.size()), width}, at::kFloat);
  auto a = out.accessor<float, 2>();
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t n = std::min(rows[i].size(), static_cast<size_t>(width));
    for (size_t k = 0; k < n; ++k) a[static_cast<int64_t>(i)][static_cast<int64_t>(k)] = rows[i][k];
  }
  return out;
}

std::vector<std::vector<float>> UnpadRows(const at::Tensor& padded, const std::vector<size_t>& lengths) {
  const at::Tensor c = padded.to(at::kCPU, at::kFloat).contiguous();
  std::vector<std::vector<float>> out(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    const float* row = c[static_cast<int64_t>(i)].data_ptr<float>();
    out[i].assign(row, row + std::min<size_t>(lengths[i], static_cast<size_t>(c.size(1))));
  }
  return out;
}

at::Tensor MaskedMean(const at::Tensor& x, const at::Tensor& mask) {
  return (x * mask).sum() / mask.sum().clamp_min(1.0);
}

at::Tensor MaskedMean(const at::Tensor& x, const at::Tensor& mask, int64_t dim) {
  return (x * mask).sum(dim) / mask.sum(dim).clamp_min(1.0);
}

absl::StatusOr<KlEstimator> ParseKlEstimator(const std::string& name) {
  if (name == "k1") return KlEstimator::kK1;
  if (name == "k2") return KlEstimator::kK2;
  if (name == "k3") return KlEstimator::kK3;
  return absl::InvalidArgumentError(absl::StrCat("KL estimator '", name, "' is not one of k1, k2, k3"));
}

at::Tensor KlPenalty(const at::Tensor& logprobs, const at::Tensor& ref_logprobs, KlEstimator estimator) {
  const at::Tensor log_ratio = logprobs - ref_logprobs;
  switch (estimator) {
    case KlEstimator::kK1:
      return log_ratio;
    case KlEstimator::kK2:
      return 0.5 * log_ratio.pow(2);
    case KlEstimator::kK3:
      return (-log_ratio).exp() - 1 + log_ratio;
  }
  return log_ratio;
}

at::Tensor ResponseMask(const at::Tensor& response_ids, const at::Tensor& valid, int64_t eos_id) {
  const at::Tensor is_eos = response_ids.eq(eos_id).to(at::kFloat);
  // EOS tokens strictly before t; the EOS itself still counts.
  const at::Tensor eos_before = is_eos.cumsum(-1) - is_eos;
  return eos_before.eq(0).to(at::kFloat) * valid.to(at::kFloat);
}

namespace {

// Index of the last counted token of each row and whether the row has one.
std::pair<at::Tensor, at::Tensor> LastCounted(const at::Tensor& mask) {
  const at::Tensor positions = at::arange(mask.size(1), mask.options().dtype(at::kLong)).unsqueeze(0);
  const at::Tensor last = (positions * mask.to(at::kLong)).argmax(-1, /*keepdim=*/true);
  const at::Tensor any = mask.sum(-1, /*keepdim=*/true).gt(0);
  return {last, any};
}

}  // namespace

at::Tensor TokenRewards(const at::Tensor& score, const at::Tensor& kl, const at::Tensor& mask, double kl_coef) {
  at::Tensor rewards = -kl_coef * kl * mask;
  auto [last, any] = LastCounted(mask);
  const at::Tensor bonus = score.reshape({-1, 1}).to(at::kFloat) * any.to(at::kFloat);
  return rewards.scatter_add(1, last, bonus);
}

at::Tensor DiscountedReturns(const at::Tensor& rewards, const at::Tensor& mask, double gamma) {
  const int64_t t_len = rewards.size(1);
  at::Tensor returns = at::zeros_like(rewards);
  at::Tensor running = at::zeros({rewards.size(0)}, rewards.options());
  for (int64_t t = t_len - 1; t >= 0; --t) {
    running = rewards.select(1, t) + gamma * running;
    returns.select(1, t).copy_(running);
  }
  return returns * mask;
}

at::Tensor RemaxAdvantages(const at::Tensor& sampled_score, const at::Tensor& greedy_score, const at::Tensor& kl,
                           const at::Tensor& mask, double kl_coef, double gamma) {
  const at::Tensor returns = DiscountedReturns(TokenRewards(sampled_score, kl, mask, kl_coef), mask, gamma);
  return (returns - greedy_score.reshape({-1, 1}).to(at::kFloat)) * mask;
}

std::pair<at::Tensor, at::Tensor> Gae(const at::Tensor& rewards, const at::Tensor& values, const at::Tensor& mask,
                                      double gamma, double lambda) {
  const at::Tensor r = rewards * mask;
  const at::Tensor v = values * mask;
  const int64_t t_len = r.size(1);
  at::Tensor advantages = at::zeros_like(r);
  at::Tensor last_gae = at::zeros({r.size(0)}, r.options());
  for (int64_t t = t_len - 1; t >= 0; --t) {
    const at::Tensor next_value = t + 1 < t_len ? v.select(1, t + 1) : at::zeros_like(last_gae);
    const at::Tensor delta = r.select(1, t) + gamma * next_value - v.select(1, t);
    last_gae = delta + gamma * lambda * last_gae;
    advantages.select(1, t).copy_(last_gae);
  }
  advantages = advantages * mask;
  return {advantages, (advantages + v) * mask};
}

at::Tensor Whiten(const at::Tensor& x, const at::Tensor& mask, bool shift_mean) {
  const at::Tensor mean = MaskedMean(x, mask);
  const at::Tensor count = mask.sum();
  at::Tensor var = MaskedMean((x - mean).pow(2), mask);
  // Unbiased, as TRL's masked_var.
  var = var * count / (count - 1).clamp_min(1.0);
  at::Tensor whitened = (x - mean) * at::rsqrt(var + 1e-8);
  if (!shift_mean) whitened = whitened + mean;
  return whitened * mask;
}

at::Tensor GrpoAdvantages(const at::Tensor& scores, double eps) {
  const at::Tensor mean = scores.mean(-1, /*keepdim=*/true);
  const at::Tensor std = scores.std(-1, /*unbiased=*/true, /*keepdim=*/true);
  return (scores - mean) / (std + eps);
}

at::Tensor RlooAdvantages(const at::Tensor& scores) {
  const int64_t g = scores.size(-1);
  const at::Tensor others = (scores.sum(-1, /*keepdim=*/true) - scores) /
                            static_cast<double>(std::max<int64_t>(g - 1, 1));
  return scores - others;
}

at::Tensor ReinforceLoss(const at::Tensor& logprobs, const at::Tensor& advantages, const at::Tensor& mask) {
  return -MaskedMean(advantages.detach() * logprobs, mask);
}

PpoPolicyLoss PpoClippedLoss(const at::Tensor& logprobs, const at::Tensor& old_logprobs, const at::Tensor& advantages,
                             const at::Tensor& mask, double clip_range) {
  const at::Tensor log_ratio = logprobs - old_logprobs.detach();
  const at::Tensor ratio = log_ratio.exp();
  const at::Tensor a = advantages.detach();
  const at::Tensor unclipped = -a * ratio;
  const at::Tensor clipped = -a * ratio.clamp(1 - clip_range, 1 + clip_range);
  PpoPolicyLoss out;
  out.loss = MaskedMean(at::maximum(unclipped, clipped), mask);
  out.clipfrac = MaskedMean(clipped.gt(unclipped).to(at::kFloat), mask).detach();
  out.approx_kl = MaskedMean((ratio - 1) - log_ratio, mask).detach();
  return out;
}

PpoValueLoss PpoValueLossClipped(const at::Tensor& values, const at::Tensor& old_values, const at::Tensor& returns,
                                 const at::Tensor& mask, double clip_range) {
  const at::Tensor old = old_values.detach();
  const at::Tensor change = values - old;
  const at::Tensor clipped = old + change.clamp(-clip_range, clip_range);
  const at::Tensor loss1 = (values - returns.detach()).pow(2);
  const at::Tensor loss2 = (clipped - returns.detach()).pow(2);
  PpoValueLoss out;
  out.loss = 0.5 * MaskedMean(at::maximum(loss1, loss2), mask);
  // Counted where the clip moved the value and its loss was the larger.
  // Not loss2 > loss1 alone: where nothing is clipped, old + (v - old) may
  // differ from v in the last bit, and such tokens would be counted at
  // random (another CPU's rounding, another gang size).
  const at::Tensor active = change.abs().gt(clip_range).logical_and(loss2.gt(loss1));
  out.clipfrac = MaskedMean(active.to(at::kFloat), mask).detach();
  return out;
}

at::Tensor CrossEntropyLoss(const at::Tensor& logprobs, const at::Tensor& mask) { return -MaskedMean(logprobs, mask); }

}  // namespace strata::policies
