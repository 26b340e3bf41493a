// Page-locking host memory for a CUDA device (cudaHostRegister), so that
// copies from the host arena run as DMA at full PCIe/NVLink bandwidth and
// can overlap compute. Torch-free: the host arena uses it.
//
// In a build without CUDA (CI's CPU build) CudaBuilt() is false and
// RegisterWithCuda fails with FAILED_PRECONDITION: asking for pinned memory
// on a machine that cannot provide it is a configuration error, not
// something to ignore.
#ifndef STRATA_OFFLOAD_HOST_CUDA_HOST_H_
#define STRATA_OFFLOAD_HOST_CUDA_HOST_H_

#include <cstddef>

#include "absl/status/status.h"

namespace strata::offload {

// True when strata was built with CUDA (STRATA_WITH_CUDA).
bool CudaBuilt();

// Registers [base, base + bytes) as pinned memory with the CUDA driver.
// INVALID_ARGUMENT / RESOURCE_EXHAUSTED / UNAVAILABLE with the driver's own
// message when it refuses (no device, out of pinnable memory, ...).
absl::Status RegisterWithCuda(void* base, size_t bytes);
// Undoes RegisterWithCuda; logs (does not fail) if the driver objects.
void UnregisterWithCuda(void* base);

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_HOST_CUDA_HOST_H_
