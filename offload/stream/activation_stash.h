// The activations a layer-wise training step keeps between its forward and
// its backward pass (each decoder layer's input, recomputed from in
// backward), on a tier, as SSDTrain does:
//
//  - kDevice keeps them where they were made: the stack of every layer's
//    input stays on the device until backward.
//  - kHost copies each into the host arena as forward produces it and
//    brings it back one layer ahead of backward: the device holds a window
//    of about three (the one being made or used, one in transit each way).
//  - kNvme stages each through one of two arena buffers into an unnamed
//    scratch file (offload/nvme/scratch_file.h) and reads it back one layer
//    ahead; the last two stay staged until backward takes them. Host memory
//    for activations is the two buffers, and a killed process leaves no
//    file behind.
//
// Copies between device and host go through DeviceTransfer and I/O through
// the scratch file's engine, so both overlap the compute of the layer in
// use. Tensors are put in increasing index order and taken in decreasing
// order, once each.
#ifndef STRATA_OFFLOAD_STREAM_ACTIVATION_STASH_H_
#define STRATA_OFFLOAD_STREAM_ACTIVATION_STASH_H_

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/device/device_transfer.h"
#include "offload/host/host_arena.h"
#include "offload/nvme/scratch_file.h"
#include "offload/tiers/tier_accounting.h"

namespace strata::offload {

struct ActivationStashOptions {
  Tier home = Tier::kDevice;
  // Where the activations are made and used.
  at::Device device = at::kCPU;
  // kNvme: the directory of the scratch file (the NVMe tier's).
  std::string nvme_directory;
  IoEngineKind engine = IoEngineKind::kAuto;
};

struct ActivationStashStats {
  int64_t bytes_written = 0;  // to NVMe
  int64_t bytes_read = 0;     // from NVMe
  // Takes served from a staging buffer that still held the bytes (the last
  // layers of a forward pass): no read needed.
  int64_t reads_saved = 0;
  // Time the caller waited for I/O the compute did not hide.
  double wait_seconds = 0;
};

class ActivationStash {
 public:
  // `arena` holds host copies (kHost) or the two staging buffers (kNvme);
  // unused for kDevice. Must outlive the stash.
  static absl::StatusOr<std::unique_ptr<ActivationStash>> Create(const ActivationStashOptions& options,
                                                                 HostArena* arena);
  ~ActivationStash();
  ActivationStash(const ActivationStash&) = delete;
  ActivationStash& operator=(const ActivationStash&) = delete;

  // Starts a step that keeps `count` tensors of `bytes` each. Host buffers
  // and the scratch file grow when a step needs more room than any before
  // (the scratch file fails with RESOURCE_EXHAUSTED naming the directory on
  // a full disk) and are kept for the next steps.
  absl::Status Begin(int64_t count, int64_t bytes);
  // Keeps tensor `i` (contiguous, `bytes` long); i = 0, 1, ... in order.
  absl::Status Put(int64_t i, const at::Tensor& tensor);
  // Gives back tensor `i` on the device, shaped and typed as it was put;
  // i = count-1, count-2, ... in order. Starts bringing back i-1.
  absl::StatusOr<at::Tensor> Take(int64_t i);
  // Ends the step, also after an error: waits for transfers in flight and
  // drops every tensor and host copy. Begin may follow.
  void End();

  Tier home() const { return options_.home; }
  const ActivationStashStats& stats() const { return stats_; }

 private:
  // One of kNvme's two staging buffers.
  struct Staging {
    HostBuffer buffer;
    int64_t holds = -1;  // the index whose bytes it holds (or is reading)
    std::optional<ScratchFile::Ticket> write, read;
    std::shared_ptr<TransferFence> upload;  // the last upload from it
  };
  // A device-to-host copy queued but not known finished (kHost, kNvme).
  struct Download {
    int64_t index = -1;
    at::Tensor source;  // kept alive until the copy is done
    std::shared_ptr<TransferFence> fence;
  };
  // A host-to-device copy started one layer ahead (kHost).
  struct Upload {
    int64_t index = -1;
    at::Tensor tensor;
    std::shared_ptr<TransferFence> fence;
  };

  ActivationStash(const ActivationStashOptions& options, HostArena* arena) : options_(options), arena_(arena) {}
  // Waits for the last download; for kNvme then starts its write.
  absl::Status FinishDownload();
  // Bytes between tensors in host copies and scratch slots (O_DIRECT's unit).
  int64_t Stride() const;
  std::span<std::byte> HostCopy(int64_t i) const;
  // Makes `buffer` at least `bytes` long; it only ever grows.
  absl::Status Grow(HostBuffer& buffer, size_t bytes);
  absl::Status WaitTicket(std::optional<ScratchFile::Ticket>& ticket);
  // kNvme: makes staging buffer `s` free to take new bytes.
  absl::Status Reclaim(Staging& s);
  // kNvme: starts reading index `i` into a staging buffer unless one holds
  // it, leaving alone the one that holds `in_use`.
  absl::Status Prefetch(int64_t i, int64_t in_use);
  // A device copy of `bytes` that compute waits for; the copy's fence goes
  // to `fence_out` when given (the bytes may change only once it passed).
  absl::StatusOr<at::Tensor> UploadNow(std::span<const std::byte> bytes, std::shared_ptr<TransferFence>* fence_out);

  const ActivationStashOptions options_;
  HostArena* const arena_;
  std::unique_ptr<DeviceTransfer> transfer_;
  std::unique_ptr<ScratchFile> scratch_;
  ActivationStashStats stats_;
  // The current step.
  int64_t count_ = 0, bytes_ = 0, next_put_ = 0, next_take_ = -1;
  std::vector<int64_t> shape_;
  at::ScalarType dtype_ = at::kFloat;
  std::vector<at::Tensor> on_device_;  // kDevice
  HostBuffer host_copies_;             // kHost: every tensor, Stride() apart
  std::array<Staging, 2> staging_;     // kNvme
  std::optional<Download> download_;   // kHost, kNvme
  std::optional<Upload> upload_;       // kHost
};

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_STREAM_ACTIVATION_STASH_H_
