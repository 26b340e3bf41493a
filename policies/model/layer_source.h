// Where a Llama model's decoder layer weights come from during a pass over
// the layers: resident on the device (here), or streamed from host / NVMe by
// the offload engine (policies/train/streamed_layers.h). The model's forward
// (generation, scoring) and the layer-wise trainer both draw layers through
// this interface.
#ifndef STRATA_POLICIES_MODEL_LAYER_SOURCE_H_
#define STRATA_POLICIES_MODEL_LAYER_SOURCE_H_

#include <ATen/ATen.h>

#include <cstddef>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/model/llama.h"

namespace strata::policies {

// A layer's tensors in LlamaLayerWeights::Named() order.
std::vector<at::Tensor*> LayerTensors(LlamaLayerWeights& w);

// The bytes of a contiguous CPU tensor, for writers that fill it in place;
// empty for any other tensor.
std::span<std::byte> WritableCpuBytes(const at::Tensor& t);

// Decoder layer weights for one pass over the layers.
class LayerSource {
 public:
  virtual ~LayerSource() = default;
  virtual int64_t num_layers() const = 0;
  virtual absl::Status BeginPass(std::vector<int64_t> order) = 0;
  // The next layer of the pass; valid until Release.
  virtual absl::StatusOr<LlamaLayerWeights> Acquire(int64_t layer) = 0;
  virtual void Release(int64_t layer) = 0;
  virtual void EndPass() = 0;
  // Home copy of one tensor (LlamaLayerWeights::Named() order), for the
  // optimizer's master weights, and its write-back.
  virtual absl::StatusOr<at::Tensor> Load(int64_t layer, size_t index) = 0;
  virtual absl::Status Store(int64_t layer, size_t index, const at::Tensor& value) = 0;
  // Host memory holding the tensor's home copy that the optimizer may
  // overwrite in place (fusing the write-back into its pass); empty when
  // there is none (NVMe home, a GPU device).
  virtual std::span<std::byte> WritableHome(int64_t layer, size_t index) = 0;
};

// Layers kept on the device for the whole run (the baseline).
class ResidentLayerSource final : public LayerSource {
 public:
  explicit ResidentLayerSource(std::vector<LlamaLayerWeights> layers) : layers_(std::move(layers)) {}
  int64_t num_layers() const override { return static_cast<int64_t>(layers_.size()); }
  absl::Status BeginPass(std::vector<int64_t>) override { return absl::OkStatus(); }
  absl::StatusOr<LlamaLayerWeights> Acquire(int64_t layer) override { return layers_.at(static_cast<size_t>(layer)); }
  void Release(int64_t) override {}
  void EndPass() override {}
  absl::StatusOr<at::Tensor> Load(int64_t layer, size_t index) override;
  absl::Status Store(int64_t layer, size_t index, const at::Tensor& value) override;
  std::span<std::byte> WritableHome(int64_t layer, size_t index) override;

 private:
  std::vector<LlamaLayerWeights> layers_;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_MODEL_LAYER_SOURCE_H_
