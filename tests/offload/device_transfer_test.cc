// DeviceTransfer, DeviceMemoryMonitor::ForDevice and the GPU side of the
// host arena and layer streamer. The CPU cases run everywhere; the CUDA
// cases run in a CUDA build on a machine with a GPU and skip otherwise.
#include "offload/device/device_transfer.h"

#include <cstring>

#include "gtest/gtest.h"
#include "offload/device/device_memory.h"
#include "offload/host/cuda_host.h"
#include "offload/host/host_arena.h"
#include "offload/stream/layer_streamer.h"
#include "tests/testutil/testutil.h"

namespace strata::offload {
namespace {

std::span<const std::byte> BytesOf(const at::Tensor& t) {
  return {static_cast<const std::byte*>(t.data_ptr()), static_cast<size_t>(t.numel()) * t.element_size()};
}

std::unique_ptr<HostArena> MakeArena(size_t capacity, bool pin_for_cuda) {
  HostArenaOptions options;
  options.capacity_bytes = capacity;
  options.pin_for_cuda = pin_for_cuda;
  auto arena = HostArena::Create(options);
  EXPECT_TRUE(arena.ok()) << arena.status();
  return arena.ok() ? std::move(*arena) : nullptr;
}

// Uploads a random tensor from arena memory, downloads it into other arena
// memory, and checks every byte came back.
void ExpectRoundTrip(DeviceTransfer& transfer, HostArena& arena) {
  const at::Tensor source = at::randn({257, 33}).to(at::kBFloat16);
  const size_t bytes = BytesOf(source).size();
  auto up = arena.Allocate(bytes);
  auto down = arena.Allocate(bytes);
  ASSERT_TRUE(up.ok() && down.ok());
  std::memcpy(up->data(), source.data_ptr(), bytes);
  std::memset(down->data(), 0x5a, bytes);  // a download that wrote nothing must not pass

  auto device = transfer.Upload(up->bytes(), source.sizes(), source.scalar_type());
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ(device->device(), transfer.device());
  const at::Tensor uploaded[] = {*device};
  auto fence = transfer.Fence();
  ASSERT_TRUE(fence.ok()) << fence.status();
  ASSERT_TRUE(transfer.ComputeWaits(**fence, uploaded).ok());
  const at::Tensor doubled = *device * 2;  // compute on the device after the wait
  ASSERT_TRUE(transfer.Download(doubled, down->bytes()).ok());
  ASSERT_TRUE(transfer.WaitAll().ok());

  const at::Tensor back = at::from_blob(down->data(), source.sizes(), at::TensorOptions().dtype(at::kBFloat16));
  EXPECT_TRUE(at::equal(back, source * 2));
}

bool GpuAvailable() { return CudaBuilt() && DeviceTransfer::Create(at::Device(at::kCUDA, 0)).ok(); }

TEST(DeviceTransferTest, ParsesDeviceNames) {
  EXPECT_EQ(*ParseComputeDevice("cpu"), at::Device(at::kCPU));
  EXPECT_EQ(*ParseComputeDevice("cuda"), at::Device(at::kCUDA, 0));
  EXPECT_EQ(*ParseComputeDevice("cuda:3"), at::Device(at::kCUDA, 3));
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", "CPU", ""}) {
    const auto parsed = ParseComputeDevice(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(DeviceTransferTest, CpuRoundTripAndSizeChecks) {
  auto transfer = DeviceTransfer::Create(at::kCPU);
  ASSERT_TRUE(transfer.ok());
  auto arena = MakeArena(1 << 20, /*pin_for_cuda=*/false);
  ExpectRoundTrip(**transfer, *arena);

  std::vector<std::byte> short_host(10);
  EXPECT_EQ((*transfer)->Upload(short_host, {4, 4}, at::kFloat).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*transfer)->Download(at::zeros({4, 4}), short_host).code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceTransferTest, CpuMonitorIsTheCountingAllocator) {
  auto monitor = DeviceMemoryMonitor::ForDevice(at::kCPU);
  ASSERT_TRUE(monitor.ok());
  EXPECT_EQ(*monitor, &DeviceMemoryMonitor::Install());
}

TEST(DeviceTransferTest, UnsupportedDevicesAreRefusedByName) {
  const auto meta = DeviceTransfer::Create(at::Device(at::kMeta));
  EXPECT_EQ(meta.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(meta.status().message().find("meta"), std::string::npos) << meta.status();
  if (CudaBuilt()) GTEST_SKIP() << "CUDA build: a GPU may be present";
  for (const auto& status : {DeviceTransfer::Create(at::Device(at::kCUDA, 0)).status(),
                             DeviceMemoryMonitor::ForDevice(at::Device(at::kCUDA, 0)).status()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(status.message().find("without CUDA"), std::string::npos) << status;
  }
  HostArenaOptions options;
  options.capacity_bytes = 1 << 20;
  options.pin_for_cuda = true;
  const auto arena = HostArena::Create(options);
  EXPECT_EQ(arena.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(arena.status().message().find("without CUDA"), std::string::npos) << arena.status();

  LayerStreamerOptions streamer_options;
  streamer_options.device = at::Device(at::kCUDA, 0);
  auto plain_arena = MakeArena(1 << 20, /*pin_for_cuda=*/false);
  const auto streamer = LayerStreamer::Create(streamer_options, plain_arena.get(), nullptr, nullptr);
  EXPECT_EQ(streamer.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(DeviceTransferTest, RoundTripFromPinnedArena_CUDA) {
  if (!GpuAvailable()) GTEST_SKIP() << "needs a CUDA build and a GPU";
  auto transfer = DeviceTransfer::Create(at::Device(at::kCUDA, 0));
  ASSERT_TRUE(transfer.ok()) << transfer.status();
  auto arena = MakeArena(8 << 20, /*pin_for_cuda=*/true);
  ASSERT_TRUE(arena->stats().cuda_pinned);
  ExpectRoundTrip(**transfer, *arena);
}

TEST(DeviceTransferTest, MonitorSeesCachingAllocatorBytes_CUDA) {
  if (!GpuAvailable()) GTEST_SKIP() << "needs a CUDA build and a GPU";
  auto monitor = DeviceMemoryMonitor::ForDevice(at::Device(at::kCUDA, 0));
  ASSERT_TRUE(monitor.ok()) << monitor.status();
  const size_t before = (*monitor)->current_bytes();
  (*monitor)->ResetPeak();
  {
    const at::Tensor t = at::empty({1 << 20}, at::TensorOptions().device(at::kCUDA, 0));  // 4 MiB
    EXPECT_GE((*monitor)->current_bytes(), before + (4u << 20));
  }
  EXPECT_EQ((*monitor)->current_bytes(), before);
  EXPECT_GE((*monitor)->peak_bytes(), before + (4u << 20));
}

TEST(DeviceTransferTest, StreamedLayersMatchHostHomesWithinBudget_CUDA) {
  if (!GpuAvailable()) GTEST_SKIP() << "needs a CUDA build and a GPU";
  testing::TempDir dir;
  auto arena = MakeArena(64 << 20, /*pin_for_cuda=*/true);
  NvmeStoreOptions store_options;
  store_options.directory = dir.path();
  auto store = NvmeStore::Open(store_options);
  ASSERT_TRUE(store.ok()) << store.status();
  for (Tier home : {Tier::kHost, Tier::kNvme}) {
    LayerStreamerOptions options;
    options.device = at::Device(at::kCUDA, 0);
    options.home = home;
    options.prefetch_depth = 2;
    options.nvme_prefix = "gpu/";
    options.device_budget_bytes = size_t{1} << 30;
    auto streamer = LayerStreamer::Create(options, arena.get(), store->get(), nullptr);
    ASSERT_TRUE(streamer.ok()) << streamer.status();
    std::vector<at::Tensor> weights;
    for (int l = 0; l < 6; ++l) {
      weights.push_back(at::randn({128, 64}));
      ASSERT_TRUE((*streamer)->AddLayer({{"w", weights.back()}}).ok());
    }
    ASSERT_TRUE((*streamer)->BeginPass({5, 4, 3, 2, 1, 0}).ok());
    for (int64_t l = 5; l >= 0; --l) {
      auto tensors = (*streamer)->Acquire(l);
      ASSERT_TRUE(tensors.ok()) << tensors.status();
      EXPECT_TRUE((*tensors)[0].is_cuda());
      EXPECT_TRUE(at::equal((*tensors)[0].cpu(), weights[static_cast<size_t>(l)])) << "layer " << l;
      (*streamer)->Release(l);
    }
    (*streamer)->EndPass();
  }
}

}  // namespace
}  // namespace strata::offload
