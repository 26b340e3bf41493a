// The AVX-512 Adam kernel: 16 floats per vector. Compiled with a per-function
// target attribute, not a global -mavx512f, so the library still runs on CPUs
// without AVX-512; CpuAdam calls it only after checking the CPU.
//
// It must stay bit-identical to AdamKernelScalar: the same operations in the
// same order, FMA exactly where the scalar code calls std::fma, and true
// division and square root (no reciprocal approximations).

// GCC 12's AVX-512 intrinsics seed results with a self-initialised
// "undefined" vector, which -Wall reports as uninitialised once inlined (a
// known false positive of GCC 12's headers, gone in later releases); the
// warning is about the header, not this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "offload/adam/cpu_adam_kernels.h"

#define STRATA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

namespace strata::offload::internal {
namespace {

constexpr int64_t kLanes = 16;

struct Constants {
  __m512 decay, l2, beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps, neg_step_size;
};

// Pointers to one block of kLanes elements.
struct Block {
  float* param;
  const float* grad;
  const uint16_t* grad_bf16;
  float* exp_avg;
  float* exp_avg_sq;
  uint16_t* device_bf16;
  float* device_fp32;
};

STRATA_AVX512 inline __m256i ToBf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

STRATA_AVX512 inline void UpdateBlock(const AdamKernelArgs& a, const Constants& c, const Block& b, bool stream_bf16,
                                      bool stream_fp32) {
  __m512 p = _mm512_loadu_ps(b.param);
  __m512 g;
  if (b.grad != nullptr) {
    g = _mm512_loadu_ps(b.grad);
  } else {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.grad_bf16));
    g = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  }
  if (a.decay) p = _mm512_mul_ps(p, c.decay);
  if (a.l2) g = _mm512_fmadd_ps(p, c.l2, g);
  const __m512 m = _mm512_fmadd_ps(g, c.one_minus_beta1, _mm512_mul_ps(_mm512_loadu_ps(b.exp_avg), c.beta1));
  const __m512 v = _mm512_fmadd_ps(_mm512_mul_ps(g, c.one_minus_beta2), g,
                                   _mm512_mul_ps(_mm512_loadu_ps(b.exp_avg_sq), c.beta2));
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), c.bias_correction2_sqrt), c.eps);
  p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(c.neg_step_size, m), denom));
  _mm512_storeu_ps(b.param, p);
  _mm512_storeu_ps(b.exp_avg, m);
  _mm512_storeu_ps(b.exp_avg_sq, v);
  if (b.device_fp32 != nullptr) {
    if (stream_fp32) {
      _mm512_stream_ps(b.device_fp32, p);
    } else {
      _mm512_storeu_ps(b.device_fp32, p);
    }
  }
  if (b.device_bf16 != nullptr) {
    __m256i* out = reinterpret_cast<__m256i*>(b.device_bf16);
    if (stream_bf16) {
      _mm256_stream_si256(out, ToBf16(p));
    } else {
      _mm256_storeu_si256(out, ToBf16(p));
    }
  }
}

Block BlockAt(const AdamKernelArgs& a, int64_t i) {
  return {a.param + i,
          a.grad != nullptr ? a.grad + i : nullptr,
          a.grad_bf16 != nullptr ? a.grad_bf16 + i : nullptr,
          a.exp_avg + i,
          a.exp_avg_sq + i,
          a.device_bf16 != nullptr ? a.device_bf16 + i : nullptr,
          a.device_fp32 != nullptr ? a.device_fp32 + i : nullptr};
}

// Fewer than kLanes elements: staged through zero-padded stack copies so the
// one vector body serves heads and tails too (the padding lanes compute
// harmless values that are never copied back).
STRATA_AVX512 void UpdatePartial(const AdamKernelArgs& a, const Constants& c, int64_t i, int64_t n) {
  alignas(64) float param[kLanes] = {}, grad[kLanes] = {}, exp_avg[kLanes] = {}, exp_avg_sq[kLanes] = {},
                    device_fp32[kLanes] = {};
  alignas(64) uint16_t grad_bf16[kLanes] = {}, device_bf16[kLanes] = {};
  const Block src = BlockAt(a, i);
  const size_t f = static_cast<size_t>(n) * sizeof(float), h = static_cast<size_t>(n) * sizeof(uint16_t);
  std::memcpy(param, src.param, f);
  if (src.grad != nullptr) std::memcpy(grad, src.grad, f);
  if (src.grad_bf16 != nullptr) std::memcpy(grad_bf16, src.grad_bf16, h);
  std::memcpy(exp_avg, src.exp_avg, f);
  std::memcpy(exp_avg_sq, src.exp_avg_sq, f);
  const Block tmp{param,
                  src.grad != nullptr ? grad : nullptr,
                  src.grad_bf16 != nullptr ? grad_bf16 : nullptr,
                  exp_avg,
                  exp_avg_sq,
                  src.device_bf16 != nullptr ? device_bf16 : nullptr,
                  src.device_fp32 != nullptr ? device_fp32 : nullptr};
  UpdateBlock(a, c, tmp, false, false);
  std::memcpy(src.param, param, f);
  std::memcpy(src.exp_avg, exp_avg, f);
  std::memcpy(src.exp_avg_sq, exp_avg_sq, f);
  if (src.device_fp32 != nullptr) std::memcpy(src.device_fp32, device_fp32, f);
  if (src.device_bf16 != nullptr) std::memcpy(src.device_bf16, device_bf16, h);
}

// Elements to process before `ptr` (holding elements of `size` bytes) reaches
// an `align`-byte boundary, or -1 if it never can.
int64_t HeadToAlign(const void* ptr, size_t size, size_t align) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  if (addr % size != 0) return -1;
  return static_cast<int64_t>(((align - addr % align) % align) / size);
}

}  // namespace

STRATA_AVX512 void AdamKernelAvx512(const AdamKernelArgs& a) {
  const Constants c{
      _mm512_set1_ps(a.decay_factor),          _mm512_set1_ps(a.l2_factor), _mm512_set1_ps(a.beta1),
      _mm512_set1_ps(a.one_minus_beta1),       _mm512_set1_ps(a.beta2),     _mm512_set1_ps(a.one_minus_beta2),
      _mm512_set1_ps(a.bias_correction2_sqrt), _mm512_set1_ps(a.eps),       _mm512_set1_ps(a.neg_step_size)};
  // Non-temporal stores need aligned addresses: peel a head so the device
  // copy (bf16 preferred, it is the common one) is aligned in the main loop.
  int64_t head = 0;
  bool stream_bf16 = false, stream_fp32 = false;
  if (a.stream && (a.device_bf16 != nullptr || a.device_fp32 != nullptr)) {
    head = a.device_bf16 != nullptr ? HeadToAlign(a.device_bf16, sizeof(uint16_t), 32)
                                    : HeadToAlign(a.device_fp32, sizeof(float), 64);
    if (head < 0) head = 0;
    head = std::min(head, a.n);
    stream_bf16 = a.device_bf16 != nullptr && HeadToAlign(a.device_bf16 + head, sizeof(uint16_t), 32) == 0;
    stream_fp32 = a.device_fp32 != nullptr && HeadToAlign(a.device_fp32 + head, sizeof(float), 64) == 0;
  }
  if (head > 0) UpdatePartial(a, c, 0, head);
  int64_t i = head;
  for (; i + kLanes <= a.n; i += kLanes) {
    UpdateBlock(a, c, BlockAt(a, i), stream_bf16, stream_fp32);
  }
  if (i < a.n) UpdatePartial(a, c, i, a.n - i);
  // Streamed stores are weakly ordered: fence before the caller signals
  // another thread (or a DMA engine) that the copy is ready.
  if (stream_bf16 || stream_fp32) _mm_sfence();
}

}  // namespace strata::offload::internal
