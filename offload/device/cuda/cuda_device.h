// CUDA implementations behind DeviceTransfer and DeviceMemoryMonitor.
// Compiled only in a CUDA build (STRATA_WITH_CUDA); include only under it.
#ifndef STRATA_OFFLOAD_DEVICE_CUDA_CUDA_DEVICE_H_
#define STRATA_OFFLOAD_DEVICE_CUDA_CUDA_DEVICE_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "offload/device/device_transfer.h"

namespace strata::offload::cuda {

// GPUs the CUDA runtime can see (0 when none or no driver).
int VisibleDevices();

// Transfers for GPU `index` on their own pool streams.
absl::StatusOr<std::unique_ptr<DeviceTransfer>> MakeTransfer(int index);

// cudaDeviceSynchronize on GPU `index`.
absl::Status Synchronize(int index);

// Makes the caching allocator ready to report on GPU `index` (its
// statistics are refused before its first allocation there).
absl::Status InitAllocator(int index);

// The CUDA caching allocator's figures for GPU `index`: bytes handed to
// tensors now and at most since the last ResetPeak; 0 if it cannot say.
size_t AllocatedBytes(int index);
size_t PeakAllocatedBytes(int index);
void ResetPeak(int index);

}  // namespace strata::offload::cuda

#endif  // STRATA_OFFLOAD_DEVICE_CUDA_CUDA_DEVICE_H_
