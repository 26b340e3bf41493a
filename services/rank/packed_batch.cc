#include "services/rank/packed_batch.h"

#include <algorithm>

#include "policies/model/llama.h"
#include "policies/rl/rl_losses.h"

namespace strata::services {

const std::vector<int32_t> kZeroWeightRow = {0};

Packed Pack(const std::vector<const std::vector<int32_t>*>& prompts,
            const std::vector<const std::vector<int32_t>*>& responses, const at::Device& device,
            const std::vector<const std::vector<uint8_t>*>& loss_masks) {
  const int64_t n = static_cast<int64_t>(prompts.size());
  int64_t s = 1, r = 1;
  for (int64_t i = 0; i < n; ++i) {
    s = std::max<int64_t>(s, static_cast<int64_t>(prompts[i]->size() + responses[i]->size()));
    r = std::max<int64_t>(r, static_cast<int64_t>(responses[i]->size()));
  }
  Packed p;
  p.ids = at::zeros({n, s}, at::kLong);
  p.mask = at::zeros({n, s}, at::kLong);
  p.positions = at::zeros({n, r}, at::kLong);
  p.targets = at::zeros({n, r}, at::kLong);
  p.response_mask = at::zeros({n, r}, at::kFloat);
  auto ids = p.ids.accessor<int64_t, 2>();
  auto mask = p.mask.accessor<int64_t, 2>();
  auto pos = p.positions.accessor<int64_t, 2>();
  auto tgt = p.targets.accessor<int64_t, 2>();
  auto rmask = p.response_mask.accessor<float, 2>();
  for (int64_t i = 0; i < n; ++i) {
    const auto& pr = *prompts[i];
    const auto& re = *responses[i];
    const std::vector<uint8_t>* loss = static_cast<size_t>(i) < loss_masks.size() ? loss_masks[i] : nullptr;
    if (loss != nullptr && loss->empty()) loss = nullptr;
    const int64_t pl = static_cast<int64_t>(pr.size());
    for (int64_t t = 0; t < pl; ++t) ids[i][t] = pr[static_cast<size_t>(t)], mask[i][t] = 1;
    for (size_t k = 0; k < re.size(); ++k) {
      const int64_t t = pl + static_cast<int64_t>(k);
      ids[i][t] = re[k];
      mask[i][t] = 1;
      pos[i][static_cast<int64_t>(k)] = t - 1;
      tgt[i][static_cast<int64_t>(k)] = re[k];
      rmask[i][static_cast<int64_t>(k)] = loss == nullptr || (k < loss->size() && (*loss)[k] != 0) ? 1.0f : 0.0f;
    }
  }
  for (at::Tensor* t : {&p.ids, &p.mask, &p.positions, &p.targets, &p.response_mask}) *t = t->to(device);
  return p;
}

Packed PackRollouts(const std::vector<policies::Rollout>& rollouts, const at::Device& device) {
  std::vector<const std::vector<int32_t>*> prompts, responses;
  for (const auto& r : rollouts) prompts.push_back(&r.prompt), responses.push_back(&r.response);
  return Pack(prompts, responses, device);
}

Packed PackPairs(const std::vector<policies::PreferencePair>& pairs, const at::Device& device) {
  std::vector<const std::vector<int32_t>*> prompts, responses;
  for (const auto& p : pairs) prompts.push_back(&p.prompt), responses.push_back(&p.chosen);
  for (const auto& p : pairs) prompts.push_back(&p.prompt), responses.push_back(&p.rejected);
  return Pack(prompts, responses, device);
}

at::Tensor ResponseLogProbs(const at::Tensor& response_logits, const Packed& packed) {
  return policies::TokenLogProbs(response_logits, packed.targets) * packed.response_mask;
}

at::Tensor ResponseValues(const at::Tensor& values, const Packed& packed) {
  return values.squeeze(-1).gather(1, packed.positions) * packed.response_mask;
}

std::vector<std::vector<float>> RolloutRows(const at::Tensor& rows, const std::vector<policies::Rollout>& rollouts) {
  std::vector<size_t> lengths;
  for (const auto& r : rollouts) lengths.push_back(r.response.size());
  return policies::UnpadRows(rows, lengths);
}

absl::StatusOr<double> AccumulateStep(policies::PlacedModel& model, const Packed& packed,
                                      const policies::LossFn& loss_fn, double scale, bool last, HeadAt head_at) {
  auto scaled = [&](const at::Tensor& output) { return loss_fn(output) * scale; };
  const at::Tensor positions = head_at == HeadAt::kResponses ? packed.positions : at::Tensor();
  return model.trainer()->ForwardBackwardAt(packed.ids, packed.mask, positions, scaled, /*sum_over_gang=*/last);
}

double Share(double local, double global) { return global > 0 ? local / global : 0.0; }

size_t Tokens(const std::vector<const std::vector<int32_t>*>& responses) {
  size_t n = 0;
  for (const auto* r : responses) n += r->size();
  return n;
}

size_t TrainedTokens(const std::vector<const policies::TextPair*>& examples) {
  size_t n = 0;
  for (const auto* e : examples) {
    n += e->response_loss_mask.empty()
             ? e->response.size()
             : static_cast<size_t>(std::count(e->response_loss_mask.begin(), e->response_loss_mask.end(), 1));
  }
  return n;
}

}  // namespace strata::services
