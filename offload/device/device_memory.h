// Measures what libtorch allocates on the compute device, so that memory
// figures include activations and temporaries, not just the engine's own
// buffers. For the CPU device a counting wrapper is installed around
// libtorch's CPU allocator (torch's allocator registry is process-wide, so
// the monitor is too: Install() is idempotent). For a CUDA device the
// figures are the CUDA caching allocator's own statistics (bytes handed to
// tensors, not the cache it reserves).
#ifndef STRATA_OFFLOAD_DEVICE_DEVICE_MEMORY_H_
#define STRATA_OFFLOAD_DEVICE_DEVICE_MEMORY_H_

#include <c10/core/Device.h>

#include <cstddef>

#include "absl/status/statusor.h"

namespace strata::offload {

class DeviceMemoryMonitor {
 public:
  // Installs the counting allocator on first use and returns the monitor.
  // Allocations made before the first call are not counted.
  static DeviceMemoryMonitor& Install();
  // The monitor for `device`: Install() for the CPU, the caching
  // allocator's statistics for cuda:N (one monitor per GPU). Fails as
  // DeviceTransfer::Create does for a device this build cannot use.
  static absl::StatusOr<DeviceMemoryMonitor*> ForDevice(const c10::Device& device);

  // Bytes libtorch currently holds on the device / the most since ResetPeak.
  size_t current_bytes() const;
  size_t peak_bytes() const;
  // Starts a new peak window at the current usage.
  void ResetPeak();

 private:
  explicit DeviceMemoryMonitor(int cuda_index) : cuda_index_(cuda_index) {}

  const int cuda_index_;  // -1: the CPU device
};

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_DEVICE_DEVICE_MEMORY_H_
