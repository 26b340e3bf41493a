#include "offload/host/cuda_host.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "base/log.h"

#if STRATA_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace strata::offload {

#if STRATA_WITH_CUDA

bool CudaBuilt() { return true; }

absl::Status RegisterWithCuda(void* base, size_t bytes) {
  // Portable: pinned for every device's context, not only the current one.
  const cudaError_t error = ::cudaHostRegister(base, bytes, cudaHostRegisterPortable);
  if (error == cudaSuccess) return absl::OkStatus();
  ::cudaGetLastError();  // so a later cudaGetLastError does not report this failure again
  const std::string message = absl::StrCat("host arena: cudaHostRegister of ", bytes,
                                           " bytes failed: ", std::string(::cudaGetErrorName(error)), ": ",
                                           std::string(::cudaGetErrorString(error)));
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::UnavailableError(message);
    default:
      return absl::InvalidArgumentError(message);
  }
}

void UnregisterWithCuda(void* base) {
  if (const cudaError_t error = ::cudaHostUnregister(base); error != cudaSuccess) {
    ::cudaGetLastError();
    STRATA_LOG(Warning) << "host arena: cudaHostUnregister failed: " << ::cudaGetErrorString(error);
  }
}

#else  // !STRATA_WITH_CUDA

bool CudaBuilt() { return false; }

absl::Status RegisterWithCuda(void*, size_t bytes) {
  return absl::FailedPreconditionError(
      absl::StrCat("host arena: cannot pin ", bytes,
                   " bytes for a GPU: this strata was built without CUDA (configure against a CUDA libtorch)"));
}

void UnregisterWithCuda(void*) {}

#endif

}  // namespace strata::offload
