#include "policies/job/seeds.h"

#include <set>

#include "gtest/gtest.h"

namespace strata::policies {
namespace {

// Every job's batches and samples depend on these values: they are pinned,
// computed apart from this code (splitmix64 written out in Python).
TEST(SeedsTest, ValuesAreThoseEveryJobSoFarDrewWith) {
  EXPECT_EQ(IterationSeed(42, 0), 0xb54b3c40881e2907ULL);
  EXPECT_EQ(IterationSeed(42, 7), 0x691cfb1624b11b0bULL);
  EXPECT_EQ(EvaluationSeed(42), 0x134f7096918175ceULL);
  EXPECT_EQ(UpdateShuffleSeed(42, 3), 0x6458817d5b2da3efULL);
  EXPECT_EQ(EpochShuffleSeed(42, 2), 0xcdd069768ULL);
  EXPECT_EQ(ModelInitSeed(42), 42u);
}

TEST(SeedsTest, PromptsAndSamplesDrawFromStreamsOfTheirOwn) {
  const uint64_t batch = IterationSeed(7, 5);
  std::set<uint64_t> seen = {batch, UpdateShuffleSeed(7, 5)};
  for (int64_t prompt = 0; prompt < 16; ++prompt) {
    const uint64_t prompt_seed = PromptSeed(batch, prompt);
    EXPECT_TRUE(seen.insert(prompt_seed).second) << prompt;
    for (int64_t sample = 0; sample < 4; ++sample) {
      EXPECT_TRUE(seen.insert(SampleSeed(prompt_seed, sample)).second) << prompt << "/" << sample;
    }
  }
}

}  // namespace
}  // namespace strata::policies
