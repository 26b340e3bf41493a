#include "policies/model/blocked_attention.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace strata::policies {

namespace {

// A masked score: finite, so a row that sees nothing averages instead of
// turning into NaN, and so far below any real score that exp() of it
// against a real maximum is exactly 0.
constexpr float kMasked = std::numeric_limits<float>::lowest();

// The shapes of one call, and which block pairs hold any visible key.
struct Geometry {
  int64_t b = 0, hkv = 0, groups = 0, t = 0, s = 0, d = 0;
  int64_t query_block = 0, key_block = 0, window = 0;
  double scale = 1.0;

  // Absolute position of query t.
  int64_t Position(int64_t query) const { return s - t + query; }
  // Whether keys [j0, j1) are all hidden from queries [t0, t1) by causality
  // or the window (padding is per row: left to the mask).
  bool Hidden(int64_t t0, int64_t t1, int64_t j0, int64_t j1) const {
    return BlockPairHidden(Position(t0), Position(t1 - 1), j0, j1, window);
  }
  // The additive mask of a block pair, [B, 1, 1, tq, tk] fp32: 0 where
  // visible, kMasked elsewhere.
  at::Tensor Mask(const at::Tensor& key_real, int64_t t0, int64_t t1, int64_t j0, int64_t j1) const {
    const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong).device(key_real.device());
    const at::Tensor query = at::arange(Position(t0), Position(t1 - 1) + 1, longs).unsqueeze(1);  // [tq, 1]
    const at::Tensor key = at::arange(j0, j1, longs).unsqueeze(0);                                // [1, tk]
    at::Tensor visible = key.le(query);
    if (window > 0) visible = visible.logical_and(key.gt(query - window));
    visible = visible.unsqueeze(0).logical_and(key_real.narrow(1, j0, j1 - j0).unsqueeze(1));  // [B, tq, tk]
    return at::zeros(visible.sizes(), key_real.options().dtype(at::kFloat))
        .masked_fill(visible.logical_not(), kMasked)
        .view({b, 1, 1, t1 - t0, j1 - j0});
  }
};

// Queries [t0, t1) of every head, grouped by key/value head: [B, Hkv, G, tq, D].
at::Tensor QueryBlock(const at::Tensor& q5, int64_t t0, int64_t t1) { return q5.narrow(3, t0, t1 - t0); }

// [B, Hkv, G, tq, X] as [B, Hkv, G * tq, X] for a product with a key block.
at::Tensor Rows(const at::Tensor& x) { return x.reshape({x.size(0), x.size(1), -1, x.size(-1)}); }

class BlockedAttentionFunction : public torch::autograd::Function<BlockedAttentionFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& key_real, int64_t query_block, int64_t key_block,
                            int64_t window) {
    const Geometry g = Shape(q, k, query_block, key_block, window);
    // Contiguous fp32 copies once: the layer hands heads transposed out of
    // [B, T, H, D], and every block's product would otherwise gather its
    // strided rows again (measured: about 3x the time at 16k tokens).
    const at::Tensor q5 = q.to(at::kFloat).contiguous().view({g.b, g.hkv, g.groups, g.t, g.d});
    const at::Tensor kf = k.to(at::kFloat).contiguous(), vf = v.to(at::kFloat).contiguous();
    at::Tensor out = at::empty({g.b, g.hkv, g.groups, g.t, g.d}, q5.options());
    at::Tensor lse = at::empty({g.b, g.hkv, g.groups, g.t}, q5.options());  // log-sum-exp of each row
    for (int64_t t0 = 0; t0 < g.t; t0 += g.query_block) {
      const int64_t t1 = std::min(g.t, t0 + g.query_block), tq = t1 - t0;
      const at::Tensor qi = QueryBlock(q5, t0, t1) * g.scale;
      // The running maximum, normaliser and unnormalised output of each row.
      at::Tensor m = at::full({g.b, g.hkv, g.groups, tq}, kMasked, q5.options());
      at::Tensor l = at::zeros_like(m);
      at::Tensor acc = at::zeros({g.b, g.hkv, g.groups, tq, g.d}, q5.options());
      for (int64_t j0 = 0; j0 < g.s; j0 += g.key_block) {
        const int64_t j1 = std::min(g.s, j0 + g.key_block);
        if (g.Hidden(t0, t1, j0, j1)) continue;
        const at::Tensor scores = Scores(g, qi, kf, key_real, t0, t1, j0, j1);
        const at::Tensor m_new = at::maximum(m, std::get<0>(scores.max(-1)));
        const at::Tensor p = (scores - m_new.unsqueeze(-1)).exp_();
        const at::Tensor rescale = (m - m_new).exp_();
        l = l * rescale + p.sum(-1);
        acc = acc * rescale.unsqueeze(-1) +
              at::matmul(Rows(p), vf.narrow(2, j0, j1 - j0)).view({g.b, g.hkv, g.groups, tq, g.d});
        m = m_new;
      }
      out.narrow(3, t0, tq).copy_(acc / l.unsqueeze(-1));
      lse.narrow(3, t0, tq).copy_(m + l.log());
    }
    ctx->save_for_backward({q, k, v, key_real, out, lse});
    ctx->saved_data["query_block"] = query_block;
    ctx->saved_data["key_block"] = key_block;
    ctx->saved_data["window"] = window;
    // A copy, not a view of the saved `out`: what the caller does to its
    // result must not touch what backward reads.
    return out.view({g.b, g.hkv * g.groups, g.t, g.d}).to(q.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &key_real = saved[3], &out = saved[4],
                     &lse = saved[5];
    const Geometry g = Shape(q, k, ctx->saved_data["query_block"].toInt(), ctx->saved_data["key_block"].toInt(),
                             ctx->saved_data["window"].toInt());
    const at::Tensor q5 = q.to(at::kFloat).contiguous().view({g.b, g.hkv, g.groups, g.t, g.d});
    const at::Tensor kf = k.to(at::kFloat).contiguous(), vf = v.to(at::kFloat).contiguous();
    const at::Tensor d_out = grads[0].to(at::kFloat).reshape({g.b, g.hkv, g.groups, g.t, g.d});
    // Each row's sum of dO * O: the softmax's backward term.
    const at::Tensor row_dot = (d_out * out).sum(-1);
    at::Tensor dq = at::zeros_like(q5), dk = at::zeros_like(kf), dv = at::zeros_like(vf);
    for (int64_t t0 = 0; t0 < g.t; t0 += g.query_block) {
      const int64_t t1 = std::min(g.t, t0 + g.query_block), tq = t1 - t0;
      const at::Tensor qi = QueryBlock(q5, t0, t1) * g.scale;
      const at::Tensor do_i = QueryBlock(d_out, t0, t1);
      const at::Tensor lse_i = lse.narrow(3, t0, tq).unsqueeze(-1);
      const at::Tensor dot_i = row_dot.narrow(3, t0, tq).unsqueeze(-1);
      at::Tensor dq_i = dq.narrow(3, t0, tq);
      for (int64_t j0 = 0; j0 < g.s; j0 += g.key_block) {
        const int64_t j1 = std::min(g.s, j0 + g.key_block), tk = j1 - j0;
        if (g.Hidden(t0, t1, j0, j1)) continue;
        const at::Tensor p = (Scores(g, qi, kf, key_real, t0, t1, j0, j1) - lse_i).exp_();  // the probabilities
        const at::Tensor kj = kf.narrow(2, j0, tk), vj = vf.narrow(2, j0, tk);
        dv.narrow(2, j0, tk).add_(at::matmul(Rows(p).transpose(-1, -2), Rows(do_i)));
        const at::Tensor dp = at::matmul(Rows(do_i), vj.transpose(-1, -2)).view(p.sizes());
        const at::Tensor ds = p * (dp - dot_i);  // d(loss) / d(scaled scores)
        dq_i.add_(at::matmul(Rows(ds), kj).view(dq_i.sizes()), g.scale);
        dk.narrow(2, j0, tk).add_(at::matmul(Rows(ds).transpose(-1, -2), Rows(qi)));
      }
    }
    return {dq.view(q.sizes()).to(q.scalar_type()),
            dk.to(k.scalar_type()),
            dv.to(v.scalar_type()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }

 private:
  static Geometry Shape(const at::Tensor& q, const at::Tensor& k, int64_t query_block, int64_t key_block,
                        int64_t window) {
    Geometry g;
    g.b = q.size(0), g.hkv = k.size(1), g.groups = q.size(1) / k.size(1);
    g.t = q.size(2), g.s = k.size(2), g.d = q.size(3);
    g.query_block = query_block, g.key_block = key_block, g.window = window;
    g.scale = 1.0 / std::sqrt(static_cast<double>(g.d));
    return g;
  }

  // The scaled, masked scores of queries [t0, t1) (scaled: qi) against keys
  // [j0, j1): [B, Hkv, G, tq, tk] fp32.
  static at::Tensor Scores(const Geometry& g, const at::Tensor& qi, const at::Tensor& kf, const at::Tensor& key_real,
                           int64_t t0, int64_t t1, int64_t j0, int64_t j1) {
    const at::Tensor kj = kf.narrow(2, j0, j1 - j0);
    return at::matmul(Rows(qi), kj.transpose(-1, -2)).view({g.b, g.hkv, g.groups, t1 - t0, j1 - j0}) +
           g.Mask(key_real, t0, t1, j0, j1);
  }
};

}  // namespace

at::Tensor BlockedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_real,
                            const BlockedAttentionOptions& options) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes(),
              "BlockedAttention: q [B, Hq, T, D], k and v [B, Hkv, S, D]");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "BlockedAttention: ", q.size(1), " query heads over ", k.size(1),
              " key/value heads");
  TORCH_CHECK(q.size(2) <= k.size(2), "BlockedAttention: more queries than keys");
  TORCH_CHECK(options.query_block > 0 && options.key_block > 0, "BlockedAttention: blocks must be positive");
  return BlockedAttentionFunction::apply(q, k, v, key_real.to(at::kBool), options.query_block, options.key_block,
                                         options.window);
}

}  // namespace strata::policies
