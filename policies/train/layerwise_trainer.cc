#include "policies/train/layerwise_trainer.h"

#include <c10/core/GradMode.h>

#include <array>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <span>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/interrupt.h"
#include "base/status_macros.h"
#include "offload/device/device_transfer.h"
#include "offload/tiers/placement.h"
#include "policies/checkpoint/safetensors.h"
#include "policies/checkpoint/tensor_io.h"
#include "policies/dist/flat_bucket.h"
#include "policies/config/tensor_dealer.h"

namespace strata::policies {
namespace {


std::vector<int64_t> Range(int64_t n, bool reverse) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (reverse) std::reverse(order.begin(), order.end());
  return order;
}

at::Tensor HostView(const offload::HostBuffer& buffer, int64_t numel) {
  return at::from_blob(buffer.data(), {numel}, at::TensorOptions().dtype(at::kFloat));
}

}  // namespace

class LayerwiseTrainerImpl final : public LayerwiseTrainer {
 public:
  LayerwiseTrainerImpl(const LlamaConfig& config, LlamaHead head, LlamaWeights resident, LayerSource* source,
                   offload::HostArena* arena, const LayerwiseTrainerOptions& options);
  ~LayerwiseTrainerImpl() override;
  absl::StatusOr<double> ForwardBackward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                         const LossFn& loss_fn, bool sum_over_gang) override;
  absl::Status OptimizerStep() override;
  double last_grad_norm() const override { return last_grad_norm_; }
  absl::Status SetLearningRate(double lr) override;
  absl::Status SaveState(const std::string& path) override;
  absl::Status LoadState(const std::vector<std::string>& paths) override;
  int64_t optimizer_state_bytes() const override;
  int64_t gradient_peak_bytes() const override { return grad_bytes_peak_; }
  absl::StatusOr<at::Tensor> Gradient(const std::string& name) const override;
  int64_t num_parameters() const override { return num_parameters_; }
  const offload::CpuAdam& adam() const override { return *adam_; }

 private:
  friend class LayerwiseTrainer;  // its factory finishes construction

  // Host-side state of one parameter tensor.
  struct ParamState {
    std::string name;
    int64_t layer = -1;  // -1: resident
    size_t index = 0;    // in Named() order for layers
    at::Tensor* resident = nullptr;
    int64_t numel = 0;
    std::vector<int64_t> shape;
    at::ScalarType dtype = at::kFloat;  // of the device weights
    int64_t step = 0;
    bool held = true;  // this rank holds its optimizer state and gradient (ZeRO-1/2: one rank does)
    int owner = 0;     // the rank that does
    // Host optimizer (grad also for NVMe). ZeRO-2: a tensor this rank does
    // not hold has a grad only while its sum is in flight.
    offload::HostBuffer master, grad, exp_avg, exp_avg_sq;
    at::Tensor device_master, device_grad, device_exp_avg, device_exp_avg_sq;  // device optimizer
  };

  // Gradients of one layer (or of the head) on their way to the host.
  struct PendingGrad {
    ParamState* state = nullptr;
    offload::HostBuffer staging;  // pinned; the download lands here
  };
  struct PendingBatch {
    std::shared_ptr<offload::TransferFence> fence;
    std::vector<PendingGrad> grads;
  };

  // Adds `grad` to the parameter's gradient: directly on the CPU device or
  // for a device optimizer; on a GPU with host gradients, queues its
  // download into the current batch (see FlushGrads).
  absl::Status AccumulateGrad(ParamState& state, const at::Tensor& grad);
  // Closes the current download batch, then adds batches to the host
  // gradients, oldest first, until at most `keep_in_flight` remain: the CPU
  // adds layer l's gradients while the GPU computes layer l-1's backward.
  absl::Status FlushGrads(size_t keep_in_flight);
  // After an error (and at destruction): waits for downloads still writing
  // into staging buffers, then drops them unadded.
  void AbandonGrads();
  // Data parallel: starts summing the gradients that became final since the
  // last call (one bucket), and waits for every sum started.
  absl::Status StartGradientSums();
  absl::Status FinishGradientSums();
  // ZeRO-2: waits for the oldest sums until `keep_in_flight` are left, and
  // gives back the gradients of tensors this rank does not hold that they
  // summed.
  absl::Status ReleaseSummed(size_t keep_in_flight);
  // A zeroed host gradient buffer for p, and back to the arena; both keep
  // the gradient-byte counters.
  absl::Status AllocateGrad(ParamState& p);
  void ReleaseGrad(ParamState& p);
  bool data_parallel() const {
    return options_.data_parallel != nullptr && options_.data_parallel->world_size() > 1;
  }
  absl::Status AllocateState(ParamState& state, const at::Tensor& value);
  // The host bytes the optimizer may write p's new weights into, or empty.
  std::span<std::byte> WriteTarget(const ParamState& p);
  // Copies new fp32 weights `master` into p's device tensor or layer home.
  absl::Status WriteBack(const ParamState& p, const at::Tensor& master);
  // The optimizer over `params` (all of them: every held parameter).
  absl::Status HostStep(const std::vector<ParamState*>& params);
  absl::Status NvmeStep(const std::vector<ParamState*>& params);
  std::vector<ParamState*> HeldParams(bool layers);
  // step_in_backward: updates layer `l` from the gradients its backward
  // left on `slots`, through a one-layer host buffer.
  absl::Status StepLayer(int64_t l, const std::vector<at::Tensor*>& slots);
  // ZeRO-1: each owner's new weights (`updated(p)`, fp32, on the owner) in
  // the model's dtype to every other rank, which writes them back to its own
  // copy of the model.
  absl::Status BroadcastUpdatedWeights(const std::function<at::Tensor(const ParamState&)>& updated);
  // One owner's tensors of one layer and dtype, as one broadcast.
  absl::Status BroadcastPart(const std::vector<const ParamState*>& part, at::ScalarType dtype, int owner,
                             const std::function<at::Tensor(const ParamState&)>& updated);
  // Measures the global gradient norm and clips to options_.max_grad_norm.
  absl::Status ClipGradients();
  absl::Status DeviceStep();

  const LlamaConfig config_;
  const LlamaHead head_;
  LlamaWeights resident_;
  LayerSource* const source_;
  offload::HostArena* const arena_;
  LayerwiseTrainerOptions options_;  // the learning rate changes with schedules
  std::unique_ptr<offload::CpuAdam> adam_;
  std::unique_ptr<offload::NvmeAdamState> nvme_adam_;
  std::unique_ptr<offload::DeviceTransfer> grad_transfer_;  // GPU with host gradients only
  PendingBatch current_grads_;
  std::deque<PendingBatch> pending_grads_;
  std::vector<ParamState*> final_grads_;  // data parallel: not yet handed to the sum
  // ZeRO-2: per sum in flight, the tensors not held here whose gradients it
  // sums (they go back to the arena once it is done).
  std::deque<std::vector<ParamState*>> summing_;
  int64_t grad_bytes_ = 0, grad_bytes_peak_ = 0;  // host gradient buffers, now and at most
  bool summed_since_step_ = false;        // data parallel: gradients already summed
  bool sum_this_pass_ = true;             // this ForwardBackward sums over the gang
  int64_t passes_since_step_ = 0;         // ForwardBackward calls since OptimizerStep
  double layer_squares_ = 0.0;            // step_in_backward: the layers' gradient sum of squares
  double last_grad_norm_ = 0.0;
  std::vector<ParamState> params_;
  std::vector<std::vector<size_t>> layer_params_;  // params_ index per layer tensor
  // ZeRO-1 and 2: the optimizer and the gradients are sharded over the
  // gang, whole tensors dealt out as they are met.
  bool sharded_ = false;
  std::optional<TensorDealer> dealer_;
  int64_t num_parameters_ = 0;
};

LayerwiseTrainerImpl::LayerwiseTrainerImpl(const LlamaConfig& config, LlamaHead head, LlamaWeights resident,
                                           LayerSource* source, offload::HostArena* arena,
                                           const LayerwiseTrainerOptions& options)
    : config_(config), head_(head), resident_(std::move(resident)), source_(source), arena_(arena), options_(options) {
  resident_.layers.clear();
}

absl::Status LayerwiseTrainerImpl::AllocateState(ParamState& state, const at::Tensor& value) {
  state.numel = value.numel();
  state.shape.assign(value.sizes().begin(), value.sizes().end());
  state.dtype = value.scalar_type();
  num_parameters_ += state.numel;
  if (sharded_) {
    state.owner = dealer_->Deal(state.numel);
    state.held = state.owner == options_.data_parallel->rank();
  }
  if (options_.optimizer == offload::Tier::kDevice) {
    state.device_master = value.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).reshape({-1});
    state.device_grad = at::zeros_like(state.device_master);
    state.device_exp_avg = at::zeros_like(state.device_master);
    state.device_exp_avg_sq = at::zeros_like(state.device_master);
    return absl::OkStatus();
  }
  const size_t bytes = static_cast<size_t>(state.numel) * sizeof(float);
  // step_in_backward: layer gradients live one layer at a time (StepLayer);
  // ZeRO-2: a tensor another rank holds has one only while it is summed.
  if (!(options_.step_in_backward && state.layer >= 0) && state.held) STRATA_RETURN_IF_ERROR(AllocateGrad(state));
  std::vector<offload::HostBuffer*> buffers;
  if (options_.optimizer == offload::Tier::kHost && state.held) {
    buffers.insert(buffers.end(), {&state.master, &state.exp_avg, &state.exp_avg_sq});
  }
  for (offload::HostBuffer* buffer : buffers) {
    auto allocated = arena_->Allocate(bytes);
    if (!allocated.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("optimizer state for ", state.name, ": ", allocated.status().message()));
    }
    *buffer = std::move(*allocated);
    std::memset(buffer->data(), 0, bytes);
  }
  const at::Tensor master = value.detach().to(at::kCPU, at::kFloat).contiguous().reshape({-1});
  if (options_.optimizer == offload::Tier::kNvme) {
    if (!state.held) return absl::OkStatus();
    return nvme_adam_->Register(state.name,
                                std::span<const float>(master.data_ptr<float>(), static_cast<size_t>(state.numel)));
  }
  if (state.held) HostView(state.master, state.numel).copy_(master);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LayerwiseTrainer>> LayerwiseTrainer::Create(const LlamaConfig& config, LlamaHead head,
                                                                           LlamaWeights resident, LayerSource* source,
                                                                           offload::HostArena* arena,
                                                                           const LayerwiseTrainerOptions& options,
                                                                           offload::NvmeStore* nvme) {
  if (source->num_layers() != config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer source has ", source->num_layers(), " layers, config has ",
                                                   config.num_hidden_layers));
  }
  offload::ModelPlacement placement;  // validates the optimizer / gradient pair
  placement.weights = offload::Tier::kDevice;
  placement.optimizer = options.optimizer;
  placement.gradients = options.gradients;
  STRATA_RETURN_IF_ERROR(placement.Validate());
  if (options.step_in_backward) {
    if (options.optimizer == offload::Tier::kDevice) {
      return absl::InvalidArgumentError("step_in_backward needs a host or NVMe optimizer");
    }
    if (options.max_grad_norm > 0) {
      return absl::InvalidArgumentError("step_in_backward cannot clip gradients (max_grad_norm must be 0)");
    }
    if (options.data_parallel != nullptr && options.data_parallel->world_size() > 1) {
      return absl::InvalidArgumentError("step_in_backward needs a gang of one");
    }
  }
  STRATA_ASSIGN_OR_RETURN(auto adam, offload::CpuAdam::Create(options.adam));
  std::unique_ptr<LayerwiseTrainerImpl> trainer(
      new LayerwiseTrainerImpl(config, head, std::move(resident), source, arena, options));
  trainer->adam_ = std::move(adam);
  if (trainer->data_parallel() && options.optimizer != offload::Tier::kDevice) {
    trainer->sharded_ = true;
    trainer->dealer_.emplace(options.data_parallel->world_size());
  }
  if (options.optimizer == offload::Tier::kNvme) {
    if (nvme == nullptr) return absl::InvalidArgumentError("an NVMe optimizer needs an NVMe store");
    STRATA_ASSIGN_OR_RETURN(auto state,
                            offload::NvmeAdamState::Create(options.nvme_adam, nvme, arena, trainer->adam_.get()));
    trainer->nvme_adam_ = std::move(state);
  }
  LlamaWeights& r = trainer->resident_;
  if ((!r.embed_tokens.device().is_cpu() || options.stage_gradients) && options.optimizer != offload::Tier::kDevice) {
    // Gradients leave the GPU through the download stream (pinned staging).
    STRATA_ASSIGN_OR_RETURN(trainer->grad_transfer_, offload::DeviceTransfer::Create(r.embed_tokens.device()));
  }
  std::vector<std::pair<std::string, at::Tensor*>> resident_params = {{"model.embed_tokens.weight", &r.embed_tokens},
                                                                      {"model.norm.weight", &r.norm}};
  if (r.lm_head.defined()) resident_params.emplace_back("lm_head.weight", &r.lm_head);
  if (r.score.defined()) resident_params.emplace_back("score.weight", &r.score);
  // Reserve first: ParamState holds pointers into resident_ only, but the
  // vector must not reallocate while layer_params_ indexes it.
  LlamaLayerWeights names_only = LlamaLayerWeights::Layout(config);
  const auto named = names_only.Named();
  trainer->params_.reserve(resident_params.size() + static_cast<size_t>(config.num_hidden_layers) * named.size());
  for (auto& [name, tensor] : resident_params) {
    LayerwiseTrainerImpl::ParamState state;
    state.name = name;
    state.resident = tensor;
    STRATA_RETURN_IF_ERROR(trainer->AllocateState(state, *tensor));
    trainer->params_.push_back(std::move(state));
  }
  trainer->layer_params_.resize(static_cast<size_t>(config.num_hidden_layers));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    for (size_t i = 0; i < named.size(); ++i) {
      STRATA_ASSIGN_OR_RETURN(auto value, source->Load(l, i));
      LayerwiseTrainerImpl::ParamState state;
      state.name = absl::StrCat("model.layers.", l, ".", named[i].first);
      state.layer = l;
      state.index = i;
      STRATA_RETURN_IF_ERROR(trainer->AllocateState(state, value));
      trainer->layer_params_[static_cast<size_t>(l)].push_back(trainer->params_.size());
      trainer->params_.push_back(std::move(state));
    }
  }
  return trainer;
}

absl::Status LayerwiseTrainerImpl::AccumulateGrad(ParamState& state, const at::Tensor& grad) {
  if (!grad.defined()) return absl::OkStatus();
  if (state.device_grad.defined()) {
    state.device_grad.add_(grad.reshape({-1}).to(at::kFloat));
    final_grads_.push_back(&state);
    return absl::OkStatus();
  }
  if (state.grad.data() == nullptr) STRATA_RETURN_IF_ERROR(AllocateGrad(state));
  if (grad_transfer_ == nullptr) {
    HostView(state.grad, state.numel).add_(grad.reshape({-1}).to(at::kCPU, at::kFloat));
    final_grads_.push_back(&state);
    return absl::OkStatus();
  }
  auto staging = arena_->Allocate(static_cast<size_t>(state.numel) * sizeof(float));
  if (!staging.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("gradient staging for ", state.name, ": ", staging.status().message()));
  }
  const at::Tensor fp32 = grad.reshape({-1}).to(at::kFloat).contiguous();
  STRATA_RETURN_IF_ERROR(grad_transfer_->Download(fp32, staging->bytes()));
  current_grads_.grads.push_back({&state, *std::move(staging)});
  return absl::OkStatus();
}

absl::Status LayerwiseTrainerImpl::FlushGrads(size_t keep_in_flight) {
  if (grad_transfer_ == nullptr) return absl::OkStatus();
  if (!current_grads_.grads.empty()) {
    auto fence = grad_transfer_->Fence();
    if (!fence.ok()) return fence.status();
    current_grads_.fence = *std::move(fence);
    pending_grads_.push_back(std::move(current_grads_));
    current_grads_ = PendingBatch();
  }
  while (pending_grads_.size() > keep_in_flight) {
    PendingBatch& batch = pending_grads_.front();
    STRATA_RETURN_IF_ERROR(grad_transfer_->WaitHost(*batch.fence));
    for (PendingGrad& g : batch.grads) {
      HostView(g.state->grad, g.state->numel).add_(HostView(g.staging, g.state->numel));
      final_grads_.push_back(g.state);
    }
    pending_grads_.pop_front();  // staging buffers go back to the arena's pools
  }
  return absl::OkStatus();
}

absl::Status LayerwiseTrainerImpl::StartGradientSums() {
  // ZeRO-2 sums every pass: a rank keeps no gradient of a tensor it does
  // not hold from one micro-batch to the next. Gloo has no reduce-scatter,
  // so each rank all-reduces and keeps what it holds.
  if (!data_parallel() || !(sum_this_pass_ || sharded_)) {
    final_grads_.clear();
    return absl::OkStatus();
  }
  if (final_grads_.empty()) return absl::OkStatus();
  ProcessGroup& gang = *options_.data_parallel;
  // Sharded, the bucket by owner: each rank needs only its own tensors'
  // sums (reduce-scatter where the backend has it). Otherwise one list.
  std::vector<std::vector<at::Tensor>> owned(sharded_ ? static_cast<size_t>(gang.world_size()) : 1);
  std::vector<ParamState*> borrowed;
  for (ParamState* p : final_grads_) {
    owned[sharded_ ? static_cast<size_t>(p->owner) : 0].push_back(
        p->device_grad.defined() ? p->device_grad : HostView(p->grad, p->numel));
    if (sharded_ && !p->held) borrowed.push_back(p);
  }
  final_grads_.clear();
  STRATA_RETURN_IF_ERROR(sharded_ ? gang.StartReduceScatterSum(std::move(owned))
                                  : gang.StartAllReduceSum(std::move(owned[0])));
  summing_.push_back(std::move(borrowed));
  // One layer's sum overlaps the next layer's backward; older ones end here
  // so that their borrowed gradients go back to the arena.
  return ReleaseSummed(/*keep_in_flight=*/1);
}

absl::Status LayerwiseTrainerImpl::FinishGradientSums() {
  if (!data_parallel()) return absl::OkStatus();
  return ReleaseSummed(0);
}

absl::Status LayerwiseTrainerImpl::ReleaseSummed(size_t keep_in_flight) {
  const absl::Status status = options_.data_parallel->WaitPending(keep_in_flight);
  while (summing_.size() > keep_in_flight) {
    for (ParamState* p : summing_.front()) ReleaseGrad(*p);
    summing_.pop_front();
  }
  return status;
}

absl::Status LayerwiseTrainerImpl::AllocateGrad(ParamState& p) {
  const size_t bytes = static_cast<size_t>(p.numel) * sizeof(float);
  auto buffer = arena_->Allocate(bytes);
  if (!buffer.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("gradient of ", p.name, ": ", buffer.status().message()));
  }
  p.grad = *std::move(buffer);
  std::memset(p.grad.data(), 0, bytes);
  grad_bytes_ += static_cast<int64_t>(bytes);
  grad_bytes_peak_ = std::max(grad_bytes_peak_, grad_bytes_);
  return absl::OkStatus();
}

void LayerwiseTrainerImpl::ReleaseGrad(ParamState& p) {
  if (p.grad.data() == nullptr) return;
  grad_bytes_ -= p.numel * static_cast<int64_t>(sizeof(float));
  p.grad = offload::HostBuffer();  // back to the arena's pools
}

void LayerwiseTrainerImpl::AbandonGrads() {
  // Sums still writing into the gradient buffers end first.
  (void)FinishGradientSums();
  final_grads_.clear();
  if (sharded_) {
    for (ParamState& p : params_) {
      if (!p.held) ReleaseGrad(p);
    }
  }
  if (grad_transfer_ == nullptr) return;
  // One wait covers every download queued, whichever batch it belongs to.
  if (!grad_transfer_->WaitAll().ok()) (void)offload::SynchronizeDevice(grad_transfer_->device());
  current_grads_ = PendingBatch();
  pending_grads_.clear();
}

LayerwiseTrainerImpl::~LayerwiseTrainerImpl() { AbandonGrads(); }

absl::StatusOr<double> LayerwiseTrainerImpl::ForwardBackward(const at::Tensor& input_ids,
                                                             const at::Tensor& attention_mask, const LossFn& loss_fn,
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
                                            resident_.embed_tokens.scalar_type());
  // Forward without autograd, keeping each layer's input.
  std::vector<at::Tensor> inputs(static_cast<size_t>(layers) + 1);
  {
    c10::NoGradGuard no_grad;
    inputs[0] = at::embedding(resident_.embed_tokens, input_ids);
    STRATA_RETURN_IF_ERROR(source_->BeginPass(Range(layers, false)));
    for (int64_t l = 0; l < layers; ++l) {
      if (absl::Status s = CheckInterrupt("in a forward pass"); !s.ok()) {
        source_->EndPass();
        return s;
      }
      auto w = source_->Acquire(l);
      if (!w.ok()) {
        source_->EndPass();
        return w.status();
      }
      inputs[static_cast<size_t>(l) + 1] = DecoderLayerForward(config_, *w, inputs[static_cast<size_t>(l)], ctx,
                                                               nullptr, l);
      *w = LlamaLayerWeights();  // before Release: the streamer may reuse the buffers
      source_->Release(l);
    }
    source_->EndPass();
  }

  // Head and loss with autograd; leaves stand in for the resident weights.
  at::Tensor embed = resident_.embed_tokens.detach().requires_grad_();
  at::Tensor norm = resident_.norm.detach().requires_grad_();
  at::Tensor head_weight;
  if (head_ == LlamaHead::kScalar) {
    head_weight = resident_.score.detach().requires_grad_();
  } else {
    head_weight = resident_.lm_head.defined() ? resident_.lm_head.detach().requires_grad_() : embed;
  }
  at::Tensor top = inputs.back().detach().requires_grad_();
  inputs.back() = at::Tensor();
  double loss_value = 0;
  {
    // Scoped so that logits, the loss graph and the head's gradient are
    // freed before the backward pass brings layers back to the device.
    const at::Tensor hidden = RmsNorm(top, norm, config_.rms_norm_eps);
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
    auto w = source_->Acquire(l);
    if (!w.ok()) {
      source_->EndPass();
      return w.status();
    }
    std::vector<at::Tensor*> slots = LayerTensors(*w);
    for (at::Tensor* t : slots) *t = t->detach().requires_grad_();
    at::Tensor x = inputs[static_cast<size_t>(l)].detach().requires_grad_();
    inputs[static_cast<size_t>(l)] = at::Tensor();
    {
      // Scoped: the output's graph refers to the weights, which the streamer
      // reuses for a later fetch only once nothing does.
      const at::Tensor y = DecoderLayerForward(config_, *w, x, ctx, nullptr, l);
      y.backward(grad);
    }
    if (options_.step_in_backward) {
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

  at::embedding(embed, input_ids).backward(grad);
  status.Update(AccumulateGrad(params_[0], embed.grad()));  // params_[0] is embed_tokens (see Create)
  status.Update(FlushGrads(/*keep_in_flight=*/0));
  if (status.ok()) status.Update(StartGradientSums());
  if (status.ok()) status.Update(FinishGradientSums());
  if (!status.ok()) return status;
  summed_since_step_ = data_parallel() && sum_over_gang;
  std::move(abandon_grads).Cancel();
  return loss_value;
}

absl::Status LayerwiseTrainerImpl::SaveState(const std::string& path) {
  TensorWriteBatch batch;
  std::map<std::string, std::string> metadata = {{"format", "strata-optimizer"}};
  for (ParamState& p : params_) {
    if (!p.held) continue;
    at::Tensor master, m, v;
    if (options_.optimizer == offload::Tier::kDevice) {
      master = p.device_master, m = p.device_exp_avg, v = p.device_exp_avg_sq;
    } else if (options_.optimizer == offload::Tier::kHost) {
      master = HostView(p.master, p.numel), m = HostView(p.exp_avg, p.numel), v = HostView(p.exp_avg_sq, p.numel);
    } else {
      master = at::empty({p.numel}, at::kFloat), m = at::empty({p.numel}, at::kFloat),
      v = at::empty({p.numel}, at::kFloat);
      auto span = [&](at::Tensor& t) { return std::span<float>(t.data_ptr<float>(), static_cast<size_t>(p.numel)); };
      STRATA_RETURN_IF_ERROR(nvme_adam_->ReadState(p.name, span(master), span(m), span(v)));
    }
    for (auto [suffix, tensor] : {std::pair{".master", &master}, std::pair{".exp_avg", &m},
                                  std::pair{".exp_avg_sq", &v}}) {
      STRATA_RETURN_IF_ERROR(batch.Add(p.name + suffix, *tensor));
    }
    metadata["step." + p.name] = std::to_string(p.step);
  }
  return WriteSafetensors(path, batch.entries(), metadata);
}

absl::Status LayerwiseTrainerImpl::LoadState(const std::vector<std::string>& paths) {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  for (const std::string& path : paths) {
    STRATA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    files.push_back(std::move(file));
  }
  for (ParamState& p : params_) {
    if (!p.held) continue;
    // The file (of whichever rank wrote this parameter's state) that has it.
    size_t which = 0;
    while (which < files.size() && files[which]->Find(p.name + ".master") == nullptr) ++which;
    if (which == files.size()) {
      return absl::InvalidArgumentError(absl::StrCat(absl::StrJoin(paths, ", "),
                                                     ": no optimizer state for ", p.name));
    }
    const SafetensorsFile* file = files[which].get();
    const std::string& path = paths[which];
    std::array<at::Tensor, 3> loaded;
    const char* suffixes[] = {".master", ".exp_avg", ".exp_avg_sq"};
    for (int i = 0; i < 3; ++i) {
      const TensorView* view = file->Find(p.name + suffixes[i]);
      if (view == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": optimizer state has no tensor ", p.name, suffixes[i]));
      }
      auto tensor = ToTensorWithShape(*view, {p.numel}, at::kFloat);
      if (!tensor.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", tensor.status().message()));
      loaded[static_cast<size_t>(i)] = *tensor;
    }
    auto step = file->metadata().find("step." + p.name);
    if (step == file->metadata().end() || !absl::SimpleAtoi(step->second, &p.step)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": optimizer state has no step count for ", p.name));
    }
    if (options_.optimizer == offload::Tier::kDevice) {
      p.device_master.copy_(loaded[0]), p.device_exp_avg.copy_(loaded[1]), p.device_exp_avg_sq.copy_(loaded[2]);
    } else if (options_.optimizer == offload::Tier::kHost) {
      HostView(p.master, p.numel).copy_(loaded[0]);
      HostView(p.exp_avg, p.numel).copy_(loaded[1]);
      HostView(p.exp_avg_sq, p.numel).copy_(loaded[2]);
    } else {
      auto span = [&](const at::Tensor& t) {
        return std::span<const float>(t.data_ptr<float>(), static_cast<size_t>(p.numel));
      };
      STRATA_RETURN_IF_ERROR(nvme_adam_->WriteState(p.name, span(loaded[0]), span(loaded[1]), span(loaded[2])));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> LayerwiseTrainerImpl::Gradient(const std::string& name) const {
  for (const ParamState& p : params_) {
    if (p.name != name) continue;
    if (!p.device_grad.defined() && p.grad.data() == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          name, ": no gradient kept for it (step_in_backward keeps none for layers; ZeRO-2 keeps only the held ones)"));
    }
    const at::Tensor grad = p.device_grad.defined() ? p.device_grad : HostView(p.grad, p.numel);
    return grad.to(at::kCPU).clone().view(p.shape);
  }
  return absl::NotFoundError(absl::StrCat("no parameter named ", name));
}

std::span<std::byte> LayerwiseTrainerImpl::WriteTarget(const ParamState& p) {
  return p.resident != nullptr ? WritableCpuBytes(*p.resident) : source_->WritableHome(p.layer, p.index);
}

absl::Status LayerwiseTrainerImpl::WriteBack(const ParamState& p, const at::Tensor& master) {
  c10::NoGradGuard no_grad;
  if (p.resident != nullptr) {
    p.resident->copy_(master.view(p.shape));
    return absl::OkStatus();
  }
  return source_->Store(p.layer, p.index, master.view(p.shape).to(p.dtype));
}

absl::Status LayerwiseTrainerImpl::SetLearningRate(double lr) {
  STRATA_RETURN_IF_ERROR(adam_->SetLearningRate(lr));  // the NVMe optimizer steps through it too
  options_.adam.adam.lr = lr;                          // the device optimizer reads this
  return absl::OkStatus();
}

namespace {

// Sum of squares of a host gradient at memory speed: eight float lanes the
// compiler vectorises, summed into a double every block so that the total
// keeps its precision. (at::dot per tensor cost ~5 ms a step on the tiny
// model, 6% of a PPO iteration.)
double SquaredNorm(const float* x, int64_t n) {
  constexpr int64_t kBlock = 1 << 14;
  double total = 0;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = begin;
    for (; i + 8 <= end; i += 8) {
      for (int k = 0; k < 8; ++k) lanes[k] += x[i + k] * x[i + k];
    }
    for (; i < end; ++i) lanes[0] += x[i] * x[i];
    for (float lane : lanes) total += lane;
  }
  return total;
}

}  // namespace

absl::Status LayerwiseTrainerImpl::ClipGradients() {
  // Unsharded, every rank holds every summed gradient and this norm is the
  // global one on each rank; ZeRO-2, each holds its share and the squares
  // are summed over the gang.
  c10::NoGradGuard no_grad;
  // step_in_backward: the layers' part was summed as each stepped.
  double squares = layer_squares_;
  layer_squares_ = 0.0;
  for (const ParamState& p : params_) {
    if (p.device_grad.defined()) {
      const at::Tensor g = p.device_grad.reshape(-1);
      squares += at::dot(g, g).item<double>();
    } else if (p.grad.data() != nullptr) {
      squares += SquaredNorm(p.grad.floats().data(), p.numel);
    }
  }
  if (sharded_) {
    std::vector<at::Tensor> total = {at::full({1}, squares, at::kDouble)};
    STRATA_RETURN_IF_ERROR(options_.data_parallel->AllReduceSum(total));
    squares = total[0].item<double>();
  }
  last_grad_norm_ = std::sqrt(squares);
  if (!std::isfinite(last_grad_norm_)) {
    return absl::InternalError(absl::StrCat("the gradient norm is ", last_grad_norm_,
                                            ": the loss diverged (lower train.lr or set train.max_grad_norm)"));
  }
  const double max_norm = options_.max_grad_norm;
  const double coefficient = max_norm / (last_grad_norm_ + 1e-6);  // torch's clip_grad_norm_
  if (max_norm <= 0 || coefficient >= 1.0) return absl::OkStatus();
  for (const ParamState& p : params_) {
    if (p.device_grad.defined()) {
      p.device_grad.mul_(coefficient);
    } else if (p.grad.data() != nullptr) {
      HostView(p.grad, p.numel).mul_(coefficient);
    }
  }
  return absl::OkStatus();
}

absl::Status LayerwiseTrainerImpl::OptimizerStep() {
  summed_since_step_ = false;
  passes_since_step_ = 0;
  STRATA_RETURN_IF_ERROR(ClipGradients());
  // With step_in_backward the layers stepped already; the rest steps here.
  const std::vector<ParamState*> params = HeldParams(/*layers=*/!options_.step_in_backward);
  absl::Status status;
  switch (options_.optimizer) {
    case offload::Tier::kHost: status = HostStep(params); break;
    case offload::Tier::kNvme: status = NvmeStep(params); break;
    case offload::Tier::kDevice: status = DeviceStep(); break;
  }
  if (!status.ok()) return status;
  for (ParamState& p : params_) {
    if (p.device_grad.defined()) {
      p.device_grad.zero_();
    } else if (p.grad.data() != nullptr) {
      std::memset(p.grad.data(), 0, static_cast<size_t>(p.numel) * sizeof(float));
    }
  }
  return absl::OkStatus();
}

std::vector<LayerwiseTrainerImpl::ParamState*> LayerwiseTrainerImpl::HeldParams(bool layers) {
  std::vector<ParamState*> out;
  for (ParamState& p : params_) {
    if (p.held && (layers || p.layer < 0)) out.push_back(&p);
  }
  return out;
}

absl::Status LayerwiseTrainerImpl::StepLayer(int64_t l, const std::vector<at::Tensor*>& slots) {
  c10::NoGradGuard no_grad;
  std::vector<ParamState*> layer;
  absl::Status status;
  for (size_t i = 0; i < slots.size() && status.ok(); ++i) {
    ParamState& p = params_[layer_params_[static_cast<size_t>(l)][i]];
    status = AllocateGrad(p);  // zeroed
    if (!status.ok()) break;
    const at::Tensor grad = slots[i]->grad();
    if (grad.defined()) HostView(p.grad, p.numel).copy_(grad.reshape({-1}).to(at::kCPU, at::kFloat));
    layer_squares_ += SquaredNorm(p.grad.floats().data(), p.numel);
    layer.push_back(&p);
  }
  if (status.ok()) status = options_.optimizer == offload::Tier::kHost ? HostStep(layer) : NvmeStep(layer);
  for (ParamState* p : layer) ReleaseGrad(*p);
  return status;
}

absl::Status LayerwiseTrainerImpl::HostStep(const std::vector<ParamState*>& params) {
  std::vector<offload::AdamTensorSpan> spans;
  spans.reserve(params.size());
  std::vector<const ParamState*> write_back;  // homes the optimizer cannot write in place
  for (ParamState* held : params) {
    ParamState& p = *held;
    offload::AdamTensorSpan span;
    span.name = p.name;
    const size_t n = static_cast<size_t>(p.numel);
    span.param = p.master.floats().first(n);
    span.grad = p.grad.floats().first(n);
    span.exp_avg = p.exp_avg.floats().first(n);
    span.exp_avg_sq = p.exp_avg_sq.floats().first(n);
    span.step = ++p.step;
    // The device weights are written in the same pass as the update when
    // their home is host memory we can reach (ZeRO-Offload's fused copy).
    const std::span<std::byte> home = WriteTarget(p);
    if (!home.empty() && p.dtype == at::kFloat) {
      span.device_fp32 = {reinterpret_cast<float*>(home.data()), n};
    } else if (!home.empty() && p.dtype == at::kBFloat16) {
      span.device_bf16 = {reinterpret_cast<uint16_t*>(home.data()), n};
    } else {
      write_back.push_back(&p);
    }
    spans.push_back(span);
  }
  STRATA_RETURN_IF_ERROR(adam_->Step(spans));
  for (const ParamState* p : write_back) {
    STRATA_RETURN_IF_ERROR(WriteBack(*p, HostView(p->master, p->numel)));
  }
  if (!sharded_) return absl::OkStatus();
  return BroadcastUpdatedWeights([](const ParamState& p) { return HostView(p.master, p.numel); });
}

absl::Status LayerwiseTrainerImpl::BroadcastUpdatedWeights(
    const std::function<at::Tensor(const ParamState&)>& updated) {
  // Each owner sends its new weights in the model's dtype, which is all any
  // rank's model keeps (bf16 weights cross as 2 bytes a parameter, not the
  // 4 of the fp32 masters), as one flat buffer per layer (or the resident
  // tensors): one collective where there was one per tensor. The owner
  // rounds its masters as it rounded its own copy (to nearest even), so the
  // replicas stay identical. The others receive into a buffer borrowed for
  // that layer and write the weights back.
  ProcessGroup& gang = *options_.data_parallel;
  for (int owner = 0; owner < gang.world_size(); ++owner) {
    for (size_t begin = 0; begin < params_.size();) {
      size_t end = begin;
      while (end < params_.size() && params_[end].layer == params_[begin].layer) ++end;
      // One dtype per model in practice; a flat buffer holds one.
      std::map<at::ScalarType, std::vector<const ParamState*>> owned;
      for (size_t i = begin; i < end; ++i) {
        if (params_[i].owner == owner) owned[params_[i].dtype].push_back(&params_[i]);
      }
      for (const auto& [dtype, part] : owned) STRATA_RETURN_IF_ERROR(BroadcastPart(part, dtype, owner, updated));
      begin = end;
    }
  }
  return absl::OkStatus();
}

absl::Status LayerwiseTrainerImpl::BroadcastPart(const std::vector<const ParamState*>& part, at::ScalarType dtype,
                                                 int owner, const std::function<at::Tensor(const ParamState&)>& updated) {
  int64_t numel = 0;
  for (const ParamState* p : part) numel += p->numel;
  auto buffer = arena_->Allocate(static_cast<size_t>(numel) * c10::elementSize(dtype));
  if (!buffer.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("weight broadcast of ", part.front()->name, " and its layer: ", buffer.status().message()));
  }
  const at::Tensor flat = at::from_blob(buffer->data(), {numel}, at::TensorOptions().dtype(dtype));
  const bool sending = owner == options_.data_parallel->rank();
  if (sending) {
    std::vector<at::Tensor> masters;
    for (const ParamState* p : part) masters.push_back(updated(*p));
    PackFlat(masters, flat);
  }
  // A broadcast copies bytes unchanged, so they cross as bytes: Gloo 1.13
  // takes no bf16 (nor int16).
  std::vector<at::Tensor> wire = {flat.view(at::kByte)};
  STRATA_RETURN_IF_ERROR(options_.data_parallel->Broadcast(wire, owner));
  if (sending) return absl::OkStatus();
  int64_t offset = 0;
  for (const ParamState* p : part) {
    STRATA_RETURN_IF_ERROR(WriteBack(*p, flat.narrow(0, offset, p->numel)));
    offset += p->numel;
  }
  return absl::OkStatus();
}

int64_t LayerwiseTrainerImpl::optimizer_state_bytes() const {
  int64_t floats = 0;
  for (const ParamState& p : params_) {
    if (p.held) floats += 3 * p.numel;
  }
  return floats * static_cast<int64_t>(sizeof(float));
}

absl::Status LayerwiseTrainerImpl::NvmeStep(const std::vector<ParamState*>& params) {
  std::vector<offload::NvmeAdamUpdate> updates;
  std::vector<std::pair<const ParamState*, offload::HostBuffer>> write_back;
  std::map<const ParamState*, at::Tensor> updated;  // sharded: each held tensor's new fp32 weights
  write_back.reserve(params.size());
  for (ParamState* held : params) {
    ParamState& p = *held;
    offload::NvmeAdamUpdate update;
    update.name = p.name;
    const size_t n = static_cast<size_t>(p.numel);
    update.grad = p.grad.floats().first(n);
    update.step = ++p.step;
    std::span<std::byte> home = WriteTarget(p);
    if (sharded_ || home.empty() || (p.dtype != at::kFloat && p.dtype != at::kBFloat16)) {
      // No reachable home (or the gang needs the fp32 weights to send): the
      // new weights land in a pooled scratch buffer and are stored after
      // the step.
      STRATA_ASSIGN_OR_RETURN(auto scratch, arena_->Allocate(n * sizeof(float)));
      update.out_fp32 = scratch.floats().first(n);
      if (sharded_) updated[&p] = HostView(scratch, p.numel);
      write_back.emplace_back(&p, std::move(scratch));
    } else if (p.dtype == at::kFloat) {
      update.out_fp32 = {reinterpret_cast<float*>(home.data()), n};
    } else {
      update.out_bf16 = {reinterpret_cast<uint16_t*>(home.data()), n};
    }
    updates.push_back(update);
  }
  STRATA_RETURN_IF_ERROR(nvme_adam_->Step(updates));
  for (const auto& [p, scratch] : write_back) {
    STRATA_RETURN_IF_ERROR(WriteBack(*p, HostView(scratch, p->numel)));
  }
  if (!sharded_) return absl::OkStatus();
  return BroadcastUpdatedWeights([&](const ParamState& p) { return updated.at(&p); });
}

absl::Status LayerwiseTrainerImpl::DeviceStep() {
  // AdamW with torch ops on the device, in torch::optim::AdamW's order.
  c10::NoGradGuard no_grad;
  const offload::AdamOptions& o = options_.adam.adam;
  for (ParamState& p : params_) {
    const int64_t step = ++p.step;
    const double bias1 = 1 - std::pow(o.beta1, static_cast<double>(step));
    const double bias2 = 1 - std::pow(o.beta2, static_cast<double>(step));
    at::Tensor grad = p.device_grad;
    if (o.decoupled) {
      p.device_master.mul_(1 - o.lr * o.weight_decay);
    } else if (o.weight_decay != 0) {
      grad = grad.add(p.device_master, o.weight_decay);
    }
    p.device_exp_avg.mul_(o.beta1).add_(grad, 1 - o.beta1);
    p.device_exp_avg_sq.mul_(o.beta2).addcmul_(grad, grad, 1 - o.beta2);
    const at::Tensor denom = (p.device_exp_avg_sq.sqrt() / std::sqrt(bias2)).add_(o.eps);
    p.device_master.addcdiv_(p.device_exp_avg, denom, -o.lr / bias1);
    STRATA_RETURN_IF_ERROR(WriteBack(p, p.device_master));
  }
  return absl::OkStatus();
}

}  // namespace strata::policies
