// A response ends at the model's end-of-turn ids: config.json's and
// generation_config.json's eos_token_id, the tokenizer's EOS and the spec's
// generation.stop_token_ids. The actor trains on the stop id it produced;
// the text rewards read is decoded without it.
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "policies/config/llama_config.h"
#include "policies/data/chat_tokens.h"
#include "policies/model/llama.h"
#include "services/rank/local_worker_group.h"
#include "tests/testutil/testutil.h"

namespace strata::services {
namespace {

class EndOfTurnTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = dir_.Join("model");
    auto config = policies::LlamaConfig::FromJson(R"({
      "vocab_size": 259, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
      "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})",
                                                  "tiny config");
    ASSERT_TRUE(config.ok()) << config.status();
    auto m = policies::LlamaModel::RandomInit(*config, policies::LlamaHead::kLanguageModel, at::kFloat, 3);
    std::filesystem::create_directories(model_);
    ASSERT_TRUE(m->Save(model_).ok());
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      std::filesystem::copy_file(testing::SourcePath(std::string("examples/tiny/data/") + f), model_ + "/" + f);
    }
    testing::WriteTextFile(model_ + "/generation_config.json", R"({"eos_token_id": [2, 5], "do_sample": true})");
  }

  policies::JobSpec Spec(const std::string& stops) {
    auto spec = policies::ParseJobSpec(absl::StrCat(R"(
algorithm: remax
models:
  actor: {path: )",
                                                    model_, R"(}
  reward: {rule: vowel_fraction}
data: {train: prompts.jsonl}
generation: {max_new_tokens: 10, stop_token_ids: )",
                                                    stops, R"(}
memory: {host_mib: 64}
output: {dir: )",
                                                    dir_.Join("out"), "}\n"),
                                       {}, "test spec");
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }

  // The greedy response to `prompt` of a group over Spec(stops).
  static std::vector<int32_t> Greedy(LocalWorkerGroup& group, const std::vector<int32_t>& prompt) {
    policies::RolloutRequest request;
    request.prompts = {prompt};
    request.sampling.greedy = true;
    request.sampling.max_new_tokens = 10;
    auto rollouts = group.Generate(request);
    EXPECT_TRUE(rollouts.ok()) << rollouts.status();
    return rollouts.ok() ? (*rollouts)[0].response : std::vector<int32_t>{};
  }

  testing::TempDir dir_;
  std::string model_;
};

TEST_F(EndOfTurnTest, StopIdsComeFromEverySourceOnce) {
  auto group = LocalWorkerGroup::Create(Spec("[7, 5]"));
  ASSERT_TRUE(group.ok()) << group.status();
  // config.json [2], generation_config.json [2, 5], the tokenizer's </s> (2), the spec's [7, 5].
  EXPECT_EQ((*group)->stop_token_ids(), (std::vector<int64_t>{2, 5, 7}));
}

TEST_F(EndOfTurnTest, AResponseEndsAtAStopIdItKeepsAndItsTextLeavesOut) {
  auto free = LocalWorkerGroup::Create(Spec("[]"));
  ASSERT_TRUE(free.ok()) << free.status();
  const std::vector<int32_t> prompt = (*free)->tokenizer().EncodeForPrompt("snow fire =>");
  const std::vector<int32_t> run = Greedy(**free, prompt);
  // A token the free run produces third, which the spec then names a stop id.
  ASSERT_GE(run.size(), 3u);
  const int32_t stop = run[2];
  ASSERT_NE(stop, run[0]);
  ASSERT_NE(stop, run[1]);
  const std::vector<int64_t> free_stops = (*free)->stop_token_ids();
  ASSERT_EQ(std::find(free_stops.begin(), free_stops.end(), stop), free_stops.end()) << "pick another prompt";

  auto stopping = LocalWorkerGroup::Create(Spec(absl::StrCat("[", stop, "]")));
  ASSERT_TRUE(stopping.ok()) << stopping.status();
  const std::vector<int32_t> response = Greedy(**stopping, prompt);
  EXPECT_EQ(response, std::vector<int32_t>(run.begin(), run.begin() + 3));  // the stop id is trained on
  const policies::Tokenizer& tokenizer = (*stopping)->tokenizer();
  EXPECT_EQ(policies::ResponseText(tokenizer, response, (*stopping)->stop_token_ids()),
            tokenizer.Decode({run[0], run[1]}));
}

}  // namespace
}  // namespace strata::services
