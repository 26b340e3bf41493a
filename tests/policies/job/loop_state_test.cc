// The driver's loop state: the adaptive KL coefficient by hand.
#include "policies/job/loop_state.h"

#include "gtest/gtest.h"

namespace strata::policies {
namespace {

TEST(LoopStateTest, AdaptiveKlControllerMovesTowardsTarget) {
  KlController fixed(0.1, 0.0, 10000);
  fixed.Update(5.0, 256);
  EXPECT_DOUBLE_EQ(fixed.value(), 0.1);
  KlController adaptive(0.1, 1.0, 1000);
  adaptive.Update(2.0, 100);  // KL too high: error clipped to 0.2 -> x1.02
  EXPECT_NEAR(adaptive.value(), 0.102, 1e-12);
  adaptive.Update(0.5, 100);  // too low: -0.2 -> x0.98
  EXPECT_NEAR(adaptive.value(), 0.102 * 0.98, 1e-12);
}

}  // namespace
}  // namespace strata::policies
