#include "services/rank/local_worker_group.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "policies/config/llama_config.h"
#include "policies/job/hardware_figures.h"
#include "policies/job/memory_plan.h"
#include "policies/rl/rl_algorithms.h"
#include "services/phase/phase.h"
#include "services/rank/actor.h"
#include "services/rank/critic.h"
#include "services/rank/gang_sum.h"
#include "services/rank/packed_batch.h"
#include "services/rank/policy_update.h"
#include "services/rank/rank_memory.h"
#include "services/rank/run_checkpoint.h"
#include "services/rank/scorer.h"

namespace strata::services {

using policies::LlamaHead;

LocalWorkerGroup::LocalWorkerGroup(policies::JobSpec spec) : spec_(std::move(spec)) {}

LocalWorkerGroup::~LocalWorkerGroup() {
  // Models (and their streamers) hold buffers of the arena and the store.
  // The scorer may use the actor's frozen base: it goes first.
  scorer_.reset();
  actor_.reset();
  critic_.reset();
}

absl::StatusOr<std::unique_ptr<LocalWorkerGroup>> LocalWorkerGroup::Create(const policies::JobSpec& spec,
                                                                           policies::ProcessGroup* gang,
                                                                           const RewardAccess& access) {
  STRATA_RETURN_IF_ERROR(spec.Validate());
  std::unique_ptr<LocalWorkerGroup> group(new LocalWorkerGroup(spec));
  group->access_ = access;
  if (gang == nullptr) {
    group->solo_ = policies::ProcessGroup::Solo();
    gang = group->solo_.get();
  }
  group->gang_ = gang;
  STRATA_ASSIGN_OR_RETURN(group->memory_, RankMemory::Create(group->spec_, *gang));
  group->passes_.gang = gang;
  group->passes_.device = group->memory_->device();
  group->passes_.micro_batch_size = spec.train.micro_batch_size;
  group->passes_.rollout = spec.generation.engine;
  group->passes_.rollout.max_concurrency = RolloutConcurrency(spec);
  STRATA_RETURN_IF_ERROR(group->LoadModels());
  return group;
}

int64_t RolloutConcurrency(const policies::JobSpec& spec) {
  using policies::Algorithm;
  // Rows decoded together are bounded as the training passes' rows are,
  // unless the spec bounds them itself.
  const int64_t limit = spec.generation.engine.max_concurrency > 0 ? spec.generation.engine.max_concurrency
                                                                   : spec.train.micro_batch_size;
  if (spec.algorithm == Algorithm::kSft || spec.algorithm == Algorithm::kRewardModel) return limit;
  if (spec.generation.engine.kv_pool_mib > 0 || spec.memory.device_mib == 0) return limit;
  auto models = policies::JobModels(spec);
  if (!models.ok()) return limit;  // LoadModels reports what is wrong with them
  const policies::JobPrediction plan = policies::PredictJob(spec, *models, policies::BuiltInHardwareFigures(),
                                                            spec.parallel.workers);
  // What the spec alone allows; only the budget makes the plan's fewer.
  const int64_t allowed = limit > 0 ? std::min(limit, plan.rollout_continuations) : plan.rollout_continuations;
  const int64_t bounded = plan.rollout_concurrency;
  if (bounded <= 0 || bounded >= allowed) return limit;
  STRATA_LOG(Info) << "rollout: " << bounded
                   << " continuations at once, what memory.device_mib leaves the KV pool (strata plan)";
  return bounded;
}

const std::vector<std::string>& LocalWorkerGroup::placed_models() const { return memory_->placed(); }

offload::DeviceMemoryMonitor& LocalWorkerGroup::device_monitor() const { return memory_->monitor(); }

absl::Status LocalWorkerGroup::LoadModels() {
  using policies::Algorithm;
  const double lr = spec_.train.lr;
  lr_ = lr;
  std::unique_ptr<policies::PlacedModel> actor, critic;
  ScorerModels scoring;
  std::string tokenizer_dir;
  switch (spec_.algorithm) {
    case Algorithm::kSft: {
      STRATA_ASSIGN_OR_RETURN(actor, memory_->Place("actor", spec_.actor, LlamaHead::kLanguageModel, true, lr));
      tokenizer_dir = spec_.actor.path;
      break;
    }
    case Algorithm::kRewardModel: {
      STRATA_ASSIGN_OR_RETURN(scoring.reward, memory_->Place("reward", spec_.reward, LlamaHead::kScalar, true, lr));
      tokenizer_dir = spec_.reward.path;
      break;
    }
    case Algorithm::kPpo:
    case Algorithm::kRemax:
    case Algorithm::kGrpo:
    case Algorithm::kRloo: {
      STRATA_ASSIGN_OR_RETURN(actor, memory_->Place("actor", spec_.actor, LlamaHead::kLanguageModel, true, lr));
      policies::ModelSpec reference = spec_.reference;
      if (reference.path.empty()) reference.path = spec_.actor.path;
      if (actor->frozen_base() != nullptr && reference.path == spec_.actor.path) {
        // LoRA: the reference is the actor's base with the adapters off.
        scoring.frozen_reference = actor->frozen_base();
      } else {
        STRATA_ASSIGN_OR_RETURN(scoring.reference,
                                memory_->Place("reference", reference, LlamaHead::kLanguageModel, false, 0));
      }
      if (spec_.algorithm == Algorithm::kPpo) {
        policies::ModelSpec critic_spec = spec_.critic;
        critic_spec.path = policies::DefaultCriticPath(spec_);
        STRATA_ASSIGN_OR_RETURN(critic,
                                memory_->Place("critic", critic_spec, LlamaHead::kScalar, true, spec_.ppo.critic_lr));
      }
      tokenizer_dir = spec_.actor.path;
      break;
    }
  }
  tokenizer_path_ = !spec_.data.tokenizer.empty() ? spec_.data.tokenizer : tokenizer_dir;
  if (tokenizer_path_.empty()) {
    return absl::InvalidArgumentError("data.tokenizer is required when the model is initialised from a config");
  }
  auto tokenizer = policies::Tokenizer::Load(tokenizer_path_);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(), absl::StrCat("data.tokenizer: ", tokenizer.status().message()));
  }
  tokenizer_ = std::move(*tokenizer);
  std::vector<int64_t> stops;
  if (actor != nullptr) stops = actor->model().config().eos_token_ids;
  if (!spec_.actor.path.empty()) {
    auto generation = policies::ReadGenerationEosIds(spec_.actor.path);
    if (!generation.ok()) return generation.status();
    stops.insert(stops.end(), generation->begin(), generation->end());
  }
  if (tokenizer_->eos_id() >= 0) stops.push_back(tokenizer_->eos_id());
  stops.insert(stops.end(), spec_.generation.stop_token_ids.begin(), spec_.generation.stop_token_ids.end());
  for (int64_t id : stops) {
    if (std::find(stop_token_ids_.begin(), stop_token_ids_.end(), id) == stop_token_ids_.end()) {
      stop_token_ids_.push_back(id);
    }
  }
  if (actor != nullptr) actor_ = std::make_unique<Actor>(std::move(actor), *tokenizer_, stop_token_ids_, passes_);
  if (scoring.reward != nullptr || scoring.reference != nullptr || scoring.frozen_reference != nullptr) {
    scorer_ = std::make_unique<Scorer>(std::move(scoring), *tokenizer_, passes_);
  }
  if (!spec_.reward_sources.empty()) {
    auto place = [this](const std::string& key, const policies::ModelSpec& model) {
      return memory_->Place(key, model, LlamaHead::kScalar, false, 0);
    };
    STRATA_ASSIGN_OR_RETURN(reward_sources_, RewardSources::Create(spec_.reward_sources, spec_, tokenizer_path_,
                                                                   access_, place, passes_));
  }
  if (critic != nullptr) critic_ = std::make_unique<Critic>(std::move(critic));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<policies::Rollout>> LocalWorkerGroup::Generate(const policies::RolloutRequest& request) {
  if (actor_ == nullptr) return absl::FailedPreconditionError("this job has no actor to generate with");
  return actor_->Generate(request);
}

absl::StatusOr<policies::Scores> LocalWorkerGroup::Score(const std::vector<policies::Rollout>& rollouts,
                                                         const policies::ScoreRequest& request) {
  // The rewards of the whole batch at once (a remote source sends it in
  // its own batches); the forward passes in micro-batches
  // (train.micro_batch_size), results in the rollouts' order.
  std::vector<float> rewards;
  if (request.rewards && !rollouts.empty()) {
    if (reward_sources_ == nullptr || prompts_ == nullptr) {
      return absl::FailedPreconditionError("rewards requested but this job has no reward sources or prompts");
    }
    STRATA_ASSIGN_OR_RETURN(auto views, ViewsOf(rollouts, *prompts_));
    STRATA_ASSIGN_OR_RETURN(auto scored, ScoreResponses(views));
    for (const auto& [name, seconds] : scored.seconds) reward_seconds_[name] += seconds;
    for (const auto& [name, scores] : scored.by_source) {
      for (size_t i = 0; i < rollouts.size(); ++i) {
        if (rollouts[i].greedy) continue;  // ReMax's baseline is not a response the policy sampled
        reward_sums_[name] += scores[i];
        reward_counts_[name] += 1;
      }
    }
    rewards = std::move(scored.total);
  }
  const auto micros = MicroBatches(rollouts.size(), spec_.train.micro_batch_size);
  if (micros.size() == 1) {
    STRATA_ASSIGN_OR_RETURN(auto scores, ScoreRows(rollouts, request));  // no copy of the batch
    scores.rewards = std::move(rewards);
    return scores;
  }
  policies::Scores all;
  all.rewards = std::move(rewards);
  for (const auto& [begin, end] : micros) {
    const std::vector<policies::Rollout> part(rollouts.begin() + begin, rollouts.begin() + end);
    STRATA_ASSIGN_OR_RETURN(auto s, ScoreRows(part, request));
    for (auto [to, from] : {std::pair{&all.reference_logprobs, &s.reference_logprobs},
                            std::pair{&all.actor_logprobs, &s.actor_logprobs}, std::pair{&all.values, &s.values}}) {
      to->insert(to->end(), from->begin(), from->end());
    }
  }
  return all;
}

absl::StatusOr<policies::Scores> LocalWorkerGroup::ScoreRows(const std::vector<policies::Rollout>& rollouts,
                                                             const policies::ScoreRequest& request) {
  policies::Scores scores;
  if (rollouts.empty()) return scores;
  c10::NoGradGuard no_grad;
  const Packed packed = PackRollouts(rollouts, memory_->device());
  if (request.reference_logprobs && scorer_ == nullptr) {
    return absl::FailedPreconditionError("reference log-probs requested but this job has no reference model");
  }
  if (request.actor_logprobs && actor_ == nullptr) {
    return absl::FailedPreconditionError("actor log-probs requested but this job has no actor");
  }
  if (request.reference_logprobs) scores.reference_logprobs = scorer_->ReferenceLogProbs(packed, rollouts);
  if (request.actor_logprobs) scores.actor_logprobs = actor_->LogProbs(packed, rollouts);
  if (request.values) {
    if (critic_ == nullptr) return absl::FailedPreconditionError("values requested but this job has no critic");
    scores.values = critic_->Values(packed, rollouts);
  }
  return scores;
}

absl::StatusOr<SourceScores> LocalWorkerGroup::ScoreResponses(const std::vector<ScoredResponse>& responses) {
  if (reward_sources_ == nullptr) return absl::FailedPreconditionError("this job has no reward sources");
  return reward_sources_->Score(responses);
}

absl::StatusOr<std::vector<ScoredResponse>> LocalWorkerGroup::ViewsOf(const std::vector<policies::Rollout>& rollouts,
                                                                      const policies::PromptSet& prompts) const {
  std::vector<ScoredResponse> views;
  for (const policies::Rollout& r : rollouts) {
    if (r.example < 0 || static_cast<size_t>(r.example) >= prompts.ids.size()) {
      return absl::InternalError(
          absl::StrCat("a rollout of data row ", r.example, " outside the job's ", prompts.ids.size(), " prompts"));
    }
    const size_t row = static_cast<size_t>(r.example);
    views.push_back(ViewOf(*tokenizer_, stop_token_ids_, r.prompt, r.response, prompts.text[row],
                           &prompts.messages[row], prompts.labels[row]));
  }
  return views;
}

policies::Metrics LocalWorkerGroup::TakeRewardMetrics() {
  policies::Metrics m;
  for (const auto& [name, sum] : reward_sums_) AddMeanShare("reward/" + name, sum, reward_counts_[name], m);
  for (const auto& [name, seconds] : reward_seconds_) m["time/score/" + name + "_s"] = seconds;
  reward_sums_.clear(), reward_counts_.clear(), reward_seconds_.clear();
  return m;
}

absl::StatusOr<policies::UpdateStats> LocalWorkerGroup::Update(const policies::PolicyUpdate& update) {
  if (actor_ == nullptr) return absl::FailedPreconditionError("this job has no actor to update");
  STRATA_ASSIGN_OR_RETURN(const UpdateSteps steps, UpdateSteps::Plan(update, critic_ != nullptr, passes_));
  const bool ppo = update.objective == policies::PolicyObjective::kPpo;
  policies::UpdateStats stats;
  for (size_t k = 0; k < steps.size(); ++k) {
    const std::vector<UpdateMicroBatch> micros = steps.MicroBatchesOf(k);
    STRATA_RETURN_IF_ERROR(actor_->PolicyStep(micros, update, stats));
    if (ppo) STRATA_RETURN_IF_ERROR(critic_->ValueStep(micros, update, stats));
  }
  std::vector<double> sums = {stats.policy_loss, stats.value_loss, stats.clipfrac, stats.value_clipfrac,
                              stats.approx_kl};
  STRATA_RETURN_IF_ERROR(SumOverGang(*gang_, sums));
  const double k = static_cast<double>(std::max<size_t>(steps.size(), 1));
  stats.policy_loss = sums[0] / k, stats.value_loss = sums[1] / k, stats.clipfrac = sums[2] / k;
  stats.value_clipfrac = sums[3] / k, stats.approx_kl = sums[4] / k;
  return stats;
}

absl::StatusOr<policies::TrainStats> LocalWorkerGroup::TrainSft(const std::vector<policies::TextPair>& batch) {
  if (actor_ == nullptr) return absl::FailedPreconditionError("no trainable actor");
  return actor_->TrainSft(batch);
}

absl::StatusOr<policies::TrainStats> LocalWorkerGroup::TrainRewardModel(
    const std::vector<policies::PreferencePair>& batch) {
  if (scorer_ == nullptr) return absl::FailedPreconditionError("no trainable reward model");
  return scorer_->TrainRewardModel(batch);
}

absl::StatusOr<policies::TrainStats> LocalWorkerGroup::EvaluateRewardModel(
    const std::vector<policies::PreferencePair>& pairs) {
  if (scorer_ == nullptr) return absl::FailedPreconditionError("this job has no reward model");
  return scorer_->EvaluateRewardModel(pairs);
}

policies::MemoryStats LocalWorkerGroup::BeginPhase(const std::string& phase) {
  policies::MemoryStats ended;
  if (!phase_.empty()) {
    ended = PhaseMemory(phase_);
    phase_memory_[phase_] = ended;
  }
  phase_ = phase;
  memory_->monitor().ResetPeak();
  return ended;
}

absl::Status LocalWorkerGroup::BeginIteration(int64_t iteration) {
  const double scale = policies::LearningRateScale(spec_.train, iteration);
  for (auto& [name, model] : Trainable()) {
    const double base = name == "critic" ? spec_.ppo.critic_lr : spec_.train.lr;
    STRATA_RETURN_IF_ERROR(model->trainer()->SetLearningRate(base * scale));
  }
  lr_ = spec_.train.lr * scale;
  return absl::OkStatus();
}

std::map<std::string, double> LocalWorkerGroup::OptimizerMetrics() {
  std::map<std::string, double> out = {{"optimizer/lr", lr_}};
  for (auto& [name, model] : Trainable()) {
    out[name == "critic" ? "optimizer/critic_grad_norm" : "optimizer/grad_norm"] = model->trainer()->last_grad_norm();
  }
  return out;
}

std::map<std::string, int64_t> LocalWorkerGroup::MemoryInUse() const { return memory_->InUse(); }

policies::MemoryStats LocalWorkerGroup::PhaseMemory(const std::string& phase) {
  if (phase != phase_) {
    auto it = phase_memory_.find(phase);
    return it == phase_memory_.end() ? policies::MemoryStats{} : it->second;
  }
  policies::MemoryStats stats;
  stats.peak_bytes = memory_->PeakBytes();
  // Master weights and moments this rank holds (ZeRO-1 shards them), and
  // host gradient buffers at most at once (ZeRO-2 keeps the held share).
  int64_t optimizer = 0, gradients = 0;
  for (auto& [name, model] : Trainable()) {
    optimizer += model->trainer()->optimizer_state_bytes();
    gradients += model->trainer()->gradient_peak_bytes();
  }
  stats.peak_bytes["optimizer_state"] = optimizer;
  stats.peak_bytes["gradient"] = gradients;
  return stats;
}

std::vector<std::pair<std::string, policies::PlacedModel*>> LocalWorkerGroup::Trainable() {
  std::vector<std::pair<std::string, policies::PlacedModel*>> out;
  for (auto* m : {actor_ ? &actor_->model() : nullptr, scorer_ ? scorer_->reward_model() : nullptr,
                  critic_ ? &critic_->model() : nullptr}) {
    if (m != nullptr && m->trainer() != nullptr) out.emplace_back(m->name(), m);
  }
  return out;
}

absl::Status LocalWorkerGroup::SaveCheckpoint(const std::string& dir) {
  // The directory is the caller's to name; its parts are made below it.
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("checkpoint: cannot create ", dir, ": ", ec.message()));
  if (gang_->rank() == 0) STRATA_RETURN_IF_ERROR(SaveWeights(dir));
  return SaveOptimizerStates(dir);
}

absl::Status LocalWorkerGroup::SaveWeights(const std::string& dir) {
  for (auto& [name, model] : Trainable()) {
    STRATA_ASSIGN_OR_RETURN(const std::string sub, MakeModelCheckpointDirectory(dir, name));
    STRATA_RETURN_IF_ERROR(model->Save(sub));
  }
  return absl::OkStatus();
}

absl::Status LocalWorkerGroup::SaveOptimizerStates(const std::string& dir) {
  const int rank = gang_->rank(), world = gang_->world_size();
  for (auto& [name, model] : Trainable()) {
    STRATA_ASSIGN_OR_RETURN(const std::string sub, MakeModelCheckpointDirectory(dir, name));
    STRATA_RETURN_IF_ERROR(model->trainer()->SaveState(OptimizerStatePath(sub, rank, world)));
  }
  return absl::OkStatus();
}

absl::Status LocalWorkerGroup::LoadCheckpoint(const std::string& dir) {
  for (auto& [name, model] : Trainable()) {
    const std::string sub = ModelCheckpointDirectory(dir, name);
    STRATA_RETURN_IF_ERROR(model->LoadWeights(sub));
    STRATA_ASSIGN_OR_RETURN(const std::vector<std::string> files, OptimizerStateFiles(sub));
    STRATA_RETURN_IF_ERROR(model->trainer()->LoadState(files));
  }
  return absl::OkStatus();
}

absl::Status LocalWorkerGroup::CopyTokenizer(const std::string& dir) const {
  const std::string from = IsDirectory(tokenizer_path_) ? tokenizer_path_
                                                        : std::filesystem::path(tokenizer_path_).parent_path().string();
  // The chat template and end-of-turn ids travel with the model, so the
  // next stage (SFT -> RL) renders and stops as this one did.
  for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                           "chat_template.jinja", "generation_config.json"}) {
    const std::string source = JoinPath(from, name);
    if (!IsRegularFile(source)) continue;
    STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(source));
    STRATA_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(dir, name), text));
  }
  if (!spec_.data.chat_template_file.empty()) {
    STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(spec_.data.chat_template_file));
    STRATA_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(dir, "chat_template.jinja"), text));
  }
  return absl::OkStatus();
}

absl::Status LocalWorkerGroup::SaveOutput(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("output.dir: cannot create ", dir, ": ", ec.message()));
  policies::PlacedModel* model = spec_.algorithm == policies::Algorithm::kRewardModel ? scorer_->reward_model()
                                                                                      : &actor_->model();
  STRATA_RETURN_IF_ERROR(model->Export(dir));
  STRATA_RETURN_IF_ERROR(CopyTokenizer(dir));
  if (!spec_.merge_lora || model->adapters() == nullptr) return absl::OkStatus();
  const std::string merged = JoinPath(dir, "merged");
  std::filesystem::create_directories(merged, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("output.dir: cannot create ", merged, ": ", ec.message()));
  STRATA_RETURN_IF_ERROR(model->SaveMerged(merged));
  return CopyTokenizer(merged);
}

}  // namespace strata::services
