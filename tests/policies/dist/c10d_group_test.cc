// ZeRO-2's reduce-scatter branch of the c10d group, run on the CPU through
// a Gloo that has one (reduce_scattering_gloo.h).
#include "gtest/gtest.h"

// Built with Gloo's headers only (tests/CMakeLists.txt).
#ifdef STRATA_TEST_WITH_GLOO
#include <thread>

#include "tests/policies/dist/reduce_scattering_gloo.h"

namespace strata::policies {
namespace {

// `body(rank, group, backend)` on each rank of a fresh gang of two.
template <typename Body>
void OnTwoRanks(Body body) {
  ReduceScatteringGang gang = MakeReduceScatteringGang(2);
  std::thread other(body, 1, std::ref(*gang.groups[1]), std::ref(*gang.backends[1]));
  body(0, *gang.groups[0], *gang.backends[0]);
  other.join();
}

// Rank r's gradients in a bucket where rank 0 owns two tensors and rank 1
// one: parts of 4 and 5 elements, so the reduce-scatter moves less.
std::vector<std::vector<at::Tensor>> Bucket(int rank) {
  const float scale = static_cast<float>(rank + 1);
  return {{at::full({3}, scale), at::full({1}, 2 * scale)}, {at::arange(5, at::kFloat) * scale}};
}

TEST(C10dGroupTest, ReduceScatterGivesEachRankTheSumsOfItsTensorsWhenWaitedFor) {
  std::vector<std::vector<std::vector<at::Tensor>>> kept(2);
  std::vector<int> calls(2);
  OnTwoRanks([&](int rank, ProcessGroup& group, ReduceScatteringGloo& backend) {
    std::vector<std::vector<at::Tensor>> owned = Bucket(rank);
    const absl::Status started = group.StartReduceScatterSum(owned);
    ASSERT_TRUE(started.ok()) << started;
    for (auto& tensors : owned) {
      for (at::Tensor& t : tensors) t.fill_(-1);  // the group sums its own packed copy
    }
    const absl::Status waited = group.WaitPending(0);
    ASSERT_TRUE(waited.ok()) << waited;
    kept[static_cast<size_t>(rank)] = owned;
    calls[static_cast<size_t>(rank)] = backend.calls;
  });
  EXPECT_EQ(calls, (std::vector<int>{1, 1}));  // the branch ran, once on each rank
  EXPECT_TRUE(kept[0][0][0].equal(at::full({3}, 3.0f)));
  EXPECT_TRUE(kept[0][0][1].equal(at::full({1}, 6.0f)));
  EXPECT_TRUE(kept[1][1][0].equal(at::arange(5, at::kFloat) * 3));
  // What a rank does not own is left as it was.
  EXPECT_TRUE(kept[0][1][0].equal(at::full({5}, -1.0f)));
  EXPECT_TRUE(kept[1][0][0].equal(at::full({3}, -1.0f)));
}

// The trainer keeps one layer's sum in flight: sums finish in the order
// they started, each writing only its own tensors.
TEST(C10dGroupTest, SumsInFlightFinishInOrder) {
  std::vector<at::Tensor> first(2), second_in_flight(2), second(2);
  OnTwoRanks([&](int rank, ProcessGroup& group, ReduceScatteringGloo&) {
    const size_t mine = static_cast<size_t>(rank);
    std::vector<std::vector<at::Tensor>> a = Bucket(rank);
    std::vector<std::vector<at::Tensor>> b = Bucket(rank);
    for (auto& tensors : b) {
      for (at::Tensor& t : tensors) t.mul_(10);
    }
    ASSERT_TRUE(group.StartReduceScatterSum(a).ok());
    ASSERT_TRUE(group.StartReduceScatterSum(b).ok());
    ASSERT_TRUE(group.WaitPending(1).ok());
    first[mine] = a[mine][0];
    second_in_flight[mine] = b[mine][0].clone();
    ASSERT_TRUE(group.WaitPending(0).ok());
    second[mine] = b[mine][0];
  });
  EXPECT_TRUE(first[0].equal(at::full({3}, 3.0f)));
  EXPECT_TRUE(first[1].equal(at::arange(5, at::kFloat) * 3));
  EXPECT_TRUE(second_in_flight[0].equal(at::full({3}, 10.0f)));  // still this rank's own
  EXPECT_TRUE(second_in_flight[1].equal(at::arange(5, at::kFloat) * 20));
  EXPECT_TRUE(second[0].equal(at::full({3}, 30.0f)));
  EXPECT_TRUE(second[1].equal(at::arange(5, at::kFloat) * 30));
}

// A bucket of one tensor pads N-fold in the by-owner layout: it is
// all-reduced instead, and its owner still gets the sum.
TEST(C10dGroupTest, ABucketThatPadsMoreThanItSavesIsAllReduced) {
  std::vector<at::Tensor> kept(2);
  std::vector<int> calls(2);
  OnTwoRanks([&](int rank, ProcessGroup& group, ReduceScatteringGloo& backend) {
    std::vector<std::vector<at::Tensor>> owned = {{at::full({8}, static_cast<float>(rank + 1))}, {}};
    ASSERT_TRUE(group.StartReduceScatterSum(owned).ok());
    ASSERT_TRUE(group.WaitPending(0).ok());
    kept[static_cast<size_t>(rank)] = owned[0][0];
    calls[static_cast<size_t>(rank)] = backend.calls;
  });
  EXPECT_EQ(calls, (std::vector<int>{0, 0}));
  EXPECT_TRUE(kept[0].equal(at::full({8}, 3.0f)));
}

TEST(C10dGroupTest, OwnerListsThatAreNotOnePerRankAreRefused) {
  OnTwoRanks([&](int, ProcessGroup& group, ReduceScatteringGloo&) {
    const absl::Status s = group.StartReduceScatterSum({{at::ones({2})}});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("1 owner lists for 2 ranks"), absl::string_view::npos) << s;
  });
}

}  // namespace
}  // namespace strata::policies
#endif  // STRATA_TEST_WITH_GLOO
