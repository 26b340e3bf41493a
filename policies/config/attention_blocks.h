// When a decoder's attention is computed in blocks with an online softmax
// (policies/model/blocked_attention.h) instead of the whole [T, S] score
// matrix, and the blocks' size. One home for the model, which computes it,
// and the planner (policies/job, torch-free), which predicts its memory.
#ifndef STRATA_POLICIES_CONFIG_ATTENTION_BLOCKS_H_
#define STRATA_POLICIES_CONFIG_ATTENTION_BLOCKS_H_

#include <cstdint>

namespace strata::policies {

// From this many scores per row and head (T x S) on, attention is blocked:
// below it the materialised product is faster on a CPU and its scores are
// small (4 MiB a head in fp32).
inline constexpr int64_t kBlockedAttentionScores = int64_t{1} << 20;
// Queries and keys per block: one block pair's scores, [B, Hq, 128, 256] in
// fp32, are the blocked attention's largest temporary.
inline constexpr int64_t kAttentionQueryBlock = 128;
inline constexpr int64_t kAttentionKeyBlock = 256;

inline bool BlockedAttentionFor(int64_t queries, int64_t keys) { return queries * keys >= kBlockedAttentionScores; }

}  // namespace strata::policies

#endif  // STRATA_POLICIES_CONFIG_ATTENTION_BLOCKS_H_
