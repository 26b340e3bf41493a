// How many continuations a rank's rollout engine decodes at once: the
// spec's limit, or fewer where the default KV pool would not fit
// memory.device_mib beside the rest (the planner's rollout_concurrency).
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "policies/job/hardware_figures.h"
#include "policies/job/memory_plan.h"
#include "services/rank/local_worker_group.h"
#include "tests/testutil/testutil.h"

namespace strata::services {
namespace {

// GRPO over the tiny example model: 16 prompts x 4 samples.
policies::JobSpec Spec(const std::vector<std::string>& overrides) {
  const std::string& model = testing::TinyConfigDir();
  const std::string yaml = "algorithm: grpo\nmodels:\n  actor: {path: " + model + "}\n  reference: {path: " + model +
                           "}\n  reward: {path: " + model +
                           "}\ndata: {train: p.jsonl, max_prompt_tokens: 16}\ntrain: {batch_size: 16}\n"
                           "group: {samples_per_prompt: 4}\ngeneration: {max_new_tokens: 24}\noutput: {dir: out}\n";
  auto spec = policies::ParseJobSpec(yaml, overrides, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

int64_t RolloutPeak(const policies::JobSpec& spec) {
  return policies::PredictJob(spec, *policies::JobModels(spec), policies::BuiltInHardwareFigures(), 1)
      .phases.at("rollout")
      .peak[0];
}

TEST(RolloutConcurrencyTest, TheSpecsLimitOrTheMicroBatch) {
  EXPECT_EQ(RolloutConcurrency(Spec({})), 0) << "no limit and no budget: every continuation at once";
  EXPECT_EQ(RolloutConcurrency(Spec({"train.micro_batch_size=4"})), 4);
  EXPECT_EQ(RolloutConcurrency(Spec({"train.micro_batch_size=4", "generation.max_concurrency=8"})), 8);
}

TEST(RolloutConcurrencyTest, TheDefaultPoolTakesWhatTheDeviceBudgetLeaves) {
  // A budget between the rollout's peak one at a time and all 64 at once.
  const int64_t least = RolloutPeak(Spec({"generation.max_concurrency=1"}));
  const int64_t most = RolloutPeak(Spec({}));
  const std::string budget = "memory.device_mib=" + std::to_string((least + (most - least) / 2) >> 20);
  const int64_t bounded = RolloutConcurrency(Spec({budget}));
  EXPECT_GT(bounded, 1);
  EXPECT_LT(bounded, 64);
  EXPECT_EQ(RolloutConcurrency(Spec({budget, "generation.max_concurrency=" + std::to_string(bounded + 5)})), bounded)
      << "the budget's bound is the tighter";
  EXPECT_EQ(RolloutConcurrency(Spec({budget, "train.micro_batch_size=2"})), 2) << "the spec's is the tighter";
  // A pool the spec sizes bounds itself (the engine admits what it holds).
  EXPECT_EQ(RolloutConcurrency(Spec({budget, "generation.kv_pool_mib=1"})), 0);
  // A budget the whole rollout fits leaves the limit alone.
  EXPECT_EQ(RolloutConcurrency(Spec({"memory.device_mib=" + std::to_string((most >> 20) + 1)})), 0);
}

}  // namespace
}  // namespace strata::services
