// What a rank's passes share with its gang: sums of its figures over the
// gang, and micro-batches that line up with every other rank's.
#ifndef STRATA_SERVICES_RANK_GANG_SUM_H_
#define STRATA_SERVICES_RANK_GANG_SUM_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/dist/process_group.h"

namespace strata::services {

// Row ranges [begin, end) of a pass's micro-batches.
using MicroBatchRanges = std::vector<std::pair<size_t, size_t>>;

// Sums `values` over the gang, in place: one collective, none for a gang of
// one or no values.
absl::Status SumOverGang(policies::ProcessGroup& gang, std::vector<double>& values);

// `rows` rows in micro-batches of at most `micro_batch_size` rows
// (train.micro_batch_size; 0: all at once). No rows still gives one (empty)
// range, so that a rank without rows joins the step.
MicroBatchRanges MicroBatches(size_t rows, int64_t micro_batch_size);

// Each step's micro-batches (of its `rows_per_step` rows), as many on every
// rank: a sharded trainer sums the gradients of every pass, so the ranks
// must make the same passes or their collectives stop lining up. A rank
// with fewer adds empty ranges, which the callers fill with a row whose
// loss weighs nothing. One collective, and none without micro-batches or
// with one rank.
absl::StatusOr<std::vector<MicroBatchRanges>> GangMicroBatches(policies::ProcessGroup& gang,
                                                               const std::vector<size_t>& rows_per_step,
                                                               int64_t micro_batch_size);

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_GANG_SUM_H_
