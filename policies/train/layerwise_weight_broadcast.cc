// ZeRO-1: each owner broadcasts its tensors' new weights, one flat
// buffer per layer and dtype, and the other ranks write them back.
#include "policies/train/layerwise_trainer_impl.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "policies/dist/flat_bucket.h"

namespace strata::policies {

absl::Status LayerwiseTrainerImpl::BroadcastUpdatedWeights(
    const std::function<at::Tensor(const ParamState&)>& updated) {
  // Each owner sends its new weights in the model's dtype, which is all any
  // rank's model keeps (bf16 weights cross as 2 bytes a parameter, not the
  // 4 of the fp32 masters), as one flat buffer per layer (or the resident
  // tensors): one collective where there was one per tensor. The owner
  // rounds its masters as it rounded its own copy (to nearest even), so the
  // replicas stay identical. The others receive into a buffer borrowed for
  // that layer and write the weights back.
  ProcessGroup& gang = *options_.data_parallel;
  for (int owner = 0; owner < gang.world_size(); ++owner) {
    for (size_t begin = 0; begin < params_.size();) {
      size_t end = begin;
      while (end < params_.size() && params_[end].layer == params_[begin].layer) ++end;
      // One dtype per model in practice; a flat buffer holds one.
      std::map<at::ScalarType, std::vector<const ParamState*>> owned;
      for (size_t i = begin; i < end; ++i) {
        if (params_[i].owner == owner) owned[params_[i].dtype].push_back(&params_[i]);
      }
      for (const auto& [dtype, part] : owned) STRATA_RETURN_IF_ERROR(BroadcastPart(part, dtype, owner, updated));
      begin = end;
    }
  }
  return absl::OkStatus();
}

absl::Status LayerwiseTrainerImpl::BroadcastPart(const std::vector<const ParamState*>& part, at::ScalarType dtype,
                                                 int owner,
                                                 const std::function<at::Tensor(const ParamState&)>& updated) {
  int64_t numel = 0;
  for (const ParamState* p : part) numel += p->numel;
  auto buffer = arena_->Allocate(static_cast<size_t>(numel) * c10::elementSize(dtype));
  if (!buffer.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("weight broadcast of ", part.front()->name, " and its layer: ", buffer.status().message()));
  }
  const at::Tensor flat = at::from_blob(buffer->data(), {numel}, at::TensorOptions().dtype(dtype));
  const bool sending = owner == options_.data_parallel->rank();
  if (sending) {
    std::vector<at::Tensor> masters;
    for (const ParamState* p : part) masters.push_back(updated(*p));
    PackFlat(masters, flat);
  }
  // A broadcast copies bytes unchanged, so they cross as bytes: Gloo 1.13
  // takes no bf16 (nor int16).
  std::vector<at::Tensor> wire = {flat.view(at::kByte)};
  STRATA_RETURN_IF_ERROR(options_.data_parallel->Broadcast(wire, owner));
  if (sending) return absl::OkStatus();
  int64_t offset = 0;
  for (const ParamState* p : part) {
    STRATA_RETURN_IF_ERROR(WriteBack(*p, flat.narrow(0, offset, p->numel)));
    offset += p->numel;
  }
  return absl::OkStatus();
}

}  // namespace strata::policies
