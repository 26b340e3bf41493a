#include "policies/config/rollout_options.h"

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

}  // namespace strata::policies
