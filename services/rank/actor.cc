#include "services/rank/actor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "policies/job/seeds.h"
#include "policies/model/generation.h"
#include "policies/rl/rl_losses.h"
#include "services/rank/gang_sum.h"

namespace strata::services {

absl::StatusOr<std::vector<policies::Rollout>> Actor::Generate(const policies::RolloutRequest& request) {
  const policies::LlamaModel& actor = model_->model();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> prompt_index;
  for (size_t p = 0; p < request.prompts.size(); ++p) {
    for (int64_t g = 0; g < request.samples_per_prompt; ++g) {
      prompts.push_back(request.prompts[p]);
      prompt_index.push_back(static_cast<int64_t>(p));
    }
  }
  const std::vector<int64_t>& eos = stop_ids_;
  const int64_t pad = tokenizer_.pad_id() >= 0 ? tokenizer_.pad_id() : 0;
  if (!request.sampling.row_seeds.empty() && request.sampling.row_seeds.size() != request.prompts.size()) {
    return absl::InvalidArgumentError(absl::StrCat("rollout: ", request.sampling.row_seeds.size(), " row seeds for ",
                                                   request.prompts.size(), " prompts"));
  }
  policies::SamplingOptions sampling = request.sampling;
  if (!sampling.row_seeds.empty()) {
    // Sample g of prompt p draws from its own stream of the prompt's seed.
    sampling.row_seeds.clear();
    for (size_t i = 0; i < prompts.size(); ++i) {
      const uint64_t prompt_seed = request.sampling.row_seeds[static_cast<size_t>(prompt_index[i])];
      sampling.row_seeds.push_back(
          policies::SampleSeed(prompt_seed, static_cast<int64_t>(i % static_cast<size_t>(request.samples_per_prompt))));
    }
  }
  // Decoding in micro-batches of rows: the KV cache and logits scale with a
  // micro-batch, not the batch.
  auto generate = [&](const std::vector<std::vector<int32_t>>& rows,
                      const policies::SamplingOptions& options) -> absl::StatusOr<policies::GenerationOutput> {
    const auto micros = MicroBatches(rows.size(), passes_.micro_batch_size);
    if (micros.size() == 1) return policies::Generate(actor, rows, options, eos, pad);  // no copy of the batch
    policies::GenerationOutput all;
    for (const auto& [begin, end] : micros) {
      const std::vector<std::vector<int32_t>> part(rows.begin() + begin, rows.begin() + end);
      policies::SamplingOptions part_options = options;
      if (!options.row_seeds.empty()) {
        part_options.row_seeds.assign(options.row_seeds.begin() + begin, options.row_seeds.begin() + end);
      }
      STRATA_ASSIGN_OR_RETURN(auto out, policies::Generate(actor, part, part_options, eos, pad));
      all.tokens.insert(all.tokens.end(), out.tokens.begin(), out.tokens.end());
      all.logprobs.insert(all.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
    }
    return all;
  };
  auto truncated = [&](const std::vector<int32_t>& response) {
    return response.empty() || std::find(eos.begin(), eos.end(), response.back()) == eos.end();
  };
  std::vector<policies::Rollout> out;
  STRATA_ASSIGN_OR_RETURN(auto sampled, generate(prompts, sampling));
  for (size_t i = 0; i < prompts.size(); ++i) {
    out.push_back(
        {prompt_index[i], prompts[i], sampled.tokens[i], sampled.logprobs[i], false, truncated(sampled.tokens[i])});
  }
  if (request.with_greedy) {
    policies::SamplingOptions greedy = request.sampling;
    greedy.greedy = true;
    greedy.row_seeds.clear();
    STRATA_ASSIGN_OR_RETURN(auto best, generate(request.prompts, greedy));
    for (size_t p = 0; p < request.prompts.size(); ++p) {
      out.push_back({static_cast<int64_t>(p), request.prompts[p], best.tokens[p], best.logprobs[p], true,
                     truncated(best.tokens[p])});
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
