// The flat layouts a bucket travels in. The by-owner layout is what NCCL's
// reduce-scatter sums; no CPU backend has a reduce-scatter, so the sum is
// done here by hand (every rank's flat buffer added up, rank r taking part
// r), which is what the collective computes.
#include "policies/dist/flat_bucket.h"

#include "gtest/gtest.h"

namespace strata::policies {
namespace {

TEST(FlatBucketTest, PackThenUnpackGivesBackEveryTensorInItsShape) {
  const std::vector<at::Tensor> values = {at::arange(6, at::kFloat).reshape({2, 3}), at::full({1}, 7.0f),
                                          at::empty({0}, at::kFloat), at::arange(4, at::kFloat) * -1};
  ASSERT_EQ(TotalElements(values), 11);
  const at::Tensor flat = at::full({13}, 99.0f);  // longer than needed: the tail is left alone
  PackFlat(values, flat);
  EXPECT_TRUE(flat.narrow(0, 0, 6).equal(at::arange(6, at::kFloat)));
  EXPECT_EQ(flat[6].item<float>(), 7.0f);
  EXPECT_EQ(flat[11].item<float>(), 99.0f);
  std::vector<at::Tensor> back = {at::zeros({2, 3}), at::zeros({1}), at::zeros({0}), at::zeros({4})};
  UnpackFlat(flat, back);
  for (size_t i = 0; i < values.size(); ++i) EXPECT_TRUE(back[i].equal(values[i])) << "tensor " << i;
}

// Three ranks with the same bucket shapes and different values; rank 1 owns
// nothing in this bucket, rank 2 owns the most. After the sum each owner's
// tensors hold the sum over the ranks of its tensors, and nothing else.
TEST(FlatBucketTest, ReduceScatterOfTheByOwnerLayoutGivesEachRankTheSumsOfItsTensors) {
  constexpr int kRanks = 3;
  auto bucket_of = [](int rank) {
    const float scale = static_cast<float>(rank + 1);
    return std::vector<std::vector<at::Tensor>>{
        {at::full({2, 2}, scale), at::full({3}, 10 * scale)},
        {},
        {at::arange(5, at::kFloat) * scale, at::full({1, 2}, -scale), at::full({2}, 100 * scale)},
    };
  };
  std::vector<std::vector<std::vector<at::Tensor>>> buckets;
  at::Tensor sum;
  for (int rank = 0; rank < kRanks; ++rank) {
    buckets.push_back(bucket_of(rank));
    auto packed = PackByOwner(buckets.back(), at::kCPU);
    ASSERT_TRUE(packed.ok()) << packed.status();
    EXPECT_EQ(packed->part_length, 9);  // rank 2's 5 + 2 + 2
    ASSERT_EQ(packed->flat.numel(), kRanks * 9);
    // Rank 0's part is padded with zeros after its 7 elements; rank 1's is all padding.
    EXPECT_TRUE(packed->flat.narrow(0, 7, 2).equal(at::zeros({2})));
    EXPECT_TRUE(packed->flat.narrow(0, 9, 9).equal(at::zeros({9})));
    sum = rank == 0 ? packed->flat.clone() : sum + packed->flat;
  }
  const float total = 1 + 2 + 3;
  for (int rank = 0; rank < kRanks; ++rank) {
    std::vector<at::Tensor>& mine = buckets[static_cast<size_t>(rank)][static_cast<size_t>(rank)];
    UnpackFlat(sum.narrow(0, rank * 9, 9), mine);
  }
  EXPECT_TRUE(buckets[0][0][0].equal(at::full({2, 2}, total)));
  EXPECT_TRUE(buckets[0][0][1].equal(at::full({3}, 10 * total)));
  EXPECT_TRUE(buckets[2][2][0].equal(at::arange(5, at::kFloat) * total));
  EXPECT_TRUE(buckets[2][2][1].equal(at::full({1, 2}, -total)));
  EXPECT_TRUE(buckets[2][2][2].equal(at::full({2}, 100 * total)));
  // What a rank does not own is not written.
  EXPECT_TRUE(buckets[0][2][0].equal(at::arange(5, at::kFloat)));
}

TEST(FlatBucketTest, ABucketOfMixedDtypesIsRefusedNamingTheRank) {
  const std::vector<std::vector<at::Tensor>> owned = {{at::ones({2})}, {at::ones({2}, at::kDouble)}};
  auto packed = PackByOwner(owned, at::kCPU);
  ASSERT_FALSE(packed.ok());
  EXPECT_EQ(packed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(packed.status().message().find("rank 1 has Double"), absl::string_view::npos) << packed.status();
}

TEST(FlatBucketTest, ABucketOfNothingHasNoBuffer) {
  const std::vector<std::vector<at::Tensor>> owned = {{}, {at::empty({0})}};
  auto packed = PackByOwner(owned, at::kCPU);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->part_length, 0);
  EXPECT_FALSE(packed->flat.defined());
}

// Bytes on a ring's wire: reduce-scatter (N-1)/N of N x the longest part,
// all-reduce 2(N-1)/N of the total. Shapes stand in for tensors (empty,
// never filled).
TEST(FlatBucketTest, ReduceScatterIsChosenOnlyWhereItMovesLess) {
  auto parts = [](const std::vector<std::vector<int64_t>>& sizes) {
    std::vector<std::vector<at::Tensor>> owned;
    for (const auto& rank : sizes) {
      owned.emplace_back();
      for (int64_t n : rank) owned.back().push_back(at::empty({n}));
    }
    return owned;
  };
  EXPECT_TRUE(ReduceScatterMovesLess(parts({{4}, {4}})));                            // balanced: half the traffic
  EXPECT_FALSE(ReduceScatterMovesLess(parts({{8}, {}})));                            // one owner of 2: as much, no gain
  EXPECT_FALSE(ReduceScatterMovesLess(parts({{131}, {}, {}, {}, {}, {}, {}, {}})));  // an embedding over 8
  // A Llama-2-7B decoder layer over 8 ranks, in millions: 3 MLP matrices of
  // 45, 4 attention matrices of 16.8 (norms left out), one rank each.
  EXPECT_TRUE(ReduceScatterMovesLess(parts({{45}, {45}, {45}, {17}, {17}, {17}, {17}, {}})));
  EXPECT_FALSE(ReduceScatterMovesLess(parts({{}, {}})));  // nothing to move
}

}  // namespace
}  // namespace strata::policies
