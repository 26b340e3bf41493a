// Micro-batches that line up across a gang, and sums over it.
#include "services/rank/gang_sum.h"

#include <thread>

#include "gtest/gtest.h"

namespace strata::services {
namespace {

TEST(GangSumTest, MicroBatchesCoverTheRowsAndNoRowsStillMakeOnePass) {
  EXPECT_EQ(MicroBatches(5, 2), (MicroBatchRanges{{0, 2}, {2, 4}, {4, 5}}));
  EXPECT_EQ(MicroBatches(5, 0), (MicroBatchRanges{{0, 5}}));
  EXPECT_EQ(MicroBatches(0, 2), (MicroBatchRanges{{0, 0}}));
  EXPECT_EQ(MicroBatches(0, 0), (MicroBatchRanges{{0, 0}}));
}

TEST(GangSumTest, AGangOfOneSumsNothingAndPadsNothing) {
  auto solo = policies::ProcessGroup::Solo();
  std::vector<double> values = {1.5, 2.0};
  ASSERT_TRUE(SumOverGang(*solo, values).ok());
  EXPECT_EQ(values, (std::vector<double>{1.5, 2.0}));
  auto micros = GangMicroBatches(*solo, {3, 0}, 2);
  ASSERT_TRUE(micros.ok()) << micros.status();
  EXPECT_EQ(*micros, (std::vector<MicroBatchRanges>{{{0, 2}, {2, 3}}, {{0, 0}}}));
}

TEST(GangSumTest, ARankWithFewerMicroBatchesAddsEmptyOnes) {
  if (!policies::ProcessGroup::Available()) GTEST_SKIP() << "this build has no Gloo";
  auto groups = policies::ProcessGroup::CreateInProcess(2, std::chrono::seconds(30));
  ASSERT_TRUE(groups.ok()) << groups.status();
  // Rank 0 holds 3 rows of the step, rank 1 one: 2 passes each at 2 rows.
  const std::vector<size_t> rows = {3, 1};
  std::vector<absl::StatusOr<std::vector<MicroBatchRanges>>> micros(2, absl::UnknownError("not run"));
  std::vector<std::vector<double>> sums = {{1.0, 2.0}, {10.0, 20.0}};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto& gang = *(*groups)[static_cast<size_t>(r)];
      micros[static_cast<size_t>(r)] = GangMicroBatches(gang, {rows[static_cast<size_t>(r)]}, 2);
      if (!SumOverGang(gang, sums[static_cast<size_t>(r)]).ok()) sums[static_cast<size_t>(r)].clear();
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_TRUE(micros[0].ok()) << micros[0].status();
  ASSERT_TRUE(micros[1].ok()) << micros[1].status();
  EXPECT_EQ(*micros[0], (std::vector<MicroBatchRanges>{{{0, 2}, {2, 3}}}));
  EXPECT_EQ(*micros[1], (std::vector<MicroBatchRanges>{{{0, 1}, {1, 1}}}));
  EXPECT_EQ(sums[0], (std::vector<double>{11.0, 22.0}));
  EXPECT_EQ(sums[1], (std::vector<double>{11.0, 22.0}));
}

}  // namespace
}  // namespace strata::services
