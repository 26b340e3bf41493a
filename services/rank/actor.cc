#include "services/rank/actor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "policies/job/seeds.h"
#include "policies/rl/rl_losses.h"
#include "policies/rollout/rollout_engine.h"
#include "services/rank/gang_sum.h"

namespace strata::services {

absl::StatusOr<std::vector<policies::Rollout>> Actor::Generate(const policies::RolloutRequest& request) {
  const std::vector<uint64_t>& prompt_seeds = request.sampling.row_seeds;
  if (!prompt_seeds.empty() && prompt_seeds.size() != request.prompts.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rollout: ", prompt_seeds.size(), " row seeds for ", request.prompts.size(), " prompts"));
  }
  // Sample g of prompt p draws from its own stream of the prompt's seed.
  std::vector<policies::RolloutPrompt> prompts;
  for (size_t p = 0; p < request.prompts.size(); ++p) {
    const uint64_t prompt_seed = prompt_seeds.empty()
                                     ? policies::PromptSeed(request.sampling.seed, static_cast<int64_t>(p))
                                     : prompt_seeds[p];
    policies::RolloutPrompt prompt{request.prompts[p], {}, request.with_greedy, {}};
    for (int64_t g = 0; g < request.samples_per_prompt; ++g) {
      prompt.sample_seeds.push_back(policies::SampleSeed(prompt_seed, g));
    }
    prompts.push_back(std::move(prompt));
  }
  policies::RolloutEngine engine(model_->model(), passes_.rollout, stop_ids_);
  STRATA_ASSIGN_OR_RETURN(auto decoded, engine.Run(prompts, request.sampling));
  // The samples of every prompt, prompt by prompt, then the greedy ones.
  std::vector<policies::Rollout> out;
  for (int pass = 0; pass < 2; ++pass) {
    const bool greedy = pass == 1;
    for (size_t p = 0; p < prompts.size(); ++p) {
      for (size_t c = 0; c < decoded[p].size(); ++c) {
        if ((c == static_cast<size_t>(request.samples_per_prompt)) != greedy) continue;
        policies::Continuation& r = decoded[p][c];
        out.push_back({static_cast<int64_t>(p), request.prompts[p], std::move(r.tokens), std::move(r.logprobs), greedy,
                       !r.stopped});
      }
    }
  }
  return out;
}

std::vector<std::vector<float>> Actor::LogProbs(const Packed& packed, const std::vector<policies::Rollout>& rollouts) {
  const at::Tensor logits = model_->model().LogitsAt(packed.ids, packed.mask, packed.positions);
  return RolloutRows(ResponseLogProbs(logits, packed), rollouts);
}

absl::Status Actor::PolicyStep(const std::vector<UpdateMicroBatch>& micros, const policies::PolicyUpdate& update,
                               policies::UpdateStats& stats) {
  const bool ppo = update.objective == policies::PolicyObjective::kPpo;
  for (size_t j = 0; j < micros.size(); ++j) {
    const UpdateMicroBatch& m = micros[j];
    double clipfrac = 0, approx_kl = 0;
    auto policy_loss = [&](const at::Tensor& logits) {
      const at::Tensor logp = ResponseLogProbs(logits, m.packed);
      if (!ppo) return policies::ReinforceLoss(logp, m.advantages, m.packed.response_mask);
      const auto out = policies::PpoClippedLoss(logp, m.old_logprobs, m.advantages, m.packed.response_mask,
                                                update.clip_range);
      clipfrac = out.clipfrac.item<double>();
      approx_kl = out.approx_kl.item<double>();
      return out.loss;
    };
    STRATA_ASSIGN_OR_RETURN(auto loss, AccumulateStep(*model_, m.packed, policy_loss, m.scale, j + 1 == micros.size(),
                                                      HeadAt::kResponses));
    stats.policy_loss += loss;
    stats.clipfrac += m.scale * clipfrac;
    stats.approx_kl += m.scale * approx_kl;
  }
  return model_->trainer()->OptimizerStep();
}

absl::StatusOr<policies::TrainStats> Actor::TrainSft(const std::vector<policies::TextPair>& batch) {
  if (model_->trainer() == nullptr) return absl::FailedPreconditionError("no trainable actor");
  if (batch.empty()) return absl::InvalidArgumentError("SFT step: empty batch");
  std::vector<const policies::TextPair*> examples;
  for (const auto& pair : batch) examples.push_back(&pair);
  std::vector<double> tokens = {static_cast<double>(TrainedTokens(examples))};
  STRATA_RETURN_IF_ERROR(SumOverGang(*passes_.gang, tokens));
  STRATA_ASSIGN_OR_RETURN(const auto gang_micros,
                          GangMicroBatches(*passes_.gang, {batch.size()}, passes_.micro_batch_size));
  const auto& micros = gang_micros[0];
  double loss = 0;
  for (size_t j = 0; j < micros.size(); ++j) {
    const auto [begin, end] = micros[j];
    std::vector<const std::vector<int32_t>*> p, r;
    std::vector<const std::vector<uint8_t>*> masks;
    for (size_t i = begin; i < end; ++i) {
      p.push_back(&batch[i].prompt), r.push_back(&batch[i].response), masks.push_back(&batch[i].response_loss_mask);
    }
    const double scale =
        begin == end
            ? 0.0
            : Share(static_cast<double>(TrainedTokens({examples.begin() + begin, examples.begin() + end})), tokens[0]);
    if (begin == end) p = {&kZeroWeightRow}, r = {&kZeroWeightRow}, masks.clear();
    const Packed packed = Pack(p, r, passes_.device, masks);
    STRATA_ASSIGN_OR_RETURN(auto part, AccumulateStep(
                                           *model_, packed,
                                           [&](const at::Tensor& logits) {
                                             return policies::CrossEntropyLoss(ResponseLogProbs(logits, packed),
                                                                               packed.response_mask);
                                           },
                                           scale, j + 1 == micros.size(), HeadAt::kResponses));
    loss += part;
  }
  STRATA_RETURN_IF_ERROR(model_->trainer()->OptimizerStep());
  std::vector<double> sums = {loss};
  STRATA_RETURN_IF_ERROR(SumOverGang(*passes_.gang, sums));
  return policies::TrainStats{sums[0], 0};
}

}  // namespace strata::services
