// How the rollout engine schedules a batch of continuations: the KV
// cache's block size and pool, how many sequences decode at once, and
// whether a prompt's continuations share its cached prefix. Free of torch,
// so the job spec names it without compiling ATen.
#ifndef STRATA_POLICIES_CONFIG_ROLLOUT_OPTIONS_H_
#define STRATA_POLICIES_CONFIG_ROLLOUT_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace strata::policies {

struct RolloutEngineOptions {
  // Positions of one sequence per KV block.
  int64_t kv_block_tokens = 16;
  // The block pool's size; 0 sizes it for the worst case of the sequences
  // that may decode at once (max_concurrency of them, or all).
  int64_t kv_pool_mib = 0;
  // Sequences decoded together at most; 0 = no limit but the pool.
  int64_t max_concurrency = 0;
  // A prompt's continuations (its samples and a greedy baseline) share the
  // prompt's KV blocks, so the prompt is prefilled once.
  bool share_prefixes = true;
  // On a CUDA device with resident weights, decode steps run in buckets of
  // fixed shape (policies/rollout/decode_step.h), each captured as a CUDA
  // graph on its second use and replayed after: one launch a step instead
  // of one a kernel. false: every step runs eagerly, in its exact shape.
  bool cuda_graphs = true;
  // Fixed-shape steps without graphs, on any device: what the graphs
  // replay, for tests and benchmarks on the CPU. Not a spec key.
  bool fixed_shape_steps = false;

  // INVALID_ARGUMENT naming "<key_prefix>.<field>".
  absl::Status Validate(const std::string& key_prefix) const;
};

// The fixed shapes decode steps run in where CUDA graphs replay them
// (policies/rollout/decode_step.h), and the planner prices.
// Rows: 1, 2, 4, 8, multiples of 8 up to 64, then of 32 (few graphs, a
// rollout captures each once, and little padding).
int64_t RowBucket(int64_t rows);
// Columns for a step whose longest sequence covers `positions` (cached +
// the new one): a power of two of blocks of `block_tokens`, at most
// `max_columns` (the most a rollout can reach), never fewer than
// `positions`.
int64_t ColumnBucket(int64_t positions, int64_t block_tokens, int64_t max_columns);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_CONFIG_ROLLOUT_OPTIONS_H_
