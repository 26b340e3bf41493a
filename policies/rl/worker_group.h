// The interface between an RL algorithm and the models of one rank. Only
// token ids and per-token floats cross it, never weights. The implementation
// (LocalWorkerGroup) holds the actor, reference, reward model (or rule) and
// critic under the job's placements; a remote rank runs the same algorithm
// in its own process (services/rank/job_rank.h), so nothing remote
// implements this.
#ifndef STRATA_POLICIES_RL_WORKER_GROUP_H_
#define STRATA_POLICIES_RL_WORKER_GROUP_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/config/sampling.h"
#include "policies/data/examples.h"

namespace strata::policies {

// One response to one prompt.
struct Rollout {
  int64_t prompt_index = 0;       // into the request's prompts
  std::vector<int32_t> prompt;    // ids, BOS included when the tokenizer adds one
  std::vector<int32_t> response;  // generated ids, ending with EOS when one was produced
  std::vector<float> logprobs;    // the actor's log-probs of `response` when sampled
  bool greedy = false;            // ReMax's baseline response
  bool truncated = false;         // stopped at max_new_tokens without an EOS
  int64_t example = -1;           // the prompt's row in the job's data (its text and label); -1: unknown
};

struct RolloutRequest {
  std::vector<std::vector<int32_t>> prompts;
  SamplingOptions sampling;  // its seed makes the rollout reproducible
  int64_t samples_per_prompt = 1;
  bool with_greedy = false;  // also the greedy response of each prompt
};

struct ScoreRequest {
  bool rewards = true;             // reward model or rule score per rollout
  bool reference_logprobs = true;  // per response token
  bool values = false;             // critic value per response token (PPO)
  bool actor_logprobs = false;     // recomputed under the current actor
};

struct Scores {
  std::vector<float> rewards;
  std::vector<std::vector<float>> reference_logprobs;
  std::vector<std::vector<float>> values;
  std::vector<std::vector<float>> actor_logprobs;
};

enum class PolicyObjective { kReinforce, kPpo };

struct PolicyUpdate {
  std::vector<Rollout> rollouts;
  std::vector<std::vector<float>> advantages;  // per response token
  PolicyObjective objective = PolicyObjective::kReinforce;
  // PPO only.
  std::vector<std::vector<float>> old_logprobs;
  std::vector<std::vector<float>> returns;  // critic targets
  std::vector<std::vector<float>> old_values;
  double clip_range = 0.2;
  double value_clip = 0.2;
  int64_t epochs = 1;
  int64_t minibatches = 1;
  uint64_t shuffle_seed = 0;
  // Data parallel: each rollout's row in the global batch of `global_rows`.
  // Minibatches are drawn from the global rows (the same on every rank) and
  // each rank trains on the rows it holds, so a gang of N takes the steps
  // one rank would. Empty: the rollouts are the whole batch.
  std::vector<int64_t> rows;
  int64_t global_rows = 0;
};

struct UpdateStats {
  double policy_loss = 0;
  double value_loss = 0;
  double clipfrac = 0;
  double value_clipfrac = 0;
  double approx_kl = 0;
};

struct TrainStats {
  double loss = 0;
  double accuracy = 0;  // reward model: fraction of pairs ranked correctly
};

// Peak bytes per tier since the last phase started.
struct MemoryStats {
  std::map<std::string, int64_t> peak_bytes;  // "device", "host", "nvme"
};

class WorkerGroup {
 public:
  virtual ~WorkerGroup() = default;

  // Samples samples_per_prompt responses per prompt (and the greedy one).
  virtual absl::StatusOr<std::vector<Rollout>> Generate(const RolloutRequest& request) = 0;
  virtual absl::StatusOr<Scores> Score(const std::vector<Rollout>& rollouts, const ScoreRequest& request) = 0;
  // Actor (and for PPO critic) gradient steps.
  virtual absl::StatusOr<UpdateStats> Update(const PolicyUpdate& update) = 0;
  // One SFT step of the actor on the batch.
  virtual absl::StatusOr<TrainStats> TrainSft(const std::vector<TextPair>& batch) = 0;
  // One Bradley-Terry step of the reward model; Evaluate* only measures.
  virtual absl::StatusOr<TrainStats> TrainRewardModel(const std::vector<PreferencePair>& batch) = 0;
  virtual absl::StatusOr<TrainStats> EvaluateRewardModel(const std::vector<PreferencePair>& pairs) = 0;

  // The iteration whose update comes next: learning-rate schedules follow
  // it. Groups without a trainer keep the default.
  virtual absl::Status BeginIteration(int64_t /*iteration*/) { return absl::OkStatus(); }
  // Optimizer figures of the last update, the same on every rank:
  // "optimizer/lr" and "optimizer/grad_norm" (the last step's global norm,
  // before clipping), and "optimizer/critic_grad_norm" for PPO.
  virtual std::map<std::string, double> OptimizerMetrics() { return {}; }

  // Starts a phase ("rollout", "score", "update") for the memory figures
  // and returns the peaks of the phase it ends (empty for the first), so a
  // remote worker answers both in one call.
  virtual MemoryStats BeginPhase(const std::string& phase) = 0;
  // The peaks of `phase`: so far for the current one, as it ended otherwise.
  virtual MemoryStats PhaseMemory(const std::string& phase) = 0;

  // Everything needed to resume (weights, optimizer states, step counts)
  // under `dir`; LoadCheckpoint restores it.
  virtual absl::Status SaveCheckpoint(const std::string& dir) = 0;
  virtual absl::Status LoadCheckpoint(const std::string& dir) = 0;
  // The trained model of the job (actor, or reward model) in HF layout.
  virtual absl::Status SaveOutput(const std::string& dir) = 0;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_RL_WORKER_GROUP_H_
