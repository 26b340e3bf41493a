#include "offload/device/device_transfer.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "offload/tiers/placement.h"

#if STRATA_WITH_CUDA
#include "offload/device/cuda/cuda_device.h"
#endif

namespace strata::offload {
namespace {

absl::Status CheckSize(const char* what, size_t host_bytes, size_t tensor_bytes) {
  if (host_bytes == tensor_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("device transfer: ", what, " of ", tensor_bytes, " tensor bytes given ", host_bytes, " host bytes"));
}

// The CPU device: the "device" is the host, so a copy is a host copy and is
// complete when the call returns.
class CpuTransfer final : public DeviceTransfer {
 public:
  at::Device device() const override { return at::kCPU; }

  absl::StatusOr<at::Tensor> Upload(std::span<const std::byte> host, at::IntArrayRef shape,
                                    at::ScalarType dtype) override {
    at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype));
    const size_t bytes = static_cast<size_t>(out.numel()) * out.element_size();
    STRATA_RETURN_IF_ERROR(CheckSize("upload", host.size(), bytes));
    // torch's copy kernel: parallel over the intra-op threads, unlike memcpy.
    // (from_blob wants a mutable pointer; the source is only read.)
    out.copy_(at::from_blob(const_cast<std::byte*>(host.data()), shape, at::TensorOptions().dtype(dtype)));
    return out;
  }

  absl::Status Download(const at::Tensor& device_tensor, std::span<std::byte> host) override {
    if (!device_tensor.device().is_cpu() || !device_tensor.is_contiguous()) {
      return absl::InvalidArgumentError("device transfer: download needs a contiguous tensor on the CPU device");
    }
    const size_t bytes = static_cast<size_t>(device_tensor.numel()) * device_tensor.element_size();
    STRATA_RETURN_IF_ERROR(CheckSize("download", host.size(), bytes));
    at::from_blob(host.data(), device_tensor.sizes(), device_tensor.options()).copy_(device_tensor);
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<TransferFence>> Fence() override { return std::make_shared<TransferFence>(); }
  absl::Status WaitHost(const TransferFence&) override { return absl::OkStatus(); }
  absl::Status ComputeWaits(const TransferFence&, std::span<const at::Tensor>) override { return absl::OkStatus(); }
};

}  // namespace

absl::Status DeviceTransfer::WaitAll() {
  STRATA_ASSIGN_OR_RETURN(auto fence, Fence());
  return WaitHost(*fence);
}

absl::Status CheckComputeDevice(const at::Device& device) {
  if (device.is_cpu()) return absl::OkStatus();
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("compute device ", device.str(), ": only cpu and cuda are supported"));
  }
#if STRATA_WITH_CUDA
  const int visible = cuda::VisibleDevices();
  if (visible == 0) {
    return absl::FailedPreconditionError(absl::StrCat("compute device ", device.str(), ": no CUDA GPU is visible"));
  }
  if (CudaIndex(device) >= visible) {
    return absl::InvalidArgumentError(
        absl::StrCat("compute device ", device.str(), ": only ", visible, " CUDA GPU(s) are visible"));
  }
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "compute device ", device.str(), ": this strata was built without CUDA (configure against a CUDA libtorch)"));
#endif
}

int CudaIndex(const at::Device& device) { return device.has_index() ? device.index() : 0; }

absl::StatusOr<std::unique_ptr<DeviceTransfer>> DeviceTransfer::Create(const at::Device& device) {
  STRATA_RETURN_IF_ERROR(CheckComputeDevice(device));
#if STRATA_WITH_CUDA
  if (device.is_cuda()) return cuda::MakeTransfer(CudaIndex(device));
#endif
  return std::unique_ptr<DeviceTransfer>(new CpuTransfer());  // the check let only the CPU through
}

absl::Status SynchronizeDevice(const at::Device& device) {
  STRATA_RETURN_IF_ERROR(CheckComputeDevice(device));
#if STRATA_WITH_CUDA
  if (device.is_cuda()) return cuda::Synchronize(CudaIndex(device));
#endif
  return absl::OkStatus();  // the CPU: nothing is queued
}

absl::StatusOr<at::Device> ParseComputeDevice(const std::string& text) {
  STRATA_ASSIGN_OR_RETURN(auto index, ParseDeviceName(text));
  return ComputeDevice(index);
}

at::Device ComputeDevice(int index) {
  if (index < 0) return at::Device(at::kCPU);
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace strata::offload
