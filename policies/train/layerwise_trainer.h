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
#ifndef STRATA_POLICIES_TRAIN_LAYERWISE_TRAINER_H_
#define STRATA_POLICIES_TRAIN_LAYERWISE_TRAINER_H_

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "offload/adam/cpu_adam.h"
#include "offload/adam/nvme_adam.h"
#include "offload/host/host_arena.h"
#include "offload/nvme/nvme_store.h"
#include "offload/tiers/placement.h"
#include "policies/config/galore_config.h"
#include "policies/dist/process_group.h"
#include "policies/model/layer_source.h"
#include "policies/model/llama.h"
#include "policies/model/lora.h"

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
  // Where each decoder layer's input waits between the forward pass and its
  // recomputation in backward (offload/stream/activation_stash.h): kDevice,
  // kHost (the arena) or kNvme (an unnamed scratch file beside the NVMe
  // store's, read back one layer ahead).
  offload::Tier activations = offload::Tier::kDevice;
  // How the layers attend: kAuto takes blocked attention from
  // kBlockedAttentionScores on; benchmarks force either to compare them.
  AttentionKind attention = AttentionKind::kAuto;
  // Tiling of NVMe optimizer states.
  offload::NvmeAdamOptions nvme_adam;
  // Move host gradients through DeviceTransfer's staging pipeline even on
  // the CPU device. A GPU with host gradients always uses it (download
  // stream, pinned staging in the arena: 2 layers of fp32 gradients); tests
  // turn it on to run that logic without a GPU.
  bool stage_gradients = false;
  // Data parallel: the gang whose gradients are summed. Each layer's
  // gradients are handed to it as soon as they are final, so the sums run
  // while the next layer's backward computes; ForwardBackward returns once
  // they are all done. Null (or a gang of one) sums nothing. Each rank
  // scales its loss by its share of the global batch, so the sum is the
  // global batch's gradient. Micro-batches accumulate with
  // `sum_over_gang` false on all passes of a step but the last, whose sum
  // covers them all; a pass after a summed one, before OptimizerStep, is
  // refused (it would sum the first part twice).
  ProcessGroup* data_parallel = nullptr;
  // > 0: before each step, scale all gradients so that their global L2 norm
  // (over every parameter; summed over the gang, so the same on each rank)
  // is at most this, as torch.nn.utils.clip_grad_norm_ does. 0: no clipping.
  double max_grad_norm = 0.0;
  // Host or NVMe optimizer only: each decoder layer is updated as soon as
  // its backward ends, from a one-layer gradient buffer, and no gradient
  // buffer for the layers exists (offload::ModelPlacement::step_in_backward).
  // Refused with data parallelism or clipping; a second ForwardBackward
  // before OptimizerStep (micro-batches) is refused. OptimizerStep then
  // updates the resident tensors (embeddings, norm, head).
  bool step_in_backward = false;
  // LoRA: train these adapters (and a scalar head, PEFT's modules_to_save)
  // instead of every parameter. The base (embeddings, layers, norm, LM
  // head) stays frozen: it gets no gradient, no master and no Adam state.
  // The trainer updates the adapters' tensors in place, so a model using
  // them (generation) sees each step. Must outlive the trainer.
  LoraAdapters* lora = nullptr;
  // A starting adapter under `lora`, frozen like the base (null: none).
  const LoraAdapters* lora_frozen = nullptr;
  // The seed of the adapters' dropout masks (keyed further by the optimizer
  // step, the micro-batch, the layer and the module); unused without dropout.
  uint64_t lora_dropout_seed = 0;
  // GaLore (rank 0: off): every parameter trains, but the Adam moments of
  // the decoder layers' projections live in a low-rank projection of their
  // gradients (policies/train/galore.h), beside the fp32 master on the
  // optimizer's tier; with an NVMe optimizer the small moments stay in the
  // arena and only masters go to NVMe. Embeddings, norms, biases and heads
  // keep full Adam. Needs AdamW; not with LoRA.
  GaloreConfig galore;
  // The seed of GaLore's projections (keyed further by tensor and step).
  uint64_t galore_seed = 0;
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

  virtual ~LayerwiseTrainer() = default;

  // Forward and backward of loss_fn(head(...)); gradients are added to the
  // host gradient buffers. Returns the loss. After an error the gradients
  // accumulated since the last OptimizerStep are unspecified. In a gang,
  // `sum_over_gang` false skips the gradient sum: a micro-batch before the
  // step's last one.
  absl::StatusOr<double> ForwardBackward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                         const LossFn& loss_fn, bool sum_over_gang = true) {
    return ForwardBackwardAt(input_ids, attention_mask, at::Tensor(), loss_fn, sum_over_gang);
  }
  // The same with the head run only at `head_positions` ([B, R] indices into
  // the sequence; undefined: every position), so loss_fn sees [B, R, V]: a
  // language model's loss needs the response positions alone, and the head
  // over a ~150k vocabulary is most of a small model's step.
  virtual absl::StatusOr<double> ForwardBackwardAt(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                                   const at::Tensor& head_positions, const LossFn& loss_fn,
                                                   bool sum_over_gang) = 0;

  // One AdamW step from the accumulated gradients, then writes the new
  // weights back (device tensors for resident parts, the source for layers)
  // and zeroes the gradients.
  virtual absl::Status OptimizerStep() = 0;
  // The global gradient norm the last OptimizerStep saw, before clipping.
  virtual double last_grad_norm() const = 0;
  // The learning rate of the following steps (schedules); INVALID_ARGUMENT
  // when negative.
  virtual absl::Status SetLearningRate(double lr) = 0;

  // Optimizer state (fp32 master weights, both moments and step count of
  // every parameter this rank holds: all of them unless sharded) as one
  // safetensors file, and its restore. LoadState takes the files of every
  // rank that wrote one, whatever the gang's size was then (so a resumed
  // job may re-shard), and reads each parameter this rank holds from the
  // file that has it. It checks names and sizes and names the offending
  // tensor, or the parameter no file has.
  virtual absl::Status SaveState(const std::string& path) = 0;
  virtual absl::Status LoadState(const std::vector<std::string>& paths) = 0;
  absl::Status LoadState(const std::string& path) { return LoadState(std::vector<std::string>{path}); }
  // Host (or device) bytes of the optimizer states this rank holds: fp32
  // master weights and both moments.
  virtual int64_t optimizer_state_bytes() const = 0;
  // The most host bytes of gradient buffers held at once: every gradient
  // unsharded; with ZeRO-2 the held tensors' plus what is borrowed while a
  // sum or a weight broadcast is in flight.
  virtual int64_t gradient_peak_bytes() const = 0;

  // A copy of the accumulated gradient of the parameter with this HF name,
  // shaped like the parameter; NOT_FOUND for an unknown name.
  virtual absl::StatusOr<at::Tensor> Gradient(const std::string& name) const = 0;

  virtual int64_t num_parameters() const = 0;
  virtual const offload::CpuAdam& adam() const = 0;

 protected:
  LayerwiseTrainer() = default;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_TRAIN_LAYERWISE_TRAINER_H_
