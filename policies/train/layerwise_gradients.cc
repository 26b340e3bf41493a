// Gradients from the backward pass to the host buffers (staged downloads
// overlapping the next layer's backward) and summed over the gang as each
// layer's become final; the buffers' allocation and their byte counters.
#include "policies/train/layerwise_trainer_impl.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace strata::policies {

using internal::HostView;

absl::Status LayerwiseTrainerImpl::AccumulateGrad(ParamState& state, const at::Tensor& grad) {
  if (!grad.defined()) return absl::OkStatus();
  if (state.device_grad.defined()) {
    state.device_grad.add_(grad.reshape({-1}).to(at::kFloat));
    final_grads_.push_back(&state);
    return absl::OkStatus();
  }
  if (state.grad.data() == nullptr) STRATA_RETURN_IF_ERROR(AllocateGrad(state));
  if (grad_transfer_ == nullptr) {
    HostView(state.grad, state.numel).add_(grad.reshape({-1}).to(at::kCPU, at::kFloat));
    final_grads_.push_back(&state);
    return absl::OkStatus();
  }
  auto staging = arena_->Allocate(static_cast<size_t>(state.numel) * sizeof(float));
  if (!staging.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("gradient staging for ", state.name, ": ", staging.status().message()));
  }
  const at::Tensor fp32 = grad.reshape({-1}).to(at::kFloat).contiguous();
  STRATA_RETURN_IF_ERROR(grad_transfer_->Download(fp32, staging->bytes()));
  current_grads_.grads.push_back({&state, *std::move(staging)});
  return absl::OkStatus();
}

absl::Status LayerwiseTrainerImpl::FlushGrads(size_t keep_in_flight) {
  if (grad_transfer_ == nullptr) return absl::OkStatus();
  if (!current_grads_.grads.empty()) {
    auto fence = grad_transfer_->Fence();
    if (!fence.ok()) return fence.status();
    current_grads_.fence = *std::move(fence);
    pending_grads_.push_back(std::move(current_grads_));
    current_grads_ = PendingBatch();
  }
  while (pending_grads_.size() > keep_in_flight) {
    PendingBatch& batch = pending_grads_.front();
    STRATA_RETURN_IF_ERROR(grad_transfer_->WaitHost(*batch.fence));
    for (PendingGrad& g : batch.grads) {
      HostView(g.state->grad, g.state->numel).add_(HostView(g.staging, g.state->numel));
      final_grads_.push_back(g.state);
    }
    pending_grads_.pop_front();  // staging buffers go back to the arena's pools
  }
  return absl::OkStatus();
}

absl::Status LayerwiseTrainerImpl::StartGradientSums() {
  // ZeRO-2 sums every pass: a rank keeps no gradient of a tensor it does
  // not hold from one micro-batch to the next. Gloo has no reduce-scatter,
  // so each rank all-reduces and keeps what it holds.
  if (!data_parallel() || !(sum_this_pass_ || sharded_)) {
    final_grads_.clear();
    return absl::OkStatus();
  }
  if (final_grads_.empty()) return absl::OkStatus();
  ProcessGroup& gang = *options_.data_parallel;
  // Sharded, the bucket by owner: each rank needs only its own tensors'
  // sums (reduce-scatter where the backend has it). Otherwise one list.
  std::vector<std::vector<at::Tensor>> owned(sharded_ ? static_cast<size_t>(gang.world_size()) : 1);
  std::vector<ParamState*> borrowed;
  for (ParamState* p : final_grads_) {
    owned[sharded_ ? static_cast<size_t>(p->owner) : 0].push_back(
        p->device_grad.defined() ? p->device_grad : HostView(p->grad, p->numel));
    if (sharded_ && !p->held) borrowed.push_back(p);
  }
  final_grads_.clear();
  STRATA_RETURN_IF_ERROR(sharded_ ? gang.StartReduceScatterSum(std::move(owned))
                                  : gang.StartAllReduceSum(std::move(owned[0])));
  summing_.push_back(std::move(borrowed));
  // One layer's sum overlaps the next layer's backward; older ones end here
  // so that their borrowed gradients go back to the arena.
  return ReleaseSummed(/*keep_in_flight=*/1);
}

absl::Status LayerwiseTrainerImpl::FinishGradientSums() {
  if (!data_parallel()) return absl::OkStatus();
  return ReleaseSummed(0);
}

absl::Status LayerwiseTrainerImpl::ReleaseSummed(size_t keep_in_flight) {
  const absl::Status status = options_.data_parallel->WaitPending(keep_in_flight);
  while (summing_.size() > keep_in_flight) {
    for (ParamState* p : summing_.front()) ReleaseGrad(*p);
    summing_.pop_front();
  }
  return status;
}

absl::Status LayerwiseTrainerImpl::AllocateGrad(ParamState& p) {
  const size_t bytes = static_cast<size_t>(p.numel) * sizeof(float);
  auto buffer = arena_->Allocate(bytes);
  if (!buffer.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("gradient of ", p.name, ": ", buffer.status().message()));
  }
  p.grad = *std::move(buffer);
  std::memset(p.grad.data(), 0, bytes);
  grad_bytes_ += static_cast<int64_t>(bytes);
  grad_bytes_peak_ = std::max(grad_bytes_peak_, grad_bytes_);
  return absl::OkStatus();
}

void LayerwiseTrainerImpl::ReleaseGrad(ParamState& p) {
  if (p.grad.data() == nullptr) return;
  grad_bytes_ -= p.numel * static_cast<int64_t>(sizeof(float));
  p.grad = offload::HostBuffer();  // back to the arena's pools
}

void LayerwiseTrainerImpl::AbandonGrads() {
  // Sums still writing into the gradient buffers end first.
  (void)FinishGradientSums();
  final_grads_.clear();
  if (sharded_) {
    for (ParamState& p : params_) {
      if (!p.held) ReleaseGrad(p);
    }
  }
  if (grad_transfer_ == nullptr) return;
  // One wait covers every download queued, whichever batch it belongs to.
  if (!grad_transfer_->WaitAll().ok()) (void)offload::SynchronizeDevice(grad_transfer_->device());
  current_grads_ = PendingBatch();
  pending_grads_.clear();
}

absl::StatusOr<at::Tensor> LayerwiseTrainerImpl::Gradient(const std::string& name) const {
  for (const ParamState& p : params_) {
    if (p.name != name) continue;
    if (!p.device_grad.defined() && p.grad.data() == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          name, ": no gradient kept for it (step_in_backward keeps none for layers; ZeRO-2 keeps only the held ones)"));
    }
    const at::Tensor grad = p.device_grad.defined() ? p.device_grad : HostView(p.grad, p.numel);
    return grad.to(at::kCPU).clone().view(p.shape);
  }
  return absl::NotFoundError(absl::StrCat("no parameter named ", name));
}

}  // namespace strata::policies
