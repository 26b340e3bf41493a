// `strata bench adam`: our CPU AdamW (offload/adam/cpu_adam.h) against
// torch::optim::AdamW on the same weights and gradients, and against the
// memory-bandwidth floor measured in the same run on the same buffers.
//
// Bytes counted per parameter and step: read weight, grad, exp_avg and
// exp_avg_sq (16 B), write weight, exp_avg, exp_avg_sq (12 B), and, with
// bf16_copy, write the 2-byte bf16 copy (30 B in all). The floor is the rate
// of a trivial kernel with exactly that access pattern (same buffers, same
// threads, same streaming stores for the copy): no AdamW over these buffers
// can move its bytes faster, so floor_fraction = ours / floor is how close we
// come to memory-bound (timing noise can put it a few percent above 1).
#ifndef STRATA_BENCH_ADAM_BENCH_H_
#define STRATA_BENCH_ADAM_BENCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata::bench {

struct AdamBenchRequest {
  int64_t params = 50'000'000;  // fp32 parameters in one tensor (~2.3 GB in all)
  int64_t steps = 10;           // timed steps per side, after one warm-up step; the best counts
  int threads = 0;              // ours, torch and the floor alike; 0 = all cores
  bool bf16_copy = true;        // also write a bf16 copy of the weights each step
  std::string isa = "auto";     // auto, scalar, avx2, avx512
  bool json = false;            // one JSON object instead of a table
};

// Returns the report (JSON or a table). INVALID_ARGUMENT for bad request
// fields, RESOURCE_EXHAUSTED when our buffers cannot be allocated (torch's
// allocations throw instead: size `params` to fit memory, ~45 B each).
// Runs on all the request's threads; sets and restores at::get_num_threads().
absl::StatusOr<std::string> RunAdamBench(const AdamBenchRequest& request);

}  // namespace strata::bench

#endif  // STRATA_BENCH_ADAM_BENCH_H_
