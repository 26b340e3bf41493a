// The sampler: Philox against PyTorch's own engine, the native race
// against its definition and against the tensor-operation path a GPU runs,
// and the drawn frequencies against softmax(logits / T) truncated by top-k
// and top-p.
#include "policies/model/sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/PhiloxRNGEngine.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "gtest/gtest.h"

namespace strata::policies {
namespace {

std::vector<RowDraw> RandomDraws(int64_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<RowDraw> draws;
  for (int64_t r = 0; r < rows; ++r) {
    // Steps past 2^32 use the counter's fourth word.
    const int64_t step = r % 5 == 4 ? static_cast<int64_t>(rng() >> 1) : static_cast<int64_t>(rng() % 4096);
    draws.push_back({rng(), step});
  }
  return draws;
}

TEST(SamplerTest, PhiloxIsPyTorchsPhilox4x32) {
  // Random123's known answers for Philox4x32-10.
  EXPECT_EQ(Philox4x32({0, 0, 0, 0}, 0), (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(Philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, ~uint64_t{0}),
            (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(Philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, 0x299f31d0a4093822ULL),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200; ++i) {
    const uint64_t key = i == 0 ? 0 : rng(), subsequence = i == 0 ? 0 : rng(), offset = i == 0 ? 0 : rng();
    at::Philox4_32 engine(key, subsequence, offset);
    const auto got = Philox4x32({static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32),
                                 static_cast<uint32_t>(subsequence), static_cast<uint32_t>(subsequence >> 32)},
                                key);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(got[static_cast<size_t>(w)], engine()) << "case " << i << " word " << w;
  }
}

// Entry i's uniform is the documented function of Philox's words.
TEST(SamplerTest, AnEntrysUniformComesFromItsPhiloxWords) {
  for (const RowDraw& d : RandomDraws(8, 2)) {
    const auto step_lo = static_cast<uint32_t>(d.step),
               step_hi = static_cast<uint32_t>(static_cast<uint64_t>(d.step) >> 32);
    for (const int64_t entry : {0, 1, 7, 8, 31, 32, 100, 127, 128, 1000, 151935}) {
      const int64_t c = entry / 128, w = entry % 128 / 32, k = entry % 32 / 8, l = entry % 8;
      const uint64_t top = Philox4x32({static_cast<uint32_t>(8 * c + l), 0, step_lo, step_hi},
                                      d.seed)[static_cast<size_t>(w)] >>
                               (8 * k) &
                           0xFF;
      const auto own = Philox4x32({static_cast<uint32_t>(entry / 2), 1, step_lo, step_hi}, d.seed);
      const size_t j = 2 * static_cast<size_t>(entry % 2);
      const uint64_t low = static_cast<uint64_t>(own[j]) << 13 | own[j + 1] >> 19;
      const double want = (static_cast<double>(top << 45 | low) + 1) / 9007199254740992.0;  // 2^53
      EXPECT_EQ(DrawUniform(d, entry), want) << "entry " << entry;
      EXPECT_GT(want, 0.0);
      EXPECT_LE(want, 1.0);
    }
  }
}

// Temperature, top-k and top-p together.
SamplingOptions Truncated(int64_t top_k, double top_p, double temperature) {
  SamplingOptions options;
  options.top_k = top_k;
  options.top_p = top_p;
  options.temperature = temperature;
  return options;
}

// argmax p_i / -log(u_i) over every entry of p[0, n): the race, by brute force.
int64_t BruteForceRace(const float* p, int64_t n, const RowDraw& draw) {
  int64_t best = -1;
  double best_score = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double score = p[i] / -std::log(DrawUniform(draw, i));
    if (score > best_score) best_score = score, best = i;
  }
  return best;
}

// The native race (AVX2 where the CPU has it, skipping entries that cannot
// win) picks exactly argmax p_i / -log(u_i) over every entry.
TEST(SamplerTest, TheRacePicksTheLargestProbabilityOverItsExponential) {
  const int64_t rows = 48, vocab = 1001;  // not a multiple of the 32-entry groups
  at::Generator gen = at::detail::createCPUGenerator(3);
  const at::Tensor logits = at::randn({rows, vocab}, gen, at::TensorOptions().dtype(at::kFloat)) * 2.0;
  const std::vector<RowDraw> draws = RandomDraws(rows, 4);
  SamplingOptions options;
  const SampledTokens got = SampleNextTokens(logits, options, draws);
  const at::Tensor probs = logits.softmax(-1);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t want = BruteForceRace(probs[r].data_ptr<float>(), vocab, draws[static_cast<size_t>(r)]);
    EXPECT_EQ(got.ids[r].item<int64_t>(), want) << "row " << r;
  }
}

// The race picks the same entry on every instruction set, the scalar one
// (a CPU without AVX2 runs it) included, whatever this machine has; each
// against the brute force, in rows whose lengths end mid-group.
TEST(SamplerTest, EveryIsaOfTheRacePicksWhatTheBruteForcePicks) {
#if defined(__x86_64__)
  const bool avx2 = __builtin_cpu_supports("avx2");
#else
  const bool avx2 = false;
#endif
  at::Generator gen = at::detail::createCPUGenerator(9);
  for (const int64_t vocab : {1, 127, 128, 1001}) {
    const at::Tensor probs = (at::randn({24, vocab}, gen, at::TensorOptions().dtype(at::kFloat)) * 2.0).softmax(-1);
    const std::vector<RowDraw> draws = RandomDraws(24, static_cast<uint64_t>(vocab) + 9);
    for (int64_t r = 0; r < 24; ++r) {
      const float* p = probs[r].data_ptr<float>();
      const RowDraw& draw = draws[static_cast<size_t>(r)];
      const int64_t want = BruteForceRace(p, vocab, draw);
      EXPECT_EQ(RaceDraw(p, vocab, draw, RaceIsa::kScalar), want) << "vocab " << vocab << " row " << r;
      if (avx2) EXPECT_EQ(RaceDraw(p, vocab, draw, RaceIsa::kAvx2), want) << "vocab " << vocab << " row " << r;
    }
  }
  if (!avx2) EXPECT_THROW(RaceDraw(nullptr, 0, {}, RaceIsa::kAvx2), c10::Error);
}

// The path a GPU runs (Philox as tensor operations, the race as a division
// and an argmax, a chunk of the vocabulary at a time) draws what the native
// race draws, on the same logits.
TEST(SamplerTest, TensorOperationsDrawWhatTheNativeRaceDraws) {
  SamplingOptions raw, tempered, truncated, greedy;
  tempered.temperature = 0.7;
  truncated.top_k = 50;
  truncated.top_p = 0.9;
  greedy.greedy = true;
  at::Generator gen = at::detail::createCPUGenerator(5);
  for (const int64_t vocab : {1001, 32000}) {
    const int64_t rows = vocab > 5000 ? 12 : 40;
    const at::Tensor logits = at::randn({rows, vocab}, gen, at::TensorOptions().dtype(at::kFloat)) * 3.0;
    const std::vector<RowDraw> draws = RandomDraws(rows, static_cast<uint64_t>(vocab));
    for (const SamplingOptions& options : {raw, tempered, truncated, greedy}) {
      const SampledTokens native = SampleNextTokens(logits, options, draws);
      const SampledTokens ops = SampleWithTensorOps(logits, options, draws);
      EXPECT_TRUE(at::equal(native.ids, ops.ids)) << "vocab " << vocab << " T " << options.temperature;
      EXPECT_TRUE(at::allclose(native.logprobs, ops.logprobs, 0, 1e-5));
      // The race a chunk of the vocabulary at a time: with 1 MiB of words
      // a chunk is 256 entries for 1001's 40 rows and 1024 for 32000's 12
      // (4 and 32 chunks, the last of each partial).
      std::vector<int64_t> keys;
      for (const RowDraw& d : draws) keys.push_back(static_cast<int64_t>(d.seed)), keys.push_back(d.step);
      const at::Tensor chunked = PickOnDevice(logits, options, at::tensor(keys, at::kLong).view({rows, 2}),
                                              at::zeros({rows}, at::kBool), /*race_chunk_bytes=*/1 << 20);
      EXPECT_TRUE(at::equal(native.ids, chunked[0].to(at::kLong))) << "vocab " << vocab << ", in chunks";
    }
  }
}

// The rollout engine's batches hold sampled rows, then greedy ones (ReMax's
// baseline); drawn together, each row gets what its kind draws alone, on
// either path.
TEST(SamplerTest, AMixedBatchDrawsWhatEachKindDrawsAlone) {
  const SamplingOptions raw, truncated = Truncated(20, 0.8, 0.9);
  SamplingOptions greedy;
  greedy.greedy = true;
  at::Generator gen = at::detail::createCPUGenerator(8);
  const int64_t rows = 20, sampled = 12;
  const at::Tensor logits = at::randn({rows, 1001}, gen, at::TensorOptions().dtype(at::kFloat)) * 3.0;
  const std::vector<RowDraw> draws = RandomDraws(sampled, 8);
  for (const SamplingOptions& options : {raw, truncated}) {
    const SampledTokens alone = SampleNextTokens(logits.narrow(0, 0, sampled), options, draws);
    const SampledTokens baseline = SampleNextTokens(logits.narrow(0, sampled, rows - sampled), greedy, {});
    const at::Tensor want_ids = at::cat({alone.ids, baseline.ids});
    const at::Tensor want_logprobs = at::cat({alone.logprobs, baseline.logprobs});
    for (const bool native : {true, false}) {
      const SampledTokens got = native ? SampleThenGreedy(logits, options, draws)
                                       : SampleWithTensorOps(logits, options, draws);
      EXPECT_TRUE(at::equal(got.ids, want_ids)) << (native ? "native" : "tensor ops") << ": " << got.ids;
      EXPECT_TRUE(at::allclose(got.logprobs, want_logprobs, 0, 1e-5));
    }
  }
  // All greedy when the options say so, whatever the draws.
  EXPECT_TRUE(at::equal(SampleThenGreedy(logits, greedy, draws).ids, logits.argmax(-1)));
  EXPECT_TRUE(
      at::equal(SampleThenGreedy(logits.narrow(0, 0, 4), greedy, draws).ids, logits.narrow(0, 0, 4).argmax(-1)));
  EXPECT_THROW(SampleThenGreedy(logits.narrow(0, 0, 4), raw, draws), c10::Error);
  // A NaN picks itself in a greedy row, as at::argmax does, and is an error
  // in a sampled row.
  for (const int64_t row : {rows - 1, int64_t{0}}) {
    at::Tensor broken = logits.clone();
    broken[row][5] = std::numeric_limits<float>::quiet_NaN();
    for (const bool native : {true, false}) {
      auto draw = [&] {
        return native ? SampleThenGreedy(broken, raw, draws) : SampleWithTensorOps(broken, raw, draws);
      };
      if (row >= sampled) {
        EXPECT_EQ(draw().ids[row].item<int64_t>(), 5);
      } else {
        EXPECT_THROW(draw(), c10::Error);
      }
    }
  }
}

// On a GPU the sampler runs there and draws what the CPU draws: Philox's
// integers are exact on both, so tokens differ only where the float race
// nearly ties (none in 40 rows of random logits, where the two leading
// scores differ by far more than float rounding).
TEST(SamplerTest, AGpuDrawsWhatTheCpuDraws_CUDA) {
  if (!at::hasCUDA()) GTEST_SKIP() << "needs a GPU";
  const SamplingOptions raw, truncated = Truncated(50, 0.9, 0.8);
  SamplingOptions greedy;
  greedy.greedy = true;
  at::Generator gen = at::detail::createCPUGenerator(6);
  const at::Tensor logits = at::randn({40, 32000}, gen, at::TensorOptions().dtype(at::kFloat)) * 3.0;
  const std::vector<RowDraw> draws = RandomDraws(40, 6);
  for (const SamplingOptions& options : {raw, truncated, greedy}) {
    const SampledTokens cpu = SampleNextTokens(logits, options, draws);
    const SampledTokens gpu = SampleNextTokens(logits.to(at::Device(at::kCUDA, 0)), options, draws);
    EXPECT_TRUE(gpu.ids.device().is_cpu());
    EXPECT_TRUE(at::equal(cpu.ids, gpu.ids)) << "T " << options.temperature << " top-k " << options.top_k;
    EXPECT_TRUE(at::allclose(cpu.logprobs, gpu.logprobs, 0, 1e-4));
  }
  // A mixed batch, as the engine decodes, in one copy.
  const std::vector<RowDraw> first(draws.begin(), draws.begin() + 25);
  const SampledTokens cpu = SampleThenGreedy(logits, truncated, first);
  const SampledTokens gpu = SampleThenGreedy(logits.to(at::Device(at::kCUDA, 0)), truncated, first);
  EXPECT_TRUE(at::equal(cpu.ids, gpu.ids));
  EXPECT_TRUE(at::allclose(cpu.logprobs, gpu.logprobs, 0, 1e-4));
}

// The chi-square statistic's upper tail Q(x; k) for integer k, in closed
// form (Abramowitz and Stegun 26.4.4 and 26.4.5).
double ChiSquareSurvival(double x, int k) {
  double term, sum;
  if (k % 2 == 0) {
    term = sum = 1.0;
    for (int j = 1; j < k / 2; ++j) sum += (term *= x / (2.0 * j));
    return std::exp(-x / 2) * sum;
  }
  if (k == 1) return std::erfc(std::sqrt(x / 2));
  term = sum = std::sqrt(x);
  for (int j = 1; j <= (k - 3) / 2; ++j) sum += (term *= x / (2.0 * j + 1));
  return std::erfc(std::sqrt(x / 2)) + std::sqrt(2 / M_PI) * std::exp(-x / 2) * sum;
}

// softmax(logits / T) with top-k and top-p applied as HF does (sorted
// ascending, the tail of mass <= 1 - top_p dropped, the most likely token
// kept), in double, independently of the sampler's code.
std::vector<double> Expected(const std::vector<double>& logits, const SamplingOptions& o) {
  const size_t n = logits.size();
  std::vector<double> scaled(n);
  for (size_t i = 0; i < n; ++i) scaled[i] = logits[i] / o.temperature;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scaled[a] < scaled[b]; });
  std::vector<bool> kept(n, true);
  if (o.top_k > 0) {
    for (size_t j = 0; j + static_cast<size_t>(o.top_k) < n; ++j) kept[order[j]] = false;
  }
  auto normalised = [&] {
    std::vector<double> p(n, 0.0);
    double z = 0;
    for (size_t i = 0; i < n; ++i) {
      if (kept[i]) z += (p[i] = std::exp(scaled[i]));
    }
    for (double& v : p) v /= z;
    return p;
  };
  if (o.top_p < 1.0) {
    const std::vector<double> p = normalised();
    double cumulative = 0;
    for (size_t j = 0; j + 1 < n; ++j) {
      cumulative += p[order[j]];
      if (cumulative <= 1.0 - o.top_p) kept[order[j]] = false;
    }
  }
  return normalised();
}

// Over 20,000 draws each token's count matches the truncated distribution
// (and on a flat vocabulary of 256, uniform):
// the chi-square statistic over the kept tokens has an upper-tail
// probability above 1e-6 (a false failure once in a million runs per
// case), and a dropped token is never drawn.
TEST(SamplerTest, DrawsFollowTheTruncatedDistribution) {
  const std::vector<double> logits = {2.0, 1.2, 0.9, 0.3, 0.0, -0.4, -1.0, -2.5};
  SamplingOptions raw, cold, top_k, top_p, both;
  cold.temperature = 0.5;
  top_k.top_k = 3;
  top_p.top_p = 0.8;  // cumulative masses sit away from 0.2
  both.top_k = 5;
  both.top_p = 0.9;
  both.temperature = 1.5;
  constexpr int64_t kRows = 1000, kSteps = 20;
  const auto vocab = static_cast<int64_t>(logits.size());
  const at::Tensor batch =
      at::tensor(logits, at::kDouble).to(at::kFloat).view({1, vocab}).expand({kRows, vocab}).contiguous();
  int case_index = 0;
  for (const SamplingOptions& options : {raw, cold, top_k, top_p, both}) {
    std::vector<int64_t> counts(logits.size(), 0);
    for (int64_t step = 0; step < kSteps; ++step) {
      std::vector<RowDraw> draws;
      for (int64_t r = 0; r < kRows; ++r) draws.push_back({static_cast<uint64_t>(1000 * case_index + r), step});
      const at::Tensor ids = SampleNextTokens(batch, options, draws).ids;
      for (int64_t r = 0; r < kRows; ++r) ++counts[static_cast<size_t>(ids[r].item<int64_t>())];
    }
    const std::vector<double> p = Expected(logits, options);
    double statistic = 0;
    int kept = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      if (p[i] == 0) {
        EXPECT_EQ(counts[i], 0) << "case " << case_index << ": dropped token " << i << " was drawn";
        continue;
      }
      const double expected = p[i] * kRows * kSteps;
      statistic += (counts[i] - expected) * (counts[i] - expected) / expected;
      ++kept;
    }
    EXPECT_GT(ChiSquareSurvival(statistic, kept - 1), 1e-6)
        << "case " << case_index << ": chi-square " << statistic << " over " << kept << " tokens";
    ++case_index;
  }
  // 256 equally likely tokens: two whole groups of the race's bound, so
  // every byte of the blocks the bound reads is drawn from.
  {
    constexpr int64_t kVocab = 256;
    const at::Tensor flat = at::zeros({kRows, kVocab}, at::kFloat);
    std::vector<int64_t> counts(kVocab, 0);
    for (int64_t step = 0; step < kSteps; ++step) {
      std::vector<RowDraw> draws;
      for (int64_t r = 0; r < kRows; ++r) draws.push_back({static_cast<uint64_t>(77 + r), step});
      const at::Tensor ids = SampleNextTokens(flat, raw, draws).ids;
      for (int64_t r = 0; r < kRows; ++r) ++counts[static_cast<size_t>(ids[r].item<int64_t>())];
    }
    const double expected = static_cast<double>(kRows * kSteps) / kVocab;
    double statistic = 0;
    for (const int64_t c : counts) statistic += (c - expected) * (c - expected) / expected;
    EXPECT_GT(ChiSquareSurvival(statistic, kVocab - 1), 1e-6) << "flat: chi-square " << statistic;
  }
  // The closed form itself, at known quantiles: 3.841 (k 1) and 11.070 (k 5) at 5%.
  EXPECT_NEAR(ChiSquareSurvival(3.841, 1), 0.05, 1e-4);
  EXPECT_NEAR(ChiSquareSurvival(11.070, 5), 0.05, 1e-4);
  EXPECT_NEAR(ChiSquareSurvival(9.488, 4), 0.05, 1e-4);
  EXPECT_NEAR(ChiSquareSurvival(293.248, 255), 0.05, 1e-3);
}

// Top-p keeps the most likely token however small top_p is.
TEST(SamplerTest, TopPKeepsTheMostLikelyToken) {
  const at::Tensor logits = at::tensor({0.5f, 2.0f, 1.9f, -1.0f}, at::kFloat).view({1, 4});
  SamplingOptions tiny;
  tiny.top_p = 1e-9;
  for (int64_t step = 0; step < 200; ++step) {
    EXPECT_EQ(SampleNextTokens(logits, tiny, {{7, step}}).ids[0].item<int64_t>(), 1);
    EXPECT_EQ(SampleWithTensorOps(logits, tiny, {{7, step}}).ids[0].item<int64_t>(), 1);
  }
}

// The log-probs a draw reports are the raw distribution's (temperature 1,
// before top-k / top-p), whether the draw was raw, tempered, truncated or
// greedy.
TEST(SamplerTest, DrawsReportTheRawDistributionsLogProbs) {
  const at::Tensor logits = at::tensor({2.0f, 1.0f, 0.0f, -1.0f, -60.0f, 3.0f, 2.5f, -2.0f}, at::kFloat).view({2, 4});
  const at::Tensor want = logits.log_softmax(-1);
  SamplingOptions raw, tempered, truncated, greedy;
  tempered.temperature = 0.3;
  truncated.top_k = 2;
  truncated.top_p = 0.9;
  greedy.greedy = true;
  for (const SamplingOptions& options : {raw, tempered, truncated, greedy}) {
    for (int64_t step = 0; step < 50; ++step) {
      for (const bool native : {true, false}) {
        const std::vector<RowDraw> draws = {{3, step}, {4, step}};
        const SampledTokens got = native ? SampleNextTokens(logits, options, draws)
                                         : SampleWithTensorOps(logits, options, draws);
        for (int64_t b = 0; b < 2; ++b) {
          EXPECT_NEAR(got.logprobs[b].item<float>(), want[b][got.ids[b].item<int64_t>()].item<float>(), 1e-5);
        }
      }
    }
  }
}

// Greedy is at::argmax's: the first of equal largest logits, and a NaN
// before anything (so a broken model is seen), in rows of any length.
TEST(SamplerTest, GreedyTakesTheFirstLargestLogitOrTheFirstNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  SamplingOptions greedy;
  greedy.greedy = true;
  for (const int64_t vocab : {1, 3, 4, 7, 64, 1001}) {
    at::Tensor logits = at::randn({3, vocab}, at::TensorOptions().dtype(at::kFloat));
    if (vocab > 2) {
      logits[0][vocab - 1] = 100.0f;  // ties: the first wins
      logits[0][vocab / 2] = 100.0f;
      logits[1][vocab - 2] = nan;
      logits[1][vocab - 1] = nan;
    }
    const at::Tensor got = SampleNextTokens(logits, greedy, {}).ids;
    EXPECT_TRUE(at::equal(got, logits.argmax(-1))) << "vocab " << vocab << ": " << got << " vs " << logits.argmax(-1);
  }
}

// A broken model's logits are an error on either path, never a token.
TEST(SamplerTest, NonFiniteLogitsAreAnError) {
  const at::Tensor logits = at::tensor({1.0f, std::numeric_limits<float>::quiet_NaN(), 0.0f}, at::kFloat).view({1, 3});
  SamplingOptions options;
  EXPECT_THROW(SampleNextTokens(logits, options, {{1, 0}}), c10::Error);
  EXPECT_THROW(SampleWithTensorOps(logits, options, {{1, 0}}), c10::Error);
}

}  // namespace
}  // namespace strata::policies
