// `strata bench transfer`: host <-> device copy bandwidth from the pinned
// host arena through DeviceTransfer (our path: copy streams, events) against
// libtorch's own path for the same bytes: a pinned tensor (at::empty with
// pinned_memory) copied with Tensor::copy_(non_blocking) and a device
// synchronize, in the same run. On a GPU this is the H2D/D2H figure of the
// offload engine; with --device cpu both sides are memcpy-bound and the run
// checks the plumbing.
#ifndef STRATA_BENCH_TRANSFER_BENCH_H_
#define STRATA_BENCH_TRANSFER_BENCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata::bench {

struct TransferBenchRequest {
  std::string device = "cuda";
  int64_t size_mib = 1024;  // bytes per copy
  int repeats = 10;         // timed copies per side and direction, after one warm-up; the median counts
  bool json = false;
};

// FAILED_PRECONDITION (from DeviceTransfer) for a device this build or
// machine cannot use; INVALID_ARGUMENT for bad fields.
absl::StatusOr<std::string> RunTransferBench(const TransferBenchRequest& request);

}  // namespace strata::bench

#endif  // STRATA_BENCH_TRANSFER_BENCH_H_
