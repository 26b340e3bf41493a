// Attention computed in blocks of queries and keys with an online softmax
// (FlashAttention's recurrence, Dao et al. 2022), and its backward by
// recomputing each block's scores from the saved log-sum-exp: the working
// memory is a block of scores at a time plus what is linear in the
// sequence, never the [T, S] score matrix materialised attention holds.
#ifndef STRATA_POLICIES_MODEL_BLOCKED_ATTENTION_H_
#define STRATA_POLICIES_MODEL_BLOCKED_ATTENTION_H_

#include <ATen/ATen.h>

#include <cstdint>

#include "policies/config/attention_blocks.h"

namespace strata::policies {

struct BlockedAttentionOptions {
  // Queries and keys per block: the scores of one block pair, [B, Hq,
  // query_block, key_block] in fp32, are the largest temporary.
  int64_t query_block = kAttentionQueryBlock;
  int64_t key_block = kAttentionKeyBlock;
  // > 0: a query at absolute position p sees keys in (p - window, p]
  // (Mistral's sliding window); 0: every earlier key.
  int64_t window = 0;
};

// softmax(q k^T / sqrt(D) + mask) v for grouped-query attention, in fp32
// whatever the inputs' dtype: q [B, Hq, T, D], k and v [B, Hkv, S, D] with
// Hq a multiple of Hkv (query head h reads key/value head h / (Hq / Hkv)).
// Query t sits at absolute position S - T + t and sees key j when j <= its
// position, within the window, and key_real[b][j] ([B, S] bool: left
// padding is false). Returns [B, Hq, T, D] in q's dtype; differentiable in
// q, k and v (its backward recomputes the scores block by block). A query
// that sees no key (a pad) gets a finite average of values, as the
// materialised attention's finite mask gives it; no real position reads it.
at::Tensor BlockedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_real,
                            const BlockedAttentionOptions& options = {});

}  // namespace strata::policies

#endif  // STRATA_POLICIES_MODEL_BLOCKED_ATTENTION_H_
