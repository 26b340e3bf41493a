#include "bench/long_sequence_bench.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/heap.h"
#include "base/status_macros.h"
#include "offload/device/device_memory.h"
#include "offload/device/device_transfer.h"
#include "offload/host/host_arena.h"
#include "offload/nvme/nvme_store.h"
#include "policies/config/lora_config.h"
#include "policies/model/fused_attention.h"
#include "policies/model/lora.h"
#include "policies/train/layerwise_trainer.h"

namespace strata::bench {
namespace {

using offload::Tier;

struct Mode {
  std::string name;
  policies::AttentionKind attention = policies::AttentionKind::kBlocked;
  Tier activations = Tier::kDevice;
};

absl::StatusOr<Mode> ParseMode(const std::string& name) {
  if (name == "materialised") return Mode{name, policies::AttentionKind::kMaterialised, Tier::kDevice};
  if (name == "blocked") return Mode{name, policies::AttentionKind::kBlocked, Tier::kDevice};
  if (name == "fused") return Mode{name, policies::AttentionKind::kFused, Tier::kDevice};
  if (name == "host") return Mode{name, policies::AttentionKind::kBlocked, Tier::kHost};
  if (name == "nvme") return Mode{name, policies::AttentionKind::kBlocked, Tier::kNvme};
  return absl::InvalidArgumentError(
      absl::StrCat("--modes: unknown mode '", name, "' (materialised, blocked, fused, host, nvme)"));
}

// The process's peak resident set since the last reset, in bytes (VmHWM);
// the reset (clear_refs "5") lets each mode report its own.
int64_t PeakRss(bool reset) {
  if (reset) {
    std::ofstream("/proc/self/clear_refs") << "5";
    return 0;
  }
  std::ifstream status("/proc/self/status");
  std::string key;
  int64_t kib = 0;
  while (status >> key) {
    if (key == "VmHWM:") {
      status >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

struct Result {
  double step_s = 1e30;
  int64_t peak_device_bytes = 0, peak_rss_bytes = 0;
  double loss = 0;
};

absl::StatusOr<Result> RunMode(const LongSequenceBenchRequest& r, const policies::LlamaConfig& config,
                               at::ScalarType dtype, const at::Device& device, int64_t t, const Mode& mode) {
  // Each mode starts as a job in its own process would: without the large
  // blocks the modes before it kept for reuse (resident, they would count
  // in this mode's RSS).
  UnmapKeptLargeBlocks();
  STRATA_ASSIGN_OR_RETURN(offload::DeviceMemoryMonitor * found, offload::DeviceMemoryMonitor::ForDevice(device));
  offload::DeviceMemoryMonitor& monitor = *found;
  policies::LlamaWeights weights =
      policies::LlamaModel::RandomInit(config, policies::LlamaHead::kLanguageModel, dtype, 1, 0.02)->weights();
  policies::MoveToDevice(weights, device, /*include_layers=*/true);
  offload::HostArenaOptions arena_options;
  // Master weights, gradients, moments (16 B a parameter), the host
  // activations or NVMe staging, on a GPU the gradients' staging (two
  // layers' in fp32, or the head's), and slack for alignment.
  const int64_t activation = t * config.hidden_size * 4;
  const int64_t layer = config.LayerParameters() * 4;
  const int64_t head = config.vocab_size * config.hidden_size * 4;
  arena_options.capacity_bytes = static_cast<size_t>(
      config.NumParameters() * 16 + (config.num_hidden_layers + 4) * activation +
      (device.is_cpu() ? 0 : 2 * std::max(layer, head) + head) + (64 << 20));
  arena_options.pin_for_cuda = !device.is_cpu();
  STRATA_ASSIGN_OR_RETURN(auto arena, offload::HostArena::Create(arena_options));
  std::unique_ptr<offload::NvmeStore> store;
  if (mode.activations == Tier::kNvme) {
    offload::NvmeStoreOptions store_options;
    store_options.directory = r.nvme_dir;
    STRATA_ASSIGN_OR_RETURN(store, offload::NvmeStore::Open(store_options));
  }
  policies::ResidentLayerSource source(weights.layers);
  policies::LayerwiseTrainerOptions options;
  options.activations = mode.activations;
  options.attention = mode.attention;
  std::unique_ptr<policies::LoraAdapters> lora;
  if (r.lora_rank > 0) {
    policies::LoraConfig lora_config;
    lora_config.rank = r.lora_rank;
    STRATA_ASSIGN_OR_RETURN(lora, policies::LoraAdapters::Init(lora_config, config, dtype, device, /*seed=*/7));
    options.lora = lora.get();
  }
  STRATA_ASSIGN_OR_RETURN(auto trainer,
                          policies::LayerwiseTrainer::Create(config, policies::LlamaHead::kLanguageModel, weights,
                                                             &source, arena.get(), options, store.get()));
  at::Generator gen = at::detail::createCPUGenerator(7);
  const at::Tensor ids = at::randint(config.vocab_size, {1, t}, gen, at::kLong).to(device);
  const at::Tensor mask = at::ones_like(ids);
  // A response's loss: the next-token loss of the last three quarters (the
  // prompt's quarter is context only).
  const int64_t prompt = t / 4;
  const at::Tensor positions = at::arange(prompt, t - 1, at::kLong).unsqueeze(0).to(device);
  auto loss_fn = [&](const at::Tensor& logits) {
    const at::Tensor logp = at::log_softmax(logits, -1);
    return -logp.gather(-1, ids.narrow(1, prompt + 1, t - 1 - prompt).unsqueeze(-1)).mean();
  };
  Result result;
  for (int step = 0; step < r.warmup + r.steps; ++step) {
    PeakRss(/*reset=*/true);
    monitor.ResetPeak();
    const size_t before = monitor.current_bytes();
    const auto start = std::chrono::steady_clock::now();
    STRATA_ASSIGN_OR_RETURN(const double loss, trainer->ForwardBackwardAt(ids, mask, positions, loss_fn, true));
    STRATA_RETURN_IF_ERROR(trainer->OptimizerStep());
    STRATA_RETURN_IF_ERROR(offload::SynchronizeDevice(device));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (step < r.warmup) continue;
    result.step_s = std::min(result.step_s, seconds);
    result.peak_device_bytes = std::max(result.peak_device_bytes, static_cast<int64_t>(monitor.peak_bytes() - before));
    result.peak_rss_bytes = std::max(result.peak_rss_bytes, PeakRss(/*reset=*/false));
    result.loss = loss;
  }
  return result;
}

}  // namespace

absl::StatusOr<std::string> RunLongSequenceBench(const LongSequenceBenchRequest& r) {
  if (r.config.empty()) return absl::InvalidArgumentError("--config is required");
  if (r.steps < 1 || r.warmup < 0) return absl::InvalidArgumentError("--steps >= 1 and --warmup >= 0 are required");
  if (r.lora_rank < 0) return absl::InvalidArgumentError("--lora-rank: must be 0 (off) or positive");
  STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(r.config));
  STRATA_ASSIGN_OR_RETURN(policies::LlamaConfig config, policies::LlamaConfig::FromJson(text, r.config));
  if (r.layers > 0) config.num_hidden_layers = r.layers;
  const absl::StatusOr<at::ScalarType> dtype = policies::ParseModelDType(r.dtype);
  if (!dtype.ok()) return absl::InvalidArgumentError(absl::StrCat("--dtype: ", dtype.status().message()));
  const absl::StatusOr<at::Device> device = offload::ParseComputeDevice(r.device);
  if (!device.ok()) return absl::InvalidArgumentError(absl::StrCat("--device: ", device.status().message()));
  std::vector<Mode> modes;
  for (const std::string& name : r.modes) {
    STRATA_ASSIGN_OR_RETURN(auto mode, ParseMode(name));
    modes.push_back(mode);
  }
  std::error_code ec;
  std::filesystem::create_directories(r.nvme_dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("--nvme-dir ", r.nvme_dir, ": ", ec.message()));
  nlohmann::json runs = nlohmann::json::array();
  std::string table =
      absl::StrFormat("training step, %d layers x hidden %d (%d parameters, %s%s), one sequence\n",
                      config.num_hidden_layers, config.hidden_size, config.NumParameters(), r.dtype,
                      r.lora_rank > 0 ? absl::StrCat(", LoRA rank ", r.lora_rank, " on every projection") : "");
  table += absl::StrFormat("  %8s  %-13s %10s %16s %14s %10s\n", "tokens", "mode", "step s", "device peak MiB",
                           "peak RSS MiB", "vs blocked");
  for (int64_t t : r.tokens) {
    if (t < 8) return absl::InvalidArgumentError(absl::StrCat("--tokens: ", t, " is too short"));
    config.max_position_embeddings = std::max(config.max_position_embeddings, t);
    double blocked_s = 0;
    for (const Mode& mode : modes) {
      nlohmann::json run{{"tokens", t}, {"mode", mode.name}};
      const int64_t scores = config.num_attention_heads * t * t * 12;
      if (mode.attention == policies::AttentionKind::kMaterialised && scores > r.max_scores_bytes) {
        run["skipped"] = absl::StrCat("its scores alone take ", scores, " bytes (--max-scores-bytes ",
                                      r.max_scores_bytes, ")");
        table += absl::StrFormat("  %8d  %-13s skipped: scores alone %.1f GiB\n", t, mode.name, scores / 1073741824.0);
        runs.push_back(run);
        continue;
      }
      if (mode.attention == policies::AttentionKind::kFused && !policies::FusedAttentionAvailable()) {
        run["skipped"] = "this libtorch has no fused attention (PyTorch 2.5+)";
        table += absl::StrFormat("  %8d  %-13s skipped: no fused attention in this libtorch\n", t, mode.name);
        runs.push_back(run);
        continue;
      }
      STRATA_ASSIGN_OR_RETURN(Result result, RunMode(r, config, *dtype, *device, t, mode));
      if (mode.name == "blocked") blocked_s = result.step_s;
      run.update({{"step_s", result.step_s},
                  {"peak_device_bytes", result.peak_device_bytes},
                  {"peak_rss_bytes", result.peak_rss_bytes},
                  {"loss", result.loss}});
      runs.push_back(run);
      table += absl::StrFormat("  %8d  %-13s %10.2f %16.1f %14.1f %10s\n", t, mode.name, result.step_s,
                               result.peak_device_bytes / 1048576.0, result.peak_rss_bytes / 1048576.0,
                               blocked_s > 0 ? absl::StrFormat("%.3fx", result.step_s / blocked_s) : "");
    }
  }
  RemoveTree(r.nvme_dir);
  if (r.json) {
    return nlohmann::json{{"layers", config.num_hidden_layers},
                          {"hidden", config.hidden_size},
                          {"parameters", config.NumParameters()},
                          {"dtype", r.dtype},
                          {"device", r.device},
                          {"lora_rank", r.lora_rank},
                          {"runs", runs}}
               .dump() +
           "\n";
  }
  return table;
}

}  // namespace strata::bench
