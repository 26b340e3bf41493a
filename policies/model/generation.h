// Autoregressive generation from a LlamaModel: greedy or sampled
// (temperature, top-k, top-p), batched over prompts of different lengths
// with left padding, with or without the KV cache, reproducible for a seed.
// A row that ends (EOS) leaves the batch and its KV cache rows at once, so
// the steps after it cost only the rows still decoding.
#ifndef STRATA_POLICIES_MODEL_GENERATION_H_
#define STRATA_POLICIES_MODEL_GENERATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/config/sampling.h"
#include "policies/model/llama.h"

namespace strata::policies {

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

}  // namespace strata::policies

#endif  // STRATA_POLICIES_MODEL_GENERATION_H_
