#include "services/rank/policy_update.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "policies/rl/rl_losses.h"

namespace strata::services {

absl::StatusOr<UpdateSteps> UpdateSteps::Plan(const policies::PolicyUpdate& update, bool has_critic,
                                              const PassOptions& passes) {
  const size_t n = update.rollouts.size();
  if (update.advantages.size() != n) return absl::InvalidArgumentError("update: one advantage row per rollout needed");
  const bool ppo = update.objective == policies::PolicyObjective::kPpo;
  if (ppo && (update.old_logprobs.size() != n || update.returns.size() != n || update.old_values.size() != n)) {
    return absl::InvalidArgumentError("update: PPO needs old_logprobs, returns and old_values per rollout");
  }
  if (ppo && !has_critic) return absl::FailedPreconditionError("PPO update but this job has no critic");
  const bool sharded = !update.rows.empty();
  if (sharded && update.rows.size() != n)
    return absl::InvalidArgumentError("update: one global row per rollout needed");
  const int64_t total = sharded ? update.global_rows : static_cast<int64_t>(n);
  std::map<int64_t, size_t> local_row;
  for (size_t i = 0; i < n; ++i) {
    const int64_t row = sharded ? update.rows[i] : static_cast<int64_t>(i);
    if (row < 0 || row >= total) return absl::InvalidArgumentError(absl::StrCat("update: row ", row, " of ", total));
    local_row[row] = i;
  }
  UpdateSteps plan(update, passes);
  const int64_t epochs = ppo ? update.epochs : 1;
  const int64_t minibatches = ppo ? std::max<int64_t>(1, update.minibatches) : 1;
  std::vector<int64_t> order(static_cast<size_t>(total));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(update.shuffle_seed);
  const size_t per = (static_cast<size_t>(total) + static_cast<size_t>(minibatches) - 1) /
                     static_cast<size_t>(minibatches);
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    if (ppo) std::shuffle(order.begin(), order.end(), rng);
    for (size_t start = 0; start < order.size(); start += per) {
      std::vector<size_t> idx;
      for (size_t k = start; k < std::min(order.size(), start + per); ++k) {
        if (auto it = local_row.find(order[k]); it != local_row.end()) idx.push_back(it->second);
      }
      plan.steps_.push_back(std::move(idx));
    }
  }
  // Each step's token count over the gang, in one collective.
  std::vector<double> tokens(plan.steps_.size() * 2, 0.0);
  for (size_t k = 0; k < plan.steps_.size(); ++k) {
    for (size_t i : plan.steps_[k]) tokens[2 * k] += static_cast<double>(update.rollouts[i].response.size());
    tokens[2 * k + 1] = tokens[2 * k];
  }
  plan.global_tokens_ = tokens;
  STRATA_RETURN_IF_ERROR(SumOverGang(*passes.gang, plan.global_tokens_));
  std::vector<size_t> rows_per_step;
  for (const auto& step : plan.steps_) rows_per_step.push_back(step.size());
  STRATA_ASSIGN_OR_RETURN(plan.micro_batches_, GangMicroBatches(*passes.gang, rows_per_step, passes.micro_batch_size));
  return plan;
}

std::vector<UpdateMicroBatch> UpdateSteps::MicroBatchesOf(size_t k) const {
  const policies::PolicyUpdate& update = *update_;
  const bool ppo = update.objective == policies::PolicyObjective::kPpo;
  const std::vector<float> zero = {0.0f};
  std::vector<UpdateMicroBatch> micros;
  for (const auto& [begin, end] : micro_batches_[k]) {
    std::vector<const std::vector<int32_t>*> prompts, responses;
    std::vector<std::vector<float>> adv, old_lp, ret, old_v;
    double micro_tokens = 0;
    for (size_t j = begin; j < end; ++j) {
      const size_t i = steps_[k][j];
      prompts.push_back(&update.rollouts[i].prompt);
      responses.push_back(&update.rollouts[i].response);
      micro_tokens += static_cast<double>(update.rollouts[i].response.size());
      adv.push_back(update.advantages[i]);
      if (ppo) {
        old_lp.push_back(update.old_logprobs[i]);
        ret.push_back(update.returns[i]);
        old_v.push_back(update.old_values[i]);
      }
    }
    if (begin == end) {
      prompts.push_back(&kZeroWeightRow), responses.push_back(&kZeroWeightRow);
      adv.push_back(zero), old_lp.push_back(zero), ret.push_back(zero), old_v.push_back(zero);
    }
    UpdateMicroBatch m;
    m.packed = Pack(prompts, responses, passes_.device);
    const int64_t width = m.packed.targets.size(1);
    auto rows = [&](const std::vector<std::vector<float>>& r) {
      return policies::PadRows(r, width).to(passes_.device);
    };
    m.advantages = rows(adv);
    if (ppo) m.old_logprobs = rows(old_lp), m.returns = rows(ret), m.old_values = rows(old_v);
    m.scale = Share(micro_tokens, global_tokens_[2 * k]);
    micros.push_back(std::move(m));
  }
  return micros;
}

}  // namespace strata::services
