#include "bench/adam_bench.h"

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "bench/stats.h"
#include "offload/adam/cpu_adam.h"

namespace strata::bench {
namespace {

// Uninitialised, 64-byte aligned, freed on destruction. Aligned like the host
// arena's buffers, so the kernels' streamed stores take their fast path.
template <typename T>
class AlignedArray {
 public:
  explicit AlignedArray(int64_t n)
      : n_(static_cast<size_t>(n)), data_(static_cast<T*>(std::aligned_alloc(64, (n_ * sizeof(T) + 63) / 64 * 64))) {}
  ~AlignedArray() { std::free(data_); }
  AlignedArray(const AlignedArray&) = delete;
  AlignedArray& operator=(const AlignedArray&) = delete;
  bool ok() const { return data_ != nullptr; }
  T* data() const { return data_; }
  std::span<T> span() const { return {data_, n_}; }

 private:
  size_t n_;
  T* data_;
};

// Seconds of each of `repeats` timed calls of `a` and of `b`, after one
// untimed warm-up call of each (page faults, worker start-up, cold caches).
// The two alternate, so on a shared machine both see the same share of
// whatever else runs.
struct Timings {
  std::vector<double> a, b;
};
Timings TimeAlternating(int64_t repeats, const std::function<void()>& a, const std::function<void()>& b) {
  auto seconds = [](const std::function<void()>& run) {
    const auto start = std::chrono::steady_clock::now();
    run();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  a();
  b();
  Timings t;
  for (int64_t i = 0; i < repeats; ++i) {
    t.a.push_back(seconds(a));
    t.b.push_back(seconds(b));
  }
  return t;
}

double Best(const std::vector<double>& seconds) { return *std::min_element(seconds.begin(), seconds.end()); }

// The floor kernel: the loads and stores of an AdamW step with a streamed
// bf16 copy and no arithmetic: it writes back exactly what it read, so it can
// run between optimizer steps on the optimizer's own buffers. Like the Adam
// kernels it loads all four inputs before storing, because p, g, m and v sit
// at the same offset within their pages and a store to one followed by a load
// from the next would stall on 4 KiB aliasing and understate the floor.
struct FloorBuffers {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  uint16_t* bf16;  // may be null
};

void FloorScalar(const FloorBuffers& b, int64_t i, int64_t end) {
  for (; i < end; ++i) {
    float p = b.param[i], g = b.grad[i], m = b.exp_avg[i], v = b.exp_avg_sq[i];
    // An empty asm the compiler cannot see through: without it the
    // stores of unchanged values could be dropped as redundant.
    asm volatile("" : "+x"(p), "+x"(g), "+x"(m), "+x"(v));
    b.param[i] = p;
    b.exp_avg[i] = m;
    b.exp_avg_sq[i] = v;
    if (b.bf16 != nullptr) {
      uint32_t u;
      std::memcpy(&u, &p, sizeof(u));
      b.bf16[i] = static_cast<uint16_t>(u >> 16);
    }
  }
}

__attribute__((target("avx512f"))) void FloorAvx512(const FloorBuffers& b, int64_t begin, int64_t end) {
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __m512 p = _mm512_loadu_ps(b.param + i), g = _mm512_loadu_ps(b.grad + i);
    __m512 m = _mm512_loadu_ps(b.exp_avg + i), v = _mm512_loadu_ps(b.exp_avg_sq + i);
    asm volatile("" : "+v"(p), "+v"(g), "+v"(m), "+v"(v));
    _mm512_storeu_ps(b.param + i, p);
    _mm512_storeu_ps(b.exp_avg + i, m);
    _mm512_storeu_ps(b.exp_avg_sq + i, v);
    if (b.bf16 != nullptr) {
      // maskz forms: GCC 12's plain AVX-512 shift and narrowing intrinsics
      // trip -Wmaybe-uninitialized on their internal "undefined" operand.
      const __m512i hi = _mm512_maskz_srli_epi32(0xFFFF, _mm512_castps_si512(p), 16);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(b.bf16 + i), _mm512_maskz_cvtepi32_epi16(0xFFFF, hi));
    }
  }
  FloorScalar(b, i, end);
}

__attribute__((target("avx2"))) void FloorAvx2(const FloorBuffers& b, int64_t begin, int64_t end) {
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 p = _mm256_loadu_ps(b.param + i), g = _mm256_loadu_ps(b.grad + i);
    __m256 m = _mm256_loadu_ps(b.exp_avg + i), v = _mm256_loadu_ps(b.exp_avg_sq + i);
    asm volatile("" : "+x"(p), "+x"(g), "+x"(m), "+x"(v));
    _mm256_storeu_ps(b.param + i, p);
    _mm256_storeu_ps(b.exp_avg + i, m);
    _mm256_storeu_ps(b.exp_avg_sq + i, v);
    if (b.bf16 != nullptr) {
      const __m256i hi = _mm256_srli_epi32(_mm256_castps_si256(p), 16);
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(hi, hi), 0x08);
      _mm_stream_si128(reinterpret_cast<__m128i*>(b.bf16 + i), _mm256_castsi256_si128(packed));
    }
  }
  FloorScalar(b, i, end);
}

// One pass of the floor kernel over [0, n) on `threads` threads, which take
// 64K-element slices first come first served, as CpuAdam's threads do, so a
// thread slowed by a neighbour on its core holds up neither side more than
// the other. Starting the threads (tens of microseconds against a pass of
// tens of milliseconds at the default size) is counted against the floor:
// if anything it flatters floor_fraction by that much.
void FloorPass(const FloorBuffers& b, int64_t n, int threads) {
  constexpr int64_t kSlice = 64 * 1024;
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2");
  std::atomic<int64_t> next{0};
  auto run = [&] {
    for (int64_t begin = next.fetch_add(kSlice); begin < n; begin = next.fetch_add(kSlice)) {
      const int64_t end = std::min(n, begin + kSlice);
      if (avx512) {
        FloorAvx512(b, begin, end);
      } else if (avx2) {
        FloorAvx2(b, begin, end);
      } else {
        FloorScalar(b, begin, end);
      }
    }
    _mm_sfence();
  };
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t) workers.emplace_back(run);
  run();
  for (auto& w : workers) w.join();
}

}  // namespace

absl::StatusOr<std::string> RunAdamBench(const AdamBenchRequest& r) {
  if (r.params < 1 || r.steps < 1) return absl::InvalidArgumentError("--params and --steps must be >= 1");
  if (r.threads < 0) return absl::InvalidArgumentError(absl::StrCat("--threads must be >= 0, got ", r.threads));
  auto isa = offload::ParseAdamIsa(r.isa);
  if (!isa.ok()) return isa.status();

  offload::CpuAdamOptions options;  // torch's AdamW defaults: lr 1e-3, wd 1e-2
  options.threads = r.threads;
  options.isa = *isa;
  STRATA_ASSIGN_OR_RETURN(auto created, offload::CpuAdam::Create(options));
  offload::CpuAdam& adam = *created;
  const int threads = adam.threads();
  const int64_t n = r.params;
  const double bytes_per_param = 28 + (r.bf16_copy ? 2 : 0);

  AlignedArray<float> param(n), grad(n), exp_avg(n), exp_avg_sq(n);
  AlignedArray<uint16_t> bf16(r.bf16_copy ? n : 0);
  if (!param.ok() || !grad.ok() || !exp_avg.ok() || !exp_avg_sq.ok() || (r.bf16_copy && !bf16.ok())) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate buffers for ", n, " parameters"));
  }
  // The same starting point for both optimizers; this also faults in every
  // page before anything is timed.
  const int previous_torch_threads = at::get_num_threads();
  at::set_num_threads(threads);
  torch::manual_seed(1234);
  torch::Tensor torch_param = torch::randn({n});
  torch::Tensor torch_grad = torch::randn({n}) * 1e-2;
  std::memcpy(param.data(), torch_param.data_ptr<float>(), static_cast<size_t>(n) * sizeof(float));
  std::memcpy(grad.data(), torch_grad.data_ptr<float>(), static_cast<size_t>(n) * sizeof(float));
  std::memset(exp_avg.data(), 0, static_cast<size_t>(n) * sizeof(float));
  std::memset(exp_avg_sq.data(), 0, static_cast<size_t>(n) * sizeof(float));
  if (r.bf16_copy) std::memset(bf16.data(), 0, static_cast<size_t>(n) * sizeof(uint16_t));

  // Ours and the floor, on the same buffers (the floor kernel leaves them
  // unchanged), one step or pass per timing. Step numbers run on across the
  // warm-up and timed steps, exactly as torch's state.step does below, so the
  // final weights compare.
  const FloorBuffers floor_buffers{param.data(), grad.data(), exp_avg.data(), exp_avg_sq.data(),
                                   r.bf16_copy ? bf16.data() : nullptr};
  int64_t our_step = 0;
  absl::Status step_status;
  // The floor goes first in each pair: its bf16 copy is a plain truncation,
  // and the last word in the buffers must be ours.
  const Timings floor_and_ours = TimeAlternating(
      r.steps, [&] { FloorPass(floor_buffers, n, threads); },
      [&] {
        offload::AdamTensorSpan t;
        t.name = "bench";
        t.param = param.span();
        t.grad = grad.span();
        t.exp_avg = exp_avg.span();
        t.exp_avg_sq = exp_avg_sq.span();
        if (r.bf16_copy) t.device_bf16 = bf16.span();
        t.step = ++our_step;
        if (step_status.ok()) step_status = adam.Step(t);
      });
  if (!step_status.ok()) {
    at::set_num_threads(previous_torch_threads);
    return step_status;
  }

  // torch::optim::AdamW, plus a bf16 copy of the weights when ours makes
  // one, so both do the same job.
  torch_param.set_requires_grad(true);
  torch_param.mutable_grad() = torch_grad;
  torch::optim::AdamW torch_adam({torch_param}, torch::optim::AdamWOptions(options.adam.lr)
                                                    .betas(std::make_tuple(options.adam.beta1, options.adam.beta2))
                                                    .eps(options.adam.eps)
                                                    .weight_decay(options.adam.weight_decay));
  torch::Tensor torch_bf16 = torch::empty({r.bf16_copy ? n : 0}, torch::kBFloat16);
  auto torch_step = [&] {
    torch_adam.step();
    if (r.bf16_copy) {
      torch::NoGradGuard no_grad;
      torch_bf16.copy_(torch_param);
    }
  };
  const std::vector<double> torch_s = TimeAlternating(r.steps, torch_step, [] {}).a;
  at::set_num_threads(previous_torch_threads);

  // Agreement after the same number of steps from the same start.
  const float* theirs = torch_param.data_ptr<float>();
  double max_abs_diff = 0;
  int64_t params_differing = 0, bf16_differing = 0;
  for (int64_t i = 0; i < n; ++i) {
    max_abs_diff = std::max(max_abs_diff, std::fabs(static_cast<double>(param.data()[i]) - theirs[i]));
    params_differing += std::memcmp(&param.data()[i], &theirs[i], sizeof(float)) != 0;
  }
  if (r.bf16_copy) {
    const auto* their_bf16 = static_cast<const uint16_t*>(torch_bf16.data_ptr());
    for (int64_t i = 0; i < n; ++i) bf16_differing += bf16.data()[i] != their_bf16[i];
  }

  // Mparams/s from the best (and, to show the spread, the median) step.
  const double mparams = static_cast<double>(n) / 1e6;
  const double ours = mparams / Best(floor_and_ours.b);
  const double torch_rate = mparams / Best(torch_s);
  const double floor = mparams / Best(floor_and_ours.a);
  const double ours_median = mparams / Median(floor_and_ours.b);
  const double floor_median = mparams / Median(floor_and_ours.a);
  const double bandwidth_gbps = floor * 1e6 * bytes_per_param / 1e9;
  nlohmann::json j{{"ours_mparams_per_s", ours},
                   {"torch_mparams_per_s", torch_rate},
                   {"speedup", ours / torch_rate},
                   {"floor_mparams_per_s", floor},
                   {"floor_fraction", ours / floor},
                   {"max_abs_diff", max_abs_diff},
                   {"params_differing", params_differing},
                   {"bf16_differing", bf16_differing},
                   {"isa", offload::AdamIsaName(adam.isa())},
                   {"threads", threads},
                   {"ours_median_mparams_per_s", ours_median},
                   {"floor_median_mparams_per_s", floor_median},
                   {"params", n},
                   {"steps", r.steps},
                   {"bf16_copy", r.bf16_copy},
                   {"bytes_per_param", bytes_per_param},
                   {"bandwidth_gbps", bandwidth_gbps},
                   {"ours_gbps", ours * 1e6 * bytes_per_param / 1e9}};
  if (r.json) return j.dump() + "\n";
  return absl::StrFormat(
      "AdamW step on %d fp32 params%s, best of %d steps (median in brackets), %d threads, isa %s\n"
      "  ours (CpuAdam)         %9.1f Mparams/s  [%.1f]  %.1f GB/s\n"
      "  torch::optim::AdamW    %9.1f Mparams/s           ours is %.2fx\n"
      "  memory floor           %9.1f Mparams/s  [%.1f]  %.1f GB/s at %.0f B/param; ours reaches %.1f%%\n"
      "  max |ours - torch|     %9.3g             %d of %d weights differ in any bit, %d bf16 copies\n",
      n, r.bf16_copy ? " + bf16 copy" : "", r.steps, threads, offload::AdamIsaName(adam.isa()), ours, ours_median,
      ours * bytes_per_param / 1e3, torch_rate, ours / torch_rate, floor, floor_median, bandwidth_gbps, bytes_per_param,
      100 * ours / floor, max_abs_diff, params_differing, n, bf16_differing);
}

}  // namespace strata::bench
