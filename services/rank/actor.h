// The actor: the policy being trained. It samples the rollouts, gives its
// own log-probs of them, and takes the policy's gradient steps (an RL
// update, or SFT).
#ifndef STRATA_SERVICES_RANK_ACTOR_H_
#define STRATA_SERVICES_RANK_ACTOR_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/rl/worker_group.h"
#include "policies/tokenizer/tokenizer.h"
#include "policies/train/placed_model.h"
#include "services/rank/packed_batch.h"
#include "services/rank/policy_update.h"

namespace strata::services {

// Not thread-safe: the rank's work thread drives it. `tokenizer` and the
// gang in `passes` must outlive it.
class Actor {
 public:
  // A response ends at the first of `stop_ids`, which it keeps (the policy
  // learns to produce it).
  Actor(std::unique_ptr<policies::PlacedModel> model, const policies::Tokenizer& tokenizer,
        std::vector<int64_t> stop_ids, PassOptions passes)
      : model_(std::move(model)), tokenizer_(tokenizer), stop_ids_(std::move(stop_ids)), passes_(passes) {}

  policies::PlacedModel& model() { return *model_; }

  // samples_per_prompt responses per prompt (and the greedy one) from the
  // rollout engine (passes.rollout); sample g of prompt p draws from its
  // own seed (SampleSeed), so the schedule changes no draw.
  absl::StatusOr<std::vector<policies::Rollout>> Generate(const policies::RolloutRequest& request);
  // The current policy's log-probs of the packed rollouts' responses.
  std::vector<std::vector<float>> LogProbs(const Packed& packed, const std::vector<policies::Rollout>& rollouts);
  // One gradient step of the policy on a step's micro-batches; adds the
  // step's loss, clip fraction and KL (this rank's shares) to `stats`.
  absl::Status PolicyStep(const std::vector<UpdateMicroBatch>& micros, const policies::PolicyUpdate& update,
                          policies::UpdateStats& stats);
  // One SFT step on this rank's shard of the batch; the gang's loss.
  absl::StatusOr<policies::TrainStats> TrainSft(const std::vector<policies::TextPair>& batch);

 private:
  std::unique_ptr<policies::PlacedModel> model_;
  const policies::Tokenizer& tokenizer_;
  const std::vector<int64_t> stop_ids_;
  const PassOptions passes_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_ACTOR_H_
