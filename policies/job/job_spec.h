// The job spec: one YAML document that names the algorithm, the models and
// where each is placed, the data, the hyperparameters, generation settings,
// evaluation, checkpoints and memory budgets. Every field, with its
// default, is documented in docs/job-spec.md. Unknown keys, wrong types and
// impossible values are INVALID_ARGUMENT errors that name the key path.
#ifndef STRATA_POLICIES_JOB_JOB_SPEC_H_
#define STRATA_POLICIES_JOB_JOB_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "offload/tiers/placement.h"
#include "policies/config/galore_config.h"
#include "policies/config/lora_config.h"
#include "policies/config/rollout_options.h"

namespace strata::policies {

enum class Algorithm { kSft, kRewardModel, kRemax, kPpo, kGrpo, kRloo };
const char* AlgorithmName(Algorithm algorithm);

struct ModelSpec {
  std::string path;  // HF model directory ("" when absent)
  std::string init;  // config.json to initialise from (SFT / reward model from scratch)
  std::string rule;  // reward only: a rule-based reward instead of a model
  std::string dtype = "fp32";
  offload::ModelPlacement placement;
  // Low-rank adapters on a model that trains (rank 0: none, every
  // parameter trains); see docs/job-spec.md.
  LoraConfig lora;
  // GaLore on a model that trains in full (rank 0: off); see docs/job-spec.md.
  GaloreConfig galore;
  // A PEFT LoRA adapter of `path` to start from: kept frozen as part of the
  // base (the reference sees it too) while `lora` trains new adapters over
  // it ("" = none).
  std::string adapter;

  // Whether the model trains LoRA adapters: `lora` set, or a starting
  // adapter (whose settings the new adapters then take).
  bool trains_adapters() const { return lora.enabled() || !adapter.empty(); }
};

struct DataSpec {
  std::string train;      // JSONL
  std::string eval;       // JSONL; optional
  std::string tokenizer;  // tokenizer path; default: the first model's directory
  int64_t max_prompt_tokens = 64;
  int64_t max_response_tokens = 64;
  // Which field of a record holds what (OpenRLHF's names). A prompt,
  // response, chosen or rejected value is a string or a conversation (a
  // list of {"role", "content", ...} messages).
  std::string prompt_key = "prompt";
  std::string label_key;  // optional: a reference answer kept for reward sources
  std::string response_key = "response";
  std::string chosen_key = "chosen";
  std::string rejected_key = "rejected";
  // Whether a string prompt is rendered through the chat template as one
  // user message (a conversation always is; a string otherwise is raw text).
  bool apply_chat_template = false;
  std::string chat_template_file;  // a Jinja file replacing the model's template
  std::string chat_template_name;  // one of the model's named templates; "" = "default"
  // Handed to the template beside the messages, e.g. {"enable_thinking": false}:
  // a JSON object, kept as its text so the spec stays free of a JSON type.
  std::string template_args_json = "{}";
  // What the template's strftime_now() sees (ISO 8601, e.g.
  // 2026-11-27T15:40:00+00:00). The service sets it when the job is
  // submitted, so a resumed job renders what its first run rendered.
  std::string template_date;
  // A prompt longer than max_prompt_tokens: "truncate_left" keeps its end
  // (what the response follows), "drop" leaves the record out.
  std::string overlong_prompts = "truncate_left";
};

struct TrainSpec {
  int64_t iterations = 100;
  int64_t batch_size = 16;
  double lr = 1e-5;
  double weight_decay = 0.0;
  // Global gradient-norm clipping before each optimizer step; 0 turns it off.
  double max_grad_norm = 0.0;
  // "constant", "linear" (to 0 at the last iteration) or "cosine" (to 0),
  // after `warmup_iterations` of linear warmup.
  std::string lr_schedule = "constant";
  int64_t warmup_iterations = 0;
  // Rows per forward pass of rollout, scoring and the update; gradients
  // accumulate over a step's micro-batches. 0: the whole batch at once.
  int64_t micro_batch_size = 0;
  // RL scores before the KL penalty and the clip: "none", "batch" (whiten by
  // the iteration's global mean and std) or "running" (by the mean and std
  // of every score so far, this iteration's included).
  std::string reward_normalization = "none";
  uint64_t seed = 1;
  int64_t log_every = 1;
};

struct GenerationSpec {
  int64_t max_new_tokens = 32;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  // Token ids that end a response besides the model's own end-of-turn ids
  // (config.json's and generation_config.json's eos_token_id, the
  // tokenizer's eos token).
  std::vector<int64_t> stop_token_ids;
  // The rollout engine's KV blocks, pool and concurrency (kv_block_tokens,
  // kv_pool_mib, max_concurrency, share_prefixes, cuda_graphs: keys of
  // `generation`).
  // max_concurrency 0 takes train.micro_batch_size when that is set.
  RolloutEngineOptions engine;
};

struct RemaxSpec {
  double kl_coef = 0.05;
  std::string kl_estimator = "k1";
  double reward_clip = 10.0;  // scores clipped to [-clip, clip]; 0 turns clipping off
  double discount = 1.0;
};

struct PpoSpec {
  double kl_coef = 0.05;
  std::string kl_estimator = "k1";
  double kl_target = 0.0;  // > 0: adaptive controller towards this KL
  double kl_horizon = 10000.0;
  double reward_clip = 10.0;
  double gamma = 1.0;
  double lambda = 0.95;
  double clip_range = 0.2;
  double value_clip = 0.2;
  int64_t epochs = 2;
  int64_t minibatches = 2;
  bool whiten_advantages = true;
  double critic_lr = 1e-5;
};

struct GroupSpec {  // GRPO and RLOO
  int64_t samples_per_prompt = 4;
  double kl_coef = 0.05;
  std::string kl_estimator = "k3";
  double reward_clip = 10.0;
};

struct EvalSpec {
  int64_t every = 0;  // iterations between evaluations; 0: never
  // RL: the one rule or check (vowel_fraction, math, ...) that scores eval
  // responses; "" = the job's reward sources.
  std::string rule;
  int64_t prompts = 64;  // eval prompts used
  // Responses sampled per eval prompt; verifiers also report pass@k, the
  // fraction of prompts with a correct one among the k.
  int64_t samples_per_prompt = 4;
  // Decode eval responses greedily (argmax) instead of sampling them with
  // the job's generation settings; then samples_per_prompt must be 1.
  bool greedy = false;
};

struct CheckpointSpec {
  int64_t every = 0;  // iterations between checkpoints; 0: only at the end
  std::string dir;    // default: <output.dir>/checkpoints
};

struct MemorySpec {
  std::string device = "cpu";  // compute device: cpu, cuda or cuda:N
  // memory.device as ParseJobSpec parsed it: -1 for the CPU, N for cuda:N.
  // Code that builds a spec by hand sets both.
  int device_index = -1;
  bool on_cpu() const { return device_index < 0; }
  int64_t device_mib = 0;   // device-tier budget; 0: unlimited
  int64_t host_mib = 2048;  // host arena size
  std::string nvme_dir;     // NVMe tier directory; required when any placement uses nvme
  // Lock all of host_mib in RAM at start and register it with io_uring as
  // fixed buffers (and with CUDA on a GPU); see docs/job-spec.md.
  bool pin_host = false;
};

struct ParallelSpec {
  // Data-parallel ranks (worker processes) the job spans; each takes
  // 1/workers of every global batch. At most train.batch_size.
  int64_t workers = 1;
  // The c10d backend of the ranks' collectives: auto (NCCL when
  // memory.device is a GPU and the build has it, Gloo otherwise), gloo or
  // nccl. Naming one builds its group even for one rank.
  std::string backend = "auto";
};

// One source of RL rewards (reward.sources): the reward of a response is
// the weighted sum of its sources' scores. Each kind reads its own fields.
struct RewardSourceSpec {
  std::string name;  // unique; metrics report reward/<name>
  std::string kind;  // "model", "verifier" or "remote"
  double weight = 1.0;
  // kind model: a reward model (a *ForSequenceClassification head) with its
  // own tokenizer and chat template, read from model.path.
  ModelSpec model;
  // kind verifier: "math", "exact", "regex" or a rule's name
  // (vowel_fraction, length_ratio, contains:WORD), against the record's label.
  std::string check;
  std::string pattern;  // regex: RE2 syntax
  bool strict = false;  // math: only a \boxed{} or "#### N" answer counts
  // kind remote: a reward server in OpenRLHF's protocol.
  std::string url;
  int64_t batch_size = 16;    // queries per request
  int64_t max_in_flight = 4;  // requests at once
  double timeout_s = 30;      // per request
  int64_t retries = 2;        // after the first try
  std::string token_secret;   // a secret the worker holds (--reward-secret NAME=FILE): the bearer token
  std::string ca_file;        // https: the CA bundle; "" = the system's
};

struct JobSpec {
  Algorithm algorithm = Algorithm::kRemax;
  std::string name;                            // optional label
  ModelSpec actor, reference, reward, critic;  // per algorithm; see docs/job-spec.md
  // RL rewards. `models.reward` (a model or a rule) is the shorthand for one
  // source: ParseJobSpec turns it into one, so this is never empty in an RL
  // job's parsed spec.
  std::vector<RewardSourceSpec> reward_sources;
  DataSpec data;
  TrainSpec train;
  GenerationSpec generation;
  RemaxSpec remax;
  PpoSpec ppo;
  GroupSpec group;
  EvalSpec eval;
  CheckpointSpec checkpoint;
  MemorySpec memory;
  ParallelSpec parallel;
  std::string output_dir;  // required
  // With LoRA: also write the merged model (base + adapters, HF layout) to
  // <output.dir>/merged beside the adapter.
  bool merge_lora = false;

  // Which models the algorithm uses, and cross-field checks.
  absl::Status Validate() const;
  // Which models may carry `lora` (the ones that train) and what it excludes.
  absl::Status ValidateLora() const;
  // Which models may carry `galore` (the ones that train in full).
  absl::Status ValidateGalore() const;
  // Whether any model places weights or optimizer states on the NVMe tier;
  // memory.nvme_dir (or the worker's --nvme-dir) must then be set.
  bool UsesNvme() const;
};

// The model a PPO critic starts from when models.critic.path is unset: the
// first reward model among reward.sources, else the actor.
std::string DefaultCriticPath(const JobSpec& spec);

// `unix_ms` in the form data.template_date takes (UTC, to the second):
// 2026-11-27T15:40:00+00:00.
std::string TemplateDateOf(int64_t unix_ms);

// Rows one iteration decodes or scores across the gang: prompts times the
// responses each gets (ReMax: a sample and the greedy one; GRPO/RLOO:
// group.samples_per_prompt; SFT and PPO: one; a preference pair: two).
int64_t RowsPerIteration(const JobSpec& spec);
// The most of those one rank of the gang decodes: row i of the global
// batch goes to rank i mod parallel.workers, a prompt's responses with it.
int64_t RowsPerRank(const JobSpec& spec);

// The learning-rate multiplier of `iteration` (0-based) under train's
// schedule: warmup ramps to 1 (iteration i of W uses (i + 1) / W), then
// constant stays at 1, linear falls to 0 at `iterations`, cosine follows
// half a cosine to 0. A function of the iteration alone, so a resumed run
// continues the schedule exactly.
double LearningRateScale(const TrainSpec& train, int64_t iteration);

// What one worker accepts from a spec, whatever the spec says; 0 = no
// limit. Rows and tokens count one rank's share: a gang spreads the batch.
struct JobLimits {
  int64_t max_rows = 0;        // RowsPerRank
  int64_t max_tokens = 0;      // RowsPerRank x (data.max_prompt_tokens + the longer of generation.max_new_tokens
                               // and data.max_response_tokens)
  int64_t max_host_mib = 0;    // memory.host_mib
  int64_t max_device_mib = 0;  // memory.device_mib
};
// RESOURCE_EXHAUSTED naming the spec key that asks for more than `limits`
// allow and the limit (`who` says whose: "workers accept", "--max-host-mib").
absl::Status CheckJobLimits(const JobSpec& spec, const JobLimits& limits, const std::string& who);

// Confinement for a service: every path the spec names (models, data,
// tokenizer, output, checkpoint and NVMe directories), taken relative to
// `base` and resolved through symlinks as far as it exists, must lie inside
// one of `roots`. PERMISSION_DENIED naming the key otherwise; the answer is
// the same whether the path exists, so a spec cannot probe the file system.
// With `lexical`, paths and roots are compared as written, `..` folded and
// no link followed: the coordinator's check of another machine's paths,
// which it may not be allowed to stat.
absl::Status CheckPathsWithin(const JobSpec& spec, const std::string& base, const std::vector<std::string>& roots,
                              bool lexical = false);

// Largest spec text accepted (and, separately, the overrides' total): a
// spec is a page of settings, and every job record carries it.
inline constexpr size_t kMaxJobSpecBytes = 1 << 20;

// Parses YAML text. `overrides` are "key.path=value" strings applied before
// parsing (the value is YAML: numbers, booleans, strings). `source` names
// the file in errors. Relative paths are kept as written: they are resolved
// against the working directory of whoever runs the job.
absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text, const std::vector<std::string>& overrides,
                                     const std::string& source);
// `spec` with every relative path (models, data, output, checkpoints, NVMe
// directory) made absolute under `base`: what a process that does not share
// the worker's working directory needs to reach the same files.
JobSpec ResolvePaths(const JobSpec& spec, const std::string& base);

// The spec text with `overrides` applied, as YAML: what a service stores so
// that workers parse exactly what was validated.
absl::StatusOr<std::string> ApplyOverrides(const std::string& yaml_text, const std::vector<std::string>& overrides,
                                           const std::string& source);

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path, const std::vector<std::string>& overrides);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_JOB_JOB_SPEC_H_
