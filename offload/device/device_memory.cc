#include "offload/device/device_memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>

#include "base/heap.h"
#include "base/status_macros.h"
#include "offload/device/device_transfer.h"

#if STRATA_WITH_CUDA
#include "offload/device/cuda/cuda_device.h"
#endif

namespace strata::offload {
namespace {

std::atomic<size_t> g_current{0};
std::atomic<size_t> g_peak{0};

// Each allocation carries its size and where it came from in a header just
// before the data, so the raw (context == data) interface keeps working and
// frees need no lookup. 64 bytes keep the data at the alignment libtorch's
// CPU allocator gives.
constexpr size_t kHeader = 64;
struct Header {
  size_t bytes;
  bool own_mapping;  // from TakeLargeBlock, else from the inner allocator
  size_t mapped;     // an own mapping's size
};
static_assert(sizeof(Header) <= kHeader);

// An own mapping's data starts a whole small page in, so it is page-aligned:
// the NVMe store then reads and writes the tensor in place with O_DIRECT.
// With the data 64 bytes in, every streamed layer went through a bounce
// buffer as large as itself and a copy (an NVMe-streamed rollout took 4.8x as long).
constexpr size_t kOwnMappingHeader = 4096;

c10::Allocator* g_inner = nullptr;

void CountedDelete(void* data) {
  if (data == nullptr) return;
  Header header;
  std::memcpy(&header, static_cast<char*>(data) - kHeader, sizeof(header));
  g_current.fetch_sub(header.bytes, std::memory_order_relaxed);
  if (header.own_mapping) {
    ReleaseLargeBlock(static_cast<char*>(data) - kOwnMappingHeader, header.mapped);
  } else {
    g_inner->raw_deallocate(static_cast<char*>(data) - kHeader);
  }
}

class CountingCpuAllocator final : public c10::Allocator {
 public:
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override { return Allocate(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
#else
  c10::DataPtr allocate(size_t n) const override { return Allocate(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return &CountedDelete; }

 private:
  static c10::DataPtr Allocate(size_t n) {
    // Large tensors in huge pages (base/heap.h: their faults cost more than
    // the compute of a long sequence's step), unless the operator chose
    // glibc's own policy.
    Header header{n, n + kOwnMappingHeader >= kOwnMappingBytes && LargeBlocksGetOwnMapping(), 0};
    char* data = nullptr;
    if (header.own_mapping) {
      auto* block = static_cast<char*>(TakeLargeBlock(n + kOwnMappingHeader, &header.mapped));
      if (block != nullptr) data = block + kOwnMappingHeader;
    }
    if (data == nullptr) {
      header.own_mapping = false;
      data = static_cast<char*>(g_inner->raw_allocate(n + kHeader)) + kHeader;
    }
    std::memcpy(data - kHeader, &header, sizeof(header));
    const size_t now = g_current.fetch_add(n, std::memory_order_relaxed) + n;
    size_t peak = g_peak.load(std::memory_order_relaxed);
    while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    return {data, data, &CountedDelete, c10::Device(c10::DeviceType::CPU)};
  }
};

}  // namespace

DeviceMemoryMonitor& DeviceMemoryMonitor::Install() {
  static DeviceMemoryMonitor* monitor = [] {
    g_inner = c10::GetAllocator(c10::DeviceType::CPU);
    static CountingCpuAllocator counting;
    // Priority above the default so later default registrations keep ours.
    c10::SetAllocator(c10::DeviceType::CPU, &counting, /*priority=*/100);
    return new DeviceMemoryMonitor(/*cuda_index=*/-1);
  }();
  return *monitor;
}

absl::StatusOr<DeviceMemoryMonitor*> DeviceMemoryMonitor::ForDevice(const c10::Device& device) {
  if (device.is_cpu()) return &Install();
  STRATA_RETURN_IF_ERROR(CheckComputeDevice(device));
  const int index = CudaIndex(device);
  static std::mutex mu;
  static std::array<DeviceMemoryMonitor*, 64> monitors{};
  std::lock_guard<std::mutex> lock(mu);
  if (monitors[index] == nullptr) {
#if STRATA_WITH_CUDA
    STRATA_RETURN_IF_ERROR(cuda::InitAllocator(index));
#endif
    monitors[index] = new DeviceMemoryMonitor(index);
  }
  return monitors[index];
}

#if STRATA_WITH_CUDA
size_t DeviceMemoryMonitor::current_bytes() const {
  return cuda_index_ >= 0 ? cuda::AllocatedBytes(cuda_index_) : g_current.load(std::memory_order_relaxed);
}

size_t DeviceMemoryMonitor::peak_bytes() const {
  return cuda_index_ >= 0 ? cuda::PeakAllocatedBytes(cuda_index_) : g_peak.load(std::memory_order_relaxed);
}

void DeviceMemoryMonitor::ResetPeak() {
  if (cuda_index_ >= 0) {
    cuda::ResetPeak(cuda_index_);
  } else {
    g_peak.store(g_current.load(std::memory_order_relaxed));
  }
}
#else
size_t DeviceMemoryMonitor::current_bytes() const { return g_current.load(std::memory_order_relaxed); }

size_t DeviceMemoryMonitor::peak_bytes() const { return g_peak.load(std::memory_order_relaxed); }

void DeviceMemoryMonitor::ResetPeak() { g_peak.store(g_current.load(std::memory_order_relaxed)); }
#endif

}  // namespace strata::offload
