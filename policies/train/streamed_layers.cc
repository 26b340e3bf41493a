#include "policies/train/streamed_layers.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace strata::policies {

absl::StatusOr<LlamaLayerWeights> StreamedLayerSource::Acquire(int64_t layer) {
  STRATA_ASSIGN_OR_RETURN(auto tensors, streamer_->Acquire(layer));
  // The streamer keeps each layer's tensor names: they say its layout.
  auto w = LlamaLayerWeights::FromNamed(streamer_->tensor_names(layer), std::move(tensors));
  if (!w.ok()) return absl::InternalError(absl::StrCat("streamed layer ", layer, ": ", w.status().message()));
  return w;
}

absl::Status AddLayersToStreamer(std::vector<LlamaLayerWeights> layers, offload::LayerStreamer* streamer) {
  for (auto& layer : layers) {
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (auto& [name, tensor] : layer.Named()) named.emplace_back(name, *tensor);
    STRATA_RETURN_IF_ERROR(streamer->AddLayer(named).status());
    layer = LlamaLayerWeights();  // drop the device copies now, layer by layer
  }
  return absl::OkStatus();
}

}  // namespace strata::policies
