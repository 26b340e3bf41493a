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
#include "rewards/rule_rewards.h"
#include "services/rank/packed_batch.h"

namespace strata::services {

// What a scorer holds: a reward model or a rule, and (RL) the reference.
struct ScorerModels {
  std::unique_ptr<policies::PlacedModel> reward;     // null with a rule
  rewards::RuleFn rule;                              // reward.rule, when set
  std::unique_ptr<policies::PlacedModel> reference;  // null in a reward-model job
};

// Not thread-safe: the rank's work thread drives it. `tokenizer` and the
// gang in `passes` must outlive it.
class Scorer {
 public:
  // A rule reads a response's text without the end-of-turn id (`stop_ids`).
  Scorer(ScorerModels models, const policies::Tokenizer& tokenizer, std::vector<int64_t> stop_ids, PassOptions passes);
  ~Scorer();

  // The reward model; null when a rule scores.
  policies::PlacedModel* reward_model() { return reward_.get(); }

  // One reward per packed rollout: the rule's of its decoded text, or the
  // reward model's score.
  std::vector<float> Rewards(const Packed& packed, const std::vector<policies::Rollout>& rollouts);
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
  rewards::RuleFn rule_;
  std::unique_ptr<policies::PlacedModel> reference_;
  const policies::Tokenizer& tokenizer_;
  const std::vector<int64_t> stop_ids_;
  const PassOptions passes_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_SCORER_H_
