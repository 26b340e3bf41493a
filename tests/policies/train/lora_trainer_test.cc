// The layer-wise trainer with LoRA: only the adapters train, their
// gradients match an independent implementation (PEFT's LoRA forward in
// Debian's python3-torch, tests/policies/model/llama_reference.py), and
// dropout's masks replay in the recomputation.
#include <c10/core/GradMode.h>

#include <nlohmann/json.hpp>

#include "base/file.h"
#include "gtest/gtest.h"
#include "policies/model/lora.h"
#include "policies/model/peft_adapter.h"
#include "policies/train/layerwise_trainer.h"
#include "tests/testutil/testutil.h"

namespace strata::policies {
namespace {

using json = nlohmann::json;

LlamaConfig SmallConfig() {
  LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 32;
  return c;
}

std::unique_ptr<offload::HostArena> Arena() {
  offload::HostArenaOptions options;
  options.capacity_bytes = 16 << 20;
  return std::move(*offload::HostArena::Create(options));
}

// Mean next-token NLL over the positions whose token and next token are
// real: the reference script's loss.
at::Tensor NextTokenLoss(const at::Tensor& logits, const at::Tensor& ids, const at::Tensor& mask) {
  const int64_t t = ids.size(1);
  const at::Tensor logp =
      at::log_softmax(logits.narrow(1, 0, t - 1), -1).gather(-1, ids.narrow(1, 1, t - 1).unsqueeze(-1)).squeeze(-1);
  const at::Tensor real = (mask.narrow(1, 0, t - 1) * mask.narrow(1, 1, t - 1)).to(at::kFloat);
  return -(logp * real).sum() / real.sum();
}

struct Batch {
  at::Tensor ids, mask;
};

Batch LeftPad(const std::vector<std::vector<int64_t>>& prompts) {
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  const int64_t b = static_cast<int64_t>(prompts.size()), t = static_cast<int64_t>(longest);
  at::Tensor ids = at::zeros({b, t}, at::kLong), mask = at::zeros({b, t}, at::kLong);
  for (int64_t r = 0; r < b; ++r) {
    const auto& p = prompts[static_cast<size_t>(r)];
    const int64_t pad = t - static_cast<int64_t>(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      ids[r][pad + static_cast<int64_t>(i)] = p[i];
      mask[r][pad + static_cast<int64_t>(i)] = 1;
    }
  }
  return {ids, mask};
}

class LoraReferenceTest : public ::testing::TestWithParam<const char*> {};

// Logits of the adapted model and the gradients of every A and B under a
// next-token loss, against PEFT's LoRA computed independently in torch; the
// adapter directory itself is one the script wrote by hand in PEFT's layout.
TEST_P(LoraReferenceTest, LogitsAndAdapterGradientsMatchAnIndependentImplementation) {
  const std::string python = testing::ReferencePython();
  auto probe = testing::RunCommand({python, "-c", "import torch"});
  if (!testing::HaveProgram(python) || !probe.ok() || probe->exit_code != 0) {
    GTEST_SKIP() << python << " has no torch (Debian: python3-torch)";
  }
  testing::TempDir out;
  auto run = testing::RunCommand(
      {python, testing::SourcePath("tests/policies/model/llama_reference.py"), out.path(), GetParam(), "lora"});
  ASSERT_TRUE(run.ok() && run->exit_code == 0) << "reference script failed";
  const json expected = json::parse(*ReadFileToString(out.Join("expected.json")));

  auto model = LlamaModel::Load(out.Join("model"), LlamaHead::kLanguageModel, at::kFloat);
  ASSERT_TRUE(model.ok()) << model.status();
  auto peft = LoadPeftAdapter(out.Join("adapter"), (*model)->config(), LlamaHead::kLanguageModel, at::kFloat, at::kCPU);
  ASSERT_TRUE(peft.ok()) << peft.status();
  const Batch batch = LeftPad(expected["prompts"].get<std::vector<std::vector<int64_t>>>());

  (*model)->UseAdapters(peft->adapters.get());
  const at::Tensor logits = (*model)->Logits(batch.ids, batch.mask);
  double worst_logit = 0, logit_scale = 0;
  const auto& rows = expected["lora_padded_logits"];
  for (int64_t r = 0; r < batch.ids.size(0); ++r) {
    for (int64_t t = 0; t < batch.ids.size(1); ++t) {
      if (batch.mask[r][t].item<int64_t>() == 0) continue;
      const at::Tensor want = at::tensor(rows[r][t].get<std::vector<float>>());
      worst_logit = std::max(worst_logit, (logits[r][t] - want).abs().max().item<double>());
      logit_scale = std::max(logit_scale, want.abs().max().item<double>());
    }
  }
  // fp32 both sides, different summation orders over two layers: 1e-5 of
  // the logits' scale (as the family tests of the plain model allow).
  EXPECT_LT(worst_logit, 1e-5 * logit_scale);

  ResidentLayerSource source((*model)->weights().layers);
  auto arena = Arena();
  LayerwiseTrainerOptions options;
  options.adam.threads = 1;
  options.lora = peft->adapters.get();
  auto trainer = LayerwiseTrainer::Create((*model)->config(), LlamaHead::kLanguageModel, (*model)->weights(), &source,
                                          arena.get(), options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto loss = (*trainer)->ForwardBackward(batch.ids, batch.mask, [&](const at::Tensor& out) {
    return NextTokenLoss(out, batch.ids, batch.mask);
  });
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, expected["lora_loss"].get<double>(), 1e-5 * std::abs(expected["lora_loss"].get<double>()));
  ASSERT_EQ(expected["lora_grads"].size(), peft->adapters->Named().size());
  for (const auto& [name, values] : expected["lora_grads"].items()) {
    auto grad = (*trainer)->Gradient(name);
    ASSERT_TRUE(grad.ok()) << grad.status();
    const at::Tensor want = at::tensor(values.get<std::vector<float>>());
    // Each gradient sums over the batch's tokens in another order: 1e-4 of
    // its own scale (a few hundred fp32 products), and the adapters' terms
    // are not small against it, so a missing scale or term would show.
    const double scale = want.abs().max().item<double>();
    ASSERT_GT(scale, 0.0) << name;
    EXPECT_LT((grad->reshape(-1) - want).abs().max().item<double>(), 1e-4 * scale) << name;
  }
  // The base has no trainable state: only the adapters count.
  EXPECT_EQ((*trainer)->num_parameters(), peft->adapters->num_parameters());
  EXPECT_EQ((*trainer)->Gradient("model.embed_tokens.weight").status().code(), absl::StatusCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(Families, LoraReferenceTest, ::testing::Values("qwen2", "qwen3"));

// Steps move the adapters and never the base: every base tensor stays
// bit-exact, the loss falls, and the optimizer holds 12 bytes per adapter
// parameter and nothing for the base.
TEST(LoraTrainerTest, OnlyTheAdaptersTrain) {
  auto model = LlamaModel::RandomInit(SmallConfig(), LlamaHead::kLanguageModel, at::kFloat, 3, 0.2);
  std::map<std::string, at::Tensor> before;
  for (auto& [name, t] : model->NamedParameters()) before[name] = t.clone();
  LoraConfig lora;
  lora.rank = 4;
  auto adapters = LoraAdapters::Init(lora, model->config(), at::kFloat, at::kCPU, 9);
  ASSERT_TRUE(adapters.ok());
  const at::Tensor a0 = (*adapters)->Named()[0].second->clone();
  model->UseAdapters(adapters->get());
  const Batch batch = LeftPad({{3, 9, 14, 2, 7, 1}, {4, 8, 22}});
  const at::Tensor logits_before = model->Logits(batch.ids, batch.mask);
  ResidentLayerSource source(model->weights().layers);
  auto arena = Arena();
  LayerwiseTrainerOptions options;
  options.adam.adam.lr = 1e-2;
  options.adam.threads = 1;
  options.lora = adapters->get();
  auto trainer = LayerwiseTrainer::Create(model->config(), LlamaHead::kLanguageModel, model->weights(), &source,
                                          arena.get(), options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto loss_fn = [&](const at::Tensor& out) { return NextTokenLoss(out, batch.ids, batch.mask); };
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    auto loss = (*trainer)->ForwardBackward(batch.ids, batch.mask, loss_fn);
    ASSERT_TRUE(loss.ok()) << loss.status();
    ASSERT_TRUE((*trainer)->OptimizerStep().ok());
    (step == 0 ? first : last) = *loss;
  }
  EXPECT_LT(last, first - 0.1);
  for (auto& [name, t] : model->NamedParameters()) EXPECT_TRUE(at::equal(t, before[name])) << name;
  EXPECT_FALSE(at::equal(*(*adapters)->Named()[0].second, a0));
  // The model computes with the trained adapters: the trainer updated them in place.
  EXPECT_FALSE(at::equal(model->Logits(batch.ids, batch.mask), logits_before));
  EXPECT_EQ((*trainer)->optimizer_state_bytes(), 12 * (*adapters)->num_parameters());
}

// With dropout, the masks the forward pass drew are the ones the layer's
// recomputation draws: the layer-wise gradients equal those of one autograd
// pass through the whole model with the same keyed masks.
TEST(LoraTrainerTest, DropoutMasksReplayInTheRecomputation) {
  auto model = LlamaModel::RandomInit(SmallConfig(), LlamaHead::kLanguageModel, at::kFloat, 4, 0.2);
  LoraConfig lora;
  lora.rank = 4;
  lora.dropout = 0.3;
  auto adapters = LoraAdapters::Init(lora, model->config(), at::kFloat, at::kCPU, 9);
  ASSERT_TRUE(adapters.ok());
  {
    c10::NoGradGuard no_grad;
    at::Generator gen = at::detail::createCPUGenerator(10);
    for (auto& [name, t] : (*adapters)->Named()) {
      if (name.find("lora_B") != std::string::npos) t->normal_(0.0, 0.3, gen);
    }
  }
  const Batch batch = LeftPad({{3, 9, 14, 2, 7, 1}, {4, 8, 22}});
  constexpr uint64_t kSeed = 77;

  // Reference: autograd through every layer at once, masks of step 0's
  // first micro-batch.
  LoraLayer leaves[3];
  std::vector<at::Tensor*> leaf_tensors;
  for (int64_t l = 0; l < 3; ++l) {
    leaves[l] = (*adapters)->layer(l);
    for (LoraModule m : (*adapters)->modules()) {
      for (at::Tensor* t : {&leaves[l].at(m).a, &leaves[l].at(m).b}) {
        *t = t->detach().requires_grad_();
        leaf_tensors.push_back(t);
      }
    }
  }
  const LayerContext ctx = MakeLayerContext(model->config(), batch.mask, batch.ids.size(1), at::kFloat);
  at::Tensor h = at::embedding(model->weights().embed_tokens, batch.ids);
  for (int64_t l = 0; l < 3; ++l) {
    const LoraApply apply{&leaves[l], lora.scaling(), lora.dropout, LoraDropoutKey(kSeed, 0, 1), l};
    h = DecoderLayerForward(model->config(), model->weights().layers[static_cast<size_t>(l)], h, ctx, nullptr, l,
                            &apply);
  }
  const at::Tensor logits = model->LogitsFromHidden(RmsNorm(h, model->weights().norm, model->config().rms_norm_eps));
  NextTokenLoss(logits, batch.ids, batch.mask).backward();

  ResidentLayerSource source(model->weights().layers);
  auto arena = Arena();
  LayerwiseTrainerOptions options;
  options.adam.threads = 1;
  options.lora = adapters->get();
  options.lora_dropout_seed = kSeed;
  auto trainer = LayerwiseTrainer::Create(model->config(), LlamaHead::kLanguageModel, model->weights(), &source,
                                          arena.get(), options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)
                  ->ForwardBackward(batch.ids, batch.mask,
                                    [&](const at::Tensor& out) { return NextTokenLoss(out, batch.ids, batch.mask); })
                  .ok());
  const auto named = (*adapters)->Named();
  for (size_t i = 0; i < named.size(); ++i) {
    auto grad = (*trainer)->Gradient(named[i].first);
    ASSERT_TRUE(grad.ok());
    const at::Tensor want = leaf_tensors[i]->grad();
    EXPECT_TRUE(at::allclose(*grad, want, 1e-4, 1e-6)) << named[i].first;
  }
}

}  // namespace
}  // namespace strata::policies
