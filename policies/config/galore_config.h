// GaLore (Zhao et al. 2024) as a job describes it: every parameter trains,
// but the Adam moments of each decoder-layer projection live in a rank-r
// projection of its gradient. Kept free of torch: the job spec and the
// planner name it; policies/train/galore.h runs it.
#ifndef STRATA_POLICIES_CONFIG_GALORE_CONFIG_H_
#define STRATA_POLICIES_CONFIG_GALORE_CONFIG_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "policies/config/llama_config.h"

namespace strata::policies {

// Defaults are the reference implementation's (galore_torch's README and
// the paper's LLaMA runs): rank 128, a new projection every 200 steps,
// scale 0.25.
struct GaloreConfig {
  // The projection's rank r; 0: no GaLore (full Adam). A matrix whose
  // smaller side is at most r is projected at its full rank.
  int64_t rank = 0;
  // Steps between projections: the first step computes one, and every
  // update_proj_gap-th step after it a new one, from that step's gradient.
  int64_t update_proj_gap = 200;
  // The projected-back update is multiplied by this (the paper's alpha).
  double scale = 0.25;

  bool enabled() const { return rank > 0; }
  // The projection's rank for a [rows, cols] matrix: min(rank, rows, cols).
  int64_t RankFor(int64_t rows, int64_t cols) const;
  // Whether a [rows, cols] matrix projects its rows (the smaller side, as
  // the paper does): the moments are then [r, cols] and the projection
  // [rows, r]; otherwise [rows, r] and [cols, r].
  static bool ProjectsRows(int64_t rows, int64_t cols) { return rows <= cols; }
  // Elements of the state one [rows, cols] matrix keeps besides its fp32
  // master: both moments and the projection.
  int64_t StateElements(int64_t rows, int64_t cols) const;
  // Over every decoder-layer projection of `model` (the tensors GaLore
  // applies to): their parameters, and their state elements as above.
  int64_t ProjectedParameters(const LlamaConfig& model) const;
  int64_t StateElements(const LlamaConfig& model) const;
  // Optimizer bytes GaLore saves over `model`'s layers against full Adam's
  // 12 a parameter: 8 a projected parameter (the moments) less its small
  // state's 4 an element. 0 when disabled; negative where the rank is so
  // large that the state outgrows the moments.
  int64_t SavedBytes(const LlamaConfig& model) const;
  // Floating-point operations of one step's projections (project and
  // project back: 4 r per parameter) over `model`'s layers, and of one
  // refresh of every projection (the randomized range finder of
  // policies/train/galore.h), which runs every update_proj_gap steps.
  double StepFlops(const LlamaConfig& model) const;
  double RefreshFlops(const LlamaConfig& model) const;
  // INVALID_ARGUMENT naming the field, quoted as '`key`.field'.
  absl::Status Validate(const std::string& key = "galore") const;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_CONFIG_GALORE_CONFIG_H_
