#include "services/rank/job_rank.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/engine_counters.h"
#include "base/file.h"
#include "base/interrupt.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "policies/data/batch_order.h"
#include "policies/data/chat_tokens.h"
#include "policies/job/seeds.h"
#include "services/telemetry/service_metrics.h"

namespace strata::services {
namespace {

// Fault points for the gang's failure tests (tests/e2e/service_test.cc),
// set in a worker's environment as STRATA_FAILPOINT:
//   kill@PHASE:ITERATION            the rank's process ends as kill -9 would
//                                   end it, as it starts that phase, while
//                                   the other ranks go on into its collectives;
//   stall@PHASE:ITERATION:SECONDS   the rank works SECONDS longer in that
//                                   phase than the others (a slow rank that
//                                   still answers); an interrupt (a cancel,
//                                   an unload) ends that work early, as it
//                                   would end real work.
// PHASE is a phase's name; save_weights: rank 0 writing a checkpoint's
// weights in commit; or load (ITERATION 0): a rank's start, once its
// models are loaded. A fault point acts once per process: a job that
// resumes after it runs the same iteration again without it.
void ActAtFailpoint(const std::string& phase, int64_t iteration) {
  static const char* const failpoint = std::getenv("STRATA_FAILPOINT");
  static std::atomic<bool> acted{false};
  if (failpoint == nullptr || acted.load()) return;
  const std::string here = absl::StrCat("@", phase, ":", iteration);
  if (absl::StrCat("kill", here) == failpoint) {
    STRATA_LOG(Warning) << "STRATA_FAILPOINT " << failpoint << ": this process ends now (SIGKILL)";
    std::fflush(nullptr);
    std::raise(SIGKILL);
  }
  const std::string stall = absl::StrCat("stall", here, ":");
  int seconds = 0;
  if (absl::StartsWith(failpoint, stall) && absl::SimpleAtoi(std::string(failpoint).substr(stall.size()), &seconds)) {
    // Claimed, not just marked: the ranks of an in-process gang reach it
    // together, and only one of them stalls.
    bool unclaimed = false;
    if (!acted.compare_exchange_strong(unclaimed, true)) return;
    STRATA_LOG(Warning) << "STRATA_FAILPOINT " << failpoint << ": working " << seconds << " s longer";
    const auto started = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - started < std::chrono::seconds(seconds)) {
      if (InterruptRequested()) {
        STRATA_LOG(Warning) << "STRATA_FAILPOINT " << failpoint << ": interrupted after "
                            << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()
                            << " s";
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // stands for work between interrupt checks
    }
  }
}

using policies::Algorithm;
using policies::Metrics;

// True when both paths name the same existing file or directory.
bool SameFile(const std::string& a, const std::string& b) {
  std::error_code ec;
  return std::filesystem::equivalent(a, b, ec) && !ec;
}

double Param(const Metrics& params, const std::string& key, double fallback = 0) {
  auto it = params.find(key);
  return it == params.end() ? fallback : it->second;
}

}  // namespace

JobRank::JobRank(const policies::JobSpec& spec, LocalWorkerGroup& models, const policies::Tokenizer& tokenizer,
                 policies::ProcessGroup& gang, JobRankOptions options)
    : spec_(spec),
      models_(models),
      tokenizer_(tokenizer),
      gang_(gang),
      options_(std::move(options)),
      metrics_(spec.output_dir, options_.metrics_path),
      checkpoints_(spec.checkpoint.dir, gang) {}

JobRank::~JobRank() = default;

absl::StatusOr<std::unique_ptr<JobRank>> JobRank::Create(const policies::JobSpec& spec, LocalWorkerGroup& models,
                                                         const policies::Tokenizer& tokenizer,
                                                         policies::ProcessGroup& gang, JobRankOptions options) {
  if (gang.world_size() > spec.train.batch_size) {
    return absl::InvalidArgumentError(absl::StrCat("parallel.workers (", gang.world_size(),
                                                   ") exceeds train.batch_size (", spec.train.batch_size,
                                                   "): every rank needs a share of the batch"));
  }
  // The models are loaded; what follows reads the data (and, on resume,
  // the checkpoint). A cancelled load stops here at the latest.
  ActAtFailpoint("load", 0);
  STRATA_RETURN_IF_ERROR(CheckInterrupt("while the rank loads"));
  std::unique_ptr<JobRank> rank(new JobRank(spec, models, tokenizer, gang, std::move(options)));
  if (gang.rank() == 0) {
    std::error_code ec;
    std::filesystem::create_directories(spec.output_dir, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("output.dir: cannot create ", spec.output_dir, ": ", ec.message()));
    }
  }
  STRATA_ASSIGN_OR_RETURN(auto data,
                          ReadJobExamples(spec, tokenizer, models.tokenizer_path(), models.stop_token_ids()));
  rank->data_ = std::make_unique<policies::JobData>(std::move(data));
  if (gang.rank() == 0) {
    STRATA_LOG(Info) << rank->data_->examples << " examples; the first prompt as the policy sees it:\n"
                     << rank->data_->sample_prompt;
    if (rank->data_->overlong_prompts > 0) {
      STRATA_LOG(Warning) << rank->data_->overlong_prompts << " prompts over data.max_prompt_tokens ("
                          << spec.data.max_prompt_tokens << ") were "
                          << (spec.data.overlong_prompts == "drop" ? "dropped" : "cut to their end");
    }
  }
  if (spec.algorithm != Algorithm::kSft && spec.algorithm != Algorithm::kRewardModel) {
    STRATA_ASSIGN_OR_RETURN(rank->algorithm_, policies::RlAlgorithm::Create(spec));
    models.SetPrompts(&rank->data_->prompts);
    // RL evaluation: sampled responses to the eval prompts, scored by the
    // job's reward sources or by eval.rule alone.
    if (spec.eval.every > 0 && !rank->data_->eval_prompts.ids.empty()) {
      rank->evaluates_ = true;
      if (!spec.eval.rule.empty()) {
        policies::RewardSourceSpec rule;
        rule.name = spec.eval.rule;
        rule.kind = "verifier";
        rule.check = spec.eval.rule;
        auto made = RewardSources::Create({rule}, spec, models.tokenizer_path(), {}, nullptr, {});
        if (!made.ok()) return absl::InvalidArgumentError(absl::StrCat("eval.rule: ", made.status().message()));
        rank->eval_rule_ = *std::move(made);
      }
    }
  }
  return rank;
}

std::vector<size_t> JobRank::ShardOf(int64_t iteration, std::vector<int64_t>* batch_index) const {
  const auto all = policies::BatchIndices(data_->examples, spec_.train.batch_size, iteration, spec_.train.seed);
  return policies::ShardOfBatch(all, gang_.rank(), gang_.world_size(), batch_index);
}

absl::StatusOr<PhaseReply> JobRank::Run(const PhaseRequest& request) {
  const std::string& phase = request.phase;
  PhaseReply reply;
  if (phase == phases::kFindCheckpoint) return FindCheckpoint(request);
  if (phase == phases::kStart) {
    STRATA_RETURN_IF_ERROR(Start(request));
    return reply;
  }
  if (phase == phases::kCommit) return Commit(request);
  if (phase == phases::kFinish) {
    // The driver ends the job once every rank has replied, rank 0 after
    // its write: the others need not wait for it in a barrier.
    if (gang_.rank() == 0) STRATA_RETURN_IF_ERROR(models_.SaveOutput(spec_.output_dir));
    return reply;
  }
  if (phase == phases::kEvaluate) {
    ActAtFailpoint(phase, request.iteration);
    STRATA_ASSIGN_OR_RETURN(reply.metrics, Evaluate());
    return reply;
  }
  const bool rl = algorithm_ != nullptr;
  const bool known = rl ? (phase == phases::kRollout || phase == phases::kScore || phase == phases::kUpdate)
                        : phase == phases::kTrain;
  if (!known) {
    return absl::InvalidArgumentError(
        absl::StrCat("phase '", phase, "' is not one of this ", policies::AlgorithmName(spec_.algorithm), " job's"));
  }
  // Timed and measured phases: the reply carries this rank's figures.
  const std::string measured = phase == phases::kTrain ? phases::kUpdate : phase;
  const auto started = std::chrono::steady_clock::now();
  const EngineCounters& counters = GlobalEngineCounters();
  const int64_t nvme_read = EngineCounters::Read(counters.nvme_read_bytes);
  const int64_t nvme_written = EngineCounters::Read(counters.nvme_written_bytes);
  models_.BeginPhase(measured);
  ActAtFailpoint(phase, request.iteration);
  if (phase == phases::kRollout) {
    std::vector<int64_t> index;
    const auto rows = ShardOf(request.iteration, &index);
    std::vector<policies::BatchPrompt> prompts;
    for (size_t i = 0; i < rows.size(); ++i) {
      prompts.push_back({index[i], data_->prompts.ids[rows[i]], static_cast<int64_t>(rows[i])});
    }
    STRATA_RETURN_IF_ERROR(algorithm_->Rollout(models_, prompts, spec_.train.batch_size, request.iteration));
  } else if (phase == phases::kScore) {
    STRATA_ASSIGN_OR_RETURN(reply.metrics, algorithm_->Score(models_, gang_, request.params));
    for (const auto& [key, value] : models_.TakeRewardMetrics()) reply.metrics[key] = value;
  } else {
    // The schedule's learning rate for this iteration's steps.
    STRATA_RETURN_IF_ERROR(models_.BeginIteration(request.iteration));
    if (phase == phases::kUpdate) {
      STRATA_ASSIGN_OR_RETURN(reply.metrics, algorithm_->Update(models_, gang_, request.iteration));
    } else {
      STRATA_ASSIGN_OR_RETURN(reply.metrics, Train(request.iteration));
    }
    for (const auto& [key, value] : models_.OptimizerMetrics()) reply.metrics[key] = value;
  }
  // NVMe traffic of the phase (the process's: with in-process ranks, theirs together).
  reply.metrics["nvme/" + measured + "_read_bytes"] = static_cast<double>(
      EngineCounters::Read(counters.nvme_read_bytes) - nvme_read);
  reply.metrics["nvme/" + measured + "_written_bytes"] = static_cast<double>(
      EngineCounters::Read(counters.nvme_written_bytes) - nvme_written);
  if (measured == phases::kUpdate)
    reply.metrics["data/overlong_prompts"] = static_cast<double>(data_->overlong_prompts);
  reply.metrics["time/" + measured + "_s"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  for (const auto& [tier, bytes] : models_.PhaseMemory(measured).peak_bytes) {
    reply.metrics["memory/" + tier + "_peak_bytes"] = static_cast<double>(bytes);
    // Per phase too, for what `strata plan` predicts phase by phase.
    reply.metrics["memory/" + measured + "/" + tier + "_peak_bytes"] = static_cast<double>(bytes);
  }
  // Beside the engine's ledgers, what the kernel counts for this process
  // (peak since it started; with in-process ranks, theirs together).
  reply.metrics["memory/process_rss_peak_bytes"] = static_cast<double>(ProcessResidentBytes().second);
  return reply;
}

absl::StatusOr<policies::Metrics> JobRank::Train(int64_t iteration) {
  const auto rows = ShardOf(iteration, nullptr);
  Metrics m;
  if (spec_.algorithm == Algorithm::kSft) {
    std::vector<policies::TextPair> batch;
    for (size_t i : rows) batch.push_back(data_->sft[i]);
    STRATA_ASSIGN_OR_RETURN(auto stats, models_.TrainSft(batch));
    m["loss/train_avg"] = stats.loss;
  } else {
    std::vector<policies::PreferencePair> batch;
    for (size_t i : rows) batch.push_back(data_->pairs[i]);
    STRATA_ASSIGN_OR_RETURN(auto stats, models_.TrainRewardModel(batch));
    m["loss/train_avg"] = stats.loss;
    m["train/pairwise_accuracy"] = stats.accuracy;
  }
  return m;
}

absl::StatusOr<policies::Metrics> JobRank::Evaluate() {
  Metrics m;
  const size_t world = static_cast<size_t>(gang_.world_size());
  const size_t me = static_cast<size_t>(gang_.rank());
  if (spec_.algorithm == Algorithm::kRewardModel && !data_->eval_pairs.empty()) {
    std::vector<policies::PreferencePair> mine;
    for (size_t i = me; i < data_->eval_pairs.size(); i += world) mine.push_back(data_->eval_pairs[i]);
    double loss = 0, accuracy = 0;
    if (!mine.empty()) {
      STRATA_ASSIGN_OR_RETURN(auto stats, models_.EvaluateRewardModel(mine));
      loss = stats.loss, accuracy = stats.accuracy;
    }
    const double n = static_cast<double>(mine.size());
    AddMeanShare("eval/pairwise_accuracy", accuracy * n, n, m);
    AddMeanShare("eval/loss", loss * n, n, m);
  } else if (evaluates_) {
    // By default the policy is evaluated as it acts: sampled with the job's
    // generation settings (a greedy decode can sit at the rule's maximum
    // while the policy does not), with one fixed seed per prompt so
    // evaluations compare; eval.greedy asks for the argmax decode instead.
    policies::RolloutRequest request;
    std::vector<size_t> which;
    for (size_t i = me; i < data_->eval_prompts.ids.size(); i += world) {
      request.prompts.push_back(data_->eval_prompts.ids[i]);
      which.push_back(i);
    }
    const int64_t k = spec_.eval.samples_per_prompt;
    request.samples_per_prompt = k;
    request.sampling.temperature = spec_.generation.temperature;
    request.sampling.top_p = spec_.generation.top_p;
    request.sampling.top_k = spec_.generation.top_k;
    request.sampling.max_new_tokens = spec_.generation.max_new_tokens;
    request.sampling.greedy = spec_.eval.greedy;
    request.sampling.seed = policies::EvaluationSeed(spec_.train.seed);
    for (size_t i : which) {
      request.sampling.row_seeds.push_back(policies::PromptSeed(request.sampling.seed, static_cast<int64_t>(i)));
    }
    const std::vector<policies::RewardSourceSpec>& sources = eval_rule_ != nullptr ? eval_rule_->specs()
                                                                                   : spec_.reward_sources;
    SourceScores scored;
    std::vector<policies::Rollout> rollouts;
    if (!request.prompts.empty()) {
      STRATA_ASSIGN_OR_RETURN(rollouts, models_.Generate(request));
      for (auto& r : rollouts) {
        if (r.prompt_index < 0 || static_cast<size_t>(r.prompt_index) >= which.size()) {
          return absl::InternalError(
              absl::StrCat("evaluation rollout of prompt ", r.prompt_index, " does not fit the batch"));
        }
        r.example = static_cast<int64_t>(which[static_cast<size_t>(r.prompt_index)]);
      }
      STRATA_ASSIGN_OR_RETURN(auto views, models_.ViewsOf(rollouts, data_->eval_prompts));
      if (eval_rule_ != nullptr) {
        STRATA_ASSIGN_OR_RETURN(scored, eval_rule_->Score(views));
      } else {
        STRATA_ASSIGN_OR_RETURN(scored, models_.ScoreResponses(views));
      }
    }
    double total = 0;
    for (float r : scored.total) total += r;
    AddMeanShare("eval/score", total, static_cast<double>(scored.total.size()), m);
    // A verifier's mean is its accuracy; pass@k counts the prompts with a
    // correct response among their k.
    for (const policies::RewardSourceSpec& source : sources) {
      if (source.kind != "verifier") continue;
      const std::vector<double>& scores = scored.by_source[source.name];
      double correct = 0;
      std::vector<bool> passed(which.size(), false);
      for (size_t i = 0; i < scores.size(); ++i) {
        correct += scores[i];
        if (scores[i] >= 1.0 - 1e-9) passed[static_cast<size_t>(rollouts[i].prompt_index)] = true;
      }
      AddMeanShare("eval/" + source.name + "/accuracy", correct, static_cast<double>(scores.size()), m);
      if (k > 1) {
        AddMeanShare(absl::StrCat("eval/", source.name, "/pass@", k),
                     static_cast<double>(std::count(passed.begin(), passed.end(), true)),
                     static_cast<double>(passed.size()), m);
      }
    }
  }
  return m;
}

absl::StatusOr<PhaseReply> JobRank::FindCheckpoint(const PhaseRequest& request) {
  PhaseReply reply;
  STRATA_ASSIGN_OR_RETURN(auto latest, LatestCheckpoint(spec_.checkpoint.dir));
  const auto& [dir, iteration] = latest;
  if (dir.empty()) {
    // The job store recorded a checkpoint that is not here: starting over
    // would empty the metrics file and overwrite the checkpoints wherever
    // they are.
    if (!request.text.empty()) {
      const std::string continued =
          options_.resumable_run_ids.empty()
              ? std::string()
              : absl::StrCat(" (the job continues job ", options_.resumable_run_ids.front(),
                             ": if the checkpoints in checkpoint.dir were removed, submit the spec as a new job, "
                             "without --continue, to start over)");
      return absl::FailedPreconditionError(absl::StrCat(
          "the job's checkpoint ", request.text, " is not in checkpoint.dir ", spec_.checkpoint.dir,
          " where this rank runs (", std::filesystem::current_path().string(),
          "): it was removed, or this rank does not see the checkpoint.dir the others share; not starting over "
          "from iteration 0",
          continued));
    }
    return reply;
  }
  STRATA_ASSIGN_OR_RETURN(CheckpointState state, ReadCheckpointState(dir, iteration));
  const std::string& owner = state.run_id;
  const bool known_own = owner.empty() && !request.text.empty() && SameFile(dir, request.text);
  const bool continued = std::find(options_.resumable_run_ids.begin(), options_.resumable_run_ids.end(), owner) !=
                         options_.resumable_run_ids.end();
  if (!options_.run_id.empty() && owner != options_.run_id && !known_own && !continued) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint.dir ", spec_.checkpoint.dir, " holds checkpoints of ",
                     owner.empty() ? std::string("an earlier run") : absl::StrCat("job ", owner), " (newest: ", dir,
                     "); give job ", options_.run_id, " its own output.dir, or remove that run's outputs",
                     owner.empty() ? std::string()
                                   : absl::StrCat(", or, if job ", owner,
                                                  " ended FAILED or CANCELLED, continue it from them "
                                                  "(`strata submit --continue ",
                                                  owner, "`)")));
  }
  reply.text = dir;
  reply.metrics["iteration"] = static_cast<double>(iteration);
  reply.metrics["metrics_lines"] = static_cast<double>(state.metrics_lines);
  for (const auto& [key, value] : state.algorithm) reply.metrics["state/" + key] = value;
  return reply;
}

absl::Status JobRank::Start(const PhaseRequest& request) {
  if (!request.text.empty()) {
    STRATA_RETURN_IF_ERROR(models_.LoadCheckpoint(request.text));
  }
  if (gang_.rank() == 0) {
    std::optional<int64_t> resumed_lines;
    if (!request.text.empty()) resumed_lines = static_cast<int64_t>(Param(request.params, "metrics_lines"));
    STRATA_RETURN_IF_ERROR(metrics_.Start(resumed_lines));
  }
  STRATA_RETURN_IF_ERROR(checkpoints_.Start());
  return gang_.Barrier();
}

absl::StatusOr<PhaseReply> JobRank::Commit(const PhaseRequest& request) {
  PhaseReply reply;
  if (gang_.rank() == 0) STRATA_RETURN_IF_ERROR(metrics_.Append(request.text));
  if (Param(request.params, "checkpoint") == 0) return reply;
  CheckpointState state;
  state.metrics_lines = static_cast<int64_t>(Param(request.params, "metrics_lines"));
  state.run_id = options_.run_id;
  for (const auto& [key, value] : request.params) {
    if (key.rfind("state/", 0) == 0) state.algorithm[key.substr(6)] = value;
  }
  CheckpointWriters writers;
  writers.optimizer_states = [&](const std::string& dir) { return models_.SaveOptimizerStates(dir); };
  writers.weights = [&](const std::string& dir) {
    ActAtFailpoint("save_weights", request.iteration);
    return models_.SaveWeights(dir);
  };
  STRATA_ASSIGN_OR_RETURN(reply.text, checkpoints_.Commit(request.iteration + 1, state, writers));
  return reply;
}

}  // namespace strata::services
