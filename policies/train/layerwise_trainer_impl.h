// Private to policies/train: the state of LayerwiseTrainer shared by the
// files that implement it, one concept each: setup and parameter table
// (layerwise_trainer.cc), the forward/backward streaming schedule
// (layerwise_forward_backward.cc), gradients on their way to the host and
// over the gang (layerwise_gradients.cc), the gradient norm and clipping
// (layerwise_grad_norm.cc), the optimizer step (layerwise_optimizer_step.cc),
// ZeRO-1's weight broadcast (layerwise_weight_broadcast.cc) and the
// optimizer-state checkpoint (layerwise_optimizer_state.cc). Callers use
// LayerwiseTrainer.
#ifndef STRATA_POLICIES_TRAIN_LAYERWISE_TRAINER_IMPL_H_
#define STRATA_POLICIES_TRAIN_LAYERWISE_TRAINER_IMPL_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/device/device_transfer.h"
#include "offload/host/host_arena.h"
#include "offload/stream/activation_stash.h"
#include "policies/config/tensor_dealer.h"
#include "policies/train/galore.h"
#include "policies/train/layerwise_trainer.h"

namespace strata::policies {

namespace internal {
// The first `numel` floats of a host buffer as a tensor (no copy).
inline at::Tensor HostView(const offload::HostBuffer& buffer, int64_t numel) {
  return at::from_blob(buffer.data(), {numel}, at::TensorOptions().dtype(at::kFloat));
}

// Sum of squares of `n` host floats, accumulated in double.
double SquaredNorm(const float* x, int64_t n);
}  // namespace internal

class LayerwiseTrainerImpl final : public LayerwiseTrainer {
 public:
  LayerwiseTrainerImpl(const LlamaConfig& config, LlamaHead head, LlamaWeights resident, LayerSource* source,
                       offload::HostArena* arena, const LayerwiseTrainerOptions& options);
  ~LayerwiseTrainerImpl() override;
  absl::StatusOr<double> ForwardBackwardAt(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                           const at::Tensor& head_positions, const LossFn& loss_fn,
                                           bool sum_over_gang) override;
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
    // GaLore: the projection and low-rank moments in place of exp_avg and
    // exp_avg_sq (in galore_state on a host or NVMe optimizer).
    std::unique_ptr<GaloreMatrix> galore;
    std::vector<offload::HostBuffer> galore_state;
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
  bool data_parallel() const { return options_.data_parallel != nullptr && options_.data_parallel->world_size() > 1; }
  absl::Status AllocateState(ParamState& state, const at::Tensor& value);
  // The host bytes the optimizer may write p's new weights into, or empty.
  std::span<std::byte> WriteTarget(const ParamState& p);
  // Copies new fp32 weights `master` into p's device tensor or layer home.
  absl::Status WriteBack(const ParamState& p, const at::Tensor& master);
  // The optimizer over `params` (all of them: every held parameter).
  absl::Status HostStep(const std::vector<ParamState*>& params);
  // GaLore's step of one matrix: its direction from the gradient (the
  // projection refreshed when due), the step number advanced; into `out`
  // when given.
  at::Tensor GaloreDirection(ParamState& p, const at::Tensor& grad, at::Tensor out = at::Tensor());
  // Host and NVMe optimizers: the direction in a buffer from the arena
  // (pooled: the same sizes recur every step, so no page is faulted twice).
  absl::StatusOr<offload::HostBuffer> GaloreHostDirection(ParamState& p);
  // The GaLore state of a decoder-layer matrix, where the optimizer lives.
  absl::Status AllocateGalore(ParamState& state);
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
  bool lora() const { return options_.lora != nullptr; }
  // Layer `l`'s adapters as a training pass applies them (dropout keyed by
  // the step and micro-batch), over `layer`: the adapters themselves, or
  // their leaves in a recomputation. A starting adapter's apply is written
  // to `frozen`, which the result points to.
  LoraApply TrainingApply(int64_t l, const LoraLayer* layer, LoraApply* frozen) const;

  const LlamaConfig config_;
  const LlamaHead head_;
  LlamaWeights resident_;
  LayerSource* const source_;
  offload::HostArena* const arena_;
  LayerwiseTrainerOptions options_;  // the learning rate changes with schedules
  std::unique_ptr<offload::CpuAdam> adam_;
  std::unique_ptr<offload::NvmeAdamState> nvme_adam_;
  std::unique_ptr<offload::DeviceTransfer> grad_transfer_;  // GPU with host gradients only
  std::unique_ptr<offload::ActivationStash> activations_;   // the layers' inputs between the passes
  PendingBatch current_grads_;
  std::deque<PendingBatch> pending_grads_;
  std::vector<ParamState*> final_grads_;  // data parallel: not yet handed to the sum
  // ZeRO-2: per sum in flight, the tensors not held here whose gradients it
  // sums (they go back to the arena once it is done).
  std::deque<std::vector<ParamState*>> summing_;
  int64_t grad_bytes_ = 0, grad_bytes_peak_ = 0;  // host gradient buffers, now and at most
  bool summed_since_step_ = false;                // data parallel: gradients already summed
  bool sum_this_pass_ = true;                     // this ForwardBackward sums over the gang
  int64_t passes_since_step_ = 0;                 // ForwardBackward calls since OptimizerStep
  double layer_squares_ = 0.0;                    // step_in_backward: the layers' gradient sum of squares
  double last_grad_norm_ = 0.0;
  std::vector<ParamState> params_;
  std::vector<std::vector<size_t>> layer_params_;  // params_ index per layer tensor
  // LoRA: per layer, the params_ index of each adapter tensor, in
  // LoraAdapters::NamedInLayer order. The layers' own tensors have none.
  std::vector<std::vector<size_t>> lora_params_;
  int64_t steps_taken_ = 0;  // optimizer steps, restored with the state (keys dropout masks)
  // ZeRO-1 and 2: the optimizer and the gradients are sharded over the
  // gang, whole tensors dealt out as they are met.
  bool sharded_ = false;
  std::optional<TensorDealer> dealer_;
  int64_t num_parameters_ = 0;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_TRAIN_LAYERWISE_TRAINER_IMPL_H_
