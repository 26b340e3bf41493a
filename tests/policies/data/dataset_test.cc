// Reading a job's JSONL records: errors name the file, line and field.
#include "policies/data/dataset.h"

#include "gtest/gtest.h"
#include "tests/testutil/testutil.h"

namespace strata::policies {
namespace {

using ::strata::testing::TempDir;
using ::strata::testing::WriteTextFile;

TEST(DatasetTest, ReadsEveryRecordAndSkipsBlankLines) {
  TempDir dir;
  const std::string path = dir.Join("train.jsonl");
  WriteTextFile(path, "{\"prompt\": \"a\", \"n\": 1}\n\n  \t\r\n{\"prompt\": \"b\"}");  // no final newline
  auto rows = ReadJsonl(path, {"prompt"});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0]["prompt"], "a");
  EXPECT_EQ((*rows)[0]["n"], 1);
  EXPECT_EQ((*rows)[1]["prompt"], "b");
}

TEST(DatasetTest, ALineThatIsNotAnObjectIsNamed) {
  TempDir dir;
  const std::string path = dir.Join("train.jsonl");
  for (const char* bad : {"{\"prompt\": ", "[\"prompt\"]", "\"prompt\""}) {
    WriteTextFile(path, std::string("{\"prompt\": \"a\"}\n") + bad + "\n");
    auto rows = ReadJsonl(path, {"prompt"});
    EXPECT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(rows.status().message(), path + ":2: not a JSON object") << bad;
  }
}

TEST(DatasetTest, AMissingOrNonStringFieldIsNamed) {
  TempDir dir;
  const std::string path = dir.Join("pairs.jsonl");
  WriteTextFile(path, "{\"prompt\": \"p\", \"chosen\": \"c\"}\n");
  auto missing = ReadJsonl(path, {"prompt", "chosen", "rejected"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.status().message(), path + ":1: field 'rejected' (a string) is missing");
  WriteTextFile(path, "{\"prompt\": 3}\n");
  auto number = ReadJsonl(path, {"prompt"});
  EXPECT_EQ(number.status().message(), path + ":1: field 'prompt' (a string) is missing");
}

TEST(DatasetTest, AFileWithoutRecordsIsRefused) {
  TempDir dir;
  const std::string path = dir.Join("empty.jsonl");
  WriteTextFile(path, "\n \n");
  auto rows = ReadJsonl(path, {});
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rows.status().message(), path + ": no examples");
}

TEST(DatasetTest, AMissingFileIsNotFound) {
  TempDir dir;
  auto rows = ReadJsonl(dir.Join("absent.jsonl"), {"prompt"});
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace strata::policies
