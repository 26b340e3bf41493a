// Picking the next token from a step's logits where the model runs:
// greedy, or sampled (temperature, top-k, top-p as HF does them). A sampled
// row's randomness is a function of (its seed, its step, the vocabulary
// entry) alone, drawn with Philox4x32-10, the counter-based generator curand
// and PyTorch use, so a row's draws do not depend on its batch, the
// concurrency, the gang size or the device. The host receives the picked
// ids and their log-probs, nothing of the size of the vocabulary.
#ifndef STRATA_POLICIES_MODEL_SAMPLER_H_
#define STRATA_POLICIES_MODEL_SAMPLER_H_

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <vector>

#include "policies/config/sampling.h"

namespace strata::policies {

// Whose randomness a sampled row draws with: its continuation's seed, and
// which of its tokens this is (0 for the first new token).
struct RowDraw {
  uint64_t seed = 0;
  int64_t step = 0;
};

struct SampledTokens {
  at::Tensor ids;       // [rows] int64, on the CPU
  at::Tensor logprobs;  // [rows] float32, on the CPU: log p under softmax(logits), temperature 1, untruncated
};

// Picks each row's next token from `logits` [rows, V] (any float dtype, on
// any device); `draws` holds one entry per row unless options.greedy. On
// the CPU the draw runs natively; elsewhere as tensor operations on the
// logits' device (SampleWithTensorOps), which draw the same tokens up to
// float rounding at near-ties. A sampled row with no finite positive
// probability (NaN or inf logits) is an error, as at::multinomial has it; a
// greedy row picks the first NaN, as at::argmax does.
SampledTokens SampleNextTokens(const at::Tensor& logits, const SamplingOptions& options,
                               const std::vector<RowDraw>& draws);

// A batch of both kinds, as the rollout engine decodes: the first
// draws.size() rows sampled with `options`, the rest greedy (all rows when
// options.greedy), with one copy to the host for the whole batch.
SampledTokens SampleThenGreedy(const at::Tensor& logits, const SamplingOptions& options,
                               const std::vector<RowDraw>& draws);

// SampleThenGreedy's path off the CPU, on any device: PickOnDevice, then
// TokensFromPicks. Exposed so the CPU tests it against the native path.
SampledTokens SampleWithTensorOps(const at::Tensor& logits, const SamplingOptions& options,
                                  const std::vector<RowDraw>& draws);

// Each row's pick from `logits` [rows, V] by tensor operations on their
// device, reading nothing on the host and copying nothing from it, with
// shapes that do not depend on the values: what a CUDA graph can capture.
// keys: [rows, 2] int64 on that device, each row's (seed, step); greedy:
// [rows] bool, rows that take their argmax (their keys unused); both
// ignored when options.greedy. Returns [3, rows] float64: the picked id,
// its log p under softmax(logits) (temperature 1, untruncated) and its
// sampling probability (1 for greedy rows, not positive for a sampled row
// whose logits were not finite). The race's Philox words take at most
// `race_chunk_bytes` (tests make it small to race over many chunks).
at::Tensor PickOnDevice(const at::Tensor& logits, const SamplingOptions& options, const at::Tensor& keys,
                        const at::Tensor& greedy, int64_t race_chunk_bytes = kRaceChunkBytes);

// PickOnDevice's output (or its first columns), brought to the host: ids
// and log-probs, and the error SampleNextTokens gives a sampled row whose
// logits were not finite.
SampledTokens TokensFromPicks(const at::Tensor& picks);

// The instruction set the CPU's race runs on; each picks the same entry.
enum class RaceIsa { kAuto, kScalar, kAvx2 };

// One draw from probabilities p[0, n) by the CPU's race, on `isa` (kAuto:
// the widest this CPU has); exposed so the tests run the scalar race on
// machines with AVX2 too. -1 when no entry is positive (NaN entries never
// win); kAvx2 on a CPU without it is an error.
int64_t RaceDraw(const float* p, int64_t n, const RowDraw& draw, RaceIsa isa);

// Philox4x32-10 (Salmon et al., SC'11) of `counter` under `key`: the
// function at::Philox4_32(key, counter[2] | counter[3] << 32, counter[0] |
// counter[1] << 32) draws from.
std::array<uint32_t, 4> Philox4x32(const std::array<uint32_t, 4>& counter, uint64_t key);

// Entry i's uniform u in (0, 1] for the draw (seed, step), the exponential
// race's: u = (t x 2^45 + r + 1) / 2^53 from Philox blocks under key
// `seed` with counter {b, stream, step's low and high words}: t is byte k
// of word w of stream-0 block 8 c + l, where i = 128 c + 32 w + 8 k + l;
// r is words 2 j and 2 j + 1 (32 + 13 bits) of stream-1 block i / 2,
// j = i % 2. The race's bound reads only t, one block per 16 entries.
double DrawUniform(const RowDraw& draw, int64_t entry);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_MODEL_SAMPLER_H_
