#include "policies/rollout/paged_attention.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#define STRATA_AVX2 __attribute__((target("avx2,fma")))
#endif

namespace strata::policies {

namespace {

float DotScalar(const float* a, const float* b, int64_t n) {
  float lanes[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int l = 0; l < 4; ++l) lanes[l] += a[i + l] * b[i + l];
  }
  float sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void AxpyScalar(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

#if defined(__x86_64__)
STRATA_AVX2 float DotAvx2(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

STRATA_AVX2 void AxpyAvx2(float alpha, const float* x, float* y, int64_t n) {
  const __m256 a = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#endif

struct Kernels {
  float (*dot)(const float*, const float*, int64_t) = DotScalar;
  void (*axpy)(float, const float*, float*, int64_t) = AxpyScalar;
};

Kernels PickKernels() {
  Kernels k;
#if defined(__x86_64__)
  if (HasAvx2()) k.dot = DotAvx2, k.axpy = AxpyAvx2;
#endif
  return k;
}

// A row of d values as float32: the row itself, or its conversion in `buffer`.
const float* AsFloat(const float* row, int64_t /*d*/, float* /*buffer*/) { return row; }
const float* AsFloat(const c10::BFloat16* row, int64_t d, float* buffer) {
  for (int64_t i = 0; i < d; ++i) buffer[i] = static_cast<float>(row[i]);
  return buffer;
}

template <typename T>
void Attend(const T* q, const T* keys, const T* values, const int64_t* slots, const std::vector<int64_t>& first,
            int64_t columns, int64_t n_h, int64_t n_kv, int64_t d, float scale, int64_t window, float* out) {
  const auto rows = static_cast<int64_t>(first.size());
  const int64_t groups = n_h / n_kv;
  const Kernels kernels = PickKernels();
  at::parallel_for(0, rows * n_kv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query(static_cast<size_t>(groups * d)), scores, row(static_cast<size_t>(d));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / n_kv, h = task % n_kv;
      const int64_t* seq = slots + b * columns + first[static_cast<size_t>(b)];
      const int64_t length = columns - first[static_cast<size_t>(b)];
      // The query (position length - 1) sees position j > length - 1 - window.
      const int64_t from = window > 0 ? std::max<int64_t>(0, length - window) : 0;
      for (int64_t g = 0; g < groups; ++g) {
        const T* src = q + (b * n_h + h * groups + g) * d;
        float* dst = query.data() + g * d;
        for (int64_t i = 0; i < d; ++i) dst[i] = static_cast<float>(src[i]) * scale;
      }
      const int64_t seen = length - from;
      scores.assign(static_cast<size_t>(groups * seen), 0.0f);
      for (int64_t j = 0; j < seen; ++j) {
        const float* k = AsFloat(keys + (seq[from + j] * n_kv + h) * d, d, row.data());
        for (int64_t g = 0; g < groups; ++g)
          scores[static_cast<size_t>(g * seen + j)] = kernels.dot(query.data() + g * d, k, d);
      }
      float* o = out + (b * n_h + h * groups) * d;
      std::fill(o, o + groups * d, 0.0f);
      std::vector<float> total(static_cast<size_t>(groups));
      for (int64_t g = 0; g < groups; ++g) {
        float* s = scores.data() + g * seen;
        const float top = *std::max_element(s, s + seen);
        float sum = 0;
        for (int64_t j = 0; j < seen; ++j) sum += (s[j] = std::exp(s[j] - top));
        total[static_cast<size_t>(g)] = sum;
      }
      for (int64_t j = 0; j < seen; ++j) {
        const float* v = AsFloat(values + (seq[from + j] * n_kv + h) * d, d, row.data());
        for (int64_t g = 0; g < groups; ++g) kernels.axpy(scores[static_cast<size_t>(g * seen + j)], v, o + g * d, d);
      }
      for (int64_t g = 0; g < groups; ++g) {
        const float inverse = 1.0f / total[static_cast<size_t>(g)];
        for (int64_t i = 0; i < d; ++i) o[g * d + i] *= inverse;
      }
    }
  });
}

}  // namespace

at::Tensor PagedDecodeAttention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                                const int64_t* slots, const std::vector<int64_t>& first, int64_t columns, double scale,
                                int64_t sliding_window) {
  TORCH_CHECK(q.device().is_cpu() && keys.device().is_cpu(), "paged attention runs on the CPU");
  TORCH_CHECK(q.scalar_type() == keys.scalar_type(), "paged attention: q and the pool differ in dtype");
  const at::Tensor query = q.contiguous();
  const int64_t rows = q.size(0), n_h = q.size(1), d = q.size(2), n_kv = keys.size(1);
  TORCH_CHECK(rows == static_cast<int64_t>(first.size()) && n_h % n_kv == 0 && keys.size(2) == d,
              "paged attention: shapes do not agree");
  at::Tensor out = at::empty({rows, n_h, d}, at::kFloat);
  const auto s = static_cast<float>(scale);
  if (q.scalar_type() == at::kFloat) {
    Attend(query.data_ptr<float>(), keys.data_ptr<float>(), values.data_ptr<float>(), slots, first, columns, n_h, n_kv,
           d, s, sliding_window, out.data_ptr<float>());
  } else {
    TORCH_CHECK(q.scalar_type() == at::kBFloat16, "paged attention: fp32 or bf16, got ", q.scalar_type());
    Attend(query.data_ptr<c10::BFloat16>(), keys.data_ptr<c10::BFloat16>(), values.data_ptr<c10::BFloat16>(), slots,
           first, columns, n_h, n_kv, d, s, sliding_window, out.data_ptr<float>());
  }
  return out;
}

}  // namespace strata::policies
