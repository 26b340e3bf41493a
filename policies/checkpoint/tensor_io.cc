#include "policies/checkpoint/tensor_io.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace strata::policies {

absl::StatusOr<at::ScalarType> ToScalarType(DType dtype) {
  switch (dtype) {
    case DType::kF64:
      return at::kDouble;
    case DType::kF32:
      return at::kFloat;
    case DType::kF16:
      return at::kHalf;
    case DType::kBF16:
      return at::kBFloat16;
    case DType::kI64:
      return at::kLong;
    case DType::kI32:
      return at::kInt;
    case DType::kI16:
      return at::kShort;
    case DType::kI8:
      return at::kChar;
    case DType::kU8:
      return at::kByte;
    case DType::kBool:
      return at::kBool;
  }
  return absl::InvalidArgumentError("unknown dtype");
}

absl::StatusOr<DType> ToDType(at::ScalarType type) {
  switch (type) {
    case at::kDouble:
      return DType::kF64;
    case at::kFloat:
      return DType::kF32;
    case at::kHalf:
      return DType::kF16;
    case at::kBFloat16:
      return DType::kBF16;
    case at::kLong:
      return DType::kI64;
    case at::kInt:
      return DType::kI32;
    case at::kShort:
      return DType::kI16;
    case at::kChar:
      return DType::kI8;
    case at::kByte:
      return DType::kU8;
    case at::kBool:
      return DType::kBool;
    default:
      return absl::InvalidArgumentError(absl::StrCat("dtype ", c10::toString(type), " cannot be saved"));
  }
}

absl::StatusOr<at::Tensor> ToTensor(const TensorView& view, at::ScalarType type) {
  STRATA_ASSIGN_OR_RETURN(auto source_type, ToScalarType(view.dtype));
  const bool floating = at::isFloatingType(source_type);
  if (floating != at::isFloatingType(type)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", view.name, "' has dtype ",
                                                   std::string(DTypeName(view.dtype)), ", cannot load as ",
                                                   c10::toString(type)));
  }
  const auto options = at::TensorOptions().dtype(source_type);
  const size_t element = DTypeSize(view.dtype);
  if (reinterpret_cast<uintptr_t>(view.data.data()) % element != 0) {
    // safetensors packs tensors back to back, so a tensor may start off its
    // element alignment; copy the bytes out first, then convert.
    at::Tensor aligned = at::empty(view.shape, options);
    std::memcpy(aligned.data_ptr(), view.data.data(), view.data.size());
    return aligned.to(type);
  }
  // from_blob does not copy; the .to(..., copy=true) below is the one copy
  // out of the mapping and converts the dtype in the same pass.
  const at::Tensor mapped = at::from_blob(const_cast<std::byte*>(view.data.data()), view.shape, options);
  return mapped.to(type, /*non_blocking=*/false, /*copy=*/true);
}

absl::StatusOr<at::Tensor> ToTensorWithShape(const TensorView& view, at::IntArrayRef shape, at::ScalarType type) {
  if (at::IntArrayRef(view.shape) != shape) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", view.name, "' has shape [",
                                                   absl::StrJoin(view.shape, ", "), "], expected [",
                                                   absl::StrJoin(shape, ", "), "]"));
  }
  return ToTensor(view, type);
}

absl::Status TensorWriteBatch::Add(const std::string& name, const at::Tensor& tensor) {
  auto dtype = ToDType(tensor.scalar_type());
  if (!dtype.ok()) return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", dtype.status().message()));
  at::Tensor host = tensor.detach().to(at::kCPU).contiguous();
  TensorToWrite entry;
  entry.name = name;
  entry.dtype = *dtype;
  entry.shape.assign(host.sizes().begin(), host.sizes().end());
  entry.data = std::span<const std::byte>(static_cast<const std::byte*>(host.data_ptr()), host.nbytes());
  keep_alive_.push_back(std::move(host));
  entries_.push_back(std::move(entry));
  return absl::OkStatus();
}

}  // namespace strata::policies
