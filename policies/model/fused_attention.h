// libtorch's fused scaled-dot-product attention, where this process's
// libtorch has it. strata calls it with grouped-query attention
// (`enable_gqa`), which came in PyTorch 2.5. The operator is looked up by
// name at run time, so strata still builds against an older libtorch
// (Debian's 1.13 has none), where FusedAttentionAvailable() is false and
// layers use BlockedAttention. Which kernel libtorch picks depends on the
// call: FlashAttention's needs half precision and no mask; the
// memory-efficient one takes a mask and fp32 but not grouped heads;
// anything else falls back to libtorch's math kernel, which materialises
// every score (MakeLayerContext's kAuto avoids those calls).
#ifndef STRATA_POLICIES_MODEL_FUSED_ATTENTION_H_
#define STRATA_POLICIES_MODEL_FUSED_ATTENTION_H_

#include <ATen/ATen.h>

#include <cstdint>

namespace strata::policies {

// The largest additive mask a layer context builds for the fused kernel
// (left padding, a window, or fewer queries than keys need one: [B, 1, T,
// S] in the model's dtype). Past it, kAuto attends in blocks instead, whose
// memory stays linear in the sequence.
inline constexpr int64_t kFusedAttentionMaskBytes = int64_t{64} << 20;

// Whether this libtorch registers aten::scaled_dot_product_attention with
// the signature strata calls (query, key, value, mask, dropout, causal,
// scale, enable_gqa). Looked up once a process.
bool FusedAttentionAvailable();

// softmax(q k^T / sqrt(D) + mask) v as BlockedAttention computes it (the
// same shapes and grouped heads: q [B, Hq, T, D], k and v [B, Hkv, S, D]),
// through the fused operator. `mask` is undefined when T == S and every
// key is real with no window (then the kernel's own causal mask applies,
// which FlashAttention's kernel needs), else the additive [B, 1, T, S] mask
// AdditiveAttentionMask made. Differentiable in q, k and v; fails where the
// operator is not available.
at::Tensor FusedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask);

// The additive mask for queries at the last T of S positions (the
// materialised attention's and the fused kernel's): 0 where query t
// (absolute position S - T + t) sees key j (j <= its position, within
// `window` when > 0, and key_real[b][j]), else the dtype's lowest finite
// value. A pad query sees no key: the materialised softmax then averages
// every value, but the fused kernels scale the mask and overflow it to
// -inf, which would make the row NaN (and a NaN reaches real rows through
// the next layer's keys), so with `pad_queries_see_themselves` such a
// query sees its own position instead. No real position reads a pad
// query's output. [B, 1, T, S] in `dtype`.
at::Tensor AdditiveAttentionMask(const at::Tensor& key_real, int64_t queries, int64_t window, at::ScalarType dtype,
                                 bool pad_queries_see_themselves = false);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_MODEL_FUSED_ATTENTION_H_
