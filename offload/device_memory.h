// Measures what libtorch allocates on the compute device, so that memory
// figures include activations and temporaries, not just the engine's own
// buffers. On the CPU build the device is the CPU: a counting wrapper is
// installed around libtorch's CPU allocator. (Torch's allocator registry is
// process-wide, so the monitor is too: Install() is idempotent.)
#ifndef STRATA_OFFLOAD_DEVICE_MEMORY_H_
#define STRATA_OFFLOAD_DEVICE_MEMORY_H_

#include <cstddef>

namespace strata::offload {

class DeviceMemoryMonitor {
 public:
  // Installs the counting allocator on first use and returns the monitor.
  // Allocations made before the first call are not counted.
  static DeviceMemoryMonitor& Install();

  // Bytes libtorch currently holds on the device / the most since ResetPeak.
  size_t current_bytes() const;
  size_t peak_bytes() const;
  // Starts a new peak window at the current usage.
  void ResetPeak();

 private:
  DeviceMemoryMonitor() = default;
};

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_DEVICE_MEMORY_H_
