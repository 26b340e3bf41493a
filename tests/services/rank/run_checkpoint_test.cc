// A run's checkpoints on disk: the names, what counts as complete, the
// optimizer shards, and a gang of one's commit.
#include "services/rank/run_checkpoint.h"

#include <filesystem>

#include "base/file.h"
#include "base/interrupt.h"
#include "gtest/gtest.h"
#include "tests/testutil/testutil.h"

namespace strata::services {
namespace {

using ::strata::testing::TempDir;
using ::strata::testing::WriteTextFile;

void MakeDir(const std::string& path) { std::filesystem::create_directories(path); }

TEST(RunCheckpointTest, TheNewestCompleteCheckpointIsTheLatest) {
  TempDir dir;
  auto none = LatestCheckpoint(dir.Join("absent"));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->first, "");
  EXPECT_EQ(none->second, -1);
  for (const char* name : {"iter-000002", "iter-000010", "iter-000011", "iter-000012.tmp-0000abcd", "other"}) {
    MakeDir(dir.Join(name));
  }
  for (const char* name : {"iter-000002", "iter-000010", "iter-000012.tmp-0000abcd", "other"}) {
    WriteTextFile(dir.Join(name) + "/state.json", "{}");
  }
  // iter-000011 lacks state.json; the .tmp one is unfinished.
  auto latest = LatestCheckpoint(dir.path());
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->first, dir.Join("iter-000010"));
  EXPECT_EQ(latest->second, 10);
}

TEST(RunCheckpointTest, RemoveCheckpointsLeavesWhatIsNotOne) {
  TempDir dir;
  for (const char* name : {"iter-000001", "iter-000002.tmp-00000001", "notes"}) MakeDir(dir.Join(name));
  ASSERT_TRUE(RemoveCheckpoints(dir.path()).ok());
  EXPECT_FALSE(IsDirectory(dir.Join("iter-000001")));
  EXPECT_FALSE(IsDirectory(dir.Join("iter-000002.tmp-00000001")));
  EXPECT_TRUE(IsDirectory(dir.Join("notes")));
}

TEST(RunCheckpointTest, OptimizerShardsAreOneGangsWhole) {
  TempDir dir;
  EXPECT_EQ(OptimizerStatePath(dir.path(), 0, 1), dir.Join("optimizer.safetensors"));
  EXPECT_EQ(OptimizerStatePath(dir.path(), 1, 2), dir.Join("optimizer-rank1-of-2.safetensors"));
  EXPECT_EQ(OptimizerStateFiles(dir.path()).status().code(), absl::StatusCode::kDataLoss);

  WriteTextFile(OptimizerStatePath(dir.path(), 0, 2), "");
  auto missing = OptimizerStateFiles(dir.path());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(missing.status().message().find("optimizer-rank1-of-2.safetensors is missing (rank 1 of 2)"),
            std::string::npos)
      << missing.status();

  WriteTextFile(OptimizerStatePath(dir.path(), 1, 2), "");
  auto whole = OptimizerStateFiles(dir.path());
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(*whole,
            (std::vector<std::string>{OptimizerStatePath(dir.path(), 0, 2), OptimizerStatePath(dir.path(), 1, 2)}));

  WriteTextFile(OptimizerStatePath(dir.path(), 0, 1), "");
  auto mixed = OptimizerStateFiles(dir.path());
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(mixed.status().message().find("gangs of 1 and 2 ranks together"), std::string::npos) << mixed.status();
}

TEST(RunCheckpointTest, AGangOfOneCommitsStateLastAndRemovesUnfinishedOnes) {
  TempDir dir;
  MakeDir(dir.Join("iter-000001.tmp"));  // left by an earlier run
  auto gang = policies::ProcessGroup::Solo();
  RunCheckpoints checkpoints(dir.path(), *gang);
  ASSERT_TRUE(checkpoints.Start().ok());
  EXPECT_FALSE(IsDirectory(dir.Join("iter-000001.tmp")));

  CheckpointState state;
  state.metrics_lines = 3;
  state.run_id = "job-1";
  state.algorithm["kl_coef"] = 0.5;
  std::string written_in;
  CheckpointWriters writers;
  writers.optimizer_states = [&](const std::string& at) {
    written_in = at;
    auto model = MakeModelCheckpointDirectory(at, "actor");
    if (!model.ok()) return model.status();
    return WriteFileAtomically(OptimizerStatePath(*model, 0, 1), "states");
  };
  writers.weights = [&](const std::string& at) {
    EXPECT_FALSE(IsRegularFile(at + "/state.json"));  // state.json comes last
    return WriteFileAtomically(ModelCheckpointDirectory(at, "actor") + "/weights", "weights");
  };
  auto committed = checkpoints.Commit(3, state, writers);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(*committed, dir.Join("iter-000003"));
  EXPECT_EQ(written_in.rfind(dir.Join("iter-000003.tmp-"), 0), 0u) << written_in;
  EXPECT_FALSE(IsDirectory(written_in));
  EXPECT_TRUE(IsRegularFile(dir.Join("iter-000003/actor/optimizer.safetensors")));
  EXPECT_TRUE(IsRegularFile(dir.Join("iter-000003/actor/weights")));
  auto text = ReadFileToString(dir.Join("iter-000003/state.json"));
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, R"({"algorithm":{"kl_coef":0.5},"iteration":3,"metrics_lines":3,"run_id":"job-1","world_size":1})");
  auto read = ReadCheckpointState(*committed, 3);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->metrics_lines, 3);
  EXPECT_EQ(read->run_id, "job-1");
  EXPECT_EQ(read->algorithm, state.algorithm);
}

TEST(RunCheckpointTest, AnInterruptedCommitLeavesNothing) {
  TempDir dir;
  auto gang = policies::ProcessGroup::Solo();
  RunCheckpoints checkpoints(dir.path(), *gang);
  ASSERT_TRUE(checkpoints.Start().ok());
  CheckpointWriters writers;
  writers.optimizer_states = [](const std::string&) { return absl::OkStatus(); };
  writers.weights = [](const std::string&) {
    RequestInterrupt();  // as an Unload does while rank 0 writes
    return absl::OkStatus();
  };
  auto committed = checkpoints.Commit(1, CheckpointState{}, writers);
  ClearInterrupt();
  EXPECT_FALSE(committed.ok());
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace strata::services
