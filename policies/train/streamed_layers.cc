#include "policies/train/streamed_layers.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace strata::policies {

absl::StatusOr<LlamaLayerWeights> StreamedLayerSource::Acquire(int64_t layer) {
  STRATA_ASSIGN_OR_RETURN(auto tensors, streamer_->Acquire(layer));
  LlamaLayerWeights w;
  auto slots = LayerTensors(w);
  if (tensors.size() != slots.size()) {
    return absl::InternalError(absl::StrCat("streamed layer ", layer, " has ", tensors.size(), " tensors, expected ",
                                            slots.size()));
  }
  for (size_t i = 0; i < slots.size(); ++i) *slots[i] = std::move(tensors[i]);
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
