#include "policies/rl/rl_algorithms.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "policies/rl/rl_losses.h"

namespace strata::policies {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

SamplingOptions Sampling(const JobSpec& spec, int64_t iteration) {
  SamplingOptions s;
  s.temperature = spec.generation.temperature;
  s.top_p = spec.generation.top_p;
  s.top_k = spec.generation.top_k;
  s.max_new_tokens = spec.generation.max_new_tokens;
  s.seed = IterationSeed(spec.train.seed, iteration);
  return s;
}

// Response-token tensors of a set of rollouts: mask and padded log-probs.
struct Tokens {
  at::Tensor mask;      // [N, R]
  at::Tensor logprobs;  // [N, R] behaviour log-probs from generation
  int64_t width = 1;
};

Tokens TokensOf(const std::vector<Rollout>& rollouts) {
  Tokens t;
  std::vector<std::vector<float>> lp, ones;
  for (const auto& r : rollouts) {
    t.width = std::max<int64_t>(t.width, static_cast<int64_t>(r.response.size()));
    lp.push_back(r.logprobs);
    ones.emplace_back(r.response.size(), 1.0f);
  }
  t.mask = PadRows(ones, t.width);
  t.logprobs = PadRows(lp, t.width);
  return t;
}

at::Tensor Clip(const std::vector<float>& scores, double clip) {
  at::Tensor s = at::tensor(scores);
  return clip > 0 ? s.clamp(-clip, clip) : s;
}

std::vector<size_t> Lengths(const std::vector<Rollout>& rollouts) {
  std::vector<size_t> out;
  for (const auto& r : rollouts) out.push_back(r.response.size());
  return out;
}

// Peak memory per tier over the iteration's phases, and phase timings.
class PhaseClock {
 public:
  explicit PhaseClock(WorkerGroup& workers) : workers_(workers), start_(Clock::now()), phase_start_(start_) {}
  // The next phase's start also brings the ended phase's peaks. The first
  // one's belong to whatever ran before this iteration (the last update,
  // evaluation, a checkpoint), not to it.
  void Begin(const std::string& phase) {
    const bool ends_own_phase = !phase_.empty();
    EndTimer();
    phase_ = phase;
    phase_start_ = Clock::now();
    const MemoryStats ended = workers_.BeginPhase(phase);
    if (ends_own_phase) AddPeaks(ended);
  }
  void Finish(Metrics& m) {
    if (!phase_.empty()) {
      EndTimer();
      AddPeaks(workers_.PhaseMemory(phase_));
      phase_.clear();
    }
    for (const auto& [tier, bytes] : peaks_) m["memory/" + tier + "_peak_bytes"] = static_cast<double>(bytes);
    for (const auto& [phase, seconds] : seconds_) m["time/" + phase + "_s"] = seconds;
    m["time/iteration_s"] = Since(start_);
  }

 private:
  void EndTimer() {
    if (!phase_.empty()) seconds_[phase_] += Since(phase_start_);
  }
  void AddPeaks(const MemoryStats& stats) {
    for (const auto& [tier, bytes] : stats.peak_bytes) peaks_[tier] = std::max(peaks_[tier], bytes);
  }
  WorkerGroup& workers_;
  Clock::time_point start_, phase_start_;
  std::string phase_;
  std::map<std::string, double> seconds_;
  std::map<std::string, int64_t> peaks_;
};

void AddUpdateStats(const UpdateStats& u, bool ppo, Metrics& m) {
  m["loss/policy_avg"] = u.policy_loss;
  if (ppo) {
    m["loss/value_avg"] = u.value_loss;
    m["policy/clipfrac_avg"] = u.clipfrac;
    m["policy/approxkl_avg"] = u.approx_kl;
    m["val/clipfrac_avg"] = u.value_clipfrac;
  }
}

// Per-sequence KL sums and the objective metrics shared by every algorithm.
void AddObjective(const at::Tensor& score, const at::Tensor& kl, const at::Tensor& mask, double kl_coef, Metrics& m) {
  const at::Tensor kl_sum = (kl * mask).sum(-1);
  m["objective/scores"] = score.mean().item<double>();
  m["objective/kl"] = kl_sum.mean().item<double>();
  m["objective/rlhf_reward"] = (score - kl_coef * kl_sum).mean().item<double>();
  m["objective/response_tokens"] = mask.sum(-1).mean().item<double>();
}

class Remax final : public RlAlgorithm {
 public:
  explicit Remax(const JobSpec& spec, KlEstimator estimator) : spec_(spec), estimator_(estimator) {}

  absl::StatusOr<Metrics> Iterate(WorkerGroup& workers, const std::vector<std::vector<int32_t>>& prompts,
                                  int64_t iteration) override {
    Metrics m;
    PhaseClock clock(workers);
    clock.Begin("rollout");
    RolloutRequest request{prompts, Sampling(spec_, iteration), 1, /*with_greedy=*/true};
    auto rollouts = workers.Generate(request);
    if (!rollouts.ok()) return rollouts.status();
    std::vector<Rollout> sampled, greedy;
    for (auto& r : *rollouts) (r.greedy ? greedy : sampled).push_back(std::move(r));

    clock.Begin("score");
    STRATA_ASSIGN_OR_RETURN(auto s, workers.Score(sampled, ScoreRequest{true, true, false, false}));
    // The greedy baseline needs only its reward: no KL enters the baseline.
    STRATA_ASSIGN_OR_RETURN(auto g, workers.Score(greedy, ScoreRequest{true, false, false, false}));

    const Tokens tokens = TokensOf(sampled);
    const at::Tensor ref = PadRows(s.reference_logprobs, tokens.width);
    const at::Tensor kl = KlPenalty(tokens.logprobs, ref, estimator_) * tokens.mask;
    const at::Tensor score = Clip(s.rewards, spec_.remax.reward_clip);
    const at::Tensor baseline = Clip(g.rewards, spec_.remax.reward_clip);
    const at::Tensor advantages =
        RemaxAdvantages(score, baseline, kl, tokens.mask, spec_.remax.kl_coef, spec_.remax.discount);

    clock.Begin("update");
    PolicyUpdate update;
    update.rollouts = std::move(sampled);
    update.advantages = UnpadRows(advantages, Lengths(update.rollouts));
    update.objective = PolicyObjective::kReinforce;
    STRATA_ASSIGN_OR_RETURN(auto stats, workers.Update(update));
    clock.Finish(m);
    AddObjective(score, kl, tokens.mask, spec_.remax.kl_coef, m);
    m["objective/greedy_scores"] = baseline.mean().item<double>();
    AddUpdateStats(stats, false, m);
    return m;
  }

 private:
  const JobSpec spec_;
  const KlEstimator estimator_;
};

class Ppo final : public RlAlgorithm {
 public:
  Ppo(const JobSpec& spec, KlEstimator estimator)
      : spec_(spec), estimator_(estimator), kl_(spec.ppo.kl_coef, spec.ppo.kl_target, spec.ppo.kl_horizon) {}

  absl::StatusOr<Metrics> Iterate(WorkerGroup& workers, const std::vector<std::vector<int32_t>>& prompts,
                                  int64_t iteration) override {
    Metrics m;
    PhaseClock clock(workers);
    clock.Begin("rollout");
    auto rollouts = workers.Generate(RolloutRequest{prompts, Sampling(spec_, iteration), 1, false});
    if (!rollouts.ok()) return rollouts.status();

    clock.Begin("score");
    STRATA_ASSIGN_OR_RETURN(auto s, workers.Score(*rollouts, ScoreRequest{true, true, true, false}));
    const Tokens tokens = TokensOf(*rollouts);
    const at::Tensor ref = PadRows(s.reference_logprobs, tokens.width);
    const at::Tensor values = PadRows(s.values, tokens.width);
    const at::Tensor kl = KlPenalty(tokens.logprobs, ref, estimator_) * tokens.mask;
    const at::Tensor score = Clip(s.rewards, spec_.ppo.reward_clip);
    const double kl_coef = kl_.value();
    const at::Tensor rewards = TokenRewards(score, kl, tokens.mask, kl_coef);
    auto [advantages, returns] = Gae(rewards, values, tokens.mask, spec_.ppo.gamma, spec_.ppo.lambda);
    if (spec_.ppo.whiten_advantages) advantages = Whiten(advantages, tokens.mask);

    clock.Begin("update");
    PolicyUpdate update;
    const auto lengths = Lengths(*rollouts);
    update.rollouts = std::move(*rollouts);
    update.advantages = UnpadRows(advantages, lengths);
    update.objective = PolicyObjective::kPpo;
    for (const auto& r : update.rollouts) update.old_logprobs.push_back(r.logprobs);
    update.returns = UnpadRows(returns, lengths);
    update.old_values = s.values;
    update.clip_range = spec_.ppo.clip_range;
    update.value_clip = spec_.ppo.value_clip;
    update.epochs = spec_.ppo.epochs;
    update.minibatches = spec_.ppo.minibatches;
    update.shuffle_seed = IterationSeed(spec_.train.seed, iteration) ^ 0x9e3779b97f4a7c15ULL;
    STRATA_ASSIGN_OR_RETURN(auto stats, workers.Update(update));
    clock.Finish(m);
    AddObjective(score, kl, tokens.mask, kl_coef, m);
    m["objective/kl_coef"] = kl_coef;
    m["val/mean"] = MaskedMean(values, tokens.mask).item<double>();
    AddUpdateStats(stats, true, m);
    kl_.Update(m["objective/kl"], static_cast<int64_t>(prompts.size()));
    return m;
  }

  Metrics State() const override { return {{"kl_coef", kl_.value()}}; }
  void Restore(const Metrics& state) override {
    if (auto it = state.find("kl_coef"); it != state.end()) kl_.set_value(it->second);
  }

 private:
  const JobSpec spec_;
  const KlEstimator estimator_;
  KlController kl_;
};

// GRPO and RLOO: several samples per prompt, a group baseline per sequence,
// the KL penalty as a per-token reward, REINFORCE over the result.
class GroupBaseline final : public RlAlgorithm {
 public:
  GroupBaseline(const JobSpec& spec, KlEstimator estimator, bool grpo)
      : spec_(spec), estimator_(estimator), grpo_(grpo) {}

  absl::StatusOr<Metrics> Iterate(WorkerGroup& workers, const std::vector<std::vector<int32_t>>& prompts,
                                  int64_t iteration) override {
    Metrics m;
    PhaseClock clock(workers);
    const int64_t group = spec_.group.samples_per_prompt;
    clock.Begin("rollout");
    auto rollouts = workers.Generate(RolloutRequest{prompts, Sampling(spec_, iteration), group, false});
    if (!rollouts.ok()) return rollouts.status();
    clock.Begin("score");
    STRATA_ASSIGN_OR_RETURN(auto s, workers.Score(*rollouts, ScoreRequest{true, true, false, false}));
    const Tokens tokens = TokensOf(*rollouts);
    const at::Tensor kl = KlPenalty(tokens.logprobs, PadRows(s.reference_logprobs, tokens.width), estimator_) *
                          tokens.mask;
    const at::Tensor score = Clip(s.rewards, spec_.group.reward_clip);
    // Generate returns the samples of a prompt next to each other.
    const at::Tensor grouped = score.view({static_cast<int64_t>(prompts.size()), group});
    const at::Tensor seq_adv = (grpo_ ? GrpoAdvantages(grouped) : RlooAdvantages(grouped)).reshape({-1, 1});
    const at::Tensor advantages = (seq_adv - spec_.group.kl_coef * kl) * tokens.mask;
    clock.Begin("update");
    PolicyUpdate update;
    const auto lengths = Lengths(*rollouts);
    update.rollouts = std::move(*rollouts);
    update.advantages = UnpadRows(advantages, lengths);
    STRATA_ASSIGN_OR_RETURN(auto stats, workers.Update(update));
    clock.Finish(m);
    AddObjective(score, kl, tokens.mask, spec_.group.kl_coef, m);
    AddUpdateStats(stats, false, m);
    return m;
  }

 private:
  const JobSpec spec_;
  const KlEstimator estimator_;
  const bool grpo_;
};

}  // namespace

uint64_t IterationSeed(uint64_t job_seed, int64_t iteration) {
  // splitmix64 of the pair, so neighbouring iterations get unrelated seeds.
  uint64_t z = job_seed * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(iteration) + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

absl::StatusOr<std::unique_ptr<RlAlgorithm>> RlAlgorithm::Create(const JobSpec& spec) {
  auto estimator = [&](const std::string& name) { return ParseKlEstimator(name); };
  switch (spec.algorithm) {
    case Algorithm::kRemax: {
      STRATA_ASSIGN_OR_RETURN(auto e, estimator(spec.remax.kl_estimator));
      return std::unique_ptr<RlAlgorithm>(new Remax(spec, e));
    }
    case Algorithm::kPpo: {
      STRATA_ASSIGN_OR_RETURN(auto e, estimator(spec.ppo.kl_estimator));
      return std::unique_ptr<RlAlgorithm>(new Ppo(spec, e));
    }
    case Algorithm::kGrpo:
    case Algorithm::kRloo: {
      STRATA_ASSIGN_OR_RETURN(auto e, estimator(spec.group.kl_estimator));
      return std::unique_ptr<RlAlgorithm>(new GroupBaseline(spec, e, spec.algorithm == Algorithm::kGrpo));
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("algorithm '", AlgorithmName(spec.algorithm), "' is not an RL loop"));
  }
}

}  // namespace strata::policies
