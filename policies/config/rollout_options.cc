#include "policies/config/rollout_options.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"

namespace strata::policies {

absl::Status RolloutEngineOptions::Validate(const std::string& key_prefix) const {
  auto error = [&](const char* field, const char* rule, int64_t got) {
    return absl::InvalidArgumentError(absl::StrCat("'", key_prefix, ".", field, "' ", rule, ", got ", got));
  };
  if (kv_block_tokens < 1 || kv_block_tokens > 4096)
    return error("kv_block_tokens", "must be in [1, 4096]", kv_block_tokens);
  // At most 2^30 MiB (1 PiB): its bytes stay far inside int64.
  if (kv_pool_mib < 0 || kv_pool_mib > (int64_t{1} << 30)) {
    return error("kv_pool_mib", "must be in [0, 1073741824] (0: sized for the rollout)", kv_pool_mib);
  }
  if (max_concurrency < 0) return error("max_concurrency", "must be >= 0 (0: no limit)", max_concurrency);
  return absl::OkStatus();
}

namespace {
int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

int64_t OwnKvBlocks(int64_t length, int64_t max_new, int64_t block_tokens) {
  return CeilDiv(length + std::max<int64_t>(max_new, 1) - 1, block_tokens) - length / block_tokens;
}

int64_t WorstCasePoolBlocks(const std::vector<int64_t>& lengths, const std::vector<std::vector<int64_t>>& caps,
                            const RolloutEngineOptions& options) {
  const int64_t bt = options.kv_block_tokens;
  std::vector<int64_t> own;  // each continuation's own blocks at most
  int64_t shared = 0, largest_shared = 0;
  for (size_t p = 0; p < lengths.size(); ++p) {
    const int64_t length = lengths[p];
    const int64_t full = options.share_prefixes ? length / bt : 0;
    for (int64_t cap : caps[p]) own.push_back(OwnKvBlocks(length, cap, bt) + length / bt - full);
    shared += full;
    largest_shared = std::max(largest_shared, options.share_prefixes ? CeilDiv(length, bt) : 0);
  }
  const auto limit = static_cast<size_t>(options.max_concurrency);
  if (options.max_concurrency == 0 || limit >= own.size()) {
    int64_t total = shared;
    for (int64_t o : own) total += o;
    return std::max<int64_t>(total, 1);
  }
  // The `limit` largest continuations, each from a prompt of its own (the
  // siblings of a long one may have ended), and one more prompt prefilled
  // and waiting to fork: no more prompts than there are.
  std::partial_sort(own.begin(), own.begin() + static_cast<std::ptrdiff_t>(limit), own.end(), std::greater<>());
  const auto prompts = std::min<int64_t>(static_cast<int64_t>(limit) + 1, static_cast<int64_t>(lengths.size()));
  int64_t total = prompts * largest_shared;
  for (size_t i = 0; i < limit; ++i) total += own[i];
  return std::max<int64_t>(total, 1);
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
