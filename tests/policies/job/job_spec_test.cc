#include "policies/job/job_spec.h"

#include "gtest/gtest.h"

namespace strata::policies {
namespace {

constexpr char kRemax[] = R"(
algorithm: remax
models:
  actor: {path: out/sft}
  reward: {rule: vowel_fraction}
data: {train: prompts.jsonl}
train: {iterations: 5, lr: 1.0e-4}
output: {dir: out/remax}
)";

std::string ErrorOf(const std::string& yaml, std::vector<std::string> overrides = {}) {
  auto spec = ParseJobSpec(yaml, overrides, "job.yaml");
  return spec.ok() ? "" : std::string(spec.status().message());
}

TEST(JobSpecTest, ParsesDefaultsAndFields) {
  auto spec = ParseJobSpec(kRemax, {}, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->algorithm, Algorithm::kRemax);
  EXPECT_EQ(spec->actor.path, "out/sft");
  EXPECT_EQ(spec->reward.rule, "vowel_fraction");
  EXPECT_EQ(spec->train.iterations, 5);
  EXPECT_DOUBLE_EQ(spec->train.lr, 1e-4);
  EXPECT_EQ(spec->train.batch_size, 16);                 // default
  EXPECT_EQ(spec->checkpoint.dir, "out/remax/checkpoints");  // derived default
  EXPECT_EQ(spec->actor.placement.weights, offload::Tier::kDevice);
}

TEST(JobSpecTest, SetOverridesAnyFieldIncludingNewOnes) {
  auto spec = ParseJobSpec(kRemax,
                           {"train.iterations=6", "train.seed=9", "train.lr=0.5", "checkpoint.every=2",
                            "models.actor.placement.weights=host", "algorithm=ppo", "models.critic.path=c"},
                           "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->train.iterations, 6);
  EXPECT_EQ(spec->train.seed, 9u);
  EXPECT_DOUBLE_EQ(spec->train.lr, 0.5);
  EXPECT_EQ(spec->checkpoint.every, 2);
  EXPECT_EQ(spec->actor.placement.weights, offload::Tier::kHost);
  EXPECT_EQ(spec->algorithm, Algorithm::kPpo);
  EXPECT_FALSE(spec->memory.pin_host);  // default
  auto pinned = ParseJobSpec(kRemax, {"memory.pin_host=true"}, "job.yaml");
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_TRUE(pinned->memory.pin_host);
  EXPECT_EQ(spec->memory.device, "cpu");  // default
  auto gpu = ParseJobSpec(kRemax, {"memory.device=cuda:1"}, "job.yaml");
  ASSERT_TRUE(gpu.ok()) << gpu.status();  // whether it exists is the worker's check
  EXPECT_EQ(gpu->memory.device, "cuda:1");
}

TEST(JobSpecTest, ErrorsNameTheKey) {
  EXPECT_NE(ErrorOf(kRemax, {"train.iteratons=3"}).find("train.iteratons"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"train.iterations=many"}).find("train.iterations"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"train.lr=-1"}).find("train.lr"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"algorithm=dpo"}).find("algorithm"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"generation.top_p=1.5"}).find("generation.top_p"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"models.actor.placement.weights=gpu"}).find("models.actor.placement.weights"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"models.actor.placement.optimizer=device"}).find("placement"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"models.actor.placement.weights=nvme"}).find("memory.nvme_dir"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"models.actor.path="}).find("models.actor.path"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"output.dir="}).find("output.dir"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"bogus=1"}).find("bogus"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"memory.pin_host=3"}).find("memory.pin_host"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"memory.device=gpu"}).find("memory.device"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"noequals"}).find("noequals"), std::string::npos);
  EXPECT_NE(ErrorOf("algorithm: [remax"), "");  // malformed YAML
  EXPECT_NE(ErrorOf("- a\n- b\n").find("mapping"), std::string::npos);
  EXPECT_EQ(ErrorOf(kRemax), "");  // the unmodified spec is fine
  EXPECT_NE(ErrorOf(kRemax, {"train.batch_size=0"}).find("job.yaml"), std::string::npos);
}

TEST(JobSpecTest, PpoNeedsACriticOrRewardModel) {
  EXPECT_NE(ErrorOf(kRemax, {"algorithm=ppo"}).find("models.critic.path"), std::string::npos);
  EXPECT_EQ(ErrorOf(kRemax, {"algorithm=ppo", "models.reward.rule=", "models.reward.path=rm"}), "");
  EXPECT_NE(ErrorOf(kRemax, {"algorithm=ppo", "models.reward.path=rm", "models.critic.path=c", "ppo.minibatches=3"})
                .find("ppo.minibatches"),
            std::string::npos);
}

}  // namespace
}  // namespace strata::policies
