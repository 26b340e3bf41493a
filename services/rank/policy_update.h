// The gradient steps of a policy update on one rank of a gang, which the
// actor and (PPO) the critic take on the same micro-batches.
#ifndef STRATA_SERVICES_RANK_POLICY_UPDATE_H_
#define STRATA_SERVICES_RANK_POLICY_UPDATE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "policies/rl/worker_group.h"
#include "services/rank/gang_sum.h"
#include "services/rank/packed_batch.h"

namespace strata::services {

// One micro-batch of a gradient step, on the device.
struct UpdateMicroBatch {
  Packed packed;
  at::Tensor advantages;                         // [N, R]
  at::Tensor old_logprobs, returns, old_values;  // [N, R], PPO only
  double scale = 0;                              // its tokens' share of the step's tokens over the gang
};

// Minibatches are drawn from the global batch's rows, the same on every
// rank (PPO reshuffles them each epoch with the update's shuffle_seed); each
// rank trains on the rows of a minibatch it holds, so a gang of N takes the
// steps one rank would. A rank with no rows in a pass still joins the
// gradient sums, with a row whose loss weighs nothing.
class UpdateSteps {
 public:
  // Checks `update` (INVALID_ARGUMENT naming what does not fit; PPO without
  // a critic is FAILED_PRECONDITION), draws its steps, and sums their
  // tokens and micro-batch counts over the gang (collectives: every rank
  // plans). A rank whose update fails the checks returns before the sums,
  // and the others' sums end at the collective timeout. `update` must
  // outlive the steps.
  static absl::StatusOr<UpdateSteps> Plan(const policies::PolicyUpdate& update, bool has_critic,
                                          const PassOptions& passes);

  size_t size() const { return steps_.size(); }
  // Step `k`'s micro-batches, built now (on the device), as many as every
  // other rank's.
  std::vector<UpdateMicroBatch> MicroBatchesOf(size_t k) const;

 private:
  UpdateSteps(const policies::PolicyUpdate& update, const PassOptions& passes) : update_(&update), passes_(passes) {}

  const policies::PolicyUpdate* update_;
  PassOptions passes_;
  std::vector<std::vector<size_t>> steps_;  // local rows of each gradient step
  std::vector<double> global_tokens_;       // each step's response tokens over the gang
  std::vector<MicroBatchRanges> micro_batches_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_POLICY_UPDATE_H_
