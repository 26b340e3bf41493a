#include "services/rank/critic.h"

#include "base/status_macros.h"
#include "policies/rl/rl_losses.h"

namespace strata::services {

std::vector<std::vector<float>> Critic::Values(const Packed& packed, const std::vector<policies::Rollout>& rollouts) {
  return RolloutRows(ResponseValues(model_->model().TokenScores(packed.ids, packed.mask), packed), rollouts);
}

absl::Status Critic::ValueStep(const std::vector<UpdateMicroBatch>& micros, const policies::PolicyUpdate& update,
                               policies::UpdateStats& stats) {
  for (size_t j = 0; j < micros.size(); ++j) {
    const UpdateMicroBatch& m = micros[j];
    double value_clipfrac = 0;
    auto value_loss = [&](const at::Tensor& values) {
      const auto out = policies::PpoValueLossClipped(ResponseValues(values, m.packed), m.old_values, m.returns,
                                                     m.packed.response_mask, update.value_clip);
      value_clipfrac = out.clipfrac.item<double>();
      return out.loss;
    };
    STRATA_ASSIGN_OR_RETURN(auto vloss, AccumulateStep(*model_, m.packed, value_loss, m.scale, j + 1 == micros.size()));
    stats.value_loss += vloss;
    stats.value_clipfrac += m.scale * value_clipfrac;
  }
  return model_->trainer()->OptimizerStep();
}

}  // namespace strata::services
