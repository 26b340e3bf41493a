#include "policies/job/memory_plan.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/heap.h"
#include "base/status_macros.h"
#include "policies/config/attention_blocks.h"
#include "policies/config/layer_memory.h"
#include "policies/config/rollout_options.h"
#include "policies/config/sampling.h"
#include "policies/config/tensor_dealer.h"

namespace strata::policies {
namespace {

int T(offload::Tier t) { return static_cast<int>(t); }

int64_t LayerParams(const LlamaConfig& c) { return c.LayerParameters(); }

// Parameters outside the decoder layers: embeddings, final norm, and the
// LM head (unless tied) or the scalar head.
int64_t ResidentParameters(const LlamaConfig& c, bool scalar_head) {
  const int64_t embed = c.vocab_size * c.hidden_size;
  const int64_t head = scalar_head ? c.num_labels * c.hidden_size : (c.tie_word_embeddings ? 0 : embed);
  return embed + head + c.hidden_size;
}

absl::StatusOr<LlamaConfig> ConfigOf(const ModelSpec& model, const std::string& role) {
  const std::string path = !model.path.empty() ? JoinPath(model.path, "config.json") : model.init;
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat("models.", role, ": ", text.status().message()));
  }
  return LlamaConfig::FromJson(*text, path);
}

}  // namespace

ModelFootprint PlanModel(const std::string& role, const LlamaConfig& config, const ModelSpec& model, bool trainable,
                         bool scalar_head) {
  ModelFootprint f;
  f.role = role;
  f.trainable = trainable;
  const int64_t layers = LayerParams(config) * config.num_hidden_layers;
  const int64_t resident = ResidentParameters(config, scalar_head);
  f.parameters = layers + resident;
  const int64_t bytes = model.dtype == "bf16" ? 2 : 4;
  const auto& p = model.placement;
  f.weights[T(p.weights)] += layers * bytes;
  f.weights[T(offload::Tier::kDevice)] += resident * bytes;
  if (p.weights != offload::Tier::kDevice) {
    f.weights[T(offload::Tier::kDevice)] += (p.prefetch_depth + 1) * LayerParams(config) *
                                            bytes;  // the streaming window
  }
  if (trainable) {
    const int64_t adapters = model.lora.Parameters(config);
    // LoRA: the adapters sit beside the compute, and they (with a scalar
    // head) are all that trains.
    f.weights[T(offload::Tier::kDevice)] += adapters * bytes;
    f.trained_parameters = adapters > 0 ? adapters + (scalar_head ? config.num_labels * config.hidden_size : 0)
                                        : f.parameters;
    // With step_in_backward only the resident tensors keep a gradient.
    f.gradients[T(p.gradients)] += (p.step_in_backward ? resident : f.trained_parameters) * 4;
    // GaLore: the projected matrices keep a 4-byte master and their small
    // state (in host memory beside an NVMe optimizer), the rest full Adam.
    const int64_t small = 4 * model.galore.StateElements(config);
    f.optimizer[T(p.optimizer)] += f.trained_parameters * 12 - model.galore.SavedBytes(config) - small;
    f.optimizer[T(p.optimizer == offload::Tier::kNvme ? offload::Tier::kHost : p.optimizer)] += small;
  }
  return f;
}

absl::StatusOr<std::vector<PlannedModel>> JobModels(const JobSpec& spec) {
  std::vector<PlannedModel> models;
  auto add = [&](const std::string& role, ModelSpec model, bool trainable, bool scalar,
                 const std::string& fallback_path, std::string placement_key = "") -> absl::Status {
    if (model.path.empty() && model.init.empty()) model.path = fallback_path;
    STRATA_ASSIGN_OR_RETURN(auto config, ConfigOf(model, role));
    if (placement_key.empty()) placement_key = absl::StrCat("models.", role, ".placement");
    models.push_back({role, config, model, trainable, scalar, std::move(placement_key), ""});
    return absl::OkStatus();
  };
  switch (spec.algorithm) {
    case Algorithm::kSft:
      STRATA_RETURN_IF_ERROR(add("actor", spec.actor, true, false, ""));
      break;
    case Algorithm::kRewardModel:
      STRATA_RETURN_IF_ERROR(add("reward", spec.reward, true, true, ""));
      break;
    default:
      STRATA_RETURN_IF_ERROR(add("actor", spec.actor, true, false, ""));
      if (spec.actor.trains_adapters() && (spec.reference.path.empty() || spec.reference.path == spec.actor.path)) {
        // The LoRA actor's base with the adapters off (LocalWorkerGroup).
        ModelSpec base = spec.actor;
        base.lora = LoraConfig();
        base.adapter.clear();
        STRATA_RETURN_IF_ERROR(add("reference", base, false, false, spec.actor.path));
        models.back().shares_base_of = "actor";
      } else {
        STRATA_RETURN_IF_ERROR(add("reference", spec.reference, false, false, spec.actor.path));
      }
      // Every reward model among the sources; the first is the one the
      // phase predictions score with.
      for (size_t i = 0; i < spec.reward_sources.size(); ++i) {
        const RewardSourceSpec& source = spec.reward_sources[i];
        if (source.kind != "model") continue;
        const bool first = std::none_of(models.begin(), models.end(),
                                        [](const PlannedModel& m) { return m.role == "reward"; });
        // A spec with models.reward set uses the shorthand: its one source.
        const std::string key = !spec.reward.path.empty() ? "models.reward.placement"
                                                          : absl::StrCat("reward.sources.", i, ".placement");
        STRATA_RETURN_IF_ERROR(add(first ? "reward" : "reward:" + source.name, source.model, false, true, "", key));
      }
      if (spec.algorithm == Algorithm::kPpo) {
        STRATA_RETURN_IF_ERROR(add("critic", spec.critic, true, true, DefaultCriticPath(spec)));
      }
  }
  return models;
}

absl::StatusOr<MemoryPlan> PlanModelStates(const JobSpec& spec) {
  STRATA_ASSIGN_OR_RETURN(auto models, JobModels(spec));
  MemoryPlan plan;
  for (const auto& m : models) {
    if (!m.shares_base_of.empty()) {
      ModelFootprint shared;
      shared.role = m.role;
      shared.shares_base_of = m.shares_base_of;
      plan.models.push_back(shared);
      continue;
    }
    plan.models.push_back(PlanModel(m.role, m.config, m.spec, m.trainable, m.scalar_head));
  }
  for (const auto& m : plan.models) {
    for (int t = 0; t < 3; ++t) plan.total[static_cast<size_t>(t)] += m.total(t);
  }
  return plan;
}

namespace {

constexpr int kDev = 0, kHost = 1, kNvme = 2;
// NVMe Adam's staging: tiles of 2^20 elements, 12 bytes each (master and two
// moments), three in flight (offload/adam/nvme_adam.h).
constexpr int64_t kNvmeAdamTileElements = int64_t{1} << 20;
constexpr int64_t kNvmeAdamStagingBytes = 3 * 12 * kNvmeAdamTileElements;
// The arena backs its pages with huge pages, faulted in as touched.
constexpr auto kHugePage = static_cast<int64_t>(kHugePageBytes);
// Decode steps a rollout's time is priced at, at most (CostModel::Rollout).
constexpr int64_t kPricedDecodeSteps = 512;
// The NVMe store aligns every slot to a 4 KiB block.
constexpr int64_t kNvmeBlock = 4096;
// Tensors per decoder layer (q, k, v, o, gate, up, down, two norms), for
// per-slot alignment.
constexpr int64_t kTensorsPerLayer = 9;

struct ModelShape {
  const PlannedModel* model = nullptr;
  int64_t E = 4;  // bytes per weight element
  int64_t H = 0, I = 0, L = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t head_width = 0;  // vocabulary, or num_labels for a scalar head
  int64_t vocab = 0;
  int64_t layer_params = 0, resident_params = 0, params = 0;
  // Parameters whose optimizer state and gradients one rank keeps: all of
  // them, or with ZeRO over several ranks the fullest rank's whole tensors.
  int64_t shard_params = 0;
  // ZeRO: the optimizer state is sharded over the gang (several ranks, and
  // an optimizer off the device).
  bool sharded = false;
  // LoRA: the adapters' parameters (0 without), and what trains: every
  // parameter, or the adapters and a scalar head.
  int64_t adapter_params = 0, trained_params = 0;
  // GaLore: of this rank's shard, the projected matrices' parameters and
  // their small state's elements; the floating-point work of a step's
  // projections, and of a refresh spread over the steps between refreshes.
  double galore_params = 0, galore_state = 0, galore_step_flops = 0;
  // Served by another model's weights (a LoRA actor's frozen base).
  bool shared = false;
  std::string dtype;
  const offload::ModelPlacement* placement = nullptr;

  int64_t LayerBytes() const { return layer_params * E; }
  // Elements of the largest tensor: the embedding, the head or an MLP matrix.
  int64_t LargestTensor() const { return std::max({vocab * H, head_width * H, H * I, heads * head_dim * H}); }
  bool streamed() const { return placement->weights != offload::Tier::kDevice; }
  // The layers a streamed model holds on the device: the one computing and
  // those prefetched, never more than it has.
  int64_t Window() const { return streamed() ? std::min<int64_t>(placement->prefetch_depth + 1, L) * LayerBytes() : 0; }
};

ModelShape ShapeOf(const PlannedModel& m, const offload::ModelPlacement& placement, int64_t workers) {
  const LlamaConfig& c = m.config;
  ModelShape s;
  s.model = &m;
  s.dtype = m.spec.dtype;
  s.E = m.spec.dtype == "bf16" ? 2 : 4;
  s.H = c.hidden_size;
  s.I = c.intermediate_size;
  s.L = c.num_hidden_layers;
  s.heads = c.num_attention_heads;
  s.kv_heads = c.num_key_value_heads;
  s.head_dim = c.head_dim;
  s.head_width = m.scalar_head ? c.num_labels : c.vocab_size;
  s.vocab = c.vocab_size;
  s.layer_params = c.LayerParameters();
  s.resident_params = ResidentParameters(c, m.scalar_head);
  s.params = s.resident_params + s.L * s.layer_params;
  s.sharded = workers > 1 && placement.optimizer != offload::Tier::kDevice;
  s.shared = !m.shares_base_of.empty();
  s.adapter_params = m.trainable ? m.spec.lora.Parameters(c) : 0;
  std::vector<int64_t> trained_tensors = c.TrainedTensorElements(m.scalar_head);
  if (s.adapter_params > 0) {
    trained_tensors = m.spec.lora.TensorElements(c);
    if (m.scalar_head) trained_tensors.push_back(c.num_labels * c.hidden_size);
  }
  s.trained_params = 0;
  for (int64_t n : trained_tensors) s.trained_params += n;
  s.shard_params = s.sharded ? FullestShard(trained_tensors, static_cast<int>(workers)) : s.trained_params;
  if (m.trainable && m.spec.galore.enabled() && s.trained_params > 0) {
    // A shard holds its share of the projected matrices, as of the rest.
    const GaloreConfig& g = m.spec.galore;
    const double share = static_cast<double>(s.shard_params) / static_cast<double>(s.trained_params);
    s.galore_params = share * static_cast<double>(g.ProjectedParameters(c));
    s.galore_state = share * static_cast<double>(g.StateElements(c));
    s.galore_step_flops = share * (g.StepFlops(c) + g.RefreshFlops(c) / static_cast<double>(g.update_proj_gap));
  }
  s.placement = &placement;
  return s;
}

double Bytes(double elements, double bytes_each) { return elements * bytes_each; }

LayerShape LayerOf(const ModelShape& s, int64_t R, int64_t T) {
  LayerShape l;
  l.rows = R, l.tokens = T;
  l.hidden = s.H, l.intermediate = s.I, l.heads = s.heads, l.kv_heads = s.kv_heads, l.head_dim = s.head_dim;
  l.dtype_bytes = s.E;
  return l;
}

// Working bytes of one layer's forward over R rows of T tokens attending to C.
double InferLayerBytes(const ModelShape& s, int64_t R, int64_t T, int64_t C) {
  return LayerForwardBytes(LayerOf(s, R, T), C);
}

// One layer's recomputation and backward (policies/config/layer_memory.h).
double TrainLayerBytes(const ModelShape& s, int64_t R, int64_t T, bool cpu_device) {
  const LayerShape layer = LayerOf(s, R, T);
  LayerGradientBytes grads;
  if (s.adapter_params > 0) {
    // LoRA: a frozen base makes no weight gradients, only its adapters'.
    const double adapters = Bytes(static_cast<double>(s.adapter_params) / s.L, 4.0 + s.E);
    grads = {adapters, adapters, adapters};
    grads.frozen_norms = true;
  } else {
    grads = FullLayerGradients(layer, s.layer_params);
    SendHomeInFloat32(layer, cpu_device, grads);
  }
  return LayerBackwardBytes(layer, grads);
}

// The output head over R rows of T tokens, its logits at `head_tokens` of
// them (the responses, for a language-model head), forward only or with
// its backward.
double HeadBytes(const ModelShape& s, int64_t R, int64_t T, int64_t head_tokens, bool training) {
  const double logits = static_cast<double>(R * head_tokens) * static_cast<double>(s.head_width);
  // Forward: the model dtype's logits, their float32 copy and log-softmax.
  if (!training) return logits * (s.E + 8.0);
  // With its backward (hooks on the CPU device, the 51M shape and a
  // 128k-vocabulary one): float32 logits, log-probs and the two gradients
  // through log-softmax at once; then the logits and their gradient (and its
  // copy in a bf16 model's dtype) beside the head weight's gradient (none
  // for a LoRA model's frozen language-model head). Around them the final
  // norm's and the hidden state's tensors over all tokens.
  const double fp32 = 4.0 * logits;
  const bool frozen_head = s.adapter_params > 0 && !s.model->scalar_head;
  const double weight_grad = frozen_head ? 0.0 : Bytes(static_cast<double>(s.head_width) * s.H, s.E);
  const double to_dtype = s.E < 4 ? logits * s.E : 0.0;
  return std::max(4.0 * fp32, 2.0 * fp32 + to_dtype + weight_grad) + 5.0 * 4.0 * static_cast<double>(R * T * s.H);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / std::max<int64_t>(b, 1); }

// One wave of the rollout engine: `prompts` prompts of P tokens prefilled
// together, then `running` continuations of them decoding N new tokens, of
// a rank's `batch_prompts` prompts with `per_prompt` continuations each.
struct RolloutWave {
  int64_t prompts = 1, running = 1;
  int64_t batch_prompts = 1, per_prompt = 1;
};

// How a rollout decodes, for its bytes.
struct DecodeShape {
  bool cpu_device = false;
  bool graphs = false;     // fixed-shape steps kept as CUDA graphs (generation.cuda_graphs)
  bool truncates = false;  // top-k or top-p sort the logits
};

// One layer's keys and values gathered out of the KV blocks for a decode
// step off the CPU, R rows of C positions (the fused kernel takes no
// block table).
double GatheredKvBytes(const ModelShape& s, int64_t R, int64_t C) {
  return 2.0 * static_cast<double>(R * C * s.kv_heads * s.head_dim) * s.E;
}

// A decode step's working set beside the KV pool: its logits, the
// sampler's work over them (8 bytes an entry: the probabilities and a
// log-sum-exp's temporary; 16 more where top-k or top-p sort them:
// tests/policies/train/sampler_memory_test.cc measures both), and off the
// CPU the race's Philox words (a chunk at most) and one layer's gathered
// keys and values.
double DecodeStepBytes(const ModelShape& s, int64_t R, int64_t C, const DecodeShape& d) {
  const double entries = static_cast<double>(R * s.head_width);
  double bytes = HeadBytes(s, R, 1, 1, false) + (d.truncates ? 24.0 : 8.0) * entries;
  if (!d.cpu_device) {
    bytes += std::min(static_cast<double>(kRaceBytesPerEntry) * entries, static_cast<double>(kRaceChunkBytes)) +
             GatheredKvBytes(s, R, C);
  }
  return bytes;
}

// One KV block of every layer.
int64_t KvBlockBytes(const ModelShape& s, const RolloutEngineOptions& e) {
  return 2 * s.L * e.kv_block_tokens * s.kv_heads * s.head_dim * s.E;
}

// The default pool of a wave's concurrency: the engine's own worst case
// (WorstCasePoolBlocks) of `running` continuations at once.
double WaveKvBytes(const ModelShape& s, const RolloutWave& w, int64_t P, int64_t N, const RolloutEngineOptions& e) {
  RolloutEngineOptions at_once = e;
  at_once.max_concurrency = w.running;
  const std::vector<int64_t> lengths(static_cast<size_t>(w.batch_prompts), P);
  const std::vector<std::vector<int64_t>> caps(static_cast<size_t>(w.batch_prompts),
                                               std::vector<int64_t>(static_cast<size_t>(w.per_prompt), N));
  return static_cast<double>(WorstCasePoolBlocks(lengths, caps, at_once) * KvBlockBytes(s, e));
}

// Continuations a pool of `pool_blocks` decodes at once when each runs to
// N tokens, as the engine admits them: whole prompts (all of a prompt's
// continuations when they share its blocks, else one) while they fit, and
// a prompt alone forks what fits. 0: not one continuation fits.
int64_t PoolConcurrency(int64_t pool_blocks, int64_t P, int64_t N, int64_t per_prompt, const RolloutEngineOptions& e) {
  const int64_t bt = e.kv_block_tokens;
  const int64_t prompt_blocks = CeilDiv(P, bt), own = OwnKvBlocks(P, N, bt);
  const int64_t partial = P % bt != 0 ? 1 : 0;  // the last to fork takes the prompt's partly filled block
  if (!e.share_prefixes) return pool_blocks / (prompt_blocks + own - partial);
  const int64_t whole = pool_blocks / (prompt_blocks + per_prompt * own - partial);
  if (whole > 0) return whole * per_prompt;
  return std::clamp<int64_t>((pool_blocks - prompt_blocks) / own, 0, per_prompt);
}

// Device bytes of a wave: the KV blocks (the spec's pool, or the wave's
// default pool), then the prefill's working set or a decode step's. With
// CUDA graphs the graphs' pool keeps a step of the widest bucket for the
// whole rollout, prefills beside it.
double RolloutBytes(const ModelShape& s, const RolloutWave& w, int64_t P, int64_t N, const RolloutEngineOptions& e,
                    const DecodeShape& d) {
  // A pool the spec sizes is allocated whole.
  const double kv = e.kv_pool_mib > 0 ? static_cast<double>(e.kv_pool_mib << 20) : WaveKvBytes(s, w, P, N, e);
  const int64_t prefill_rows = e.share_prefixes ? w.prompts : w.running;
  const double prefill = InferLayerBytes(s, prefill_rows, P, P) + HeadBytes(s, prefill_rows, 1, 1, false);
  const int64_t widest = P + std::max<int64_t>(N, 1) - 1;
  if (!d.graphs) return kv + std::max(prefill, DecodeStepBytes(s, w.running, widest, d));
  const double step = DecodeStepBytes(s, RowBucket(w.running), ColumnBucket(widest, e.kv_block_tokens, widest), d);
  return kv + prefill + step;
}

double ScoreBytes(const ModelShape& s, int64_t R, int64_t T, int64_t head_tokens) {
  return InferLayerBytes(s, R, T, T) + HeadBytes(s, R, T, head_tokens, false);
}

// Layer inputs a training step keeps on the device: every layer's and the
// top's (in backward, the gradient arriving at a layer takes its place),
// or with activations off the device a window of three (the one in
// use, one in transit each way: offload/stream/activation_stash.h).
double KeptActivationBytes(const ModelShape& s, int64_t R, int64_t T) {
  const int64_t kept = s.placement->activations == offload::Tier::kDevice ? s.L + 1 : std::min<int64_t>(3, s.L + 1);
  return static_cast<double>(kept) * R * T * s.H * s.E;
}

double UpdateBytes(const ModelShape& s, int64_t R, int64_t T, int64_t head_tokens, bool cpu_device) {
  return KeptActivationBytes(s, R, T) +
         std::max(HeadBytes(s, R, T, head_tokens, true), TrainLayerBytes(s, R, T, cpu_device));
}

// The cost model: seconds of the operations a phase runs.
class CostModel {
 public:
  CostModel(const HardwareFigures& f, bool cpu_device) : f_(f), cpu_device_(cpu_device) {}

  double Linear(int64_t m, int64_t k, int64_t n, const std::string& dtype) const {
    return f_.MatmulSeconds(m, k, n, dtype);
  }
  double Copy(double bytes) const { return bytes / f_.memory_copy_bytes_per_s; }

  // One layer's forward: R rows of Tq new tokens attending to C.
  double LayerForward(const ModelShape& s, int64_t R, int64_t Tq, int64_t C) const {
    const int64_t m = R * Tq;
    const int64_t q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
    double t = Linear(m, s.H, q, s.dtype) + 2 * Linear(m, s.H, kv, s.dtype) + Linear(m, q, s.H, s.dtype) +
               2 * Linear(m, s.H, s.I, s.dtype) + Linear(m, s.I, s.H, s.dtype);
    // Scores and their product with values: R x heads products of [Tq, d] x [d, C].
    const double batched = static_cast<double>(R * s.heads);
    if (BlockedAttentionFor(Tq, C)) {
      // In blocks, at their own measured rate, counted as the kernel
      // computes them: whole block pairs, those causality hides skipped.
      const auto scores = static_cast<double>(BlockedAttentionScores(Tq, C));
      t += 4.0 * batched * s.head_dim * scores / f_.BlockedAttentionFlops(s.head_dim);
    } else {
      t += 2 * (batched * (Linear(Tq, s.head_dim, C, s.dtype) - f_.op_overhead_s) + f_.op_overhead_s);
    }
    // Norms, rotary embedding, softmax, activations and residuals: memory
    // traffic plus a fixed cost per operation.
    double elementwise = (14.0 * m * s.H + 4.0 * m * s.I) * s.E + 12.0 * R * s.heads * Tq * C;
    // A decode step off the CPU attends over a gathered copy of its KV
    // blocks: each byte read from the pool and written to the copy.
    if (!cpu_device_ && Tq == 1 && C > 1) elementwise += 2.0 * GatheredKvBytes(s, R, C);
    return t + Copy(elementwise) + f_.layer_overhead_s;
  }
  // Bringing a streamed model's layers in once.
  double Stream(const ModelShape& s) const {
    const double bytes = static_cast<double>(s.L * s.LayerBytes());
    switch (s.placement->weights) {
      case offload::Tier::kHost:
        return bytes / f_.host_stream_bytes_per_s;
      case offload::Tier::kNvme:
        return bytes / f_.nvme_stream_bytes_per_s;
      default:
        return 0.0;
    }
  }
  // Compute and streaming overlap: on a GPU the prefetch runs on copy
  // streams; on a CPU device the streamer's own thread copies (or reads from
  // NVMe) while the compute threads run, which hides the copy behind passes
  // over whole sequences. A decoding step from the host arena is another
  // matter on a CPU device: its products read every weight for a few rows
  // of arithmetic, and the streamer's memcpy contends with them for DRAM,
  // so the two add up (measured on the 2-vCPU machine: the medium PPO
  // rollout with its actor streamed from the host took 0.8-1.0 s longer
  // than resident for 5 GB copied; the update, whose passes are
  // compute-bound, took the same). Reads from NVMe are the disk's DMA, not
  // a copy, and overlap decoding too: the Llama-2-7B LoRA rollout took 627 s
  // on the AVX-512 machine, where all of it but its reads prices at 441 s
  // and its 1.66 TB of reads, at the streaming rate measured that hour, at
  // 527 s. The streaming figures are taken where compute is negligible:
  // the copy's own rate.
  double WithStream(const ModelShape& s, double compute, double stream, bool decoding) const {
    const bool copied = s.placement->weights == offload::Tier::kHost;
    return cpu_device_ && decoding && copied ? compute + stream : std::max(compute, stream);
  }
  // A forward pass through every layer and the head.
  double Pass(const ModelShape& s, int64_t R, int64_t Tq, int64_t C, int64_t head_positions) const {
    const double layers = static_cast<double>(s.L) * LayerForward(s, R, Tq, C);
    const double head = Linear(head_positions, s.H, s.head_width, s.dtype) +
                        Copy(static_cast<double>(head_positions) * s.head_width * 4.0 * 3.0) +
                        Copy(static_cast<double>(R * Tq * s.H) * s.E * 2.0);
    return WithStream(s, layers, Stream(s), /*decoding=*/Tq == 1) + head;
  }
  // A wave of the rollout engine: one prefill of its prompts (of each
  // continuation when prefixes are not shared), then N - 1 decode steps of
  // every continuation (the worst case: none ends early).
  double Rollout(const ModelShape& s, const RolloutWave& w, int64_t P, int64_t N, bool share) const {
    const int64_t prefill_rows = share ? w.prompts : w.running;
    double t = Pass(s, prefill_rows, P, P, prefill_rows);
    // Each decode step's cost at its context: exact up to kPricedDecodeSteps
    // steps; beyond, that many spans each priced at its middle step (the
    // cost grows smoothly with the context), so a fit over responses of
    // 100k tokens stays quick.
    const int64_t stride = std::max<int64_t>(1, CeilDiv(N - 1, kPricedDecodeSteps));
    for (int64_t step = 1; step < N; step += stride) {
      const int64_t span = std::min(stride, N - step);
      t += static_cast<double>(span) * Pass(s, w.running, 1, P + step + (span - 1) / 2, w.running);
    }
    // Sampling: softmax, sort for top-p, draws; on the CPU.
    t += static_cast<double>(N) *
         (Copy(static_cast<double>(w.running) * s.head_width * 4.0 * 6.0) + f_.decode_step_overhead_s);
    return t;
  }
  // Forward without autograd, a head pass with its backward, then each layer
  // recomputed with its backward (about twice a forward's work).
  double ForwardBackward(const ModelShape& s, int64_t R, int64_t T, int64_t head_tokens) const {
    const double layer = LayerForward(s, R, T, T);
    // Forward, recomputation, and a backward of two forwards' work (input
    // and weight gradients); with LoRA the frozen base's weight gradients
    // are skipped, about one forward less.
    const double compute = static_cast<double>(s.L) * (s.adapter_params > 0 ? 3.0 : 4.0) * layer;
    const double head = 3.0 * Linear(R * head_tokens, s.H, s.head_width, s.dtype) +
                        Copy(static_cast<double>(R * head_tokens) * s.head_width * 4.0 * 6.0);
    // Each layer's gradients added into the host fp32 buffers.
    const double grads = Copy(static_cast<double>(s.trained_params) * (4.0 * 3.0 + s.E));
    // Activations off the device: every layer's input leaves in forward and
    // comes back in backward. The NVMe reads and writes run beside the
    // compute (the last two layers' inputs stay staged: no I/O); the
    // copies to and from the host do too on a GPU, and on the CPU device
    // are memcpys on the compute thread.
    const double kept = static_cast<double>(s.L * R * T * s.H * s.E);
    double hidden_io = 0.0, activation_copies = 0.0;
    if (s.placement->activations != offload::Tier::kDevice) {
      if (cpu_device_) activation_copies = 2.0 * Copy(kept);
      if (s.placement->activations == offload::Tier::kNvme) {
        const double moved = kept * static_cast<double>(std::max<int64_t>(s.L - 2, 0)) / static_cast<double>(s.L);
        hidden_io = moved / f_.nvme_write_bytes_per_s + moved / f_.nvme_read_bytes_per_s;
      } else if (!cpu_device_) {
        hidden_io = 2.0 * kept / f_.host_stream_bytes_per_s;
      }
    }
    return std::max(WithStream(s, compute, 2.0 * Stream(s), /*decoding=*/false), hidden_io) + head + grads +
           activation_copies;
  }
  // One optimizer step over a rank's shard, and the new weights written home.
  double OptimizerStep(const ModelShape& s) const {
    const double full = static_cast<double>(s.shard_params) - s.galore_params;  // full Adam's
    double t = 0;
    switch (s.placement->optimizer) {
      case offload::Tier::kDevice:
        t = full / f_.device_adam_params_per_s;
        break;
      case offload::Tier::kHost:
        t = full / f_.adam_params_per_s;
        break;
      case offload::Tier::kNvme:
        t = full / f_.NvmeAdamParamsPerSecond();
        break;
    }
    if (s.galore_params > 0) {
      // GaLore's projections (on the device for a device optimizer, else
      // the host), the direction applied (master, gradient and direction
      // read, master written), and on NVMe the master's 4 bytes each way.
      const double rate = s.placement->optimizer == offload::Tier::kDevice ? f_.LargeMatmulFlops()
                                                                           : f_.HostMatmulFlops();
      t += s.galore_step_flops / rate + Copy(16.0 * s.galore_params);
      if (s.placement->optimizer == offload::Tier::kNvme) {
        t += s.galore_params * (4.0 / f_.nvme_read_bytes_per_s + 4.0 / f_.nvme_write_bytes_per_s);
      }
    }
    const double layers = static_cast<double>(s.L * s.LayerBytes());
    // Updated layers go home to NVMe; a LoRA base never changes.
    if (s.placement->weights == offload::Tier::kNvme && s.adapter_params == 0) t += layers / f_.nvme_write_bytes_per_s;
    t += Copy(static_cast<double>(s.trained_params) * (4.0 + s.E));  // norm, clip, write back
    // Sharded, the updated weights come from each shard's owner.
    if (s.sharded) t += static_cast<double>(s.trained_params) * s.E / f_.allreduce_bytes_per_s;
    return t;
  }
  // One sum of the gradients over the gang: every micro-batch's when the
  // optimizer is sharded (ZeRO-2 keeps no other rank's gradients between
  // them), else once a step.
  double GradientSum(const ModelShape& s, int64_t workers) const {
    return workers > 1 ? static_cast<double>(s.trained_params) * 4.0 / f_.allreduce_bytes_per_s : 0.0;
  }

 private:
  const HardwareFigures& f_;
  const bool cpu_device_;
};

int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// Micro-batches of `rows`: their count and the largest one's size.
std::pair<int64_t, int64_t> Micro(int64_t rows, int64_t micro) {
  rows = std::max<int64_t>(rows, 1);
  if (micro <= 0 || micro >= rows) return {1, rows};
  return {CeilDiv(rows, micro), micro};
}

}  // namespace

JobPrediction PredictJob(const JobSpec& spec, const std::vector<PlannedModel>& models, const HardwareFigures& figures,
                         int64_t workers) {
  workers = std::max<int64_t>(workers, 1);
  JobPrediction out;
  out.micro_batch_size = spec.train.micro_batch_size;
  const bool cpu_device = spec.memory.on_cpu();
  const CostModel cost(figures, cpu_device);
  std::map<std::string, ModelShape> shapes;
  for (const auto& m : models) {
    if (!m.shares_base_of.empty()) {
      out.shares_base_of[m.role] = m.shares_base_of;
      continue;
    }
    out.placement[m.role] = m.spec.placement;
    out.trainable[m.role] = m.trainable;
    out.placement_key[m.role] = m.placement_key;
  }
  for (const auto& m : models) {
    // A shared base computes under its owner's placement.
    const std::string& owner = m.shares_base_of.empty() ? m.role : m.shares_base_of;
    shapes[m.role] = ShapeOf(m, out.placement.at(owner), workers);
  }
  auto has = [&](const char* role) { return shapes.count(role) > 0; };

  // State that lives through every phase.
  std::array<double, 3> resident{};
  // The buffers of a step (step_in_backward's layer, GaLore's directions),
  // which the arena keeps pooled between steps and the trained models
  // share (measured): the largest model's.
  double step_buffers = 0.0;
  // Arena bytes reserved but never written, so never resident.
  double untouched_staging = 0.0;
  // What each model adds to the device and host tiers once placed, and the
  // part of it that is the loaded tensors themselves (kept where they lie).
  struct Placed {
    double device = 0.0, host = 0.0, loaded_kept = 0.0;
  };
  std::map<std::string, Placed> placed;
  for (const auto& [role, s] : shapes) {
    if (s.shared) {
      placed[role] = Placed();
      continue;
    }
    const auto& p = *s.placement;
    const std::array<double, 3> before = resident;
    const double untouched_before = untouched_staging;
    resident[kDev] += static_cast<double>((s.resident_params + s.adapter_params) * s.E);
    const double layers = static_cast<double>(s.L * s.LayerBytes());
    if (p.weights == offload::Tier::kDevice) resident[kDev] += layers;
    // On a CPU device the window's buffers are pooled and kept between passes.
    if (cpu_device) resident[kDev] += static_cast<double>(s.Window());
    if (p.weights == offload::Tier::kHost) resident[kHost] += layers;
    if (p.weights == offload::Tier::kNvme) resident[kNvme] += layers + s.L * kTensorsPerLayer * kNvmeBlock;
    if (!cpu_device && p.weights == offload::Tier::kNvme) resident[kHost] += static_cast<double>(s.Window());
    // Training state: made when the model is placed, except the step scratch.
    double step_scratch = 0.0;
    if (s.model->trainable) {
      const double params = static_cast<double>(s.trained_params);
      const double shard = static_cast<double>(s.shard_params);
      const double layer_trained = s.adapter_params > 0 ? static_cast<double>(s.adapter_params) / s.L
                                                        : static_cast<double>(s.layer_params);
      // Gradient buffers: every parameter's; with several ranks (ZeRO-2) the
      // held share plus, borrowed, the others' share of two layers (one
      // summing while the next is made); with step_in_backward only the
      // resident tensors' plus one layer's (below).
      double grads = 4.0 * params;
      if (workers > 1) {
        const double others = static_cast<double>(workers - 1) / static_cast<double>(workers);
        grads = 4.0 * shard + 2.0 * 4.0 * layer_trained * others;
      }
      // What this model's step holds besides: one layer's gradient with
      // step_in_backward (and its new weights' scratch for NVMe-homed
      // layers); GaLore's directions of its largest projection (one on the
      // host; on NVMe two matrices' direction and new weights, one
      // streaming while the next is computed).
      double step_held = 0.0;
      if (p.step_in_backward) {
        grads = 4.0 * static_cast<double>(s.resident_params);
        const double layer = 4.0 * static_cast<double>(s.layer_params);
        const bool scratch = p.optimizer == offload::Tier::kNvme && p.weights == offload::Tier::kNvme;
        step_held += layer * (scratch ? 2.0 : 1.0);
      }
      if (s.galore_params > 0) {
        step_held += (p.optimizer == offload::Tier::kNvme ? 16.0 : 4.0) * static_cast<double>(s.H) *
                     static_cast<double>(s.I);
      }
      step_buffers = std::max(step_buffers, step_held);
      switch (p.optimizer) {
        case offload::Tier::kDevice:
          resident[kDev] += 16.0 * params - 8.0 * s.galore_params + 4.0 * s.galore_state;
          break;
        case offload::Tier::kHost:
          resident[kHost] += grads + 12.0 * shard - 8.0 * s.galore_params + 4.0 * s.galore_state;
          break;
        case offload::Tier::kNvme:
          resident[kHost] += grads + kNvmeAdamStagingBytes + 4.0 * s.galore_state;
          // A tile holds one tensor's elements: a model whose largest tensor
          // is under a tile never touches the rest of its staging buffers.
          untouched_staging += static_cast<double>(
              kNvmeAdamStagingBytes -
              3 * std::min(12 * kNvmeAdamTileElements, RoundUp(12 * s.LargestTensor(), kHugePage)));
          // New fp32 weights of NVMe-homed layers wait in host scratch until
          // the step has updated every tensor, then go home (one layer's with
          // step_in_backward: counted in the update phase).
          if (p.weights == offload::Tier::kNvme && !p.step_in_backward) {
            step_scratch = 4.0 * static_cast<double>(s.L * s.layer_params);
            resident[kHost] += step_scratch;
          }
          resident[kNvme] += 12.0 * shard - 8.0 * s.galore_params + 3.0 * kNvmeBlock * (s.L * kTensorsPerLayer + 3);
          break;
      }
      // A GPU with host gradients stages two layers of them in pinned memory.
      if (!cpu_device && p.gradients == offload::Tier::kHost) resident[kHost] += 2.0 * 4.0 * layer_trained;
    }
    Placed& added = placed[role];
    added.device = resident[kDev] - before[kDev];
    added.host = resident[kHost] - before[kHost] - (untouched_staging - untouched_before) - step_scratch;
    added.loaded_kept = static_cast<double>(s.resident_params * s.E) +
                        (p.weights == offload::Tier::kDevice ? layers : 0.0);
  }
  resident[kHost] += step_buffers;

  const int64_t rows = CeilDiv(spec.train.batch_size, workers);  // prompts (or examples) per rank
  const int64_t P = spec.data.max_prompt_tokens;
  const int64_t N = spec.generation.max_new_tokens;
  const int64_t T = P + N;
  const int64_t micro = spec.train.micro_batch_size;

  // Phases: the transient device peak is the largest of its passes.
  struct Phase {
    double transient = 0.0;  // device bytes beyond the resident state
    double seconds = 0.0;
    void Pass(double bytes, double s) { transient = std::max(transient, bytes), seconds += s; }
  };
  // The streaming window counts with a pass unless it is kept (CPU device).
  auto window = [&](const ModelShape& s) { return cpu_device ? 0.0 : static_cast<double>(s.Window()); };
  std::map<std::string, Phase> phases;
  // The rollout engine decodes `prompts` x `per_prompt` continuations, at
  // most max_concurrency (else train.micro_batch_size) at once, in waves.
  const RolloutEngineOptions& engine = spec.generation.engine;
  // The pool bounds the wave too: a pool the spec sizes holds the
  // continuations whose worst case fits in it, and the default pool
  // (kv_pool_mib 0) takes what memory.device_mib leaves beside the resident
  // state, the window and the wave's working set (RolloutConcurrency).
  auto generate = [&](const ModelShape& s, int64_t prompts, int64_t per_prompt) {
    const int64_t total = std::max<int64_t>(prompts * per_prompt, 1);
    const int64_t limit = engine.max_concurrency > 0 ? engine.max_concurrency : micro;
    DecodeShape decode;
    decode.cpu_device = cpu_device;
    decode.graphs = !cpu_device && engine.cuda_graphs && s.placement->weights == offload::Tier::kDevice;
    decode.truncates = spec.generation.top_k > 0 || spec.generation.top_p < 1.0;
    auto wave_of = [&](int64_t running) {
      RolloutWave w;
      w.running = running;
      w.prompts = std::min(prompts, CeilDiv(running, per_prompt));
      w.batch_prompts = prompts;
      w.per_prompt = per_prompt;
      return w;
    };
    auto fits = [&](int64_t running) {
      return resident[kDev] + window(s) + RolloutBytes(s, wave_of(running), P, N, engine, decode) <=
             static_cast<double>(spec.memory.device_mib << 20);
    };
    int64_t running = limit > 0 ? std::min(limit, total) : total;
    if (engine.kv_pool_mib > 0) {
      // Where not one continuation fits the pool, the rollout fails naming
      // kv_pool_mib; the plan prices the spec's concurrency.
      const int64_t held = PoolConcurrency((engine.kv_pool_mib << 20) / KvBlockBytes(s, engine), P, N, per_prompt,
                                           engine);
      if (held > 0) running = std::min(running, held);
    } else if (spec.memory.device_mib > 0 && !fits(running) && fits(1)) {
      // Where not even one fits, the plan overflows at the spec's own
      // concurrency (throttling would not make it fit).
      int64_t lo = 1, hi = running;  // the most that fit
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        if (fits(mid)) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      running = lo;
    }
    const RolloutWave wave = wave_of(running);
    out.rollout_concurrency = wave.running;
    out.rollout_continuations = total;
    const int64_t waves = CeilDiv(total, wave.running);
    phases["rollout"].Pass(window(s) + RolloutBytes(s, wave, P, N, engine, decode),
                           static_cast<double>(waves) * cost.Rollout(s, wave, P, N, engine.share_prefixes));
  };
  // A language-model head runs at the response positions only (the
  // trainer's and the scorer's LogitsAt); a scalar head at every token.
  const int64_t responses = spec.algorithm == Algorithm::kSft ? spec.data.max_response_tokens : N;
  auto head_tokens = [&](const ModelShape& s, int64_t tokens) {
    return s.model->scalar_head ? tokens : std::min(responses, tokens);
  };
  auto score = [&](const ModelShape& s, int64_t n_rows) {
    const auto [count, size] = Micro(n_rows, micro);
    const int64_t head = head_tokens(s, T);
    phases["score"].Pass(window(s) + ScoreBytes(s, size, T, head), count * cost.Pass(s, size, T, T, size * head));
  };
  // Activations kept off the device: each trained model's stash holds its
  // buffers (grown to the largest step) from its first step on.
  std::array<double, 3> stashed{};
  // `steps` gradient steps of `step_rows` rows each, at `tokens` per row.
  auto update = [&](const ModelShape& s, int64_t steps, int64_t step_rows, int64_t tokens) {
    const auto [count, size] = Micro(step_rows, micro);
    const double stride = static_cast<double>(RoundUp(size * tokens * s.H * s.E, kNvmeBlock));
    if (s.placement->activations == offload::Tier::kHost) {
      stashed[kHost] += static_cast<double>(RoundUp(static_cast<int64_t>(s.L * stride), kHugePage));
    } else if (s.placement->activations == offload::Tier::kNvme) {
      stashed[kHost] += 2.0 * static_cast<double>(RoundUp(static_cast<int64_t>(stride), kHugePage));
      stashed[kNvme] += static_cast<double>(std::max<int64_t>(s.L - 2, 0)) * stride;  // the last two stay staged
    }
    const double sums = (s.sharded ? count : 1) * cost.GradientSum(s, workers);
    const int64_t head = head_tokens(s, tokens);
    phases["update"].Pass(window(s) + UpdateBytes(s, size, tokens, head, cpu_device),
                          steps * (count * cost.ForwardBackward(s, size, tokens, head) + sums + cost.OptimizerStep(s)));
  };
  switch (spec.algorithm) {
    case Algorithm::kSft:
      update(shapes["actor"], 1, rows, P + spec.data.max_response_tokens);
      break;
    case Algorithm::kRewardModel:
      update(shapes["reward"], 1, 2 * rows, P + spec.data.max_response_tokens);
      break;
    case Algorithm::kRemax:
      generate(shapes["actor"], rows, 2);  // a sample and the greedy baseline
      if (has("reward")) score(shapes["reward"], rows), score(shapes["reward"], rows);
      score(shapes["reference"], rows);
      update(shapes["actor"], 1, rows, T);
      break;
    case Algorithm::kPpo: {
      generate(shapes["actor"], rows, 1);
      if (has("reward")) score(shapes["reward"], rows);
      score(shapes["reference"], rows);
      score(shapes["critic"], rows);
      const int64_t steps = spec.ppo.epochs * std::max<int64_t>(spec.ppo.minibatches, 1);
      const int64_t step_rows = CeilDiv(rows, std::max<int64_t>(spec.ppo.minibatches, 1));
      update(shapes["actor"], steps, step_rows, T);
      update(shapes["critic"], steps, step_rows, T);
      break;
    }
    case Algorithm::kGrpo:
    case Algorithm::kRloo: {
      const int64_t group_rows = rows * spec.group.samples_per_prompt;
      generate(shapes["actor"], rows, spec.group.samples_per_prompt);
      if (has("reward")) score(shapes["reward"], group_rows);
      score(shapes["reference"], group_rows);
      update(shapes["actor"], 1, group_rows, T);
      break;
    }
  }

  resident[kHost] += stashed[kHost];
  resident[kNvme] += stashed[kNvme];
  int64_t host_peak = 0, device_peak = 0;
  for (const auto& [name, phase] : phases) {
    PhasePrediction p;
    p.peak[kDev] = static_cast<int64_t>(resident[kDev] + phase.transient);
    p.peak[kHost] = static_cast<int64_t>(resident[kHost]);
    p.peak[kNvme] = static_cast<int64_t>(resident[kNvme]);
    p.seconds = phase.seconds;
    for (int t = 0; t < 3; ++t) out.peak[t] = std::max(out.peak[t], p.peak[t]);
    out.iteration_s += p.seconds;
    out.phases[name] = p;
    host_peak = std::max(host_peak, p.peak[kHost]);
    device_peak = std::max(device_peak, p.peak[kDev]);
  }
  // Peak RSS: the process's baseline, the arena's touched pages (all of it
  // when pinned), the device tier when it is host memory; or, if larger, a
  // moment of loading (below).
  const bool pinned = spec.memory.pin_host;
  const int64_t arena = pinned ? std::max(host_peak, spec.memory.host_mib << 20)
                               : host_peak - static_cast<int64_t>(untouched_staging);
  const double steady = static_cast<double>(arena) + (cpu_device ? static_cast<double>(device_peak) : 0.0);
  // Models load one at a time, in the order JobModels lists them (as
  // LocalWorkerGroup::LoadModels does): all of a model's tensors are read
  // into host memory, one tensor of its file resident at a time, then placed (streamed layers copied to the arena
  // or written to NVMe, master weights and states made) before the loaded
  // tensors that moved are freed. Beside it: the models placed before it.
  double loading = 0.0, before_host = pinned ? static_cast<double>(arena) : 0.0, before_device = 0.0;
  for (const auto& m : models) {
    const ModelShape& s = shapes.at(m.role);
    if (s.shared) continue;  // never loaded
    const Placed& p = placed.at(m.role);
    const double full = static_cast<double>(s.params * s.E);
    const double added = (pinned ? 0.0 : p.host) + (cpu_device ? p.device - p.loaded_kept : 0.0);
    const double file_tensor = static_cast<double>(s.LargestTensor() * s.E);
    loading = std::max(loading, before_host + before_device + full + std::max(added, file_tensor));
    if (!pinned) before_host += p.host;
    if (cpu_device) before_device += p.device;
  }
  out.process_rss_bytes = figures.process_baseline_bytes + static_cast<int64_t>(std::max(steady, loading));
  return out;
}

absl::StatusOr<Hardware> ParseHardware(const std::string& text) {
  Hardware hw;
  bool have_host = false, have_device = false;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const size_t eq = part.find('=');
    const std::string key(part.substr(0, eq));
    const std::string value(eq == absl::string_view::npos ? "" : part.substr(eq + 1));
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("--fit: '", part, "': ", why));
    };
    if (eq == absl::string_view::npos) return bad("expected TIER=SIZE (device, host, nvme)");
    if (key == "device" && value == "cpu") {
      hw.cpu_device = true, have_device = true;
      continue;
    }
    // A number and a unit.
    size_t digits = 0;
    while (digits < value.size() && (std::isdigit(static_cast<unsigned char>(value[digits])) || value[digits] == '.')) {
      ++digits;
    }
    double number = 0;
    if (digits == 0 || !absl::SimpleAtod(value.substr(0, digits), &number)) return bad("the size is not a number");
    static const std::map<std::string, double> kUnits = {
        {"", 1.0},   {"B", 1.0},  {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
        {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9},     {"TB", 1e12}};
    auto unit = kUnits.find(value.substr(digits));
    if (unit == kUnits.end()) return bad("unknown unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
    const auto bytes = static_cast<int64_t>(number * unit->second);
    if (key == "device") {
      hw.device_bytes = bytes, have_device = true;
    } else if (key == "host") {
      hw.host_bytes = bytes, have_host = true;
    } else if (key == "nvme") {
      hw.nvme_bytes = bytes;
    } else {
      return bad("unknown tier (device, host, nvme)");
    }
  }
  if (!have_host) return absl::InvalidArgumentError("--fit: host=SIZE is required (the worker's RAM)");
  if (!have_device) return absl::InvalidArgumentError("--fit: device=SIZE (or device=cpu) is required");
  return hw;
}

bool Fits(const JobPrediction& p, const Hardware& hw, std::string* binding_tier, double* overshoot) {
  // Each tier's need against its offer; on a CPU device the process's RSS
  // (device tier included) is what must fit the host.
  std::vector<std::pair<std::string, double>> ratios;
  auto ratio = [](int64_t need, int64_t offer) {
    if (need <= 0) return 0.0;
    return offer <= 0 ? 1e30 : static_cast<double>(need) / static_cast<double>(offer);
  };
  if (!hw.cpu_device) ratios.push_back({"device", ratio(p.peak[kDev], hw.device_bytes)});
  ratios.push_back({"host", ratio(p.process_rss_bytes, hw.host_bytes)});
  ratios.push_back({"nvme", ratio(p.peak[kNvme], hw.nvme_bytes)});
  auto worst = std::max_element(ratios.begin(), ratios.end(),
                                [](const auto& a, const auto& b) { return a.second < b.second; });
  if (binding_tier != nullptr) *binding_tier = worst->first;
  if (overshoot != nullptr) *overshoot = worst->second;
  return worst->second <= 1.0;
}

FitResult FitJob(const JobSpec& spec, const std::vector<PlannedModel>& models, const HardwareFigures& figures,
                 const Hardware& hardware, int64_t workers, bool vary_micro_batch, bool vary_activations) {
  using offload::Tier;
  // Each model's options: the engine's supported combinations.
  std::vector<std::vector<offload::ModelPlacement>> options;
  // Updating layers inside the backward pass needs the whole gradient of a
  // step in one pass, unclipped, on one rank (JobSpec::Validate).
  const bool step_in_backward_allowed = spec.train.max_grad_norm <= 0 && workers <= 1;
  for (const auto& m : models) {
    std::vector<offload::ModelPlacement> mine;
    if (!m.shares_base_of.empty()) {  // follows its owner's
      options.push_back({offload::ModelPlacement()});
      continue;
    }
    for (Tier weights : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
      if (weights == Tier::kNvme && hardware.nvme_bytes <= 0) continue;
      for (int prefetch : {1, 2}) {
        if (weights == Tier::kDevice && prefetch > 1) continue;
        std::vector<Tier> optimizers = {Tier::kHost};
        if (m.trainable) {
          if (weights == Tier::kDevice && !hardware.cpu_device) optimizers.push_back(Tier::kDevice);
          if (hardware.nvme_bytes > 0) optimizers.push_back(Tier::kNvme);
        }
        for (Tier optimizer : optimizers) {
          offload::ModelPlacement p;
          p.weights = weights;
          p.optimizer = optimizer;
          p.gradients = optimizer == Tier::kDevice ? Tier::kDevice : Tier::kHost;
          p.prefetch_depth = prefetch;
          if (m.trainable && !vary_activations) p.activations = m.spec.placement.activations;
          mine.push_back(p);
          if (m.trainable && optimizer != Tier::kDevice && step_in_backward_allowed && !m.spec.trains_adapters()) {
            p.step_in_backward = true;
            mine.push_back(p);
          }
        }
      }
    }
    options.push_back(std::move(mine));
  }
  std::vector<int64_t> micros;
  const int64_t rows = std::max<int64_t>(1, CeilDiv(spec.train.batch_size, std::max<int64_t>(workers, 1)));
  const int64_t first = spec.train.micro_batch_size > 0 ? std::min(spec.train.micro_batch_size, rows) : rows;
  micros.push_back(spec.train.micro_batch_size > 0 ? first : 0);
  if (vary_micro_batch) {
    if (micros.front() != 0) micros.push_back(0);  // the whole batch
    for (int64_t m = int64_t{1} << 20; m >= 1; m /= 2) {
      if (m < first) micros.push_back(m);
    }
  }

  FitResult result;
  double nearest = 1e300;
  std::vector<JobPrediction> fits;
  JobSpec trial = spec;
  // The device the hardware names decides what the phases cost (copies,
  // streaming, the rollout's steps) and what the process's RSS holds.
  std::string device;
  if (hardware.cpu_device != spec.memory.on_cpu()) {
    device = hardware.cpu_device ? "cpu" : "cuda:0";
    trial.memory.device = device;
    trial.memory.device_index = hardware.cpu_device ? -1 : 0;
  }
  // Every combination of the models' options and micro-batches, with the
  // models' GaLore settings as `base` has them (`galore_rank`: those the
  // fit added, recorded in each prediction).
  auto search = [&](const std::vector<PlannedModel>& base, const std::map<std::string, int64_t>& galore_rank) {
    std::vector<size_t> pick(models.size(), 0);
    std::vector<PlannedModel> placed = base;
    while (true) {
      for (size_t i = 0; i < models.size(); ++i) placed[i].spec.placement = options[i][pick[i]];
      for (auto& m : placed) {
        if (m.shares_base_of.empty()) continue;
        for (const auto& owner : placed) {
          if (owner.role == m.shares_base_of) m.spec.placement = owner.spec.placement;
        }
      }
      bool any_step_in_backward = false;
      for (const auto& m : placed) any_step_in_backward |= m.spec.placement.step_in_backward;
      for (int64_t micro : micros) {
        if (any_step_in_backward && micro > 0 && micro < rows) continue;
        trial.train.micro_batch_size = micro;
        JobPrediction p = PredictJob(trial, placed, figures, workers);
        p.galore_rank = galore_rank;
        p.device = device;
        ++result.tried;
        std::string tier;
        double over = 0;
        if (Fits(p, hardware, &tier, &over)) {
          fits.push_back(std::move(p));
        } else if (fits.empty() && over < nearest) {
          nearest = over;
          result.binding_tier = tier;
          result.chosen = std::move(p);
        }
      }
      size_t i = 0;
      while (i < pick.size() && ++pick[i] == options[i].size()) pick[i++] = 0;
      if (i == pick.size()) break;
    }
  };
  search(models, {});
  // Nothing fits with the activations on the device: the trained models
  // keep them on the host (a GPU's), then on NVMe, as SSDTrain does; the
  // latter stays for GaLore's search below.
  std::vector<Tier> activation_tiers;
  if (vary_activations && !hardware.cpu_device) activation_tiers.push_back(Tier::kHost);
  if (vary_activations && hardware.nvme_bytes > 0) activation_tiers.push_back(Tier::kNvme);
  for (size_t t = 0; fits.empty() && t < activation_tiers.size(); ++t) {
    for (size_t i = 0; i < models.size(); ++i) {
      if (!models[i].trainable || !models[i].shares_base_of.empty()) continue;
      for (offload::ModelPlacement& p : options[i]) p.activations = activation_tiers[t];
    }
    search(models, {});
  }
  // Nothing fits with full Adam: GaLore shrinks the optimizer state of the
  // models that train every parameter, at the largest rank that fits (the
  // closest to full Adam).
  std::vector<size_t> full_adam;
  for (size_t i = 0; i < models.size(); ++i) {
    const PlannedModel& m = models[i];
    if (m.trainable && m.shares_base_of.empty() && !m.spec.trains_adapters() && !m.spec.galore.enabled()) {
      full_adam.push_back(i);
    }
  }
  for (int64_t rank = 1024; fits.empty() && !full_adam.empty() && rank >= 32; rank /= 2) {
    std::vector<PlannedModel> with = models;
    std::map<std::string, int64_t> added;
    bool smaller = true;  // a rank at or above a matrix's side saves nothing
    for (size_t i : full_adam) {
      with[i].spec.galore.rank = rank;
      added[models[i].role] = rank;
      smaller = smaller && with[i].spec.galore.SavedBytes(with[i].config) > 0;
    }
    if (smaller) search(with, added);
  }
  if (fits.empty()) return result;
  // Fastest first; on a tie, the smaller host footprint.
  std::stable_sort(fits.begin(), fits.end(), [](const JobPrediction& a, const JobPrediction& b) {
    if (a.iteration_s != b.iteration_s) return a.iteration_s < b.iteration_s;
    return a.process_rss_bytes < b.process_rss_bytes;
  });
  result.fits = true;
  result.binding_tier.clear();
  result.chosen = fits.front();
  result.candidates.assign(fits.begin() + 1, fits.end());
  return result;
}

std::vector<std::string> PredictionOverrides(const JobPrediction& prediction) {
  std::vector<std::string> out;
  for (const auto& [role, p] : prediction.placement) {
    const auto key_of = prediction.placement_key.find(role);
    const std::string key = absl::StrCat(
        key_of != prediction.placement_key.end() ? key_of->second : absl::StrCat("models.", role, ".placement"), ".");
    out.push_back(absl::StrCat(key, "weights=", offload::TierName(p.weights)));
    out.push_back(absl::StrCat(key, "prefetch=", p.prefetch_depth));
    if (!prediction.trainable.count(role) || !prediction.trainable.at(role)) continue;
    out.push_back(absl::StrCat(key, "optimizer=", offload::TierName(p.optimizer)));
    out.push_back(absl::StrCat(key, "gradients=", offload::TierName(p.gradients)));
    out.push_back(absl::StrCat(key, "step_in_backward=", p.step_in_backward ? "true" : "false"));
    out.push_back(absl::StrCat(key, "activations=", offload::TierName(p.activations)));
    if (auto rank = prediction.galore_rank.find(role); rank != prediction.galore_rank.end()) {
      out.push_back(absl::StrCat("models.", role, ".galore={rank: ", rank->second, "}"));
    }
  }
  out.push_back(absl::StrCat("train.micro_batch_size=", prediction.micro_batch_size));
  if (!prediction.device.empty()) out.push_back(absl::StrCat("memory.device=", prediction.device));
  const int64_t arena_mib = (prediction.peak[kHost] + prediction.peak[kHost] / 10 + (1 << 20) - 1) >> 20;
  out.push_back(absl::StrCat("memory.host_mib=", std::max<int64_t>(arena_mib, 64)));
  return out;
}

}  // namespace strata::policies
