#include "services/rank/scorer.h"

#include <c10/core/GradMode.h>

#include "base/status_macros.h"
#include "rewards/reward_model.h"
#include "services/rank/gang_sum.h"

namespace strata::services {

Scorer::Scorer(ScorerModels models, const policies::Tokenizer& tokenizer, PassOptions passes)
    : reward_(std::move(models.reward)),
      reference_(std::move(models.reference)),
      reference_model_(reference_ != nullptr ? &reference_->model() : models.frozen_reference),
      tokenizer_(tokenizer),
      passes_(passes) {}

Scorer::~Scorer() = default;

std::vector<std::vector<float>> Scorer::ReferenceLogProbs(const Packed& packed,
                                                          const std::vector<policies::Rollout>& rollouts) {
  const at::Tensor logits = reference_model_->LogitsAt(packed.ids, packed.mask, packed.positions);
  return RolloutRows(ResponseLogProbs(logits, packed), rollouts);
}

absl::StatusOr<policies::TrainStats> Scorer::TrainRewardModel(const std::vector<policies::PreferencePair>& batch) {
  if (reward_ == nullptr || reward_->trainer() == nullptr) {
    return absl::FailedPreconditionError("no trainable reward model");
  }
  if (batch.empty()) return absl::InvalidArgumentError("reward model step: empty batch");
  std::vector<double> pairs = {static_cast<double>(batch.size())};
  STRATA_RETURN_IF_ERROR(SumOverGang(*passes_.gang, pairs));
  STRATA_ASSIGN_OR_RETURN(const auto gang_micros,
                          GangMicroBatches(*passes_.gang, {batch.size()}, passes_.micro_batch_size));
  const auto& micros = gang_micros[0];
  double loss = 0, weighted_accuracy = 0;
  for (size_t j = 0; j < micros.size(); ++j) {
    const auto [begin, end] = micros[j];
    std::vector<policies::PreferencePair> part(batch.begin() + begin, batch.begin() + end);
    const double scale = begin == end ? 0.0 : Share(static_cast<double>(part.size()), pairs[0]);
    if (begin == end) part.push_back({kZeroWeightRow, kZeroWeightRow, kZeroWeightRow});
    const Packed packed = PackPairs(part, passes_.device);
    const int64_t n = static_cast<int64_t>(part.size());
    double accuracy = 0;
    STRATA_ASSIGN_OR_RETURN(auto part_loss, AccumulateStep(
                                                *reward_, packed,
                                                [&](const at::Tensor& values) {
                                                  rewards::PreferenceObjective objective =
                                                      rewards::PreferenceFromTokenScores(values, packed.mask, n);
                                                  accuracy = objective.accuracy;
                                                  return objective.loss;
                                                },
                                                scale, j + 1 == micros.size()));
    loss += part_loss;
    weighted_accuracy += scale * accuracy;
  }
  STRATA_RETURN_IF_ERROR(reward_->trainer()->OptimizerStep());
  std::vector<double> sums = {loss, weighted_accuracy};
  STRATA_RETURN_IF_ERROR(SumOverGang(*passes_.gang, sums));
  return policies::TrainStats{sums[0], sums[1]};
}

absl::StatusOr<policies::TrainStats> Scorer::EvaluateRewardModel(const std::vector<policies::PreferencePair>& pairs) {
  if (reward_ == nullptr) return absl::FailedPreconditionError("this job has no reward model");
  c10::NoGradGuard no_grad;
  const Packed packed = PackPairs(pairs, passes_.device);
  const int64_t n = static_cast<int64_t>(pairs.size());
  const rewards::PreferenceObjective objective =
      rewards::PreferenceFromScores(reward_->model().Scores(packed.ids, packed.mask).select(1, 0), n);
  return policies::TrainStats{objective.loss.item<double>(), objective.accuracy};
}

}  // namespace strata::services
