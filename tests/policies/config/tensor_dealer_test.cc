#include "policies/config/tensor_dealer.h"

#include "gtest/gtest.h"

namespace strata::policies {
namespace {

TEST(TensorDealerTest, EachTensorGoesToTheRankWithTheFewestElementsLowestOnATie) {
  TensorDealer dealer(3);
  EXPECT_EQ(dealer.Deal(10), 0);  // all empty: the lowest
  EXPECT_EQ(dealer.Deal(4), 1);
  EXPECT_EQ(dealer.Deal(4), 2);  // 10, 4, 0
  EXPECT_EQ(dealer.Deal(1), 1);  // 10, 4, 4: the lowest of the tie
  EXPECT_EQ(dealer.Deal(0), 2);  // 10, 5, 4
  EXPECT_EQ(dealer.dealt(), (std::vector<int64_t>{10, 5, 4}));
  EXPECT_EQ(dealer.most(), 10);
}

// A big tensor met first (an embedding) fills one rank past an even share.
TEST(TensorDealerTest, TheFullestShardCanExceedAnEvenShare) {
  const std::vector<int64_t> tensors = {136, 1, 10, 10, 10, 10, 10, 10, 10, 10};
  EXPECT_EQ(FullestShard(tensors, 1), 217);
  EXPECT_EQ(FullestShard(tensors, 4), 136);  // the rest spread over ranks 1-3
  EXPECT_EQ(FullestShard({}, 2), 0);
}

}  // namespace
}  // namespace strata::policies
