// What an iteration reports about memory, against a scripted WorkerGroup.
#include "policies/rl/rl_algorithms.h"

#include "gtest/gtest.h"

namespace strata::policies {
namespace {

// Answers every call with fixed, well-formed data. Each BeginPhase reports
// the ended phase's device peak as 10 x the number of phases started so far,
// except for the phase that was open before the iteration (evaluation, a
// checkpoint, the previous update), which reports `before_iteration`.
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
    s.rewards.assign(rollouts.size(), 1.0f);
    if (request.reference_logprobs) {
      for (const auto& r : rollouts) s.reference_logprobs.emplace_back(r.response.size(), -1.0f);
    }
    return s;
  }
  absl::StatusOr<UpdateStats> Update(const PolicyUpdate&) override { return UpdateStats{}; }
  absl::StatusOr<TrainStats> TrainSft(const std::vector<TextPair>&) override { return TrainStats{}; }
  absl::StatusOr<TrainStats> TrainRewardModel(const std::vector<PreferencePair>&) override { return TrainStats{}; }
  absl::StatusOr<TrainStats> EvaluateRewardModel(const std::vector<PreferencePair>&) override {
    return TrainStats{};
  }
  MemoryStats BeginPhase(const std::string&) override {
    MemoryStats ended;
    ended.peak_bytes["device"] = phases_started_ == 0 ? before_iteration : 10 * phases_started_;
    ++phases_started_;
    return ended;
  }
  MemoryStats PhaseMemory(const std::string&) override {
    MemoryStats current;
    current.peak_bytes["device"] = 10 * phases_started_;
    return current;
  }
  absl::Status SaveCheckpoint(const std::string&) override { return absl::OkStatus(); }
  absl::Status LoadCheckpoint(const std::string&) override { return absl::OkStatus(); }
  absl::Status SaveOutput(const std::string&) override { return absl::OkStatus(); }

  int64_t before_iteration = int64_t{1} << 40;

 private:
  int64_t phases_started_ = 0;
};

TEST(RlAlgorithmsTest, IterationPeaksCoverItsOwnPhasesOnly) {
  JobSpec spec;
  spec.algorithm = Algorithm::kRemax;
  auto remax = RlAlgorithm::Create(spec);
  ASSERT_TRUE(remax.ok()) << remax.status();
  ScriptedWorkers workers;
  auto metrics = (*remax)->Iterate(workers, {{1, 2}, {3}}, 0);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  // rollout ends at 10, score at 20, update (asked at the end) at 30; the
  // 1 TiB of whatever ran before the iteration is not this iteration's.
  EXPECT_EQ(metrics->at("memory/device_peak_bytes"), 30.0);
}

}  // namespace
}  // namespace strata::policies
