// The C++ Llama against an independent HF-forward reference in Python
// (tests/policies/model/llama_reference.py, run with Debian's python3-torch), plus
// KV-cache, padding, sampling and checkpoint round-trip properties.
#include "policies/model/llama.h"

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/interrupt.h"
#include "gtest/gtest.h"
#include "policies/model/generation.h"
#include "tests/policies/model/tiny_config.h"
#include "tests/testutil/testutil.h"

namespace strata::policies {
namespace {

using nlohmann::json;

// Runs the reference script for `variant` once per process and caches the result.
struct Reference {
  std::string model_dir;
  json expected;
};

const Reference* GetReference(const std::string& variant, std::string* skip_reason) {
  static std::map<std::string, Reference> cache;
  static testing::TempDir* root = new testing::TempDir();  // lives for the process
  if (auto it = cache.find(variant); it != cache.end()) return &it->second;
  const std::string python = testing::ReferencePython();
  if (!testing::HaveProgram(python)) {
    *skip_reason = python + " not found";
    return nullptr;
  }
  auto probe = testing::RunCommand({python, "-c", "import torch"});
  if (!probe.ok() || probe->exit_code != 0) {
    *skip_reason = python + " has no torch (Debian: python3-torch)";
    return nullptr;
  }
  const std::string out = root->Join(variant);
  auto run = testing::RunCommand(
      {python, testing::SourcePath("tests/policies/model/llama_reference.py"), out, variant});
  if (!run.ok() || run->exit_code != 0) {
    ADD_FAILURE() << "reference script failed for " << variant;
    return nullptr;
  }
  auto text = ReadFileToString(out + "/expected.json");
  if (!text.ok()) {
    ADD_FAILURE() << text.status();
    return nullptr;
  }
  Reference ref{out + "/model", json::parse(*text)};
  return &cache.emplace(variant, std::move(ref)).first->second;
}

at::Tensor JsonToTensor(const json& j) {
  std::vector<float> flat;
  std::vector<int64_t> shape;
  const json* level = &j;
  while (level->is_array()) {
    shape.push_back(static_cast<int64_t>(level->size()));
    if (level->empty()) break;
    level = &(*level)[0];
  }
  std::function<void(const json&)> walk = [&](const json& x) {
    if (x.is_array()) {
      for (const auto& e : x) walk(e);
    } else {
      flat.push_back(x.get<float>());
    }
  };
  walk(j);
  return at::tensor(flat).view(shape);
}

at::Tensor Ids(const std::vector<int32_t>& ids) {
  return at::tensor(std::vector<int64_t>(ids.begin(), ids.end()), at::kLong).unsqueeze(0);
}

std::vector<std::vector<int32_t>> Prompts(const json& expected) {
  return expected["prompts"].get<std::vector<std::vector<int32_t>>>();
}

class LlamaReferenceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string reason;
    ref_ = GetReference(GetParam(), &reason);
    if (ref_ == nullptr) {
      if (!reason.empty()) GTEST_SKIP() << reason;
      FAIL() << "no reference";
    }
    auto model = LlamaModel::Load(ref_->model_dir, LlamaHead::kLanguageModel, at::kFloat);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
  }
  const Reference* ref_ = nullptr;
  std::unique_ptr<LlamaModel> model_;
};

TEST_P(LlamaReferenceTest, LogitsMatchHfForward) {
  const auto prompts = Prompts(ref_->expected);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const at::Tensor ids = Ids(prompts[i]);
    const at::Tensor logits = model_->Logits(ids, at::ones_like(ids))[0];
    const at::Tensor want = JsonToTensor(ref_->expected["logits"][i]);
    ASSERT_EQ(logits.sizes(), want.sizes());
    EXPECT_LT((logits - want).abs().max().item<float>(), 1e-4) << "prompt " << i;
  }
}

TEST_P(LlamaReferenceTest, GreedyContinuationMatchesHf) {
  const auto prompts = Prompts(ref_->expected);
  for (bool use_cache : {true, false}) {
    SamplingOptions options;
    options.greedy = true;
    options.max_new_tokens = 8;
    options.stop_at_eos = false;
    options.use_kv_cache = use_cache;
    auto out = Generate(*model_, prompts, options, model_->config().eos_token_ids);
    ASSERT_TRUE(out.ok()) << out.status();
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(out->tokens[i], ref_->expected["greedy"][i].get<std::vector<int32_t>>())
          << "prompt " << i << (use_cache ? " with" : " without") << " KV cache";
    }
  }
}

TEST_P(LlamaReferenceTest, LeftPaddedBatchMatchesSinglePrompts) {
  const auto prompts = Prompts(ref_->expected);
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  at::Tensor ids = at::zeros({static_cast<int64_t>(prompts.size()), static_cast<int64_t>(longest)}, at::kLong);
  at::Tensor mask = at::zeros_like(ids);
  for (size_t b = 0; b < prompts.size(); ++b) {
    const int64_t offset = static_cast<int64_t>(longest - prompts[b].size());
    ids[b].narrow(0, offset, static_cast<int64_t>(prompts[b].size())).copy_(Ids(prompts[b])[0]);
    mask[b].narrow(0, offset, static_cast<int64_t>(prompts[b].size())).fill_(1);
  }
  const at::Tensor batched = model_->Logits(ids, mask);
  const at::Tensor hf_padded = JsonToTensor(ref_->expected["padded_logits"]);
  for (size_t b = 0; b < prompts.size(); ++b) {
    const int64_t n = static_cast<int64_t>(prompts[b].size());
    const at::Tensor real = batched[b].narrow(0, static_cast<int64_t>(longest) - n, n);
    const at::Tensor single = model_->Logits(Ids(prompts[b]), at::ones({1, n}, at::kLong))[0];
    EXPECT_LT((real - single).abs().max().item<float>(), 1e-4) << "prompt " << b;
    const at::Tensor hf = hf_padded[b].narrow(0, static_cast<int64_t>(longest) - n, n);
    EXPECT_LT((real - hf).abs().max().item<float>(), 1e-4) << "prompt " << b;
  }
}

TEST_P(LlamaReferenceTest, KvCacheDecodingEqualsFullRecomputation) {
  const auto prompts = Prompts(ref_->expected);
  const at::Tensor full_ids = Ids(prompts[2]);
  const int64_t n = full_ids.size(1);
  const at::Tensor full = model_->Logits(full_ids, at::ones_like(full_ids))[0];
  DenseKvCache cache(model_->config(), 1, n, at::TensorOptions().dtype(at::kFloat));
  // Prefill 4 tokens, then one at a time.
  std::vector<at::Tensor> pieces;
  pieces.push_back(model_->Logits(full_ids.narrow(1, 0, 4), at::ones({1, 4}, at::kLong), &cache)[0]);
  for (int64_t t = 4; t < n; ++t) {
    pieces.push_back(model_->Logits(full_ids.narrow(1, t, 1), at::ones({1, t + 1}, at::kLong), &cache)[0]);
  }
  EXPECT_EQ(cache.length(), n);
  EXPECT_LT((at::cat(pieces, 0) - full).abs().max().item<float>(), 1e-4);
}

// The families share these checks: Mistral's sliding window (4 keys, shorter
// than two of the prompts), Qwen2's q/k/v biases with tied embeddings,
// Qwen3's per-head q/k norms with a head_dim apart from hidden / heads.
INSTANTIATE_TEST_SUITE_P(Variants, LlamaReferenceTest,
                         ::testing::Values("gqa_untied", "mha_tied", "gqa_sharded", "mistral", "qwen2", "qwen3"));

class LlamaScalarHeadTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaScalarHeadTest, ScoresMatchHfSequenceClassification) {
  std::string reason;
  const Reference* ref = GetReference(GetParam(), &reason);
  if (ref == nullptr) {
    if (!reason.empty()) GTEST_SKIP() << reason;
    FAIL();
  }
  auto model = LlamaModel::Load(ref->model_dir, LlamaHead::kScalar, at::kFloat);
  ASSERT_TRUE(model.ok()) << model.status();
  const auto prompts = Prompts(ref->expected);
  const auto want = ref->expected["scores"].get<std::vector<float>>();
  for (size_t i = 0; i < prompts.size(); ++i) {
    // Right padding here (HF's test used left): the score is read at the
    // last real token either way.
    const int64_t n = static_cast<int64_t>(prompts[i].size());
    at::Tensor ids = at::zeros({1, n + 3}, at::kLong);
    ids.narrow(1, 0, n).copy_(Ids(prompts[i]));
    at::Tensor mask = at::zeros_like(ids);
    mask.narrow(1, 0, n).fill_(1);
    const at::Tensor score = (*model)->Scores(ids, mask);
    ASSERT_EQ(score.sizes(), (at::IntArrayRef{1, 1}));
    EXPECT_NEAR(score.item<float>(), want[i], 1e-4) << "prompt " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, LlamaScalarHeadTest, ::testing::Values("scalar", "qwen3_scalar"));

TEST(LlamaCheckpointTest, SaveThenLoadIsBitExact) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (size_t shard_bytes : {size_t{0}, size_t{20000}}) {
      testing::TempDir dir;
      auto model = LlamaModel::RandomInit(TinyConfig(), LlamaHead::kLanguageModel, dtype, 7);
      ASSERT_TRUE(model->Save(dir.path(), shard_bytes).ok());
      EXPECT_EQ(IsRegularFile(dir.Join("model.safetensors.index.json")), shard_bytes != 0);
      auto loaded = LlamaModel::Load(dir.path(), LlamaHead::kLanguageModel, dtype);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      auto a = model->NamedParameters();
      auto b = (*loaded)->NamedParameters();
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].first, b[i].first);
        EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
      }
    }
  }
}

TEST(LlamaCheckpointTest, MissingTensorIsNamed) {
  testing::TempDir dir;
  LlamaConfig c = TinyConfig();
  auto model = LlamaModel::RandomInit(c, LlamaHead::kLanguageModel, at::kFloat, 1);
  ASSERT_TRUE(model->Save(dir.path()).ok());
  // A reward model needs score.weight, which a causal LM does not have.
  auto loaded = LlamaModel::Load(dir.path(), LlamaHead::kScalar, at::kFloat);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("score.weight"), std::string::npos) << loaded.status();
}

// A cancelled job's load gives up at the next tensor, and loads normally
// once the request is cleared.
TEST(LlamaCheckpointTest, InterruptStopsALoad) {
  testing::TempDir dir;
  auto model = LlamaModel::RandomInit(TinyConfig(), LlamaHead::kLanguageModel, at::kFloat, 1);
  ASSERT_TRUE(model->Save(dir.path()).ok());
  RequestInterrupt();
  auto stopped = LlamaModel::Load(dir.path(), LlamaHead::kLanguageModel, at::kFloat);
  ClearInterrupt();
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled) << stopped.status();
  EXPECT_NE(stopped.status().message().find("while loading a model"), std::string::npos) << stopped.status();
  EXPECT_TRUE(LlamaModel::Load(dir.path(), LlamaHead::kLanguageModel, at::kFloat).ok());
}

TEST(LlamaCheckpointTest, WrongShapeIsNamedWithBothShapes) {
  testing::TempDir dir;
  LlamaConfig c = TinyConfig();
  auto model = LlamaModel::RandomInit(c, LlamaHead::kLanguageModel, at::kFloat, 1);
  ASSERT_TRUE(model->Save(dir.path()).ok());
  c.intermediate_size = 48;  // config now disagrees with the weights
  ASSERT_TRUE(WriteFileAtomically(dir.Join("config.json"), c.ToJson(false)).ok());
  auto loaded = LlamaModel::Load(dir.path(), LlamaHead::kLanguageModel, at::kFloat);
  ASSERT_FALSE(loaded.ok());
  const std::string msg(loaded.status().message());
  EXPECT_NE(msg.find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[64, 32]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[48, 32]"), std::string::npos) << msg;
}

TEST(LlamaConfigTest, BadFieldsAreNamed) {
  auto bad_heads = LlamaConfig::FromJson(
      R"({"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 3, "vocab_size": 10,
          "intermediate_size": 8, "num_hidden_layers": 1})",
      "config.json");
  ASSERT_FALSE(bad_heads.ok());
  EXPECT_NE(bad_heads.status().message().find("num_key_value_heads"), std::string::npos);
  auto bad_type = LlamaConfig::FromJson(R"({"hidden_size": "big"})", "config.json");
  ASSERT_FALSE(bad_type.ok());
  EXPECT_NE(bad_type.status().message().find("hidden_size"), std::string::npos);
  EXPECT_FALSE(LlamaConfig::FromJson("{not json", "config.json").ok());
  auto other = LlamaConfig::FromJson(R"({"model_type": "gpt2"})", "config.json");
  EXPECT_NE(other.status().message().find("model_type"), std::string::npos);
}

// Each family is read from model_type (or, without one, the class name in
// `architectures`) and written back in its own HF layout; what a family's
// config asks for beyond what strata implements is refused by name.
TEST(LlamaConfigTest, FamiliesRoundTripAndUnsupportedFieldsAreNamed) {
  const std::string shape = R"("hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 10, "intermediate_size": 8, "num_hidden_layers": 1)";
  struct Case {
    std::string json;
    ModelFamily family;
    bool qkv_bias, qk_norm;
    int64_t window;
    std::string causal_lm;
  };
  for (const Case& c :
       std::vector<Case>{{R"({"model_type": "mistral", "sliding_window": 4096, )" + shape + "}", ModelFamily::kMistral,
                          false, false, 4096, "MistralForCausalLM"},
                         {R"({"model_type": "mistral", "sliding_window": null, )" + shape + "}", ModelFamily::kMistral,
                          false, false, 0, "MistralForCausalLM"},
                         {R"({"model_type": "qwen2", "use_sliding_window": false, )" + shape + "}", ModelFamily::kQwen2,
                          true, false, 0, "Qwen2ForCausalLM"},
                         {R"({"model_type": "qwen3", "head_dim": 128, )" + shape + "}", ModelFamily::kQwen3, false,
                          true, 0, "Qwen3ForCausalLM"},
                         {R"({"architectures": ["Qwen2ForSequenceClassification"], )" + shape + "}",
                          ModelFamily::kQwen2, true, false, 0, "Qwen2ForCausalLM"},
                         {"{" + shape + "}", ModelFamily::kLlama, false, false, 0, "LlamaForCausalLM"}}) {
    auto parsed = LlamaConfig::FromJson(c.json, "config.json");
    ASSERT_TRUE(parsed.ok()) << c.json << ": " << parsed.status();
    EXPECT_EQ(parsed->family, c.family) << c.json;
    EXPECT_EQ(parsed->qkv_bias, c.qkv_bias) << c.json;
    EXPECT_EQ(parsed->qk_norm, c.qk_norm) << c.json;
    EXPECT_EQ(parsed->sliding_window, c.window) << c.json;
    EXPECT_EQ(parsed->ArchitectureName(false), c.causal_lm);
    const std::string written = parsed->ToJson(true);
    EXPECT_NE(written.find(absl::StrCat("\"model_type\": \"", ModelTypeName(c.family), "\"")), std::string::npos)
        << written;
    auto again = LlamaConfig::FromJson(written, "round-trip");
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->family, c.family);
    EXPECT_EQ(again->sliding_window, c.window);
    EXPECT_EQ(again->head_dim, parsed->head_dim);
    EXPECT_EQ(again->NumParameters(), parsed->NumParameters());
  }
  for (const auto& [json, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model_type": "gemma3", )" + shape + "}", "model_type"},
           {R"({"architectures": ["GPT2LMHeadModel"], )" + shape + "}", "architectures"},
           {R"({"model_type": "llama", "attention_bias": true, )" + shape + "}", "attention_bias"},
           {R"({"model_type": "llama", "mlp_bias": true, )" + shape + "}", "mlp_bias"},
           {R"({"model_type": "qwen2", "use_sliding_window": true, )" + shape + "}", "use_sliding_window"},
           {R"({"model_type": "mistral", "sliding_window": -1, )" + shape + "}", "sliding_window"},
           {R"({"model_type": "llama", "hidden_act": "gelu", )" + shape + "}", "hidden_act"}}) {
    auto parsed = LlamaConfig::FromJson(json, "config.json");
    ASSERT_FALSE(parsed.ok()) << json;
    EXPECT_NE(parsed.status().message().find("'" + field + "'"), std::string::npos) << parsed.status();
  }
}

// A Qwen3 model's extra tensors (q_norm, k_norm) and a Qwen2 model's biases
// are saved under HF's names and load back bit-exact.
TEST(LlamaCheckpointTest, FamilyTensorsSaveAndLoadUnderHfNames) {
  for (ModelFamily family : {ModelFamily::kQwen2, ModelFamily::kQwen3}) {
    LlamaConfig c = TinyConfig();
    c.family = family;
    c.qkv_bias = family == ModelFamily::kQwen2;
    c.qk_norm = family == ModelFamily::kQwen3;
    testing::TempDir dir;
    auto model = LlamaModel::RandomInit(c, LlamaHead::kLanguageModel, at::kFloat, 3);
    ASSERT_TRUE(model->Save(dir.path()).ok());
    auto loaded = LlamaModel::Load(dir.path(), LlamaHead::kLanguageModel, at::kFloat);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ((*loaded)->config().family, family);
    auto names = [](const LlamaModel& m) {
      std::vector<std::string> out;
      for (const auto& [name, tensor] : m.NamedParameters()) out.push_back(name);
      return out;
    };
    const auto got = names(**loaded);
    const std::string extra = family == ModelFamily::kQwen2 ? "model.layers.1.self_attn.v_proj.bias"
                                                            : "model.layers.1.self_attn.k_norm.weight";
    EXPECT_NE(std::find(got.begin(), got.end(), extra), got.end()) << extra;
    EXPECT_EQ(got, names(*model));
    int64_t count = 0;
    for (const auto& [name, tensor] : (*loaded)->NamedParameters()) count += tensor.numel();
    EXPECT_EQ(count, c.NumParameters());
  }
}

// The element counts the planner deals out as ZeRO shards are the model's
// tensors in the trainer's order: embedding, norm, head, then each layer's
// Named() tensors, for every family's layout and head.
TEST(LlamaConfigTest, TrainedTensorElementsAreTheModelsTensorsInTheTrainersOrder) {
  for (ModelFamily family : {ModelFamily::kLlama, ModelFamily::kQwen2, ModelFamily::kQwen3}) {
    for (const auto& [head, tied] :
         {std::pair{LlamaHead::kLanguageModel, false}, std::pair{LlamaHead::kLanguageModel, true},
          std::pair{LlamaHead::kScalar, false}}) {
      LlamaConfig c = TinyConfig();
      c.family = family;
      c.qkv_bias = family == ModelFamily::kQwen2;
      c.qk_norm = family == ModelFamily::kQwen3;
      c.tie_word_embeddings = tied;
      c.num_labels = 3;
      auto model = LlamaModel::RandomInit(c, head, at::kFloat, 3);
      LlamaWeights w = model->weights();
      std::vector<int64_t> expected = {w.embed_tokens.numel(), w.norm.numel()};
      if (w.lm_head.defined()) expected.push_back(w.lm_head.numel());
      if (w.score.defined()) expected.push_back(w.score.numel());
      for (LlamaLayerWeights& layer : w.layers) {
        for (const auto& [name, tensor] : layer.Named()) expected.push_back(tensor->numel());
      }
      EXPECT_EQ(c.TrainedTensorElements(head == LlamaHead::kScalar), expected)
          << "family " << static_cast<int>(family) << ", tied " << tied << ", scalar " << (head == LlamaHead::kScalar);
    }
  }
}

TEST(LlamaConfigTest, JsonRoundTripsAndGqaDefaults) {
  auto parsed = LlamaConfig::FromJson(
      R"({"hidden_size": 64, "num_attention_heads": 8, "vocab_size": 10, "intermediate_size": 8,
          "num_hidden_layers": 1, "eos_token_id": [2, 5], "rope_scaling": {"rope_type": "linear", "factor": 2.0}})",
      "config.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->num_key_value_heads, 8);
  EXPECT_EQ(parsed->head_dim, 8);
  EXPECT_EQ(parsed->eos_token_ids, (std::vector<int64_t>{2, 5}));
  auto again = LlamaConfig::FromJson(parsed->ToJson(false), "round-trip");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->eos_token_ids, parsed->eos_token_ids);
  EXPECT_EQ(again->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_DOUBLE_EQ(again->rope_scaling.factor, 2.0);
}

TEST(LlamaBf16Test, Bf16LogitsStayCloseToFp32) {
  auto model = LlamaModel::RandomInit(TinyConfig(), LlamaHead::kLanguageModel, at::kFloat, 3, 0.2);
  LlamaWeights bf = model->weights();
  auto cast = [](at::Tensor& t) { t = t.to(at::kBFloat16); };
  cast(bf.embed_tokens);
  cast(bf.norm);
  cast(bf.lm_head);
  for (auto& layer : bf.layers)
    for (auto& [name, t] : layer.Named()) cast(*t);
  LlamaModel bf16(model->config(), LlamaHead::kLanguageModel, bf);
  const at::Tensor ids = at::tensor(std::vector<int64_t>{1, 4, 9, 16, 25, 36}, at::kLong).unsqueeze(0);
  const at::Tensor a = model->Logits(ids, at::ones_like(ids));
  const at::Tensor b = bf16.Logits(ids, at::ones_like(ids));
  EXPECT_EQ(b.scalar_type(), at::kFloat);
  // bf16 keeps ~3 significant digits; logits here are O(1).
  EXPECT_LT((a - b).abs().max().item<float>(), 0.1);
  EXPECT_GT((a - b).abs().max().item<float>(), 0.0);  // it really ran in bf16
}

TEST(LogProbsTest, TokenLogProbsAndEntropyByHand) {
  // Two tokens, uniform over 4 classes and a peaked distribution.
  const at::Tensor logits = at::tensor(std::vector<float>{0, 0, 0, 0, std::log(2.f), 0, 0, 0}).view({1, 2, 4});
  const at::Tensor targets = at::tensor(std::vector<int64_t>{3, 0}, at::kLong).view({1, 2});
  const at::Tensor logp = TokenLogProbs(logits, targets);
  EXPECT_NEAR(logp[0][0].item<float>(), std::log(0.25f), 1e-6);
  EXPECT_NEAR(logp[0][1].item<float>(), std::log(0.4f), 1e-6);
  const at::Tensor entropy = TokenEntropy(logits);
  EXPECT_NEAR(entropy[0][0].item<float>(), std::log(4.f), 1e-6);
  const float h = -(0.4f * std::log(0.4f) + 3 * 0.2f * std::log(0.2f));
  EXPECT_NEAR(entropy[0][1].item<float>(), h, 1e-6);
}

TEST(GenerationTest, SameSeedSameTokensOtherSeedOtherTokens) {
  auto model = LlamaModel::RandomInit(TinyConfig(), LlamaHead::kLanguageModel, at::kFloat, 5, 0.5);
  SamplingOptions options;
  options.max_new_tokens = 12;
  options.stop_at_eos = false;
  options.seed = 11;
  auto a = Generate(*model, {{1, 2, 3}, {4}}, options, {2});
  auto b = Generate(*model, {{1, 2, 3}, {4}}, options, {2});
  options.seed = 12;
  auto c = Generate(*model, {{1, 2, 3}, {4}}, options, {2});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_NE(a->tokens, c->tokens);
}

// A row that ends leaves the batch (nothing is decoded for it afterwards),
// and that changes no other row: each row of a batch, with its own seed,
// gets the tokens and log-probs it gets decoded alone, with the KV cache and
// without. The log-probs agree to float rounding of batched matmuls.
TEST(GenerationTest, FinishedRowsLeaveTheBatchWithoutChangingTheOthers) {
  auto model = LlamaModel::RandomInit(TinyConfig(), LlamaHead::kLanguageModel, at::kFloat, 5, 0.5);
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {4}, {5, 6}, {7, 8, 9, 10}, {11}, {12, 13}};
  const std::vector<int64_t> stops = {2, 5, 9, 14, 20, 27};  // 6 of 50 tokens: rows end at different steps
  for (const bool use_cache : {true, false}) {
    SamplingOptions options;
    options.max_new_tokens = 16;
    options.use_kv_cache = use_cache;
    for (size_t i = 0; i < prompts.size(); ++i) options.row_seeds.push_back(100 + i);
    auto batch = Generate(*model, prompts, options, stops);
    ASSERT_TRUE(batch.ok()) << batch.status();
    std::set<size_t> lengths;
    for (size_t i = 0; i < prompts.size(); ++i) {
      SamplingOptions alone = options;
      alone.row_seeds = {options.row_seeds[i]};
      auto single = Generate(*model, {prompts[i]}, alone, stops);
      ASSERT_TRUE(single.ok()) << single.status();
      EXPECT_EQ(batch->tokens[i], single->tokens[0]) << "row " << i << ", cache " << use_cache;
      ASSERT_EQ(batch->logprobs[i].size(), single->logprobs[0].size());
      for (size_t t = 0; t < batch->logprobs[i].size(); ++t) {
        EXPECT_NEAR(batch->logprobs[i][t], single->logprobs[0][t], 1e-4) << "row " << i << " token " << t;
      }
      lengths.insert(batch->tokens[i].size());
    }
    // The case under test happened: rows ended at different steps.
    EXPECT_GE(lengths.size(), 3u);
    EXPECT_LT(*lengths.begin(), 16u);
  }
}

// A cancelled job's worker requests an interrupt; generation gives up at
// its next decoding step, and runs normally once the request is cleared.
TEST(GenerationTest, InterruptStopsAtTheNextStep) {
  auto model = LlamaModel::RandomInit(TinyConfig(), LlamaHead::kLanguageModel, at::kFloat, 5, 0.5);
  SamplingOptions options;
  options.max_new_tokens = 4;
  RequestInterrupt();
  auto stopped = Generate(*model, {{1, 2, 3}}, options, {2});
  ClearInterrupt();
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled);
  EXPECT_NE(stopped.status().message().find("while generating"), std::string::npos) << stopped.status();
  EXPECT_TRUE(Generate(*model, {{1, 2, 3}}, options, {2}).ok());
}

TEST(GenerationTest, TopKOneAndTinyTopPAreGreedy) {
  auto model = LlamaModel::RandomInit(TinyConfig(), LlamaHead::kLanguageModel, at::kFloat, 5, 0.5);
  SamplingOptions greedy;
  greedy.greedy = true;
  greedy.max_new_tokens = 10;
  greedy.stop_at_eos = false;
  auto want = Generate(*model, {{1, 7, 3}}, greedy, {});
  SamplingOptions top_k = greedy;
  top_k.greedy = false;
  top_k.top_k = 1;
  SamplingOptions top_p = greedy;
  top_p.greedy = false;
  top_p.top_p = 1e-6;
  for (const auto& options : {top_k, top_p}) {
    auto got = Generate(*model, {{1, 7, 3}}, options, {});
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->tokens, want->tokens);
  }
}

TEST(GenerationTest, StopsAtEosAndKeepsIt) {
  auto model = LlamaModel::RandomInit(TinyConfig(), LlamaHead::kLanguageModel, at::kFloat, 5, 0.5);
  SamplingOptions options;
  options.greedy = true;
  options.max_new_tokens = 10;
  options.stop_at_eos = false;
  auto free_run = Generate(*model, {{1, 7, 3}}, options, {});
  ASSERT_TRUE(free_run.ok());
  const int32_t stop = free_run->tokens[0][3];
  options.stop_at_eos = true;
  auto stopped = Generate(*model, {{1, 7, 3}}, options, {stop});
  ASSERT_TRUE(stopped.ok());
  const auto& t = stopped->tokens[0];
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t.back(), stop);
  EXPECT_LE(t.size(), 4u);
  EXPECT_EQ(stopped->logprobs[0].size(), t.size());
}

TEST(GenerationTest, BadRequestsAreRejected) {
  auto model = LlamaModel::RandomInit(TinyConfig(), LlamaHead::kLanguageModel, at::kFloat, 5);
  SamplingOptions options;
  EXPECT_EQ(Generate(*model, {{}}, options, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Generate(*model, {{1, 999}}, options, {}).status().code(), absl::StatusCode::kInvalidArgument);
  options.max_new_tokens = 100;  // past max_position_embeddings = 64
  EXPECT_EQ(Generate(*model, {{1}}, options, {}).status().code(), absl::StatusCode::kInvalidArgument);
  options.max_new_tokens = 4;
  options.temperature = 0;
  EXPECT_NE(Generate(*model, {{1}}, options, {}).status().message().find("temperature"), std::string::npos);
}

}  // namespace
}  // namespace strata::policies
