// `strata bench rollout`: an RL iteration's rollout (prompts of mixed
// lengths, n samples each and a greedy baseline) through the rollout
// engine against the static loop that preceded it (one padded batch of the
// samples, a second of the baselines, each prompt prefilled once per
// continuation), on the same weights in the same run. Random weights end
// no response on their own, so each continuation's length is forced from a
// fixed spread (10% to 100% of the new tokens), identically in both.
#ifndef STRATA_BENCH_ROLLOUT_BENCH_H_
#define STRATA_BENCH_ROLLOUT_BENCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata::bench {

struct RolloutBenchRequest {
  std::string config;  // a HF config.json (random weights), or
  std::string model;   // a model directory (its weights)
  int64_t prompts = 64;
  int64_t samples = 4;
  bool greedy_baseline = true;
  int64_t min_prompt_tokens = 16;
  int64_t max_prompt_tokens = 64;
  int64_t new_tokens = 128;
  int64_t kv_block_tokens = 16;
  int64_t max_concurrency = 0;
  std::string dtype = "fp32";
  std::string device = "cpu";
  // The engine's decode steps: "auto" (generation.cuda_graphs' default),
  // "exact" (no graphs, exact shapes) or "fixed" (the graphs' shapes, eager).
  std::string steps = "auto";
  bool check_greedy = true;  // also decode the workload greedily by both and compare
  bool json = false;
};

absl::StatusOr<std::string> RunRolloutBench(const RolloutBenchRequest& request);

}  // namespace strata::bench

#endif  // STRATA_BENCH_ROLLOUT_BENCH_H_
