// The rollout engine: every continuation an iteration asks for, decoded
// with continuous batching over a paged KV cache.
//
// The schedule. Sequences wait in the prompts' order. A prompt is admitted
// when its worst case fits: its prompt blocks, then for each continuation
// the blocks it could still take up to max_new_tokens (reserved at
// admission, so a sequence never runs short mid-decode and nothing is
// preempted). An admitted prompt is prefilled once; its continuations
// (samples, then the greedy baseline) fork from it, sharing its full
// blocks and each copying the partly filled last one. Each step decodes
// one token of every running sequence; a sequence that ends leaves the
// batch that step and frees its blocks, and waiting prompts join as the
// pool and the concurrency limit allow. A prompt whose continuations
// exceed the concurrency limit is admitted when it is first in line and
// forks them as room frees up.
//
// Why the schedule cannot change a draw: a sampled continuation draws its
// t-th token with Philox keyed by its own seed and t (sampler.h), whatever
// batch it is in. Only the logits' last bits depend on the batch's shape
// (BLAS paths, attention's summation order).
#ifndef STRATA_POLICIES_ROLLOUT_ROLLOUT_ENGINE_H_
#define STRATA_POLICIES_ROLLOUT_ROLLOUT_ENGINE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/config/rollout_options.h"
#include "policies/config/sampling.h"
#include "policies/model/llama.h"

namespace strata::policies {

// One prompt and the continuations to decode from it.
struct RolloutPrompt {
  std::vector<int32_t> ids;
  // One sampled continuation per seed (greedy too when the sampling options
  // say greedy).
  std::vector<uint64_t> sample_seeds;
  // Also the greedy continuation, after the sampled ones.
  bool greedy = false;
  // Each continuation's own cap on new tokens (sampled ones in order, then
  // the greedy one), at most the sampling options'; empty: theirs for all.
  std::vector<int64_t> max_new_tokens;

  int64_t continuations() const { return static_cast<int64_t>(sample_seeds.size()) + (greedy ? 1 : 0); }
  // Continuation c's cap under the sampling options' `max_new`.
  int64_t Cap(int64_t c, int64_t max_new) const {
    return max_new_tokens.empty() ? max_new : std::min(max_new, max_new_tokens[static_cast<size_t>(c)]);
  }
};

struct Continuation {
  std::vector<int32_t> tokens;  // ending with the stop id when one ended it
  // log p(token) under the model's own distribution (temperature 1, no
  // truncation), one per token.
  std::vector<float> logprobs;
  bool stopped = false;  // ended by a stop id, not by max_new_tokens
};

struct RolloutStats {
  int64_t block_bytes = 0;       // one KV block, every layer
  int64_t pool_blocks = 0;       // the pool's size
  int64_t peak_used_blocks = 0;  // at most this many held at once
  int64_t prefill_tokens = 0;    // prompt tokens run through the model
  int64_t decode_steps = 0;      // forward passes of one token per sequence
  int64_t decoded_tokens = 0;    // sequence-steps in them
  int64_t peak_concurrency = 0;  // sequences decoding together at most
  // Fixed-shape steps (RolloutEngineOptions::cuda_graphs): pad rows decoded
  // beside the sequences, graphs captured, and steps that replayed one.
  int64_t padded_rows = 0;
  int64_t captured_graphs = 0;
  int64_t replayed_steps = 0;

  int64_t peak_kv_bytes() const { return peak_used_blocks * block_bytes; }
};

class RolloutEngine {
 public:
  // `model` outlives the engine. A continuation ends after producing one of
  // `stop_ids` (kept in its tokens) unless the sampling options say not to.
  RolloutEngine(const LlamaModel& model, RolloutEngineOptions options, std::vector<int64_t> stop_ids);

  // Continuations of every prompt, in order: prompt p's sampled ones in
  // seed order, then its greedy one. INVALID_ARGUMENT for an empty prompt,
  // an id outside the vocabulary, a prompt + max_new_tokens beyond the
  // context, or a pool (kv_pool_mib) too small for one continuation.
  absl::StatusOr<std::vector<std::vector<Continuation>>> Run(const std::vector<RolloutPrompt>& prompts,
                                                             const SamplingOptions& sampling);

  // Figures of the last Run.
  const RolloutStats& stats() const { return stats_; }

  // The pool Run would make for `prompts` when kv_pool_mib is 0: the worst
  // case of the sequences that may decode at once.
  static int64_t WorstCaseBlocks(const std::vector<RolloutPrompt>& prompts, int64_t max_new_tokens,
                                 const RolloutEngineOptions& options);

 private:
  const LlamaModel& model_;
  const RolloutEngineOptions options_;
  const std::vector<int64_t> stop_ids_;
  RolloutStats stats_;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_ROLLOUT_ROLLOUT_ENGINE_H_
