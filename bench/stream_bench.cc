#include "bench/stream_bench.h"

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "offload/device/device_memory.h"
#include "offload/device/device_transfer.h"
#include "offload/host/host_arena.h"
#include "offload/nvme/nvme_store.h"
#include "offload/stream/layer_streamer.h"
#include "policies/train/layerwise_trainer.h"
#include "policies/train/streamed_layers.h"

namespace strata::bench {
namespace {

using offload::Tier;

struct ModeResult {
  double step_s = 0;
  size_t peak_device_bytes = 0;
  offload::HostArenaStats host;
  offload::LayerStreamerStats streaming;
  double loss = 0;
};

policies::LlamaConfig BenchConfig(const StreamBenchRequest& r) {
  policies::LlamaConfig c;
  c.num_hidden_layers = r.layers;
  c.hidden_size = r.hidden;
  c.num_attention_heads = std::max<int64_t>(1, r.hidden / 64);
  c.num_key_value_heads = c.num_attention_heads;
  c.head_dim = r.hidden / c.num_attention_heads;
  // Llama's 8/3 * hidden MLP width, rounded up to a multiple of 64.
  c.intermediate_size = (r.hidden * 8 / 3 + 63) / 64 * 64;
  c.vocab_size = r.vocab;
  c.max_position_embeddings = r.seq;
  return c;
}

int64_t DecoderBytes(const policies::LlamaConfig& c) {
  const int64_t per_layer = 4 * c.hidden_size * c.hidden_size + 3 * c.hidden_size * c.intermediate_size +
                            2 * c.hidden_size;
  return per_layer * c.num_hidden_layers * static_cast<int64_t>(sizeof(float));
}

// Runs warm-up + timed steps of one mode. `home` is kDevice for the
// resident peer.
absl::StatusOr<ModeResult> RunMode(const StreamBenchRequest& r, const policies::LlamaConfig& config, Tier home,
                                   const at::Device& device, size_t device_budget) {
  STRATA_ASSIGN_OR_RETURN(auto found, offload::DeviceMemoryMonitor::ForDevice(device));
  offload::DeviceMemoryMonitor& monitor = *found;
  // The weights alone: streamed layers are then freed as they reach home.
  policies::LlamaWeights weights =
      policies::LlamaModel::RandomInit(config, policies::LlamaHead::kLanguageModel, at::kFloat, 1)->weights();
  // Streamed layers are copied to their home from the CPU.
  policies::MoveToDevice(weights, device, /*include_layers=*/home == Tier::kDevice);
  offload::HostArenaOptions arena_options;
  // Master weights, gradient, two moments (16 B/param) + the streamed home
  // copy (4 B/param), plus per-tensor alignment slack.
  arena_options.capacity_bytes = static_cast<size_t>(config.NumParameters()) * 20 + (64 << 20);
  if (!device.is_cpu()) {
    // Gradient staging on a GPU: two batches in flight (a layer's, or the
    // head's) and the embedding's at the end, fp32.
    const size_t head = static_cast<size_t>(config.vocab_size * config.hidden_size) * sizeof(float);
    const size_t layer = static_cast<size_t>(DecoderBytes(config) / config.num_hidden_layers);
    arena_options.capacity_bytes += 2 * std::max(head, layer) + head;
  }
  arena_options.pin_for_cuda = !device.is_cpu();
  STRATA_ASSIGN_OR_RETURN(auto arena, offload::HostArena::Create(arena_options));

  std::unique_ptr<offload::NvmeStore> store;
  std::unique_ptr<offload::LayerStreamer> streamer;
  std::unique_ptr<policies::LayerSource> source;
  if (home == Tier::kDevice) {
    source = std::make_unique<policies::ResidentLayerSource>(std::move(weights.layers));
  } else {
    if (home == Tier::kNvme) {
      offload::NvmeStoreOptions store_options;
      store_options.directory = r.nvme_dir;
      STRATA_ASSIGN_OR_RETURN(store, offload::NvmeStore::Open(store_options));
    }
    offload::LayerStreamerOptions options;
    options.device = device;
    options.home = home;
    options.prefetch_depth = r.prefetch_depth;
    options.nvme_prefix = "bench/";
    options.device_budget_bytes = device_budget;
    options.compute_reserve_bytes = policies::LayerWorkingBytes(config, r.batch, r.seq, at::kFloat, /*training=*/true);
    STRATA_ASSIGN_OR_RETURN(streamer, offload::LayerStreamer::Create(options, arena.get(), store.get(), nullptr));
    STRATA_RETURN_IF_ERROR(policies::AddLayersToStreamer(std::move(weights.layers), streamer.get()));
    source = std::make_unique<policies::StreamedLayerSource>(streamer.get());
  }
  weights.layers.clear();
  policies::LayerwiseTrainerOptions trainer_options;
  STRATA_ASSIGN_OR_RETURN(auto trainer,
                          policies::LayerwiseTrainer::Create(config, policies::LlamaHead::kLanguageModel, weights,
                                                             source.get(), arena.get(), trainer_options));
  weights = policies::LlamaWeights();  // the trainer holds the resident parts

  at::Generator gen = at::detail::createCPUGenerator(7);
  const at::Tensor ids = at::randint(config.vocab_size, {r.batch, r.seq}, gen, at::kLong).to(device);
  const at::Tensor mask = at::ones_like(ids);
  auto loss_fn = [&](const at::Tensor& logits) {
    const at::Tensor logp = at::log_softmax(logits.narrow(1, 0, r.seq - 1), -1);
    return -logp.gather(-1, ids.narrow(1, 1, r.seq - 1).unsqueeze(-1)).mean();
  };
  ModeResult result;
  result.step_s = 1e30;
  for (int step = 0; step <= r.steps; ++step) {
    monitor.ResetPeak();
    const auto start = std::chrono::steady_clock::now();
    auto loss = trainer->ForwardBackward(ids, mask, loss_fn);
    if (!loss.ok()) return loss.status();
    STRATA_RETURN_IF_ERROR(trainer->OptimizerStep());
    STRATA_RETURN_IF_ERROR(offload::SynchronizeDevice(device));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (step == 0) continue;  // warm-up
    result.step_s = std::min(result.step_s, seconds);
    result.peak_device_bytes = std::max(result.peak_device_bytes, monitor.peak_bytes());
    result.loss = *loss;
  }
  result.host = arena->stats();
  if (streamer) result.streaming = streamer->stats();
  return result;
}

}  // namespace

absl::StatusOr<std::string> RunStreamBench(const StreamBenchRequest& r) {
  if (r.layers < 1 || r.hidden < 64 || r.hidden % 64 != 0 || r.seq < 2 || r.batch < 1 || r.steps < 1) {
    return absl::InvalidArgumentError(
        "--layers >= 1, --hidden a multiple of 64, --seq >= 2, --batch >= 1 and --steps >= 1 are required");
  }
  const policies::LlamaConfig config = BenchConfig(r);
  STRATA_RETURN_IF_ERROR(config.Validate());
  STRATA_ASSIGN_OR_RETURN(auto device, offload::ParseComputeDevice(r.device));
  STRATA_RETURN_IF_ERROR(offload::CheckComputeDevice(device));
  const int64_t decoder_bytes = DecoderBytes(config);
  const size_t layer_bytes = static_cast<size_t>(decoder_bytes / r.layers);
  const size_t reserve = policies::LayerWorkingBytes(config, r.batch, r.seq, at::kFloat, /*training=*/true);
  // Default: what the streamed step needs by the engine's own estimate:
  // embeddings and head with their gradients, the prefetch window, the
  // compute reserve and the saved layer inputs, plus 10%.
  const size_t resident_bytes = static_cast<size_t>(2 * config.vocab_size * config.hidden_size) * sizeof(float);
  const size_t inputs_bytes = static_cast<size_t>((r.layers + 1) * r.batch * r.seq * r.hidden) * sizeof(float);
  const size_t estimate = 2 * resident_bytes + static_cast<size_t>(r.prefetch_depth + 1) * layer_bytes + reserve +
                          inputs_bytes;
  const size_t budget = r.device_budget_mib > 0 ? static_cast<size_t>(r.device_budget_mib) << 20
                                                : estimate + estimate / 10;
  std::error_code ec;
  std::filesystem::create_directories(r.nvme_dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("--nvme-dir ", r.nvme_dir, ": ", ec.message()));

  auto resident = RunMode(r, config, Tier::kDevice, device, 0);  // the peer needs the weights on the device
  if (!resident.ok()) return resident.status();
  STRATA_ASSIGN_OR_RETURN(auto host, RunMode(r, config, Tier::kHost, device, budget));
  auto nvme = RunMode(r, config, Tier::kNvme, device, budget);
  RemoveTree(r.nvme_dir);
  if (!nvme.ok()) return nvme.status();

  const size_t peak = std::max(host.peak_device_bytes, nvme->peak_device_bytes);
  nlohmann::json j{{"device", device.str()},
                   {"resident_s", resident->step_s},
                   {"host_stream_s", host.step_s},
                   {"nvme_stream_s", nvme->step_s},
                   {"peak_device_bytes", peak},
                   {"device_budget_bytes", budget},
                   {"host_reserved_bytes", host.host.peak_reserved_bytes},
                   {"host_requested_bytes", host.host.peak_requested_bytes},
                   {"within_budget", peak <= budget},
                   {"host_stream_ratio", host.step_s / resident->step_s},
                   {"nvme_stream_ratio", nvme->step_s / resident->step_s},
                   {"resident_peak_device_bytes", resident->peak_device_bytes},
                   {"decoder_weight_bytes", decoder_bytes},
                   {"weights_and_optimizer_bytes", config.NumParameters() * 16},
                   {"oversubscription", static_cast<double>(config.NumParameters() * 16) / static_cast<double>(budget)},
                   {"parameters", config.NumParameters()},
                   {"host_stall_s", host.streaming.stall_seconds},
                   {"nvme_stall_s", nvme->streaming.stall_seconds},
                   {"nvme_fetch_s", nvme->streaming.fetch_seconds},
                   {"losses_equal", resident->loss == host.loss && host.loss == nvme->loss}};
  if (r.json) return j.dump() + "\n";
  return absl::StrFormat(
      "training step on %s, %d params (%d layers x hidden %d), batch %d x %d tokens\n"
      "  resident (peer):      %7.3f s   device peak %8.1f MiB\n"
      "  streamed from host:   %7.3f s   device peak %8.1f MiB  (%.2fx, stalled %.3f s)\n"
      "  streamed from NVMe:   %7.3f s   device peak %8.1f MiB  (%.2fx, stalled %.3f s)\n"
      "  device budget %.1f MiB (weights + optimizer states are %.1fx that): %s\n"
      "  host arena %.1f MiB reserved for %.1f MiB requested\n",
      device.str(), config.NumParameters(), r.layers, r.hidden, r.batch, r.seq, resident->step_s,
      resident->peak_device_bytes / 1048576.0, host.step_s, host.peak_device_bytes / 1048576.0,
      host.step_s / resident->step_s, host.streaming.stall_seconds, nvme->step_s, nvme->peak_device_bytes / 1048576.0,
      nvme->step_s / resident->step_s, nvme->streaming.stall_seconds, budget / 1048576.0,
      static_cast<double>(config.NumParameters() * 16) / static_cast<double>(budget),
      peak <= budget ? "kept" : "EXCEEDED", host.host.peak_reserved_bytes / 1048576.0,
      host.host.peak_requested_bytes / 1048576.0);
}

}  // namespace strata::bench
