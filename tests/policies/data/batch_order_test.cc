// Which examples an iteration trains on: a pure function of (job seed,
// iteration), each epoch a permutation of the examples, split row by row
// over a gang.
#include "policies/data/batch_order.h"

#include <algorithm>
#include <numeric>

#include "gtest/gtest.h"

namespace strata::policies {
namespace {

// Pinned values: changing the shuffle or its seed changes every job's data.
TEST(BatchOrderTest, BatchesAreThoseOfEarlierReleases) {
  EXPECT_EQ(BatchIndices(5, 3, 0, 7), (std::vector<size_t>{2, 1, 0}));
  EXPECT_EQ(BatchIndices(5, 3, 1, 7), (std::vector<size_t>{4, 3, 1}));
  EXPECT_EQ(BatchIndices(5, 3, 2, 7), (std::vector<size_t>{2, 4, 3}));
  EXPECT_EQ(BatchIndices(5, 3, 3, 7), (std::vector<size_t>{0, 4, 1}));
}

TEST(BatchOrderTest, EachEpochIsAPermutationOfTheExamples) {
  const size_t examples = 6;
  std::vector<size_t> seen;
  for (int64_t it = 0; it < 3; ++it) {  // 3 x 4 = 2 epochs of 6
    const auto batch = BatchIndices(examples, 4, it, 3);
    seen.insert(seen.end(), batch.begin(), batch.end());
  }
  std::vector<size_t> all(examples);
  std::iota(all.begin(), all.end(), 0);
  for (size_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<size_t> part(seen.begin() + static_cast<std::ptrdiff_t>(epoch * examples),
                             seen.begin() + static_cast<std::ptrdiff_t>((epoch + 1) * examples));
    std::sort(part.begin(), part.end());
    EXPECT_EQ(part, all) << "epoch " << epoch;
  }
}

TEST(BatchOrderTest, AnotherSeedShufflesOtherwise) {
  std::vector<size_t> a, b;
  for (int64_t it = 0; it < 4; ++it) {
    const auto x = BatchIndices(16, 4, it, 1), y = BatchIndices(16, 4, it, 2);
    a.insert(a.end(), x.begin(), x.end());
    b.insert(b.end(), y.begin(), y.end());
  }
  EXPECT_NE(a, b);
}

TEST(BatchOrderTest, RowIGoesToRankIModWorld) {
  const std::vector<size_t> batch = {10, 11, 12, 13, 14};
  std::vector<int64_t> index;
  EXPECT_EQ(ShardOfBatch(batch, 1, 2, &index), (std::vector<size_t>{11, 13}));
  EXPECT_EQ(index, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(ShardOfBatch(batch, 0, 2, nullptr), (std::vector<size_t>{10, 12, 14}));
  EXPECT_EQ(ShardOfBatch(batch, 0, 1, nullptr), batch);
}

}  // namespace
}  // namespace strata::policies
