#include "policies/train/placed_model.h"

#include <c10/core/GradMode.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "policies/model/peft_adapter.h"
#include "policies/train/streamed_layers.h"

namespace strata::policies {

absl::StatusOr<std::unique_ptr<PlacedModel>> PlacedModel::Create(std::unique_ptr<LlamaModel> model,
                                                                 const PlacedModelOptions& options,
                                                                 const OffloadContext& context) {
  if (auto s = options.placement.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(options.name, ": ", s.message()));
  }
  const offload::ModelPlacement& placement = options.placement;
  const bool needs_nvme = placement.weights == offload::Tier::kNvme ||
                          (options.trainable && (placement.optimizer == offload::Tier::kNvme ||
                                                 placement.activations == offload::Tier::kNvme));
  if (needs_nvme && context.nvme == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(options.name, ": placement uses nvme but no NVMe directory is set"));
  }
  std::unique_ptr<PlacedModel> placed(new PlacedModel(options));
  const LlamaConfig config = model->config();
  const LlamaHead head = model->head();
  const at::ScalarType dtype = model->dtype();
  // The copy shares the tensors' storage; dropping the model leaves it the
  // only owner, so streamed layers are freed as they reach their home.
  LlamaWeights weights = model->weights();
  model.reset();
  // Resident parts always compute on the device; layers only when resident
  // (streamed ones go to their home from wherever they were loaded).
  MoveToDevice(weights, context.device, /*include_layers=*/placement.weights == offload::Tier::kDevice);
  if (placement.weights == offload::Tier::kDevice) {
    // The source shares storage with the model's tensors, so optimizer
    // updates are what generation sees.
    placed->source_ = std::make_unique<ResidentLayerSource>(weights.layers);
    placed->model_ = std::make_unique<LlamaModel>(config, head, weights);
  } else {
    offload::LayerStreamerOptions streaming;
    streaming.device = context.device;
    streaming.home = placement.weights;
    streaming.prefetch_depth = placement.prefetch_depth;
    streaming.nvme_prefix = options.name + "/";
    streaming.device_budget_bytes = context.device_budget_bytes;
    if (context.device_budget_bytes > 0) {
      streaming.compute_reserve_bytes = LayerWorkingBytes(config, options.batch, options.seq, dtype, options.trainable);
    }
    STRATA_ASSIGN_OR_RETURN(auto streamer,
                            offload::LayerStreamer::Create(streaming, context.arena, context.nvme, context.accountant));
    placed->streamer_ = std::move(streamer);
    STRATA_RETURN_IF_ERROR(AddLayersToStreamer(std::move(weights.layers), placed->streamer_.get()));
    weights.layers.clear();
    placed->source_ = std::make_unique<StreamedLayerSource>(placed->streamer_.get());
    placed->model_ = std::make_unique<LlamaModel>(config, head, weights, placed->source_.get());
  }
  LoraConfig lora = options.lora;
  if (!options.start_adapter.empty()) {
    auto start = LoadPeftAdapter(options.start_adapter, config, head, dtype, context.device);
    if (!start.ok()) {
      return absl::Status(start.status().code(), absl::StrCat(options.name, ".adapter: ", start.status().message()));
    }
    placed->frozen_adapters_ = std::move(start->adapters);
    if (start->score.defined()) {
      c10::NoGradGuard no_grad;
      weights.score.copy_(start->score);  // the head the adapter trained (modules_to_save)
    }
    if (!lora.enabled()) lora = start->config;
  }
  if (lora.enabled()) {
    if (!options.trainable) {
      return absl::InvalidArgumentError(absl::StrCat(options.name, ": LoRA adapters are for a model that trains"));
    }
    auto adapters = LoraAdapters::Init(lora, config, dtype, context.device, options.lora_seed);
    if (!adapters.ok()) {
      return absl::Status(adapters.status().code(), absl::StrCat(options.name, ": ", adapters.status().message()));
    }
    placed->adapters_ = std::move(*adapters);
    placed->base_ = std::make_unique<LlamaModel>(config, head, weights, placed->source_.get());
    placed->base_->UseAdapters(nullptr, placed->frozen_adapters_.get());
  }
  placed->model_->UseAdapters(placed->adapters_.get(), placed->frozen_adapters_.get());
  if (options.trainable) {
    LayerwiseTrainerOptions trainer_options = options.trainer;
    trainer_options.lora = placed->adapters_.get();
    trainer_options.lora_frozen = placed->frozen_adapters_.get();
    trainer_options.lora_dropout_seed = options.lora_seed;
    trainer_options.optimizer = placement.optimizer;
    trainer_options.gradients = placement.gradients;
    trainer_options.step_in_backward = placement.step_in_backward;
    trainer_options.activations = placement.activations;
    trainer_options.nvme_adam.id_prefix = options.name + "/";
    auto trainer = LayerwiseTrainer::Create(config, head, weights, placed->source_.get(), context.arena,
                                            trainer_options, context.nvme);
    if (!trainer.ok()) {
      return absl::Status(trainer.status().code(), absl::StrCat(options.name, ": ", trainer.status().message()));
    }
    placed->trainer_ = std::move(*trainer);
  }
  return placed;
}

absl::StatusOr<LlamaModel> PlacedModel::Gathered(bool merged) const {
  LlamaWeights weights = model_->weights();
  const int64_t layers = model_->config().num_hidden_layers;
  if (placement().weights != offload::Tier::kDevice) {
    weights.layers.resize(static_cast<size_t>(layers));
    for (size_t l = 0; l < weights.layers.size(); ++l) {
      std::vector<at::Tensor*> slots = LayerTensors(weights.layers[l]);
      for (size_t i = 0; i < slots.size(); ++i) {
        STRATA_ASSIGN_OR_RETURN(auto tensor, source_->Load(static_cast<int64_t>(l), i));
        *slots[i] = tensor;
      }
    }
  }
  if (merged) {
    for (const LoraAdapters* adapters : {frozen_adapters_.get(), adapters_.get()}) {
      if (adapters == nullptr) continue;
      for (int64_t l = 0; l < layers; ++l) adapters->MergeInto(l, weights.layers[static_cast<size_t>(l)]);
    }
  }
  return LlamaModel(model_->config(), model_->head(), std::move(weights));
}

absl::Status PlacedModel::Save(const std::string& dir) const {
  if (adapters_ != nullptr) {
    // A scalar head (undefined for a language model) is saved beside the adapters.
    return SavePeftAdapter(dir, *adapters_, model_->head(), model_->weights().score, options_.base_model);
  }
  if (placement().weights == offload::Tier::kDevice) return model_->Save(dir);
  STRATA_ASSIGN_OR_RETURN(auto model, Gathered(/*merged=*/false));
  return model.Save(dir);
}

absl::Status PlacedModel::Export(const std::string& dir) const {
  if (frozen_adapters_ == nullptr || adapters_ == nullptr) return Save(dir);
  const std::unique_ptr<LoraAdapters> stacked = LoraAdapters::Stacked(*frozen_adapters_, *adapters_);
  return SavePeftAdapter(dir, *stacked, model_->head(), model_->weights().score, options_.base_model);
}

absl::Status PlacedModel::SaveMerged(const std::string& dir) const {
  STRATA_ASSIGN_OR_RETURN(auto model, Gathered(/*merged=*/true));
  return model.Save(dir);
}

absl::Status PlacedModel::LoadWeights(const std::string& dir) {
  c10::NoGradGuard no_grad;
  if (adapters_ != nullptr) {
    STRATA_ASSIGN_OR_RETURN(auto loaded,
                            LoadPeftAdapter(dir, model_->config(), model_->head(), model_->dtype(), model_->device()));
    if (loaded.adapters->modules() != adapters_->modules() || loaded.config.rank != adapters_->config().rank) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, ": the adapter's rank or target modules differ from ", name(), "'s lora settings"));
    }
    auto to = adapters_->Named();
    auto from = loaded.adapters->Named();
    for (size_t i = 0; i < to.size(); ++i) to[i].second->copy_(*from[i].second);
    if (model_->head() == LlamaHead::kScalar) {
      if (!loaded.score.defined()) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": the adapter has no scalar head (score)"));
      }
      model_->weights().score.copy_(loaded.score);
    }
    return absl::OkStatus();
  }
  STRATA_ASSIGN_OR_RETURN(auto loaded, LlamaModel::Load(dir, model_->head(), model_->dtype()));
  LlamaWeights from = loaded->weights();
  const LlamaWeights& to = model_->weights();
  to.embed_tokens.copy_(from.embed_tokens);
  to.norm.copy_(from.norm);
  if (to.lm_head.defined()) to.lm_head.copy_(from.lm_head);
  if (to.score.defined()) to.score.copy_(from.score);
  for (size_t l = 0; l < from.layers.size(); ++l) {
    std::vector<at::Tensor*> slots = LayerTensors(from.layers[l]);
    for (size_t i = 0; i < slots.size(); ++i) {
      STRATA_RETURN_IF_ERROR(source_->Store(static_cast<int64_t>(l), i, *slots[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace strata::policies
