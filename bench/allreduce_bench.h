// `strata bench allreduce`: the data-parallel gradient path on this machine.
// Two ranks (threads) over loopback Gloo:
//   1. bandwidth of strata's path (each decoder layer's gradients one
//      bucket, started asynchronously and awaited together, as the trainer
//      does) against a bare c10d ProcessGroupGloo all-reduce of the same
//      bytes as one tensor (the peer), in the same run;
//   2. a data-parallel training step of the given model shape on each rank
//      (forward, backward with the per-layer sums overlapped, CPU Adam), and
//      the share of it spent blocked waiting for the sums.
#ifndef STRATA_BENCH_ALLREDUCE_BENCH_H_
#define STRATA_BENCH_ALLREDUCE_BENCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata::bench {

struct AllReduceBenchRequest {
  // HF config.json of the model shape (default: the 51M example).
  std::string config = "examples/medium/model.json";
  int ranks = 2;
  // Per rank, for the training step.
  int64_t batch = 4;
  int64_t seq = 40;
  // Timed repetitions (after one warm-up); the best is reported.
  int steps = 3;
  // The model's weights in the training step: "fp32" or "bf16" (what the
  // ZeRO-1 weight broadcast sends).
  std::string dtype = "fp32";
  bool json = false;
};

absl::StatusOr<std::string> RunAllReduceBench(const AllReduceBenchRequest& request);

}  // namespace strata::bench

#endif  // STRATA_BENCH_ALLREDUCE_BENCH_H_
