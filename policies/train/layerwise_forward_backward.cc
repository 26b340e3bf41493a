// The streaming schedule of one ForwardBackward: a forward pass without
// autograd keeping each layer's input, the head and loss, then layers
// brought back in reverse, recomputed and backpropagated one at a time.
#include "policies/train/layerwise_trainer_impl.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <numeric>

#include "absl/cleanup/cleanup.h"
#include "base/interrupt.h"
#include "base/status_macros.h"

namespace strata::policies {

namespace {

std::vector<int64_t> Range(int64_t n, bool reverse) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (reverse) std::reverse(order.begin(), order.end());
  return order;
}

// Layer l's weights, or the error with the pass ended.
absl::StatusOr<LlamaLayerWeights> AcquireOrEndPass(LayerSource& source, int64_t l) {
  absl::StatusOr<LlamaLayerWeights> weights = source.Acquire(l);
  if (!weights.ok()) source.EndPass();
  return weights;
}

}  // namespace

LoraApply LayerwiseTrainerImpl::TrainingApply(int64_t l, const LoraLayer* layer, LoraApply* frozen) const {
  if (layer == nullptr) return LoraApply();
  const LoraConfig& config = options_.lora->config();
  if (options_.lora_frozen != nullptr) *frozen = options_.lora_frozen->ApplyFor(l);
  LoraApply apply{layer, config.scaling(), config.dropout,
                  LoraDropoutKey(options_.lora_dropout_seed, steps_taken_, passes_since_step_), l};
  if (options_.lora_frozen != nullptr) apply.frozen = frozen;
  return apply;
}

absl::StatusOr<double> LayerwiseTrainerImpl::ForwardBackwardAt(const at::Tensor& input_ids,
                                                               const at::Tensor& attention_mask,
                                                               const at::Tensor& head_positions, const LossFn& loss_fn,
                                                               bool sum_over_gang) {
  // However this returns early (an error, or an exception from libtorch),
  // no download may still be writing into a staging buffer afterwards.
  if (data_parallel() && summed_since_step_) {
    return absl::FailedPreconditionError(
        "data parallel training summed this step's gradients already: the summing pass is the step's last");
  }
  if (options_.step_in_backward && passes_since_step_ > 0) {
    return absl::FailedPreconditionError(
        "step_in_backward: one forward-backward per optimizer step (the layers stepped in the last one)");
  }
  ++passes_since_step_;
  sum_this_pass_ = sum_over_gang;
  absl::Cleanup abandon_grads = [this] { AbandonGrads(); };
  const int64_t layers = config_.num_hidden_layers;
  const LayerContext ctx = MakeLayerContext(config_, attention_mask, input_ids.size(1),
                                            resident_.embed_tokens.scalar_type(), options_.attention);
  // Forward without autograd, keeping each layer's input in the stash (on
  // the device, or off it as SSDTrain does).
  absl::Cleanup end_stash = [this] { activations_->End(); };
  at::Tensor top;
  {
    c10::NoGradGuard no_grad;
    at::Tensor hidden = at::embedding(resident_.embed_tokens, input_ids);
    STRATA_RETURN_IF_ERROR(activations_->Begin(layers, static_cast<int64_t>(hidden.nbytes())));
    STRATA_RETURN_IF_ERROR(source_->BeginPass(Range(layers, false)));
    for (int64_t l = 0; l < layers; ++l) {
      if (absl::Status s = CheckInterrupt("in a forward pass"); !s.ok()) {
        source_->EndPass();
        return s;
      }
      if (absl::Status s = activations_->Put(l, hidden); !s.ok()) {
        source_->EndPass();
        return s;
      }
      auto w = AcquireOrEndPass(*source_, l);
      if (!w.ok()) return w.status();
      LoraApply frozen;
      const LoraApply adapters = TrainingApply(l, lora() ? &options_.lora->layer(l) : nullptr, &frozen);
      hidden = DecoderLayerForward(config_, *w, hidden, ctx, nullptr, l, &adapters);
      *w = LlamaLayerWeights();  // before Release: the streamer may reuse the buffers
      source_->Release(l);
    }
    source_->EndPass();
    top = std::move(hidden);
  }

  // Head and loss with autograd; leaves stand in for the resident weights
  // that train (with LoRA, the scalar head alone).
  auto trained = [this](const at::Tensor& t) { return lora() ? t : t.detach().requires_grad_(); };
  at::Tensor embed = trained(resident_.embed_tokens);
  at::Tensor norm = trained(resident_.norm);
  at::Tensor head_weight;
  if (head_ == LlamaHead::kScalar) {
    head_weight = resident_.score.detach().requires_grad_();
  } else {
    head_weight = resident_.lm_head.defined() ? trained(resident_.lm_head) : embed;
  }
  top = top.detach().requires_grad_();
  double loss_value = 0;
  {
    // Scoped so that logits, the loss graph and the head's gradient are
    // freed before the backward pass brings layers back to the device.
    const at::Tensor hidden = AtPositions(RmsNorm(top, norm, config_.rms_norm_eps), head_positions);
    const at::Tensor output = at::linear(hidden, head_weight).to(at::kFloat);
    const at::Tensor loss = loss_fn(output);
    loss_value = loss.item<double>();
    loss.backward();
  }
  absl::Status status;
  for (ParamState& p : params_) {
    if (p.resident == &resident_.norm) status.Update(AccumulateGrad(p, norm.grad()));
    // A tied head's gradient stays in embed.grad and is taken below.
    if (p.resident == &resident_.lm_head || p.resident == &resident_.score) {
      status.Update(AccumulateGrad(p, head_weight.grad()));
    }
  }
  status.Update(FlushGrads(/*keep_in_flight=*/1));
  if (status.ok()) status.Update(StartGradientSums());
  if (!status.ok()) return status;
  norm = at::Tensor();
  if (!head_weight.is_same(embed)) head_weight = at::Tensor();
  at::Tensor grad = top.grad();
  top = at::Tensor();

  // Backward, one recomputed layer at a time.
  STRATA_RETURN_IF_ERROR(source_->BeginPass(Range(layers, true)));
  for (int64_t l = layers - 1; l >= 0; --l) {
    // Data parallel ranks stop only before the backward pass: its gradient
    // sums are collectives the others would wait on.
    if (absl::Status s = CheckInterrupt("in a backward pass"); !s.ok() && !data_parallel()) {
      source_->EndPass();
      return s;
    }
    absl::StatusOr<at::Tensor> input = activations_->Take(l);
    if (!input.ok()) {
      source_->EndPass();
      return input.status();
    }
    auto w = AcquireOrEndPass(*source_, l);
    if (!w.ok()) return w.status();
    std::vector<at::Tensor*> slots = LayerTensors(*w);
    // What trains gets leaves: the layer's tensors, or with LoRA its
    // adapters alone (the frozen base computes no weight gradient).
    LoraLayer adapter_leaves;
    if (lora()) {
      adapter_leaves = options_.lora->layer(l);
      for (LoraModule m : options_.lora->modules()) {
        adapter_leaves.at(m).a = adapter_leaves.at(m).a.detach().requires_grad_();
        adapter_leaves.at(m).b = adapter_leaves.at(m).b.detach().requires_grad_();
      }
    } else {
      for (at::Tensor* t : slots) *t = t->detach().requires_grad_();
    }
    LoraApply frozen;
    const LoraApply adapters = TrainingApply(l, lora() ? &adapter_leaves : nullptr, &frozen);
    at::Tensor x = input->detach().requires_grad_();
    *input = at::Tensor();
    {
      // Scoped: the output's graph refers to the weights, which the streamer
      // reuses for a later fetch only once nothing does.
      const at::Tensor y = DecoderLayerForward(config_, *w, x, ctx, nullptr, l, &adapters);
      y.backward(grad);
    }
    if (lora()) {
      const std::vector<size_t>& indices = lora_params_[static_cast<size_t>(l)];
      size_t i = 0;
      for (LoraModule m : options_.lora->modules()) {
        status.Update(AccumulateGrad(params_[indices[i++]], adapter_leaves.at(m).a.grad()));
        status.Update(AccumulateGrad(params_[indices[i++]], adapter_leaves.at(m).b.grad()));
      }
    } else if (options_.step_in_backward) {
      status.Update(StepLayer(l, slots));
    } else {
      for (size_t i = 0; i < slots.size(); ++i) {
        status.Update(AccumulateGrad(params_[layer_params_[static_cast<size_t>(l)][i]], slots[i]->grad()));
      }
    }
    status.Update(FlushGrads(/*keep_in_flight=*/1));
    if (status.ok()) status.Update(StartGradientSums());
    if (!status.ok()) {
      source_->EndPass();
      return status;
    }
    grad = x.grad();
    *w = LlamaLayerWeights();
    source_->Release(l);
  }
  source_->EndPass();

  if (!lora()) {
    at::embedding(embed, input_ids).backward(grad);
    status.Update(AccumulateGrad(params_[0], embed.grad()));  // params_[0] is embed_tokens (see Create)
  }
  status.Update(FlushGrads(/*keep_in_flight=*/0));
  if (status.ok()) status.Update(StartGradientSums());
  if (status.ok()) status.Update(FinishGradientSums());
  if (!status.ok()) return status;
  summed_since_step_ = data_parallel() && sum_over_gang;
  std::move(abandon_grads).Cancel();
  return loss_value;
}

}  // namespace strata::policies
