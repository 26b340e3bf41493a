#include "policies/train/galore.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/splitmix64.h"
#include "base/status_macros.h"

namespace strata::policies {

namespace {
// Oversampling and power iterations of the range finder: Halko et al.'s
// recommended p = 5-10 and q = 1-2, at the top of each range.
constexpr int64_t kOversample = 8;
constexpr int kPowerIterations = 2;

at::Tensor Orthonormal(const at::Tensor& m) { return std::get<0>(at::linalg_qr(m, "reduced")); }
}  // namespace

at::Tensor TopLeftSingularVectors(const at::Tensor& matrix, int64_t rank, uint64_t key) {
  c10::NoGradGuard no_grad;
  const at::Tensor a = matrix.to(at::kFloat);
  const int64_t k = std::min(a.size(0), rank + kOversample);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(key);
  const at::Tensor test = at::randn({a.size(1), k}, generator, at::TensorOptions().dtype(at::kFloat)).to(a.device());
  at::Tensor q = Orthonormal(at::matmul(a, test));
  for (int i = 0; i < kPowerIterations; ++i) q = Orthonormal(at::matmul(a, Orthonormal(at::matmul(a.t(), q))));
  // a ~ q (q^T a); the SVD of the [k, cols] sketch orders the directions.
  const at::Tensor small_u = std::get<0>(at::linalg_svd(at::matmul(q.t(), a), /*full_matrices=*/false));
  const at::Tensor u = at::matmul(q, small_u.narrow(1, 0, rank));
  // A singular vector's sign is LAPACK's arbitrary choice, and the moments
  // kept across a refresh read each column by its sign: fix it (the entry
  // of largest magnitude positive), so that nearby gradients give nearby
  // projections.
  const at::Tensor largest = u.abs().argmax(0, /*keepdim=*/true);
  return (u * at::sign(u.gather(0, largest))).contiguous();
}

uint64_t GaloreProjectionKey(uint64_t seed, std::string_view tensor, int64_t step) {
  uint64_t h = SplitMix64(seed);
  for (char c : tensor) h = SplitMix64(h ^ static_cast<unsigned char>(c));
  return SplitMix64(h ^ static_cast<uint64_t>(step));
}

GaloreMatrix::GaloreMatrix(int64_t rows, int64_t cols, const GaloreConfig& config)
    : rows_(rows), cols_(cols), rank_(config.RankFor(rows, cols)), config_(config) {}

absl::StatusOr<std::unique_ptr<GaloreMatrix>> GaloreMatrix::Create(int64_t rows, int64_t cols,
                                                                   const GaloreConfig& config,
                                                                   const Allocator& allocate) {
  if (auto s = config.Validate(); !s.ok()) return s;
  if (rows < 1 || cols < 1) return absl::InvalidArgumentError(absl::StrCat("galore: bad shape ", rows, " x ", cols));
  std::unique_ptr<GaloreMatrix> m(new GaloreMatrix(rows, cols, config));
  const int64_t r = m->rank_;
  const std::vector<int64_t> moments = m->projects_rows() ? std::vector<int64_t>{r, cols}
                                                          : std::vector<int64_t>{rows, r};
  const std::vector<int64_t> projection = {m->projects_rows() ? rows : cols, r};
  STRATA_ASSIGN_OR_RETURN(m->projection_, allocate(projection));
  STRATA_ASSIGN_OR_RETURN(m->exp_avg_, allocate(moments));
  STRATA_ASSIGN_OR_RETURN(m->exp_avg_sq_, allocate(moments));
  return m;
}

at::Tensor GaloreMatrix::Direction(const at::Tensor& grad, int64_t step, const offload::AdamOptions& adam, uint64_t key,
                                   at::Tensor out) {
  c10::NoGradGuard no_grad;
  const at::Tensor g = grad.view({rows_, cols_});
  if (RefreshDue(step)) {
    projection_.copy_(TopLeftSingularVectors(projects_rows() ? g : g.t(), rank_, key));
  }
  const at::Tensor low = projects_rows() ? at::matmul(projection_.t(), g) : at::matmul(g, projection_);
  // torch's Adam on the projected gradient, operation for operation.
  const double bias1 = 1 - std::pow(adam.beta1, static_cast<double>(step));
  const double bias2 = 1 - std::pow(adam.beta2, static_cast<double>(step));
  exp_avg_.mul_(adam.beta1).add_(low, 1 - adam.beta1);
  exp_avg_sq_.mul_(adam.beta2).addcmul_(low, low, 1 - adam.beta2);
  const at::Tensor denom = (exp_avg_sq_.sqrt() / std::sqrt(bias2)).add_(adam.eps);
  const at::Tensor normalised = exp_avg_.div(denom).div_(bias1);
  if (!out.defined()) out = at::empty({rows_, cols_}, normalised.options());
  if (projects_rows()) {
    at::mm_out(out, projection_, normalised);
  } else {
    at::mm_out(out, normalised, projection_.t());
  }
  if (config_.scale != 1.0) out.mul_(config_.scale);
  return out;
}

absl::Status GaloreMatrix::SetProjection(const at::Tensor& projection) {
  if (projection.sizes() != projection_.sizes()) {
    return absl::InvalidArgumentError(absl::StrCat("galore: a projection of shape [",
                                                   absl::StrJoin(projection.sizes(), ", "), "] for one of shape [",
                                                   absl::StrJoin(projection_.sizes(), ", "), "]"));
  }
  c10::NoGradGuard no_grad;
  projection_.copy_(projection);
  return absl::OkStatus();
}

int64_t GaloreMatrix::state_bytes() const {
  return (projection_.numel() + exp_avg_.numel() + exp_avg_sq_.numel()) * static_cast<int64_t>(sizeof(float));
}

}  // namespace strata::policies
