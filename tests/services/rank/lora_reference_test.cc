// With LoRA on the actor, the reference is the actor's own base with the
// adapters off: loaded once, and scoring what a separate plain load of the
// base scores, however far the adapters have trained.
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "policies/config/llama_config.h"
#include "policies/model/llama.h"
#include "policies/model/lora.h"
#include "policies/model/peft_adapter.h"
#include "services/rank/local_worker_group.h"
#include "tests/testutil/testutil.h"

namespace strata::services {
namespace {

class LoraReferenceTest : public ::testing::Test {
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
  }

  policies::JobSpec Spec(const std::string& actor_extra) {
    auto spec = policies::ParseJobSpec(absl::StrCat(R"(
algorithm: remax
models:
  actor: {path: )",
                                                    model_, actor_extra, R"(}
  reward: {rule: vowel_fraction}
data: {train: prompts.jsonl}
generation: {max_new_tokens: 8}
train: {lr: 0.05}
memory: {host_mib: 64}
output: {dir: )",
                                                    dir_.Join("out"), "}\n"),
                                       {}, "test spec");
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }

  // Rollouts of the group's actor for three prompts.
  static std::vector<policies::Rollout> Rollouts(LocalWorkerGroup& group) {
    policies::RolloutRequest request;
    for (const char* text : {"snow fire =>", "a long river =>", "stone =>"}) {
      request.prompts.push_back(group.tokenizer().EncodeForPrompt(text));
    }
    request.sampling.max_new_tokens = 8;
    request.sampling.seed = 4;
    auto rollouts = group.Generate(request);
    EXPECT_TRUE(rollouts.ok()) << rollouts.status();
    return rollouts.ok() ? *rollouts : std::vector<policies::Rollout>{};
  }

  testing::TempDir dir_;
  std::string model_;
};

TEST_F(LoraReferenceTest, TheReferenceIsTheActorsFrozenBaseLoadedOnce) {
  auto lora = LocalWorkerGroup::Create(Spec(", lora: {rank: 4, alpha: 8}"));
  ASSERT_TRUE(lora.ok()) << lora.status();
  EXPECT_EQ((*lora)->placed_models(), std::vector<std::string>{"actor"});
  auto plain = LocalWorkerGroup::Create(Spec(""));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->placed_models(), (std::vector<std::string>{"actor", "reference"}));

  policies::RolloutRequest request;
  for (const char* text : {"snow fire =>", "a long river =>", "stone =>"}) {
    request.prompts.push_back((*lora)->tokenizer().EncodeForPrompt(text));
  }
  request.sampling.max_new_tokens = 8;
  request.sampling.seed = 4;
  auto rollouts = (*lora)->Generate(request);
  ASSERT_TRUE(rollouts.ok()) << rollouts.status();

  // Train the adapters a few steps, so the actor moves off its base.
  policies::PolicyUpdate update;
  update.rollouts = *rollouts;
  for (size_t i = 0; i < rollouts->size(); ++i) {
    update.advantages.emplace_back((*rollouts)[i].response.size(), i == 0 ? 1.0f : -1.0f);
  }
  for (int step = 0; step < 3; ++step) ASSERT_TRUE((*lora)->Update(update).ok());

  policies::ScoreRequest both;
  both.rewards = false;
  both.actor_logprobs = true;
  auto lora_scores = (*lora)->Score(*rollouts, both);
  auto plain_scores = (*plain)->Score(*rollouts, both);
  ASSERT_TRUE(lora_scores.ok() && plain_scores.ok());
  // The frozen base scores what a separate load of the base does, to the bit.
  EXPECT_EQ(lora_scores->reference_logprobs, plain_scores->reference_logprobs);
  // And the actor is not its base any more: the adapters apply to it alone.
  double moved = 0;
  for (size_t i = 0; i < rollouts->size(); ++i) {
    for (size_t t = 0; t < lora_scores->actor_logprobs[i].size(); ++t) {
      moved = std::max(moved, static_cast<double>(
                                  std::abs(lora_scores->actor_logprobs[i][t] - lora_scores->reference_logprobs[i][t])));
    }
  }
  EXPECT_GT(moved, 1e-2);
}

// A job that starts from an adapter (an SFT LoRA): the reference is the
// base with that adapter, frozen, and the actor starts equal to it.
TEST_F(LoraReferenceTest, WithAStartingAdapterTheReferenceIsTheBaseWithIt) {
  auto config = policies::LlamaConfig::Load(model_);
  ASSERT_TRUE(config.ok());
  policies::LoraConfig lora;
  lora.rank = 2;
  lora.target_modules = {"v_proj", "up_proj"};
  auto start = policies::LoraAdapters::Init(lora, *config, at::kFloat, at::kCPU, 21);
  ASSERT_TRUE(start.ok());
  for (auto& [name, t] : (*start)->Named()) {
    if (name.find("lora_B") != std::string::npos) t->normal_(0.0, 0.5);
  }
  const std::string adapter = dir_.Join("sft-adapter");
  ASSERT_TRUE(
      policies::SavePeftAdapter(adapter, **start, policies::LlamaHead::kLanguageModel, at::Tensor(), model_).ok());

  auto group = LocalWorkerGroup::Create(Spec(", adapter: " + adapter + ", lora: {rank: 4}"));
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->placed_models(), std::vector<std::string>{"actor"});
  auto plain = LocalWorkerGroup::Create(Spec(""));
  ASSERT_TRUE(plain.ok()) << plain.status();
  const std::vector<policies::Rollout> rollouts = Rollouts(**group);
  policies::ScoreRequest both;
  both.rewards = false;
  both.actor_logprobs = true;
  auto scores = (*group)->Score(rollouts, both);
  auto base = (*plain)->Score(rollouts, both);
  ASSERT_TRUE(scores.ok() && base.ok());
  // Fresh trained adapters add exactly zero: the actor is the base with the
  // starting adapter, which is the reference.
  EXPECT_EQ(scores->actor_logprobs, scores->reference_logprobs);
  // And that is not the bare base.
  double apart = 0;
  for (size_t i = 0; i < rollouts.size(); ++i) {
    for (size_t t = 0; t < base->reference_logprobs[i].size(); ++t) {
      apart = std::max(apart, static_cast<double>(
                                  std::abs(base->reference_logprobs[i][t] - scores->reference_logprobs[i][t])));
    }
  }
  EXPECT_GT(apart, 1e-2);

  // A starting adapter of another base is refused naming the setting and the tensor.
  const std::string wrong = dir_.Join("wrong-adapter");
  policies::LlamaConfig other = *config;
  other.hidden_size = 32;
  auto mismatched = policies::LoraAdapters::Init(lora, other, at::kFloat, at::kCPU, 1);
  ASSERT_TRUE(mismatched.ok());
  ASSERT_TRUE(
      policies::SavePeftAdapter(wrong, **mismatched, policies::LlamaHead::kLanguageModel, at::Tensor(), "other").ok());
  auto refused = LocalWorkerGroup::Create(Spec(", adapter: " + wrong));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("actor.adapter"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("lora_A.weight"), std::string::npos) << refused.status();
}

}  // namespace
}  // namespace strata::services
