#include "policies/model/lora.h"

#include <c10/core/GradMode.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "base/file.h"
#include "gtest/gtest.h"
#include "policies/checkpoint/safetensors.h"
#include "policies/model/llama.h"
#include "policies/model/peft_adapter.h"
#include "tests/policies/model/tiny_config.h"
#include "tests/testutil/testutil.h"

namespace strata::policies {
namespace {

using json = nlohmann::json;

// The shared tiny model with an MLP narrower than the default (48): the
// adapters' shapes then differ between up/gate and down.
LlamaConfig FamilyConfig(ModelFamily family) {
  LlamaConfig c = TinyConfig(family);
  c.intermediate_size = 48;
  return c;
}

LoraConfig Lora(int64_t rank) {
  LoraConfig lora;
  lora.rank = rank;
  lora.alpha = 16;
  return lora;
}

// Gives every B random values: fresh adapters (B = 0) change nothing.
void RandomizeB(LoraAdapters& adapters, uint64_t seed) {
  c10::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  for (auto& [name, tensor] : adapters.Named()) {
    if (name.find("lora_B") != std::string::npos) tensor->normal_(0.0, 0.3, gen);
  }
}

struct Batch {
  at::Tensor ids, mask;
};

Batch LeftPadded() {
  at::Tensor ids =
      at::tensor(std::vector<int64_t>{0, 0, 5, 9, 13, 2, 7, 1, 4, 8, 22, 3, 40, 30}, at::kLong).view({2, 7});
  at::Tensor mask = at::ones_like(ids);
  mask[0][0] = 0;
  mask[0][1] = 0;
  return {ids, mask};
}

// The largest difference at the real (unpadded) positions.
double MaxDiff(const at::Tensor& a, const at::Tensor& b, const at::Tensor& mask) {
  const at::Tensor real = mask.to(at::kBool).unsqueeze(-1).expand_as(a);
  return (a - b).abs().masked_select(real).max().item<double>();
}

TEST(LoraTest, FreshAdaptersLeaveTheModelExactlyItsBase) {
  auto model = LlamaModel::RandomInit(FamilyConfig(ModelFamily::kLlama), LlamaHead::kLanguageModel, at::kFloat, 3, 0.2);
  auto adapters = LoraAdapters::Init(Lora(4), model->config(), at::kFloat, at::kCPU, 11);
  ASSERT_TRUE(adapters.ok()) << adapters.status();
  const Batch batch = LeftPadded();
  const at::Tensor base = model->Logits(batch.ids, batch.mask);
  model->UseAdapters(adapters->get());
  EXPECT_TRUE(at::equal(model->Logits(batch.ids, batch.mask), base));
  // PEFT's init: A Kaiming-uniform with a = sqrt(5) (bound 1/sqrt(in)), B zero.
  for (auto& [name, tensor] : (*adapters)->Named()) {
    if (name.find("lora_B") != std::string::npos) {
      EXPECT_EQ(tensor->abs().max().item<float>(), 0.0f) << name;
    } else {
      const double bound = 1.0 / std::sqrt(static_cast<double>(tensor->size(1)));
      EXPECT_LE(tensor->abs().max().item<double>(), bound) << name;
      EXPECT_GT(tensor->abs().max().item<double>(), 0.5 * bound) << name;
    }
  }
  auto again = LoraAdapters::Init(Lora(4), model->config(), at::kFloat, at::kCPU, 11);
  auto other = LoraAdapters::Init(Lora(4), model->config(), at::kFloat, at::kCPU, 12);
  const at::Tensor first = *(*adapters)->Named()[0].second;
  EXPECT_TRUE(at::equal(*(*again)->Named()[0].second, first));
  EXPECT_FALSE(at::equal(*(*other)->Named()[0].second, first));
}

// x W^T + s B A x computed on the fly gives what the merged W + s B A gives,
// for every family (biases, per-head norms, a sliding window, tied heads).
TEST(LoraTest, AdaptedForwardEqualsTheMergedWeightsForwardInEveryFamily) {
  for (ModelFamily family : {ModelFamily::kLlama, ModelFamily::kMistral, ModelFamily::kQwen2, ModelFamily::kQwen3}) {
    SCOPED_TRACE(ModelTypeName(family));
    auto model = LlamaModel::RandomInit(FamilyConfig(family), LlamaHead::kLanguageModel, at::kFloat, 5, 0.2);
    LoraConfig lora = Lora(4);
    lora.use_rslora = family == ModelFamily::kQwen3;  // the other scaling too
    auto adapters = LoraAdapters::Init(lora, model->config(), at::kFloat, at::kCPU, 7);
    ASSERT_TRUE(adapters.ok()) << adapters.status();
    RandomizeB(**adapters, 8);
    const Batch batch = LeftPadded();
    const at::Tensor base = model->Logits(batch.ids, batch.mask);
    model->UseAdapters(adapters->get());
    const at::Tensor adapted = model->Logits(batch.ids, batch.mask);

    LlamaWeights merged = model->weights();
    for (int64_t l = 0; l < model->config().num_hidden_layers; ++l) {
      (*adapters)->MergeInto(l, merged.layers[static_cast<size_t>(l)]);
    }
    const at::Tensor from_merged =
        LlamaModel(model->config(), LlamaHead::kLanguageModel, merged).Logits(batch.ids, batch.mask);
    // fp32 in both; the two differ only in the order of sums of ~100 terms
    // per projection (about 1e-6 relative each), over two layers and the
    // head: 1e-5 of the logits' scale bounds it. The adapters move the
    // logits by far more than that, so a dropped adapter would show.
    const double scale = adapted.abs().max().item<double>();
    EXPECT_LT(MaxDiff(adapted, from_merged, batch.mask), 1e-5 * scale);
    EXPECT_GT(MaxDiff(adapted, base, batch.mask), 1e-2 * scale);
    // The merge made new tensors: the model's own base is untouched.
    model->UseAdapters(nullptr);
    EXPECT_TRUE(at::equal(model->Logits(batch.ids, batch.mask), base));
  }
}

// A starting adapter under a trained one (a job that starts from an SFT
// adapter) computes what the two stacked into one adapter compute: the one
// adapter a job writes for PEFT.
TEST(LoraTest, AStackOfTwoAdaptersIsOneAdapter) {
  auto model = LlamaModel::RandomInit(FamilyConfig(ModelFamily::kQwen2), LlamaHead::kLanguageModel, at::kFloat, 5, 0.2);
  LoraConfig below_config = Lora(2);
  below_config.target_modules = {"q_proj", "down_proj"};
  LoraConfig above_config = Lora(4);
  above_config.use_rslora = true;
  auto below = LoraAdapters::Init(below_config, model->config(), at::kFloat, at::kCPU, 1);
  auto above = LoraAdapters::Init(above_config, model->config(), at::kFloat, at::kCPU, 2);
  ASSERT_TRUE(below.ok() && above.ok());
  RandomizeB(**below, 3);
  RandomizeB(**above, 4);
  const Batch batch = LeftPadded();
  model->UseAdapters(above->get(), below->get());
  const at::Tensor both = model->Logits(batch.ids, batch.mask);
  model->UseAdapters(nullptr, below->get());
  const at::Tensor below_only = model->Logits(batch.ids, batch.mask);
  const std::unique_ptr<LoraAdapters> stacked = LoraAdapters::Stacked(**below, **above);
  EXPECT_EQ(stacked->config().rank, 6);
  EXPECT_EQ(stacked->modules().size(), 7u);
  model->UseAdapters(stacked.get());
  const at::Tensor one = model->Logits(batch.ids, batch.mask);
  const double scale = both.abs().max().item<double>();
  EXPECT_LT(MaxDiff(one, both, batch.mask), 1e-5 * scale);
  EXPECT_GT(MaxDiff(both, below_only, batch.mask), 1e-2 * scale);  // the upper adapter counts
}

TEST(LoraTest, TargetModulesChooseTheProjections) {
  const LlamaConfig c = FamilyConfig(ModelFamily::kLlama);
  LoraConfig lora = Lora(2);
  lora.target_modules = {"v_proj", "q_proj", "down_proj"};
  auto adapters = LoraAdapters::Init(lora, c, at::kFloat, at::kCPU, 1);
  ASSERT_TRUE(adapters.ok());
  std::vector<std::string> names;
  for (auto& [name, tensor] : (*adapters)->NamedInLayer(1)) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "model.layers.1.self_attn.q_proj.lora_A.weight", "model.layers.1.self_attn.q_proj.lora_B.weight",
                       "model.layers.1.self_attn.v_proj.lora_A.weight", "model.layers.1.self_attn.v_proj.lora_B.weight",
                       "model.layers.1.mlp.down_proj.lora_A.weight", "model.layers.1.mlp.down_proj.lora_B.weight"}));
  // rank x (in + out) per module, per layer.
  EXPECT_EQ((*adapters)->num_parameters(), 2 * 2 * ((32 + 32) + (32 + 16) + (48 + 32)));
}

TEST(LoraTest, BadSettingsAreRefusedByName) {
  const LlamaConfig c = FamilyConfig(ModelFamily::kLlama);
  LoraConfig zero = Lora(0);
  EXPECT_NE(LoraAdapters::Init(zero, c, at::kFloat, at::kCPU, 1).status().message().find("'lora.rank'"),
            std::string::npos);
  LoraConfig unknown = Lora(4);
  unknown.target_modules = {"q_proj", "qkv_proj"};
  const absl::Status status = LoraAdapters::Init(unknown, c, at::kFloat, at::kCPU, 1).status();
  EXPECT_NE(status.message().find("'lora.target_modules'"), std::string::npos) << status;
  EXPECT_NE(status.message().find("qkv_proj"), std::string::npos) << status;
  LoraConfig dropout = Lora(4);
  dropout.dropout = 1.0;
  EXPECT_NE(dropout.Validate("models.actor.lora").message().find("'models.actor.lora.dropout'"), std::string::npos);
}

TEST(LoraTest, DropoutMasksAreAFunctionOfTheKey) {
  auto model = LlamaModel::RandomInit(FamilyConfig(ModelFamily::kLlama), LlamaHead::kLanguageModel, at::kFloat, 3, 0.2);
  auto adapters = LoraAdapters::Init(Lora(4), model->config(), at::kFloat, at::kCPU, 2);
  ASSERT_TRUE(adapters.ok());
  RandomizeB(**adapters, 3);
  const at::Tensor x = at::randn({2, 5, 32});
  const LlamaLayerWeights& w = model->weights().layers[0];
  auto project = [&](uint64_t key, double dropout) {
    LoraApply apply = (*adapters)->ApplyFor(0);
    apply.dropout = dropout;
    apply.dropout_key = key;
    return LoraLinear(x, w.q_proj, at::Tensor(), &apply, LoraModule::kQ);
  };
  EXPECT_TRUE(at::equal(project(LoraDropoutKey(1, 4, 0), 0.3), project(LoraDropoutKey(1, 4, 0), 0.3)));
  EXPECT_FALSE(at::equal(project(LoraDropoutKey(1, 4, 0), 0.3), project(LoraDropoutKey(1, 4, 1), 0.3)));
  EXPECT_FALSE(at::equal(project(LoraDropoutKey(1, 4, 0), 0.3), project(LoraDropoutKey(1, 5, 0), 0.3)));
  EXPECT_FALSE(at::equal(project(LoraDropoutKey(1, 4, 0), 0.3), project(0, 0.0)));
}

// ---- PEFT's layout ----

json ReadJson(const std::string& path) { return json::parse(*ReadFileToString(path)); }

void WriteJson(const std::string& path, const json& value) { testing::WriteTextFile(path, value.dump(2)); }

TEST(PeftAdapterTest, WritesPeftsNamesAndConfigAndReadsThemBack) {
  testing::TempDir dir;
  const LlamaConfig c = FamilyConfig(ModelFamily::kQwen3);
  LoraConfig lora = Lora(4);
  lora.target_modules = {"q_proj", "v_proj"};
  auto adapters = LoraAdapters::Init(lora, c, at::kFloat, at::kCPU, 5);
  ASSERT_TRUE(adapters.ok());
  RandomizeB(**adapters, 6);
  const at::Tensor score = at::randn({1, 32});
  ASSERT_TRUE(SavePeftAdapter(dir.path(), **adapters, LlamaHead::kScalar, score, "/models/base").ok());

  const json config = ReadJson(dir.Join(kPeftConfigFile));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["task_type"], "SEQ_CLS");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["lora_alpha"], 16.0);
  EXPECT_EQ(config["target_modules"], json({"q_proj", "v_proj"}));
  EXPECT_EQ(config["modules_to_save"], json({"score"}));
  EXPECT_EQ(config["bias"], "none");
  EXPECT_EQ(config["fan_in_fan_out"], false);
  EXPECT_EQ(config["base_model_name_or_path"], "/models/base");
  auto file = SafetensorsFile::Open(dir.Join(kPeftWeightsFile));
  ASSERT_TRUE(file.ok());
  EXPECT_NE((*file)->Find("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"), nullptr);
  EXPECT_NE((*file)->Find("base_model.model.score.weight"), nullptr);
  for (const TensorView& view : (*file)->tensors()) {
    EXPECT_EQ(view.name.find(".default"), std::string::npos) << view.name;
  }

  auto loaded = LoadPeftAdapter(dir.path(), c, LlamaHead::kScalar, at::kFloat, at::kCPU);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config.rank, 4);
  EXPECT_TRUE(at::equal(loaded->score, score));
  auto want = (*adapters)->Named();
  auto got = loaded->adapters->Named();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(*got[i].second, *want[i].second)) << got[i].first;
}

TEST(PeftAdapterTest, RefusesWhatStrataDoesNotImplementByName) {
  testing::TempDir dir;
  const LlamaConfig c = FamilyConfig(ModelFamily::kLlama);
  auto adapters = LoraAdapters::Init(Lora(4), c, at::kFloat, at::kCPU, 5);
  ASSERT_TRUE(adapters.ok());
  ASSERT_TRUE(SavePeftAdapter(dir.path(), **adapters, LlamaHead::kLanguageModel, at::Tensor(), "base").ok());
  const json good = ReadJson(dir.Join(kPeftConfigFile));
  auto refused = [&](const std::string& field, const json& value, const std::string& named) {
    json config = good;
    config[field] = value;
    WriteJson(dir.Join(kPeftConfigFile), config);
    const absl::Status status =
        LoadPeftAdapter(dir.path(), c, LlamaHead::kLanguageModel, at::kFloat, at::kCPU).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(status.message().find(named), std::string::npos) << status;
    EXPECT_NE(status.message().find(kPeftConfigFile), std::string::npos) << status;
  };
  refused("use_dora", true, "use_dora");
  refused("rank_pattern", json({{"q_proj", 8}}), "rank_pattern");
  refused("alpha_pattern", json({{"q_proj", 8}}), "alpha_pattern");
  refused("layers_to_transform", json({0}), "layers_to_transform");
  refused("peft_type", "IA3", "peft_type");
  refused("r", 0, "rank");
  refused("target_modules", json({"q_proj", "c_attn"}), "c_attn");
  refused("modules_to_save", json({"lm_head"}), "modules_to_save");
  // A field of another JSON type is named, never a crash.
  refused("fan_in_fan_out", "no", "fan_in_fan_out");
  refused("r", "four", "r = \"four\"");
  refused("lora_alpha", json::array(), "lora_alpha");
  refused("target_modules", 7, "target_modules");
  refused("peft_type", 3, "peft_type");
  WriteJson(dir.Join(kPeftConfigFile), good);
  ASSERT_TRUE(LoadPeftAdapter(dir.path(), c, LlamaHead::kLanguageModel, at::kFloat, at::kCPU).ok());

  // An adapter of another base: the shapes do not match, named by tensor.
  LlamaConfig wider = c;
  wider.hidden_size = 64;
  const absl::Status status =
      LoadPeftAdapter(dir.path(), wider, LlamaHead::kLanguageModel, at::kFloat, at::kCPU).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), std::string::npos)
      << status;
  // A deeper base than the adapter: a tensor it needs is missing.
  LlamaConfig deeper = c;
  deeper.num_hidden_layers = 3;
  EXPECT_NE(LoadPeftAdapter(dir.path(), deeper, LlamaHead::kLanguageModel, at::kFloat, at::kCPU)
                .status()
                .message()
                .find("no tensor base_model.model.model.layers.2."),
            std::string::npos);
  // A shallower one: a tensor strata would not use.
  LlamaConfig shallower = c;
  shallower.num_hidden_layers = 1;
  EXPECT_NE(LoadPeftAdapter(dir.path(), shallower, LlamaHead::kLanguageModel, at::kFloat, at::kCPU)
                .status()
                .message()
                .find("layers.1."),
            std::string::npos);
}

}  // namespace
}  // namespace strata::policies
