// `strata bench long`: one training step (forward, layer-wise recomputation
// and backward, CPU AdamW) over one long sequence, at each length asked for,
// with the attention materialised (the peer), blocked, or fused (libtorch's
// kernel, where it exists: policies/model/fused_attention.h), and the
// layers' kept inputs on the device (the peer), the host or NVMe: the
// step's time, the device tier's peak and the process's peak RSS, in the
// same run, on the CPU or a GPU.
#ifndef STRATA_BENCH_LONG_SEQUENCE_BENCH_H_
#define STRATA_BENCH_LONG_SEQUENCE_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::bench {

struct LongSequenceBenchRequest {
  // A Hugging Face config.json: the shape (random weights).
  std::string config;
  // > 0: this many decoder layers instead of the config's.
  int64_t layers = 0;
  // The weights' and activations' dtype: fp32 or bf16.
  std::string dtype = "fp32";
  std::vector<int64_t> tokens = {1024, 4096};
  // > 0: train LoRA adapters of this rank on every projection (alpha 2 x
  // rank, as a job's default) instead of every parameter.
  int64_t lora_rank = 0;
  // Modes to run, of "materialised", "blocked", "fused", "host", "nvme"
  // (the last two blocked, with activations off the device). "fused" is
  // skipped where this libtorch lacks the kernel.
  std::vector<std::string> modes = {"materialised", "blocked", "host", "nvme"};
  // The compute device: "cpu", "cuda" or "cuda:N".
  std::string device = "cpu";
  // Materialised attention is skipped where its scores alone would pass
  // this many bytes (it would swap or be killed).
  int64_t max_scores_bytes = int64_t{8} << 30;
  // Directory for NVMe activations; created if missing.
  std::string nvme_dir = "strata-bench-nvme";
  // Timed steps per mode after `warmup` untimed ones; the best is reported.
  int steps = 1;
  int warmup = 0;
  bool json = false;
};

absl::StatusOr<std::string> RunLongSequenceBench(const LongSequenceBenchRequest& request);

}  // namespace strata::bench

#endif  // STRATA_BENCH_LONG_SEQUENCE_BENCH_H_
