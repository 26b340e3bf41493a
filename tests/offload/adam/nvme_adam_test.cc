#include "offload/adam/nvme_adam.h"

#include <random>

#include "gtest/gtest.h"
#include "tests/testutil/testutil.h"

namespace strata::offload {
namespace {

class NvmeAdamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HostArenaOptions arena_options;
    arena_options.capacity_bytes = 16 << 20;
    arena_ = std::move(*HostArena::Create(arena_options));
    NvmeStoreOptions store_options;
    store_options.directory = dir_.path();
    auto store = NvmeStore::Open(store_options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    CpuAdamOptions adam_options;
    adam_options.threads = 1;
    adam_ = std::move(*CpuAdam::Create(adam_options));
  }
  testing::TempDir dir_;
  std::unique_ptr<HostArena> arena_;
  std::unique_ptr<NvmeStore> store_;
  std::unique_ptr<CpuAdam> adam_;
};

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Swapping states through NVMe in tiles gives bit-for-bit the update that
// host-resident states give.
TEST_F(NvmeAdamTest, TiledNvmeStepsEqualHostSteps) {
  NvmeAdamOptions options;
  options.tile_elements = 1024;  // several tiles per tensor, and a ragged last one
  auto nvme = NvmeAdamState::Create(options, store_.get(), arena_.get(), adam_.get());
  ASSERT_TRUE(nvme.ok()) << nvme.status();
  const std::vector<size_t> sizes = {5000, 1024, 17};
  std::vector<std::vector<float>> host_param, host_m, host_v, out(sizes.size());
  for (size_t t = 0; t < sizes.size(); ++t) {
    host_param.push_back(Random(sizes[t], 10 + static_cast<uint32_t>(t)));
    host_m.emplace_back(sizes[t], 0.f);
    host_v.emplace_back(sizes[t], 0.f);
    out[t].resize(sizes[t]);
    ASSERT_TRUE((*nvme)->Register("t" + std::to_string(t), host_param[t]).ok());
  }
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<std::vector<float>> grads;
    std::vector<NvmeAdamUpdate> updates;
    for (size_t t = 0; t < sizes.size(); ++t) grads.push_back(Random(sizes[t], 100 * static_cast<uint32_t>(step) + t));
    for (size_t t = 0; t < sizes.size(); ++t) {
      updates.push_back({"t" + std::to_string(t), grads[t], step, out[t], {}, {}});
      AdamTensorSpan span;
      span.param = host_param[t];
      span.grad = grads[t];
      span.exp_avg = host_m[t];
      span.exp_avg_sq = host_v[t];
      span.step = step;
      ASSERT_TRUE(adam_->Step(span).ok());
    }
    ASSERT_TRUE((*nvme)->Step(updates).ok());
    for (size_t t = 0; t < sizes.size(); ++t) EXPECT_EQ(out[t], host_param[t]) << "tensor " << t << " step " << step;
  }
  auto master = (*nvme)->Master("t0");
  ASSERT_TRUE(master.ok());
  EXPECT_EQ(*master, host_param[0]);
  EXPECT_EQ((*nvme)->staging_bytes(), 3 * 12288u);
}

TEST_F(NvmeAdamTest, UnknownTensorAndWrongSizeAreErrors) {
  NvmeAdamOptions options;
  options.tile_elements = 4096;
  auto nvme = NvmeAdamState::Create(options, store_.get(), arena_.get(), adam_.get());
  ASSERT_TRUE(nvme.ok()) << nvme.status();
  std::vector<float> g(10);
  std::vector<NvmeAdamUpdate> unknown = {{"nope", g, 1, {}, {}, {}}};
  EXPECT_EQ((*nvme)->Step(unknown).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE((*nvme)->Register("w", std::vector<float>(20, 1.f)).ok());
  std::vector<NvmeAdamUpdate> wrong = {{"w", g, 1, {}, {}, {}}};
  const auto status = (*nvme)->Step(wrong);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("w"), std::string::npos);
  NvmeAdamOptions bad;
  bad.staging_buffers = 1;
  EXPECT_NE(
      NvmeAdamState::Create(bad, store_.get(), arena_.get(), adam_.get()).status().message().find("staging_buffers"),
      std::string::npos);
}

}  // namespace
}  // namespace strata::offload
