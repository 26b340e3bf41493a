// When a decoder's attention is computed in blocks with an online softmax
// (policies/model/blocked_attention.h) instead of the whole [T, S] score
// matrix, the blocks' size, and the working bytes of either. One home for
// the model, which computes it and reserves room for it when streaming, and
// the planner (policies/job, torch-free), which predicts its memory.
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

// Whether keys [j0, j1) are all hidden from the queries at positions
// [first, last] by causality or a sliding window (0: none): the blocked
// attention skips such a block pair.
inline bool BlockPairHidden(int64_t first, int64_t last, int64_t j0, int64_t j1, int64_t window) {
  return j0 > last || (window > 0 && j1 - 1 <= first - window);
}

// Scores the blocked attention computes for `queries` queries (the last of
// `keys` positions) against `keys` keys: every block pair that causality or
// a sliding `window` (0: none) does not wholly hide, computed whole. Its
// products' FLOPs per head are 4 x head_dim x this forward. Near the
// diagonal a pair is partly hidden, so this exceeds the T(T+1)/2 visible
// scores by about 25% at 1k tokens and 1.6% at 16k.
inline int64_t BlockedAttentionScores(int64_t queries, int64_t keys, int64_t window = 0) {
  // Per query block, the key blocks it computes are one run [lo, hi]: a
  // closed form, not a walk over every pair (the planner prices 100k-token
  // passes many times over in a fit).
  const int64_t key_blocks = (keys + kAttentionKeyBlock - 1) / kAttentionKeyBlock;
  int64_t scores = 0;
  for (int64_t t0 = 0; t0 < queries; t0 += kAttentionQueryBlock) {
    const int64_t t1 = t0 + kAttentionQueryBlock < queries ? t0 + kAttentionQueryBlock : queries;
    const int64_t first = keys - queries + t0, last = keys - queries + t1 - 1;  // positions of the block's queries
    // Causality hides the blocks that start after `last`; the window those
    // that end at or before first - window (BlockPairHidden).
    const int64_t hi = last / kAttentionKeyBlock < key_blocks - 1 ? last / kAttentionKeyBlock : key_blocks - 1;
    const int64_t lo = window > 0 && first - window + 1 > 0 ? (first - window + 1) / kAttentionKeyBlock : 0;
    if (hi < lo) continue;
    const int64_t end = (hi + 1) * kAttentionKeyBlock < keys ? (hi + 1) * kAttentionKeyBlock : keys;
    scores += (t1 - t0) * (end - lo * kAttentionKeyBlock);
  }
  return scores;
}

// The shape of one attention call, for its working bytes.
struct AttentionShape {
  int64_t rows = 1, queries = 1, keys = 1;
  int64_t heads = 1, kv_heads = 1, head_dim = 1;
  int64_t dtype_bytes = 4;  // of the model's activations
};

// Attention's own working bytes, as libtorch's CPU kernels allocate them:
// materialised, the [T, S] scores with their float32 softmax and the
// probabilities in the model's dtype; blocked, one block pair of float32
// scores, probabilities and mask, plus float32 tensors of q, k and v's width
// per query (their contiguous copies and the output, and in training the
// gradients).
inline double AttentionWorkingBytes(const AttentionShape& a, bool training) {
  const double row_queries = static_cast<double>(a.rows) * static_cast<double>(a.queries);
  if (!BlockedAttentionFor(a.queries, a.keys)) {
    return row_queries * static_cast<double>(a.heads) * static_cast<double>(a.keys) *
           (8.0 + static_cast<double>(a.dtype_bytes));
  }
  const double block_pair = 3.0 * 4.0 *
                            static_cast<double>(a.rows * a.heads * kAttentionQueryBlock * kAttentionKeyBlock);
  const double width = static_cast<double>((a.heads + 2 * a.kv_heads) * a.head_dim);
  return block_pair + (training ? 5.0 : 2.0) * 4.0 * row_queries * width;
}

}  // namespace strata::policies

#endif  // STRATA_POLICIES_CONFIG_ATTENTION_BLOCKS_H_
