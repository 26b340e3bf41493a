// How ZeRO shares a model's tensors out among the ranks: whole tensors,
// each, in the order the trainer meets them, to the rank holding the
// fewest elements so far (the lowest rank on a tie). The trainer deals
// with it, and the memory planner deals the same tensors with it to know
// what the fullest rank holds, so that the two cannot drift apart. Plain
// arithmetic, no c10d.
#ifndef STRATA_POLICIES_CONFIG_TENSOR_DEALER_H_
#define STRATA_POLICIES_CONFIG_TENSOR_DEALER_H_

#include <cstdint>
#include <vector>

namespace strata::policies {

class TensorDealer {
 public:
  explicit TensorDealer(int ranks);  // at least 1

  // The rank that holds the next tensor, of `elements` elements.
  int Deal(int64_t elements);

  // Elements dealt to each rank so far, and to the fullest.
  const std::vector<int64_t>& dealt() const { return dealt_; }
  int64_t most() const;

 private:
  std::vector<int64_t> dealt_;
};

// The elements the fullest of `ranks` ranks holds once `tensors` (in the
// trainer's order) are dealt.
int64_t FullestShard(const std::vector<int64_t>& tensors, int ranks);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_CONFIG_TENSOR_DEALER_H_
