// The RL algorithms' phases against scripted WorkerGroups, and the driver's
// scalar state.
#include "policies/rl/rl_algorithms.h"

#include <cmath>

#include "gtest/gtest.h"

namespace strata::policies {
namespace {

// Answers every call with fixed, well-formed data.
class ScriptedWorkers final : public WorkerGroup {
 public:
  absl::StatusOr<std::vector<Rollout>> Generate(const RolloutRequest& request) override {
    std::vector<Rollout> out;
    for (size_t p = 0; p < request.prompts.size(); ++p) {
      out.push_back({static_cast<int64_t>(p), request.prompts[p], {5, 6}, {-1.0f, -1.0f}, false});
      if (request.with_greedy) out.push_back({static_cast<int64_t>(p), request.prompts[p], {5}, {-1.0f}, true});
    }
    return out;
  }
  absl::StatusOr<Scores> Score(const std::vector<Rollout>& rollouts, const ScoreRequest& request) override {
    Scores s;
    for (size_t i = 0; i < rollouts.size(); ++i) {
      s.rewards.push_back(rollouts[i].greedy || sampled_rewards.empty() ? greedy_reward
                                                                        : sampled_rewards[i % sampled_rewards.size()]);
    }
    if (request.reference_logprobs) {
      for (const auto& r : rollouts) s.reference_logprobs.emplace_back(r.response.size(), -1.0f);
    }
    return s;
  }
  absl::StatusOr<UpdateStats> Update(const PolicyUpdate&) override { return UpdateStats{}; }
  absl::StatusOr<TrainStats> TrainSft(const std::vector<TextPair>&) override { return TrainStats{}; }
  absl::StatusOr<TrainStats> TrainRewardModel(const std::vector<PreferencePair>&) override { return TrainStats{}; }
  absl::StatusOr<TrainStats> EvaluateRewardModel(const std::vector<PreferencePair>&) override { return TrainStats{}; }
  MemoryStats BeginPhase(const std::string&) override { return {}; }
  MemoryStats PhaseMemory(const std::string&) override { return {}; }
  absl::Status SaveCheckpoint(const std::string&) override { return absl::OkStatus(); }
  absl::Status LoadCheckpoint(const std::string&) override { return absl::OkStatus(); }
  absl::Status SaveOutput(const std::string&) override { return absl::OkStatus(); }

  std::vector<float> sampled_rewards;  // by rollout, cycled; empty: all greedy_reward
  float greedy_reward = 1.0f;
};

std::vector<BatchPrompt> Batch() { return {{0, {1, 2}}, {1, {3}}}; }

TEST(RlAlgorithmsTest, RemaxPhasesReportTheBatchObjective) {
  JobSpec spec;
  spec.algorithm = Algorithm::kRemax;
  auto remax = RlAlgorithm::Create(spec);
  ASSERT_TRUE(remax.ok()) << remax.status();
  ScriptedWorkers workers;
  auto gang = ProcessGroup::Solo();
  ASSERT_TRUE((*remax)->Rollout(workers, Batch(), 2, 0).ok());
  auto scored = (*remax)->Score(workers, *gang, {});
  ASSERT_TRUE(scored.ok()) << scored.status();
  // Every reward is 1 and the behaviour and reference log-probs agree.
  EXPECT_DOUBLE_EQ(scored->at("objective/scores"), 1.0);
  EXPECT_DOUBLE_EQ(scored->at("objective/greedy_scores"), 1.0);
  EXPECT_DOUBLE_EQ(scored->at("objective/kl"), 0.0);
  EXPECT_DOUBLE_EQ(scored->at("objective/response_tokens"), 2.0);
  auto updated = (*remax)->Update(workers, *gang, 0);
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_TRUE(updated->contains("loss/policy_avg"));
  // What was scored is used once.
  EXPECT_EQ((*remax)->Update(workers, *gang, 0).status().code(), absl::StatusCode::kFailedPrecondition);
}

// train.reward_normalization: batch whitens the sampled scores by the
// iteration's mean and std, and the greedy baseline by the same map;
// running folds every iteration into the driver's statistics (Chan et al.'s
// parallel update), which survive State / Restore.
TEST(RlAlgorithmsTest, RewardNormalizationBatchAndRunning) {
  JobSpec spec;
  spec.algorithm = Algorithm::kRemax;
  spec.remax.reward_clip = 0;
  ScriptedWorkers workers;
  workers.sampled_rewards = {1.0f, 3.0f};
  workers.greedy_reward = 2.0f;
  auto gang = ProcessGroup::Solo();
  auto score = [&](const JobSpec& s, const Metrics& params) {
    auto remax = RlAlgorithm::Create(s);
    EXPECT_TRUE(remax.ok());
    EXPECT_TRUE((*remax)->Rollout(workers, Batch(), 2, 0).ok());
    auto scored = (*remax)->Score(workers, *gang, params);
    EXPECT_TRUE(scored.ok()) << scored.status();
    return scored.ok() ? *scored : Metrics{};
  };
  Metrics raw = score(spec, {});
  EXPECT_DOUBLE_EQ(raw.at("objective/scores"), 2.0);
  EXPECT_FALSE(raw.contains("reward/raw_mean"));

  spec.train.reward_normalization = "batch";
  Metrics batch = score(spec, {});
  EXPECT_NEAR(batch.at("objective/scores"), 0.0, 1e-6);         // (1 - 2) / 1 and (3 - 2) / 1
  EXPECT_NEAR(batch.at("objective/greedy_scores"), 0.0, 1e-6);  // (2 - 2) / 1
  EXPECT_DOUBLE_EQ(batch.at("reward/raw_mean"), 2.0);
  EXPECT_DOUBLE_EQ(batch.at("reward/batch_var"), 1.0);

  spec.train.reward_normalization = "running";
  RlController controller(spec);
  Metrics first = score(spec, controller.ScoreParams());
  EXPECT_NEAR(first.at("objective/scores"), 0.0, 1e-6);  // nothing before: this batch alone
  controller.Observe(first);
  workers.sampled_rewards = {5.0f, 7.0f};
  Metrics second = score(spec, controller.ScoreParams());
  // All four scores {1, 3, 5, 7}: mean 4, variance 5.
  EXPECT_NEAR(second.at("objective/scores"), (6.0 - 4.0) / std::sqrt(5.0), 1e-5);
  controller.Observe(second);
  RlController resumed(spec);
  resumed.Restore(controller.State());
  EXPECT_EQ(resumed.ScoreParams(), controller.ScoreParams());
  EXPECT_DOUBLE_EQ(controller.ScoreParams().at("reward_count"), 4.0);
  EXPECT_DOUBLE_EQ(controller.ScoreParams().at("reward_mean"), 4.0);
  EXPECT_DOUBLE_EQ(controller.ScoreParams().at("reward_m2"), 20.0);
}

// Rollouts that do not fit the prompts asked for are an error, not a crash.
class ShortWorkers final : public WorkerGroup {
 public:
  absl::StatusOr<std::vector<Rollout>> Generate(const RolloutRequest&) override {
    return std::vector<Rollout>{{7, {1}, {5}, {-1.0f}, false}};
  }
  absl::StatusOr<Scores> Score(const std::vector<Rollout>&, const ScoreRequest&) override { return Scores{}; }
  absl::StatusOr<UpdateStats> Update(const PolicyUpdate&) override { return UpdateStats{}; }
  absl::StatusOr<TrainStats> TrainSft(const std::vector<TextPair>&) override { return TrainStats{}; }
  absl::StatusOr<TrainStats> TrainRewardModel(const std::vector<PreferencePair>&) override { return TrainStats{}; }
  absl::StatusOr<TrainStats> EvaluateRewardModel(const std::vector<PreferencePair>&) override { return TrainStats{}; }
  MemoryStats BeginPhase(const std::string&) override { return {}; }
  MemoryStats PhaseMemory(const std::string&) override { return {}; }
  absl::Status SaveCheckpoint(const std::string&) override { return absl::OkStatus(); }
  absl::Status LoadCheckpoint(const std::string&) override { return absl::OkStatus(); }
  absl::Status SaveOutput(const std::string&) override { return absl::OkStatus(); }
};

TEST(RlAlgorithmsTest, RolloutsThatDoNotFitTheBatchAreAnError) {
  JobSpec spec;
  spec.algorithm = Algorithm::kPpo;
  auto ppo = RlAlgorithm::Create(spec);
  ASSERT_TRUE(ppo.ok()) << ppo.status();
  ShortWorkers workers;
  const absl::Status s = (*ppo)->Rollout(workers, Batch(), 2, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("1 responses for 2 prompts"), std::string::npos) << s;
}

TEST(RlAlgorithmsTest, PpoControllerCarriesTheKlCoefficient) {
  JobSpec spec;
  spec.algorithm = Algorithm::kPpo;
  spec.ppo.kl_coef = 0.1;
  spec.ppo.kl_target = 1.0;
  spec.ppo.kl_horizon = 100;
  RlController controller(spec);
  EXPECT_DOUBLE_EQ(controller.ScoreParams().at("kl_coef"), 0.1);
  controller.Observe({{"objective/kl", 10.0}});  // far above target: the coefficient grows
  const double grown = controller.ScoreParams().at("kl_coef");
  EXPECT_GT(grown, 0.1);
  RlController resumed(spec);
  resumed.Restore(controller.State());
  EXPECT_DOUBLE_EQ(resumed.ScoreParams().at("kl_coef"), grown);
  // Other algorithms carry nothing.
  spec.algorithm = Algorithm::kRemax;
  EXPECT_TRUE(RlController(spec).ScoreParams().empty());
}

TEST(RlAlgorithmsTest, GlobalMeansOfOneRankAreItsMeans) {
  GlobalMeans means;
  means.Add("a", 6.0, 3.0);
  means.Add("b", 1.0, 4.0);
  Metrics m;
  ASSERT_TRUE(means.Reduce(*ProcessGroup::Solo(), m).ok());
  EXPECT_DOUBLE_EQ(m.at("a"), 2.0);
  EXPECT_DOUBLE_EQ(m.at("b"), 0.25);
}

}  // namespace
}  // namespace strata::policies
