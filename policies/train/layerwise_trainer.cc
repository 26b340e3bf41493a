// LayerwiseTrainer::Create and the parameter table it builds: one
// ParamState per tensor, with its optimizer state allocated on the tier
// the options name (and, sharded, dealt to its owner).
#include "policies/train/layerwise_trainer_impl.h"

#include <cstring>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "offload/tiers/placement.h"

namespace strata::policies {

using internal::HostView;

LayerwiseTrainerImpl::LayerwiseTrainerImpl(const LlamaConfig& config, LlamaHead head, LlamaWeights resident,
                                           LayerSource* source, offload::HostArena* arena,
                                           const LayerwiseTrainerOptions& options)
    : config_(config), head_(head), resident_(std::move(resident)), source_(source), arena_(arena), options_(options) {
  resident_.layers.clear();
}

LayerwiseTrainerImpl::~LayerwiseTrainerImpl() { AbandonGrads(); }

absl::Status LayerwiseTrainerImpl::AllocateState(ParamState& state, const at::Tensor& value) {
  state.numel = value.numel();
  state.shape.assign(value.sizes().begin(), value.sizes().end());
  state.dtype = value.scalar_type();
  num_parameters_ += state.numel;
  if (sharded_) {
    state.owner = dealer_->Deal(state.numel);
    state.held = state.owner == options_.data_parallel->rank();
  }
  const bool galore = options_.galore.enabled() && state.layer >= 0 && value.dim() == 2;
  if (options_.optimizer == offload::Tier::kDevice) {
    state.device_master = value.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).reshape({-1});
    state.device_grad = at::zeros_like(state.device_master);
    if (galore) return AllocateGalore(state);
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
    buffers.push_back(&state.master);
    if (!galore) buffers.insert(buffers.end(), {&state.exp_avg, &state.exp_avg_sq});
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
  if (!state.held) return absl::OkStatus();
  if (galore) STRATA_RETURN_IF_ERROR(AllocateGalore(state));
  const at::Tensor master = value.detach().to(at::kCPU, at::kFloat).contiguous().reshape({-1});
  if (options_.optimizer == offload::Tier::kNvme) {
    const std::span<const float> values(master.data_ptr<float>(), static_cast<size_t>(state.numel));
    return galore ? nvme_adam_->RegisterMaster(state.name, values) : nvme_adam_->Register(state.name, values);
  }
  HostView(state.master, state.numel).copy_(master);
  return absl::OkStatus();
}

absl::Status LayerwiseTrainerImpl::AllocateGalore(ParamState& state) {
  GaloreMatrix::Allocator allocate;
  if (options_.optimizer == offload::Tier::kDevice) {
    const at::TensorOptions on = state.device_master.options();
    allocate = [on](const std::vector<int64_t>& shape) -> absl::StatusOr<at::Tensor> { return at::zeros(shape, on); };
  } else {
    // The small state stays in the arena on an NVMe optimizer too: it is
    // read and written whole every step, and is a fraction of the master.
    allocate = [&](const std::vector<int64_t>& shape) -> absl::StatusOr<at::Tensor> {
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      const size_t bytes = static_cast<size_t>(numel) * sizeof(float);
      auto buffer = arena_->Allocate(bytes);
      if (!buffer.ok()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("GaLore state for ", state.name, ": ", buffer.status().message()));
      }
      std::memset(buffer->data(), 0, bytes);
      at::Tensor view = at::from_blob(buffer->data(), shape, at::TensorOptions().dtype(at::kFloat));
      state.galore_state.push_back(std::move(*buffer));
      return view;
    };
  }
  STRATA_ASSIGN_OR_RETURN(state.galore,
                          GaloreMatrix::Create(state.shape[0], state.shape[1], options_.galore, allocate));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LayerwiseTrainer>> LayerwiseTrainer::Create(const LlamaConfig& config, LlamaHead head,
                                                                           LlamaWeights resident, LayerSource* source,
                                                                           offload::HostArena* arena,
                                                                           const LayerwiseTrainerOptions& options,
                                                                           offload::NvmeStore* nvme) {
  if (source->num_layers() != config.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer source has ", source->num_layers(), " layers, config has ", config.num_hidden_layers));
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
    if (options.lora != nullptr) {
      return absl::InvalidArgumentError(
          "step_in_backward steps whole layers; with LoRA only the adapters train, after the backward pass");
    }
  }
  if (options.galore.enabled()) {
    STRATA_RETURN_IF_ERROR(options.galore.Validate());
    if (options.lora != nullptr) {
      return absl::InvalidArgumentError("GaLore trains every parameter; with LoRA only the adapters train");
    }
    if (!options.adam.adam.decoupled) return absl::InvalidArgumentError("GaLore needs AdamW (decoupled weight decay)");
  }
  if (options.lora != nullptr && options.lora->num_layers() != config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA adapters for ", options.lora->num_layers(),
                                                   " layers, the model has ", config.num_hidden_layers));
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
  offload::ActivationStashOptions stash;
  stash.home = options.activations;
  stash.device = r.embed_tokens.device();
  if (options.activations == offload::Tier::kNvme) {
    if (nvme == nullptr) return absl::InvalidArgumentError("activations on NVMe need an NVMe directory");
    stash.nvme_directory = nvme->directory();
  }
  STRATA_ASSIGN_OR_RETURN(trainer->activations_, offload::ActivationStash::Create(stash, arena));
  if ((!r.embed_tokens.device().is_cpu() || options.stage_gradients) && options.optimizer != offload::Tier::kDevice) {
    // Gradients leave the GPU through the download stream (pinned staging).
    STRATA_ASSIGN_OR_RETURN(trainer->grad_transfer_, offload::DeviceTransfer::Create(r.embed_tokens.device()));
  }
  std::vector<std::pair<std::string, at::Tensor*>> resident_params;
  if (options.lora == nullptr) {
    resident_params = {{"model.embed_tokens.weight", &r.embed_tokens}, {"model.norm.weight", &r.norm}};
    if (r.lm_head.defined()) resident_params.emplace_back("lm_head.weight", &r.lm_head);
  }
  // A scalar head is new to the model: it trains in full, with or without
  // adapters (PEFT's modules_to_save).
  if (r.score.defined()) resident_params.emplace_back("score.weight", &r.score);
  // Reserve first: ParamState holds pointers into resident_ only, but the
  // vector must not reallocate while layer_params_ indexes it.
  LlamaLayerWeights names_only = LlamaLayerWeights::Layout(config);
  const auto named = names_only.Named();
  const size_t per_layer = options.lora != nullptr ? 2 * options.lora->modules().size() : named.size();
  trainer->params_.reserve(resident_params.size() + static_cast<size_t>(config.num_hidden_layers) * per_layer);
  for (auto& [name, tensor] : resident_params) {
    LayerwiseTrainerImpl::ParamState state;
    state.name = name;
    state.resident = tensor;
    STRATA_RETURN_IF_ERROR(trainer->AllocateState(state, *tensor));
    trainer->params_.push_back(std::move(state));
  }
  if (options.lora != nullptr) {
    trainer->lora_params_.resize(static_cast<size_t>(config.num_hidden_layers));
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      for (auto& [name, tensor] : options.lora->NamedInLayer(l)) {
        LayerwiseTrainerImpl::ParamState state;
        state.name = name;
        state.resident = tensor;  // updated in place: generation uses these very tensors
        STRATA_RETURN_IF_ERROR(trainer->AllocateState(state, *tensor));
        trainer->lora_params_[static_cast<size_t>(l)].push_back(trainer->params_.size());
        trainer->params_.push_back(std::move(state));
      }
    }
    return trainer;
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

absl::Status LayerwiseTrainerImpl::SetLearningRate(double lr) {
  STRATA_RETURN_IF_ERROR(adam_->SetLearningRate(lr));  // the NVMe optimizer steps through it too
  options_.adam.adam.lr = lr;                          // the device optimizer reads this
  return absl::OkStatus();
}

int64_t LayerwiseTrainerImpl::optimizer_state_bytes() const {
  int64_t bytes = 0;
  for (const ParamState& p : params_) {
    if (!p.held) continue;
    bytes += p.galore != nullptr ? p.numel * static_cast<int64_t>(sizeof(float)) + p.galore->state_bytes()
                                 : 3 * p.numel * static_cast<int64_t>(sizeof(float));
  }
  return bytes;
}

}  // namespace strata::policies
