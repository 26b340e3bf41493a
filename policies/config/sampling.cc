#include "policies/config/sampling.h"

#include "absl/strings/str_cat.h"

namespace strata::policies {

absl::Status SamplingOptions::Validate() const {
  if (!greedy && !(temperature > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be > 0, got ", temperature));
  }
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", top_k));
  if (!(top_p > 0 && top_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  if (max_new_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens must be >= 0, got ", max_new_tokens));
  }
  for (int64_t cap : row_max_new_tokens) {
    if (cap < 0) return absl::InvalidArgumentError(absl::StrCat("row_max_new_tokens must be >= 0, got ", cap));
  }
  return absl::OkStatus();
}

}  // namespace strata::policies
