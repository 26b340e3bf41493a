// The memory a rank places its models in (memory.device, a host arena of
// memory.host_mib, an NVMe store under memory.nvme_dir), how it places
// them, and what each tier holds: one of these per rank, shared by its
// roles.
#ifndef STRATA_SERVICES_RANK_RANK_MEMORY_H_
#define STRATA_SERVICES_RANK_RANK_MEMORY_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/owned_directory.h"
#include "offload/device/device_memory.h"
#include "offload/host/host_arena.h"
#include "offload/nvme/nvme_store.h"
#include "policies/dist/process_group.h"
#include "policies/job/job_spec.h"
#include "policies/train/placed_model.h"

namespace strata::services {

// The prefix of a rank's NVMe directory under memory.nvme_dir (or a
// worker's --nvme-dir): "strata-rank<R>-XXXXXX".
inline constexpr const char* kNvmeRankDirPrefix = "strata-rank";

// Removes the NVMe directories under `nvme_dir` of ranks that are gone (a
// worker or `strata train` killed with -9 leaves its rank's behind) and
// logs what it freed. Ranks alive in any process keep theirs.
void SweepAbandonedNvmeDirs(const std::string& nvme_dir);

class RankMemory {
 public:
  // Opens the device (counting its allocations from now on, so the models'
  // own weights are part of the figures), the host arena and, with
  // memory.nvme_dir, a store in a directory of this rank's own. Errors name
  // the spec key. `spec` and `gang` must outlive the memory.
  static absl::StatusOr<std::unique_ptr<RankMemory>> Create(const policies::JobSpec& spec,
                                                            policies::ProcessGroup& gang);
  // Removes the store's directory: NVMe slots are scratch (checkpoints hold
  // the states), and a full disk must not outlive the job that filled it.
  // The models placed here must be gone first.
  ~RankMemory();

  // Loads models.<key> (or initialises it from its config) and places it
  // under its placement; a trainable one gets an optimizer at `lr` that
  // sums its gradients over the gang. Errors name the model.
  absl::StatusOr<std::unique_ptr<policies::PlacedModel>> Place(const std::string& key, const policies::ModelSpec& model,
                                                               policies::LlamaHead head, bool trainable, double lr);

  // The models placed so far, by key, in order: a model the job shares
  // (a LoRA actor's frozen base serving as the reference) is not among them.
  const std::vector<std::string>& placed() const { return placed_; }

  // Where the models compute (memory.device).
  const at::Device& device() const { return device_; }
  offload::DeviceMemoryMonitor& monitor() const { return *monitor_; }
  // Bytes held now per tier ("device", "host", "nvme").
  std::map<std::string, int64_t> InUse() const;
  // The most bytes held per tier since the device's peak was last reset
  // (the NVMe tier's: what it holds now).
  std::map<std::string, int64_t> PeakBytes() const;

 private:
  // The NVMe store's files and this process's activation scratch files.
  int64_t NvmeBytes() const;

  RankMemory(const policies::JobSpec& spec, policies::ProcessGroup& gang) : spec_(spec), gang_(gang) {}

  const policies::JobSpec& spec_;
  policies::ProcessGroup& gang_;
  at::Device device_ = at::kCPU;
  offload::DeviceMemoryMonitor* monitor_ = nullptr;  // of device_
  std::unique_ptr<offload::HostArena> arena_;
  std::unique_ptr<offload::NvmeStore> nvme_;
  std::vector<std::string> placed_;
  // The store's own directory under memory.nvme_dir, locked while this
  // rank lives: a later rank sweeps it if this one dies without removing it.
  std::unique_ptr<OwnedDirectory> nvme_job_dir_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_RANK_MEMORY_H_
