// The CPU Adam kernels, one per instruction set, each in its own
// translation unit (compiled with its own -m flags). Private to
// offload/adam: callers use CpuAdam.
#ifndef STRATA_OFFLOAD_ADAM_CPU_ADAM_KERNELS_H_
#define STRATA_OFFLOAD_ADAM_CPU_ADAM_KERNELS_H_

#include <cstdint>

namespace strata::offload {

namespace internal {
// Everything one kernel call needs, with the per-step constants already
// rounded to float exactly where torch rounds them.
struct AdamKernelArgs {
  float* param = nullptr;
  const float* grad = nullptr;  // or
  const uint16_t* grad_bf16 = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  uint16_t* device_bf16 = nullptr;  // optional
  float* device_fp32 = nullptr;     // optional
  int64_t n = 0;
  bool decay = false;            // multiply param by `decay_factor` first (AdamW)
  bool l2 = false;               // grad += l2_factor * param (Adam)
  bool stream = false;           // non-temporal stores for the device copies
  float decay_factor = 1.0f;     // float(1 - lr * weight_decay)
  float l2_factor = 0.0f;        // float(weight_decay)
  float beta1 = 0.0f;            // float(beta1)
  float one_minus_beta1 = 0.0f;  // float(1 - beta1)
  float beta2 = 0.0f;
  float one_minus_beta2 = 0.0f;
  float bias_correction2_sqrt = 1.0f;  // float(sqrt(1 - beta2^step))
  float eps = 0.0f;
  float neg_step_size = 0.0f;  // float(-lr / (1 - beta1^step))
};
void AdamKernelScalar(const AdamKernelArgs& args);
void AdamKernelAvx2(const AdamKernelArgs& args);
void AdamKernelAvx512(const AdamKernelArgs& args);
}  // namespace internal

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_ADAM_CPU_ADAM_KERNELS_H_
