// `strata bench stream`: one training step (forward, backward with per-layer
// recomputation, CPU AdamW) of a Llama-shaped model whose decoder weights do
// not fit the device budget, with the layers streamed from the host arena
// and from NVMe, against the same step with every layer resident on the
// device (the peer), in the same run.
#ifndef STRATA_BENCH_STREAM_BENCH_H_
#define STRATA_BENCH_STREAM_BENCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata::bench {

struct StreamBenchRequest {
  int64_t layers = 16;
  int64_t hidden = 512;
  int64_t vocab = 4096;
  int64_t batch = 2;
  int64_t seq = 128;
  // Device-tier budget for the streamed runs; 0 picks what the streamed step
  // needs by the engine's estimate (+10%).
  int64_t device_budget_mib = 0;
  int prefetch_depth = 1;
  // Directory for the NVMe tier; created if missing, emptied afterwards.
  std::string nvme_dir = "strata-bench-nvme";
  // Timed steps per mode (after one untimed warm-up step); best is reported.
  int steps = 2;
  // Compute device: "cpu" (the device tier is the CPU, budget enforced by the
  // counting allocator) or "cuda[:N]" in a CUDA build (pinned arena, copy
  // streams, caching-allocator figures).
  std::string device = "cpu";
  bool json = false;
};

absl::StatusOr<std::string> RunStreamBench(const StreamBenchRequest& request);

}  // namespace strata::bench

#endif  // STRATA_BENCH_STREAM_BENCH_H_
