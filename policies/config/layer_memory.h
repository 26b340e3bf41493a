// The device bytes one decoder layer works in beside its weights, in a
// no-grad forward and in the layer-wise trainer's recomputation and
// backward, as libtorch's kernels allocate them. One home for the model,
// which keeps that much free when it streams layers, and the planner
// (policies/job, torch-free), which predicts a job's device peak.
#ifndef STRATA_POLICIES_CONFIG_LAYER_MEMORY_H_
#define STRATA_POLICIES_CONFIG_LAYER_MEMORY_H_

#include <algorithm>
#include <cstdint>

#include "policies/config/attention_blocks.h"

namespace strata::policies {

// R rows of T tokens through one decoder layer.
struct LayerShape {
  int64_t rows = 1, tokens = 1;
  int64_t hidden = 1, intermediate = 1;
  int64_t heads = 1, kv_heads = 1, head_dim = 1;
  int64_t dtype_bytes = 4;  // of the model's weights and activations

  AttentionShape Attention(int64_t keys) const {
    AttentionShape a;
    a.rows = rows, a.queries = tokens, a.keys = keys;
    a.heads = heads, a.kv_heads = kv_heads, a.head_dim = head_dim, a.dtype_bytes = dtype_bytes;
    return a;
  }
  // Elements of R x T tensors of the hidden, intermediate and q, k, v widths.
  double RowsBy(int64_t width) const { return static_cast<double>(rows) * static_cast<double>(tokens) * width; }
  int64_t QkvWidth() const { return (heads + 2 * kv_heads) * head_dim; }
};

// A no-grad forward over R x T new tokens attending to `keys` positions:
// four hidden-size and three intermediate-size tensors at its peak, beside
// attention's own.
inline double LayerForwardBytes(const LayerShape& s, int64_t keys) {
  return (4.0 * s.RowsBy(s.hidden) + 3.0 * s.RowsBy(s.intermediate)) * static_cast<double>(s.dtype_bytes) +
         AttentionWorkingBytes(s.Attention(keys), /*training=*/false);
}

// Bytes of the layer's weight gradients alive at each phase of its
// backward: the first MLP matrix's, all but q, k and v's, and all of them.
// Then the float32 copies that send them home: on the CPU device made and
// freed one at a time once the backward ends; on a GPU still in flight
// while the next layer's backward runs.
struct LayerGradientBytes {
  double first_mlp = 0, before_attention = 0, all = 0;
  double sending = 0;
  bool sending_overlaps = false;
  // The two RMSNorm weights are frozen (LoRA's base): their products keep
  // no copy of the normalised input for a weight gradient, two hidden-size
  // tensors fewer in the MLP's backward (measured at 7B width, 1k and 4k).
  bool frozen_norms = false;
};

// A full-parameter layer's gradients in the model dtype: down_proj's first,
// then the MLP's and o_proj's, then all `layer_params`.
inline LayerGradientBytes FullLayerGradients(const LayerShape& s, int64_t layer_params) {
  const auto e = static_cast<double>(s.dtype_bytes);
  const double mlp = static_cast<double>(s.hidden) * static_cast<double>(s.intermediate);
  const double o = static_cast<double>(s.hidden) * static_cast<double>(s.heads * s.head_dim);
  return {mlp * e, (3.0 * mlp + o) * e, static_cast<double>(layer_params) * e};
}

// The float32 copies that send a full-parameter layer's gradients home: on
// a GPU two of the largest (an MLP matrix's) in flight; on the CPU device a
// bf16 model's, one at a time (fp32 gradients go home as they are).
inline void SendHomeInFloat32(const LayerShape& s, bool cpu_device, LayerGradientBytes& g) {
  const double largest = 4.0 * static_cast<double>(s.hidden) * static_cast<double>(s.intermediate);
  g.sending = cpu_device ? (s.dtype_bytes < 4 ? largest : 0.0) : 2.0 * largest;
  g.sending_overlaps = !cpu_device;
}

// The layer-wise trainer's recomputed forward of one layer and its
// backward, beyond the layer's input and the gradient arriving at its
// output (the caller counts those with the kept inputs). Autograd frees a
// saved tensor once the gradient that needs it is made, so the peak is the
// largest of three phases:
//  - the MLP's backward: every saved activation (ten hidden-size tensors,
//    eight with frozen norms; q, k and v; four intermediate-size ones) with
//    two intermediate-size gradients and down_proj's weight gradient;
//  - attention's backward: its own working bytes beside the MLP's and
//    o_proj's weight gradients;
//  - the end: every weight gradient beside eight hidden-size tensors, or
//    beside the float32 copy that sends one home.
// Measured on the CPU device with hooks at each phase (fp32; the 51M shape,
// and at Llama-2-7B width with and without grouped-query attention and with
// a narrower MLP, at 1k-16k tokens): within 2% of each. A bf16 model also
// keeps RMSNorm's float32 copies of its two inputs (checked at 7B width).
inline double LayerBackwardBytes(const LayerShape& s, const LayerGradientBytes& g) {
  const auto e = static_cast<double>(s.dtype_bytes);
  const double norm_copies = s.dtype_bytes < 4 ? 2.0 * 4.0 * s.RowsBy(s.hidden) : 0.0;
  const double in_flight = g.sending_overlaps ? g.sending : 0.0;
  const double saved_hidden = g.frozen_norms ? 8.0 : 10.0;
  const double mlp = g.first_mlp +
                     (saved_hidden * s.RowsBy(s.hidden) + s.RowsBy(s.QkvWidth()) + 6.0 * s.RowsBy(s.intermediate)) * e +
                     norm_copies + in_flight;
  const double attention = g.before_attention + AttentionWorkingBytes(s.Attention(s.tokens), /*training=*/true) +
                           s.RowsBy(s.hidden) * e + in_flight;
  const double hidden = 8.0 * s.RowsBy(s.hidden) * e;
  const double end = g.all + (g.sending_overlaps ? hidden + g.sending : std::max(hidden, g.sending));
  return std::max({mlp, attention, end});
}

}  // namespace strata::policies

#endif  // STRATA_POLICIES_CONFIG_LAYER_MEMORY_H_
