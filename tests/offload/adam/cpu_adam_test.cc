#include "offload/adam/cpu_adam.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace strata::offload {
namespace {

// torch::optim keys its per-parameter state by the TensorImpl's address:
// as text in libtorch 1.x, as the pointer itself in 2.x.
template <typename Optimizer>
auto OptimizerStateKey(Optimizer& optimizer, const at::Tensor& param) {
  using Key = typename std::decay_t<decltype(optimizer.state())>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << param.unsafeGetTensorImpl();
    return text.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

// Odd sizes: none is a multiple of either vector width, so every kernel's
// head/tail path runs, and 100003 spans many work items.
const std::vector<int64_t> kSizes = {1, 7, 1023, 100003};

// Our copy of one parameter tensor and its optimizer state.
struct Buffers {
  explicit Buffers(std::vector<float> init)
      : param(std::move(init)),
        exp_avg(param.size()),
        exp_avg_sq(param.size()),
        bf16(param.size()),
        fp32(param.size()) {}
  std::vector<float> param, exp_avg, exp_avg_sq;
  std::vector<uint16_t> bf16;
  std::vector<float> fp32;
  int64_t step = 0;  // the caller-kept count torch keeps in state.step
};

AdamTensorSpan SpanOf(Buffers& b, std::span<const float> grad, int64_t step) {
  AdamTensorSpan t;
  t.name = "t";
  t.param = b.param;
  t.grad = grad;
  t.exp_avg = b.exp_avg;
  t.exp_avg_sq = b.exp_avg_sq;
  t.device_bf16 = b.bf16;
  t.device_fp32 = b.fp32;
  t.step = step;
  return t;
}

std::vector<float> ToVector(const torch::Tensor& t) {
  const auto c = t.contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

struct Diff {
  double max_abs = 0;      // max |ours - torch|
  double max_scaled = 0;   // max |ours - torch| / max(1, |torch|)
  double max_ref = 0;      // max |torch|
  int64_t mismatched = 0;  // elements that differ in any bit
};

Diff Compare(const std::vector<float>& ours, const torch::Tensor& theirs) {
  const std::vector<float> ref = ToVector(theirs);
  Diff d;
  for (size_t i = 0; i < ours.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(ours[i]) - ref[i]);
    d.max_abs = std::max(d.max_abs, diff);
    d.max_scaled = std::max(d.max_scaled, diff / std::max(1.0, std::fabs(static_cast<double>(ref[i]))));
    d.max_ref = std::max(d.max_ref, std::fabs(static_cast<double>(ref[i])));
    if (std::memcmp(&ours[i], &ref[i], sizeof(float)) != 0) ++d.mismatched;
  }
  return d;
}

std::unique_ptr<CpuAdam> MakeAdam(const AdamOptions& adam, AdamIsa isa = AdamIsa::kAuto, int threads = 2) {
  CpuAdamOptions options;
  options.adam = adam;
  options.isa = isa;
  options.threads = threads;
  // Tiny work items so even the 100003-element tensor is split between
  // threads at unaligned-to-the-tensor-end offsets.
  options.grain = 1000;
  options.min_parallel_elements = 0;
  auto created = CpuAdam::Create(options);
  EXPECT_TRUE(created.ok()) << created.status();
  return created.ok() ? std::move(*created) : nullptr;
}

// Runs `steps` steps of ours and torch's optimizer over tensors of kSizes,
// with fresh gradients every step, and compares weights and both moments.
// Tensor 2 gets no gradient on step 2, so torch skips it and its step count
// falls one behind the others: per-tensor step counts are part of the check.
//
// Tolerance: we reproduce torch's operation order and its float constants,
// so on the Debian 1.13 CPU build every element matches bit for bit. Another
// torch build may fuse a multiply-add differently (ATen's addcmul and
// add-with-alpha are fused only where the compiler contracts them), which
// moves a moment by one rounding per step and a weight by about lr * 2^-24.
// So over 6 steps the weights must agree to 4e-7 (~3 ulps) absolute for
// |w| <= 1, relative above, and each moment to 1e-6 of its tensor's largest
// element (~8 ulps of it; element-wise relative error is unbounded where
// g + wd * p cancels). Tested: computing addcmul unfused in our kernel stays
// within these bounds; a wrong constant or bias correction does not.
void CheckAgainstTorch(const AdamOptions& adam, const std::string& label) {
  SCOPED_TRACE(label);
  torch::manual_seed(7);
  std::vector<torch::Tensor> params;
  std::vector<Buffers> ours;
  for (int64_t n : kSizes) {
    params.push_back(torch::randn({n}).requires_grad_(true));
    ours.emplace_back(ToVector(params.back()));
  }
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (adam.decoupled) {
    optimizer = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(adam.lr)
                                                                  .betas(std::make_tuple(adam.beta1, adam.beta2))
                                                                  .eps(adam.eps)
                                                                  .weight_decay(adam.weight_decay));
  } else {
    optimizer = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(adam.lr)
                                                                 .betas(std::make_tuple(adam.beta1, adam.beta2))
                                                                 .eps(adam.eps)
                                                                 .weight_decay(adam.weight_decay));
  }
  auto cpu_adam = MakeAdam(adam);
  ASSERT_NE(cpu_adam, nullptr);

  for (int step = 1; step <= 6; ++step) {
    std::vector<std::vector<float>> grads;
    std::vector<AdamTensorSpan> spans;
    grads.reserve(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (i == 2 && step == 2) {
        params[i].mutable_grad() = torch::Tensor();
        continue;
      }
      // Gradients over six orders of magnitude, so eps and the bias
      // corrections all matter somewhere.
      const double scale = std::pow(10.0, static_cast<double>(static_cast<int>(i + step) % 6) - 4.0);
      torch::Tensor g = torch::randn({params[i].numel()}) * scale;
      params[i].mutable_grad() = g;
      grads.push_back(ToVector(g));
      spans.push_back(SpanOf(ours[i], grads.back(), ++ours[i].step));
    }
    optimizer->step();
    ASSERT_TRUE(cpu_adam->Step(spans).ok());
  }

  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("tensor of ", kSizes[i], " elements"));
    const auto key = OptimizerStateKey(*optimizer, params[i]);
    torch::Tensor exp_avg, exp_avg_sq;
    int64_t torch_step = 0;
    auto& state = *optimizer->state().at(key);
    if (adam.decoupled) {
      auto& s = static_cast<torch::optim::AdamWParamState&>(state);
      exp_avg = s.exp_avg();
      exp_avg_sq = s.exp_avg_sq();
      torch_step = s.step();
    } else {
      auto& s = static_cast<torch::optim::AdamParamState&>(state);
      exp_avg = s.exp_avg();
      exp_avg_sq = s.exp_avg_sq();
      torch_step = s.step();
    }
    EXPECT_EQ(ours[i].step, torch_step);
    const Diff p = Compare(ours[i].param, params[i].detach());
    const Diff m = Compare(ours[i].exp_avg, exp_avg);
    const Diff v = Compare(ours[i].exp_avg_sq, exp_avg_sq);
    EXPECT_LE(p.max_scaled, 4e-7) << "max abs diff " << p.max_abs;
    EXPECT_LE(m.max_abs, 1e-6 * m.max_ref) << "largest |exp_avg| " << m.max_ref;
    EXPECT_LE(v.max_abs, 1e-6 * v.max_ref) << "largest |exp_avg_sq| " << v.max_ref;
    // Informational: on the build we test against, all three are 0.
    ::testing::Test::RecordProperty(absl::StrCat(label, "_n", kSizes[i], "_mismatched_bits"),
                                    std::to_string(p.mismatched + m.mismatched + v.mismatched));
    // The device copies are the updated weights.
    EXPECT_EQ(0, std::memcmp(ours[i].fp32.data(), ours[i].param.data(), ours[i].param.size() * sizeof(float)));
  }
}

TEST(CpuAdamTest, MatchesTorchAdamWWithWeightDecay) {
  AdamOptions adam;
  adam.lr = 1e-2;
  adam.weight_decay = 0.1;
  CheckAgainstTorch(adam, "adamw_wd");
}

TEST(CpuAdamTest, MatchesTorchAdamWWithoutWeightDecay) {
  AdamOptions adam;
  adam.lr = 3e-3;
  adam.weight_decay = 0;
  adam.beta1 = 0.8;
  adam.beta2 = 0.95;
  adam.eps = 1e-6;
  CheckAgainstTorch(adam, "adamw_nowd");
}

TEST(CpuAdamTest, MatchesTorchAdamWithL2WeightDecay) {
  AdamOptions adam;
  adam.lr = 1e-2;
  adam.weight_decay = 0.05;
  adam.decoupled = false;
  CheckAgainstTorch(adam, "adam_l2");
}

std::vector<float> RandomVector(int64_t n, std::mt19937& rng, float scale, bool nonnegative = false) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    x = dist(rng);
    if (nonnegative) x *= x;
  }
  return v;
}

// Runs three steps over one tensor with non-zero starting moments, fp32 or
// bf16 gradients, and both device copies, and returns every output buffer.
struct Outputs {
  std::vector<float> param, exp_avg, exp_avg_sq, fp32;
  std::vector<uint16_t> bf16;
};

Outputs RunSteps(CpuAdam& adam, int64_t n, bool bf16_grads, int64_t tile) {
  std::mt19937 rng(static_cast<uint32_t>(n));
  Outputs o;
  o.param = RandomVector(n, rng, 1.0f);
  o.exp_avg = RandomVector(n, rng, 1e-2f);
  o.exp_avg_sq = RandomVector(n, rng, 1e-2f, /*nonnegative=*/true);
  o.fp32.assign(static_cast<size_t>(n), 0.0f);
  o.bf16.assign(static_cast<size_t>(n), 0);
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<float> grad = RandomVector(n, rng, 0.1f);
    std::vector<uint16_t> grad_bf16(grad.size());
    for (size_t i = 0; i < grad.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &grad[i], sizeof(u));
      grad_bf16[i] = static_cast<uint16_t>(u >> 16);
    }
    // Tiles of `tile` elements (the whole tensor when tile >= n), all at the
    // same step number, as an NVMe-swapped optimizer would issue them.
    for (int64_t off = 0; off < n; off += tile) {
      const size_t len = static_cast<size_t>(std::min(tile, n - off));
      const size_t o0 = static_cast<size_t>(off);
      AdamTensorSpan t;
      t.param = std::span(o.param).subspan(o0, len);
      if (bf16_grads) {
        t.grad_bf16 = std::span<const uint16_t>(grad_bf16).subspan(o0, len);
      } else {
        t.grad = std::span<const float>(grad).subspan(o0, len);
      }
      t.exp_avg = std::span(o.exp_avg).subspan(o0, len);
      t.exp_avg_sq = std::span(o.exp_avg_sq).subspan(o0, len);
      t.device_fp32 = std::span(o.fp32).subspan(o0, len);
      t.device_bf16 = std::span(o.bf16).subspan(o0, len);
      t.step = step;
      EXPECT_TRUE(adam.Step(t).ok());
    }
  }
  return o;
}

template <typename T>
int64_t CountBitDifferences(const std::vector<T>& a, const std::vector<T>& b) {
  EXPECT_EQ(a.size(), b.size());
  int64_t count = 0;
  for (size_t i = 0; i < a.size(); ++i) count += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return count;
}

void ExpectBitIdentical(const Outputs& a, const Outputs& b) {
  EXPECT_EQ(CountBitDifferences(a.param, b.param), 0);
  EXPECT_EQ(CountBitDifferences(a.exp_avg, b.exp_avg), 0);
  EXPECT_EQ(CountBitDifferences(a.exp_avg_sq, b.exp_avg_sq), 0);
  EXPECT_EQ(CountBitDifferences(a.fp32, b.fp32), 0);
  EXPECT_EQ(CountBitDifferences(a.bf16, b.bf16), 0);
}

void CheckIsaMatchesScalar(AdamIsa isa) {
  if (!AdamIsaSupported(isa)) {
    GTEST_SKIP() << "this CPU lacks " << AdamIsaName(isa);
  }
  for (bool decoupled : {true, false}) {
    AdamOptions options;
    options.lr = 1e-2;
    options.weight_decay = 0.1;
    options.decoupled = decoupled;
    auto scalar = MakeAdam(options, AdamIsa::kScalar, 1);
    auto vector = MakeAdam(options, isa, 2);
    ASSERT_NE(scalar, nullptr);
    ASSERT_NE(vector, nullptr);
    EXPECT_EQ(vector->isa(), isa);
    for (int64_t n : kSizes) {
      for (bool bf16_grads : {false, true}) {
        SCOPED_TRACE(absl::StrCat("n=", n, " bf16_grads=", bf16_grads, " decoupled=", decoupled));
        ExpectBitIdentical(RunSteps(*scalar, n, bf16_grads, n), RunSteps(*vector, n, bf16_grads, n));
      }
    }
  }
}

TEST(CpuAdamTest, Avx2MatchesScalarBitForBit) { CheckIsaMatchesScalar(AdamIsa::kAvx2); }

TEST(CpuAdamTest, Avx512MatchesScalarBitForBit) { CheckIsaMatchesScalar(AdamIsa::kAvx512); }

TEST(CpuAdamTest, AutoPicksTheBestSupportedIsa) {
  auto adam = MakeAdam(AdamOptions{});
  ASSERT_NE(adam, nullptr);
  EXPECT_EQ(adam->isa(), BestAdamIsa());
  EXPECT_TRUE(AdamIsaSupported(adam->isa()));
}

TEST(CpuAdamTest, TiledUpdateMatchesWholeUpdateBitForBit) {
  AdamOptions options;
  options.lr = 1e-2;
  for (AdamIsa isa : {AdamIsa::kScalar, AdamIsa::kAvx2, AdamIsa::kAvx512}) {
    if (!AdamIsaSupported(isa)) continue;
    auto adam = MakeAdam(options, isa, 2);
    ASSERT_NE(adam, nullptr);
    const int64_t n = 100003;
    const Outputs whole = RunSteps(*adam, n, false, n);
    // Tile sizes that leave every possible misalignment at tile starts.
    for (int64_t tile : {7, 1000, 4099, 65536}) {
      SCOPED_TRACE(absl::StrCat(AdamIsaName(isa), " tile=", tile));
      ExpectBitIdentical(whole, RunSteps(*adam, n, false, tile));
    }
  }
}

TEST(CpuAdamTest, ThreadCountDoesNotChangeResults) {
  auto one = MakeAdam(AdamOptions{}, AdamIsa::kAuto, 1);
  auto three = MakeAdam(AdamOptions{}, AdamIsa::kAuto, 3);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(three, nullptr);
  ExpectBitIdentical(RunSteps(*one, 100003, false, 100003), RunSteps(*three, 100003, false, 100003));
}

TEST(CpuAdamTest, Bf16GradsEqualTheirFp32Widening) {
  AdamOptions options;
  auto adam = MakeAdam(options);
  ASSERT_NE(adam, nullptr);
  // RunSteps derives the bf16 gradient by truncating the fp32 one; widening
  // it back is exact, so feeding the widened values as fp32 must agree.
  const int64_t n = 1023;
  std::mt19937 rng(5);
  Buffers a(RandomVector(n, rng, 1.0f)), b = a;
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<float> grad = RandomVector(n, rng, 0.1f);
    std::vector<uint16_t> grad_bf16(grad.size());
    for (size_t i = 0; i < grad.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &grad[i], sizeof(u));
      grad_bf16[i] = static_cast<uint16_t>(u >> 16);
      u &= 0xFFFF0000u;
      std::memcpy(&grad[i], &u, sizeof(u));
    }
    ASSERT_TRUE(adam->Step(SpanOf(a, grad, step)).ok());
    AdamTensorSpan t = SpanOf(b, {}, step);
    t.grad_bf16 = grad_bf16;
    ASSERT_TRUE(adam->Step(t).ok());
  }
  EXPECT_EQ(CountBitDifferences(a.param, b.param), 0);
  EXPECT_EQ(CountBitDifferences(a.exp_avg_sq, b.exp_avg_sq), 0);
}

// The bf16 copy must equal torch's float -> bfloat16 conversion bit for bit,
// both after real updates and on hand-picked rounding cases.
TEST(CpuAdamTest, Bf16DeviceCopyMatchesTorchConversion) {
  for (AdamIsa isa : {AdamIsa::kScalar, AdamIsa::kAvx2, AdamIsa::kAvx512}) {
    if (!AdamIsaSupported(isa)) continue;
    SCOPED_TRACE(AdamIsaName(isa));
    // After real updates.
    AdamOptions options;
    options.lr = 1e-2;
    auto adam = MakeAdam(options, isa);
    ASSERT_NE(adam, nullptr);
    const Outputs out = RunSteps(*adam, 100003, false, 100003);
    const torch::Tensor expected = torch::from_blob(const_cast<float*>(out.param.data()),
                                                    {static_cast<int64_t>(out.param.size())})
                                       .to(at::kBFloat16);
    EXPECT_EQ(0, std::memcmp(expected.data_ptr(), out.bf16.data(), out.bf16.size() * sizeof(uint16_t)));

    // Rounding cases. With lr = 0 and no decay the update leaves each
    // weight unchanged (p + (-0 * m) / denom == p), so the copy is the
    // conversion of exactly these bit patterns: ties to even in both
    // directions, just above and below ties, the largest finite value (which
    // rounds to infinity), infinities, signed zeros and subnormals.
    const std::vector<uint32_t> bits = {0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0xBF808000,
                                        0xBF818000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
                                        0x00000000, 0x80000000, 0x00000001, 0x00008000, 0x00018000,
                                        0x807FFFFF, 0x3F800000, 0x4049FFFF, 0x33D6BF95};
    std::vector<float> weights(bits.size());
    std::memcpy(weights.data(), bits.data(), bits.size() * sizeof(float));
    Buffers b(weights);
    AdamOptions frozen;
    frozen.lr = 0;
    frozen.weight_decay = 0;
    auto still = MakeAdam(frozen, isa);
    ASSERT_NE(still, nullptr);
    const std::vector<float> grad(bits.size(), 0.5f);
    ASSERT_TRUE(still->Step(SpanOf(b, grad, 1)).ok());
    EXPECT_EQ(CountBitDifferences(b.param, weights), 0);
    const torch::Tensor ref =
        torch::from_blob(weights.data(), {static_cast<int64_t>(weights.size())}).to(at::kBFloat16);
    for (size_t i = 0; i < bits.size(); ++i) {
      uint16_t want;
      std::memcpy(&want, static_cast<const uint16_t*>(ref.data_ptr()) + i, sizeof(want));
      EXPECT_EQ(b.bf16[i], want) << "float bits 0x" << std::hex << bits[i];
    }
  }
}

TEST(CpuAdamTest, InvalidOptionsNameTheField) {
  struct Case {
    const char* field;
    void (*mutate)(AdamOptions&);
  };
  const Case cases[] = {
      {"lr", [](AdamOptions& o) { o.lr = -1e-3; }},
      {"lr", [](AdamOptions& o) { o.lr = std::numeric_limits<double>::quiet_NaN(); }},
      {"beta1", [](AdamOptions& o) { o.beta1 = 1.0; }},
      {"beta1", [](AdamOptions& o) { o.beta1 = -0.1; }},
      {"beta2", [](AdamOptions& o) { o.beta2 = 1.5; }},
      {"eps", [](AdamOptions& o) { o.eps = 0; }},
      {"eps", [](AdamOptions& o) { o.eps = -1e-8; }},
      {"weight_decay", [](AdamOptions& o) { o.weight_decay = -0.01; }},
  };
  EXPECT_TRUE(AdamOptions{}.Validate().ok());
  for (const Case& c : cases) {
    AdamOptions options;
    c.mutate(options);
    const absl::Status status = options.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(std::string(status.message()).find(c.field), std::string::npos) << status;
    CpuAdamOptions cpu;
    cpu.adam = options;
    EXPECT_EQ(CpuAdam::Create(cpu).status().code(), absl::StatusCode::kInvalidArgument) << c.field;
  }
  CpuAdamOptions cpu;
  cpu.threads = -1;
  EXPECT_NE(std::string(CpuAdam::Create(cpu).status().message()).find("threads"), std::string::npos);
  auto adam = MakeAdam(AdamOptions{});
  ASSERT_NE(adam, nullptr);
  EXPECT_EQ(adam->SetLearningRate(-1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(adam->SetLearningRate(0.5).ok());
  EXPECT_EQ(adam->options().lr, 0.5);
}

TEST(CpuAdamTest, ParseIsaRoundTripsAndRejectsUnknownNames) {
  for (AdamIsa isa : {AdamIsa::kAuto, AdamIsa::kScalar, AdamIsa::kAvx2, AdamIsa::kAvx512}) {
    auto parsed = ParseAdamIsa(AdamIsaName(isa));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, isa);
  }
  EXPECT_EQ(ParseAdamIsa("sse9").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuAdamTest, MismatchedSpansAreRejectedBeforeAnythingChanges) {
  auto adam = MakeAdam(AdamOptions{});
  ASSERT_NE(adam, nullptr);
  std::mt19937 rng(3);
  Buffers good(RandomVector(64, rng, 1.0f)), bad(RandomVector(64, rng, 1.0f));
  const Buffers before = good;
  const std::vector<float> grad(64, 0.1f), short_grad(63, 0.1f);
  const std::vector<uint16_t> grad_bf16(64, 0x3DCD);
  std::vector<uint16_t> short_bf16(10);

  struct Case {
    const char* expect;  // a word the message must contain
    AdamTensorSpan span;
  };
  std::vector<Case> cases;
  cases.push_back({"grad", SpanOf(bad, short_grad, 1)});
  {
    AdamTensorSpan t = SpanOf(bad, grad, 1);
    t.exp_avg = t.exp_avg.first(32);
    cases.push_back({"exp_avg", t});
  }
  {
    AdamTensorSpan t = SpanOf(bad, grad, 1);
    t.exp_avg_sq = {};
    cases.push_back({"exp_avg_sq", t});
  }
  {
    AdamTensorSpan t = SpanOf(bad, grad, 1);
    t.device_bf16 = short_bf16;
    cases.push_back({"device_bf16", t});
  }
  {
    AdamTensorSpan t = SpanOf(bad, grad, 1);
    t.grad_bf16 = grad_bf16;
    cases.push_back({"exactly one", t});
  }
  {
    AdamTensorSpan t = SpanOf(bad, {}, 1);
    cases.push_back({"exactly one", t});
  }
  cases.push_back({"step", SpanOf(bad, grad, 0)});

  for (Case& c : cases) {
    c.span.name = "layers.0.weight";
    // The valid tensor comes first: a failed Step must not have touched it.
    const std::vector<AdamTensorSpan> spans = {SpanOf(good, grad, 1), c.span};
    const absl::Status status = adam->Step(spans);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.expect;
    EXPECT_NE(std::string(status.message()).find(c.expect), std::string::npos) << status;
    EXPECT_NE(std::string(status.message()).find("layers.0.weight"), std::string::npos) << status;
    EXPECT_EQ(CountBitDifferences(good.param, before.param), 0);
    EXPECT_EQ(CountBitDifferences(good.exp_avg, before.exp_avg), 0);
  }
}

TEST(CpuAdamTest, ForcingAnUnsupportedIsaFails) {
  AdamIsa missing = AdamIsa::kAuto;
  for (AdamIsa isa : {AdamIsa::kAvx512, AdamIsa::kAvx2}) {
    if (!AdamIsaSupported(isa)) missing = isa;
  }
  if (missing == AdamIsa::kAuto) GTEST_SKIP() << "this CPU supports every ISA CpuAdam has";
  CpuAdamOptions options;
  options.isa = missing;
  EXPECT_EQ(CpuAdam::Create(options).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace strata::offload
