#include "services/rank/rank_memory.h"

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "offload/nvme/scratch_file.h"
#include "policies/job/seeds.h"
#include "rewards/reward_model.h"

namespace strata::services {
namespace {

using policies::LlamaHead;
using policies::LlamaModel;

absl::StatusOr<std::unique_ptr<LlamaModel>> LoadOrInit(const policies::ModelSpec& spec, LlamaHead head,
                                                       const std::string& key, uint64_t seed) {
  STRATA_ASSIGN_OR_RETURN(auto dtype, policies::ParseModelDType(spec.dtype));
  auto prefix = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("models.", key, ": ", s.message()));
  };
  if (spec.path.empty()) {
    auto text = ReadFileToString(spec.init);
    if (!text.ok()) return prefix(text.status());
    auto config = policies::LlamaConfig::FromJson(*text, spec.init);
    if (!config.ok()) return prefix(config.status());
    return LlamaModel::RandomInit(*config, head, dtype, seed);
  }
  if (!IsDirectory(spec.path)) {
    return absl::NotFoundError(absl::StrCat("models.", key, ".path: ", spec.path, " is not a directory"));
  }
  auto model = LlamaModel::Load(spec.path, head, dtype);
  if (model.ok() || head != LlamaHead::kScalar || model.status().code() != absl::StatusCode::kNotFound) {
    if (!model.ok()) return prefix(model.status());
    return model;
  }
  // A causal LM (e.g. the SFT output) becomes a reward model or critic with a
  // fresh scalar head, as HF does when loading it for sequence classification.
  auto lm = LlamaModel::Load(spec.path, LlamaHead::kLanguageModel, dtype);
  if (!lm.ok()) return prefix(lm.status());
  return rewards::WithFreshScalarHead(**lm, seed);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RankMemory>> RankMemory::Create(const policies::JobSpec& spec,
                                                               policies::ProcessGroup& gang) {
  const at::Device device = offload::ComputeDevice(spec.memory.device_index);
  // Refuses a device this build or machine cannot use.
  auto monitor = offload::DeviceMemoryMonitor::ForDevice(device);
  if (!monitor.ok()) {
    return absl::Status(monitor.status().code(), absl::StrCat("memory.device: ", monitor.status().message()));
  }
  std::unique_ptr<RankMemory> memory(new RankMemory(spec, gang));
  memory->device_ = device;
  memory->monitor_ = *monitor;
  offload::HostArenaOptions arena_options;
  arena_options.capacity_bytes = static_cast<size_t>(spec.memory.host_mib) << 20;
  // Unpinned, the arena is a budget touched as used; pinned, all of it is
  // committed and locked now, so a machine without the memory fails here.
  arena_options.lock_memory = spec.memory.pin_host;
  arena_options.populate = spec.memory.pin_host;
  arena_options.pin_for_cuda = !device.is_cpu();  // DMA and asynchronous copies
  auto arena = offload::HostArena::Create(arena_options);
  if (!arena.ok()) {
    // Name the setting that asked for what failed: locking, CUDA pinning, or the size.
    std::string key = "memory.host_mib";
    if (arena.status().message().find("cudaHostRegister") != std::string::npos ||
        arena.status().message().find("without CUDA") != std::string::npos) {
      key = "memory.device (pinning memory.host_mib)";
    } else if (spec.memory.pin_host) {
      key = "memory.pin_host (with memory.host_mib)";
    }
    return absl::Status(arena.status().code(), absl::StrCat(key, ": ", arena.status().message()));
  }
  memory->arena_ = std::move(*arena);
  if (spec.UsesNvme() && spec.memory.nvme_dir.empty()) {
    return absl::InvalidArgumentError(
        "spec key 'memory.nvme_dir' is required when a placement uses nvme (this worker has no --nvme-dir)");
  }
  if (!spec.memory.nvme_dir.empty()) {
    // A directory of its own: ranks of a gang on one machine, and jobs
    // sharing a worker's --nvme-dir, never share a store.
    SweepAbandonedNvmeDirs(spec.memory.nvme_dir);
    auto dir = OwnedDirectory::Create(spec.memory.nvme_dir, absl::StrCat(kNvmeRankDirPrefix, gang.rank()));
    if (!dir.ok()) return absl::Status(dir.status().code(), absl::StrCat("memory.nvme_dir: ", dir.status().message()));
    memory->nvme_job_dir_ = std::move(*dir);
    const std::string pattern = memory->nvme_job_dir_->path();
    offload::NvmeStoreOptions nvme_options;
    nvme_options.directory = pattern;
    auto store = offload::NvmeStore::Open(nvme_options);
    if (!store.ok()) {
      return absl::Status(store.status().code(), absl::StrCat("memory.nvme_dir: ", store.status().message()));
    }
    // Streamers' I/O threads and optimizers stepping inside a backward pass
    // may drive it at once.
    memory->nvme_ = offload::SynchronizedNvmeStore(std::move(*store));
    if (spec.memory.pin_host) {
      const std::span<std::byte> region = memory->arena_->region();
      if (auto s = memory->nvme_->RegisterBuffers({&region, 1}); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("memory.pin_host: ", s.message()));
      }
    }
  }
  return memory;
}

RankMemory::~RankMemory() {
  nvme_.reset();  // closes the store's files before its directory goes
  nvme_job_dir_.reset();
}

void SweepAbandonedNvmeDirs(const std::string& nvme_dir) {
  if (nvme_dir.empty()) return;
  // A rank's prefix is kNvmeRankDirPrefix + R; the sweep takes every rank's.
  const SweepResult swept = SweepAbandonedDirectories(nvme_dir, kNvmeRankDirPrefix);
  for (const std::string& dir : swept.failed) {
    STRATA_LOG(Warning) << "NVMe directory " << dir << " belongs to no live rank, but not all of it could be removed";
  }
  if (!swept.removed.empty()) {
    STRATA_LOG(Info) << "removed " << swept.removed.size() << " NVMe director"
                     << (swept.removed.size() == 1 ? "y" : "ies") << " of ranks that are gone from " << nvme_dir << " ("
                     << (swept.bytes >> 20) << " MiB)";
  }
}

absl::StatusOr<std::unique_ptr<policies::PlacedModel>> RankMemory::Place(const std::string& key,
                                                                         const policies::ModelSpec& model,
                                                                         LlamaHead head, bool trainable, double lr) {
  STRATA_ASSIGN_OR_RETURN(auto loaded, LoadOrInit(model, head, key, policies::ModelInitSeed(spec_.train.seed)));
  policies::PlacedModelOptions options;
  options.name = key;
  options.placement = model.placement;
  options.trainable = trainable;
  options.trainer.adam.adam.lr = lr;
  options.trainer.adam.adam.weight_decay = spec_.train.weight_decay;
  options.trainer.max_grad_norm = spec_.train.max_grad_norm;
  options.trainer.data_parallel = &gang_;
  if (trainable) {
    options.lora = model.lora;
    options.lora_seed = policies::AdapterSeed(spec_.train.seed);
    options.base_model = model.path;
    options.start_adapter = model.adapter;
    options.trainer.galore = model.galore;
    options.trainer.galore_seed = policies::GaloreSeed(spec_.train.seed);
  }
  options.batch = spec_.train.batch_size;
  options.seq = spec_.data.max_prompt_tokens +
                std::max(spec_.data.max_response_tokens, spec_.generation.max_new_tokens);
  policies::OffloadContext context;
  context.arena = arena_.get();
  context.nvme = nvme_.get();
  context.device_budget_bytes = static_cast<size_t>(spec_.memory.device_mib) << 20;
  context.device = device_;
  placed_.push_back(key);
  return policies::PlacedModel::Create(std::move(loaded), options, context);
}

std::map<std::string, int64_t> RankMemory::InUse() const {
  return {{"device", static_cast<int64_t>(monitor_->current_bytes())},
          {"host", static_cast<int64_t>(arena_->stats().requested_bytes)},
          {"nvme", NvmeBytes()}};
}

std::map<std::string, int64_t> RankMemory::PeakBytes() const {
  return {{"device", static_cast<int64_t>(monitor_->peak_bytes())},
          {"host", static_cast<int64_t>(arena_->stats().peak_requested_bytes)},
          {"nvme", NvmeBytes()}};
}

int64_t RankMemory::NvmeBytes() const {
  // The store's files and the scratch files of activations kept on NVMe,
  // which share its directory.
  return (nvme_ ? nvme_->allocated_bytes() : 0) + offload::ScratchFile::OpenBytes();
}

}  // namespace strata::services
