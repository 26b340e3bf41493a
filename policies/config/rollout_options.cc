#include "policies/config/rollout_options.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace strata::policies {

absl::Status RolloutEngineOptions::Validate(const std::string& key_prefix) const {
  auto error = [&](const char* field, const char* rule, int64_t got) {
    return absl::InvalidArgumentError(absl::StrCat("'", key_prefix, ".", field, "' ", rule, ", got ", got));
  };
  if (kv_block_tokens < 1 || kv_block_tokens > 4096)
    return error("kv_block_tokens", "must be in [1, 4096]", kv_block_tokens);
  if (kv_pool_mib < 0) return error("kv_pool_mib", "must be >= 0 (0: sized for the rollout)", kv_pool_mib);
  if (max_concurrency < 0) return error("max_concurrency", "must be >= 0 (0: no limit)", max_concurrency);
  return absl::OkStatus();
}

int64_t RowBucket(int64_t rows) {
  if (rows <= 1) return 1;
  if (rows <= 8) {
    int64_t bucket = 2;
    while (bucket < rows) bucket *= 2;
    return bucket;
  }
  return rows <= 64 ? (rows + 7) / 8 * 8 : (rows + 31) / 32 * 32;
}

int64_t ColumnBucket(int64_t positions, int64_t block_tokens, int64_t max_columns) {
  int64_t blocks = 1;
  while (blocks * block_tokens < positions) blocks *= 2;
  return std::max(positions, std::min(blocks * block_tokens, max_columns));
}

}  // namespace strata::policies
