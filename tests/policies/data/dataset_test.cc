// Reading a job's JSONL records and their fields by key: errors name the
// file, line and key.
#include "policies/data/dataset.h"

#include "gtest/gtest.h"
#include "tests/testutil/testutil.h"

namespace strata::policies {
namespace {

using ::strata::testing::TempDir;
using ::strata::testing::WriteTextFile;

Record Line(const std::string& json) { return {nlohmann::ordered_json::parse(json), "train.jsonl:7"}; }

TEST(DatasetTest, ReadsEveryRecordAndSkipsBlankLines) {
  TempDir dir;
  const std::string path = dir.Join("train.jsonl");
  WriteTextFile(path, "{\"prompt\": \"a\", \"n\": 1}\n\n  \t\r\n{\"prompt\": \"b\"}");  // no final newline
  auto rows = ReadJsonl(path);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].fields["prompt"], "a");
  EXPECT_EQ((*rows)[0].fields["n"], 1);
  EXPECT_EQ((*rows)[0].where, path + ":1");
  EXPECT_EQ((*rows)[1].fields["prompt"], "b");
  EXPECT_EQ((*rows)[1].where, path + ":4");
}

TEST(DatasetTest, ALineThatIsNotAnObjectIsNamed) {
  TempDir dir;
  const std::string path = dir.Join("train.jsonl");
  for (const char* bad : {"{\"prompt\": ", "[\"prompt\"]", "\"prompt\""}) {
    WriteTextFile(path, std::string("{\"prompt\": \"a\"}\n") + bad + "\n");
    auto rows = ReadJsonl(path);
    EXPECT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(rows.status().message(), path + ":2: not a JSON object") << bad;
  }
}

TEST(DatasetTest, AFileWithoutRecordsIsRefused) {
  TempDir dir;
  const std::string path = dir.Join("empty.jsonl");
  WriteTextFile(path, "\n \n");
  auto rows = ReadJsonl(path);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rows.status().message(), path + ": no examples");
}

TEST(DatasetTest, AMissingFileIsNotFound) {
  TempDir dir;
  auto rows = ReadJsonl(dir.Join("absent.jsonl"));
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kNotFound);
}

TEST(DatasetTest, ATextFieldIsAStringOrAConversation) {
  auto text = RequireText(Line(R"({"q": "hi"})"), "q");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_FALSE(text->is_conversation());
  EXPECT_EQ(text->text, "hi");
  // Extra fields of a message pass through; content may be null (a tool call).
  auto conversation = RequireText(
      Line(R"({"q": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": []}]})"),
      "q");
  ASSERT_TRUE(conversation.ok()) << conversation.status();
  ASSERT_TRUE(conversation->is_conversation());
  EXPECT_TRUE(conversation->messages[1].contains("tool_calls"));
  auto absent = ReadText(Line(R"({"q": null})"), "q");
  ASSERT_TRUE(absent.ok());
  EXPECT_FALSE(absent->has_value());
}

TEST(DatasetTest, AMalformedFieldIsNamedWithItsLineAndKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"other": "x"})", "train.jsonl:7: key 'q' is missing"},
      {R"({"q": 3})",
       "train.jsonl:7: key 'q' must be a string or a conversation (a list of {\"role\", \"content\"} messages)"},
      {R"({"q": []})", "train.jsonl:7: key 'q' is an empty conversation"},
      {R"({"q": ["hi"]})", "train.jsonl:7: key 'q' message 0 is not an object"},
      {R"({"q": [{"content": "hi"}]})", "train.jsonl:7: key 'q' message 0 has no \"role\" string"},
      {R"({"q": [{"role": "user", "content": "a"}, {"role": "user"}]})",
       "train.jsonl:7: key 'q' message 1 has no \"content\""},
      {R"({"q": [{"role": "user", "content": 5}]})",
       "train.jsonl:7: key 'q' message 0's \"content\" is not a string, null or a list of parts"},
  };
  for (const auto& [line, message] : cases) {
    auto value = RequireText(Line(line), "q");
    EXPECT_EQ(value.status().code(), absl::StatusCode::kInvalidArgument) << line;
    EXPECT_EQ(value.status().message(), message) << line;
  }
}

TEST(DatasetTest, ALabelIsAStringOrANumberAsItsText) {
  EXPECT_EQ(*ReadLabel(Line(R"({"a": "42"})"), "a"), "42");
  EXPECT_EQ(*ReadLabel(Line(R"({"a": 42})"), "a"), "42");
  EXPECT_EQ(*ReadLabel(Line(R"({"a": 0.5})"), "a"), "0.5");
  EXPECT_EQ(*ReadLabel(Line(R"({})"), ""), "");  // no label_key: no label
  EXPECT_EQ(ReadLabel(Line(R"({})"), "a").status().message(), "train.jsonl:7: key 'a' (the label) is missing");
  EXPECT_EQ(ReadLabel(Line(R"({"a": [1]})"), "a").status().message(),
            "train.jsonl:7: key 'a' (the label) must be a string or a number");
}

}  // namespace
}  // namespace strata::policies
