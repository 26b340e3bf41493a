// The memory planner: what a job needs per tier and phase, how long an
// iteration takes, and which placement fits given hardware.
//
// Model states (PlanModelStates) are weights, gradients and Adam states
// under the spec's placement. PredictJob adds what the phases allocate
// besides: the KV cache and logits of generation, the per-layer working set
// of forward passes, the layer inputs kept for the layer-wise backward
// (activation checkpointing at layer granularity), the streaming window,
// NVMe Adam's staging tiles, and the process's own resident bytes. FitJob
// tries every placement the engine supports and picks the fastest that fits.
#ifndef STRATA_POLICIES_JOB_MEMORY_PLAN_H_
#define STRATA_POLICIES_JOB_MEMORY_PLAN_H_

#include <array>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/config/llama_config.h"
#include "policies/job/hardware_figures.h"
#include "policies/job/job_spec.h"

namespace strata::policies {

struct ModelFootprint {
  std::string role;  // actor, reference, reward, critic
  int64_t parameters = 0;
  // Parameters with gradients and Adam state: all of them, or with LoRA the
  // adapters (and a scalar head); 0 when frozen.
  int64_t trained_parameters = 0;
  bool trainable = false;
  // The role whose weights serve this one (a LoRA actor's frozen base as
  // the reference): it holds no bytes of its own.
  std::string shares_base_of;
  // Bytes per tier (device, host, nvme) for each kind of state.
  std::array<int64_t, 3> weights{}, gradients{}, optimizer{};
  int64_t total(int tier) const { return weights[tier] + gradients[tier] + optimizer[tier]; }
};

struct MemoryPlan {
  std::vector<ModelFootprint> models;
  std::array<int64_t, 3> total{};  // per tier
};

// Plans `spec`'s models. Each model's config.json is read from its `path`
// (or its `init` file); a rule reward has no model. Streamed weights count
// their home tier in full and (prefetch + 1) layers on the device; gradients
// and Adam states are fp32 (4 and 12 bytes per parameter).
absl::StatusOr<MemoryPlan> PlanModelStates(const JobSpec& spec);

// The same for one model, given its config.
ModelFootprint PlanModel(const std::string& role, const LlamaConfig& config, const ModelSpec& model, bool trainable,
                         bool scalar_head);

// One model of a job as the planner sees it.
struct PlannedModel {
  std::string role;  // actor, reference, reward, critic
  LlamaConfig config;
  ModelSpec spec;  // dtype and placement
  bool trainable = false;
  bool scalar_head = false;
  // Where the spec sets its placement: models.<role>.placement, or
  // reward.sources.<i>.placement for a reward model among the sources.
  std::string placement_key;
  // "actor" for the reference of a LoRA actor: the actor's own base with
  // the adapters off, loaded once, computing under the actor's placement.
  std::string shares_base_of;
};

// The models `spec`'s algorithm loads, with their configs (read from each
// model's config.json or `init` file; errors name the spec key).
absl::StatusOr<std::vector<PlannedModel>> JobModels(const JobSpec& spec);

struct PhasePrediction {
  std::array<int64_t, 3> peak{};  // bytes per tier: device, host, nvme
  double seconds = 0.0;
};

struct JobPrediction {
  std::map<std::string, offload::ModelPlacement> placement;  // by role
  std::map<std::string, bool> trainable;                     // by role: optimizer fields apply
  std::map<std::string, std::string> placement_key;          // by role: PlannedModel::placement_key
  // Roles served by another's weights (PlannedModel::shares_base_of): they
  // have no placement of their own.
  std::map<std::string, std::string> shares_base_of;
  int64_t micro_batch_size = 0;  // as train.micro_batch_size: 0 is the whole batch
  // memory.device as FitJob priced it, where the hardware it fits names
  // another kind of device than the spec (a GPU for a spec on the CPU);
  // empty: the spec's.
  std::string device;
  // Roles FitJob put GaLore on because nothing fit with full Adam, and its
  // rank (the spec's own galore settings are not listed).
  std::map<std::string, int64_t> galore_rank;
  // "rollout", "score", "update" (RL) or "update" alone (SFT, reward model).
  std::map<std::string, PhasePrediction> phases;
  // Continuations the rollout engine decodes at once (RL): the spec's
  // generation.max_concurrency (else train.micro_batch_size, else all),
  // fewer where a kv_pool_mib pool holds fewer, or where with kv_pool_mib 0
  // the wave would not fit memory.device_mib; a worker decodes that many.
  int64_t rollout_concurrency = 0;
  int64_t rollout_continuations = 0;  // of this many in an iteration's rollout, per rank
  std::array<int64_t, 3> peak{};      // the largest of the phases
  // What the kernel will count for the worker process at its peak: its
  // baseline, the host arena's touched pages, the model files mapped while
  // loading, and on a CPU device the device tier too.
  int64_t process_rss_bytes = 0;
  double iteration_s = 0.0;
};

// Predicts `spec` as written (placements, micro-batches) over `workers`
// data-parallel ranks (per-rank figures; optimizer states sharded).
JobPrediction PredictJob(const JobSpec& spec, const std::vector<PlannedModel>& models, const HardwareFigures& figures,
                         int64_t workers);

// What a worker offers, per tier; 0 nvme means no NVMe tier.
struct Hardware {
  int64_t device_bytes = 0;
  int64_t host_bytes = 0;
  int64_t nvme_bytes = 0;
  // The job computes on the CPU: the device tier is host RAM, and process
  // RSS (which then includes it) must fit the host.
  bool cpu_device = false;
};

// Parses "device=80GiB,host=128GiB,nvme=2TiB" (device=cpu: compute on the
// CPU; sizes take B, KiB, MiB, GiB, TiB, KB, MB, GB, TB). INVALID_ARGUMENT
// naming the part that does not parse; `host` is required.
absl::StatusOr<Hardware> ParseHardware(const std::string& text);

// Whether a prediction fits, and the tier that overflows most (relative to
// what it offers) when it does not.
bool Fits(const JobPrediction& p, const Hardware& hw, std::string* binding_tier = nullptr, double* overshoot = nullptr);

struct FitResult {
  bool fits = false;
  std::string binding_tier;               // when nothing fits: the tier the nearest miss overflows
  JobPrediction chosen;                   // the fastest that fits, or the nearest miss
  std::vector<JobPrediction> candidates;  // the others that fit, fastest first
  int64_t tried = 0;
};

// Prices the device `hardware` names (a spec on the CPU fitted to a GPU is
// planned on cuda:0, one on a GPU fitted to device=cpu on the CPU) and
// tries every supported placement of every model (weights device / host /
// nvme; optimizer device / host / nvme; prefetch 1 or 2; step_in_backward
// where the spec allows it) and, unless `vary_micro_batch` is false,
// micro-batch sizes from the spec's down to 1. When nothing fits, tries
// again with the trained models' activations on the host (a GPU's), then
// on NVMe; then with GaLore on every model that trains in full without it,
// at the largest rank of 1024, 512, ..., 32 that fits (chosen.galore_rank
// says so). With `vary_activations` false the trained models keep the
// spec's placement.activations throughout.
FitResult FitJob(const JobSpec& spec, const std::vector<PlannedModel>& models, const HardwareFigures& figures,
                 const Hardware& hardware, int64_t workers, bool vary_micro_batch = true, bool vary_activations = true);

// The spec overrides ("models.actor.placement.weights=host", ...) that turn
// a spec into the prediction's: placements, GaLore where the fit added it,
// train.micro_batch_size, memory.device where the fit changed it, and
// memory.host_mib set to what the arena needs with 10% to spare.
std::vector<std::string> PredictionOverrides(const JobPrediction& prediction);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_JOB_MEMORY_PLAN_H_
