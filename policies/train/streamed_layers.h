// Decoder layers streamed by the offload engine's LayerStreamer, seen
// through the model's LayerSource interface.
#ifndef STRATA_POLICIES_TRAIN_STREAMED_LAYERS_H_
#define STRATA_POLICIES_TRAIN_STREAMED_LAYERS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "offload/stream/layer_streamer.h"
#include "policies/model/layer_source.h"
#include "policies/model/llama.h"

namespace strata::policies {

// Layers streamed by the offload engine. The streamer must hold the layers
// in LlamaLayerWeights::Named() order (see AddLayersToStreamer).
class StreamedLayerSource final : public LayerSource {
 public:
  explicit StreamedLayerSource(offload::LayerStreamer* streamer) : streamer_(streamer) {}
  int64_t num_layers() const override { return streamer_->num_layers(); }
  absl::Status BeginPass(std::vector<int64_t> order) override { return streamer_->BeginPass(std::move(order)); }
  absl::StatusOr<LlamaLayerWeights> Acquire(int64_t layer) override;
  void Release(int64_t layer) override { streamer_->Release(layer); }
  void EndPass() override { streamer_->EndPass(); }
  absl::StatusOr<at::Tensor> Load(int64_t layer, size_t index) override { return streamer_->LoadTensor(layer, index); }
  absl::Status Store(int64_t layer, size_t index, const at::Tensor& value) override {
    return streamer_->StoreTensor(layer, index, value);
  }
  std::span<std::byte> WritableHome(int64_t layer, size_t index) override { return streamer_->HostHome(layer, index); }

 private:
  offload::LayerStreamer* streamer_;
};

// Moves `layers` into `streamer` (their device copies are dropped).
absl::Status AddLayersToStreamer(std::vector<LlamaLayerWeights> layers, offload::LayerStreamer* streamer);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_TRAIN_STREAMED_LAYERS_H_
