#include "offload/stream/layer_streamer.h"

#include <set>

#include "gtest/gtest.h"
#include "tests/testutil/testutil.h"

namespace strata::offload {
namespace {

std::vector<std::pair<std::string, at::Tensor>> RandomLayer(int64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
  return {{"w1", at::randn({64, 32}, gen)},
          {"w2", at::randn({32}, gen).to(at::kBFloat16)},
          {"w3", at::randn({3, 5, 7}, gen)}};
}

class LayerStreamerTest : public ::testing::TestWithParam<Tier> {
 protected:
  void SetUp() override {
    HostArenaOptions arena_options;
    arena_options.capacity_bytes = 8 << 20;
    auto arena = HostArena::Create(arena_options);
    ASSERT_TRUE(arena.ok()) << arena.status();
    arena_ = std::move(*arena);
    if (GetParam() == Tier::kNvme) {
      NvmeStoreOptions store_options;
      store_options.directory = dir_.path();
      auto store = NvmeStore::Open(store_options);
      ASSERT_TRUE(store.ok()) << store.status();
      store_ = std::move(*store);
    }
  }

  std::unique_ptr<LayerStreamer> Make(int prefetch_depth, int layers) {
    LayerStreamerOptions options;
    options.home = GetParam();
    options.prefetch_depth = prefetch_depth;
    options.nvme_prefix = "test/";
    auto streamer = LayerStreamer::Create(options, arena_.get(), store_.get(), &accountant_);
    EXPECT_TRUE(streamer.ok()) << streamer.status();
    for (int l = 0; l < layers; ++l) {
      auto index = (*streamer)->AddLayer(RandomLayer(l));
      EXPECT_TRUE(index.ok()) << index.status();
      EXPECT_EQ(*index, l);
    }
    return std::move(*streamer);
  }

  testing::TempDir dir_;
  std::unique_ptr<HostArena> arena_;
  std::unique_ptr<NvmeStore> store_;
  TierAccountant accountant_{TierBudgets{}};
};

TEST_P(LayerStreamerTest, ForwardAndReversePassesReturnTheLayers) {
  auto streamer = Make(/*prefetch_depth=*/1, /*layers=*/5);
  for (bool reverse : {false, true}) {
    std::vector<int64_t> order = {0, 1, 2, 3, 4};
    if (reverse) std::reverse(order.begin(), order.end());
    ASSERT_TRUE(streamer->BeginPass(order).ok());
    for (int64_t l : order) {
      auto tensors = streamer->Acquire(l);
      ASSERT_TRUE(tensors.ok()) << tensors.status();
      const auto want = RandomLayer(l);
      ASSERT_EQ(tensors->size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_TRUE(at::equal((*tensors)[i], want[i].second)) << "layer " << l << " " << want[i].first;
      }
      streamer->Release(l);
    }
    streamer->EndPass();
  }
  EXPECT_EQ(streamer->stats().fetches, 10);
  EXPECT_EQ(streamer->tensor_names(2), (std::vector<std::string>{"w1", "w2", "w3"}));
}

// A tensor of 1 MiB or more read from NVMe lands page-aligned (O_DIRECT
// reads it in place, not through a bounce buffer), whatever the allocator
// gave, and its buffer serves the next pass too.
TEST_P(LayerStreamerTest, LargeTensorsFromNvmeLandPageAlignedAndTheirBuffersAreReused) {
  LayerStreamerOptions options;
  options.home = GetParam();
  options.prefetch_depth = 0;
  options.nvme_prefix = "big/";
  auto streamer = LayerStreamer::Create(options, arena_.get(), store_.get(), nullptr);
  ASSERT_TRUE(streamer.ok()) << streamer.status();
  at::Generator gen = at::detail::createCPUGenerator(11);
  const std::vector<std::pair<std::string, at::Tensor>> layer = {{"big", at::randn({520, 1000}, gen)},
                                                                 {"small", at::randn({7}, gen)}};
  ASSERT_TRUE((*streamer)->AddLayer(layer).ok());
  const void* first = nullptr;
  for (int pass = 0; pass < 3; ++pass) {
    ASSERT_TRUE((*streamer)->BeginPass({0}).ok());
    auto tensors = (*streamer)->Acquire(0);
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    EXPECT_TRUE(at::equal((*tensors)[0], layer[0].second));
    EXPECT_TRUE(at::equal((*tensors)[1], layer[1].second));
    const void* big = (*tensors)[0].data_ptr();
    if (GetParam() == Tier::kNvme) EXPECT_EQ(reinterpret_cast<uintptr_t>(big) % 4096, 0u) << "pass " << pass;
    if (pass == 0) first = big;
    EXPECT_EQ(big, first) << "pass " << pass << " took a new buffer";
    tensors->clear();
    (*streamer)->Release(0);
    (*streamer)->EndPass();
  }
}

TEST_P(LayerStreamerTest, ResidentLayersStayWithinThePrefetchWindow) {
  for (int depth : {0, 2}) {
    auto streamer = Make(depth, 6);
    ASSERT_TRUE(streamer->BeginPass({0, 1, 2, 3, 4, 5}).ok());
    for (int64_t l = 0; l < 6; ++l) {
      auto tensors = streamer->Acquire(l);
      ASSERT_TRUE(tensors.ok());
      tensors->clear();
      streamer->Release(l);
    }
    streamer->EndPass();
    EXPECT_LE(streamer->stats().max_resident_bytes, static_cast<size_t>(depth + 1) * streamer->layer_bytes(0));
  }
}

// On a CPU device the window's buffers are reused: passes after the first
// allocate nothing new, and the buffers in use are at most the window's.
TEST_P(LayerStreamerTest, WindowBuffersAreReusedAcrossPasses) {
  auto streamer = Make(/*prefetch_depth=*/1, /*layers=*/6);
  std::set<const void*> seen;
  for (int pass = 0; pass < 4; ++pass) {
    ASSERT_TRUE(streamer->BeginPass({0, 1, 2, 3, 4, 5}).ok());
    for (int64_t l = 0; l < 6; ++l) {
      auto tensors = streamer->Acquire(l);
      ASSERT_TRUE(tensors.ok()) << tensors.status();
      const auto want = RandomLayer(l);
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_TRUE(at::equal((*tensors)[i], want[i].second)) << "pass " << pass << " layer " << l;
        seen.insert((*tensors)[i].data_ptr());
      }
      tensors->clear();  // nothing refers to the layer once it is released
      streamer->Release(l);
    }
    streamer->EndPass();
  }
  // Three tensors a layer, for at most the one computing and the one
  // prefetched (fewer when a slow fetch starts after the release).
  EXPECT_LE(seen.size(), 2u * 3u);
  EXPECT_GE(seen.size(), 3u);
}

TEST_P(LayerStreamerTest, StoreTensorUpdatesTheHomeCopy) {
  auto streamer = Make(1, 2);
  const at::Tensor updated = at::full({64, 32}, 3.5f);
  ASSERT_TRUE(streamer->StoreTensor(1, 0, updated).ok());
  auto loaded = streamer->LoadTensor(1, 0);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(at::equal(*loaded, updated));
  ASSERT_TRUE(streamer->BeginPass({1}).ok());
  auto tensors = streamer->Acquire(1);
  ASSERT_TRUE(tensors.ok());
  EXPECT_TRUE(at::equal((*tensors)[0], updated));
  streamer->EndPass();
  const auto wrong = streamer->StoreTensor(1, 0, at::zeros({2, 2}));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("layers.1.w1"), std::string::npos);
}

TEST_P(LayerStreamerTest, OutOfOrderAcquireAndEarlyEndAreSafe) {
  auto streamer = Make(2, 4);
  ASSERT_TRUE(streamer->BeginPass({0, 1, 2, 3}).ok());
  EXPECT_EQ(streamer->Acquire(2).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(streamer->Acquire(0).ok());
  EXPECT_EQ(streamer->BeginPass({0}).code(), absl::StatusCode::kFailedPrecondition);
  streamer->EndPass();  // layers 1.. may be in flight or ready: dropped
  ASSERT_TRUE(streamer->BeginPass({3, 2}).ok());
  auto three = streamer->Acquire(3);
  ASSERT_TRUE(three.ok());
  EXPECT_TRUE(at::equal((*three)[2], RandomLayer(3)[2].second));
  streamer->EndPass();
}

TEST_P(LayerStreamerTest, HomeBytesAreAccounted) {
  auto streamer = Make(1, 3);
  const size_t home = accountant_.Usage().current_of(GetParam());
  EXPECT_GE(home, 3 * streamer->layer_bytes(0));
  streamer.reset();
  EXPECT_EQ(accountant_.Usage().current_of(GetParam()), 0u);
}

TEST_P(LayerStreamerTest, DeviceBudgetLimitsPrefetchAndFailsWhenALayerCannotFit) {
  DeviceMemoryMonitor& monitor = DeviceMemoryMonitor::Install();
  auto probe = Make(0, 1);
  const size_t layer = probe->layer_bytes(0);
  probe.reset();
  for (size_t room : {layer + layer / 2, layer / 2}) {
    LayerStreamerOptions options;
    options.home = GetParam();
    options.prefetch_depth = 3;  // would hold 4 layers without the budget
    options.nvme_prefix = "budget/";
    options.device_budget_bytes = monitor.current_bytes() + room;
    auto streamer = LayerStreamer::Create(options, arena_.get(), store_.get(), nullptr);
    ASSERT_TRUE(streamer.ok());
    for (int l = 0; l < 4; ++l) ASSERT_TRUE((*streamer)->AddLayer(RandomLayer(l)).ok());
    ASSERT_TRUE((*streamer)->BeginPass({0, 1, 2, 3}).ok());
    for (int64_t l = 0; l < 4; ++l) {
      auto tensors = (*streamer)->Acquire(l);
      if (room < layer) {
        EXPECT_EQ(tensors.status().code(), absl::StatusCode::kResourceExhausted);
        EXPECT_NE(tensors.status().message().find("budget"), std::string::npos);
        break;
      }
      ASSERT_TRUE(tensors.ok()) << tensors.status();
      tensors->clear();
      (*streamer)->Release(l);
    }
    (*streamer)->EndPass();
    if (room > layer) {
      EXPECT_LE((*streamer)->stats().max_resident_bytes, layer);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Homes, LayerStreamerTest, ::testing::Values(Tier::kHost, Tier::kNvme),
                         [](const auto& info) { return std::string(TierName(info.param)); });

TEST(LayerStreamerOptionsTest, BadOptionsAreRejected) {
  LayerStreamerOptions options;
  options.prefetch_depth = -1;
  EXPECT_NE(options.Validate().message().find("prefetch_depth"), std::string::npos);
  options.prefetch_depth = 1;
  options.home = Tier::kDevice;
  EXPECT_FALSE(options.Validate().ok());
  options.home = Tier::kNvme;
  EXPECT_FALSE(LayerStreamer::Create(options, nullptr, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace strata::offload
