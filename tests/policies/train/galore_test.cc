// GaLore: the projection (a randomized range finder against the exact
// SVD), the step against an independent reference written from the paper
// (Debian's python3-torch, tests/policies/train/galore_reference.py), the
// identity projection against AdamW, the refresh schedule, and the trainer
// with GaLore on every optimizer tier, resumed from its state and in a gang.
#include "policies/train/galore.h"

#include <c10/core/GradMode.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/match.h"
#include "base/file.h"
#include "gtest/gtest.h"
#include "policies/checkpoint/safetensors.h"
#include "policies/checkpoint/tensor_io.h"
#include "policies/dist/process_group.h"
#include "policies/train/layerwise_trainer.h"
#include "policies/train/streamed_layers.h"
#include "tests/policies/model/tiny_config.h"
#include "tests/testutil/testutil.h"

namespace strata::policies {
namespace {

using json = nlohmann::json;

offload::AdamOptions Adam() {
  offload::AdamOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  return o;
}

GaloreConfig Config(int64_t rank, int64_t gap = 200, double scale = 0.25) {
  GaloreConfig c;
  c.rank = rank;
  c.update_proj_gap = gap;
  c.scale = scale;
  return c;
}

std::unique_ptr<GaloreMatrix> Matrix(int64_t rows, int64_t cols, const GaloreConfig& config) {
  auto m = GaloreMatrix::Create(rows, cols, config,
                                [](const std::vector<int64_t>& shape) -> absl::StatusOr<at::Tensor> {
                                  return at::zeros(shape, at::kFloat);
                                });
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

std::unique_ptr<offload::CpuAdam> CpuAdam(const offload::AdamOptions& adam) {
  offload::CpuAdamOptions options;
  options.adam = adam;
  options.threads = 1;
  return std::move(*offload::CpuAdam::Create(options));
}

// W <- W (1 - lr wd) - lr D, as the trainer applies a GaLore direction.
void Apply(offload::CpuAdam& adam, at::Tensor& w, const at::Tensor& direction) {
  const at::Tensor d = direction.contiguous();
  offload::DirectionSpan span;
  span.param = {w.data_ptr<float>(), static_cast<size_t>(w.numel())};
  span.direction = {d.data_ptr<float>(), static_cast<size_t>(d.numel())};
  ASSERT_TRUE(adam.ApplyDirection({&span, 1}).ok());
}

// A [rows, cols] matrix with singular values decay^i over random singular
// vectors, plus a little noise: a gradient's shape of spectrum.
at::Tensor DecayingSpectrum(int64_t rows, int64_t cols, double decay, uint64_t seed) {
  at::manual_seed(seed);
  const int64_t k = std::min(rows, cols);
  const at::Tensor u = std::get<0>(at::linalg_qr(at::randn({rows, k})));
  const at::Tensor v = std::get<0>(at::linalg_qr(at::randn({cols, k})));
  const at::Tensor s = at::pow(at::full({k}, decay), at::arange(k, at::kFloat));
  return at::matmul(u * s, v.t()) + 1e-4 * at::randn({rows, cols});
}

// The randomized projection holds (nearly) all the energy of the exact top-r
// subspace; its columns are orthonormal; the same key draws the same.
TEST(GaloreTest, TopLeftSingularVectorsHoldTheTopSubspacesEnergy) {
  for (const auto& [rows, cols, rank] : {std::tuple{96, 200, 8}, std::tuple{64, 64, 16}, std::tuple{40, 300, 40}}) {
    const at::Tensor g = DecayingSpectrum(rows, cols, 0.9, 7);
    const at::Tensor p = TopLeftSingularVectors(g, rank, 42);
    ASSERT_EQ(p.sizes(), (std::vector<int64_t>{rows, rank}));
    // Orthonormal to fp32 rounding of a length-`rows` dot product.
    EXPECT_LT((at::matmul(p.t(), p) - at::eye(rank)).abs().max().item<double>(), 1e-5);
    const at::Tensor s = at::linalg_svdvals(g.to(at::kDouble));
    const double best = s.narrow(0, 0, rank).pow(2).sum().item<double>();
    const double held = at::matmul(p.t(), g).to(at::kDouble).pow(2).sum().item<double>();
    // The error this accepts: at most 0.1% of the top-r energy left out
    // (two power iterations on a 0.9 decay leave far less).
    EXPECT_GT(held, (1 - 1e-3) * best) << rows << "x" << cols << " rank " << rank;
    EXPECT_LE(held, best * (1 + 1e-5));
    EXPECT_TRUE(p.equal(TopLeftSingularVectors(g, rank, 42)));
    // Each column's sign is fixed (its largest entry positive): the same
    // subspace from -g, as from a nearby gradient, reads alike.
    EXPECT_TRUE(p.gather(0, p.abs().argmax(0, true)).gt(0).all().item<bool>());
    EXPECT_LT((TopLeftSingularVectors(-g, rank, 42) - p).abs().max().item<double>(), 1e-4);
  }
  EXPECT_NE(GaloreProjectionKey(1, "model.layers.0.mlp.up_proj.weight", 1),
            GaloreProjectionKey(1, "model.layers.0.mlp.up_proj.weight", 201));
  EXPECT_NE(GaloreProjectionKey(1, "model.layers.0.mlp.up_proj.weight", 1),
            GaloreProjectionKey(1, "model.layers.1.mlp.up_proj.weight", 1));
}

// With the identity as its projection (rank = the smaller side), GaLore is
// AdamW: the moments see the gradient itself. Both sides project. Steps 2
// to 6 from zero moments: no refresh is due after step 1, so the identity
// set before them stays, and CpuAdam takes the same step numbers.
TEST(GaloreTest, TheIdentityProjectionGivesAdamW) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{6, 10}, std::pair<int64_t, int64_t>{10, 6}}) {
    const int64_t r = std::min(rows, cols);
    auto galore = Matrix(rows, cols, Config(r, /*gap=*/1000, /*scale=*/1.0));
    ASSERT_TRUE(galore->SetProjection(at::eye(r)).ok());
    at::manual_seed(3);
    at::Tensor w = at::randn({rows, cols});
    at::Tensor reference = w.clone(), m = at::zeros_like(w), v = at::zeros_like(w);
    auto adam = CpuAdam(Adam());
    for (int64_t step = 2; step <= 6; ++step) {
      const at::Tensor g = at::randn({rows, cols});
      Apply(*adam, w, galore->Direction(g, step, Adam(), 9));
      offload::AdamTensorSpan span;
      const size_t n = static_cast<size_t>(w.numel());
      span.param = {reference.data_ptr<float>(), n};
      span.grad = {g.data_ptr<float>(), n};
      span.exp_avg = {m.data_ptr<float>(), n};
      span.exp_avg_sq = {v.data_ptr<float>(), n};
      span.step = step;
      ASSERT_TRUE(adam->Step(span).ok());
    }
    EXPECT_TRUE(galore->projection().equal(at::eye(r)));
    // The two differ in rounding only: GaLore computes lr * (m / denom /
    // bias1) and a fused add, AdamW (lr / bias1) * m / denom and a plain
    // one; a few ulps of |w| per step over 5 steps. A missing bias
    // correction or decay would move w by ~lr, a thousand times more.
    const double w_scale = reference.abs().max().item<double>();
    EXPECT_LT((w - reference).abs().max().item<double>(), 40 * std::ldexp(w_scale, -24)) << rows << "x" << cols;
    EXPECT_LT((galore->exp_avg() - m).abs().max().item<double>(), 4 * std::ldexp(m.abs().max().item<double>(), -24));
    EXPECT_LT((galore->exp_avg_sq() - v).abs().max().item<double>(), 4 * std::ldexp(v.abs().max().item<double>(), -24));
  }
}

// A new projection on the first step and every update_proj_gap-th after,
// and not in between.
TEST(GaloreTest, ProjectionsRefreshOnSchedule) {
  auto galore = Matrix(12, 20, Config(4, /*gap=*/3));
  at::manual_seed(5);
  at::Tensor previous = galore->projection().clone();
  for (int64_t step = 1; step <= 7; ++step) {
    (void)galore->Direction(at::randn({12, 20}), step, Adam(), GaloreProjectionKey(1, "w", step));
    const bool changed = !galore->projection().equal(previous);
    EXPECT_EQ(changed, step == 1 || step == 4 || step == 7) << "step " << step;
    EXPECT_EQ(galore->RefreshDue(step), step == 1 || step == 4 || step == 7) << "step " << step;
    previous = galore->projection().clone();
  }
  EXPECT_FALSE(GaloreMatrix::Create(4, 4, Config(0), nullptr).ok());
  EXPECT_EQ(galore->state_bytes(), (12 * 4 + 2 * 4 * 20) * 4);  // P [12, 4], moments [4, 20]
  EXPECT_EQ(Config(4).StateElements(12, 20), 12 * 4 + 2 * 4 * 20);
  EXPECT_EQ(Config(4).StateElements(20, 12), 12 * 4 + 2 * 20 * 4);  // projects the 12 columns
}

std::vector<std::vector<float>> Rows(const at::Tensor& t) {
  std::vector<std::vector<float>> out;
  const at::Tensor c = t.contiguous();
  for (int64_t i = 0; i < c.size(0); ++i) {
    const float* row = c.data_ptr<float>() + i * c.size(1);
    out.emplace_back(row, row + c.size(1));
  }
  return out;
}

at::Tensor FromRows(const json& rows) {
  std::vector<float> flat;
  for (const auto& row : rows) {
    for (float x : row.get<std::vector<float>>()) flat.push_back(x);
  }
  return at::tensor(flat).view({static_cast<int64_t>(rows.size()), -1});
}

// Six steps with a refresh at 1 and 4, both sides, against the paper's
// algorithm written independently in Python with the same projections.
TEST(GaloreTest, StepsEqualAnIndependentReferenceOfThePaper) {
  const std::string python = testing::ReferencePython();
  auto probe = testing::RunCommand({python, "-c", "import torch"});
  if (!testing::HaveProgram(python) || !probe.ok() || probe->exit_code != 0) {
    GTEST_SKIP() << python << " has no torch (Debian: python3-torch)";
  }
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{12, 20}, std::pair<int64_t, int64_t>{20, 12}}) {
    const GaloreConfig config = Config(4, /*gap=*/3);
    auto galore = Matrix(rows, cols, config);
    auto adam = CpuAdam(Adam());
    at::manual_seed(11);
    const at::Tensor w0 = at::randn({rows, cols});
    at::Tensor w = w0.clone();
    json in = {{"lr", Adam().lr},
               {"weight_decay", Adam().weight_decay},
               {"beta1", Adam().beta1},
               {"beta2", Adam().beta2},
               {"eps", Adam().eps},
               {"scale", config.scale},
               {"projects_rows", galore->projects_rows()},
               {"w0", Rows(w0)}};
    for (int64_t step = 1; step <= 6; ++step) {
      const at::Tensor g = DecayingSpectrum(rows, cols, 0.7, static_cast<uint64_t>(step));
      Apply(*adam, w, galore->Direction(g, step, Adam(), GaloreProjectionKey(2, "w", step)));
      in["grads"].push_back(Rows(g));
      in["projections"].push_back(Rows(galore->projection()));
    }
    testing::TempDir dir;
    ASSERT_TRUE(WriteFileAtomically(dir.Join("in.json"), in.dump()).ok());
    auto run = testing::RunCommand({python, testing::SourcePath("tests/policies/train/galore_reference.py"),
                                    dir.Join("in.json"), dir.Join("out.json")});
    ASSERT_TRUE(run.ok() && run->exit_code == 0) << "reference script failed";
    const json out = json::parse(*ReadFileToString(dir.Join("out.json")));
    // fp32 both sides, sums in other orders (a projection sums 12 or 20
    // products): 1e-4 of the distance w moved is ample for rounding, and a
    // wrong scale, bias correction or side would be off by its whole size.
    const double moved = (w - w0).abs().max().item<double>();
    ASSERT_GT(moved, 0.0);
    EXPECT_LT((w - FromRows(out["w"])).abs().max().item<double>(), 1e-4 * moved) << rows << "x" << cols;
    for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
      const at::Tensor want = FromRows(out[moment]);
      const at::Tensor got = std::string(moment) == "exp_avg" ? galore->exp_avg() : galore->exp_avg_sq();
      EXPECT_LT((got - want).abs().max().item<double>(), 1e-5 * want.abs().max().item<double>()) << moment;
    }
  }
}

// The trainer with GaLore: a tiny Qwen2 (its q/k/v biases and norms keep
// full Adam), next-token loss on a fixed batch.
struct Batch {
  at::Tensor ids, mask;
};

Batch MakeBatch() {
  const at::Tensor ids =
      at::tensor(std::vector<int64_t>{1, 5, 9, 13, 2, 7, 3, 4, 8, 22, 3, 40, 30, 6}, at::kLong).view({2, 7});
  return {ids, at::ones_like(ids)};
}

at::Tensor NextTokenLoss(const at::Tensor& logits, const at::Tensor& ids) {
  const int64_t t = ids.size(1);
  const at::Tensor logp = at::log_softmax(logits.narrow(1, 0, t - 1), -1);
  return -logp.gather(-1, ids.narrow(1, 1, t - 1).unsqueeze(-1)).mean();
}

LayerwiseTrainerOptions GaloreOptions(offload::Tier optimizer, bool step_in_backward = false) {
  LayerwiseTrainerOptions options;
  options.adam.adam.lr = 1e-2;
  options.adam.adam.weight_decay = 0.01;
  options.adam.threads = 1;
  options.optimizer = optimizer;
  options.gradients = optimizer == offload::Tier::kDevice ? offload::Tier::kDevice : offload::Tier::kHost;
  options.step_in_backward = step_in_backward;
  options.nvme_adam.tile_elements = 1024;
  options.galore = Config(4, /*gap=*/3);
  options.galore_seed = 77;
  return options;
}

using Weights = std::map<std::string, at::Tensor>;

// A model with random weights and a trainer over it (every tier it needs),
// kept together so a test can step, save, and build another over the same
// model.
class Trained {
 public:
  explicit Trained(const LayerwiseTrainerOptions& options, ProcessGroup* gang = nullptr) {
    model_ = LlamaModel::RandomInit(TinyConfig(ModelFamily::kQwen2), LlamaHead::kLanguageModel, at::kFloat, 3, 0.2);
    offload::HostArenaOptions arena;
    arena.capacity_bytes = 16 << 20;
    arena_ = std::move(*offload::HostArena::Create(arena));
    offload::NvmeStoreOptions store;
    store.directory = dir_.path();
    store_ = offload::SynchronizedNvmeStore(std::move(*offload::NvmeStore::Open(store)));
    source_ = std::make_unique<ResidentLayerSource>(model_->weights().layers);
    Rebuild(options, gang);
  }
  void Rebuild(LayerwiseTrainerOptions options, ProcessGroup* gang = nullptr) {
    trainer_.reset();
    options.data_parallel = gang;
    auto trainer = LayerwiseTrainer::Create(model_->config(), LlamaHead::kLanguageModel, model_->weights(),
                                            source_.get(), arena_.get(), options, store_.get());
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    trainer_ = std::move(*trainer);
  }
  // One step on rows [first, first + count) of the batch, the loss weighed
  // by count / 2 (a gang's share); returns the loss.
  double Step(int64_t first = 0, int64_t count = 2) {
    const Batch batch = MakeBatch();
    const at::Tensor ids = batch.ids.narrow(0, first, count), mask = batch.mask.narrow(0, first, count);
    auto loss = trainer_->ForwardBackward(ids, mask, [&](const at::Tensor& logits) {
      return NextTokenLoss(logits, ids) * (static_cast<double>(count) / 2);
    });
    EXPECT_TRUE(loss.ok()) << loss.status();
    EXPECT_TRUE(trainer_->OptimizerStep().ok());
    return loss.ok() ? *loss : 0;
  }
  Weights weights() const {
    Weights out;
    for (auto& [name, t] : model_->NamedParameters()) out[name] = t.detach().clone();
    return out;
  }
  LayerwiseTrainer& trainer() { return *trainer_; }

 private:
  testing::TempDir dir_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<offload::HostArena> arena_;
  std::unique_ptr<offload::NvmeStore> store_;
  std::unique_ptr<LayerSource> source_;
  std::unique_ptr<LayerwiseTrainer> trainer_;
};

double MaxDifference(const Weights& a, const Weights& b) {
  double worst = 0;
  for (const auto& [name, t] : a) worst = std::max(worst, (t - b.at(name)).abs().max().item<double>());
  return worst;
}

// GaLore on the host, on NVMe (whole step and layer by layer in the
// backward pass) and on the device take the same steps; the optimizer
// state is the masters plus the small state, far below full Adam's.
TEST(GaloreTrainerTest, EveryOptimizerTierTakesTheSameSteps) {
  Trained host(GaloreOptions(offload::Tier::kHost));
  std::vector<double> losses;
  for (int i = 0; i < 5; ++i) losses.push_back(host.Step());
  EXPECT_LT(losses.back(), losses.front());  // it trains
  for (const auto& [tier, in_backward] :
       {std::pair{offload::Tier::kNvme, false}, std::pair{offload::Tier::kNvme, true},
        std::pair{offload::Tier::kHost, true}, std::pair{offload::Tier::kDevice, false}}) {
    Trained other(GaloreOptions(tier, in_backward));
    for (int i = 0; i < 5; ++i) EXPECT_NEAR(other.Step(), losses[static_cast<size_t>(i)], 1e-6);
    // Host and NVMe run the very same arithmetic; the device applies the
    // direction with torch's mul_ and add_ (rounded apart from the fused
    // add: an ulp of the weights per step).
    const double tolerance = tier == offload::Tier::kDevice ? 1e-6 : 0.0;
    EXPECT_LE(MaxDifference(other.weights(), host.weights()), tolerance)
        << offload::TierName(tier) << (in_backward ? " step_in_backward" : "");
  }
  // Masters (4 bytes a parameter) and every projection's state, plus full
  // Adam (12 bytes) for the rest.
  const LlamaConfig c = TinyConfig(ModelFamily::kQwen2);
  const GaloreConfig g = Config(4, 3);
  const int64_t projected = g.ProjectedParameters(c);
  const int64_t expected = 4 * projected + 4 * g.StateElements(c) + 12 * (host.trainer().num_parameters() - projected);
  EXPECT_EQ(host.trainer().optimizer_state_bytes(), expected);
  EXPECT_LT(expected, 12 * host.trainer().num_parameters());
}

// Saved after step 2 and loaded into a new trainer (its masters, moments,
// projections and step counts), the run goes on as if never stopped: step 3
// uses the saved projection, step 4 refreshes it, bit for bit the same.
TEST(GaloreTrainerTest, ResumingFromTheSavedStateIsExact) {
  for (const offload::Tier tier : {offload::Tier::kHost, offload::Tier::kNvme, offload::Tier::kDevice}) {
    Trained straight(GaloreOptions(tier)), resumed(GaloreOptions(tier));
    for (int i = 0; i < 2; ++i) straight.Step(), resumed.Step();
    testing::TempDir dir;
    const std::string state = dir.Join("optimizer.safetensors");
    ASSERT_TRUE(resumed.trainer().SaveState(state).ok());
    resumed.Rebuild(GaloreOptions(tier));  // fresh state, the model's current weights
    ASSERT_TRUE(resumed.trainer().LoadState(state).ok());
    for (int i = 0; i < 3; ++i) EXPECT_EQ(straight.Step(), resumed.Step()) << offload::TierName(tier);
    EXPECT_EQ(MaxDifference(straight.weights(), resumed.weights()), 0.0) << offload::TierName(tier);

    // The state does not load into a run without GaLore, nor with another
    // rank, and the error says why.
    LayerwiseTrainerOptions full = GaloreOptions(tier);
    full.galore = GaloreConfig();
    resumed.Rebuild(full);
    const absl::Status no_galore = resumed.trainer().LoadState(state);
    EXPECT_NE(no_galore.message().find("GaLore"), std::string::npos) << no_galore;
    LayerwiseTrainerOptions other_rank = GaloreOptions(tier);
    other_rank.galore.rank = 2;
    resumed.Rebuild(other_rank);
    const absl::Status rank = resumed.trainer().LoadState(state);
    EXPECT_NE(rank.message().find("galore settings"), std::string::npos) << rank;
  }
}

// ZeRO-1 in a gang of two (each rank its row of the batch, the optimizer
// state of the tensors it holds, projections computed by their owner from
// the summed gradient) ends where one rank with the whole batch does.
TEST(GaloreTrainerTest, AGangOfTwoEqualsOneRank) {
  if (!ProcessGroup::Available(Backend::kGloo)) GTEST_SKIP() << "this build has no Gloo";
  Trained alone(GaloreOptions(offload::Tier::kHost));
  const Weights before = alone.weights();
  for (int i = 0; i < 4; ++i) alone.Step();
  const double moved = MaxDifference(alone.weights(), before);
  auto groups = ProcessGroup::CreateInProcess(2, std::chrono::milliseconds(20000));
  ASSERT_TRUE(groups.ok()) << groups.status();
  std::vector<Weights> after(2);
  std::vector<int64_t> state_bytes(2);
  testing::TempDir dir;
  const std::vector<std::string> files = {dir.Join("rank0.safetensors"), dir.Join("rank1.safetensors")};
  auto rank_body = [&](int rank) {
    Trained member(GaloreOptions(offload::Tier::kHost), (*groups)[static_cast<size_t>(rank)].get());
    for (int i = 0; i < 4; ++i) member.Step(rank, 1);
    after[static_cast<size_t>(rank)] = member.weights();
    state_bytes[static_cast<size_t>(rank)] = member.trainer().optimizer_state_bytes();
    EXPECT_TRUE(member.trainer().SaveState(files[static_cast<size_t>(rank)]).ok());
  };
  std::thread other(rank_body, 1);
  rank_body(0);
  other.join();
  EXPECT_EQ(MaxDifference(after[0], after[1]), 0.0);  // the owners' weights, broadcast
  // Gradients summed over two ranks round apart from one batch's sum, and
  // Adam's normalisation and the projections carry that on: 1e-3 of how
  // far the weights moved (a projection from one rank's gradient alone,
  // or a moment missed, is off by the whole update).
  EXPECT_LT(MaxDifference(after[0], alone.weights()), 1e-3 * moved);
  EXPECT_EQ(state_bytes[0] + state_bytes[1], alone.trainer().optimizer_state_bytes());

  // Re-sharded: one rank loads the gang's two files, every projection and
  // moment from whichever rank held it, and writes them back alike.
  Trained resumed(GaloreOptions(offload::Tier::kHost));
  ASSERT_TRUE(resumed.trainer().LoadState(files).ok());
  const std::string whole = dir.Join("whole.safetensors");
  ASSERT_TRUE(resumed.trainer().SaveState(whole).ok());
  auto merged = SafetensorsFile::Open(whole);
  ASSERT_TRUE(merged.ok()) << merged.status();
  int projections = 0;
  for (const std::string& file : files) {
    auto part = SafetensorsFile::Open(file);
    ASSERT_TRUE(part.ok()) << part.status();
    for (const TensorView& view : (*part)->tensors()) {
      const TensorView* same = (*merged)->Find(view.name);
      ASSERT_NE(same, nullptr) << view.name;
      EXPECT_TRUE(ToTensor(view, at::kFloat)->equal(*ToTensor(*same, at::kFloat))) << view.name;
      projections += absl::EndsWith(view.name, ".galore_projection");
    }
  }
  EXPECT_EQ(projections, 7 * TinyConfig(ModelFamily::kQwen2).num_hidden_layers);
}

}  // namespace
}  // namespace strata::policies
