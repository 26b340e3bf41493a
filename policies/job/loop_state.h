// What a job's driver carries from one iteration to the next, as scalars:
// the adaptive KL coefficient and running reward statistics. Torch-free, so
// the control plane (the coordinator) holds it without the models.
#ifndef STRATA_POLICIES_JOB_LOOP_STATE_H_
#define STRATA_POLICIES_JOB_LOOP_STATE_H_

#include <cstdint>

#include "policies/job/job_spec.h"
#include "policies/job/metrics.h"

namespace strata::policies {

// Adaptive KL controller (Ziegler et al.): nudges the coefficient so the
// observed KL tracks `target` over `horizon` samples. With target <= 0 the
// coefficient stays fixed.
class KlController {
 public:
  KlController(double initial, double target, double horizon) : value_(initial), target_(target), horizon_(horizon) {}
  double value() const { return value_; }
  void Update(double observed_kl, int64_t samples);
  void set_value(double v) { value_ = v; }

 private:
  double value_;
  double target_;
  double horizon_;
};

// The driver's part of an RL loop: the scalars carried from one iteration
// to the next (PPO's adaptive KL coefficient), and what a resumed run needs.
class RlController {
 public:
  explicit RlController(const JobSpec& spec);
  // The scalars the score phase needs.
  Metrics ScoreParams() const;
  // Learns from an iteration's global metrics.
  void Observe(const Metrics& iteration);
  Metrics State() const;
  void Restore(const Metrics& state);

 private:
  const JobSpec spec_;
  KlController kl_;
  // train.reward_normalization: running: every score seen so far.
  double reward_count_ = 0, reward_mean_ = 0, reward_m2_ = 0;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_JOB_LOOP_STATE_H_
