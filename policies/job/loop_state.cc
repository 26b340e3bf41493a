#include "policies/job/loop_state.h"

#include <algorithm>

namespace strata::policies {

void KlController::Update(double observed_kl, int64_t samples) {
  if (target_ <= 0) return;
  const double error = std::clamp(observed_kl / target_ - 1.0, -0.2, 0.2);
  value_ *= 1.0 + error * static_cast<double>(samples) / horizon_;
}

RlController::RlController(const JobSpec& spec)
    : spec_(spec), kl_(spec.ppo.kl_coef, spec.ppo.kl_target, spec.ppo.kl_horizon) {}

// The score phase needs exactly the carried scalars.
Metrics RlController::ScoreParams() const { return State(); }

void RlController::Observe(const Metrics& iteration) {
  if (spec_.train.reward_normalization == "running") {
    auto n = iteration.find("reward/batch_count"), mean = iteration.find("reward/raw_mean"),
         var = iteration.find("reward/batch_var");
    if (n != iteration.end() && mean != iteration.end() && var != iteration.end() && n->second > 0) {
      // Chan et al.'s parallel update, as the score phase applied it.
      const double total = reward_count_ + n->second, delta = mean->second - reward_mean_;
      reward_m2_ += var->second * n->second + delta * delta * reward_count_ * n->second / total;
      reward_mean_ += delta * n->second / total;
      reward_count_ = total;
    }
  }
  if (spec_.algorithm != Algorithm::kPpo) return;
  auto kl = iteration.find("objective/kl");
  if (kl != iteration.end()) kl_.Update(kl->second, spec_.train.batch_size);
}

Metrics RlController::State() const {
  Metrics state;
  if (spec_.train.reward_normalization == "running") {
    state = {{"reward_count", reward_count_}, {"reward_mean", reward_mean_}, {"reward_m2", reward_m2_}};
  }
  if (spec_.algorithm == Algorithm::kPpo) state["kl_coef"] = kl_.value();
  return state;
}

void RlController::Restore(const Metrics& state) {
  if (auto it = state.find("kl_coef"); it != state.end() && spec_.algorithm == Algorithm::kPpo) {
    kl_.set_value(it->second);
  }
  auto get = [&](const char* key) {
    auto it = state.find(key);
    return it == state.end() ? 0.0 : it->second;
  };
  reward_count_ = get("reward_count");
  reward_mean_ = get("reward_mean");
  reward_m2_ = get("reward_m2");
}

}  // namespace strata::policies
