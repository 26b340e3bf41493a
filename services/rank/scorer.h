// The scorer: what judges the actor's rollouts without being the policy.
// The reward (a rule, or a reward model: the one a reward-model job
// trains) and the reference model's log-probs (the KL anchor).
#ifndef STRATA_SERVICES_RANK_SCORER_H_
#define STRATA_SERVICES_RANK_SCORER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/rl/worker_group.h"
#include "policies/tokenizer/tokenizer.h"
#include "policies/train/placed_model.h"
#include "services/rank/packed_batch.h"

namespace strata::services {

// What a scorer holds: the reward model a reward_model job trains, or (RL)
// the reference. RL rewards come from the job's RewardSources.
struct ScorerModels {
  std::unique_ptr<policies::PlacedModel> reward;     // a reward_model job's
  std::unique_ptr<policies::PlacedModel> reference;  // RL's, loaded on its own
  // RL with LoRA on the actor: the actor's frozen base serves as the
  // reference instead (no load, no memory of its own). Must outlive the
  // scorer.
  const policies::LlamaModel* frozen_reference = nullptr;
};

// Not thread-safe: the rank's work thread drives it. `tokenizer` and the
// gang in `passes` must outlive it.
class Scorer {
 public:
  Scorer(ScorerModels models, const policies::Tokenizer& tokenizer, PassOptions passes);
  ~Scorer();

  // The reward model a reward_model job trains; null in RL.
  policies::PlacedModel* reward_model() { return reward_.get(); }
  // The reference model's log-probs of the packed rollouts' responses.
  std::vector<std::vector<float>> ReferenceLogProbs(const Packed& packed,
                                                    const std::vector<policies::Rollout>& rollouts);

  // One Bradley-Terry step of the reward model on this rank's shard of the
  // batch; the gang's loss and accuracy. EvaluateRewardModel only measures
  // this rank's pairs.
  absl::StatusOr<policies::TrainStats> TrainRewardModel(const std::vector<policies::PreferencePair>& batch);
  absl::StatusOr<policies::TrainStats> EvaluateRewardModel(const std::vector<policies::PreferencePair>& pairs);

 private:
  // Members are destroyed in reverse order: the reference is freed first.
  std::unique_ptr<policies::PlacedModel> reward_;
  std::unique_ptr<policies::PlacedModel> reference_;
  const policies::LlamaModel* reference_model_;  // reference_'s model, or the actor's frozen base
  const policies::Tokenizer& tokenizer_;
  const PassOptions passes_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_SCORER_H_
