#include "policies/train/layerwise_trainer.h"
#include "policies/train/streamed_layers.h"

#include <map>
#include <thread>

#include "base/interrupt.h"
#include "gtest/gtest.h"
#include "offload/device/device_memory.h"
#include "offload/tiers/placement.h"
#include "policies/checkpoint/safetensors.h"
#include "policies/checkpoint/tensor_io.h"
#include "policies/config/tensor_dealer.h"
#include "policies/dist/process_group.h"
#include "tests/testutil/testutil.h"

#ifdef STRATA_TEST_WITH_GLOO
#include "tests/policies/dist/reduce_scattering_gloo.h"
#endif

namespace strata::policies {
namespace {

LlamaConfig SmallConfig(bool tied) {
  LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = tied;
  return c;
}

at::Tensor NextTokenLoss(const at::Tensor& logits, const at::Tensor& ids) {
  const int64_t t = ids.size(1);
  const at::Tensor logp = at::log_softmax(logits.narrow(1, 0, t - 1), -1);
  return -logp.gather(-1, ids.narrow(1, 1, t - 1).unsqueeze(-1)).mean();
}

struct Batch {
  at::Tensor ids, mask;
};

Batch MakeBatch() {
  at::Tensor ids =
      at::tensor(std::vector<int64_t>{0, 0, 5, 9, 13, 2, 7, 1, 4, 8, 22, 3, 50, 60}, at::kLong).view({2, 7});
  at::Tensor mask = at::ones_like(ids);
  mask[0][0] = 0;
  mask[0][1] = 0;  // left padding
  return {ids, mask};
}

std::unique_ptr<offload::HostArena> Arena() {
  offload::HostArenaOptions options;
  options.capacity_bytes = 16 << 20;
  return std::move(*offload::HostArena::Create(options));
}

LayerwiseTrainerOptions TrainerOptions() {
  LayerwiseTrainerOptions options;
  options.adam.adam.lr = 1e-2;
  options.adam.threads = 1;
  return options;
}

// Layer-at-a-time backward with recomputation gives the gradients that
// full autograd over the whole model gives.
TEST(LayerwiseTrainerTest, GradientsMatchFullAutograd) {
  for (bool tied : {false, true}) {
    auto model = LlamaModel::RandomInit(SmallConfig(tied), LlamaHead::kLanguageModel, at::kFloat, 3, 0.2);
    const Batch batch = MakeBatch();
    auto loss_fn = [&](const at::Tensor& logits) { return NextTokenLoss(logits, batch.ids); };

    // Reference: autograd through the whole model.
    for (auto& [name, t] : model->NamedParameters()) t.requires_grad_(true);
    const at::Tensor ref_loss = loss_fn(model->Logits(batch.ids, batch.mask));
    ref_loss.backward();

    auto arena = Arena();
    ResidentLayerSource source(model->weights().layers);
    auto trainer = LayerwiseTrainer::Create(model->config(), LlamaHead::kLanguageModel, model->weights(), &source,
                                            arena.get(), TrainerOptions());
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    auto loss = (*trainer)->ForwardBackward(batch.ids, batch.mask, loss_fn);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_NEAR(*loss, ref_loss.item<double>(), 1e-6);
    for (auto& [name, t] : model->NamedParameters()) {
      auto grad = (*trainer)->Gradient(name);
      ASSERT_TRUE(grad.ok()) << name;
      EXPECT_LT((*grad - t.grad()).abs().max().item<float>(), 1e-5) << name << (tied ? " tied" : " untied");
    }
  }
}

// An interrupt (a cancelled job) stops a training pass at the next layer.
TEST(LayerwiseTrainerTest, InterruptStopsThePassAtALayer) {
  auto model = LlamaModel::RandomInit(SmallConfig(false), LlamaHead::kLanguageModel, at::kFloat, 3, 0.2);
  const Batch batch = MakeBatch();
  auto loss_fn = [&](const at::Tensor& logits) { return NextTokenLoss(logits, batch.ids); };
  auto arena = Arena();
  ResidentLayerSource source(model->weights().layers);
  auto trainer = LayerwiseTrainer::Create(model->config(), LlamaHead::kLanguageModel, model->weights(), &source,
                                          arena.get(), TrainerOptions());
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  RequestInterrupt();
  auto stopped = (*trainer)->ForwardBackward(batch.ids, batch.mask, loss_fn);
  ClearInterrupt();
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled) << stopped.status();
  EXPECT_TRUE((*trainer)->ForwardBackward(batch.ids, batch.mask, loss_fn).ok());
}

// The GPU's gradient path (downloads into staging buffers, added to the
// host gradients one layer later), run on the CPU device: the same
// gradients as direct accumulation, over two accumulated batches; and a
// clear error when the arena has no room for the staging buffers.
TEST(LayerwiseTrainerTest, StagedGradientsEqualDirectOnes) {
  const Batch batch = MakeBatch();
  auto loss_fn = [&](const at::Tensor& logits) { return NextTokenLoss(logits, batch.ids); };
  std::vector<std::map<std::string, at::Tensor>> grads;
  for (bool staged : {false, true}) {
    auto model = LlamaModel::RandomInit(SmallConfig(false), LlamaHead::kLanguageModel, at::kFloat, 3, 0.2);
    auto arena = Arena();
    ResidentLayerSource source(model->weights().layers);
    LayerwiseTrainerOptions options = TrainerOptions();
    options.stage_gradients = staged;
    auto trainer = LayerwiseTrainer::Create(model->config(), LlamaHead::kLanguageModel, model->weights(), &source,
                                            arena.get(), options);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const size_t live_before = arena->stats().live_buffers;
    for (int i = 0; i < 2; ++i) ASSERT_TRUE((*trainer)->ForwardBackward(batch.ids, batch.mask, loss_fn).ok());
    EXPECT_EQ(arena->stats().live_buffers, live_before) << "staging buffers not returned";
    grads.emplace_back();
    for (auto& [name, t] : model->NamedParameters()) grads.back()[name] = *(*trainer)->Gradient(name);
  }
  for (const auto& [name, direct] : grads[0]) {
    EXPECT_TRUE(at::equal(direct, grads[1].at(name))) << name;
  }

  // 8 KiB beyond the optimizer states: no room to stage a layer.
  auto model = LlamaModel::RandomInit(SmallConfig(false), LlamaHead::kLanguageModel, at::kFloat, 3, 0.2);
  offload::HostArenaOptions small;
  small.capacity_bytes = static_cast<size_t>(model->config().NumParameters()) * 16 + 64 * 4096 + 8192;
  auto arena = std::move(*offload::HostArena::Create(small));
  ResidentLayerSource source(model->weights().layers);
  LayerwiseTrainerOptions options = TrainerOptions();
  options.stage_gradients = true;
  auto trainer = LayerwiseTrainer::Create(model->config(), LlamaHead::kLanguageModel, model->weights(), &source,
                                          arena.get(), options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const auto loss = (*trainer)->ForwardBackward(batch.ids, batch.mask, loss_fn);
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(loss.status().message().find("gradient staging"), std::string::npos) << loss.status();
}

// Every placement the engine supports runs the same math: the losses of
// several training steps equal those of resident weights with host Adam.
class PlacementTest : public ::testing::TestWithParam<offload::ModelPlacement> {};

std::vector<double> TrainWithPlacement(const offload::ModelPlacement& placement, int steps) {
  const Batch batch = MakeBatch();
  auto loss_fn = [&](const at::Tensor& logits) { return NextTokenLoss(logits, batch.ids); };
  auto model = LlamaModel::RandomInit(SmallConfig(false), LlamaHead::kLanguageModel, at::kFloat, 3, 0.2);
  auto arena = Arena();
  testing::TempDir dir;
  std::unique_ptr<offload::NvmeStore> store;
  if (placement.weights == offload::Tier::kNvme || placement.optimizer == offload::Tier::kNvme ||
      placement.activations == offload::Tier::kNvme) {
    offload::NvmeStoreOptions store_options;
    store_options.directory = dir.path();
    store = offload::SynchronizedNvmeStore(std::move(*offload::NvmeStore::Open(store_options)));
  }
  LlamaWeights weights = model->weights();  // shares storage with the model
  std::unique_ptr<offload::LayerStreamer> streamer;
  std::unique_ptr<LayerSource> source;
  if (placement.weights == offload::Tier::kDevice) {
    source = std::make_unique<ResidentLayerSource>(weights.layers);
  } else {
    offload::LayerStreamerOptions options;
    options.home = placement.weights;
    options.prefetch_depth = placement.prefetch_depth;
    streamer = std::move(*offload::LayerStreamer::Create(options, arena.get(), store.get(), nullptr));
    EXPECT_TRUE(AddLayersToStreamer(weights.layers, streamer.get()).ok());
    source = std::make_unique<StreamedLayerSource>(streamer.get());
  }
  weights.layers.clear();
  LayerwiseTrainerOptions options = TrainerOptions();
  options.optimizer = placement.optimizer;
  options.gradients = placement.gradients;
  options.step_in_backward = placement.step_in_backward;
  options.activations = placement.activations;
  options.nvme_adam.tile_elements = 1024;
  auto trainer = LayerwiseTrainer::Create(model->config(), LlamaHead::kLanguageModel, weights, source.get(),
                                          arena.get(), options, store.get());
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return {};
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    auto loss = (*trainer)->ForwardBackward(batch.ids, batch.mask, loss_fn);
    EXPECT_TRUE(loss.ok()) << loss.status();
    losses.push_back(loss.ok() ? *loss : 0);
    EXPECT_TRUE((*trainer)->OptimizerStep().ok());
  }
  return losses;
}

TEST_P(PlacementTest, LossesEqualResidentWithHostAdam) {
  const auto baseline = TrainWithPlacement(offload::ModelPlacement{}, 4);
  const auto losses = TrainWithPlacement(GetParam(), 4);
  ASSERT_EQ(losses.size(), baseline.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(losses[i], baseline[i], 1e-6) << "step " << i << " with " << GetParam().ToString();
  }
  EXPECT_LT(losses.back(), losses.front());  // it trains
}

offload::ModelPlacement Place(offload::Tier weights, offload::Tier optimizer, offload::Tier gradients,
                              bool step_in_backward = false) {
  offload::ModelPlacement p;
  p.weights = weights;
  p.optimizer = optimizer;
  p.gradients = gradients;
  p.step_in_backward = step_in_backward;
  return p;
}

offload::ModelPlacement WithActivations(offload::ModelPlacement p, offload::Tier activations) {
  p.activations = activations;
  return p;
}

using offload::Tier;
INSTANTIATE_TEST_SUITE_P(
    Placements, PlacementTest,
    ::testing::Values(Place(Tier::kHost, Tier::kHost, Tier::kHost), Place(Tier::kNvme, Tier::kHost, Tier::kHost),
                      Place(Tier::kDevice, Tier::kNvme, Tier::kHost), Place(Tier::kNvme, Tier::kNvme, Tier::kHost),
                      Place(Tier::kDevice, Tier::kDevice, Tier::kDevice),
                      // Each layer updated as its backward ends: the same steps.
                      Place(Tier::kDevice, Tier::kHost, Tier::kHost, true),
                      Place(Tier::kHost, Tier::kHost, Tier::kHost, true),
                      Place(Tier::kNvme, Tier::kNvme, Tier::kHost, true),
                      // Activations off the device (SSDTrain): the same steps.
                      WithActivations(Place(Tier::kDevice, Tier::kHost, Tier::kHost), Tier::kHost),
                      WithActivations(Place(Tier::kDevice, Tier::kHost, Tier::kHost), Tier::kNvme),
                      WithActivations(Place(Tier::kNvme, Tier::kNvme, Tier::kHost, true), Tier::kNvme)),
    [](const auto& info) {
      const offload::ModelPlacement& p = info.param;
      return std::string(offload::TierName(p.weights)) + "_" + offload::TierName(p.optimizer) + "_" +
             offload::TierName(p.gradients) + (p.step_in_backward ? "_step_in_backward" : "") +
             (p.activations != offload::Tier::kDevice ? std::string("_activations_") + offload::TierName(p.activations)
                                                      : "");
    });

// SSDTrain's offload: a long sequence's layer inputs kept on the host or
// NVMe instead of the device give the very same loss and gradients, and
// the device holds a window of them instead of the stack (the planner's
// KeptActivationBytes: three instead of layers + 1).
TEST(LayerwiseTrainerTest, ActivationsOffTheDeviceGiveTheSameGradientsAndKeepAWindow) {
  LlamaConfig c = SmallConfig(false);
  c.hidden_size = 64, c.intermediate_size = 96, c.head_dim = 16, c.num_hidden_layers = 10;
  c.max_position_embeddings = 2048;
  auto model = LlamaModel::RandomInit(c, LlamaHead::kLanguageModel, at::kFloat, 8, 0.2);
  const int64_t t = 1024;  // blocked attention: t * t reaches kBlockedAttentionScores
  at::Generator gen = at::detail::createCPUGenerator(11);
  const at::Tensor ids = at::randint(c.vocab_size, {1, t}, gen, at::kLong);
  at::Tensor mask = at::ones_like(ids);
  mask.narrow(1, 0, 5).zero_();  // left padding
  auto loss_fn = [&](const at::Tensor& logits) { return NextTokenLoss(logits, ids); };
  offload::DeviceMemoryMonitor& monitor = offload::DeviceMemoryMonitor::Install();
  testing::TempDir dir;
  offload::NvmeStoreOptions store_options;
  store_options.directory = dir.path();
  auto store = std::move(*offload::NvmeStore::Open(store_options));

  struct Result {
    double loss = 0;
    std::map<std::string, at::Tensor> grads;
    size_t peak = 0;
  };
  auto run = [&](offload::Tier activations) {
    Result r;
    offload::HostArenaOptions arena_options;
    arena_options.capacity_bytes = 64 << 20;
    auto arena = std::move(*offload::HostArena::Create(arena_options));
    ResidentLayerSource source(model->weights().layers);
    LayerwiseTrainerOptions options = TrainerOptions();
    options.activations = activations;
    auto trainer = LayerwiseTrainer::Create(c, LlamaHead::kLanguageModel, model->weights(), &source, arena.get(),
                                            options, store.get());
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    if (!trainer.ok()) return r;
    monitor.ResetPeak();
    const size_t before = monitor.current_bytes();
    auto loss = (*trainer)->ForwardBackward(ids, mask, loss_fn);
    EXPECT_TRUE(loss.ok()) << loss.status();
    r.peak = monitor.peak_bytes() - before;
    r.loss = loss.ok() ? *loss : 0;
    for (auto& [name, tensor] : model->NamedParameters()) r.grads[name] = *(*trainer)->Gradient(name);
    return r;
  };
  const Result kept = run(offload::Tier::kDevice);
  const double activation = static_cast<double>(t * c.hidden_size * 4);
  for (offload::Tier tier : {offload::Tier::kHost, offload::Tier::kNvme}) {
    const Result off = run(tier);
    EXPECT_EQ(off.loss, kept.loss) << offload::TierName(tier);
    for (const auto& [name, grad] : kept.grads) {
      EXPECT_TRUE(at::equal(off.grads.at(name), grad)) << name << " with activations on " << offload::TierName(tier);
    }
    // Ten layers' inputs and the top's kept, against a window of three:
    // the peak drops by at least eight of them.
    EXPECT_GE(static_cast<double>(kept.peak) - static_cast<double>(off.peak),
              (c.num_hidden_layers + 1 - 3) * activation)
        << offload::TierName(tier) << ": " << kept.peak << " vs " << off.peak;
  }
  EXPECT_TRUE(store->Ids().empty());  // activations never enter the store
}

TEST(LayerwiseTrainerTest, StepInBackwardKeepsNoLayerGradientsAndTakesOnePassPerStep) {
  const Batch batch = MakeBatch();
  auto loss_fn = [&](const at::Tensor& logits) { return NextTokenLoss(logits, batch.ids); };
  auto model = LlamaModel::RandomInit(SmallConfig(false), LlamaHead::kLanguageModel, at::kFloat, 3, 0.2);
  LlamaWeights weights = model->weights();
  ResidentLayerSource source(weights.layers);
  weights.layers.clear();
  LayerwiseTrainerOptions options = TrainerOptions();
  options.step_in_backward = true;
  // The arena holds master weights and moments (12 B a parameter) and the
  // resident tensors' gradients, not the layers' 4 B a parameter.
  auto arena = Arena();
  const size_t before = arena->stats().requested_bytes;
  auto trainer = LayerwiseTrainer::Create(model->config(), LlamaHead::kLanguageModel, weights, &source, arena.get(),
                                          options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const LlamaConfig& c = model->config();
  const int64_t resident = c.NumParameters() - c.num_hidden_layers * c.LayerParameters();
  EXPECT_LE(arena->stats().requested_bytes - before,
            static_cast<size_t>(12 * c.NumParameters() + 4 * resident) + (64 << 10));
  ASSERT_TRUE((*trainer)->ForwardBackward(batch.ids, batch.mask, loss_fn).ok());
  EXPECT_GT((*trainer)->Gradient("lm_head.weight")->abs().sum().item<double>(), 0.0);
  EXPECT_EQ((*trainer)->Gradient("model.layers.0.mlp.up_proj.weight").status().code(),
            absl::StatusCode::kFailedPrecondition);
  // The layers stepped already: a second pass would need their gradients.
  auto again = (*trainer)->ForwardBackward(batch.ids, batch.mask, loss_fn);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  ASSERT_TRUE((*trainer)->OptimizerStep().ok());
  EXPECT_GT((*trainer)->last_grad_norm(), 0.0);
  EXPECT_TRUE((*trainer)->ForwardBackward(batch.ids, batch.mask, loss_fn).ok());

  options.max_grad_norm = 1.0;
  EXPECT_FALSE(
      LayerwiseTrainer::Create(model->config(), LlamaHead::kLanguageModel, weights, &source, arena.get(), options)
          .ok());
}

TEST(PlacementValidationTest, ImpossibleCombinationsNameTheField) {
  EXPECT_NE(Place(Tier::kHost, Tier::kDevice, Tier::kDevice).Validate().message().find("placement.optimizer"),
            std::string::npos);
  EXPECT_NE(Place(Tier::kDevice, Tier::kHost, Tier::kDevice).Validate().message().find("placement.gradients"),
            std::string::npos);
  EXPECT_FALSE(Place(Tier::kDevice, Tier::kHost, Tier::kNvme).Validate().ok());
  EXPECT_TRUE(Place(Tier::kNvme, Tier::kNvme, Tier::kHost).Validate().ok());
}

// The done-when of the offload engine: a step of a model whose weights and
// optimizer states are several times the device budget completes with the
// measured device peak (every libtorch allocation) under the budget.
TEST(LayerwiseTrainerTest, StreamedStepStaysUnderADeviceBudgetFarBelowTheModel) {
  offload::DeviceMemoryMonitor& monitor = offload::DeviceMemoryMonitor::Install();
  LlamaConfig c = SmallConfig(false);
  c.vocab_size = 128;
  c.hidden_size = 128;
  c.intermediate_size = 384;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.head_dim = 32;
  c.num_hidden_layers = 24;
  auto model = LlamaModel::RandomInit(c, LlamaHead::kLanguageModel, at::kFloat, 5);
  const Batch batch = MakeBatch();
  const int64_t b = batch.ids.size(0), t = batch.ids.size(1);

  offload::HostArenaOptions arena_options;
  arena_options.capacity_bytes = static_cast<size_t>(c.NumParameters()) * 24 + (16 << 20);
  auto arena = std::move(*offload::HostArena::Create(arena_options));
  offload::LayerStreamerOptions options;
  options.prefetch_depth = 1;
  options.compute_reserve_bytes = LayerWorkingBytes(c, b, t, at::kFloat, /*training=*/true);
  const size_t layer_bytes = 4 * (4 * 128 * 128 + 3 * 128 * 384 + 2 * 128);
  const size_t resident = 4 * 2 * 128 * 128;
  options.device_budget_bytes = monitor.current_bytes() + 2 * resident + 2 * layer_bytes +
                                options.compute_reserve_bytes + (1 << 20);
  auto streamer = std::move(*offload::LayerStreamer::Create(options, arena.get(), nullptr, nullptr));
  LlamaWeights weights = model->weights();  // shares storage; the model is dropped below
  model.reset();
  ASSERT_TRUE(AddLayersToStreamer(std::move(weights.layers), streamer.get()).ok());
  weights.layers.clear();
  StreamedLayerSource source(streamer.get());
  auto trainer = LayerwiseTrainer::Create(c, LlamaHead::kLanguageModel, weights, &source, arena.get(),
                                          TrainerOptions());
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const size_t weights_and_optimizer = static_cast<size_t>(c.NumParameters()) * 16;
  ASSERT_GT(weights_and_optimizer, 3 * (options.device_budget_bytes - monitor.current_bytes()));

  monitor.ResetPeak();
  auto loss = (*trainer)->ForwardBackward(batch.ids, batch.mask,
                                          [&](const at::Tensor& logits) { return NextTokenLoss(logits, batch.ids); });
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_TRUE((*trainer)->OptimizerStep().ok());
  EXPECT_LE(monitor.peak_bytes(), options.device_budget_bytes);
}

TEST(LayerwiseTrainerTest, ScalarHeadTrains) {
  auto model = LlamaModel::RandomInit(SmallConfig(false), LlamaHead::kScalar, at::kFloat, 4, 0.2);
  auto arena = Arena();
  ResidentLayerSource source(model->weights().layers);
  auto trainer = LayerwiseTrainer::Create(model->config(), LlamaHead::kScalar, model->weights(), &source, arena.get(),
                                          TrainerOptions());
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const Batch batch = MakeBatch();
  const at::Tensor target = at::tensor(std::vector<float>{1.0f, -1.0f}).view({2, 1});
  auto loss_fn = [&](const at::Tensor& values) { return (AtLastToken(values, batch.mask) - target).pow(2).mean(); };
  double first = 0, last = 0;
  for (int step = 0; step < 10; ++step) {
    auto loss = (*trainer)->ForwardBackward(batch.ids, batch.mask, loss_fn);
    ASSERT_TRUE(loss.ok());
    if (step == 0) first = *loss;
    last = *loss;
    ASSERT_TRUE((*trainer)->OptimizerStep().ok());
  }
  EXPECT_LT(last, first * 0.5);
}

// train.max_grad_norm: the global norm over every parameter, measured as
// torch measures it, and the gradients scaled by torch's clip_grad_norm_
// coefficient before Adam. Checked exactly through the first moments
// (exp_avg = (1 - beta1) * gradient after one step), since Adam's first
// update barely depends on the gradient's scale.
TEST(LayerwiseTrainerTest, GradientClippingUsesTheGlobalNormAsTorchDoes) {
  auto model = LlamaModel::RandomInit(SmallConfig(false), LlamaHead::kLanguageModel, at::kFloat, 3, 0.2);
  const Batch batch = MakeBatch();
  auto loss_fn = [&](const at::Tensor& logits) { return NextTokenLoss(logits, batch.ids); };
  for (auto& [name, t] : model->NamedParameters()) t.requires_grad_(true);
  loss_fn(model->Logits(batch.ids, batch.mask)).backward();
  double squares = 0;
  for (auto& [name, t] : model->NamedParameters()) squares += t.grad().pow(2).sum().item<double>();
  const double norm = std::sqrt(squares);

  for (double max_norm : {0.0, norm / 4, norm * 4}) {
    auto copy = LlamaModel::RandomInit(SmallConfig(false), LlamaHead::kLanguageModel, at::kFloat, 3, 0.2);
    auto arena = Arena();
    ResidentLayerSource source(copy->weights().layers);
    LayerwiseTrainerOptions options = TrainerOptions();
    options.max_grad_norm = max_norm;
    auto trainer = LayerwiseTrainer::Create(copy->config(), LlamaHead::kLanguageModel, copy->weights(), &source,
                                            arena.get(), options);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    ASSERT_TRUE((*trainer)->ForwardBackward(batch.ids, batch.mask, loss_fn).ok());
    ASSERT_TRUE((*trainer)->OptimizerStep().ok());
    EXPECT_NEAR((*trainer)->last_grad_norm(), norm, norm * 1e-5) << max_norm;
    testing::TempDir dir;
    ASSERT_TRUE((*trainer)->SaveState(dir.Join("state.safetensors")).ok());
    auto state = SafetensorsFile::Open(dir.Join("state.safetensors"));
    ASSERT_TRUE(state.ok()) << state.status();
    const double coefficient = max_norm > 0 ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
    const double beta1 = options.adam.adam.beta1;
    for (auto& [name, t] : model->NamedParameters()) {
      const TensorView* m = (*state)->Find(name + ".exp_avg");
      ASSERT_NE(m, nullptr) << name;
      const at::Tensor exp_avg = *ToTensor(*m, at::kFloat);
      const at::Tensor want = t.grad().reshape(-1) * ((1 - beta1) * coefficient);
      EXPECT_LT((exp_avg.reshape(-1) - want).abs().max().item<float>(), 1e-6) << name << " max_norm " << max_norm;
    }
  }
}

// The learning rate changes between steps (schedules), for the host and
// the device optimizer alike; a negative one is refused.
TEST(LayerwiseTrainerTest, SetLearningRateChangesTheNextStep) {
  for (offload::Tier optimizer : {offload::Tier::kHost, offload::Tier::kDevice}) {
    auto model = LlamaModel::RandomInit(SmallConfig(false), LlamaHead::kLanguageModel, at::kFloat, 3, 0.2);
    const at::Tensor before = model->weights().norm.clone();
    const Batch batch = MakeBatch();
    auto loss_fn = [&](const at::Tensor& logits) { return NextTokenLoss(logits, batch.ids); };
    auto arena = Arena();
    ResidentLayerSource source(model->weights().layers);
    LayerwiseTrainerOptions options = TrainerOptions();
    options.optimizer = optimizer;
    options.gradients = optimizer == offload::Tier::kDevice ? offload::Tier::kDevice : offload::Tier::kHost;
    auto trainer = LayerwiseTrainer::Create(model->config(), LlamaHead::kLanguageModel, model->weights(), &source,
                                            arena.get(), options);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    EXPECT_EQ((*trainer)->SetLearningRate(-1).code(), absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE((*trainer)->SetLearningRate(0.0).ok());
    ASSERT_TRUE((*trainer)->ForwardBackward(batch.ids, batch.mask, loss_fn).ok());
    ASSERT_TRUE((*trainer)->OptimizerStep().ok());
    EXPECT_TRUE(at::equal(model->weights().norm, before)) << "lr 0 moved the weights";
    ASSERT_TRUE((*trainer)->SetLearningRate(1e-2).ok());
    ASSERT_TRUE((*trainer)->ForwardBackward(batch.ids, batch.mask, loss_fn).ok());
    ASSERT_TRUE((*trainer)->OptimizerStep().ok());
    EXPECT_FALSE(at::equal(model->weights().norm, before));
  }
}

// Micro-batches: two halves of a batch, each loss scaled by its share,
// accumulate the whole batch's gradients.
TEST(LayerwiseTrainerTest, MicroBatchesAccumulateTheWholeBatchGradients) {
  auto model = LlamaModel::RandomInit(SmallConfig(false), LlamaHead::kLanguageModel, at::kFloat, 3, 0.2);
  const Batch batch = MakeBatch();
  auto arena = Arena();
  ResidentLayerSource source(model->weights().layers);
  auto trainer = LayerwiseTrainer::Create(model->config(), LlamaHead::kLanguageModel, model->weights(), &source,
                                          arena.get(), TrainerOptions());
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto loss_of = [](const at::Tensor& ids) {
    return [ids](const at::Tensor& logits) { return NextTokenLoss(logits, ids); };
  };
  ASSERT_TRUE((*trainer)->ForwardBackward(batch.ids, batch.mask, loss_of(batch.ids)).ok());
  std::map<std::string, at::Tensor> whole;
  for (auto& [name, t] : model->NamedParameters()) whole[name] = (*trainer)->Gradient(name)->clone();
  ASSERT_TRUE((*trainer)->SetLearningRate(0).ok());
  ASSERT_TRUE((*trainer)->OptimizerStep().ok());  // zeroes the gradients, moves nothing

  // NextTokenLoss is a mean over each row's tokens, and both rows have 6.
  for (int64_t row = 0; row < 2; ++row) {
    const at::Tensor ids = batch.ids.narrow(0, row, 1), mask = batch.mask.narrow(0, row, 1);
    auto half = [&](const at::Tensor& logits) { return NextTokenLoss(logits, ids) * 0.5; };
    ASSERT_TRUE((*trainer)->ForwardBackward(ids, mask, half, /*sum_over_gang=*/row == 1).ok());
  }
  for (auto& [name, t] : model->NamedParameters()) {
    const at::Tensor accumulated = *(*trainer)->Gradient(name);
    EXPECT_LT((accumulated - whole[name]).abs().max().item<float>(), 1e-6) << name;
  }
}

using RankWeights = std::map<std::string, at::Tensor>;

struct ShardedStepResult {
  std::vector<RankWeights> before, after;  // each rank's weights
  std::vector<double> grad_norms;          // each rank's last_grad_norm()
  std::vector<int64_t> state_bytes;        // each rank's optimizer_state_bytes()
};

// One ZeRO step of a gang of two, rank r on `groups[r]`: each rank its own
// row, weighing half of the batch, in two micro-batches (ZeRO-2 sums each).
ShardedStepResult ShardedStep(const std::vector<std::unique_ptr<ProcessGroup>>& groups, at::ScalarType dtype,
                              double max_grad_norm = 0.0) {
  ShardedStepResult result;
  result.before.resize(2);
  result.after.resize(2);
  result.grad_norms.resize(2);
  result.state_bytes.resize(2);
  const Batch batch = MakeBatch();
  std::vector<absl::Status> statuses(2);
  auto rank_body = [&](int rank) {
    const size_t r = static_cast<size_t>(rank);
    absl::Status& status = statuses[r];
    auto model = LlamaModel::RandomInit(SmallConfig(false), LlamaHead::kLanguageModel, dtype, 3, 0.2);
    for (auto& [name, t] : model->NamedParameters()) result.before[r][name] = t.clone();
    auto arena = Arena();
    ResidentLayerSource source(model->weights().layers);
    LayerwiseTrainerOptions options = TrainerOptions();
    options.data_parallel = groups[r].get();
    options.max_grad_norm = max_grad_norm;
    auto trainer = LayerwiseTrainer::Create(model->config(), LlamaHead::kLanguageModel, model->weights(), &source,
                                            arena.get(), options);
    if (!trainer.ok()) {
      status = trainer.status();
      return;
    }
    const at::Tensor ids = batch.ids.narrow(0, rank, 1), mask = batch.mask.narrow(0, rank, 1);
    for (int micro = 0; micro < 2 && status.ok(); ++micro) {
      const at::Tensor part_ids = ids.narrow(1, 0, 5 + micro * 2), part_mask = mask.narrow(1, 0, 5 + micro * 2);
      auto quarter = [&](const at::Tensor& logits) { return NextTokenLoss(logits, part_ids) * 0.25; };
      status = (*trainer)->ForwardBackward(part_ids, part_mask, quarter, /*sum_over_gang=*/micro == 1).status();
    }
    if (status.ok()) status = (*trainer)->OptimizerStep();
    result.grad_norms[r] = (*trainer)->last_grad_norm();
    result.state_bytes[r] = (*trainer)->optimizer_state_bytes();
    for (auto& [name, t] : model->NamedParameters()) result.after[r][name] = t.clone();
  };
  std::thread other(rank_body, 1);
  rank_body(0);
  other.join();
  EXPECT_TRUE(statuses[0].ok()) << statuses[0];
  EXPECT_TRUE(statuses[1].ok()) << statuses[1];
  return result;
}

// ZeRO-1 in a gang of two: each rank updates the tensors it holds and
// broadcasts them in the model's dtype, one flat buffer per layer; after
// the step both ranks' models are the same bit for bit, in fp32 and in
// bf16 (which crosses as bytes: Gloo has no bf16), and they moved.
TEST(LayerwiseTrainerTest, ShardedStepLeavesEveryRankTheSameWeights) {
  if (!ProcessGroup::Available(Backend::kGloo)) GTEST_SKIP() << "this build has no Gloo";
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    auto groups = ProcessGroup::CreateInProcess(2, std::chrono::milliseconds(20000));
    ASSERT_TRUE(groups.ok()) << groups.status();
    const ShardedStepResult step = ShardedStep(*groups, dtype);
    int moved = 0;
    for (const auto& [name, value] : step.after[0]) {
      EXPECT_TRUE(step.before[0].at(name).equal(step.before[1].at(name))) << name << ": the ranks started apart";
      EXPECT_TRUE(value.equal(step.after[1].at(name))) << c10::toString(dtype) << " " << name;
      if (!value.equal(step.before[0].at(name))) ++moved;
    }
    EXPECT_EQ(moved, static_cast<int>(step.after[0].size())) << c10::toString(dtype);
    // Each rank holds master weights and moments (12 bytes a parameter) of
    // what TensorDealer deals it, which is what the memory planner counts.
    TensorDealer dealer(2);
    for (int64_t elements : SmallConfig(false).TrainedTensorElements(/*scalar_head=*/false)) dealer.Deal(elements);
    EXPECT_EQ(step.state_bytes, (std::vector<int64_t>{12 * dealer.dealt()[0], 12 * dealer.dealt()[1]}));
  }
}

#ifdef STRATA_TEST_WITH_GLOO
// ZeRO-2 through a reduce-scatter (NCCL's branch, run on a Gloo that has
// one): a rank receives the sums of the tensors it holds only, and the
// gradients it borrowed for the others are left unsummed. Nothing in the
// step may read those: clipping's global norm, the update and the weight
// broadcast give the all-reduce branch's weights, bit for bit (two ranks
// add a + b either way).
TEST(LayerwiseTrainerTest, ReduceScatteredStepEqualsTheAllReducedOne) {
  auto all_reducing = ProcessGroup::CreateInProcess(2, std::chrono::milliseconds(20000));
  ASSERT_TRUE(all_reducing.ok()) << all_reducing.status();
  const ShardedStepResult expected = ShardedStep(*all_reducing, at::kFloat, /*max_grad_norm=*/0.05);
  ReduceScatteringGang gang = MakeReduceScatteringGang(2);
  const ShardedStepResult got = ShardedStep(gang.groups, at::kFloat, /*max_grad_norm=*/0.05);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_GT(gang.backends[static_cast<size_t>(rank)]->calls, 0) << "rank " << rank << " never reduce-scattered";
  }
  EXPECT_GT(expected.grad_norms[0], 0.05);  // the clipping acted
  for (size_t rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(got.grad_norms[rank], expected.grad_norms[rank]) << "rank " << rank;
    for (const auto& [name, value] : expected.after[rank]) {
      EXPECT_TRUE(got.after[rank].at(name).equal(value)) << "rank " << rank << " " << name;
    }
  }
}
#endif

}  // namespace
}  // namespace strata::policies
