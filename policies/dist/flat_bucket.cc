#include "policies/dist/flat_bucket.h"

#include <algorithm>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::policies {

int64_t TotalElements(const std::vector<at::Tensor>& tensors) {
  int64_t total = 0;
  for (const at::Tensor& t : tensors) total += t.numel();
  return total;
}

void PackFlat(const std::vector<at::Tensor>& tensors, const at::Tensor& flat) {
  int64_t offset = 0;
  for (const at::Tensor& t : tensors) {
    flat.narrow(0, offset, t.numel()).copy_(t.reshape({-1}));
    offset += t.numel();
  }
}

void UnpackFlat(const at::Tensor& flat, std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (at::Tensor& t : tensors) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

bool ReduceScatterMovesLess(const std::vector<std::vector<at::Tensor>>& owned) {
  int64_t total = 0, longest = 0;
  for (const auto& tensors : owned) {
    const int64_t part = TotalElements(tensors);
    total += part;
    longest = std::max(longest, part);
  }
  return static_cast<int64_t>(owned.size()) * longest < 2 * total;
}

absl::StatusOr<OwnerPartitionedBucket> PackByOwner(const std::vector<std::vector<at::Tensor>>& owned,
                                                   const at::Device& device) {
  OwnerPartitionedBucket bucket;
  std::optional<at::ScalarType> dtype;
  std::vector<int64_t> lengths;  // each rank's elements
  for (size_t r = 0; r < owned.size(); ++r) {
    for (const at::Tensor& t : owned[r]) {
      if (dtype.has_value() && t.scalar_type() != *dtype) {
        return absl::InvalidArgumentError(absl::StrCat("reduce-scatter: a bucket's tensors must share a dtype; rank ",
                                                       r, " has ", c10::toString(t.scalar_type()), " beside ",
                                                       c10::toString(*dtype)));
      }
      dtype = t.scalar_type();
    }
    lengths.push_back(TotalElements(owned[r]));
    bucket.part_length = std::max(bucket.part_length, lengths.back());
  }
  if (bucket.part_length == 0) return bucket;
  const auto options = at::TensorOptions().dtype(*dtype).device(device);
  bucket.flat = at::empty({static_cast<int64_t>(owned.size()) * bucket.part_length}, options);
  for (size_t r = 0; r < owned.size(); ++r) {
    const at::Tensor part = bucket.flat.narrow(0, static_cast<int64_t>(r) * bucket.part_length, bucket.part_length);
    PackFlat(owned[r], part);
    // Only the padding is zeroed: the rest is written once, by the packing.
    part.narrow(0, lengths[r], bucket.part_length - lengths[r]).zero_();
  }
  return bucket;
}

}  // namespace strata::policies
