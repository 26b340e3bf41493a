#include "offload/adam/cpu_adam.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/engine_counters.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "offload/adam/cpu_adam_kernels.h"

namespace strata::offload {
namespace internal {

// A fixed set of threads that run one job at a time. The caller takes part
// as thread 0, so a pool of size 1 starts no thread at all. Workers sleep on
// a condition variable between jobs: an optimizer step is milliseconds to
// seconds of work, so a futex wake-up is noise, and spinning would steal the
// cores the rest of the training loop needs.
class WorkerPool {
 public:
  explicit WorkerPool(int threads) {
    workers_.reserve(static_cast<size_t>(threads - 1));
    for (int i = 1; i < threads; ++i) {
      workers_.emplace_back([this, i] { Loop(i); });
    }
  }

  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs job(index) once for every index in [0, size()) and returns when all
  // have returned. Not reentrant; the caller serialises.
  void Run(const std::function<void(int)>& job) {
    if (workers_.empty()) {
      job(0);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      pending_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    job(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void Loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      (*job)(index);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int)>* job_ = nullptr;  // guarded by mu_
  uint64_t generation_ = 0;                        // guarded by mu_
  int pending_ = 0;                                // guarded by mu_
  bool stop_ = false;                              // guarded by mu_
};

namespace {

float Bf16ToFloat(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// c10::BFloat16's round_to_nearest_even, including its canonical NaN.
uint16_t FloatToBf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace

// The reference every vector kernel must reproduce bit for bit. Each line is
// one ATen kernel of torch's AdamW/Adam step; std::fma marks the places where
// ATen's AVX2 kernels compute a fused multiply-add (add with alpha, addcmul),
// and everything else is rounded after every operation as torch does.
void AdamKernelScalar(const AdamKernelArgs& a) {
  for (int64_t i = 0; i < a.n; ++i) {
    float p = a.param[i];
    float g = a.grad != nullptr ? a.grad[i] : Bf16ToFloat(a.grad_bf16[i]);
    if (a.decay) p = p * a.decay_factor;        // p.mul_(1 - lr * wd)
    if (a.l2) g = std::fma(p, a.l2_factor, g);  // grad.add(p, wd)
    const float m = std::fma(g, a.one_minus_beta1, a.exp_avg[i] * a.beta1);
    const float v = std::fma(g * a.one_minus_beta2, g, a.exp_avg_sq[i] * a.beta2);
    const float denom = std::sqrt(v) / a.bias_correction2_sqrt + a.eps;
    p = p + (a.neg_step_size * m) / denom;  // p.addcdiv_(m, denom, -step_size)
    a.param[i] = p;
    a.exp_avg[i] = m;
    a.exp_avg_sq[i] = v;
    if (a.device_fp32 != nullptr) a.device_fp32[i] = p;
    if (a.device_bf16 != nullptr) a.device_bf16[i] = FloatToBf16(p);
  }
}

}  // namespace internal

namespace {

absl::Status CheckRange(const char* field, double value, double lo, bool lo_inclusive, double hi, bool hi_inclusive) {
  // Written so that NaN fails every comparison and is rejected.
  const bool lo_ok = lo_inclusive ? value >= lo : value > lo;
  const bool hi_ok = hi_inclusive ? value <= hi : value < hi;
  if (lo_ok && hi_ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " must be in ", lo_inclusive ? "[" : "(", lo, ", ", hi,
                                                 hi_inclusive ? "]" : ")", ", got ", value));
}

bool CpuHasAvx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

bool CpuHasAvx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

// Same length as param, or (for optional spans) empty.
template <typename T>
absl::Status CheckLength(const AdamTensorSpan& t, size_t index, const char* field, std::span<T> span, bool optional) {
  if (span.size() == t.param.size() || (optional && span.empty())) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("tensor ", index, " '", std::string(t.name), "': ", field, " has ",
                                                 span.size(), " elements, param has ", t.param.size()));
}

absl::Status CheckTensor(const AdamTensorSpan& t, size_t index) {
  if (t.step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", index, " '", std::string(t.name), "': step must be >= 1, got ", t.step));
  }
  if (t.grad.empty() == t.grad_bf16.empty() && !t.param.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", index, " '", std::string(t.name), "': exactly one of grad and grad_bf16 must be set"));
  }
  for (absl::Status s :
       {t.grad.empty() ? CheckLength(t, index, "grad_bf16", t.grad_bf16, false)
                       : CheckLength(t, index, "grad", t.grad, false),
        CheckLength(t, index, "exp_avg", t.exp_avg, false), CheckLength(t, index, "exp_avg_sq", t.exp_avg_sq, false),
        CheckLength(t, index, "device_bf16", t.device_bf16, true),
        CheckLength(t, index, "device_fp32", t.device_fp32, true)}) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AdamOptions::Validate() const {
  const double kInf = HUGE_VAL;
  STRATA_RETURN_IF_ERROR(CheckRange("lr", lr, 0, true, kInf, false));
  STRATA_RETURN_IF_ERROR(CheckRange("beta1", beta1, 0, true, 1, false));
  STRATA_RETURN_IF_ERROR(CheckRange("beta2", beta2, 0, true, 1, false));
  STRATA_RETURN_IF_ERROR(CheckRange("eps", eps, 0, false, kInf, false));
  return CheckRange("weight_decay", weight_decay, 0, true, kInf, false);
}

absl::Status CpuAdamOptions::Validate() const {
  STRATA_RETURN_IF_ERROR(adam.Validate());
  if (threads < 0 || threads > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("threads must be in [0, 4096], got ", threads));
  }
  switch (isa) {
    case AdamIsa::kAuto:
    case AdamIsa::kScalar:
    case AdamIsa::kAvx2:
    case AdamIsa::kAvx512:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("isa has an unknown value ", static_cast<int>(isa)));
  }
  if (grain < 1) return absl::InvalidArgumentError(absl::StrCat("grain must be >= 1, got ", grain));
  if (min_parallel_elements < 0) {
    return absl::InvalidArgumentError(absl::StrCat("min_parallel_elements must be >= 0, got ", min_parallel_elements));
  }
  return absl::OkStatus();
}

std::string AdamIsaName(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::kAuto:
      return "auto";
    case AdamIsa::kScalar:
      return "scalar";
    case AdamIsa::kAvx2:
      return "avx2";
    case AdamIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

absl::StatusOr<AdamIsa> ParseAdamIsa(std::string_view name) {
  for (AdamIsa isa : {AdamIsa::kAuto, AdamIsa::kScalar, AdamIsa::kAvx2, AdamIsa::kAvx512}) {
    if (name == AdamIsaName(isa)) return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("isa must be one of auto, scalar, avx2, avx512; got '", std::string(name), "'"));
}

bool AdamIsaSupported(AdamIsa isa) {
  switch (isa) {
    case AdamIsa::kAuto:
    case AdamIsa::kScalar:
      return true;
    case AdamIsa::kAvx2:
      return CpuHasAvx2();
    case AdamIsa::kAvx512:
      return CpuHasAvx512();
  }
  return false;
}

AdamIsa BestAdamIsa() {
  if (CpuHasAvx512()) return AdamIsa::kAvx512;
  if (CpuHasAvx2()) return AdamIsa::kAvx2;
  return AdamIsa::kScalar;
}

absl::StatusOr<std::unique_ptr<CpuAdam>> CpuAdam::Create(const CpuAdamOptions& options) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  const AdamIsa isa = options.isa == AdamIsa::kAuto ? BestAdamIsa() : options.isa;
  if (!AdamIsaSupported(isa)) {
    return absl::FailedPreconditionError(absl::StrCat("isa ", AdamIsaName(isa), " is not supported by this CPU"));
  }
  int threads = options.threads;
  if (threads == 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  STRATA_LOG(Info) << "CpuAdam: isa=" << AdamIsaName(isa) << " threads=" << threads
                   << (options.adam.decoupled ? " AdamW" : " Adam") << " lr=" << options.adam.lr
                   << " weight_decay=" << options.adam.weight_decay;
  return std::unique_ptr<CpuAdam>(new CpuAdam(options, isa, threads));
}

CpuAdam::CpuAdam(const CpuAdamOptions& options, AdamIsa isa, int threads)
    : config_(options),
      isa_(isa),
      threads_(threads),
      kernel_(isa == AdamIsa::kAvx512 ? &internal::AdamKernelAvx512
              : isa == AdamIsa::kAvx2 ? &internal::AdamKernelAvx2
                                      : &internal::AdamKernelScalar),
      pool_(std::make_unique<internal::WorkerPool>(threads)),
      lr_(options.adam.lr) {}

CpuAdam::~CpuAdam() = default;

AdamOptions CpuAdam::options() const {
  std::lock_guard<std::mutex> lock(mu_);
  AdamOptions o = config_.adam;
  o.lr = lr_;
  return o;
}

absl::Status CpuAdam::SetLearningRate(double lr) {
  AdamOptions o = config_.adam;
  o.lr = lr;
  STRATA_RETURN_IF_ERROR(o.Validate());
  std::lock_guard<std::mutex> lock(mu_);
  lr_ = lr;
  return absl::OkStatus();
}

absl::Status CpuAdam::ApplyDirection(std::span<const DirectionSpan> tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const DirectionSpan& t = tensors[i];
    const size_t n = t.param.size();
    if (t.direction.size() != n || (!t.device_bf16.empty() && t.device_bf16.size() != n) ||
        (!t.device_fp32.empty() && t.device_fp32.size() != n)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " '", std::string(t.name),
                                                     "': direction and device copies must have the param's ", n,
                                                     " elements"));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!config_.adam.decoupled) {
    return absl::FailedPreconditionError("a precomputed direction needs AdamW (decoupled weight decay)");
  }
  // As torch rounds them: p.mul_(1 - lr * wd), then p.add_(d, -lr) (fused).
  const float decay = static_cast<float>(1 - lr_ * config_.adam.weight_decay);
  const float neg_lr = static_cast<float>(-lr_);
  for (const DirectionSpan& t : tensors) {
    float* p = t.param.data();
    const float* d = t.direction.data();
    const int64_t n = static_cast<int64_t>(t.param.size());
    for (int64_t i = 0; i < n; ++i) p[i] = std::fma(d[i], neg_lr, p[i] * decay);
    if (!t.device_fp32.empty()) std::memcpy(t.device_fp32.data(), p, static_cast<size_t>(n) * sizeof(float));
    if (!t.device_bf16.empty()) {
      for (int64_t i = 0; i < n; ++i) t.device_bf16[static_cast<size_t>(i)] = internal::FloatToBf16(p[i]);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuAdam::Step(std::span<const AdamTensorSpan> tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    STRATA_RETURN_IF_ERROR(CheckTensor(tensors[i], i));
  }
  std::lock_guard<std::mutex> lock(mu_);
  const AdamOptions& o = config_.adam;

  // The constants are computed in double and rounded to float exactly where
  // torch turns a double Scalar into a float operand.
  std::vector<internal::AdamKernelArgs> args(tensors.size());
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamTensorSpan& t = tensors[i];
    internal::AdamKernelArgs& a = args[i];
    a.param = t.param.data();
    a.grad = t.grad.empty() ? nullptr : t.grad.data();
    a.grad_bf16 = t.grad_bf16.empty() ? nullptr : t.grad_bf16.data();
    a.exp_avg = t.exp_avg.data();
    a.exp_avg_sq = t.exp_avg_sq.data();
    a.device_bf16 = t.device_bf16.empty() ? nullptr : t.device_bf16.data();
    a.device_fp32 = t.device_fp32.empty() ? nullptr : t.device_fp32.data();
    a.n = static_cast<int64_t>(t.param.size());
    a.stream = config_.stream_device_copy;
    a.decay = o.decoupled && o.weight_decay != 0;
    a.l2 = !o.decoupled && o.weight_decay != 0;
    a.decay_factor = static_cast<float>(1 - lr_ * o.weight_decay);
    a.l2_factor = static_cast<float>(o.weight_decay);
    a.beta1 = static_cast<float>(o.beta1);
    a.one_minus_beta1 = static_cast<float>(1 - o.beta1);
    a.beta2 = static_cast<float>(o.beta2);
    a.one_minus_beta2 = static_cast<float>(1 - o.beta2);
    const double step = static_cast<double>(t.step);
    const double bias_correction1 = 1 - std::pow(o.beta1, step);
    const double bias_correction2 = 1 - std::pow(o.beta2, step);
    a.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
    a.eps = static_cast<float>(o.eps);
    a.neg_step_size = static_cast<float>(-(lr_ / bias_correction1));
    total += a.n;
  }
  if (total == 0) return absl::OkStatus();
  EngineCounters::Add(GlobalEngineCounters().adam_parameters, total);

  if (threads_ == 1 || total < config_.min_parallel_elements) {
    for (const auto& a : args) {
      if (a.n > 0) kernel_(a);
    }
    return absl::OkStatus();
  }

  // Work items are [offset, offset + grain) slices of one tensor, handed out
  // first come first served so a thread slowed by a neighbour on its core
  // does not hold the others up. Multiples of 64 elements keep every slice
  // of an aligned buffer aligned for the vector kernels.
  const int64_t grain = (config_.grain + 63) / 64 * 64;
  struct Item {
    size_t tensor;
    int64_t offset;
    int64_t n;
  };
  std::vector<Item> items;
  items.reserve(static_cast<size_t>(total / grain) + tensors.size());
  for (size_t i = 0; i < args.size(); ++i) {
    for (int64_t off = 0; off < args[i].n; off += grain) {
      items.push_back({i, off, std::min(grain, args[i].n - off)});
    }
  }
  if (items.size() == 1) {
    // One slice: waking the workers would cost more than it could save.
    kernel_(args[items[0].tensor]);
    return absl::OkStatus();
  }
  std::atomic<size_t> next{0};
  pool_->Run([&](int) {
    for (size_t k = next.fetch_add(1, std::memory_order_relaxed); k < items.size();
         k = next.fetch_add(1, std::memory_order_relaxed)) {
      const Item& item = items[k];
      internal::AdamKernelArgs a = args[item.tensor];
      a.param += item.offset;
      if (a.grad != nullptr) a.grad += item.offset;
      if (a.grad_bf16 != nullptr) a.grad_bf16 += item.offset;
      a.exp_avg += item.offset;
      a.exp_avg_sq += item.offset;
      if (a.device_bf16 != nullptr) a.device_bf16 += item.offset;
      if (a.device_fp32 != nullptr) a.device_fp32 += item.offset;
      a.n = item.n;
      kernel_(a);
    }
  });
  return absl::OkStatus();
}

}  // namespace strata::offload
