#include "policies/config/tensor_dealer.h"

#include <algorithm>

namespace strata::policies {

TensorDealer::TensorDealer(int ranks) : dealt_(static_cast<size_t>(std::max(ranks, 1)), 0) {}

int TensorDealer::Deal(int64_t elements) {
  const auto fewest = std::min_element(dealt_.begin(), dealt_.end());
  *fewest += elements;
  return static_cast<int>(fewest - dealt_.begin());
}

int64_t TensorDealer::most() const { return *std::max_element(dealt_.begin(), dealt_.end()); }

int64_t FullestShard(const std::vector<int64_t>& tensors, int ranks) {
  TensorDealer dealer(ranks);
  for (int64_t elements : tensors) dealer.Deal(elements);
  return dealer.most();
}

}  // namespace strata::policies
