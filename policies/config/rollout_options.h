// How the rollout engine schedules a batch of continuations: the KV
// cache's block size and pool, how many sequences decode at once, and
// whether a prompt's continuations share its cached prefix. Free of torch,
// so the job spec names it without compiling ATen.
#ifndef STRATA_POLICIES_CONFIG_ROLLOUT_OPTIONS_H_
#define STRATA_POLICIES_CONFIG_ROLLOUT_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

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

// Blocks of `block_tokens` a continuation of a prompt of `length` tokens
// may hold beside the prompt's full blocks, decoding up to `max_new`
// tokens: positions up to length + max_new - 1 are cached (the last token
// is produced, never fed back), the partly filled last prompt block
// included.
int64_t OwnKvBlocks(int64_t length, int64_t max_new, int64_t block_tokens);

// The default pool (kv_pool_mib 0): the blocks of the worst case of the
// sequences that may decode at once under `options`. Prompt p has
// `lengths[p]` tokens and one continuation per entry of `caps[p]`, its cap
// on new tokens. The rollout engine sizes its pool with it and the planner
// prices it, so both count the same blocks.
int64_t WorstCasePoolBlocks(const std::vector<int64_t>& lengths, const std::vector<std::vector<int64_t>>& caps,
                            const RolloutEngineOptions& options);

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
