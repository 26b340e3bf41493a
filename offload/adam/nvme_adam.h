// Optimizer states on the NVMe tier (ZeRO-Infinity style): each tensor's fp32
// master weights and both Adam moments live on NVMe in tiles of
// `tile_elements`, and a step streams them through a few host staging
// buffers: tile k+1 is read while CPU Adam updates tile k, and tile k is
// written back while tile k+1 updates. Host memory used is a handful of
// tiles, however large the model.
#ifndef STRATA_OFFLOAD_ADAM_NVME_ADAM_H_
#define STRATA_OFFLOAD_ADAM_NVME_ADAM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/adam/cpu_adam.h"
#include "offload/host/host_arena.h"
#include "offload/nvme/nvme_store.h"

namespace strata::offload {

struct NvmeAdamOptions {
  // Elements per tile; a tile moves 12 bytes per element (master, two moments).
  int64_t tile_elements = 1 << 20;
  // Staging buffers cycled by the pipeline (read ahead, update, write back); >= 2.
  int staging_buffers = 3;
  // Prefix of the NVMe ids: "<id_prefix><tensor name>.adam.<tile>".
  std::string id_prefix;

  absl::Status Validate() const;
};

// One tensor's update: its gradient (or, for a master-only tensor, its
// direction) and where the new weights go.
struct NvmeAdamUpdate {
  std::string name;
  std::span<const float> grad;   // whole tensor, fp32
  int64_t step = 0;              // this update's step number (1 for the first)
  std::span<float> out_fp32;     // optional: updated weights, fp32
  std::span<uint16_t> out_bf16;  // optional: updated weights, bf16
  // A master-only tensor's update direction, instead of grad (the master
  // becomes what CpuAdam::ApplyDirection makes of it).
  std::span<const float> direction;
};

// Drive from one thread at a time. `store`, `arena` and `adam` must outlive it.
class NvmeAdamState {
 public:
  static absl::StatusOr<std::unique_ptr<NvmeAdamState>> Create(const NvmeAdamOptions& options, NvmeStore* store,
                                                               HostArena* arena, CpuAdam* adam);

  // Writes `master` (the initial fp32 weights) with zero moments.
  absl::Status Register(const std::string& name, std::span<const float> master);
  // A tensor whose moments live elsewhere (GaLore's, small, in host
  // memory): only its master goes to NVMe, 4 bytes per element, and its
  // updates come with a direction instead of a gradient.
  absl::Status RegisterMaster(const std::string& name, std::span<const float> master);

  // Updates every tensor in `updates`, pipelining all their tiles.
  absl::Status Step(std::span<const NvmeAdamUpdate> updates);

  // Reads a tensor's current fp32 master weights (for checkpoints and tests).
  absl::StatusOr<std::vector<float>> Master(const std::string& name);
  // A master-only tensor's state (checkpoints).
  absl::Status ReadMaster(const std::string& name, std::span<float> master);
  absl::Status WriteMaster(const std::string& name, std::span<const float> master);

  // Whole-state access for checkpoints: each span has the tensor's length.
  absl::Status ReadState(const std::string& name, std::span<float> master, std::span<float> exp_avg,
                         std::span<float> exp_avg_sq);
  absl::Status WriteState(const std::string& name, std::span<const float> master, std::span<const float> exp_avg,
                          std::span<const float> exp_avg_sq);

  int64_t num_elements(const std::string& name) const;
  bool master_only(const std::string& name) const { return master_only_.contains(name); }
  // Host bytes of the staging buffers.
  size_t staging_bytes() const;

 private:
  struct Tile {
    std::string id;
    int64_t offset = 0;  // first element of the tensor in this tile
    int64_t count = 0;
  };
  NvmeAdamState(const NvmeAdamOptions& options, NvmeStore* store, CpuAdam* adam)
      : options_(options), store_(store), adam_(adam) {}
  std::vector<Tile> TilesOf(const std::string& name, int64_t elements) const;

  const NvmeAdamOptions options_;
  NvmeStore* const store_;
  CpuAdam* const adam_;
  std::vector<HostBuffer> staging_;
  std::map<std::string, int64_t> elements_;
  std::set<std::string> master_only_;
};

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_ADAM_NVME_ADAM_H_
