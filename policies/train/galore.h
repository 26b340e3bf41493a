// GaLore's optimizer state for one weight matrix (Zhao et al. 2024,
// Algorithm 2): Adam's moments kept in a rank-r projection of the
// gradient, the update projected back to full rank. The matrix's fp32
// master weights stay with the trainer's tier (host, NVMe or device); this
// holds the projection and the two small moments, and turns a gradient into
// the step's update direction.
//
// Choices (docs/DECISIONS.md): the moments are kept, not reset, when the
// projection changes, as the paper and its reference implementation do;
// Adam's arithmetic is torch's (the same as CpuAdam, so an identity
// projection gives AdamW); a projection is the top-r singular vectors of
// the gradient of the step that computes it, found by a randomized range
// finder keyed by (seed, tensor, step).
#ifndef STRATA_POLICIES_TRAIN_GALORE_H_
#define STRATA_POLICIES_TRAIN_GALORE_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "offload/adam/cpu_adam.h"
#include "policies/config/galore_config.h"

namespace strata::policies {

// The top `rank` left singular vectors of `matrix` ([rows, cols], fp32;
// rank <= rows), as a [rows, rank] matrix with orthonormal columns on the
// matrix's device. A randomized range finder with subspace iteration
// (Halko, Martinsson and Tropp 2011, Algorithms 4.4 and 5.1): rank + 8
// Gaussian test vectors drawn from `key`, two power iterations with
// re-orthonormalisation, then the exact SVD of the small sketch. The span
// it finds holds, on gradients' fast-decaying spectra, all but a fraction
// of a percent of the top-r energy (galore_test.cc measures it).
at::Tensor TopLeftSingularVectors(const at::Tensor& matrix, int64_t rank, uint64_t key);

// A projection's key: a pure function of the job's seed, the tensor and the
// step that computes it, so a resumed or re-sharded run draws the same.
uint64_t GaloreProjectionKey(uint64_t seed, std::string_view tensor, int64_t step);

class GaloreMatrix {
 public:
  // Zeroed fp32 state tensors of the shape asked, where the state lives.
  using Allocator = std::function<absl::StatusOr<at::Tensor>(const std::vector<int64_t>& shape)>;
  static absl::StatusOr<std::unique_ptr<GaloreMatrix>> Create(int64_t rows, int64_t cols, const GaloreConfig& config,
                                                              const Allocator& allocate);

  // Whether `step` (1 for the first update) computes a new projection: the
  // first, then every update_proj_gap-th.
  bool RefreshDue(int64_t step) const { return (step - 1) % config_.update_proj_gap == 0; }

  // This step's update direction D ([rows, cols] fp32, on the gradient's
  // device): the caller applies W <- W (1 - lr wd) - lr D. Refreshes the
  // projection from `grad` when due (with `key`), projects the gradient,
  // updates the moments as torch's Adam does at `step` (its bias
  // corrections), and projects the normalised moment back, times scale.
  // With `out` ([rows, cols] fp32 on that device) the direction is written
  // there and returned: a caller's pooled buffer, not a fresh allocation.
  at::Tensor Direction(const at::Tensor& grad, int64_t step, const offload::AdamOptions& adam, uint64_t key,
                       at::Tensor out = at::Tensor());

  // Sets the projection (a checkpoint's, or a test's); INVALID_ARGUMENT
  // when its shape is not projection()'s.
  absl::Status SetProjection(const at::Tensor& projection);

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t rank() const { return rank_; }
  // Projects the rows (the smaller side): P is [rows, r], moments [r, cols].
  bool projects_rows() const { return GaloreConfig::ProjectsRows(rows_, cols_); }
  // The state, in place (checkpoints read and write these).
  at::Tensor& projection() { return projection_; }
  at::Tensor& exp_avg() { return exp_avg_; }
  at::Tensor& exp_avg_sq() { return exp_avg_sq_; }
  int64_t state_bytes() const;

 private:
  GaloreMatrix(int64_t rows, int64_t cols, const GaloreConfig& config);

  const int64_t rows_, cols_, rank_;
  const GaloreConfig config_;
  at::Tensor projection_, exp_avg_, exp_avg_sq_;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_TRAIN_GALORE_H_
