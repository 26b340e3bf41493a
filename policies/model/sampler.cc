#include "policies/model/sampler.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#define STRATA_AVX2 __attribute__((target("avx2")))
#endif

namespace strata::policies {

namespace {

// Philox4x32's multipliers and key increments (Salmon et al., Table 2).
constexpr uint32_t kMulA = 0xD2511F53u, kMulB = 0xCD9E8D57u;
constexpr uint32_t kWeylA = 0x9E3779B9u, kWeylB = 0xBB67AE85u;
constexpr int kRounds = 10;

// An entry's uniform has 53 bits: its top 8 from its byte of a group's
// Philox blocks, the low 45 from a block of its own (sampler.h has the
// layout). The race's bound needs only the top 8, so the whole vocabulary
// costs one block per 16 entries; the other 45 bits are computed for the
// entries the bound lets through (about 1 in 256; a 16-bit bound, tried,
// lets fewer through but doubles the blocks and ran slower). A group is 8
// blocks side by side, one 32-bit lane each: entry 128 c + 32 w + 8 k + l
// takes byte k of word w of block 8 c + l, so shifting one word's lane
// vector gives 8 consecutive entries.
constexpr int64_t kEntriesPerGroup = 128, kBlocksPerGroup = 8;

std::array<uint32_t, 4> Block(const RowDraw& draw, uint64_t block, uint32_t stream) {
  return Philox4x32({static_cast<uint32_t>(block), stream, static_cast<uint32_t>(draw.step),
                     static_cast<uint32_t>(static_cast<uint64_t>(draw.step) >> 32)},
                    draw.seed);
}

// A group's words: words[8 w + l] is word w of block 8 c + l.
void GroupWordsScalar(const RowDraw& draw, int64_t group, uint32_t words[32]) {
  for (int64_t l = 0; l < kBlocksPerGroup; ++l) {
    const auto block = Block(draw, static_cast<uint64_t>(group * kBlocksPerGroup + l), 0);
    for (int w = 0; w < 4; ++w) words[w * kBlocksPerGroup + l] = block[static_cast<size_t>(w)];
  }
}

// The top 8 bits of the uniform of the entry at `offset` in its group.
uint32_t TopByte(const uint32_t words[32], int64_t offset) {
  const int64_t w = offset / 32, k = offset / 8 % 4, l = offset % 8;
  return words[w * kBlocksPerGroup + l] >> (8 * k) & 0xFFu;
}

// u <= (top + 1) / 256, so 1 - u is at least this exact float.
float OneLessUniformAtLeast(uint32_t top) { return 1.0f - (static_cast<float>(top) + 1.0f) * 0x1.0p-8f; }

// Bit j of mask[w] is set when entry 32 w + j of a whole group could beat
// `scale`: p > scale x (1 - u's upper bound).
void GroupCandidatesScalar(const float* p, const uint32_t words[32], float scale, uint32_t mask[4]) {
  for (int w = 0; w < 4; ++w) {
    mask[w] = 0;
    for (int j = 0; j < 32; ++j) {
      if (p[32 * w + j] > scale * OneLessUniformAtLeast(TopByte(words, 32 * w + j))) mask[w] |= 1u << j;
    }
  }
}

#if defined(__x86_64__)
// (hi, lo) of each 32-bit lane of x times m.
STRATA_AVX2 inline void MulHiLo(__m256i x, __m256i m, __m256i* hi, __m256i* lo) {
  const __m256i even = _mm256_mul_epu32(x, m);                        // lanes 0, 2, 4, 6 as 64-bit products
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);  // lanes 1, 3, 5, 7
  *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

STRATA_AVX2 void GroupWordsAvx2(const RowDraw& draw, int64_t group, uint32_t words[32]) {
  const auto first = static_cast<int32_t>(group * kBlocksPerGroup);
  __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i c1 = _mm256_setzero_si256();
  __m256i c2 = _mm256_set1_epi32(static_cast<int32_t>(draw.step));
  __m256i c3 = _mm256_set1_epi32(static_cast<int32_t>(static_cast<uint64_t>(draw.step) >> 32));
  const __m256i mul_a = _mm256_set1_epi32(static_cast<int32_t>(kMulA));
  const __m256i mul_b = _mm256_set1_epi32(static_cast<int32_t>(kMulB));
  auto k0 = static_cast<uint32_t>(draw.seed), k1 = static_cast<uint32_t>(draw.seed >> 32);
  for (int round = 0; round < kRounds; ++round) {
    __m256i hi0, lo0, hi1, lo1;
    MulHiLo(c0, mul_a, &hi0, &lo0);
    MulHiLo(c2, mul_b, &hi1, &lo1);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int32_t>(k0)));
    c1 = lo1;
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int32_t>(k1)));
    c3 = lo0;
    k0 += kWeylA, k1 += kWeylB;
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(words), c0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(words + 8), c1);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(words + 16), c2);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(words + 24), c3);
}

STRATA_AVX2 void GroupCandidatesAvx2(const float* p, const uint32_t words[32], float scale, uint32_t mask[4]) {
  const __m256 one = _mm256_set1_ps(1.0f), step = _mm256_set1_ps(0x1.0p-8f), bound_scale = _mm256_set1_ps(scale);
  const __m256i byte = _mm256_set1_epi32(0xFF);
  for (int w = 0; w < 4; ++w) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 8 * w));
    mask[w] = 0;
    for (int k = 0; k < 4; ++k) {
      const __m256i top = _mm256_and_si256(_mm256_srlv_epi32(x, _mm256_set1_epi32(8 * k)), byte);
      const __m256 above = _mm256_sub_ps(one, _mm256_mul_ps(_mm256_add_ps(_mm256_cvtepi32_ps(top), one), step));
      const __m256 bound = _mm256_mul_ps(bound_scale, above);
      const __m256 candidate = _mm256_cmp_ps(_mm256_loadu_ps(p + 32 * w + 8 * k), bound, _CMP_GT_OQ);
      mask[w] |= static_cast<uint32_t>(_mm256_movemask_ps(candidate)) << (8 * k);
    }
  }
}

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

// The race's inner work on one group, with or without AVX2.
struct GroupKernels {
  void (*words)(const RowDraw&, int64_t, uint32_t*) = GroupWordsScalar;
  void (*candidates)(const float*, const uint32_t*, float, uint32_t*) = GroupCandidatesScalar;
};

GroupKernels PickGroupKernels(RaceIsa isa) {
  GroupKernels k;
  if (isa == RaceIsa::kScalar) return k;
#if defined(__x86_64__)
  if (HasAvx2()) {
    k.words = GroupWordsAvx2, k.candidates = GroupCandidatesAvx2;
    return k;
  }
#endif
  TORCH_CHECK(isa == RaceIsa::kAuto, "sampling: this CPU has no AVX2");
  return k;
}

// The entry's uniform from its top byte and its own block's low 45 bits
// (words 2 h and 2 h + 1 of block entry / 2 of stream 1, h = entry % 2).
double UniformOf(const RowDraw& draw, int64_t entry, uint32_t top) {
  const auto block = Block(draw, static_cast<uint64_t>(entry) / 2, 1);
  const size_t h = 2 * static_cast<size_t>(entry % 2);
  const uint64_t low = static_cast<uint64_t>(block[h]) << 13 | block[h + 1] >> 19;
  return (static_cast<double>(static_cast<uint64_t>(top) << 45 | low) + 1.0) * 0x1.0p-53;
}

// One draw from the distribution p[0, n): argmax p_i / E_i with E_i ~
// Exp(1), the race at::multinomial runs, E_i = -log(u_i) for entry i's
// uniform u_i (DrawUniform). Each u_i comes from (seed, step, i) alone, so
// a float-level change to one probability (a gang's rounding against one
// rank's, a GPU's against the CPU's) changes the draw only if that entry
// was about to win or lose; an inverse CDF would move with every entry
// before the draw. E_i >= 1 - u_i, so an entry with p_i <= best x (1 - u_i)
// cannot win: a float bound on that from the top bits skips nearly the
// whole vocabulary without the low bits or a log. -1 when no entry is
// positive and finite (NaN probabilities compare false).
int64_t ExponentialRace(const float* p, int64_t n, const RowDraw& draw, const GroupKernels& kernels) {
  int64_t best = -1;
  double best_score = 0;
  // Below best_score by more than float rounding: an entry under
  // scale x (1 - u_i's upper bound) is under best_score x (1 - u_i).
  float scale = 0;
  auto consider = [&](int64_t i, uint32_t top) {
    const double pi = p[i];  // > 0: NaN and zero fail the bound
    const double u = UniformOf(draw, i, top);
    if (pi <= best_score * (1.0 - u)) return;
    const double score = pi / -std::log(u);
    if (score > best_score) {
      best_score = score, best = i;
      scale = static_cast<float>(best_score) * (1.0f - 0x1.0p-20f);
    }
  };
  alignas(32) uint32_t words[32];
  uint32_t mask[4];
  for (int64_t start = 0; start < n; start += kEntriesPerGroup) {
    kernels.words(draw, start / kEntriesPerGroup, words);
    if (start + kEntriesPerGroup <= n) {
      // A bound from the scale at the group's start passes a superset of
      // the entries the current best leaves in the race.
      kernels.candidates(p + start, words, scale, mask);
      for (int w = 0; w < 4; ++w) {
        for (uint32_t m = mask[w]; m != 0; m &= m - 1) {
          const int64_t offset = 32 * w + __builtin_ctz(m);
          consider(start + offset, TopByte(words, offset));
        }
      }
    } else {
      for (int64_t offset = 0; start + offset < n; ++offset) {
        const uint32_t top = TopByte(words, offset);
        if (p[start + offset] > scale * OneLessUniformAtLeast(top)) consider(start + offset, top);
      }
    }
  }
  return best;
}

// The index of x[0, n)'s largest entry, the first of equals; a NaN is
// larger than anything (the first NaN wins), as at::argmax has it.
int64_t RowArgmax(const float* x, int64_t n) {
  float best = -std::numeric_limits<float>::infinity();
  bool nan = false;
  int64_t i = 0;
#if defined(__SSE2__)
  __m128 most = _mm_set1_ps(best);
  __m128 unordered = _mm_setzero_ps();
  for (; i + 4 <= n; i += 4) {
    const __m128 v = _mm_loadu_ps(x + i);
    most = _mm_max_ps(most, v);
    unordered = _mm_or_ps(unordered, _mm_cmpunord_ps(v, v));
  }
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, most);
  for (float v : lanes) best = std::max(best, v);
  nan = _mm_movemask_ps(unordered) != 0;
#endif
  for (; i < n; ++i) {
    if (std::isnan(x[i])) nan = true;
    else best = std::max(best, x[i]);
  }
  for (int64_t j = 0; j < n; ++j) {
    if (nan ? std::isnan(x[j]) : x[j] == best) return j;
  }
  return 0;  // n == 0
}

// log p(next) under softmax(logits): the logit less the row's logsumexp.
at::Tensor RawLogProbs(const at::Tensor& scores, const at::Tensor& next) {
  return (scores.gather(-1, next.unsqueeze(-1)).squeeze(-1) - scores.logsumexp(-1)).contiguous();
}

// softmax(scores / temperature), with the tokens top-k and top-p drop at
// zero; tensor operations on the scores' device.
at::Tensor SamplingProbs(const at::Tensor& scores, const SamplingOptions& options) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  at::Tensor tempered = scores / options.temperature;
  if (options.top_k > 0 && options.top_k < tempered.size(-1)) {
    const at::Tensor kth = std::get<0>(tempered.topk(options.top_k, -1)).narrow(-1, options.top_k - 1, 1);
    tempered = tempered.masked_fill(tempered < kth, neg_inf);
  }
  if (options.top_p < 1.0) {
    // As HF does: sort ascending and drop the low tail whose total mass is at
    // most 1 - top_p; the most likely token always survives.
    auto [sorted, order] = tempered.sort(-1, /*descending=*/false);
    const at::Tensor cumulative = sorted.softmax(-1).cumsum(-1);
    at::Tensor drop_sorted = cumulative <= (1.0 - options.top_p);
    drop_sorted.narrow(-1, drop_sorted.size(-1) - 1, 1).fill_(false);
    const at::Tensor drop = drop_sorted.scatter(-1, order, drop_sorted);
    tempered = tempered.masked_fill(drop, neg_inf);
  }
  return tempered.softmax(-1).contiguous();
}

bool Untouched(const SamplingOptions& options) {
  return options.temperature == 1.0 && options.top_k == 0 && options.top_p >= 1.0;
}

// The picked tokens' raw log-probs. When the sampled distribution is the
// raw one, its probabilities give them without another pass over the
// vocabulary; a drawn token's probability is positive, but below float's
// normal range its log loses digits, so those rows take the slow way. On
// the host a test skips the slow way when no row needs it; on a device that
// test would wait for the device, so both are computed. Rows in `slow`
// (bool [rows], optional: greedy ones) take the slow way too.
at::Tensor PickedLogProbs(const at::Tensor& scores, const at::Tensor& probs, const at::Tensor& next,
                          const SamplingOptions& options, const at::Tensor& slow = {}) {
  if (!Untouched(options)) return RawLogProbs(scores, next);
  const at::Tensor drawn = probs.gather(1, next.unsqueeze(1)).squeeze(1);
  at::Tensor tiny = drawn < std::numeric_limits<float>::min();
  if (slow.defined()) tiny = tiny.logical_or(slow);
  if (scores.device().is_cpu() && !tiny.any().item<bool>()) return drawn.log().contiguous();
  return at::where(tiny, RawLogProbs(scores, next), drawn.log()).contiguous();
}

// How many of the logits' rows SampleThenGreedy samples.
int64_t SampledRows(const SamplingOptions& options, const at::Tensor& logits, const std::vector<RowDraw>& draws) {
  TORCH_CHECK(logits.dim() == 2, "sampling: logits must be [rows, vocabulary], got ", logits.sizes());
  if (options.greedy) return 0;
  TORCH_CHECK(static_cast<int64_t>(draws.size()) <= logits.size(0), "sampling: ", draws.size(), " draws for ",
              logits.size(0), " rows");
  return static_cast<int64_t>(draws.size());
}

[[noreturn]] void NotFinite() {
  // As at::multinomial does: a broken model (NaN or infinite logits) is an
  // error, never a token. Either makes its row's softmax all NaN, and a row
  // of NaN has no entry to draw.
  TORCH_CHECK(false, "sampling: the probabilities are not finite (NaN or inf logits)");
}

// Philox4x32-10 over int64 tensors holding 32-bit words: c[0..3] and the
// key words broadcast together. ATen's int64 products wrap (two's
// complement) on every backend, and the low 64 bits of a 32 x 32-bit
// product hold both its halves.
std::array<at::Tensor, 4> PhiloxTensors(std::array<at::Tensor, 4> c, at::Tensor k0, at::Tensor k1) {
  constexpr int64_t kLow32 = 0xFFFFFFFFLL;
  for (int round = 0; round < kRounds; ++round) {
    const at::Tensor p0 = c[0] * static_cast<int64_t>(kMulA);
    const at::Tensor p1 = c[2] * static_cast<int64_t>(kMulB);
    const at::Tensor hi0 = p0.__rshift__(32).bitwise_and(kLow32), hi1 = p1.__rshift__(32).bitwise_and(kLow32);
    c = {hi1.bitwise_xor(c[1]).bitwise_xor(k0), p1.bitwise_and(kLow32), hi0.bitwise_xor(c[3]).bitwise_xor(k1),
         p0.bitwise_and(kLow32)};
    k0 = (k0 + static_cast<int64_t>(kWeylA)).bitwise_and(kLow32);
    k1 = (k1 + static_cast<int64_t>(kWeylB)).bitwise_and(kLow32);
  }
  return c;
}

// The uniforms of entries [begin, begin + count) of each row's draw,
// [rows, count] float64 on the keys' device; keys: [rows, 2] int64, each
// row's (seed, step). `begin` starts a group.
at::Tensor DrawUniforms(const at::Tensor& keys, int64_t begin, int64_t count) {
  constexpr int64_t kLow32 = 0xFFFFFFFFLL;
  TORCH_CHECK(begin % kEntriesPerGroup == 0, "sampling: uniforms from entry ", begin, ", not a group's first");
  const int64_t rows = keys.size(0);
  const auto on = at::TensorOptions().dtype(at::kLong).device(keys.device());
  const at::Tensor seed = keys.narrow(1, 0, 1), step = keys.narrow(1, 1, 1);
  // The words of blocks [first, first + blocks) of `stream`, [rows, 4, blocks].
  auto words_of = [&](int64_t first, int64_t blocks, int64_t stream) {
    const at::Tensor block = at::arange(first, first + blocks, on).view({1, blocks}).expand({rows, blocks});
    const auto words = PhiloxTensors({block, at::full({rows, blocks}, stream, on),
                                      step.bitwise_and(kLow32).expand({rows, blocks}),
                                      step.__rshift__(32).bitwise_and(kLow32).expand({rows, blocks})},
                                     seed.bitwise_and(kLow32), seed.__rshift__(32).bitwise_and(kLow32));
    return at::stack({words[0], words[1], words[2], words[3]}, 1);
  };
  // Top bytes: [rows, 4 (word), 4 (byte), groups, 8 (lane)], permuted to
  // entry 128 group + 32 word + 8 byte + lane.
  const int64_t groups = (count + kEntriesPerGroup - 1) / kEntriesPerGroup;
  const at::Tensor shifts = at::arange(0, 32, 8, on).view({1, 1, 4, 1, 1});
  const at::Tensor top = words_of(begin / kEntriesPerGroup * kBlocksPerGroup, groups * kBlocksPerGroup, 0)
                             .view({rows, 4, 1, groups, kBlocksPerGroup})
                             .__rshift__(shifts)
                             .bitwise_and(0xFF)
                             .permute({0, 3, 1, 2, 4})
                             .reshape({rows, groups * kEntriesPerGroup})
                             .narrow(1, 0, count);
  // Low 45 bits: entry 2 j + h from words 2 h and 2 h + 1 of block j.
  const int64_t pairs = (count + 1) / 2;
  const at::Tensor own = words_of(begin / 2, pairs, 1).view({rows, 2, 2, pairs});
  const at::Tensor low = (own.select(2, 0).__lshift__(13) + own.select(2, 1).__rshift__(19))
                             .permute({0, 2, 1})
                             .reshape({rows, 2 * pairs})
                             .narrow(1, 0, count);
  return (top.__lshift__(45) + low + 1).to(at::kDouble) * 0x1.0p-53;
}

// The exponential race's winner of each row of `probs` [rows, V]: the
// argmax of p / -log u, a chunk of the vocabulary at a time so that the
// Philox words take at most `chunk_bytes`. The first of
// equal entries wins, as argmax has it. An entry of probability 0 never
// wins (u = 1 would make it 0 / -0, a NaN); a row of NaN (no finite
// distribution) races nothing and picks entry 0, whose NaN probability
// the caller reports.
at::Tensor RaceWinners(const at::Tensor& probs, const at::Tensor& keys, int64_t chunk_bytes) {
  const int64_t rows = probs.size(0), vocab = probs.size(1);
  const int64_t fit = chunk_bytes / (kRaceBytesPerEntry * std::max<int64_t>(rows, 1));
  const int64_t chunk = std::max<int64_t>(fit / kEntriesPerGroup, 1) * kEntriesPerGroup;
  at::Tensor best_value, best_index;
  for (int64_t begin = 0; begin < vocab; begin += chunk) {
    const int64_t count = std::min(chunk, vocab - begin);
    const at::Tensor p = probs.narrow(1, begin, count).to(at::kDouble);
    const at::Tensor race = at::where(p > 0, p / DrawUniforms(keys, begin, count).log().neg(), 0.0);
    auto [value, index] = race.max(1);
    index = index + begin;
    if (!best_value.defined()) {
      best_value = value, best_index = index;
      continue;
    }
    const at::Tensor better = value.gt(best_value);  // an equal one later is not better
    best_value = at::where(better, value, best_value);
    best_index = at::where(better, index, best_index);
  }
  return best_index;
}

// The native race over rows of `scores` (float32, contiguous, on the CPU).
SampledTokens NativeSampled(const at::Tensor& scores, const SamplingOptions& options,
                            const std::vector<RowDraw>& draws) {
  const int64_t rows = scores.size(0), vocab = scores.size(1);
  at::Tensor next = at::empty({rows}, at::kLong);
  int64_t* out = next.data_ptr<int64_t>();
  const at::Tensor probs = SamplingProbs(scores, options);
  const float* p = probs.data_ptr<float>();
  static const GroupKernels kernels = PickGroupKernels(RaceIsa::kAuto);
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      out[b] = ExponentialRace(p + b * vocab, vocab, draws[static_cast<size_t>(b)], kernels);
    }
  });
  if (!std::all_of(out, out + rows, [](int64_t t) { return t >= 0; })) NotFinite();
  return {next, PickedLogProbs(scores, probs, next, options)};
}

SampledTokens NativeGreedy(const at::Tensor& scores) {
  const int64_t rows = scores.size(0), vocab = scores.size(1);
  at::Tensor next = at::empty({rows}, at::kLong);
  int64_t* out = next.data_ptr<int64_t>();
  const float* x = scores.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) out[b] = RowArgmax(x + b * vocab, vocab);
  });
  return {next, RawLogProbs(scores, next)};
}

}  // namespace

std::array<uint32_t, 4> Philox4x32(const std::array<uint32_t, 4>& counter, uint64_t key) {
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  auto k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMulA) * c0, p1 = static_cast<uint64_t>(kMulB) * c2;
    const auto hi0 = static_cast<uint32_t>(p0 >> 32), hi1 = static_cast<uint32_t>(p1 >> 32);
    c0 = hi1 ^ c1 ^ k0, c1 = static_cast<uint32_t>(p1), c2 = hi0 ^ c3 ^ k1, c3 = static_cast<uint32_t>(p0);
    k0 += kWeylA, k1 += kWeylB;
  }
  return {c0, c1, c2, c3};
}

int64_t RaceDraw(const float* p, int64_t n, const RowDraw& draw, RaceIsa isa) {
  return ExponentialRace(p, n, draw, PickGroupKernels(isa));
}

double DrawUniform(const RowDraw& draw, int64_t entry) {
  uint32_t words[32];
  GroupWordsScalar(draw, entry / kEntriesPerGroup, words);
  return UniformOf(draw, entry, TopByte(words, entry % kEntriesPerGroup));
}

at::Tensor PickOnDevice(const at::Tensor& logits, const SamplingOptions& options, const at::Tensor& keys,
                        const at::Tensor& greedy, int64_t race_chunk_bytes) {
  TORCH_CHECK(logits.dim() == 2, "sampling: logits must be [rows, vocabulary], got ", logits.sizes());
  const at::Tensor scores = logits.to(at::kFloat);
  const at::Tensor greedy_ids = scores.argmax(-1);
  if (options.greedy) {
    return at::stack({greedy_ids.to(at::kDouble), RawLogProbs(scores, greedy_ids).to(at::kDouble),
                      at::ones({scores.size(0)}, scores.options().dtype(at::kDouble))});
  }
  TORCH_CHECK(keys.dim() == 2 && keys.size(0) == scores.size(0) && keys.size(1) == 2 &&
                  greedy.sizes() == at::IntArrayRef{scores.size(0)},
              "sampling: keys must be [rows, 2] and greedy [rows] for ", scores.size(0), " rows");
  // Every row draws; greedy rows then take their argmax instead. Shapes
  // never depend on which rows are which.
  const at::Tensor probs = SamplingProbs(scores, options);
  const at::Tensor next = at::where(greedy, greedy_ids, RaceWinners(probs, keys, race_chunk_bytes));
  const at::Tensor drawn_prob = probs.gather(1, next.unsqueeze(1)).squeeze(1).to(at::kDouble);
  // Greedy rows' log-probs as the CPU's greedy path computes them.
  const at::Tensor logprobs = PickedLogProbs(scores, probs, next, options, /*slow=*/greedy);
  return at::stack(
      {next.to(at::kDouble), logprobs.to(at::kDouble), at::where(greedy, at::ones_like(drawn_prob), drawn_prob)});
}

SampledTokens TokensFromPicks(const at::Tensor& picks) {
  const at::Tensor host = picks.to(at::kCPU);
  if (!(host[2] > 0).all().item<bool>()) NotFinite();
  return {host[0].to(at::kLong), host[1].to(at::kFloat)};
}

SampledTokens SampleWithTensorOps(const at::Tensor& logits, const SamplingOptions& options,
                                  const std::vector<RowDraw>& draws) {
  const int64_t sampled = SampledRows(options, logits, draws), rows = logits.size(0);
  // Each row's (seed, step) in one copy to the device; greedy rows' unused.
  std::vector<int64_t> keys(static_cast<size_t>(2 * rows), 0);
  for (size_t r = 0; r < static_cast<size_t>(sampled); ++r) {
    keys[2 * r] = static_cast<int64_t>(draws[r].seed), keys[2 * r + 1] = draws[r].step;
  }
  const at::Device device = logits.device();
  const at::Tensor on_device = at::tensor(keys, at::kLong).view({rows, 2}).to(device);
  const at::Tensor greedy = at::arange(rows, at::TensorOptions().dtype(at::kLong).device(device)) >= sampled;
  return TokensFromPicks(PickOnDevice(logits, options, on_device, greedy));
}

SampledTokens SampleThenGreedy(const at::Tensor& logits, const SamplingOptions& options,
                               const std::vector<RowDraw>& draws) {
  if (!logits.device().is_cpu()) return SampleWithTensorOps(logits, options, draws);
  const int64_t sampled = SampledRows(options, logits, draws), rows = logits.size(0);
  const at::Tensor scores = logits.to(at::kFloat).contiguous();
  if (sampled == 0) return NativeGreedy(scores);
  if (sampled == rows) return NativeSampled(scores, options, draws);
  const SampledTokens a = NativeSampled(scores.narrow(0, 0, sampled), options, draws);
  const SampledTokens b = NativeGreedy(scores.narrow(0, sampled, rows - sampled));
  return {at::cat({a.ids, b.ids}), at::cat({a.logprobs, b.logprobs})};
}

SampledTokens SampleNextTokens(const at::Tensor& logits, const SamplingOptions& options,
                               const std::vector<RowDraw>& draws) {
  if (options.greedy) return SampleThenGreedy(logits, options, {});
  // A draw for every row: none of them greedy by a short list.
  TORCH_CHECK(logits.dim() != 2 || static_cast<int64_t>(draws.size()) == logits.size(0), "sampling: ", draws.size(),
              " draws for ", logits.size(0), " rows");
  return SampleThenGreedy(logits, options, draws);
}

}  // namespace strata::policies
