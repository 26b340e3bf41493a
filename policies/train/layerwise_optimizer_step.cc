// OptimizerStep: AdamW on the host, on NVMe or on the device, the
// per-layer step of step_in_backward, and the new weights written back to
// the resident tensors and the layers' home.
#include "policies/train/layerwise_trainer_impl.h"

#include <c10/core/GradMode.h>

#include <cmath>
#include <cstring>
#include <future>
#include <map>
#include <span>
#include <utility>

#include "base/status_macros.h"

namespace strata::policies {

using internal::HostView;
using internal::SquaredNorm;

absl::Status LayerwiseTrainerImpl::OptimizerStep() {
  ++steps_taken_;
  summed_since_step_ = false;
  passes_since_step_ = 0;
  STRATA_RETURN_IF_ERROR(ClipGradients());
  // With step_in_backward the layers stepped already; the rest steps here.
  const std::vector<ParamState*> params = HeldParams(/*layers=*/!options_.step_in_backward);
  absl::Status status;
  switch (options_.optimizer) {
    case offload::Tier::kHost:
      status = HostStep(params);
      break;
    case offload::Tier::kNvme:
      status = NvmeStep(params);
      break;
    case offload::Tier::kDevice:
      status = DeviceStep();
      break;
  }
  if (!status.ok()) return status;
  for (ParamState& p : params_) {
    if (p.device_grad.defined()) {
      p.device_grad.zero_();
    } else if (p.grad.data() != nullptr) {
      std::memset(p.grad.data(), 0, static_cast<size_t>(p.numel) * sizeof(float));
    }
  }
  return absl::OkStatus();
}

std::vector<LayerwiseTrainerImpl::ParamState*> LayerwiseTrainerImpl::HeldParams(bool layers) {
  std::vector<ParamState*> out;
  for (ParamState& p : params_) {
    if (p.held && (layers || p.layer < 0)) out.push_back(&p);
  }
  return out;
}

absl::Status LayerwiseTrainerImpl::StepLayer(int64_t l, const std::vector<at::Tensor*>& slots) {
  c10::NoGradGuard no_grad;
  std::vector<ParamState*> layer;
  absl::Status status;
  for (size_t i = 0; i < slots.size() && status.ok(); ++i) {
    ParamState& p = params_[layer_params_[static_cast<size_t>(l)][i]];
    status = AllocateGrad(p);  // zeroed
    if (!status.ok()) break;
    const at::Tensor grad = slots[i]->grad();
    if (grad.defined()) HostView(p.grad, p.numel).copy_(grad.reshape({-1}).to(at::kCPU, at::kFloat));
    layer_squares_ += SquaredNorm(p.grad.floats().data(), p.numel);
    layer.push_back(&p);
  }
  if (status.ok()) status = options_.optimizer == offload::Tier::kHost ? HostStep(layer) : NvmeStep(layer);
  for (ParamState* p : layer) ReleaseGrad(*p);
  return status;
}

at::Tensor LayerwiseTrainerImpl::GaloreDirection(ParamState& p, const at::Tensor& grad, at::Tensor out) {
  const int64_t step = ++p.step;
  return p.galore->Direction(grad, step, adam_->options(), GaloreProjectionKey(options_.galore_seed, p.name, step),
                             std::move(out));
}

absl::StatusOr<offload::HostBuffer> LayerwiseTrainerImpl::GaloreHostDirection(ParamState& p) {
  STRATA_ASSIGN_OR_RETURN(auto buffer, arena_->Allocate(static_cast<size_t>(p.numel) * sizeof(float)));
  GaloreDirection(p, HostView(p.grad, p.numel), HostView(buffer, p.numel).view(p.shape));
  return buffer;
}

absl::Status LayerwiseTrainerImpl::HostStep(const std::vector<ParamState*>& params) {
  std::vector<offload::AdamTensorSpan> spans;
  spans.reserve(params.size());
  std::vector<const ParamState*> write_back;  // homes the optimizer cannot write in place
  for (ParamState* held : params) {
    ParamState& p = *held;
    if (p.galore != nullptr) {
      // One matrix at a time: its full-size direction is the step's only
      // temporary of the parameter's size.
      STRATA_ASSIGN_OR_RETURN(const offload::HostBuffer direction, GaloreHostDirection(p));
      offload::DirectionSpan span;
      span.name = p.name;
      span.param = p.master.floats().first(static_cast<size_t>(p.numel));
      span.direction = direction.floats().first(static_cast<size_t>(p.numel));
      STRATA_RETURN_IF_ERROR(adam_->ApplyDirection({&span, 1}));
      write_back.push_back(&p);
      continue;
    }
    offload::AdamTensorSpan span;
    span.name = p.name;
    const size_t n = static_cast<size_t>(p.numel);
    span.param = p.master.floats().first(n);
    span.grad = p.grad.floats().first(n);
    span.exp_avg = p.exp_avg.floats().first(n);
    span.exp_avg_sq = p.exp_avg_sq.floats().first(n);
    span.step = ++p.step;
    // The device weights are written in the same pass as the update when
    // their home is host memory we can reach (ZeRO-Offload's fused copy).
    const std::span<std::byte> home = WriteTarget(p);
    if (!home.empty() && p.dtype == at::kFloat) {
      span.device_fp32 = {reinterpret_cast<float*>(home.data()), n};
    } else if (!home.empty() && p.dtype == at::kBFloat16) {
      span.device_bf16 = {reinterpret_cast<uint16_t*>(home.data()), n};
    } else {
      write_back.push_back(&p);
    }
    spans.push_back(span);
  }
  STRATA_RETURN_IF_ERROR(adam_->Step(spans));
  for (const ParamState* p : write_back) {
    STRATA_RETURN_IF_ERROR(WriteBack(*p, HostView(p->master, p->numel)));
  }
  if (!sharded_) return absl::OkStatus();
  return BroadcastUpdatedWeights([](const ParamState& p) { return HostView(p.master, p.numel); });
}

absl::Status LayerwiseTrainerImpl::NvmeStep(const std::vector<ParamState*>& params) {
  std::vector<offload::NvmeAdamUpdate> updates;
  std::vector<std::pair<const ParamState*, offload::HostBuffer>> write_back;
  std::map<const ParamState*, at::Tensor> updated;  // sharded: each held tensor's new fp32 weights
  write_back.reserve(params.size());
  for (ParamState* held : params) {
    ParamState& p = *held;
    if (p.galore != nullptr) continue;  // after the full-Adam tensors, one at a time
    offload::NvmeAdamUpdate update;
    update.name = p.name;
    const size_t n = static_cast<size_t>(p.numel);
    update.grad = p.grad.floats().first(n);
    update.step = ++p.step;
    std::span<std::byte> home = WriteTarget(p);
    if (sharded_ || home.empty() || (p.dtype != at::kFloat && p.dtype != at::kBFloat16)) {
      // No reachable home (or the gang needs the fp32 weights to send): the
      // new weights land in a pooled scratch buffer and are stored after
      // the step.
      STRATA_ASSIGN_OR_RETURN(auto scratch, arena_->Allocate(n * sizeof(float)));
      update.out_fp32 = scratch.floats().first(n);
      if (sharded_) updated[&p] = HostView(scratch, p.numel);
      write_back.emplace_back(&p, std::move(scratch));
    } else if (p.dtype == at::kFloat) {
      update.out_fp32 = {reinterpret_cast<float*>(home.data()), n};
    } else {
      update.out_bf16 = {reinterpret_cast<uint16_t*>(home.data()), n};
    }
    updates.push_back(update);
  }
  STRATA_RETURN_IF_ERROR(nvme_adam_->Step(updates));
  for (const auto& [p, scratch] : write_back) {
    STRATA_RETURN_IF_ERROR(WriteBack(*p, HostView(scratch, p->numel)));
  }
  // GaLore matrices: the master's tiles stream through ApplyDirection (4
  // bytes each way per parameter instead of 12) on a helper thread while
  // the next matrix's direction is computed here.
  struct InFlight {
    ParamState* p = nullptr;
    offload::HostBuffer direction, scratch;
    offload::NvmeAdamUpdate update;
    std::future<absl::Status> done;  // last: destroyed first, waiting for the stream
  };
  std::unique_ptr<InFlight> flight;
  auto land = [&]() -> absl::Status {
    std::unique_ptr<InFlight> landed = std::move(flight);
    STRATA_RETURN_IF_ERROR(landed->done.get());
    ParamState& p = *landed->p;
    STRATA_RETURN_IF_ERROR(WriteBack(p, HostView(landed->scratch, p.numel)));
    if (sharded_) {
      updated[&p] = HostView(landed->scratch, p.numel);
      write_back.emplace_back(&p, std::move(landed->scratch));  // kept until the broadcast
    }
    return absl::OkStatus();
  };
  for (ParamState* held : params) {
    ParamState& p = *held;
    if (p.galore == nullptr) continue;
    const size_t n = static_cast<size_t>(p.numel);
    auto next = std::make_unique<InFlight>();
    next->p = &p;
    STRATA_ASSIGN_OR_RETURN(next->direction, GaloreHostDirection(p));
    STRATA_ASSIGN_OR_RETURN(next->scratch, arena_->Allocate(n * sizeof(float)));
    if (flight != nullptr) STRATA_RETURN_IF_ERROR(land());
    next->update.name = p.name;
    next->update.direction = next->direction.floats().first(n);
    next->update.step = p.step;
    next->update.out_fp32 = next->scratch.floats().first(n);
    flight = std::move(next);
    flight->done = std::async(std::launch::async, [this, update = &flight->update] {
      return nvme_adam_->Step({update, 1});
    });
  }
  if (flight != nullptr) STRATA_RETURN_IF_ERROR(land());
  if (!sharded_) return absl::OkStatus();
  return BroadcastUpdatedWeights([&](const ParamState& p) { return updated.at(&p); });
}

absl::Status LayerwiseTrainerImpl::DeviceStep() {
  // AdamW with torch ops on the device, in torch::optim::AdamW's order.
  c10::NoGradGuard no_grad;
  const offload::AdamOptions& o = options_.adam.adam;
  for (ParamState& p : params_) {
    if (p.galore != nullptr) {
      const at::Tensor direction = GaloreDirection(p, p.device_grad).reshape({-1});
      p.device_master.mul_(1 - o.lr * o.weight_decay).add_(direction, -o.lr);
      STRATA_RETURN_IF_ERROR(WriteBack(p, p.device_master));
      continue;
    }
    const int64_t step = ++p.step;
    const double bias1 = 1 - std::pow(o.beta1, static_cast<double>(step));
    const double bias2 = 1 - std::pow(o.beta2, static_cast<double>(step));
    at::Tensor grad = p.device_grad;
    if (o.decoupled) {
      p.device_master.mul_(1 - o.lr * o.weight_decay);
    } else if (o.weight_decay != 0) {
      grad = grad.add(p.device_master, o.weight_decay);
    }
    p.device_exp_avg.mul_(o.beta1).add_(grad, 1 - o.beta1);
    p.device_exp_avg_sq.mul_(o.beta2).addcmul_(grad, grad, 1 - o.beta2);
    const at::Tensor denom = (p.device_exp_avg_sq.sqrt() / std::sqrt(bias2)).add_(o.eps);
    p.device_master.addcdiv_(p.device_exp_avg, denom, -o.lr / bias1);
    STRATA_RETURN_IF_ERROR(WriteBack(p, p.device_master));
  }
  return absl::OkStatus();
}

std::span<std::byte> LayerwiseTrainerImpl::WriteTarget(const ParamState& p) {
  return p.resident != nullptr ? WritableCpuBytes(*p.resident) : source_->WritableHome(p.layer, p.index);
}

absl::Status LayerwiseTrainerImpl::WriteBack(const ParamState& p, const at::Tensor& master) {
  c10::NoGradGuard no_grad;
  if (p.resident != nullptr) {
    p.resident->copy_(master.view(p.shape));
    return absl::OkStatus();
  }
  return source_->Store(p.layer, p.index, master.view(p.shape).to(p.dtype));
}

}  // namespace strata::policies
