// Blocked attention, and libtorch's fused kernel where it exists (PyTorch
// 2.5+; on a GPU when there is one), against the materialised attention
// (the decoder's own formula: scores, a finite additive mask, an fp32
// softmax), forward and backward, with grouped queries, padding, a window,
// fewer queries than keys and blocks that do not divide the sequence, and
// in every family's decoder layer. Blocked attention's working memory:
// tests/policies/train/attention_memory_test.cc.
#include "policies/model/blocked_attention.h"

#include <c10/core/GradMode.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "policies/model/fused_attention.h"
#include "policies/model/llama.h"
#include "tests/policies/model/tiny_config.h"

namespace strata::policies {
namespace {

// What DecoderLayerForward computes without a cache.
at::Tensor Materialised(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_real,
                        int64_t window) {
  const int64_t b = q.size(0), hq = q.size(1), t = q.size(2), d = q.size(3), hkv = k.size(1), s = k.size(2);
  const at::Tensor query_pos = at::arange(s - t, s, at::kLong).unsqueeze(1);
  const at::Tensor key_pos = at::arange(0, s, at::kLong).unsqueeze(0);
  at::Tensor allowed = key_pos.le(query_pos);
  if (window > 0) allowed = allowed.logical_and(key_pos.gt(query_pos - window));
  allowed = allowed.unsqueeze(0).logical_and(key_real.unsqueeze(1));
  const at::Tensor bias = at::zeros(allowed.sizes(), at::kFloat)
                              .masked_fill(allowed.logical_not(), std::numeric_limits<float>::lowest())
                              .view({b, 1, 1, t, s});
  const at::Tensor scores = (at::matmul(q.reshape({b, hkv, -1, d}), k.transpose(-1, -2)) /
                             std::sqrt(static_cast<double>(d)))
                                .view({b, hkv, hq / hkv, t, s}) +
                            bias;
  return at::matmul(at::softmax(scores, -1, at::kFloat).view({b, hkv, -1, s}), v).view({b, hq, t, d});
}

struct Case {
  const char* name;
  int64_t b, hq, hkv, t, s, d, window, query_block, key_block;
  std::vector<int64_t> pads;  // left padding of each row
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class BlockedAttentionTest : public ::testing::TestWithParam<Case> {};

// A case's random q, k and v, its padding, and a loss's weights over the
// real queries only (a pad query's output is never read).
struct Inputs {
  at::Tensor q, k, v, key_real, query_real, weights;
};

Inputs RandomInputs(const Case& c) {
  at::manual_seed(7);
  Inputs in;
  in.q = at::randn({c.b, c.hq, c.t, c.d}), in.k = at::randn({c.b, c.hkv, c.s, c.d});
  in.v = at::randn({c.b, c.hkv, c.s, c.d});
  in.key_real = at::ones({c.b, c.s}, at::kBool);
  for (int64_t r = 0; r < c.b; ++r) in.key_real[r].narrow(0, 0, c.pads[static_cast<size_t>(r)]).fill_(false);
  in.query_real = in.key_real.narrow(1, c.s - c.t, c.t).view({c.b, 1, c.t, 1}).to(at::kFloat);
  in.weights = at::randn({c.b, c.hq, c.t, c.d}) * in.query_real;
  return in;
}

// The output at real queries and the gradients of q, k and v (on the CPU)
// of `attend` on `device`, under the loss `in.weights` sets.
template <typename Attend>
std::vector<at::Tensor> OutputAndGradients(const Inputs& in, const at::Device& device, Attend attend,
                                           at::ScalarType dtype = at::kFloat) {
  // Copies: each call's leaves gather their own gradients.
  auto leaf = [&](const at::Tensor& t) { return t.to(device, dtype).clone().requires_grad_(); };
  at::Tensor q = leaf(in.q), k = leaf(in.k), v = leaf(in.v);
  const at::Tensor out = attend(q, k, v);
  (out.to(at::kFloat) * in.weights.to(device)).sum().backward();
  auto cpu = [](const at::Tensor& t) { return t.cpu().to(at::kFloat); };
  return {(cpu(out) * in.query_real).detach(), cpu(q.grad()), cpu(k.grad()), cpu(v.grad())};
}

// Each of output, dq, dk and dv within `tolerance` of its scale.
void ExpectClose(const std::vector<at::Tensor>& want, const std::vector<at::Tensor>& got, double tolerance,
                 const Case& c) {
  const char* names[] = {"output", "dq", "dk", "dv"};
  for (size_t i = 0; i < want.size(); ++i) {
    const double scale = want[i].abs().max().item<double>();
    ASSERT_GT(scale, 0.0) << names[i];
    EXPECT_LT((got[i] - want[i]).abs().max().item<double>(), tolerance * scale) << c.name << " " << names[i];
  }
}

// Outputs and the gradients of q, k and v under a loss over the real
// queries: the materialised attention's, to fp32 rounding.
TEST_P(BlockedAttentionTest, EqualsTheMaterialisedAttentionForwardAndBackward) {
  const Case c = GetParam();
  const Inputs in = RandomInputs(c);
  const at::Device cpu(at::kCPU);
  const auto want = OutputAndGradients(in, cpu, [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return Materialised(q, k, v, in.key_real, c.window);
  });
  const auto got = OutputAndGradients(in, cpu, [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    BlockedAttentionOptions options;
    options.window = c.window, options.query_block = c.query_block, options.key_block = c.key_block;
    return BlockedAttention(q, k, v, in.key_real, options);
  });
  // fp32 both ways, sums split into blocks and rescaled (the online
  // softmax): 1e-5 of each quantity's scale (a few hundred roundings of
  // 6e-8); a wrong mask or a missed block is off by its whole size.
  ExpectClose(want, got, 1e-5, c);
}

// The same through the fused operator, on a GPU when there is one (_CUDA:
// deploy/gpu/run.sh runs such tests one binary at a time), else on the
// CPU: its causal mask alone where that suffices, else the additive mask.
TEST_P(BlockedAttentionTest, FusedEqualsTheMaterialisedAttentionForwardAndBackward_CUDA) {
  if (!FusedAttentionAvailable()) GTEST_SKIP() << "this libtorch has no aten::scaled_dot_product_attention with GQA";
  const Case c = GetParam();
  const Inputs in = RandomInputs(c);
  const at::Device device = at::hasCUDA() ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  const bool causal_alone = c.t == c.s && c.window == 0 && in.key_real.all().item<bool>();
  const auto want = OutputAndGradients(in, at::Device(at::kCPU),
                                       [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
                                         return Materialised(q, k, v, in.key_real, c.window);
                                       });
  auto fused = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    const at::Tensor mask = causal_alone ? at::Tensor()
                                         : AdditiveAttentionMask(in.key_real.to(device), c.t, c.window, q.scalar_type(),
                                                                 /*pad_queries_see_themselves=*/true);
    return FusedAttention(q, k, v, mask);
  };
  // fp32 both ways. On the CPU, 1e-5 of each quantity's scale, as for the
  // blocks. On a GPU the kernels may sum in another order and multiply in
  // TF32 where libtorch allows it (10-bit mantissa: 5e-4 relative a
  // product, averaging out over D = 8-16 terms): 2e-3. A wrong mask or a
  // misread head is off by its whole size.
  ExpectClose(want, OutputAndGradients(in, device, fused), device.is_cuda() ? 2e-3 : 1e-5, c);
  if (!device.is_cuda()) return;
  // bf16 on the GPU (where FlashAttention's kernel serves the unmasked
  // cases) against the fp32 reference: inputs rounded to 8 bits of
  // mantissa (4e-3 relative), scores of a few units off by ~1e-2, the
  // softmax's weights by as much relatively, the output and the gradients
  // rounded again: 5e-2 of each quantity's scale.
  ExpectClose(want, OutputAndGradients(in, device, fused, at::kBFloat16), 5e-2, c);
}

INSTANTIATE_TEST_SUITE_P(Shapes, BlockedAttentionTest,
                         ::testing::Values(Case{"gqa", 2, 4, 2, 37, 37, 8, 0, 8, 16, {0, 5}},
                                           Case{"causal_alone", 2, 4, 2, 37, 37, 8, 0, 8, 16, {0, 0}},
                                           Case{"mha_one_block", 1, 2, 2, 20, 20, 16, 0, 128, 256, {3}},
                                           Case{"qwen3_head_dim", 2, 6, 2, 23, 23, 12, 0, 5, 7, {2, 0}},
                                           Case{"mistral_window", 2, 4, 2, 41, 41, 8, 5, 8, 6, {0, 9}},
                                           Case{"fewer_queries_than_keys", 2, 4, 1, 9, 30, 8, 0, 4, 8, {4, 0}},
                                           Case{"window_and_prefix", 1, 4, 2, 12, 33, 8, 7, 5, 4, {6}}),
                         [](const auto& info) { return std::string(info.param.name); });

// A decoder layer of every family (Mistral's window, Qwen2's biases,
// Qwen3's q/k norms and head_dim) with left padding: the layer's output and
// the gradients of its input and weights, blocked against materialised.
TEST(BlockedAttentionLayerTest, EveryFamilysLayerComputesTheSame) {
  for (const ModelFamily family :
       {ModelFamily::kLlama, ModelFamily::kMistral, ModelFamily::kQwen2, ModelFamily::kQwen3}) {
    const LlamaConfig config = TinyConfig(family);
    auto model = LlamaModel::RandomInit(config, LlamaHead::kLanguageModel, at::kFloat, 5, 0.2);
    LlamaLayerWeights layer = model->weights().layers[0];
    at::Tensor mask = at::ones({2, 19}, at::kLong);
    mask[1].narrow(0, 0, 6).fill_(0);
    at::manual_seed(3);
    const at::Tensor hidden0 = at::randn({2, 19, config.hidden_size});
    const at::Tensor weights = at::randn({2, 19, config.hidden_size}) * mask.unsqueeze(-1).to(at::kFloat);
    auto run = [&](AttentionKind kind) {
      for (auto& [name, t] : layer.Named()) *t = t->detach().clone().requires_grad_();
      const at::Tensor hidden = hidden0.clone().requires_grad_();
      const LayerContext ctx = MakeLayerContext(config, mask, 19, at::kFloat, kind);
      EXPECT_EQ(ctx.attention_bias.defined(), kind == AttentionKind::kMaterialised);
      const at::Tensor out = DecoderLayerForward(config, layer, hidden, ctx, nullptr, 0, nullptr);
      (out * weights).sum().backward();
      std::vector<at::Tensor> result = {(out * mask.unsqueeze(-1).to(at::kFloat)).detach(), hidden.grad()};
      for (auto& [name, t] : layer.Named()) result.push_back(t->grad());
      return result;
    };
    const auto want = run(AttentionKind::kMaterialised);
    std::vector<AttentionKind> kinds = {AttentionKind::kBlocked};
    if (FusedAttentionAvailable()) kinds.push_back(AttentionKind::kFused);  // its CPU kernel
    for (const AttentionKind kind : kinds) {
      const auto got = run(kind);
      ASSERT_EQ(want.size(), got.size());
      for (size_t i = 0; i < want.size(); ++i) {
        if (!want[i].defined()) continue;  // a weight this family lacks
        const double scale = want[i].abs().max().item<double>();
        EXPECT_LE((got[i] - want[i]).abs().max().item<double>(), 1e-5 * scale)
            << ModelTypeName(family) << " tensor " << i << (kind == AttentionKind::kFused ? " (fused)" : "");
      }
    }
  }
}

// The fused operator is found exactly where libtorch has the signature
// strata calls (enable_gqa came in 2.5), so an older libtorch (Debian's
// 1.13) attends in blocks instead of failing.
TEST(FusedAttentionTest, IsAvailableFromPyTorch25On) {
  const bool has_gqa = TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5);
  EXPECT_EQ(FusedAttentionAvailable(), has_gqa);
}

// The fused kernels' mask: a pad query, which sees no key, sees its own
// position (a fully masked row would be NaN there); every other row is the
// materialised attention's mask.
TEST(FusedAttentionTest, APadQuerySeesOnlyItselfInTheFusedMask) {
  at::Tensor key_real = at::ones({2, 7}, at::kBool);
  key_real[1].narrow(0, 0, 3).fill_(false);
  const at::Tensor plain = AdditiveAttentionMask(key_real, 5, 0, at::kFloat);
  const at::Tensor fused = AdditiveAttentionMask(key_real, 5, 0, at::kFloat, /*pad_queries_see_themselves=*/true);
  ASSERT_EQ(fused.sizes(), (std::vector<int64_t>{2, 1, 5, 7}));
  const at::Tensor differs = fused.ne(plain);
  // Row 1's queries at positions 2..6: position 2 is a pad and sees nothing
  // but now itself; the real queries from 3 on are unchanged.
  EXPECT_EQ(differs.sum().item<int64_t>(), 1);
  EXPECT_TRUE(differs[1][0][0][2].item<bool>());
  EXPECT_EQ(fused[1][0][0][2].item<float>(), 0.f);
  EXPECT_EQ(plain[1][0][0][2].item<float>(), std::numeric_limits<float>::lowest());
}

// A CUDA model's layers take a fused kernel only where one serves the call:
// causality alone (FlashAttention's in half precision, grouped or not; the
// memory-efficient one in fp32 with equal heads), or a small mask with
// equal heads. Elsewhere libtorch would materialise the scores, so blocks.
// On the CPU, kAuto keeps to materialised or blocked attention.
TEST(FusedAttentionTest, AutoTakesAFusedKernelOnAGpuWhereOneServes_CUDA) {
  const LlamaConfig grouped = TinyConfig(ModelFamily::kLlama);  // 4 query heads, 2 key/value heads
  LlamaConfig equal = grouped;
  equal.num_key_value_heads = equal.num_attention_heads;
  at::Tensor mask = at::ones({2, 19}, at::kLong);
  EXPECT_FALSE(MakeLayerContext(equal, mask, 19, at::kFloat).fused);
  if (!FusedAttentionAvailable() || !at::hasCUDA()) GTEST_SKIP() << "needs the fused operator and a GPU";
  mask = mask.to(at::kCUDA);
  const LayerContext plain = MakeLayerContext(equal, mask, 19, at::kFloat);
  EXPECT_TRUE(plain.fused);
  EXPECT_FALSE(plain.fused_mask.defined());
  EXPECT_TRUE(MakeLayerContext(grouped, mask, 19, at::kBFloat16).fused);
  EXPECT_FALSE(MakeLayerContext(grouped, mask, 19, at::kFloat).fused);
  mask[1].narrow(0, 0, 6).fill_(0);
  const LayerContext padded = MakeLayerContext(equal, mask, 19, at::kFloat);
  EXPECT_TRUE(padded.fused);
  ASSERT_TRUE(padded.fused_mask.defined());
  EXPECT_EQ(padded.fused_mask.sizes(), (std::vector<int64_t>{2, 1, 19, 19}));
  EXPECT_FALSE(MakeLayerContext(grouped, mask, 19, at::kBFloat16).fused);
  // 2 rows x 4k x 4k in fp32: 128 MiB of mask, past the bound.
  const at::Tensor long_mask = at::ones({2, 4096}, at::TensorOptions().dtype(at::kLong).device(at::kCUDA));
  long_mask[1].narrow(0, 0, 6).fill_(0);
  const LayerContext blocked = MakeLayerContext(equal, long_mask, 4096, at::kFloat);
  EXPECT_FALSE(blocked.fused);
  EXPECT_FALSE(blocked.attention_bias.defined());
}

// The scores the blocks compute, which the planner and `bench figures`
// price blocked attention by: whole block pairs that causality or the
// window does not wholly hide (kAttentionQueryBlock 128, kAttentionKeyBlock 256).
TEST(BlockedAttentionScoresTest, CountsTheBlockPairsTheKernelComputes) {
  // 1k causal: query block i sees key blocks 0 .. (128 i + 127) / 256, 20
  // pairs of 128 x 256 in all, against 524,800 visible scores.
  EXPECT_EQ(BlockedAttentionScores(1024, 1024), 20 * 128 * 256);
  // 16k: 4,160 pairs, 1.6% above the visible 134,225,920.
  EXPECT_EQ(BlockedAttentionScores(16384, 16384), int64_t{4160} * 128 * 256);
  // 100 new queries after 900 positions see every key ...
  EXPECT_EQ(BlockedAttentionScores(100, 1000), 100 * 1000);
  // ... and with a window of 300 (keys above position 600 for the first
  // query) the first two key blocks, [0, 256) and [256, 512), are skipped.
  EXPECT_EQ(BlockedAttentionScores(100, 1000, 300), 100 * (256 + 232));
}

// The count is a closed form per query block (the planner calls it for
// 100k-token passes many times in a fit); it must agree with walking every
// block pair through the kernel's own skip rule, at ragged ends, with
// decode-style query tails and with windows narrower and wider than a block.
TEST(BlockedAttentionScoresTest, ClosedFormAgreesWithTheKernelsSkipRule) {
  auto walked = [](int64_t queries, int64_t keys, int64_t window) {
    int64_t scores = 0;
    for (int64_t t0 = 0; t0 < queries; t0 += kAttentionQueryBlock) {
      const int64_t t1 = std::min(t0 + kAttentionQueryBlock, queries);
      const int64_t first = keys - queries + t0, last = keys - queries + t1 - 1;
      for (int64_t j0 = 0; j0 < keys; j0 += kAttentionKeyBlock) {
        const int64_t j1 = std::min(j0 + kAttentionKeyBlock, keys);
        if (!BlockPairHidden(first, last, j0, j1, window)) scores += (t1 - t0) * (j1 - j0);
      }
    }
    return scores;
  };
  for (const int64_t keys : {1, 255, 256, 257, 1000, 1024, 3001}) {
    for (const int64_t queries : {int64_t{1}, int64_t{129}, keys / 3 + 1, keys}) {
      if (queries > keys) continue;
      for (const int64_t window : {0, 1, 100, 256, 300, 4096}) {
        EXPECT_EQ(BlockedAttentionScores(queries, keys, window), walked(queries, keys, window))
            << queries << " queries, " << keys << " keys, window " << window;
      }
    }
  }
}

}  // namespace
}  // namespace strata::policies
