// Rank 0's metrics file: a fresh run empties it, a resumed one keeps the
// lines its checkpoint follows and refuses to append after a broken one.
#include "services/rank/metrics_log.h"

#include "base/file.h"
#include "gtest/gtest.h"
#include "tests/testutil/testutil.h"

namespace strata::services {
namespace {

using ::strata::testing::TempDir;
using ::strata::testing::WriteTextFile;

std::string Read(const std::string& path) {
  auto text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

TEST(MetricsLogTest, AFreshRunStartsEmptyAndAppendsLines) {
  TempDir dir;
  const std::string path = dir.Join("metrics.jsonl");
  WriteTextFile(path, "{\"iteration\": 0}\n");
  MetricsLog log(dir.path(), "");
  ASSERT_TRUE(log.Start(std::nullopt).ok());
  EXPECT_EQ(Read(path), "");
  ASSERT_TRUE(log.Append("{\"iteration\": 0, \"loss\": 1.5}").ok());
  EXPECT_EQ(Read(path), "{\"iteration\": 0, \"loss\": 1.5}\n");
  EXPECT_TRUE(IsDirectory(dir.Join("tensorboard")));
}

TEST(MetricsLogTest, AResumedRunKeepsTheLinesItsCheckpointFollows) {
  TempDir dir;
  const std::string path = dir.Join("elsewhere.jsonl");
  WriteTextFile(path, "{\"iteration\": 0}\n{\"iteration\": 1}\n{\"iteration\": 2}\n");
  MetricsLog log(dir.path(), path);
  ASSERT_TRUE(log.Start(2).ok());
  EXPECT_EQ(Read(path), "{\"iteration\": 0}\n{\"iteration\": 1}\n");
}

TEST(MetricsLogTest, ALineCutShortBeforeTheCountIsDataLoss) {
  TempDir dir;
  const std::string path = dir.Join("metrics.jsonl");
  WriteTextFile(path, "{\"iteration\": 0}\n{\"iter");
  MetricsLog log(dir.path(), "");
  const absl::Status started = log.Start(2);
  EXPECT_EQ(started.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(started.message().find("line 2 is missing or cut short"), std::string::npos) << started;
}

}  // namespace
}  // namespace strata::services
