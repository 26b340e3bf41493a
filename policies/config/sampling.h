// How generation picks tokens. Kept apart from generation.h and free of
// torch, so the wire format and the RL interfaces can name it without
// compiling ATen.
#ifndef STRATA_POLICIES_CONFIG_SAMPLING_H_
#define STRATA_POLICIES_CONFIG_SAMPLING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace strata::policies {

struct SamplingOptions {
  // Argmax at every step; temperature, top_k and top_p are ignored.
  bool greedy = false;
  // Logits are divided by this before sampling; must be > 0.
  double temperature = 1.0;
  // Keep only the k most likely tokens; 0 keeps all.
  int64_t top_k = 0;
  // Keep the smallest set of tokens whose probability reaches top_p; in (0, 1].
  double top_p = 1.0;
  // Upper bound on new tokens per prompt; >= 0.
  int64_t max_new_tokens = 64;
  // Stop a prompt's continuation after it produces an EOS id (kept in the output).
  bool stop_at_eos = true;
  // Decode incrementally with a KV cache; false recomputes the whole
  // sequence every step (slow, for checks and benchmarks).
  bool use_kv_cache = true;
  // Seed of the sampled draws (each row draws from its own stream of it);
  // the same seed and inputs give the same tokens.
  uint64_t seed = 0;
  // One seed per prompt, when given: row i draws with row_seeds[i] (the
  // job's seeds, so a prompt's continuation does not depend on which other
  // prompts share its batch or rank). `seed` is unused.
  std::vector<uint64_t> row_seeds;
  // One cap per prompt, when given: row i ends after min(max_new_tokens,
  // row_max_new_tokens[i]) tokens (a request's own limit; benchmarks force
  // a spread of response lengths on random weights with it).
  std::vector<int64_t> row_max_new_tokens;

  // INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;
};

// Off the CPU the sampler's exponential race computes its Philox words as
// int64 tensors of about 76 bytes an entry of the logits; it draws a chunk
// of the vocabulary at a time, so the words take at most this much.
inline constexpr int64_t kRaceChunkBytes = int64_t{256} << 20;
inline constexpr int64_t kRaceBytesPerEntry = 80;  // 76 measured, and a margin

}  // namespace strata::policies

#endif  // STRATA_POLICIES_CONFIG_SAMPLING_H_
