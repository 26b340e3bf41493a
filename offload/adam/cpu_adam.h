// CPU Adam / AdamW for optimizer states that live in host memory
// (ZeRO-Offload style): fp32 master weights, exp_avg and exp_avg_sq are
// updated in place from fp32 (or bf16) gradients, and the updated weights can
// be written out as a bf16 or fp32 "device copy" in the same pass, so every
// byte is touched once per step.
//
// The arithmetic follows torch::optim::AdamW / torch::optim::Adam of PyTorch
// 1.13 operation by operation (same float constants, same roundings, fused
// multiply-adds where ATen's kernels fuse them), so results match torch to
// the last bit on the x86-64 builds we checked; see cpu_adam_test.cc.
//
// The core works on raw float spans and knows nothing of torch.
#ifndef STRATA_OFFLOAD_ADAM_CPU_ADAM_H_
#define STRATA_OFFLOAD_ADAM_CPU_ADAM_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::offload {

// Hyperparameters, with torch's defaults except weight_decay (torch's AdamW
// default is 0.01 too; its Adam default is 0).
struct AdamOptions {
  // Learning rate; >= 0.
  double lr = 1e-3;
  // Decay of the first-moment average; in [0, 1).
  double beta1 = 0.9;
  // Decay of the second-moment average; in [0, 1).
  double beta2 = 0.999;
  // Added to the denominator for numerical stability; > 0.
  double eps = 1e-8;
  // Weight decay coefficient; >= 0. 0 turns decay off.
  double weight_decay = 0.01;
  // true: AdamW, decoupled decay p *= 1 - lr * weight_decay before the step.
  // false: Adam with L2 decay, grad += weight_decay * p.
  bool decoupled = true;

  // INVALID_ARGUMENT naming the first offending field.
  absl::Status Validate() const;
};

// The instruction set a CpuAdam runs on. Every ISA produces bit-identical
// results; they differ only in speed.
enum class AdamIsa {
  kAuto,    // the widest one this CPU supports
  kScalar,  // portable C++, any x86-64 (or other) CPU
  kAvx2,    // AVX2 + FMA
  kAvx512,  // AVX-512 F + BW + VL
};

// "auto", "scalar", "avx2", "avx512".
std::string AdamIsaName(AdamIsa isa);
// Parses the names above; INVALID_ARGUMENT for anything else.
absl::StatusOr<AdamIsa> ParseAdamIsa(std::string_view name);
// Whether this CPU (and OS) can run `isa`. kAuto and kScalar: always true.
bool AdamIsaSupported(AdamIsa isa);
// The widest supported ISA (never kAuto).
AdamIsa BestAdamIsa();

struct CpuAdamOptions {
  // Hyperparameters; the learning rate can be changed later (SetLearningRate).
  AdamOptions adam;
  // Threads that share each Step, the calling thread included; 0 means
  // std::thread::hardware_concurrency(). threads - 1 workers are started once
  // in Create and sleep between steps.
  int threads = 0;
  // ISA to run; kAuto picks BestAdamIsa(). Forcing an ISA the CPU lacks makes
  // Create fail with FAILED_PRECONDITION.
  AdamIsa isa = AdamIsa::kAuto;
  // Elements per work item handed to a thread (rounded up to 64). Large
  // enough to amortise scheduling, small enough to balance threads.
  int64_t grain = 64 * 1024;
  // Updates smaller than this many elements in total run on the calling
  // thread only: waking workers costs more than it saves.
  int64_t min_parallel_elements = 128 * 1024;
  // Write the device copy (bf16/fp32 output) with non-temporal stores. It is
  // write-only here and read next by a copy to the GPU, so keeping it out of
  // the cache saves a read-for-ownership per line.
  bool stream_device_copy = true;

  absl::Status Validate() const;
};

// One parameter tensor, or one [offset, offset + n) tile of it: all spans
// below have the same length n, except the optional device copies, which are
// empty or length n. Spans must not overlap each other.
struct AdamTensorSpan {
  // Names the tensor in error messages; may be empty.
  std::string_view name;
  // fp32 master weights, updated in place.
  std::span<float> param;
  // Gradient: exactly one of grad (fp32) or grad_bf16 (bf16 bit patterns).
  std::span<const float> grad;
  std::span<const uint16_t> grad_bf16;
  // Optimizer states, updated in place; start as zeros like torch's.
  std::span<float> exp_avg;
  std::span<float> exp_avg_sq;
  // Optional copies of the updated weights: bf16 rounded to nearest even
  // (NaN becomes 0x7FC0, as c10::BFloat16 does), or fp32.
  std::span<uint16_t> device_bf16;
  std::span<float> device_fp32;
  // The number this update makes the tensor's step count: 1 for its first
  // update (torch's state.step after the increment). The caller keeps one
  // count per tensor and passes the same value for every tile of a tensor in
  // one optimizer step, which makes a tiled update bit-identical to a whole
  // one.
  int64_t step = 0;
};

// A tensor (or tile) whose update direction was computed elsewhere
// (GaLore's projected-back step): ApplyDirection sets
// param = param * (1 - lr * weight_decay) - lr * direction, AdamW's decay
// and step with the optimizer's current hyperparameters, and writes the
// device copies in the same pass. Same span rules as AdamTensorSpan.
struct DirectionSpan {
  std::string_view name;
  std::span<float> param;
  std::span<const float> direction;
  std::span<uint16_t> device_bf16;
  std::span<float> device_fp32;
};

namespace internal {
struct AdamKernelArgs;  // the per-ISA kernels' arguments: cpu_adam_kernels.h
class WorkerPool;
}  // namespace internal

// Thread-safe: concurrent Step calls are serialised (each already uses every
// thread). The spans passed to Step are borrowed for the call only.
class CpuAdam {
 public:
  static absl::StatusOr<std::unique_ptr<CpuAdam>> Create(const CpuAdamOptions& options);
  ~CpuAdam();
  CpuAdam(const CpuAdam&) = delete;
  CpuAdam& operator=(const CpuAdam&) = delete;

  // Applies one update to every tensor (or tile) in `tensors`, each at its own
  // step number, in one parallel pass. Checks all spans first: on
  // INVALID_ARGUMENT (mismatched lengths, both or neither gradient, step < 1)
  // nothing has been modified.
  absl::Status Step(std::span<const AdamTensorSpan> tensors);
  absl::Status Step(const AdamTensorSpan& tensor) { return Step(std::span<const AdamTensorSpan>(&tensor, 1)); }

  // Applies each direction as DirectionSpan says (AdamW only: decoupled
  // decay; FAILED_PRECONDITION otherwise). Checks all spans first.
  absl::Status ApplyDirection(std::span<const DirectionSpan> tensors);

  // For learning-rate schedules; INVALID_ARGUMENT if negative.
  absl::Status SetLearningRate(double lr);

  AdamOptions options() const;
  AdamIsa isa() const { return isa_; }  // never kAuto
  int threads() const { return threads_; }

 private:
  CpuAdam(const CpuAdamOptions& options, AdamIsa isa, int threads);

  const CpuAdamOptions config_;
  const AdamIsa isa_;
  const int threads_;
  void (*const kernel_)(const internal::AdamKernelArgs&);
  std::unique_ptr<internal::WorkerPool> pool_;
  mutable std::mutex mu_;  // serialises Step and guards lr_
  double lr_;
};

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_ADAM_CPU_ADAM_H_
