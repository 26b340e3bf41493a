// How the driver merges the ranks' phase replies: rank 0's global metrics,
// the largest per-rank measurement, and means whose shares each rank sent;
// and which of the ranks' errors it reports.
#include "services/driver/job_runner.h"

#include "gtest/gtest.h"

namespace strata::services {
namespace {

PhaseReply Reply(policies::Metrics metrics) { return PhaseReply{std::move(metrics), ""}; }

TEST(MergeRepliesTest, TakesRankZerosGlobalsAndTheLargestMeasurement) {
  auto merged = MergeReplies({Reply({{"loss/policy_avg", 0.5}, {"time/update_s", 2.0}}),
                              Reply({{"loss/policy_avg", 0.5}, {"time/update_s", 3.0}})});
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->metrics.at("loss/policy_avg"), 0.5);
  EXPECT_EQ(merged->metrics.at("time/update_s"), 3.0);
}

TEST(MergeRepliesTest, MeanSharesBecomeTheGangsMean) {
  // Rank 0 scored 3 responses for 1.5 in all, rank 1 one response for 0.9:
  // the gang's mean is 2.4 / 4, not the mean of the ranks' means.
  policies::Metrics rank0, rank1;
  AddMeanShare("eval/score", 1.5, 3, rank0);
  AddMeanShare("eval/score", 0.9, 1, rank1);
  rank0["time/evaluate_s"] = 1;
  auto merged = MergeReplies({Reply(rank0), Reply(rank1)});
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_DOUBLE_EQ(merged->metrics.at("eval/score"), 0.6);
  EXPECT_EQ(merged->metrics.size(), 2u) << "the shares themselves are not metrics of the job";
  for (const auto& [key, value] : merged->metrics) EXPECT_FALSE(IsMeanShare(key)) << key;
}

TEST(MergeRepliesTest, ARankWithNothingToCountAddsNothing) {
  policies::Metrics rank0, rank1;
  AddMeanShare("eval/score", 1.2, 2, rank0);
  AddMeanShare("eval/score", 0, 0, rank1);
  auto merged = MergeReplies({Reply(rank0), Reply(rank1)});
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_DOUBLE_EQ(merged->metrics.at("eval/score"), 0.6);
  // Nothing counted anywhere: 0, as the collective it replaces gave.
  AddMeanShare("eval/score", 0, 0, rank0);
  merged = MergeReplies({Reply(rank0), Reply(rank1)});
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->metrics.at("eval/score"), 0.0);
}

TEST(MergeRepliesTest, AMalformedShareNamesTheRank) {
  policies::Metrics whole, no_count, extra, negative;
  AddMeanShare("eval/score", 1, 2, whole);
  no_count = {{"mean_sum/eval/score", 1}};
  extra = whole;
  AddMeanShare("eval/loss", 1, 2, extra);
  AddMeanShare("eval/score", 1, -2, negative);
  for (const auto& [rank1, expected] : std::vector<std::pair<policies::Metrics, std::string>>{
           {no_count, "rank 1: malformed reply: mean_count/eval/score is missing"},
           {{}, "rank 1: malformed reply: mean_sum/eval/score is missing"},
           {extra, "rank 1: malformed reply: mean_count/eval/loss which rank 0 lacks"},
           {negative, "rank 1: malformed reply: mean_count/eval/score = -2"}}) {
    auto merged = MergeReplies({Reply(whole), Reply(rank1)});
    ASSERT_FALSE(merged.ok()) << expected;
    EXPECT_EQ(merged.status().code(), absl::StatusCode::kInternal);
    EXPECT_NE(merged.status().message().find(expected), std::string::npos) << merged.status();
  }
}

TEST(MergeRepliesTest, EvaluationEndsInNoCollective) {
  // The driver waits for a slow evaluating rank while it answers (RemoteGang).
  EXPECT_FALSE(PhaseEndsInCollective("evaluate"));
  EXPECT_FALSE(PhaseEndsInCollective("rollout"));
  EXPECT_TRUE(PhaseEndsInCollective("score"));
  EXPECT_TRUE(PhaseEndsInCollective("update"));
}

TEST(FirstCauseTest, ARanksOwnErrorExplainsTheOthersTimeouts) {
  const absl::Status own = absl::DataLossError("rank 1: disk full");
  EXPECT_EQ(FirstCause({absl::OkStatus(), absl::OkStatus()}), absl::OkStatus());
  EXPECT_EQ(FirstCause({absl::DeadlineExceededError("rank 0 waited"), own, absl::UnavailableError("rank 2")}), own);
  EXPECT_EQ(FirstCause({absl::DeadlineExceededError("rank 0 waited"), own}, /*ranks_share_a_process=*/true), own);
}

// Workers in other processes: a dead one's UNAVAILABLE may be the cause of
// the others' timeouts, so the first in rank order is reported. Ranks of
// one process cannot die: a closed connection follows a peer's deadline.
TEST(FirstCauseTest, InOneProcessTheDeadlineIsTheCause) {
  const absl::Status closed = absl::UnavailableError("rank 0: connection closed by peer");
  const absl::Status deadline = absl::DeadlineExceededError("rank 1: all-reduce timed out");
  EXPECT_EQ(FirstCause({closed, deadline}), closed);
  EXPECT_EQ(FirstCause({closed, deadline}, /*ranks_share_a_process=*/true), deadline);
  EXPECT_EQ(FirstCause({closed, absl::UnavailableError("rank 1")}, /*ranks_share_a_process=*/true), closed);
}

}  // namespace
}  // namespace strata::services
