// Autoregressive generation from a LlamaModel: greedy or sampled
// (temperature, top-k, top-p), batched over prompts of different lengths
// with left padding, with or without the KV cache, reproducible for a seed.
#ifndef STRATA_POLICIES_MODEL_GENERATION_H_
#define STRATA_POLICIES_MODEL_GENERATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/model/llama.h"

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
  // Seed of the sampling generator; the same seed and inputs give the same tokens.
  uint64_t seed = 0;
  // One seed per prompt, when given: each row then draws from its own
  // generator, so a prompt's continuation does not depend on which other
  // prompts share its batch (a data-parallel rank's shard). `seed` is unused.
  std::vector<uint64_t> row_seeds;

  // INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;
};

struct GenerationOutput {
  // New tokens of each prompt (no padding), ending with EOS when one was produced.
  std::vector<std::vector<int32_t>> tokens;
  // log p(token) under the model's own distribution (temperature 1, no
  // truncation), one per token in `tokens`.
  std::vector<std::vector<float>> logprobs;
};

// Generates continuations of `prompts` (each non-empty). Prompts are left
// padded with `pad_id` (0 if negative) and masked. INVALID_ARGUMENT for empty
// prompts, ids outside the vocabulary, or sequences longer than the model's
// max_position_embeddings.
absl::StatusOr<GenerationOutput> Generate(const LlamaModel& model, const std::vector<std::vector<int32_t>>& prompts,
                                          const SamplingOptions& options, const std::vector<int64_t>& eos_ids,
                                          int64_t pad_id = -1);

// Picks the next token of each row from float32 logits [B, V], all rows from
// one generator, or row b from generators[b]. Exposed for tests.
at::Tensor SampleNextTokens(const at::Tensor& logits, const SamplingOptions& options,
                            std::vector<at::Generator>& generators);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_MODEL_GENERATION_H_
