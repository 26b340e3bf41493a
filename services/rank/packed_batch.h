// Token rows as the models of a rank take them: prompts and responses
// packed into padded tensors, and the per-token results read back out.
// Shared by the roles (actor, critic, scorer).
#ifndef STRATA_SERVICES_RANK_PACKED_BATCH_H_
#define STRATA_SERVICES_RANK_PACKED_BATCH_H_

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "policies/dist/process_group.h"
#include "policies/rl/worker_group.h"
#include "policies/train/placed_model.h"
#include "services/rank/pass_options.h"

namespace strata::services {

// Prompt + response rows, right-padded, with the indices that pick out the
// response tokens' predictions: the output at position p-1+k predicts
// response token k.
struct Packed {
  at::Tensor ids;            // [N, S]
  at::Tensor mask;           // [N, S]
  at::Tensor positions;      // [N, R]
  at::Tensor targets;        // [N, R]
  at::Tensor response_mask;  // [N, R] float
};

// Built on the CPU, returned on `device` (where the models compute).
// `loss_masks`, when given, holds per row the response ids the loss is on
// (TextPair::response_loss_mask; an empty mask or a null row: all of them).
Packed Pack(const std::vector<const std::vector<int32_t>*>& prompts,
            const std::vector<const std::vector<int32_t>*>& responses, const at::Device& device,
            const std::vector<const std::vector<uint8_t>*>& loss_masks = {});
// The rollouts' prompts and responses.
Packed PackRollouts(const std::vector<policies::Rollout>& rollouts, const at::Device& device);
// Chosen rows first, then rejected rows, as one batch.
Packed PackPairs(const std::vector<policies::PreferencePair>& pairs, const at::Device& device);

// log p(response token k) from the logits at the response positions
// [N, R, V] (LogitsAt or a head run at packed.positions) -> [N, R].
at::Tensor ResponseLogProbs(const at::Tensor& response_logits, const Packed& packed);
// Critic values at the response positions from per-token scalars [N, S, 1].
at::Tensor ResponseValues(const at::Tensor& values, const Packed& packed);
// Per-token rows [N, R] cut back to each rollout's response length.
std::vector<std::vector<float>> RolloutRows(const at::Tensor& rows, const std::vector<policies::Rollout>& rollouts);

// The one-token row a rank feeds a pass it has no rows for (its loss is
// scaled by 0), so that it still joins the gang's gradient sums.
extern const std::vector<int32_t> kZeroWeightRow;

// One micro-batch's forward and backward; `scale` is its share of the
// global batch (its loss is a mean over its own rows), so that the gang's
// summed, accumulated gradients are the global batch's. The last
// micro-batch of a step sums over the gang. Returns the scaled loss.
// loss_fn sees the head's output at every position [N, S, ...], or with
// `HeadAt::kResponses` at the response positions only [N, R, ...].
enum class HeadAt { kAllPositions, kResponses };
absl::StatusOr<double> AccumulateStep(policies::PlacedModel& model, const Packed& packed,
                                      const policies::LossFn& loss_fn, double scale, bool last,
                                      HeadAt head_at = HeadAt::kAllPositions);

// This rank's share of a global count (0 when there is nothing at all).
double Share(double local, double global);
// The tokens of `responses`.
size_t Tokens(const std::vector<const std::vector<int32_t>*>& responses);
// The trained tokens of SFT examples (their loss masks' ones).
size_t TrainedTokens(const std::vector<const policies::TextPair*>& examples);

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_PACKED_BATCH_H_
