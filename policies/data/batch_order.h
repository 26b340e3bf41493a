// Which examples each iteration trains on, and which of them each rank of a
// gang holds: pure functions of the job seed, the iteration and the gang,
// so a resumed or re-sharded run sees the data an uninterrupted one would.
#ifndef STRATA_POLICIES_DATA_BATCH_ORDER_H_
#define STRATA_POLICIES_DATA_BATCH_ORDER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata::policies {

// The example indices (into `examples` examples) of iteration `iteration`'s
// batch of `batch_size`: the iterations walk through the examples epoch by
// epoch, each epoch in its own order (EpochShuffleSeed of `job_seed`).
// `examples` must be > 0.
std::vector<size_t> BatchIndices(size_t examples, int64_t batch_size, int64_t iteration, uint64_t job_seed);

// The rows of `batch` that rank `rank` of `world` holds: row i goes to rank
// i mod world. Their indices in the batch go to `batch_index` when given.
std::vector<size_t> ShardOfBatch(const std::vector<size_t>& batch, int rank, int world,
                                 std::vector<int64_t>* batch_index);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_DATA_BATCH_ORDER_H_
