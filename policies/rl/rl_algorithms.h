// The RL loops, split the way a gang runs them. Each rank of a job runs an
// RlAlgorithm on its shard of the global batch, phase by phase (rollout,
// score, update) against its WorkerGroup; statistics that span the batch
// (means, PPO's whitening) are summed over the gang, so every rank reports
// the same global metrics and a gang of N computes what one rank would. The
// driver (the coordinator, or `strata train`) holds only scalars between
// iterations: RlController (policies/job/loop_state.h).
#ifndef STRATA_POLICIES_RL_RL_ALGORITHMS_H_
#define STRATA_POLICIES_RL_RL_ALGORITHMS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/dist/process_group.h"
#include "policies/job/job_spec.h"
#include "policies/job/loop_state.h"
#include "policies/job/metrics.h"
#include "policies/job/seeds.h"
#include "policies/rl/rl_losses.h"
#include "policies/rl/worker_group.h"

namespace strata::policies {

// A prompt of the iteration's global batch and its index there: sampling
// seeds derive from the index, so a prompt's samples do not depend on the
// rank it lands on.
struct BatchPrompt {
  int64_t index = 0;  // in the global batch
  std::vector<int32_t> ids;
  int64_t example = -1;  // its row in the job's data; rollouts carry it to the reward sources
};

class RlAlgorithm {
 public:
  virtual ~RlAlgorithm() = default;
  // For remax, ppo, grpo and rloo specs; INVALID_ARGUMENT otherwise.
  static absl::StatusOr<std::unique_ptr<RlAlgorithm>> Create(const JobSpec& spec);

  // Samples responses to this rank's prompts (`global_batch` prompts over
  // the gang) and keeps them for Score. Reports nothing global yet.
  virtual absl::Status Rollout(WorkerGroup& workers, const std::vector<BatchPrompt>& prompts, int64_t global_batch,
                               int64_t iteration) = 0;
  // Rewards, reference log-probs (and values), then advantages, kept for
  // Update. `params` are the driver's scalars ("kl_coef"). Returns the
  // objective/* metrics of the whole batch.
  virtual absl::StatusOr<Metrics> Score(WorkerGroup& workers, ProcessGroup& gang, const Metrics& params) = 0;
  // The gradient steps on what Score kept; returns loss/* and policy/*
  // metrics of the whole batch.
  virtual absl::StatusOr<Metrics> Update(WorkerGroup& workers, ProcessGroup& gang, int64_t iteration) = 0;
};

// Global means over the gang: each rank adds its sums and counts, Reduce
// sums them over the ranks in one collective and writes sum / count.
class GlobalMeans {
 public:
  void Add(const std::string& key, double sum, double count);
  absl::Status Reduce(ProcessGroup& gang, Metrics& out) const;

 private:
  std::vector<std::string> keys_;
  std::vector<double> values_;  // sum, count per key
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_RL_RL_ALGORITHMS_H_
