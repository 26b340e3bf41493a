// The in-process WorkerGroup: one rank's models, built from a job spec,
// serving rollout, scoring and updates by direct calls. `strata train` and
// the tests run algorithms against it; the gRPC worker wraps the same class.
// It composes the roles (actor.h, scorer.h, critic.h) over the rank's
// memory (rank_memory.h) and gang (gang_sum.h): it decides which roles a job
// has, hands each call to them, and keeps the figures of the whole rank.
#ifndef STRATA_SERVICES_RANK_LOCAL_WORKER_GROUP_H_
#define STRATA_SERVICES_RANK_LOCAL_WORKER_GROUP_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "offload/device/device_memory.h"
#include "policies/data/job_data.h"
#include "policies/dist/process_group.h"
#include "policies/job/job_spec.h"
#include "policies/job/metrics.h"
#include "policies/rl/worker_group.h"
#include "policies/tokenizer/tokenizer.h"
#include "policies/train/placed_model.h"
#include "services/rank/pass_options.h"
#include "services/rank/reward_sources.h"

namespace strata::services {

class Actor;
class Critic;
class RankMemory;
class Scorer;

// Continuations a rank's rollout engine decodes at once:
// generation.max_concurrency, else train.micro_batch_size (0: all), or
// fewer where, with generation.kv_pool_mib 0, the planner finds that only
// fewer fit memory.device_mib (PredictJob's rollout_concurrency), so that
// the default pool takes what the device budget leaves.
int64_t RolloutConcurrency(const policies::JobSpec& spec);

class LocalWorkerGroup final : public policies::WorkerGroup {
 public:
  // Loads the models `spec`'s algorithm needs under their placements. Paths
  // are resolved against the working directory. Errors name the model
  // ("models.actor.path: ...") and the file.
  //
  // `gang` (null: a gang of one) makes this one data-parallel rank: the
  // batches it is given are its shard, gradients are summed over the gang,
  // each rank's loss is weighted by its share of the global batch's tokens
  // (or pairs), and the losses and statistics it returns are the global
  // batch's. It must outlive the group. `access` is what the job's remote
  // reward sources may reach (none by default).
  static absl::StatusOr<std::unique_ptr<LocalWorkerGroup>> Create(const policies::JobSpec& spec,
                                                                  policies::ProcessGroup* gang = nullptr,
                                                                  const RewardAccess& access = {});
  ~LocalWorkerGroup() override;

  absl::StatusOr<std::vector<policies::Rollout>> Generate(const policies::RolloutRequest& request) override;
  absl::StatusOr<policies::Scores> Score(const std::vector<policies::Rollout>& rollouts,
                                         const policies::ScoreRequest& request) override;
  absl::StatusOr<policies::UpdateStats> Update(const policies::PolicyUpdate& update) override;
  absl::StatusOr<policies::TrainStats> TrainSft(const std::vector<policies::TextPair>& batch) override;
  absl::StatusOr<policies::TrainStats> TrainRewardModel(const std::vector<policies::PreferencePair>& batch) override;
  absl::StatusOr<policies::TrainStats> EvaluateRewardModel(const std::vector<policies::PreferencePair>& pairs) override;
  policies::MemoryStats BeginPhase(const std::string& phase) override;
  policies::MemoryStats PhaseMemory(const std::string& phase) override;
  absl::Status BeginIteration(int64_t iteration) override;
  std::map<std::string, double> OptimizerMetrics() override;
  // The models this rank loaded and placed, by key ("actor", "reference", ...).
  const std::vector<std::string>& placed_models() const;
  // Bytes held now per tier ("device", "host", "nvme"), for the metrics
  // endpoint. Safe to call between operations of the job's work thread.
  std::map<std::string, int64_t> MemoryInUse() const;
  // Rank 0's weights and this rank's optimizer states, in one call.
  absl::Status SaveCheckpoint(const std::string& dir) override;
  // The two parts of a checkpoint, for a gang that writes them apart:
  // the trainable models' weights under dir/<model> (the same on every
  // rank: one rank writes them), and the optimizer states this rank holds
  // (run_checkpoint.h names the files).
  absl::Status SaveWeights(const std::string& dir);
  absl::Status SaveOptimizerStates(const std::string& dir);
  absl::Status LoadCheckpoint(const std::string& dir) override;
  absl::Status SaveOutput(const std::string& dir) override;

  const policies::Tokenizer& tokenizer() const { return *tokenizer_; }
  // Where the tokenizer was loaded from (copied next to saved models).
  const std::string& tokenizer_path() const { return tokenizer_path_; }
  // The ids a response ends at: the actor's end-of-turn ids (config.json's
  // and generation_config.json's eos_token_id), the tokenizer's EOS and
  // generation.stop_token_ids, each once.
  const std::vector<int64_t>& stop_token_ids() const { return stop_token_ids_; }

  // RL: the prompts the rollouts' `example` rows index (text, conversation,
  // label), which the reward sources read. Must outlive the group's use.
  void SetPrompts(const policies::PromptSet* prompts) { prompts_ = prompts; }
  // The reward sources' scores of `responses`: RL evaluation scores its own.
  absl::StatusOr<SourceScores> ScoreResponses(const std::vector<ScoredResponse>& responses);
  // The text views of rollouts of `prompts` (by their `example` row).
  absl::StatusOr<std::vector<ScoredResponse>> ViewsOf(const std::vector<policies::Rollout>& rollouts,
                                                      const policies::PromptSet& prompts) const;
  // What the reward sources measured since the last call, as the score
  // phase reports it: reward/<name> (the mean over sampled responses, a
  // gang mean share) and time/score/<name>_s.
  policies::Metrics TakeRewardMetrics();

  // Measures the job's compute device (memory.device).
  offload::DeviceMemoryMonitor& device_monitor() const;

 private:
  explicit LocalWorkerGroup(policies::JobSpec spec);
  // Places the models of the job's algorithm, then loads the tokenizer and
  // gives the models their roles.
  absl::Status LoadModels();
  // The trained models by checkpoint name: actor, reward, critic.
  std::vector<std::pair<std::string, policies::PlacedModel*>> Trainable();
  absl::Status CopyTokenizer(const std::string& dir) const;
  // Score of one micro-batch of rollouts, packed once for every role.
  absl::StatusOr<policies::Scores> ScoreRows(const std::vector<policies::Rollout>& rollouts,
                                             const policies::ScoreRequest& request);

  const policies::JobSpec spec_;
  std::unique_ptr<policies::ProcessGroup> solo_;  // the gang when none is given
  policies::ProcessGroup* gang_ = nullptr;
  std::unique_ptr<RankMemory> memory_;
  PassOptions passes_;
  std::unique_ptr<policies::Tokenizer> tokenizer_;
  std::string tokenizer_path_;
  std::vector<int64_t> stop_token_ids_;
  RewardAccess access_;
  std::unique_ptr<RewardSources> reward_sources_;  // RL
  const policies::PromptSet* prompts_ = nullptr;
  std::map<std::string, double> reward_sums_, reward_counts_, reward_seconds_;
  // The roles the algorithm needs; null where it has none.
  std::unique_ptr<Actor> actor_;
  std::unique_ptr<Scorer> scorer_;
  std::unique_ptr<Critic> critic_;
  std::string phase_;
  double lr_ = 0.0;  // the actor's (or reward model's) learning rate this iteration
  std::map<std::string, policies::MemoryStats> phase_memory_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_LOCAL_WORKER_GROUP_H_
