// The one path bytes take between the host tier and the device tier.
//
// On the CPU device (CI's build, and every machine without a GPU) a copy is
// a memcpy on the calling thread and fences are already complete. On a CUDA
// device uploads run on a dedicated host-to-device stream and downloads on
// a device-to-host stream; events order them against the compute stream, so
// copies for one layer overlap the kernels of another, as ZeRO-Infinity and
// Fuyou do. Host memory should be the pinned arena (HostArenaOptions::
// pin_for_cuda): from pageable memory the driver stages copies synchronously.
#ifndef STRATA_OFFLOAD_DEVICE_DEVICE_TRANSFER_H_
#define STRATA_OFFLOAD_DEVICE_DEVICE_TRANSFER_H_

#include <ATen/ATen.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::offload {

// A point in a DeviceTransfer's copy streams: every copy queued before it.
class TransferFence {
 public:
  virtual ~TransferFence() = default;
};

class DeviceTransfer {
 public:
  // For `device`; fails as CheckComputeDevice does.
  static absl::StatusOr<std::unique_ptr<DeviceTransfer>> Create(const at::Device& device);

  virtual ~DeviceTransfer() = default;
  virtual at::Device device() const = 0;

  // Allocates a device tensor and queues the copy of `host` (exactly the
  // tensor's bytes) into it. `host` must stay unchanged until a fence taken
  // after this call has passed WaitHost. The tensor may be used by compute
  // only after ComputeWaits on such a fence.
  virtual absl::StatusOr<at::Tensor> Upload(std::span<const std::byte> host, at::IntArrayRef shape,
                                            at::ScalarType dtype) = 0;
  // Queues the copy of contiguous `device_tensor` into `host` (exactly its
  // bytes), after the compute already queued on the calling thread's
  // stream. `host` holds the result once a later fence passes WaitHost.
  virtual absl::Status Download(const at::Tensor& device_tensor, std::span<std::byte> host) = 0;

  // A point after every upload and download queued so far. Fails only when
  // the device does (a CUDA error that poisons the context).
  virtual absl::StatusOr<std::shared_ptr<TransferFence>> Fence() = 0;
  // Blocks the calling thread until the copies before `fence` are done.
  virtual absl::Status WaitHost(const TransferFence& fence) = 0;
  // Makes compute queued later on the calling thread's stream wait for the
  // copies before `fence`, and keeps `tensors` (uploaded before it) from
  // being reused by the allocator until that compute is done. Does not
  // block the host.
  virtual absl::Status ComputeWaits(const TransferFence& fence, std::span<const at::Tensor> tensors) = 0;

  // Fence + WaitHost: every copy queued so far is done when this returns OK.
  absl::Status WaitAll();
};

// OK for the CPU, or cuda:N in a CUDA build with that GPU visible;
// FAILED_PRECONDITION (CUDA in a CPU build, no GPU) or INVALID_ARGUMENT
// (another device type, an index out of range) naming the device.
absl::Status CheckComputeDevice(const at::Device& device);
// The GPU index of a CUDA device ("cuda" means cuda:0).
int CudaIndex(const at::Device& device);

// Blocks until all work queued on `device` is done (timing, teardown); a
// no-op for the CPU. Errors as CheckComputeDevice.
absl::Status SynchronizeDevice(const at::Device& device);

// "cpu", "cuda" (device 0) or "cuda:N"; INVALID_ARGUMENT naming `text`
// otherwise. Whether the device exists is DeviceTransfer::Create's check.
absl::StatusOr<at::Device> ParseComputeDevice(const std::string& text);
// The device ParseDeviceName's index names: the CPU for -1, else cuda:N.
at::Device ComputeDevice(int index);

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_DEVICE_DEVICE_TRANSFER_H_
