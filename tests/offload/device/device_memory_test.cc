#include "offload/device/device_memory.h"

#include <ATen/ATen.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

TEST(DeviceMemoryTest, ALargeTensorIsPageAlignedInAHugePageMappingAndIsCounted) {
  DeviceMemoryMonitor& monitor = DeviceMemoryMonitor::Install();
  const size_t before = monitor.current_bytes();
  {
    at::Tensor t = at::ones({3 << 20}, at::kFloat);  // 12 MiB: base/heap.h's TakeLargeBlock
    // The data starts one 4 KiB page into the huge-page-aligned mapping, so
    // the NVMe store's O_DIRECT transfers use it in place.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % (size_t{2} << 20), 4096u);
    EXPECT_EQ(monitor.current_bytes(), before + (size_t{12} << 20));
    EXPECT_FLOAT_EQ(t.sum().item<float>(), static_cast<float>(3 << 20));
  }
  EXPECT_EQ(monitor.current_bytes(), before);
}

TEST(DeviceMemoryTest, AFreedLargeTensorsMappingServesTheNextOfItsSize) {
  DeviceMemoryMonitor& monitor = DeviceMemoryMonitor::Install();
  const size_t before = monitor.current_bytes();
  void* first = nullptr;
  {
    at::Tensor t = at::full({2 << 20}, 3.f);  // 8 MiB
    first = t.data_ptr();
  }
  at::Tensor again = at::empty({2 << 20}, at::kFloat);
  EXPECT_EQ(again.data_ptr(), first);
  // Its old pages, not a new mapping the kernel zeroed (which the kernel may
  // well place at the same address).
  EXPECT_EQ(again[(2 << 20) - 1].item<float>(), 3.f);
  EXPECT_EQ(monitor.current_bytes(), before + (size_t{8} << 20));
}

// The name /proc/self/maps gives the mapping that holds `address` ("" for
// an anonymous one, "[heap]" for the brk heap).
std::string MappingName(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::istringstream fields(line);
    std::string range, perms, offset, device, inode, name;
    fields >> range >> perms >> offset >> device >> inode;
    std::getline(fields >> std::ws, name);
    const size_t dash = range.find('-');
    if (std::stoull(range.substr(0, dash), nullptr, 16) <= at &&
        at < std::stoull(range.substr(dash + 1), nullptr, 16)) {
      return name;
    }
  }
  return "?";
}

// Run by the next test in a process of its own, with MALLOC_MMAP_MAX_=0.
TEST(DeviceMemoryTest, DISABLED_WithGlibcMappingsOffALargeTensorComesFromTheHeap) {
  DeviceMemoryMonitor& monitor = DeviceMemoryMonitor::Install();
  const size_t before = monitor.current_bytes();
  at::Tensor t = at::ones({3 << 20}, at::kFloat);  // 12 MiB
  EXPECT_EQ(MappingName(t.data_ptr()), "[heap]");
  EXPECT_EQ(monitor.current_bytes(), before + (size_t{12} << 20));
}

TEST(DeviceMemoryTest, AnOperatorsMmapSettingLeavesLargeTensorsToGlibc) {
  // The allocator reads the environment once a process: a child started
  // with the main job's setting (deploy/demo.sh), running the test above.
  std::string exe(4096, '\0');
  exe.resize(static_cast<size_t>(readlink("/proc/self/exe", exe.data(), exe.size())));
  std::vector<std::string> args = {
      exe, "--gtest_also_run_disabled_tests",
      "--gtest_filter=DeviceMemoryTest.DISABLED_WithGlibcMappingsOffALargeTensorComesFromTheHeap"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env = {"MALLOC_MMAP_MAX_=0"};
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), envp.data()), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's test failed: a large tensor got its own mapping";
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
