#include "policies/rollout/decode_step.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "policies/rollout/rollout_engine.h"
#include "tests/policies/model/tiny_config.h"

namespace strata::policies {
namespace {

TEST(DecodeStepTest, BucketsRoundRowsAndColumnsUp) {
  const std::vector<std::pair<int64_t, int64_t>> rows = {{1, 1},  {2, 2},   {3, 4},   {5, 8},   {8, 8},
                                                         {9, 16}, {17, 24}, {64, 64}, {65, 96}, {200, 224}};
  for (const auto& [n, bucket] : rows) EXPECT_EQ(RowBucket(n), bucket) << n << " rows";
  EXPECT_EQ(ColumnBucket(1, 16, 1000), 16);
  EXPECT_EQ(ColumnBucket(5, 4, 100), 8);
  EXPECT_EQ(ColumnBucket(9, 4, 100), 16);
  EXPECT_EQ(ColumnBucket(17, 4, 100), 32);
  EXPECT_EQ(ColumnBucket(33, 4, 40), 40) << "no wider than the longest a rollout reaches";
  EXPECT_EQ(ColumnBucket(50, 4, 40), 50) << "never narrower than the step";
}

// Two sequences over a pool of random keys and values: one sampled, one
// greedy, 6 and 9 positions cached.
struct Fixture {
  std::unique_ptr<LlamaModel> model = LlamaModel::RandomInit(TinyConfig(ModelFamily::kMistral),
                                                             LlamaHead::kLanguageModel, at::kFloat, 3, 0.5);
  KvBlockPool pool{model->config(), 8, 4, at::TensorOptions().dtype(at::kFloat)};
  std::vector<int64_t> a = {5, 1}, b = {2, 7, 0};  // block tables
  std::vector<StepRow> batch = {{11, &a, 6, RowDraw{77, 3}}, {12, &b, 9, std::nullopt}};
  SamplingOptions sampling;

  Fixture() {
    at::Generator gen = at::detail::createCPUGenerator(9);
    for (int64_t l = 0; l < model->config().num_hidden_layers; ++l) {
      for (at::Tensor* store : {&pool.keys(l), &pool.values(l)}) {
        store->narrow(0, 0, 8 * 4).copy_(at::randn({8 * 4, store->size(1), store->size(2)}, gen));
      }
    }
    sampling.temperature = 0.8;
    sampling.top_k = 20;
  }

  SampledTokens Step(int64_t rows, int64_t columns, int64_t fetch) {
    c10::NoGradGuard no_grad;
    DecodeStep step(*model, pool, sampling, rows, columns);
    step.Stage(batch);
    step.Run(nullptr);
    EXPECT_FALSE(step.captured()) << "no graphs without a session";
    return step.Fetch(fetch);
  }
};

// Pad rows and columns beyond the longest sequence are masked out: the two
// real rows pick the same tokens in a bucket of 2 x 10 (exact) as in one
// of 8 x 16, with log-probs equal to float rounding (masked columns add
// exact zeros, but products over other shapes sum in another order), and
// the pad rows stay finite.
TEST(DecodeStepTest, PadRowsAndWiderColumnsChangeNoRealRowsPick) {
  Fixture f;
  const SampledTokens exact = f.Step(2, 10, 2);
  const SampledTokens padded = f.Step(8, 16, 8);
  EXPECT_TRUE(at::equal(exact.ids, padded.ids.narrow(0, 0, 2))) << exact.ids << padded.ids;
  EXPECT_TRUE(at::allclose(exact.logprobs, padded.logprobs.narrow(0, 0, 2), 0, 1e-5));
  EXPECT_TRUE(padded.logprobs.isfinite().all().item<bool>()) << padded.logprobs;
  EXPECT_THROW(f.Step(1, 10, 1), c10::Error) << "two sequences in a bucket of one row";
  EXPECT_THROW(f.Step(2, 9, 2), c10::Error) << "a sequence of 10 positions in 9 columns";
}

// A sampled row whose cache holds NaN has nothing to draw: an error, as
// SampleNextTokens has it. A greedy row picks the NaN, as at::argmax does.
TEST(DecodeStepTest, NotFiniteLogitsFailASampledRowOnly) {
  Fixture f;
  for (int64_t l = 0; l < f.model->config().num_hidden_layers; ++l) {
    for (int64_t block : f.b) f.pool.values(l).narrow(0, block * 4, 4).fill_(NAN);
  }
  EXPECT_NO_THROW(f.Step(2, 10, 2)) << "the sampled row is finite";
  std::swap(f.batch[0].draw, f.batch[1].draw);
  EXPECT_THROW(f.Step(2, 10, 2), c10::Error);
}

// On a GPU the engine captures a bucket's step as a CUDA graph on its
// second use and replays it after. A replay runs the kernels the eager
// step ran, so it picks what eager fixed-shape steps pick; a capture that
// met a host read or a copy from the host would have thrown. Every
// attention path a decode step can take on a GPU is captured: the additive
// mask with grouped heads (Llama's tiny shape), with Mistral's window, and
// the fused kernel with equal key/value heads; a concurrency limit makes
// rows come and go, so buckets replay out of their capture order.
TEST(DecodeStepTest, CudaGraphsPickWhatEagerStepsPick_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "needs a GPU";
  const at::Device cuda(at::kCUDA, 0);
  LlamaConfig equal_heads = TinyConfig(ModelFamily::kLlama);
  equal_heads.num_key_value_heads = equal_heads.num_attention_heads;
  const std::vector<std::pair<std::string, LlamaConfig>> shapes = {{"llama", TinyConfig(ModelFamily::kLlama)},
                                                                   {"mistral", TinyConfig(ModelFamily::kMistral)},
                                                                   {"equal heads", equal_heads}};
  for (const auto& [name, config] : shapes) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      auto cpu = LlamaModel::RandomInit(config, LlamaHead::kLanguageModel, dtype, 5, 0.5);
      LlamaWeights weights = cpu->weights();
      MoveToDevice(weights, cuda, /*include_layers=*/true);
      const LlamaModel model(cpu->config(), LlamaHead::kLanguageModel, weights);
      SamplingOptions sampling;
      sampling.max_new_tokens = 24;
      sampling.top_p = 0.9;
      std::vector<RolloutPrompt> prompts;
      for (int32_t p = 0; p < 6; ++p) {
        std::vector<int32_t> ids(static_cast<size_t>(2 + 3 * p));
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((7 * p + 3 * i) % 50);
        prompts.push_back({ids, {100u + static_cast<uint64_t>(p), 200u + static_cast<uint64_t>(p)}, true, {}});
      }
      const std::vector<int64_t> stops = {2, 9, 14};
      RolloutEngineOptions eager;
      eager.kv_block_tokens = 4;
      eager.max_concurrency = 5;
      eager.cuda_graphs = false;
      eager.fixed_shape_steps = true;
      RolloutEngineOptions graphed = eager;
      graphed.cuda_graphs = true;
      RolloutEngine want_engine(model, eager, stops), got_engine(model, graphed, stops);
      auto want = want_engine.Run(prompts, sampling);
      auto got = got_engine.Run(prompts, sampling);
      const std::string what = name + (dtype == at::kFloat ? ", fp32" : ", bf16");
      ASSERT_TRUE(want.ok()) << what << ": " << want.status();
      ASSERT_TRUE(got.ok()) << what << ": " << got.status();
      EXPECT_EQ(want_engine.stats().captured_graphs, 0) << what;
      EXPECT_GT(got_engine.stats().captured_graphs, 0) << what;
      EXPECT_GT(got_engine.stats().replayed_steps, got_engine.stats().captured_graphs) << what;
      for (size_t p = 0; p < prompts.size(); ++p) {
        for (size_t c = 0; c < 3; ++c) {
          const Continuation &w = (*want)[p][c], &g = (*got)[p][c];
          EXPECT_EQ(w.tokens, g.tokens) << what << ", prompt " << p << ", continuation " << c;
          for (size_t t = 0; t < std::min(w.logprobs.size(), g.logprobs.size()); ++t) {
            EXPECT_NEAR(w.logprobs[t], g.logprobs[t], 1e-5) << what << ", prompt " << p << ", continuation " << c;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata::policies
