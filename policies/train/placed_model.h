// One model of a job under its placement: weights resident or streamed
// through the offload engine, and, when trainable, a layer-wise trainer
// whose optimizer and gradients sit where the placement says. The worker
// holds the actor, reference, reward model and critic as PlacedModels.
#ifndef STRATA_POLICIES_TRAIN_PLACED_MODEL_H_
#define STRATA_POLICIES_TRAIN_PLACED_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "offload/host/host_arena.h"
#include "offload/nvme/nvme_store.h"
#include "offload/stream/layer_streamer.h"
#include "offload/tiers/placement.h"
#include "policies/config/lora_config.h"
#include "policies/model/layer_source.h"
#include "policies/model/llama.h"
#include "policies/model/lora.h"
#include "policies/train/layerwise_trainer.h"

namespace strata::policies {

// Memory shared by every model of a worker; each must outlive the models.
struct OffloadContext {
  offload::HostArena* arena = nullptr;            // host homes, optimizer states, staging
  offload::NvmeStore* nvme = nullptr;             // required by nvme placements
  offload::TierAccountant* accountant = nullptr;  // optional: home bytes per tier
  size_t device_budget_bytes = 0;                 // 0: unlimited
  // Where the model computes: the CPU, or cuda:N in a CUDA build (the arena
  // should then be pinned). Inputs must be on it; outputs are.
  at::Device device = at::kCPU;
};

struct PlacedModelOptions {
  std::string name;  // "actor", ...: prefixes NVMe ids and names errors
  offload::ModelPlacement placement;
  bool trainable = false;
  // Adam hyperparameters and threads; optimizer and gradient tiers are taken
  // from `placement`.
  LayerwiseTrainerOptions trainer;
  // Batch and sequence length the model runs at, for the compute reserve
  // kept free under a device budget.
  int64_t batch = 8;
  int64_t seq = 128;
  // Trainable only: low-rank adapters train in place of every parameter
  // (rank 0: none). The base stays frozen wherever its placement puts it;
  // the adapters, their gradients and Adam state sit beside the compute
  // (the device) and on the placement's optimizer tier.
  LoraConfig lora;
  uint64_t lora_seed = 0;  // the adapters' init and dropout masks
  std::string base_model;  // base_model_name_or_path of saved adapters
  // A PEFT LoRA adapter to start from: kept frozen as part of the base, with
  // `lora` (default: the adapter's own settings) training new adapters over it.
  std::string start_adapter;
};

class PlacedModel {
 public:
  static absl::StatusOr<std::unique_ptr<PlacedModel>> Create(std::unique_ptr<LlamaModel> model,
                                                             const PlacedModelOptions& options,
                                                             const OffloadContext& context);

  // Forward and generation; layers come through the placement.
  LlamaModel& model() { return *model_; }
  const LlamaModel& model() const { return *model_; }
  // Null unless trainable.
  LayerwiseTrainer* trainer() { return trainer_.get(); }
  const offload::ModelPlacement& placement() const { return options_.placement; }
  const std::string& name() const { return options_.name; }
  // With LoRA: the adapters model() applies, and the same weights without
  // them (the frozen base: a LoRA job's reference, at no memory of its
  // own). Null without LoRA.
  LoraAdapters* adapters() { return adapters_.get(); }
  const LlamaModel* frozen_base() const { return base_.get(); }

  // Writes the current weights in HF layout (layers read back from their
  // home); with LoRA, the trained adapters (and a scalar head) in PEFT's
  // layout: what a checkpoint holds and LoadWeights reads back.
  absl::Status Save(const std::string& dir) const;
  // What a job outputs: Save's files, except that a starting adapter and
  // the adapters trained over it are written as one PEFT adapter
  // (LoraAdapters::Stacked) that PEFT loads over the base alone.
  absl::Status Export(const std::string& dir) const;
  // Reads weights saved by Save (same shapes) into the placed model.
  absl::Status LoadWeights(const std::string& dir);
  // With LoRA: base + adapters merged, in HF layout, one layer at a time.
  absl::Status SaveMerged(const std::string& dir) const;

 private:
  explicit PlacedModel(const PlacedModelOptions& options) : options_(options) {}

  // Gathers the layers back from their home (`merged`: with the adapters
  // merged in) into a whole model.
  absl::StatusOr<LlamaModel> Gathered(bool merged) const;

  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<LlamaModel> base_;               // LoRA: model_ without adapters
  std::unique_ptr<LoraAdapters> adapters_;         // LoRA only
  std::unique_ptr<LoraAdapters> frozen_adapters_;  // a starting adapter, frozen
  const PlacedModelOptions options_;
  std::unique_ptr<offload::LayerStreamer> streamer_;
  std::unique_ptr<LayerSource> source_;
  std::unique_ptr<LayerwiseTrainer> trainer_;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_TRAIN_PLACED_MODEL_H_
