#include "offload/device/device_memory.h"

#include <ATen/ATen.h>

#include "gtest/gtest.h"

namespace strata::offload {
namespace {

TEST(DeviceMemoryTest, CountsTorchAllocationsAndFrees) {
  DeviceMemoryMonitor& monitor = DeviceMemoryMonitor::Install();
  const size_t before = monitor.current_bytes();
  monitor.ResetPeak();
  {
    at::Tensor t = at::empty({1 << 20}, at::kFloat);  // 4 MiB
    EXPECT_GE(monitor.current_bytes(), before + (4u << 20));
    at::Tensor u = t * 2;  // a temporary of the same size
    EXPECT_GE(monitor.peak_bytes(), before + (8u << 20));
  }
  EXPECT_EQ(monitor.current_bytes(), before);
  EXPECT_GE(monitor.peak_bytes(), before + (8u << 20));
}

TEST(DeviceMemoryTest, ALargeTensorHasItsOwnHugePageAlignedMappingAndIsCounted) {
  DeviceMemoryMonitor& monitor = DeviceMemoryMonitor::Install();
  const size_t before = monitor.current_bytes();
  {
    at::Tensor t = at::ones({3 << 20}, at::kFloat);  // 12 MiB: base/heap.h's MapLargeBlock
    // The data follows the allocator's 64-byte header at the mapping's start.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % (size_t{2} << 20), 64u);
    EXPECT_EQ(monitor.current_bytes(), before + (size_t{12} << 20));
    EXPECT_FLOAT_EQ(t.sum().item<float>(), static_cast<float>(3 << 20));
  }
  EXPECT_EQ(monitor.current_bytes(), before);
}

TEST(DeviceMemoryTest, InstallIsIdempotentAndMathStillWorks) {
  DeviceMemoryMonitor& a = DeviceMemoryMonitor::Install();
  DeviceMemoryMonitor& b = DeviceMemoryMonitor::Install();
  EXPECT_EQ(&a, &b);
  const at::Tensor x = at::arange(10, at::kFloat);
  EXPECT_FLOAT_EQ(x.sum().item<float>(), 45.f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.data_ptr()) % 64, 0u);
}

}  // namespace
}  // namespace strata::offload
