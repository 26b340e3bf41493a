// The critic (PPO): a scalar head's value of every response token, trained
// towards the returns on the actor's micro-batches.
#ifndef STRATA_SERVICES_RANK_CRITIC_H_
#define STRATA_SERVICES_RANK_CRITIC_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "policies/rl/worker_group.h"
#include "policies/train/placed_model.h"
#include "services/rank/packed_batch.h"
#include "services/rank/policy_update.h"

namespace strata::services {

// Not thread-safe: the rank's work thread drives it.
class Critic {
 public:
  explicit Critic(std::unique_ptr<policies::PlacedModel> model) : model_(std::move(model)) {}

  policies::PlacedModel& model() { return *model_; }

  // The values of the packed rollouts' response tokens.
  std::vector<std::vector<float>> Values(const Packed& packed, const std::vector<policies::Rollout>& rollouts);
  // One gradient step of the clipped value loss on a step's micro-batches;
  // adds the step's loss and clip fraction (this rank's shares) to `stats`.
  absl::Status ValueStep(const std::vector<UpdateMicroBatch>& micros, const policies::PolicyUpdate& update,
                         policies::UpdateStats& stats);

 private:
  std::unique_ptr<policies::PlacedModel> model_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_CRITIC_H_
