// The in-process WorkerGroup: one worker's models, built from a job spec,
// serving rollout, scoring and updates by direct calls. `strata train` and
// the tests run algorithms against it; the gRPC worker wraps the same class.
#ifndef STRATA_SERVICES_RANK_LOCAL_WORKER_GROUP_H_
#define STRATA_SERVICES_RANK_LOCAL_WORKER_GROUP_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "offload/device/device_memory.h"
#include "offload/host/host_arena.h"
#include "offload/nvme/nvme_store.h"
#include "policies/dist/process_group.h"
#include "policies/job/job_spec.h"
#include "policies/train/placed_model.h"
#include "policies/tokenizer/tokenizer.h"
#include "policies/rl/worker_group.h"
#include "rewards/rule_rewards.h"

namespace strata::services {

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
  // batch's. It must outlive the group.
  static absl::StatusOr<std::unique_ptr<LocalWorkerGroup>> Create(const policies::JobSpec& spec,
                                                                  policies::ProcessGroup* gang = nullptr);
  ~LocalWorkerGroup() override;

  absl::StatusOr<std::vector<policies::Rollout>> Generate(const policies::RolloutRequest& request) override;
  absl::StatusOr<policies::Scores> Score(const std::vector<policies::Rollout>& rollouts,
                                         const policies::ScoreRequest& request) override;
  absl::StatusOr<policies::UpdateStats> Update(const policies::PolicyUpdate& update) override;
  absl::StatusOr<policies::TrainStats> TrainSft(const std::vector<policies::TextPair>& batch) override;
  absl::StatusOr<policies::TrainStats> TrainRewardModel(const std::vector<policies::PreferencePair>& batch) override;
  absl::StatusOr<policies::TrainStats> EvaluateRewardModel(
      const std::vector<policies::PreferencePair>& pairs) override;
  policies::MemoryStats BeginPhase(const std::string& phase) override;
  policies::MemoryStats PhaseMemory(const std::string& phase) override;
  absl::Status BeginIteration(int64_t iteration) override;
  std::map<std::string, double> OptimizerMetrics() override;
  // Bytes held now per tier ("device", "host", "nvme"), for the metrics
  // endpoint. Safe to call between operations of the job's work thread.
  std::map<std::string, int64_t> MemoryInUse() const;
  // Rank 0's weights and this rank's optimizer states, in one call.
  absl::Status SaveCheckpoint(const std::string& dir) override;
  // The two parts of a checkpoint, for a gang that writes them apart:
  // the trainable models' weights under dir/<model> (the same on every
  // rank: one rank writes them), and the optimizer states this rank holds
  // (dir/<model>/optimizer-rank<R>-of-<N>.safetensors).
  absl::Status SaveWeights(const std::string& dir);
  absl::Status SaveOptimizerStates(const std::string& dir);
  absl::Status LoadCheckpoint(const std::string& dir) override;
  absl::Status SaveOutput(const std::string& dir) override;

  const policies::Tokenizer& tokenizer() const { return *tokenizer_; }
  // Where the tokenizer was loaded from (copied next to saved models).
  const std::string& tokenizer_path() const { return tokenizer_path_; }

  // Measures the job's compute device (memory.device).
  offload::DeviceMemoryMonitor& device_monitor() const { return *monitor_; }

 private:
  explicit LocalWorkerGroup(policies::JobSpec spec) : spec_(std::move(spec)) {}
  absl::Status LoadModels();
  absl::StatusOr<std::unique_ptr<policies::PlacedModel>> Place(const std::string& key,
                                                                const policies::ModelSpec& model,
                                                                policies::LlamaHead head, bool trainable,
                                                                double lr);
  // The trained models by checkpoint name.
  std::vector<std::pair<std::string, policies::PlacedModel*>> Trainable();
  absl::Status CopyTokenizer(const std::string& dir) const;
  // Score of one micro-batch of rollouts.
  absl::StatusOr<policies::Scores> ScoreRows(const std::vector<policies::Rollout>& rollouts,
                                             const policies::ScoreRequest& request);
  // Sums `values` over the gang (in place).
  absl::Status SumOverGang(std::vector<double>& values);
  // Each step's micro-batches (row ranges [begin, end) of its `rows`), as
  // many on every rank: a sharded trainer sums the gradients of every pass,
  // so the ranks must make the same passes or their collectives stop lining
  // up. A rank with fewer adds empty ranges, which the callers fill with a
  // row whose loss weighs nothing. One collective, and none
  // without micro-batches or with one rank.
  absl::StatusOr<std::vector<std::vector<std::pair<size_t, size_t>>>> GangMicroBatches(
      const std::vector<size_t>& rows_per_step);

  const policies::JobSpec spec_;
  std::unique_ptr<policies::ProcessGroup> solo_;  // the gang when none is given
  policies::ProcessGroup* gang_ = nullptr;
  at::Device device_ = at::kCPU;                        // memory.device
  offload::DeviceMemoryMonitor* monitor_ = nullptr;     // of device_
  std::unique_ptr<offload::HostArena> arena_;
  std::unique_ptr<offload::NvmeStore> nvme_;
  // The store's own directory under memory.nvme_dir, removed with the group:
  // NVMe slots are scratch (checkpoints hold the states), and a full disk
  // must not outlive the job that filled it.
  std::string nvme_job_dir_;
  std::unique_ptr<policies::Tokenizer> tokenizer_;
  std::string tokenizer_path_;
  std::unique_ptr<policies::PlacedModel> actor_, reference_, reward_, critic_;
  rewards::RuleFn rule_;
  std::string phase_;
  double lr_ = 0.0;  // the actor's (or reward model's) learning rate this iteration
  std::map<std::string, policies::MemoryStats> phase_memory_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_LOCAL_WORKER_GROUP_H_
