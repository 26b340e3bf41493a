#include "policies/data/batch_order.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>

#include "policies/job/seeds.h"

namespace strata::policies {

std::vector<size_t> BatchIndices(size_t examples, int64_t batch_size, int64_t iteration, uint64_t job_seed) {
  std::vector<size_t> out;
  std::vector<size_t> order;
  size_t order_epoch = SIZE_MAX;  // the epoch `order` was shuffled for
  const size_t first = static_cast<size_t>(iteration * batch_size);
  for (size_t k = first; k < first + static_cast<size_t>(batch_size); ++k) {
    const size_t epoch = k / examples;
    if (epoch != order_epoch) {  // a batch spans at most a few epochs
      order.resize(examples);
      std::iota(order.begin(), order.end(), 0);
      std::mt19937_64 rng(EpochShuffleSeed(job_seed, epoch));
      std::shuffle(order.begin(), order.end(), rng);
      order_epoch = epoch;
    }
    out.push_back(order[k % examples]);
  }
  return out;
}

std::vector<size_t> ShardOfBatch(const std::vector<size_t>& batch, int rank, int world,
                                 std::vector<int64_t>* batch_index) {
  std::vector<size_t> mine;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (static_cast<int>(i % static_cast<size_t>(world)) != rank) continue;
    mine.push_back(batch[i]);
    if (batch_index) batch_index->push_back(static_cast<int64_t>(i));
  }
  return mine;
}

}  // namespace strata::policies
