// Torch glue for the safetensors reader/writer: TensorView <-> at::Tensor.
#ifndef STRATA_POLICIES_CHECKPOINT_TENSOR_IO_H_
#define STRATA_POLICIES_CHECKPOINT_TENSOR_IO_H_

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/checkpoint/safetensors.h"

namespace strata::policies {

absl::StatusOr<at::ScalarType> ToScalarType(DType dtype);
absl::StatusOr<DType> ToDType(at::ScalarType type);

// Copies a mapped tensor into an owned tensor of `type` (one copy; a dtype
// change happens in the same pass). INVALID_ARGUMENT naming the tensor when
// its dtype has no torch equivalent or cannot convert to `type`.
absl::StatusOr<at::Tensor> ToTensor(const TensorView& view, at::ScalarType type);

// Like ToTensor, and also checks the shape: INVALID_ARGUMENT naming the
// tensor with the expected and found shapes.
absl::StatusOr<at::Tensor> ToTensorWithShape(const TensorView& view, at::IntArrayRef shape, at::ScalarType type);

// Keeps contiguous CPU copies alive while TensorToWrite spans point into them.
class TensorWriteBatch {
 public:
  // `tensor` may be on any device and non-contiguous.
  absl::Status Add(const std::string& name, const at::Tensor& tensor);
  const std::vector<TensorToWrite>& entries() const { return entries_; }

 private:
  std::vector<at::Tensor> keep_alive_;
  std::vector<TensorToWrite> entries_;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_CHECKPOINT_TENSOR_IO_H_
