// Built only with STRATA_WITH_CUDA. Uses the c10 CUDA API common to
// libtorch 1.13 and 2.x (pool streams, CUDAEvent, the caching allocator's
// recordStream and statistics).
#include "offload/device/cuda/cuda_device.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <exception>
#include <string>

#include "absl/strings/str_cat.h"

namespace strata::offload::cuda {
namespace {

absl::Status CudaError(const std::string& what, cudaError_t error) {
  ::cudaGetLastError();  // so a later check does not report this failure again
  return absl::InternalError(absl::StrCat("device transfer: ", what, ": ", std::string(::cudaGetErrorName(error)), ": ",
                                          std::string(::cudaGetErrorString(error))));
}

absl::Status TorchError(const std::string& what, const std::exception& e) {
  return absl::InternalError(absl::StrCat("device transfer: ", what, ": ", std::string(e.what())));
}

// One event on each copy stream. Waiting on an event changes no state a
// caller can observe, hence mutable (CUDAEvent::block is non-const).
class CudaFence final : public TransferFence {
 public:
  mutable at::cuda::CUDAEvent upload;
  mutable at::cuda::CUDAEvent download;
};

class CudaTransfer final : public DeviceTransfer {
 public:
  explicit CudaTransfer(c10::DeviceIndex index)
      : index_(index),
        upload_stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index)),
        download_stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index)) {}

  at::Device device() const override { return at::Device(at::kCUDA, index_); }

  absl::StatusOr<at::Tensor> Upload(std::span<const std::byte> host, at::IntArrayRef shape,
                                    at::ScalarType dtype) override {
    try {
      c10::cuda::CUDAGuard device_guard(index_);
      // Allocated while the upload stream is current, so the caching
      // allocator ties the block to it and a block freed there is only
      // reused after the copies queued before the free.
      c10::cuda::CUDAStreamGuard stream_guard(upload_stream_);
      at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype).device(device()));
      const size_t bytes = static_cast<size_t>(out.numel()) * out.element_size();
      if (host.size() != bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("device transfer: upload of ", bytes, " tensor bytes given ", host.size(), " host bytes"));
      }
      if (const cudaError_t e = ::cudaMemcpyAsync(out.data_ptr(), host.data(), bytes, cudaMemcpyHostToDevice,
                                                  upload_stream_.stream());
          e != cudaSuccess) {
        return CudaError(absl::StrCat("host-to-device copy of ", bytes, " bytes"), e);
      }
      return out;
    } catch (const std::exception& e) {
      return TorchError("upload", e);
    }
  }

  absl::Status Download(const at::Tensor& device_tensor, std::span<std::byte> host) override {
    if (!device_tensor.is_cuda() || device_tensor.get_device() != index_ || !device_tensor.is_contiguous()) {
      return absl::InvalidArgumentError(
          absl::StrCat("device transfer: download needs a contiguous tensor on ", device().str()));
    }
    const size_t bytes = static_cast<size_t>(device_tensor.numel()) * device_tensor.element_size();
    if (host.size() != bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("device transfer: download of ", bytes, " tensor bytes given ", host.size(), " host bytes"));
    }
    try {
      c10::cuda::CUDAGuard device_guard(index_);
      // The copy must see what compute queued so far has written.
      at::cuda::CUDAEvent produced;
      produced.record(c10::cuda::getCurrentCUDAStream(index_));
      produced.block(download_stream_);
      if (const cudaError_t e = ::cudaMemcpyAsync(host.data(), device_tensor.data_ptr(), bytes, cudaMemcpyDeviceToHost,
                                                  download_stream_.stream());
          e != cudaSuccess) {
        return CudaError(absl::StrCat("device-to-host copy of ", bytes, " bytes"), e);
      }
    } catch (const std::exception& e) {
      return TorchError("download", e);
    }
    try {
      // The caller may drop the tensor now; its block must outlive the copy.
      c10::cuda::CUDACachingAllocator::recordStream(device_tensor.storage().data_ptr(), download_stream_);
      return absl::OkStatus();
    } catch (const std::exception& e) {
      // The copy is queued but its source is unprotected: let it finish
      // before the caller frees either side.
      ::cudaStreamSynchronize(download_stream_.stream());
      return TorchError("protecting a download's source", e);
    }
  }

  absl::StatusOr<std::shared_ptr<TransferFence>> Fence() override {
    try {
      auto fence = std::make_shared<CudaFence>();
      c10::cuda::CUDAGuard device_guard(index_);
      fence->upload.record(upload_stream_);
      fence->download.record(download_stream_);
      return std::shared_ptr<TransferFence>(std::move(fence));
    } catch (const std::exception& e) {
      return TorchError("recording a fence", e);
    }
  }

  absl::Status WaitHost(const TransferFence& fence) override {
    const auto& f = static_cast<const CudaFence&>(fence);
    try {
      f.upload.synchronize();
      f.download.synchronize();
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return TorchError("waiting for copies", e);
    }
  }

  absl::Status ComputeWaits(const TransferFence& fence, std::span<const at::Tensor> tensors) override {
    const auto& f = static_cast<const CudaFence&>(fence);
    try {
      c10::cuda::CUDAGuard device_guard(index_);
      const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(index_);
      f.upload.block(compute);
      f.download.block(compute);
      // Uploaded blocks belong to the upload stream; without this a block
      // freed after use could be handed out again while compute still reads it.
      for (const at::Tensor& t : tensors) {
        c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), compute);
      }
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return TorchError("ordering compute after copies", e);
    }
  }

 private:
  const c10::DeviceIndex index_;
  const c10::cuda::CUDAStream upload_stream_;
  const c10::cuda::CUDAStream download_stream_;
};

}  // namespace

int VisibleDevices() { return static_cast<int>(c10::cuda::device_count()); }

absl::StatusOr<std::unique_ptr<DeviceTransfer>> MakeTransfer(int index) {
  try {
    return std::unique_ptr<DeviceTransfer>(new CudaTransfer(static_cast<c10::DeviceIndex>(index)));
  } catch (const std::exception& e) {
    return TorchError(absl::StrCat("creating copy streams on cuda:", index), e);
  }
}

absl::Status Synchronize(int index) {
  try {
    c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(index));  // restores the caller's device
    if (const cudaError_t e = ::cudaDeviceSynchronize(); e != cudaSuccess) {
      return CudaError(absl::StrCat("synchronizing cuda:", index), e);
    }
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return TorchError(absl::StrCat("selecting cuda:", index), e);
  }
}

absl::Status InitAllocator(int index) {
  try {
    // The allocator's statistics calls check that it was initialised, which
    // the first allocation on the device does.
    (void)at::empty({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, static_cast<c10::DeviceIndex>(index)));
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return TorchError(absl::StrCat("initialising the caching allocator on cuda:", index), e);
  }
}

// allocated_bytes[0] is the aggregate over the small and large pools (the
// StatType enum moved namespaces between libtorch versions; its order did
// not). These run on the streamer's I/O thread: nothing may throw there, so
// a failure reads as 0 (InitAllocator made the normal case succeed).
namespace {

template <typename Pick>
size_t AllocatedStat(int index, Pick pick) {
  try {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
    return static_cast<size_t>(pick(stats.allocated_bytes[0]));
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

size_t AllocatedBytes(int index) {
  return AllocatedStat(index, [](const auto& stat) { return stat.current; });
}

size_t PeakAllocatedBytes(int index) {
  return AllocatedStat(index, [](const auto& stat) { return stat.peak; });
}

void ResetPeak(int index) {
  try {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index));
  } catch (const std::exception&) {
  }
}

}  // namespace strata::offload::cuda
