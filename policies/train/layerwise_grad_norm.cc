// The global gradient norm each step measures, and clipping to
// max_grad_norm as torch.nn.utils.clip_grad_norm_ does.
#include "policies/train/layerwise_trainer_impl.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace strata::policies {

using internal::HostView;

namespace internal {

// Sum of squares of a host gradient at memory speed: eight float lanes the
// compiler vectorises, summed into a double every block so that the total
// keeps its precision. (at::dot per tensor cost ~5 ms a step on the tiny
// model, 6% of a PPO iteration.)
double SquaredNorm(const float* x, int64_t n) {
  constexpr int64_t kBlock = 1 << 14;
  double total = 0;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = begin;
    for (; i + 8 <= end; i += 8) {
      for (int k = 0; k < 8; ++k) lanes[k] += x[i + k] * x[i + k];
    }
    for (; i < end; ++i) lanes[0] += x[i] * x[i];
    for (float lane : lanes) total += lane;
  }
  return total;
}

}  // namespace internal

using internal::SquaredNorm;

absl::Status LayerwiseTrainerImpl::ClipGradients() {
  // Unsharded, every rank holds every summed gradient and this norm is the
  // global one on each rank; ZeRO-2, each holds its share and the squares
  // are summed over the gang.
  c10::NoGradGuard no_grad;
  // step_in_backward: the layers' part was summed as each stepped.
  double squares = layer_squares_;
  layer_squares_ = 0.0;
  for (const ParamState& p : params_) {
    if (p.device_grad.defined()) {
      const at::Tensor g = p.device_grad.reshape(-1);
      squares += at::dot(g, g).item<double>();
    } else if (p.grad.data() != nullptr) {
      squares += SquaredNorm(p.grad.floats().data(), p.numel);
    }
  }
  if (sharded_) {
    std::vector<at::Tensor> total = {at::full({1}, squares, at::kDouble)};
    STRATA_RETURN_IF_ERROR(options_.data_parallel->AllReduceSum(total));
    squares = total[0].item<double>();
  }
  last_grad_norm_ = std::sqrt(squares);
  if (!std::isfinite(last_grad_norm_)) {
    return absl::InternalError(absl::StrCat("the gradient norm is ", last_grad_norm_,
                                            ": the loss diverged (lower train.lr or set train.max_grad_norm)"));
  }
  const double max_norm = options_.max_grad_norm;
  const double coefficient = max_norm / (last_grad_norm_ + 1e-6);  // torch's clip_grad_norm_
  if (max_norm <= 0 || coefficient >= 1.0) return absl::OkStatus();
  for (const ParamState& p : params_) {
    if (p.device_grad.defined()) {
      p.device_grad.mul_(coefficient);
    } else if (p.grad.data() != nullptr) {
      HostView(p.grad, p.numel).mul_(coefficient);
    }
  }
  return absl::OkStatus();
}

}  // namespace strata::policies
