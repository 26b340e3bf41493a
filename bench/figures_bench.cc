#include "bench/figures_bench.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "bench/adam_bench.h"
#include "bench/allreduce_bench.h"
#include "bench/io_bench.h"
#include "offload/adam/nvme_adam.h"
#include "offload/device/device_memory.h"
#include "offload/host/host_arena.h"
#include "offload/nvme/nvme_store.h"
#include "offload/stream/layer_streamer.h"
#include "policies/config/attention_blocks.h"
#include "policies/job/hardware_figures.h"
#include "policies/model/blocked_attention.h"
#include "policies/model/llama.h"
#include "policies/rollout/rollout_engine.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Best seconds per call of `fn` over calls adding up to about `budget_s`.
template <typename Fn>
double BestSeconds(Fn fn, double budget_s) {
  fn();  // warm-up: allocations, thread pools
  double best = 1e30, spent = 0;
  for (int i = 0; i < 3 || spent < budget_s; ++i) {
    const auto start = Clock::now();
    fn();
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::min(best, s);
    spent += s;
    if (i > 1000) break;
  }
  return best;
}

// Parameters per second of the real NVMe-tiled Adam (the job's store,
// arena and tiles): each tile read, updated and written back, pipelined, as a
// step of a model with its optimizer on NVMe runs. Slower than CPU Adam by the
// disk, and not simply its read and write rates: the tiles overlap.
absl::StatusOr<double> NvmeAdamParamsPerSecond(const std::string& dir, int64_t tensors, int64_t elements_each,
                                               double budget) {
  offload::NvmeStoreOptions store_options;
  store_options.directory = dir;
  STRATA_ASSIGN_OR_RETURN(auto store, offload::NvmeStore::Open(store_options));
  offload::HostArenaOptions arena_options;
  arena_options.capacity_bytes = size_t{256} << 20;
  arena_options.populate = false;
  STRATA_ASSIGN_OR_RETURN(auto arena, offload::HostArena::Create(arena_options));
  STRATA_ASSIGN_OR_RETURN(auto adam, offload::CpuAdam::Create(offload::CpuAdamOptions{}));
  STRATA_ASSIGN_OR_RETURN(auto state, offload::NvmeAdamState::Create(offload::NvmeAdamOptions{}, store.get(),
                                                                     arena.get(), adam.get()));
  std::vector<float> master(static_cast<size_t>(elements_each), 0.01f), grad(master.size(), 1e-3f);
  std::vector<float> out(master.size());
  for (int64_t t = 0; t < tensors; ++t) {
    STRATA_RETURN_IF_ERROR(state->Register(absl::StrCat("w", t), master));
  }
  int64_t step = 0;
  absl::Status status;
  const double s = BestSeconds(
      [&] {
        ++step;
        std::vector<offload::NvmeAdamUpdate> updates;
        for (int64_t t = 0; t < tensors; ++t) {
          updates.push_back({absl::StrCat("w", t), grad, step, out, {}, {}});
        }
        status.Update(state->Step(updates));
      },
      budget);
  STRATA_RETURN_IF_ERROR(status);
  return static_cast<double>(tensors * elements_each) / s;
}

// Layer streaming's own rate, as the planner prices a streamed pass (its
// compute priced apart): passes over four layers shaped as Llama-2-7B's
// (seven bf16 matrices, 386 MiB), each acquired and released with nothing
// between, into the CPU device's own allocator (installed by the caller)
// as a job's layers are: the NVMe store reads into its huge pages at
// 2.9-3.2 GB/s on the AVX-512 machine, into glibc's 4 KiB pages at 2.1.
// The median of five passes: a rollout re-reads the same layers every
// decoding step.
absl::StatusOr<double> StreamPasses(offload::Tier home, const std::string& nvme_dir, bool quick) {
  const int64_t hidden = quick ? 512 : 4096, intermediate = quick ? 1376 : 11008;
  const int64_t layers = quick ? 2 : 4, passes = quick ? 2 : 5;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const char* name : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    tensors.emplace_back(name, at::zeros({hidden, hidden}, at::kBFloat16));
  }
  tensors.emplace_back("gate_proj", at::zeros({intermediate, hidden}, at::kBFloat16));
  tensors.emplace_back("up_proj", at::zeros({intermediate, hidden}, at::kBFloat16));
  tensors.emplace_back("down_proj", at::zeros({hidden, intermediate}, at::kBFloat16));
  size_t layer_bytes = 0;
  for (const auto& [name, t] : tensors) layer_bytes += static_cast<size_t>(t.nbytes());

  // The host home's layers; a CPU device reads NVMe homes without the arena.
  offload::HostArenaOptions arena_options;
  arena_options.capacity_bytes = home == offload::Tier::kHost
                                     ? static_cast<size_t>(layers) * layer_bytes + (size_t{64} << 20)
                                     : size_t{1} << 20;
  STRATA_ASSIGN_OR_RETURN(auto arena, offload::HostArena::Create(arena_options));
  std::unique_ptr<offload::NvmeStore> store;
  if (home == offload::Tier::kNvme) {
    offload::NvmeStoreOptions store_options;
    store_options.directory = nvme_dir;
    STRATA_ASSIGN_OR_RETURN(store, offload::NvmeStore::Open(store_options));
  }
  offload::LayerStreamerOptions options;
  options.home = home;
  options.prefetch_depth = 1;
  options.nvme_prefix = "figures/";
  STRATA_ASSIGN_OR_RETURN(auto streamer, offload::LayerStreamer::Create(options, arena.get(), store.get(), nullptr));
  for (int64_t l = 0; l < layers; ++l) STRATA_RETURN_IF_ERROR(streamer->AddLayer(tensors).status());
  tensors.clear();
  std::vector<int64_t> order(static_cast<size_t>(layers));
  std::iota(order.begin(), order.end(), 0);
  std::vector<double> seconds;
  for (int64_t pass = 0; pass <= passes; ++pass) {
    const auto start = Clock::now();
    STRATA_RETURN_IF_ERROR(streamer->BeginPass(order));
    for (int64_t l = 0; l < layers; ++l) {
      STRATA_RETURN_IF_ERROR(streamer->Acquire(l).status());
      streamer->Release(l);
    }
    streamer->EndPass();
    if (pass > 0) seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());  // 0: warm-up
  }
  std::nth_element(seconds.begin(), seconds.begin() + static_cast<std::ptrdiff_t>(seconds.size() / 2), seconds.end());
  return static_cast<double>(static_cast<size_t>(layers) * layer_bytes) / seconds[seconds.size() / 2];
}

absl::StatusOr<double> LayerStreamBytesPerSecond(offload::Tier home, const std::string& nvme_dir, bool quick) {
  if (home != offload::Tier::kNvme) return StreamPasses(home, nvme_dir, quick);
  std::error_code ec;
  RemoveTree(nvme_dir);
  std::filesystem::create_directories(nvme_dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat(nvme_dir, ": ", ec.message()));
  auto rate = StreamPasses(home, nvme_dir, quick);  // its store is closed on return
  RemoveTree(nvme_dir);                             // also after an error: up to 1.5 GiB of slot files
  return rate;
}

int64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}

absl::StatusOr<nlohmann::json> Json(const absl::StatusOr<std::string>& report, const char* bench) {
  if (!report.ok()) {
    return absl::Status(report.status().code(), absl::StrCat("bench ", bench, ": ", report.status().message()));
  }
  auto j = nlohmann::json::parse(*report, nullptr, false);
  if (!j.is_object()) return absl::InternalError(absl::StrCat("bench ", bench, ": its report is not JSON"));
  return j;
}

}  // namespace

absl::StatusOr<std::string> RunFiguresBench(const FiguresBenchRequest& request) {
  if (request.nvme_dir.empty() || !IsDirectory(request.nvme_dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nvme-dir '", request.nvme_dir, "' is not an existing directory (the NVMe tier's disk)"));
  }
  // Measure as a job runs: its CPU device's allocator (page-aligned huge
  // pages for large tensors, which O_DIRECT reads into in place).
  offload::DeviceMemoryMonitor::Install();
  policies::HardwareFigures f;
  f.machine = request.machine;
  std::string table = "figure                          value\n";

  const double budget = request.quick ? 0.02 : 0.2;
  {
    // Fixed costs on a minimal model (hidden 64): the difference between 3
    // decoder layers and 1 is two layers' dispatch; a decoding step of the
    // rollout engine (what rollouts run, and the planner prices) on the
    // 1-layer model, less its layer, is the step's own.
    policies::LlamaConfig c;
    c.hidden_size = 64, c.intermediate_size = 128, c.num_attention_heads = 2, c.num_key_value_heads = 2;
    c.head_dim = 32, c.vocab_size = 256, c.max_position_embeddings = 64;
    c.eos_token_ids = {};
    const int64_t rows = 8, prompt = 8, steps = 16;
    std::vector<policies::RolloutPrompt> prompts;
    for (int64_t r = 0; r < rows; ++r) {
      prompts.push_back({std::vector<int32_t>(prompt, 5), {static_cast<uint64_t>(r)}, false, {}});
    }
    double per_step[2] = {0, 0};
    for (int64_t layers : {1, 3}) {
      c.num_hidden_layers = layers;
      auto model = policies::LlamaModel::RandomInit(c, policies::LlamaHead::kLanguageModel, at::kFloat, 1);
      policies::SamplingOptions options;
      options.stop_at_eos = false;
      options.max_new_tokens = steps;
      absl::Status status;
      policies::RolloutEngine engine(*model, policies::RolloutEngineOptions(), {});
      const double s = BestSeconds([&] { status.Update(engine.Run(prompts, options).status()); }, budget);
      STRATA_RETURN_IF_ERROR(status);
      per_step[layers == 1 ? 0 : 1] = s / static_cast<double>(steps);
    }
    f.layer_overhead_s = std::max((per_step[1] - per_step[0]) / 2.0, 1e-7);
    f.decode_step_overhead_s = std::max(per_step[0] - f.layer_overhead_s, 1e-7);
    table += absl::StrFormat("layer / decode step overhead    %10.1f / %.1f us\n", f.layer_overhead_s * 1e6,
                             f.decode_step_overhead_s * 1e6);
  }
  // libtorch and its thread pools are up and a small model has run; the
  // large buffers of the benchmarks to come are not allocated yet.
  f.process_baseline_bytes = ResidentBytes();
  // Widths and rows of the product grid (rows: decoding's few to training's many).
  const std::vector<int64_t> ks = request.quick ? std::vector<int64_t>{256, 1024}
                                                : std::vector<int64_t>{256, 1024, 4096};
  const std::vector<int64_t> ms = request.quick ? std::vector<int64_t>{1, 64}
                                                : std::vector<int64_t>{1, 2, 4, 16, 64, 256, 1024};
  for (const auto& [dtype, name] : {std::pair{at::kFloat, "fp32"}, std::pair{at::kBFloat16, "bf16"}}) {
    auto& points = dtype == at::kFloat ? f.matmul_fp32 : f.matmul_bf16;
    for (int64_t k : ks) {
      // A model touches each layer's weights once per pass: cycle through
      // enough matrices (256 MiB) that they come from DRAM, not the caches.
      const int64_t copies = std::max<int64_t>(1, (int64_t{256} << 20) / (k * k * at::elementSize(dtype)));
      std::vector<at::Tensor> ws;
      for (int64_t i = 0; i < copies; ++i) ws.push_back(at::randn({k, k}).to(dtype));
      for (int64_t m : ms) {
        const at::Tensor x = at::randn({m, k}).to(dtype);
        size_t next = 0;
        const double s = BestSeconds([&] { (void)at::mm(x, ws[next++ % ws.size()]); }, budget);
        points.push_back({m, k, 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(k) / s});
        table += absl::StrFormat("matmul %-4s m=%-5d k=%-5d %10.2f GFLOP/s\n", name, m, k, points.back().flops / 1e9);
      }
    }
  }
  {
    // GaLore's projection on the host: [r + 8, 4096] x [4096, 4096], fp32.
    const int64_t k = request.quick ? 1024 : 4096;
    const at::Tensor p = at::randn({136, k}), g = at::randn({k, k});
    const double s = BestSeconds([&] { (void)at::mm(p, g); }, budget);
    f.host_matmul_flops_per_s = 2.0 * 136.0 * static_cast<double>(k) * static_cast<double>(k) / s;
    table += absl::StrFormat("host matmul fp32 (GaLore)       %10.2f GFLOP/s\n", f.host_matmul_flops_per_s / 1e9);
  }
  {
    // Blocked attention, forward and backward, over one row of 8 heads of
    // 64 and of 128: its products' FLOP/s, counted over the scores it
    // computes (whole block pairs; 4 d a score forward, 2.5 times that
    // backward), as the planner counts them.
    const int64_t t = request.quick ? 512 : 1024, heads = 8;
    auto rate = [&](int64_t d) {
      const at::Tensor q = at::randn({1, heads, t, d}).requires_grad_();
      const at::Tensor k = at::randn({1, heads, t, d}).requires_grad_();
      const at::Tensor v = at::randn({1, heads, t, d}).requires_grad_();
      const at::Tensor real = at::ones({1, t}, at::kBool);
      const double s = BestSeconds([&] { policies::BlockedAttention(q, k, v, real).sum().backward(); }, budget);
      const double forward = 4.0 * heads * d * static_cast<double>(policies::BlockedAttentionScores(t, t));
      return 3.5 * forward / s;
    };
    f.blocked_attention_flops_per_s = rate(64);
    f.blocked_attention_d128_flops_per_s = rate(128);
    table += absl::StrFormat("blocked attention fwd+bwd d=64  %10.2f GFLOP/s\n", f.blocked_attention_flops_per_s / 1e9);
    table += absl::StrFormat("blocked attention fwd+bwd d=128 %10.2f GFLOP/s\n",
                             f.blocked_attention_d128_flops_per_s / 1e9);
  }
  {
    const at::Tensor a = at::ones({8}), b = at::ones({8});
    f.op_overhead_s = BestSeconds([&] { (void)at::add(a, b); }, budget);
    table += absl::StrFormat("op overhead                     %10.2f us\n", f.op_overhead_s * 1e6);
  }
  {
    // Copies into a tensor that already exists: the memory traffic of the
    // cost model's elementwise work.
    const int64_t bytes = (request.quick ? 32 : 256) << 20;
    const at::Tensor src = at::ones({bytes / 4}), dst = at::empty({bytes / 4});
    const double s = BestSeconds([&] { dst.copy_(src); }, budget);
    f.memory_copy_bytes_per_s = static_cast<double>(bytes) / s;
    table += absl::StrFormat("memory copy                     %10.2f GB/s\n", f.memory_copy_bytes_per_s / 1e9);
  }
  {
    IoBenchRequest io;
    io.dir = request.nvme_dir;
    io.size_mib = request.quick ? 64 : 1024;
    io.repeats = 1;
    io.json = true;
    STRATA_ASSIGN_OR_RETURN(auto j, Json(RunIoBench(io), "io"));
    f.nvme_read_bytes_per_s = j.value("ours_read_mbps", 0.0) * 1e6;
    f.nvme_write_bytes_per_s = j.value("ours_write_mbps", 0.0) * 1e6;
    table += absl::StrFormat("nvme read / write               %10.2f / %.2f GB/s (fio %.2f / %.2f)\n",
                             f.nvme_read_bytes_per_s / 1e9, f.nvme_write_bytes_per_s / 1e9,
                             j.value("fio_read_mbps", 0.0) / 1e3, j.value("fio_write_mbps", 0.0) / 1e3);
  }
  {
    STRATA_ASSIGN_OR_RETURN(f.host_stream_bytes_per_s,
                            LayerStreamBytesPerSecond(offload::Tier::kHost, "", request.quick));
    STRATA_ASSIGN_OR_RETURN(f.nvme_stream_bytes_per_s,
                            LayerStreamBytesPerSecond(offload::Tier::kNvme,
                                                      JoinPath(request.nvme_dir, "strata-figures-stream"),
                                                      request.quick));
    table += absl::StrFormat("layer streaming host / nvme     %10.2f / %.2f GB/s\n", f.host_stream_bytes_per_s / 1e9,
                             f.nvme_stream_bytes_per_s / 1e9);
  }
  {
    AdamBenchRequest adam;
    adam.params = request.quick ? 2'000'000 : 100'000'000;  // far past the caches: DRAM-bound, as models are
    adam.steps = 3;
    adam.bf16_copy = false;
    adam.json = true;
    STRATA_ASSIGN_OR_RETURN(auto j, Json(RunAdamBench(adam), "adam"));
    f.adam_params_per_s = j.value("ours_mparams_per_s", 0.0) * 1e6;
    f.device_adam_params_per_s = j.value("torch_mparams_per_s", 0.0) * 1e6;
    table += absl::StrFormat("CPU AdamW (torch's)             %10.1f M params/s (%.1f)\n", f.adam_params_per_s / 1e6,
                             f.device_adam_params_per_s / 1e6);
  }
  {
    // The store reads with O_DIRECT, so the page cache does not flatter
    // this: 384 MiB of states (32 tiles) is enough.
    const int64_t tensors = request.quick ? 2 : 8, each = request.quick ? 1 << 20 : 4 << 20;
    const std::string dir = JoinPath(request.nvme_dir, "strata-figures-adam");
    std::error_code ec;
    RemoveTree(dir);
    std::filesystem::create_directories(dir, ec);
    auto rate = NvmeAdamParamsPerSecond(dir, tensors, each, request.quick ? 0.0 : 1.0);
    RemoveTree(dir);
    if (!rate.ok()) return absl::Status(rate.status().code(), absl::StrCat("nvme adam: ", rate.status().message()));
    f.nvme_adam_params_per_s = *rate;
    table += absl::StrFormat("NVMe-tiled AdamW                %10.1f M params/s\n", f.nvme_adam_params_per_s / 1e6);
  }
  {
    AllReduceBenchRequest ar;
    ar.steps = 1;
    ar.json = true;
    auto report = RunAllReduceBench(ar);
    if (report.ok()) {
      STRATA_ASSIGN_OR_RETURN(auto j, Json(report, "allreduce"));
      f.allreduce_bytes_per_s = j.value("strata_allreduce_gb_s", 0.0) * 1e9;
      table += absl::StrFormat("gradient all-reduce, 2 ranks    %10.2f GB/s\n", f.allreduce_bytes_per_s / 1e9);
    } else {
      // No Gloo in this build, or no model shape to run: an estimate, said as one.
      f.allreduce_bytes_per_s = f.memory_copy_bytes_per_s / 4;
      table += absl::StrFormat("gradient all-reduce             not measured (%s); memory copy / 4\n",
                               report.status().message());
    }
  }
  table += absl::StrFormat("process baseline RSS            %10.1f MiB\n",
                           static_cast<double>(f.process_baseline_bytes) / (1 << 20));
  // The file must parse as the planner reads it.
  STRATA_RETURN_IF_ERROR(policies::ParseHardwareFigures(f.ToJson(), "figures").status());
  if (!request.out.empty()) {
    STRATA_RETURN_IF_ERROR(WriteFileAtomically(request.out, f.ToJson()));
    table += absl::StrCat("wrote ", request.out, "\n");
  } else {
    table += f.ToJson();
  }
  return table;
}

}  // namespace strata::bench
