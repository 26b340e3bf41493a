#include "policies/model/layer_source.h"

#include <c10/core/GradMode.h>

namespace strata::policies {

std::vector<at::Tensor*> LayerTensors(LlamaLayerWeights& w) {
  std::vector<at::Tensor*> out;
  for (auto& [name, tensor] : w.Named()) out.push_back(tensor);
  return out;
}

std::span<std::byte> WritableCpuBytes(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous()) return {};
  return {static_cast<std::byte*>(t.data_ptr()), t.nbytes()};
}

absl::StatusOr<at::Tensor> ResidentLayerSource::Load(int64_t layer, size_t index) {
  return LayerTensors(layers_.at(static_cast<size_t>(layer))).at(index)->detach().clone();
}

absl::Status ResidentLayerSource::Store(int64_t layer, size_t index, const at::Tensor& value) {
  c10::NoGradGuard no_grad;
  LayerTensors(layers_.at(static_cast<size_t>(layer))).at(index)->copy_(value);
  return absl::OkStatus();
}

std::span<std::byte> ResidentLayerSource::WritableHome(int64_t layer, size_t index) {
  return WritableCpuBytes(*LayerTensors(layers_.at(static_cast<size_t>(layer))).at(index));
}

}  // namespace strata::policies
