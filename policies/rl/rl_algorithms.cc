#include "policies/rl/rl_algorithms.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace strata::policies {
namespace {

SamplingOptions Sampling(const JobSpec& spec, const std::vector<BatchPrompt>& prompts, int64_t iteration) {
  SamplingOptions s;
  s.temperature = spec.generation.temperature;
  s.top_p = spec.generation.top_p;
  s.top_k = spec.generation.top_k;
  s.max_new_tokens = spec.generation.max_new_tokens;
  s.seed = IterationSeed(spec.train.seed, iteration);
  for (const BatchPrompt& p : prompts) s.row_seeds.push_back(PromptSeed(s.seed, p.index));
  return s;
}

std::vector<std::vector<int32_t>> Ids(const std::vector<BatchPrompt>& prompts) {
  std::vector<std::vector<int32_t>> out;
  for (const BatchPrompt& p : prompts) out.push_back(p.ids);
  return out;
}

// Response-token tensors of a set of rollouts: mask and padded log-probs.
struct Tokens {
  at::Tensor mask;      // [N, R]
  at::Tensor logprobs;  // [N, R] behaviour log-probs from generation
  int64_t width = 1;
};

Tokens TokensOf(const std::vector<policies::Rollout>& rollouts) {
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

at::Tensor Clip(const at::Tensor& s, double clip) { return clip > 0 ? s.clamp(-clip, clip) : s; }

std::vector<size_t> Lengths(const std::vector<policies::Rollout>& rollouts) {
  std::vector<size_t> out;
  for (const auto& r : rollouts) out.push_back(r.response.size());
  return out;
}

double Sum(const at::Tensor& t) { return t.numel() == 0 ? 0.0 : t.sum().item<double>(); }

// The objective metrics every algorithm reports, as sums over this rank's
// sequences (means over the gang's). The entropy is TRL's estimate: the
// sampled tokens' negative log-probabilities under the sampling policy,
// summed per response (and per token, for a length-free view).
void AddObjective(const at::Tensor& score, const at::Tensor& kl, const Tokens& tokens,
                  const std::vector<policies::Rollout>& rollouts, double kl_coef, GlobalMeans& means) {
  const double n = static_cast<double>(score.numel());
  const at::Tensor& mask = tokens.mask;
  const at::Tensor kl_sum = (kl * mask).sum(-1);
  const double negative_logprobs = Sum(-tokens.logprobs * mask);
  double truncated = 0;
  for (const policies::Rollout& r : rollouts) truncated += r.truncated ? 1 : 0;
  means.Add("objective/scores", Sum(score), n);
  means.Add("objective/kl", Sum(kl_sum), n);
  means.Add("objective/rlhf_reward", Sum(score - kl_coef * kl_sum), n);
  means.Add("objective/response_tokens", Sum(mask), n);
  means.Add("objective/entropy", negative_logprobs, n);
  means.Add("policy/entropy_per_token", negative_logprobs, Sum(mask));
  means.Add("response/clipped_fraction", truncated, n);
}

void AddUpdateStats(const UpdateStats& u, bool ppo, Metrics& m) {
  m["loss/policy_avg"] = u.policy_loss;
  if (ppo) {
    m["loss/value_avg"] = u.value_loss;
    m["policy/clipfrac_avg"] = u.clipfrac;
    m["policy/approxkl_avg"] = u.approx_kl;
    m["val/clipfrac_avg"] = u.value_clipfrac;
  }
}

double Param(const Metrics& params, const std::string& key, double fallback) {
  auto it = params.find(key);
  return it == params.end() ? fallback : it->second;
}

// train.reward_normalization: the affine map (x - mean) / std that whitens
// this iteration's sampled scores, from their global statistics (batch) or
// from those combined with every earlier iteration's (running: the driver
// passes reward_count / reward_mean / reward_m2 in the score params). Adds
// the raw scores' mean and this batch's moments, which the driver folds into
// its running statistics.
struct RewardScale {
  double mean = 0, std = 1;
  at::Tensor Apply(const std::vector<float>& scores) const { return (at::tensor(scores, at::kFloat) - mean) / std; }
};

absl::StatusOr<RewardScale> NormalizeRewards(const JobSpec& spec, const std::vector<float>& raw, const Metrics& params,
                                             ProcessGroup& gang, Metrics& m) {
  const std::string& mode = spec.train.reward_normalization;
  if (mode == "none") return RewardScale{};
  double sum = 0, squares = 0;
  for (float x : raw) sum += x, squares += static_cast<double>(x) * x;
  std::vector<at::Tensor> totals = {at::tensor({sum, squares, static_cast<double>(raw.size())}, at::kDouble)};
  STRATA_RETURN_IF_ERROR(gang.AllReduceSum(totals));
  const double* t = totals[0].data_ptr<double>();
  const double n = std::max(t[2], 1.0), mean = t[0] / n, var = std::max(t[1] / n - mean * mean, 0.0);
  m["reward/raw_mean"] = mean;
  m["reward/batch_var"] = var;
  m["reward/batch_count"] = t[2];
  double use_mean = mean, use_var = var;
  if (mode == "running") {
    // Chan et al.'s parallel update of (count, mean, M2).
    const double prior_n = Param(params, "reward_count", 0), prior_mean = Param(params, "reward_mean", 0);
    const double prior_m2 = Param(params, "reward_m2", 0);
    const double total = prior_n + t[2];
    const double delta = mean - prior_mean;
    use_mean = prior_mean + delta * t[2] / std::max(total, 1.0);
    use_var = (prior_m2 + var * t[2] + delta * delta * prior_n * t[2] / std::max(total, 1.0)) / std::max(total, 1.0);
  }
  return RewardScale{use_mean, std::sqrt(use_var) + 1e-8};
}

// What every algorithm keeps between phases.
class PhasedAlgorithm : public RlAlgorithm {
 protected:
  // The rollouts must be those of the prompts asked for: an answer that does
  // not fit the batch (from a remote worker) is an error here, not a crash
  // in a tensor op later. Each rollout learns its prompt's data row.
  absl::Status CheckRollouts(std::vector<policies::Rollout>& rollouts, size_t prompts, int64_t per_prompt,
                             bool greedy) const {
    const size_t want = prompts * static_cast<size_t>(per_prompt + (greedy ? 1 : 0));
    if (rollouts.size() != want) {
      return absl::InternalError(
          absl::StrCat("rollout returned ", rollouts.size(), " responses for ", prompts, " prompts, expected ", want));
    }
    for (const policies::Rollout& r : rollouts) {
      if (r.prompt_index < 0 || static_cast<size_t>(r.prompt_index) >= prompts ||
          (!r.greedy && r.logprobs.size() != r.response.size())) {
        return absl::InternalError(absl::StrCat("rollout of prompt ", r.prompt_index, " does not fit the batch"));
      }
    }
    for (policies::Rollout& r : rollouts) r.example = prompts_[static_cast<size_t>(r.prompt_index)].example;
    return absl::OkStatus();
  }

  std::vector<BatchPrompt> prompts_;
  std::vector<policies::Rollout> rollouts_;
  PolicyUpdate update_;
  bool scored_ = false;
};

class Remax final : public PhasedAlgorithm {
 public:
  Remax(const JobSpec& spec, KlEstimator estimator) : spec_(spec), estimator_(estimator) {}

  absl::Status Rollout(WorkerGroup& workers, const std::vector<BatchPrompt>& prompts, int64_t,
                       int64_t iteration) override {
    prompts_ = prompts;
    scored_ = false;
    RolloutRequest request{Ids(prompts), Sampling(spec_, prompts, iteration), 1, /*with_greedy=*/true};
    STRATA_ASSIGN_OR_RETURN(rollouts_, workers.Generate(request));
    return CheckRollouts(rollouts_, prompts.size(), 1, true);
  }

  absl::StatusOr<Metrics> Score(WorkerGroup& workers, ProcessGroup& gang, const Metrics& params) override {
    std::vector<policies::Rollout> sampled, greedy;
    for (auto& r : rollouts_) (r.greedy ? greedy : sampled).push_back(std::move(r));
    rollouts_.clear();
    STRATA_ASSIGN_OR_RETURN(auto s, workers.Score(sampled, ScoreRequest{true, true, false, false}));
    // The greedy baseline needs only its reward: no KL enters the baseline.
    STRATA_ASSIGN_OR_RETURN(auto g, workers.Score(greedy, ScoreRequest{true, false, false, false}));

    const Tokens tokens = TokensOf(sampled);
    const at::Tensor ref = PadRows(s.reference_logprobs, tokens.width);
    const at::Tensor kl = KlPenalty(tokens.logprobs, ref, estimator_) * tokens.mask;
    Metrics m;
    STRATA_ASSIGN_OR_RETURN(const RewardScale scale, NormalizeRewards(spec_, s.rewards, params, gang, m));
    const at::Tensor score = Clip(scale.Apply(s.rewards), spec_.remax.reward_clip);
    // The greedy baseline goes through the same map as the samples.
    const at::Tensor baseline = Clip(scale.Apply(g.rewards), spec_.remax.reward_clip);
    const at::Tensor advantages = RemaxAdvantages(score, baseline, kl, tokens.mask, spec_.remax.kl_coef,
                                                  spec_.remax.discount);

    update_ = PolicyUpdate();
    update_.rollouts = std::move(sampled);
    update_.advantages = UnpadRows(advantages, Lengths(update_.rollouts));
    update_.objective = PolicyObjective::kReinforce;
    scored_ = true;

    GlobalMeans means;
    AddObjective(score, kl, tokens, update_.rollouts, spec_.remax.kl_coef, means);
    means.Add("objective/greedy_scores", Sum(baseline), static_cast<double>(baseline.numel()));
    STRATA_RETURN_IF_ERROR(means.Reduce(gang, m));
    return m;
  }

  absl::StatusOr<Metrics> Update(WorkerGroup& workers, ProcessGroup&, int64_t) override {
    if (!scored_) return absl::FailedPreconditionError("update before score");
    scored_ = false;
    STRATA_ASSIGN_OR_RETURN(auto stats, workers.Update(update_));
    Metrics m;
    AddUpdateStats(stats, false, m);
    return m;
  }

 private:
  const JobSpec spec_;
  const KlEstimator estimator_;
};

class Ppo final : public PhasedAlgorithm {
 public:
  Ppo(const JobSpec& spec, KlEstimator estimator) : spec_(spec), estimator_(estimator) {}

  absl::Status Rollout(WorkerGroup& workers, const std::vector<BatchPrompt>& prompts, int64_t global_batch,
                       int64_t iteration) override {
    prompts_ = prompts;
    global_batch_ = global_batch;
    scored_ = false;
    STRATA_ASSIGN_OR_RETURN(rollouts_, workers.Generate(RolloutRequest{Ids(prompts),
                                                                       Sampling(spec_, prompts, iteration), 1, false}));
    return CheckRollouts(rollouts_, prompts.size(), 1, false);
  }

  absl::StatusOr<Metrics> Score(WorkerGroup& workers, ProcessGroup& gang, const Metrics& params) override {
    STRATA_ASSIGN_OR_RETURN(auto s, workers.Score(rollouts_, ScoreRequest{true, true, true, false}));
    const Tokens tokens = TokensOf(rollouts_);
    const at::Tensor ref = PadRows(s.reference_logprobs, tokens.width);
    const at::Tensor values = PadRows(s.values, tokens.width);
    const at::Tensor kl = KlPenalty(tokens.logprobs, ref, estimator_) * tokens.mask;
    Metrics m;
    STRATA_ASSIGN_OR_RETURN(const RewardScale scale, NormalizeRewards(spec_, s.rewards, params, gang, m));
    const at::Tensor score = Clip(scale.Apply(s.rewards), spec_.ppo.reward_clip);
    const double kl_coef = Param(params, "kl_coef", spec_.ppo.kl_coef);
    const at::Tensor rewards = TokenRewards(score, kl, tokens.mask, kl_coef);
    auto [advantages, returns] = Gae(rewards, values, tokens.mask, spec_.ppo.gamma, spec_.ppo.lambda);
    if (spec_.ppo.whiten_advantages) {
      STRATA_ASSIGN_OR_RETURN(advantages, WhitenOverGang(gang, advantages, tokens.mask));
    }

    update_ = PolicyUpdate();
    const auto lengths = Lengths(rollouts_);
    update_.rollouts = std::move(rollouts_);
    rollouts_.clear();
    update_.advantages = UnpadRows(advantages, lengths);
    update_.objective = PolicyObjective::kPpo;
    for (const auto& r : update_.rollouts) {
      update_.old_logprobs.push_back(r.logprobs);
      update_.rows.push_back(prompts_[static_cast<size_t>(r.prompt_index)].index);
    }
    update_.global_rows = global_batch_;
    update_.returns = UnpadRows(returns, lengths);
    update_.old_values = s.values;
    update_.clip_range = spec_.ppo.clip_range;
    update_.value_clip = spec_.ppo.value_clip;
    update_.epochs = spec_.ppo.epochs;
    update_.minibatches = spec_.ppo.minibatches;
    scored_ = true;

    GlobalMeans means;
    AddObjective(score, kl, tokens, update_.rollouts, kl_coef, means);
    means.Add("val/mean", Sum(values * tokens.mask), Sum(tokens.mask));
    STRATA_RETURN_IF_ERROR(means.Reduce(gang, m));
    m["objective/kl_coef"] = kl_coef;
    return m;
  }

  absl::StatusOr<Metrics> Update(WorkerGroup& workers, ProcessGroup&, int64_t iteration) override {
    if (!scored_) return absl::FailedPreconditionError("update before score");
    scored_ = false;
    update_.shuffle_seed = UpdateShuffleSeed(spec_.train.seed, iteration);
    STRATA_ASSIGN_OR_RETURN(auto stats, workers.Update(update_));
    Metrics m;
    AddUpdateStats(stats, true, m);
    return m;
  }

 private:
  // Whiten with the mean and (unbiased) variance of every rank's tokens.
  static absl::StatusOr<at::Tensor> WhitenOverGang(ProcessGroup& gang, const at::Tensor& x, const at::Tensor& mask) {
    std::vector<at::Tensor> sums = {at::tensor({Sum(x * mask), Sum(mask)}, at::kDouble)};
    STRATA_RETURN_IF_ERROR(gang.AllReduceSum(sums));
    const double count = sums[0][1].item<double>();
    const double mean = sums[0][0].item<double>() / std::max(count, 1.0);
    std::vector<at::Tensor> squares = {at::tensor({Sum((x - mean).pow(2) * mask)}, at::kDouble)};
    STRATA_RETURN_IF_ERROR(gang.AllReduceSum(squares));
    const double var = squares[0][0].item<double>() / std::max(count - 1, 1.0);  // unbiased, as TRL's masked_var
    return (x - mean) * (1.0 / std::sqrt(var + 1e-8)) * mask;
  }

  const JobSpec spec_;
  const KlEstimator estimator_;
  int64_t global_batch_ = 0;
};

// GRPO and RLOO: several samples per prompt, a group baseline per sequence,
// the KL penalty as a per-token reward, REINFORCE over the result. A
// prompt's samples stay on the rank that holds the prompt.
class GroupBaseline final : public PhasedAlgorithm {
 public:
  GroupBaseline(const JobSpec& spec, KlEstimator estimator, bool grpo)
      : spec_(spec), estimator_(estimator), grpo_(grpo) {}

  absl::Status Rollout(WorkerGroup& workers, const std::vector<BatchPrompt>& prompts, int64_t,
                       int64_t iteration) override {
    prompts_ = prompts;
    scored_ = false;
    const int64_t group = spec_.group.samples_per_prompt;
    STRATA_ASSIGN_OR_RETURN(
        rollouts_, workers.Generate(RolloutRequest{Ids(prompts), Sampling(spec_, prompts, iteration), group, false}));
    return CheckRollouts(rollouts_, prompts.size(), group, false);
  }

  absl::StatusOr<Metrics> Score(WorkerGroup& workers, ProcessGroup& gang, const Metrics& params) override {
    const int64_t group = spec_.group.samples_per_prompt;
    STRATA_ASSIGN_OR_RETURN(auto s, workers.Score(rollouts_, ScoreRequest{true, true, false, false}));
    const Tokens tokens = TokensOf(rollouts_);
    const at::Tensor kl = KlPenalty(tokens.logprobs, PadRows(s.reference_logprobs, tokens.width), estimator_) *
                          tokens.mask;
    Metrics m;
    STRATA_ASSIGN_OR_RETURN(const RewardScale scale, NormalizeRewards(spec_, s.rewards, params, gang, m));
    const at::Tensor score = Clip(scale.Apply(s.rewards), spec_.group.reward_clip);
    // Generate returns the samples of a prompt next to each other.
    const at::Tensor grouped = score.view({static_cast<int64_t>(prompts_.size()), group});
    const at::Tensor seq_adv = (grpo_ ? GrpoAdvantages(grouped) : RlooAdvantages(grouped)).reshape({-1, 1});
    const at::Tensor advantages = (seq_adv - spec_.group.kl_coef * kl) * tokens.mask;
    update_ = PolicyUpdate();
    const auto lengths = Lengths(rollouts_);
    update_.rollouts = std::move(rollouts_);
    rollouts_.clear();
    update_.advantages = UnpadRows(advantages, lengths);
    scored_ = true;
    GlobalMeans means;
    AddObjective(score, kl, tokens, update_.rollouts, spec_.group.kl_coef, means);
    STRATA_RETURN_IF_ERROR(means.Reduce(gang, m));
    return m;
  }

  absl::StatusOr<Metrics> Update(WorkerGroup& workers, ProcessGroup&, int64_t) override {
    if (!scored_) return absl::FailedPreconditionError("update before score");
    scored_ = false;
    STRATA_ASSIGN_OR_RETURN(auto stats, workers.Update(update_));
    Metrics m;
    AddUpdateStats(stats, false, m);
    return m;
  }

 private:
  const JobSpec spec_;
  const KlEstimator estimator_;
  const bool grpo_;
};

}  // namespace

void GlobalMeans::Add(const std::string& key, double sum, double count) {
  keys_.push_back(key);
  values_.push_back(sum);
  values_.push_back(count);
}

absl::Status GlobalMeans::Reduce(ProcessGroup& gang, Metrics& out) const {
  std::vector<at::Tensor> sums = {at::tensor(values_, at::kDouble)};
  STRATA_RETURN_IF_ERROR(gang.AllReduceSum(sums));
  const double* v = sums[0].data_ptr<double>();
  for (size_t i = 0; i < keys_.size(); ++i) out[keys_[i]] = v[2 * i] / std::max(v[2 * i + 1], 1e-30);
  return absl::OkStatus();
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
