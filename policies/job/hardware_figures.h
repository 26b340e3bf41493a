// What a machine does per second, as `strata bench figures` measured it:
// the figures the planner's cost model turns into phase times. A JSON file
// written on the machine (or one like it) and read by `strata plan`.
#ifndef STRATA_POLICIES_JOB_HARDWARE_FIGURES_H_
#define STRATA_POLICIES_JOB_HARDWARE_FIGURES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::policies {

// Matrix-multiply throughput of [m, k] x [k, k] at one (m, k), in flop/s.
struct MatmulPoint {
  int64_t m = 0;
  int64_t k = 0;
  double flops = 0.0;
};

struct HardwareFigures {
  std::string machine;  // free text: where the figures were measured
  std::string source;   // the file they were read from ("" when built in)
  // Per model dtype ("fp32", "bf16"): measured points over m and k.
  std::vector<MatmulPoint> matmul_fp32, matmul_bf16;
  // Fixed cost of one tensor operation (dispatch, allocation, threads), s.
  double op_overhead_s = 0.0;
  // Fixed cost of one decoder layer's forward (its ~30 operations) and of
  // one generation step besides its layers (head, sampling, bookkeeping),
  // both measured on a minimal model where the arithmetic is negligible.
  double layer_overhead_s = 0.0;
  double decode_step_overhead_s = 0.0;
  double memory_copy_bytes_per_s = 0.0;  // within the compute device's memory
  // Decoder layers streamed by the offload engine (LayerStreamer) from the
  // host arena and from NVMe: bytes per second of passes over 7B-sized
  // layers with no compute between (how they overlap compute is the
  // planner's to model).
  double host_stream_bytes_per_s = 0.0;
  double nvme_stream_bytes_per_s = 0.0;
  double nvme_read_bytes_per_s = 0.0;  // the NVMe store, O_DIRECT
  double nvme_write_bytes_per_s = 0.0;
  double adam_params_per_s = 0.0;         // CPU AdamW over host states
  double device_adam_params_per_s = 0.0;  // AdamW by tensor ops on the device
  // NVMe-tiled AdamW (states read, updated and written back, pipelined); 0
  // in figures files written before it was measured: then derived from the
  // NVMe read and write rates (NvmeAdamParamsPerSecond).
  double nvme_adam_params_per_s = 0.0;
  double allreduce_bytes_per_s = 0.0;  // bytes summed per second over 2 ranks
  // fp32 matrix products on the host CPU at GaLore's shape (a projection
  // [136, 4096] times a [4096, 4096] gradient); 0 in figures files written
  // before it was measured: then the device's fp32 rate (HostMatmulFlops).
  double host_matmul_flops_per_s = 0.0;
  // Blocked attention's forward and backward (policies/model/
  // blocked_attention.h), in the products' FLOP/s (4 d a head for each
  // score its blocks compute, BlockedAttentionScores, forward; 2.5 times
  // that backward): far below a large product's rate, its products being a
  // block pair's. (Files of the first days of 2026-11-28 counted only the
  // visible scores, 20% fewer at the 1k tokens it is measured at.) 0 in
  // figures files written before it was measured: then BlockedAttentionFlops
  // takes the built-in figure's share of the large-product rate.
  double blocked_attention_flops_per_s = 0.0;
  // The same at head_dim 128 (Llama-2-7B's, Mistral's, Qwen's), where a
  // block pair's products are longer for the same softmax: 1.3x the rate at
  // 64 on the 2-vCPU machine. 0 in files written before it was measured:
  // then the rate at 64 serves every head_dim.
  double blocked_attention_d128_flops_per_s = 0.0;
  // Resident bytes of a strata process before it loads a model (libtorch,
  // code, thread stacks), which peak RSS adds to the tiers' figures.
  int64_t process_baseline_bytes = 0;

  // Seconds of an [m, k] x [k, n] product in `dtype`: interpolated in
  // log(m), log(k) between the measured points, plus one op's overhead.
  double MatmulSeconds(int64_t m, int64_t k, int64_t n, const std::string& dtype) const;

  // The NVMe-tiled AdamW rate: measured, or derived from the NVMe read and
  // write rates (and no faster than CPU Adam) where a file lacks it.
  double NvmeAdamParamsPerSecond() const;
  // FLOP/s of the device's large fp32 products ([1024, 4096] x [4096, 4096]).
  double LargeMatmulFlops() const;
  // FLOP/s of the host's fp32 products (GaLore's projections).
  double HostMatmulFlops() const;
  // FLOP/s of blocked attention at `head_dim`: interpolated in log(head_dim)
  // between the rates at 64 and 128, held at the nearer one outside them.
  double BlockedAttentionFlops(int64_t head_dim) const;

  std::string ToJson() const;

 private:
  // Points by k, each row sorted by m: built on the first MatmulSeconds
  // (the planner asks millions of times while it searches placements).
  struct Rows {
    std::vector<std::pair<double, std::vector<std::pair<double, double>>>> by_k;  // k -> (m, flop/s)
  };
  mutable Rows fp32_rows_, bf16_rows_;
  const Rows& RowsOf(const std::string& dtype) const;
};

// Figures measured on the 2-vCPU development machine (docs/BENCHMARKS.md),
// for a planner run with no figures file.
HardwareFigures BuiltInHardwareFigures();

// Reads a figures file; INVALID_ARGUMENT naming the file and the field that
// is missing or not a positive number.
absl::StatusOr<HardwareFigures> ParseHardwareFigures(const std::string& text, const std::string& source);
absl::StatusOr<HardwareFigures> LoadHardwareFigures(const std::string& path);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_JOB_HARDWARE_FIGURES_H_
