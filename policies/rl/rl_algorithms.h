// The RL loops: one iteration of ReMax, PPO, GRPO or RLOO against a
// WorkerGroup. They see token ids and per-token floats only, so local and
// remote workers are interchangeable.
#ifndef STRATA_POLICIES_RL_RL_ALGORITHMS_H_
#define STRATA_POLICIES_RL_RL_ALGORITHMS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/job/job_spec.h"
#include "policies/rl/worker_group.h"

namespace strata::policies {

using Metrics = std::map<std::string, double>;

class RlAlgorithm {
 public:
  virtual ~RlAlgorithm() = default;
  // For remax, ppo, grpo and rloo specs; INVALID_ARGUMENT otherwise.
  static absl::StatusOr<std::unique_ptr<RlAlgorithm>> Create(const JobSpec& spec);

  // One iteration over `prompts`: rollout, score, advantages, update.
  // Metrics use the names of docs/job-spec.md (objective/scores,
  // objective/kl, loss/policy_avg, time/rollout_s, memory/device_peak_bytes, ...).
  virtual absl::StatusOr<Metrics> Iterate(WorkerGroup& workers, const std::vector<std::vector<int32_t>>& prompts,
                                          int64_t iteration) = 0;

  // Algorithm state a resumed run needs (the adaptive KL coefficient).
  virtual Metrics State() const { return {}; }
  virtual void Restore(const Metrics&) {}
};

// The sampling seed of an iteration: a pure function of the job seed and the
// iteration, so a resumed run samples what an uninterrupted one would.
uint64_t IterationSeed(uint64_t job_seed, int64_t iteration);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_RL_RL_ALGORITHMS_H_
