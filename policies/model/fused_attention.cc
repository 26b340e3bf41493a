#include "policies/model/fused_attention.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <limits>
#include <optional>

#include "base/log.h"

namespace strata::policies {
namespace {

using FusedSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  const c10::optional<at::Tensor>&, double, bool, c10::optional<double>, bool);

// The operator, or nullopt where this libtorch lacks it or registers
// another signature (2.0-2.4: no enable_gqa).
const std::optional<c10::TypedOperatorHandle<FusedSignature>>& FusedOperator() {
  static const auto* op = [] {
    auto* found = new std::optional<c10::TypedOperatorHandle<FusedSignature>>();
    const auto handle = c10::Dispatcher::singleton().findSchema({"aten::scaled_dot_product_attention", ""});
    if (!handle.has_value()) return found;
    try {
      found->emplace(handle->typed<FusedSignature>());
    } catch (const c10::Error& e) {
      STRATA_LOG(Warning) << "aten::scaled_dot_product_attention has another signature here; attention runs in "
                             "blocks: "
                          << e.what_without_backtrace();
    }
    return found;
  }();
  return *op;
}

}  // namespace

bool FusedAttentionAvailable() { return FusedOperator().has_value(); }

at::Tensor FusedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  const auto& op = FusedOperator();
  TORCH_CHECK(op.has_value(),
              "fused attention needs aten::scaled_dot_product_attention with enable_gqa (PyTorch 2.5+)");
  const c10::optional<at::Tensor> attn_mask = mask.defined() ? c10::optional<at::Tensor>(mask) : c10::nullopt;
  return op->call(q, k, v, attn_mask, /*dropout_p=*/0.0, /*is_causal=*/!mask.defined(), /*scale=*/c10::nullopt,
                  /*enable_gqa=*/k.size(1) != q.size(1));
}

at::Tensor AdditiveAttentionMask(const at::Tensor& key_real, int64_t queries, int64_t window, at::ScalarType dtype,
                                 bool pad_queries_see_themselves) {
  const int64_t s = key_real.size(1), t = queries;
  const at::TensorOptions on_device = at::TensorOptions().dtype(at::kLong).device(key_real.device());
  const at::Tensor query_pos = at::arange(s - t, s, on_device).unsqueeze(1);  // [T, 1]
  const at::Tensor key_pos = at::arange(0, s, on_device).unsqueeze(0);        // [1, S]
  at::Tensor allowed = key_pos.le(query_pos);
  if (window > 0) allowed = allowed.logical_and(key_pos.gt(query_pos - window));
  const at::Tensor self = key_pos.eq(query_pos);
  allowed = allowed.unsqueeze(0).logical_and(key_real.to(at::kBool).unsqueeze(1));  // [B, T, S]
  if (pad_queries_see_themselves) {
    allowed = allowed.logical_or(allowed.any(-1, /*keepdim=*/true).logical_not().logical_and(self.unsqueeze(0)));
  }
  const double lowest = dtype == at::kBFloat16 ? -3.3895313892515355e38
                        : dtype == at::kHalf   ? -65504.0
                                               : static_cast<double>(std::numeric_limits<float>::lowest());
  return at::zeros(allowed.sizes(), at::TensorOptions().dtype(dtype).device(allowed.device()))
      .masked_fill(allowed.logical_not(), lowest)
      .unsqueeze(1);
}

}  // namespace strata::policies
