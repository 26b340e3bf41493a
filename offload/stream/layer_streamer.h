// Layer streaming: a model's layers live on a home tier (host arena or NVMe)
// and are brought to the device just before use, the next `prefetch_depth`
// layers fetched by a background thread while the current one computes
// (forward order for generation and forward, reverse for backward), and
// dropped from the device when released. Every copy to the device goes
// through DeviceTransfer: on the CPU device a memcpy from the arena (the
// overlap is between the I/O thread and compute); on a GPU an asynchronous
// copy from the pinned arena on the upload stream, which compute waits for
// by event only when it acquires the layer.
#ifndef STRATA_OFFLOAD_STREAM_LAYER_STREAMER_H_
#define STRATA_OFFLOAD_STREAM_LAYER_STREAMER_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/device/device_memory.h"
#include "offload/device/device_transfer.h"
#include "offload/host/host_arena.h"
#include "offload/nvme/nvme_store.h"
#include "offload/tiers/tier_accounting.h"

namespace strata::offload {

struct LayerStreamerOptions {
  // Where layers are brought for compute: the CPU, or cuda:N in a CUDA
  // build (then the host arena should be pinned, and an NVMe home stages
  // each layer through it).
  at::Device device = at::kCPU;
  // Where layer weights live between uses: kHost (the arena) or kNvme.
  Tier home = Tier::kHost;
  // Layers fetched ahead of the one in use; 0 fetches on demand.
  int prefetch_depth = 1;
  // NVMe slot ids are "<nvme_prefix>layers.<i>.<tensor name>".
  std::string nvme_prefix;
  // Device bytes (everything libtorch holds there, activations included)
  // that a fetch may not push usage past; 0 means no limit. A fetch waits
  // for the layers in use to be released; if none are and the layer still
  // does not fit, the fetch fails with RESOURCE_EXHAUSTED.
  size_t device_budget_bytes = 0;
  // Device bytes kept free for the compute that uses a layer (activations,
  // gradients, temporaries): a fetch needs layer bytes + this much room.
  size_t compute_reserve_bytes = 0;

  absl::Status Validate() const;
};

struct LayerStreamerStats {
  int64_t fetches = 0;
  int64_t bytes_fetched = 0;
  double fetch_seconds = 0;       // time the I/O thread spent copying / reading
  double stall_seconds = 0;       // time Acquire waited for a fetch (not hidden)
  size_t max_resident_bytes = 0;  // most layer bytes on the device at once
};

// Drive from one thread: BeginPass, then Acquire/Release each layer of the
// pass in order, then EndPass. The I/O thread and its queue live in the
// implementation (layer_streamer.cc).
class LayerStreamer {
 public:
  // `arena` holds host homes (kHost) and, on a GPU, the pinned staging
  // buffers an NVMe home is read into before upload; on the CPU device NVMe
  // reads go straight into the layer's tensors. `store` is required for
  // kNvme.
  // `accountant` (optional) records host / nvme home bytes.
  static absl::StatusOr<std::unique_ptr<LayerStreamer>> Create(const LayerStreamerOptions& options, HostArena* arena,
                                                               NvmeStore* store, TierAccountant* accountant);
  virtual ~LayerStreamer() = default;
  LayerStreamer(const LayerStreamer&) = delete;
  LayerStreamer& operator=(const LayerStreamer&) = delete;

  // Copies `tensors` (name, value; any device, contiguous or not) to the
  // home tier as a new layer and returns its index.
  virtual absl::StatusOr<int64_t> AddLayer(const std::vector<std::pair<std::string, at::Tensor>>& tensors) = 0;

  // Overwrites tensor `index` of `layer` at home (e.g. after an optimizer
  // step). Same shape and dtype as registered. Not during a pass.
  virtual absl::Status StoreTensor(int64_t layer, size_t index, const at::Tensor& value) = 0;
  // The host-home bytes of tensor `index` of `layer`, for writers that can
  // fill them in place (the optimizer's fused write-back). Empty for an
  // NVMe home. Not during a pass.
  virtual std::span<std::byte> HostHome(int64_t layer, size_t index) = 0;

  // Reads tensor `index` of `layer` from home into a new CPU tensor.
  virtual absl::StatusOr<at::Tensor> LoadTensor(int64_t layer, size_t index) const = 0;

  // Starts a pass over `order` (layer indices); prefetching begins now.
  virtual absl::Status BeginPass(std::vector<int64_t> order) = 0;
  // Waits until `layer`, the next layer of the pass, is on the device and
  // returns its tensors in AddLayer order. Errors from the fetch surface here.
  virtual absl::StatusOr<std::vector<at::Tensor>> Acquire(int64_t layer) = 0;
  // Drops the device copies of `layer` (callers must drop theirs too).
  virtual void Release(int64_t layer) = 0;
  // Ends the pass, waiting for and discarding fetches not acquired.
  virtual void EndPass() = 0;

  virtual int64_t num_layers() const = 0;
  // Bytes of one layer's tensors (what a fetch brings to the device).
  virtual size_t layer_bytes(int64_t layer) const = 0;
  virtual const std::vector<std::string>& tensor_names(int64_t layer) const = 0;
  virtual LayerStreamerStats stats() const = 0;

 protected:
  LayerStreamer() = default;
};

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_STREAM_LAYER_STREAMER_H_
