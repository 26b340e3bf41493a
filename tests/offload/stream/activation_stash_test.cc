#include "offload/stream/activation_stash.h"

#include <filesystem>

#include "gtest/gtest.h"
#include "offload/device/device_memory.h"
#include "tests/testutil/testutil.h"

namespace strata::offload {
namespace {

class ActivationStashTest : public ::testing::TestWithParam<Tier> {
 protected:
  void SetUp() override {
    HostArenaOptions arena_options;
    arena_options.capacity_bytes = 64 << 20;
    arena_ = std::move(*HostArena::Create(arena_options));
    ActivationStashOptions options;
    options.home = GetParam();
    options.nvme_directory = dir_.path();
    auto stash = ActivationStash::Create(options, arena_.get());
    ASSERT_TRUE(stash.ok()) << stash.status();
    stash_ = std::move(*stash);
  }

  // A step of `count` tensors shaped [2, t, 24]: each comes back equal,
  // in reverse order.
  void RoundTrip(int64_t count, int64_t t, at::ScalarType dtype) {
    std::vector<at::Tensor> put;
    const int64_t bytes = 2 * t * 24 * static_cast<int64_t>(c10::elementSize(dtype));
    ASSERT_TRUE(stash_->Begin(count, bytes).ok());
    for (int64_t i = 0; i < count; ++i) {
      put.push_back(at::randn({2, t, 24}).to(dtype));
      ASSERT_TRUE(stash_->Put(i, put.back()).ok()) << i;
    }
    for (int64_t i = count - 1; i >= 0; --i) {
      auto back = stash_->Take(i);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->scalar_type(), dtype);
      EXPECT_TRUE(at::equal(*back, put[static_cast<size_t>(i)])) << "tensor " << i;
    }
    stash_->End();
  }

  testing::TempDir dir_;
  std::unique_ptr<HostArena> arena_;
  std::unique_ptr<ActivationStash> stash_;
};

TEST_P(ActivationStashTest, TensorsComeBackEqualInReverseOrder) {
  RoundTrip(5, 37, at::kFloat);
  // A longer step grows the buffers; a shorter one reuses them.
  RoundTrip(4, 300, at::kBFloat16);
  RoundTrip(1, 3, at::kFloat);
  RoundTrip(6, 50, at::kFloat);
  // Nothing named is left in the NVMe directory.
  EXPECT_TRUE(std::filesystem::is_empty(dir_.path()));
}

TEST_P(ActivationStashTest, OrderAndSizeAreChecked) {
  ASSERT_TRUE(stash_->Begin(3, 2 * 5 * 24 * 4).ok());
  const at::Tensor x = at::randn({2, 5, 24});
  EXPECT_EQ(stash_->Put(1, x).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stash_->Put(0, at::randn({2, 6, 24})).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(stash_->Put(0, x).ok());
  EXPECT_EQ(stash_->Take(0).status().code(), absl::StatusCode::kFailedPrecondition);  // not all put
  ASSERT_TRUE(stash_->Put(1, x).ok());
  ASSERT_TRUE(stash_->Put(2, x).ok());
  EXPECT_EQ(stash_->Take(1).status().code(), absl::StatusCode::kFailedPrecondition);  // 2 comes first
  EXPECT_TRUE(stash_->Take(2).ok());
  // A step abandoned half way (an error in backward) ends cleanly.
  stash_->End();
  RoundTrip(3, 5, at::kFloat);
}

INSTANTIATE_TEST_SUITE_P(Tiers, ActivationStashTest, ::testing::Values(Tier::kDevice, Tier::kHost, Tier::kNvme),
                         [](const auto& info) { return std::string(TierName(info.param)); });

// NVMe: the last two tensors stay in the staging buffers until backward
// takes them; the rest are written once and read one ahead of their take.
TEST(ActivationStashNvmeTest, WritesAndReadsAllButTheLastTwo) {
  testing::TempDir dir;
  HostArenaOptions arena_options;
  arena_options.capacity_bytes = 64 << 20;
  auto arena = std::move(*HostArena::Create(arena_options));
  ActivationStashOptions options;
  options.home = Tier::kNvme;
  options.nvme_directory = dir.path();
  auto stash = std::move(*ActivationStash::Create(options, arena.get()));
  const int64_t count = 6, bytes = 3 * 4096;
  const int64_t open_before = ScratchFile::OpenBytes();
  // Two tensors both stay staged: no scratch file at all.
  ASSERT_TRUE(stash->Begin(2, bytes).ok());
  EXPECT_EQ(ScratchFile::OpenBytes(), open_before);
  ASSERT_TRUE(stash->Begin(count, bytes).ok());
  // Slots for the tensors that get written only, counted as open bytes.
  EXPECT_EQ(ScratchFile::OpenBytes() - open_before, (count - 2) * bytes);
  for (int64_t i = 0; i < count; ++i) ASSERT_TRUE(stash->Put(i, at::full({3 * 1024}, static_cast<float>(i))).ok());
  for (int64_t i = count - 1; i >= 0; --i) {
    auto back = stash->Take(i);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ((*back)[0].item<float>(), static_cast<float>(i));
  }
  EXPECT_EQ(stash->stats().bytes_written, (count - 2) * bytes);
  EXPECT_EQ(stash->stats().bytes_read, (count - 2) * bytes);
  EXPECT_EQ(stash->stats().reads_saved, 1);  // the second to last; the last is taken from its staging
  stash.reset();
  EXPECT_EQ(ScratchFile::OpenBytes(), open_before);
}

// Off the device, the stash holds at most the window on the device: a step
// of many large tensors adds about three of them to the device peak, where
// keeping them adds them all.
TEST(ActivationStashWindowTest, OffTheDeviceTheDeviceHoldsAWindow) {
  testing::TempDir dir;
  HostArenaOptions arena_options;
  arena_options.capacity_bytes = 96 << 20;
  auto arena = std::move(*HostArena::Create(arena_options));
  DeviceMemoryMonitor& monitor = DeviceMemoryMonitor::Install();
  const int64_t count = 12, elements = 1 << 20;  // 4 MiB each
  auto peak_of = [&](Tier home) {
    ActivationStashOptions options;
    options.home = home;
    options.nvme_directory = dir.path();
    auto stash = std::move(*ActivationStash::Create(options, arena.get()));
    EXPECT_TRUE(stash->Begin(count, elements * 4).ok());
    monitor.ResetPeak();
    const size_t before = monitor.current_bytes();
    at::Tensor x = at::zeros({elements});
    for (int64_t i = 0; i < count; ++i) {
      EXPECT_TRUE(stash->Put(i, x).ok());
      x = x + 1;  // the next layer's input
    }
    x = at::Tensor();
    for (int64_t i = count - 1; i >= 0; --i) {
      auto back = stash->Take(i);
      EXPECT_TRUE(back.ok() && (*back)[0].item<float>() == static_cast<float>(i));
    }
    stash->End();
    return static_cast<double>(monitor.peak_bytes() - before) / (elements * 4);
  };
  EXPECT_GE(peak_of(Tier::kDevice), count);
  EXPECT_LE(peak_of(Tier::kHost), 3.01);
  EXPECT_LE(peak_of(Tier::kNvme), 3.01);
}

}  // namespace
}  // namespace strata::offload
