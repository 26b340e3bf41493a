// Training a Llama one decoder layer at a time, so that layer weights need
// not stay on the device: the forward pass keeps only each layer's input,
// the backward pass brings each layer back (reverse order), recomputes it
// with autograd and backpropagates through it alone (activation
// checkpointing at layer granularity). Gradients go to host fp32 buffers as
// each layer finishes; the optimizer (CPU AdamW) updates fp32 master weights
// on the host and writes the device-dtype weights back to the layers' home.
//
// Where layer weights come from is a LayerSource: resident on the device, or
// streamed from host / NVMe by the offload engine.
#ifndef STRATA_POLICIES_LAYERWISE_TRAINER_H_
#define STRATA_POLICIES_LAYERWISE_TRAINER_H_

#include <ATen/ATen.h>

#include <deque>
#include <functional>
#include <span>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "offload/cpu_adam.h"
#include "offload/device_transfer.h"
#include "offload/host_arena.h"
#include "offload/layer_streamer.h"
#include "offload/nvme_adam.h"
#include "policies/layer_source.h"
#include "policies/llama.h"

namespace strata::policies {

// Maps the head output at every position (LM logits [B, T, V] or scalar
// head values [B, T, num_labels], float32) to a scalar loss. Reward models
// read their score with AtLastToken.
using LossFn = std::function<at::Tensor(const at::Tensor& output)>;

struct LayerwiseTrainerOptions {
  // Adam hyperparameters, threads and ISA (the device optimizer uses the
  // hyperparameters only).
  offload::CpuAdamOptions adam;
  // Where master weights and moments live (kDevice, kHost or kNvme) and
  // where gradients accumulate; see offload::ModelPlacement for the
  // combinations that work. Weights' placement is the LayerSource's.
  offload::Tier optimizer = offload::Tier::kHost;
  offload::Tier gradients = offload::Tier::kHost;
  // Tiling of NVMe optimizer states.
  offload::NvmeAdamOptions nvme_adam;
  // Move host gradients through DeviceTransfer's staging pipeline even on
  // the CPU device. A GPU with host gradients always uses it (download
  // stream, pinned staging in the arena: 2 layers of fp32 gradients); tests
  // turn it on to run that logic without a GPU.
  bool stage_gradients = false;
};

class LayerwiseTrainer {
 public:
  // `resident` holds embed_tokens, norm, and lm_head or score (its `layers`
  // are ignored: they come from `source`). With a host optimizer, master
  // weights, gradients and both moments (16 bytes per parameter) are
  // allocated in `arena`; with an NVMe optimizer only the gradients (4
  // bytes per parameter) and a few staging tiles are, and the states go to
  // `nvme`. `source`, `arena` and `nvme` must outlive the trainer.
  static absl::StatusOr<std::unique_ptr<LayerwiseTrainer>> Create(const LlamaConfig& config, LlamaHead head,
                                                                  LlamaWeights resident, LayerSource* source,
                                                                  offload::HostArena* arena,
                                                                  const LayerwiseTrainerOptions& options,
                                                                  offload::NvmeStore* nvme = nullptr);

  ~LayerwiseTrainer();

  // Forward and backward of loss_fn(head(...)); gradients are added to the
  // host gradient buffers. Returns the loss. After an error the gradients
  // accumulated since the last OptimizerStep are unspecified.
  absl::StatusOr<double> ForwardBackward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                         const LossFn& loss_fn);

  // One AdamW step from the accumulated gradients, then writes the new
  // weights back (device tensors for resident parts, the source for layers)
  // and zeroes the gradients.
  absl::Status OptimizerStep();

  // Optimizer state (fp32 master weights, both moments and step count of
  // every parameter) as one safetensors file, and its restore. LoadState
  // checks names and sizes and names the offending tensor.
  absl::Status SaveState(const std::string& path);
  absl::Status LoadState(const std::string& path);

  // A copy of the accumulated gradient of the parameter with this HF name,
  // shaped like the parameter; NOT_FOUND for an unknown name.
  absl::StatusOr<at::Tensor> Gradient(const std::string& name) const;

  int64_t num_parameters() const { return num_parameters_; }
  const offload::CpuAdam& adam() const { return *adam_; }

 private:
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
    offload::HostBuffer master, grad, exp_avg, exp_avg_sq;  // host optimizer (grad also for NVMe)
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

  LayerwiseTrainer(const LlamaConfig& config, LlamaHead head, LlamaWeights resident, LayerSource* source,
                   offload::HostArena* arena, const LayerwiseTrainerOptions& options);
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
  absl::Status AllocateState(ParamState& state, const at::Tensor& value);
  // The host bytes the optimizer may write p's new weights into, or empty.
  std::span<std::byte> WriteTarget(const ParamState& p);
  // Copies new fp32 weights `master` into p's device tensor or layer home.
  absl::Status WriteBack(const ParamState& p, const at::Tensor& master);
  absl::Status HostStep();
  absl::Status NvmeStep();
  absl::Status DeviceStep();

  const LlamaConfig config_;
  const LlamaHead head_;
  LlamaWeights resident_;
  LayerSource* const source_;
  offload::HostArena* const arena_;
  const LayerwiseTrainerOptions options_;
  std::unique_ptr<offload::CpuAdam> adam_;
  std::unique_ptr<offload::NvmeAdamState> nvme_adam_;
  std::unique_ptr<offload::DeviceTransfer> grad_transfer_;  // GPU with host gradients only
  PendingBatch current_grads_;
  std::deque<PendingBatch> pending_grads_;
  std::vector<ParamState> params_;
  std::vector<std::vector<size_t>> layer_params_;  // params_ index per layer tensor
  int64_t num_parameters_ = 0;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_LAYERWISE_TRAINER_H_
