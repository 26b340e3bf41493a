// Attention of one new token per sequence over its cached keys and values
// where they lie in the KV block pool, on the CPU: no gathered copy of the
// cache and no padding to the longest sequence. fp32 accumulation and an
// exact softmax; AVX2 + FMA where the CPU has them.
#ifndef STRATA_POLICIES_ROLLOUT_PAGED_ATTENTION_H_
#define STRATA_POLICIES_ROLLOUT_PAGED_ATTENTION_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace strata::policies {

// q: [B, n_h, d] (one query per sequence), keys / values: the pool's
// [slots, n_kv, d] of one layer (float32 or bfloat16, like q). Sequence b
// attends over the slots slots[b][first[b] .. columns) (its positions in
// order, the query's own last), within `sliding_window` positions of the
// query when that is > 0. Returns [B, n_h, d] float32.
at::Tensor PagedDecodeAttention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                                const int64_t* slots, const std::vector<int64_t>& first, int64_t columns, double scale,
                                int64_t sliding_window);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_ROLLOUT_PAGED_ATTENTION_H_
