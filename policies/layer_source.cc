#include "policies/layer_source.h"

#include "absl/strings/str_cat.h"

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
  at::NoGradGuard no_grad;
  LayerTensors(layers_.at(static_cast<size_t>(layer))).at(index)->copy_(value);
  return absl::OkStatus();
}

std::span<std::byte> ResidentLayerSource::WritableHome(int64_t layer, size_t index) {
  return WritableCpuBytes(*LayerTensors(layers_.at(static_cast<size_t>(layer))).at(index));
}

absl::StatusOr<LlamaLayerWeights> StreamedLayerSource::Acquire(int64_t layer) {
  auto tensors = streamer_->Acquire(layer);
  if (!tensors.ok()) return tensors.status();
  LlamaLayerWeights w;
  auto slots = LayerTensors(w);
  if (tensors->size() != slots.size()) {
    return absl::InternalError(absl::StrCat("streamed layer ", layer, " has ", tensors->size(), " tensors, expected ",
                                            slots.size()));
  }
  for (size_t i = 0; i < slots.size(); ++i) *slots[i] = std::move((*tensors)[i]);
  return w;
}

absl::Status AddLayersToStreamer(std::vector<LlamaLayerWeights> layers, offload::LayerStreamer* streamer) {
  for (auto& layer : layers) {
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (auto& [name, tensor] : layer.Named()) named.emplace_back(name, *tensor);
    auto index = streamer->AddLayer(named);
    if (!index.ok()) return index.status();
    layer = LlamaLayerWeights();  // drop the device copies now, layer by layer
  }
  return absl::OkStatus();
}

}  // namespace strata::policies
