#include "services/driver/job_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "policies/job/loop_state.h"

namespace strata::services {
namespace {

using nlohmann::json;
using policies::Algorithm;
using policies::Metrics;

void Progress(const JobRunOptions& o, int64_t it, int64_t total, const json& m) {
  if (o.progress == nullptr) return;
  auto get = [&](const char* key) { return m.contains(key) && m[key].is_number() ? m[key].get<double>() : NAN; };
  std::string detail;
  for (auto [label, key] :
       {std::pair{"reward", "objective/scores"}, std::pair{"kl", "objective/kl"}, std::pair{"loss", "loss/train_avg"},
        std::pair{"acc", "eval/pairwise_accuracy"}, std::pair{"eval", "eval/score"}}) {
    const double v = get(key);
    if (!std::isnan(v)) detail += absl::StrFormat(" %s %.3f", label, v);
  }
  const double seconds = get("time/iteration_s");
  if (o.progress_bar) {
    const int width = 24;
    const int filled = static_cast<int>(width * (it + 1) / std::max<int64_t>(total, 1));
    // \033[K clears what a longer previous line left behind.
    std::fprintf(o.progress, "\r\033[K[%s%s] %lld/%lld%s %.2f s/it",
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), '.').c_str(), static_cast<long long>(it + 1),
                 static_cast<long long>(total), detail.c_str(), seconds);
    if (it + 1 == total) std::fprintf(o.progress, "\n");
  } else {
    std::fprintf(o.progress, "iteration %lld/%lld%s %.2f s/it\n", static_cast<long long>(it + 1),
                 static_cast<long long>(total), detail.c_str(), seconds);
  }
  std::fflush(o.progress);
}

// Adds a phase's metrics to the iteration's line: memory peaks are the
// largest of the iteration's phases, everything else is the phase's own.
void AddPhase(const Metrics& phase, json& line) {
  for (const auto& [key, value] : phase) {
    if (key.rfind("memory/", 0) == 0 && line.contains(key)) {
      line[key] = std::max(line[key].get<double>(), value);
    } else {
      line[key] = value;
    }
  }
}

Metrics LineMetrics(const json& line) {
  Metrics m;
  for (const auto& [key, value] : line.items()) {
    if (value.is_number()) m[key] = value.get<double>();
  }
  return m;
}

}  // namespace

absl::Status FirstCause(const std::vector<absl::Status>& statuses, bool ranks_share_a_process) {
  absl::Status consequence, deadline;
  for (const absl::Status& s : statuses) {
    if (s.ok()) continue;
    const bool knock_on = s.code() == absl::StatusCode::kDeadlineExceeded || s.code() == absl::StatusCode::kUnavailable;
    if (!knock_on) return s;
    if (consequence.ok()) consequence = s;
    if (deadline.ok() && s.code() == absl::StatusCode::kDeadlineExceeded) deadline = s;
  }
  return ranks_share_a_process && !deadline.ok() ? deadline : consequence;
}

absl::Status RunJob(const policies::JobSpec& spec, Gang& gang, const JobRunOptions& options) {
  const bool rl = spec.algorithm != Algorithm::kSft && spec.algorithm != Algorithm::kRewardModel;
  policies::RlController controller(spec);
  auto run = [&](const std::string& phase, int64_t iteration, Metrics params = {},
                 std::string text = "") -> absl::StatusOr<PhaseReply> {
    if (options.cancelled && options.cancelled()) return absl::CancelledError("job cancelled");
    return gang.Run(PhaseRequest{phase, iteration, std::move(params), std::move(text)});
  };

  // Resume.
  int64_t start = 0;
  int64_t metrics_lines = 0;
  std::string resume_dir;
  if (options.resume) {
    STRATA_ASSIGN_OR_RETURN(auto found, run(phases::kFindCheckpoint, 0, {}, options.own_checkpoint));
    if (!found.text.empty()) {
      resume_dir = found.text;
      start = static_cast<int64_t>(found.metrics["iteration"]);
      metrics_lines = static_cast<int64_t>(found.metrics["metrics_lines"]);
      Metrics state;
      for (const auto& [key, value] : found.metrics) {
        if (key.rfind("state/", 0) == 0) state[key.substr(6)] = value;
      }
      controller.Restore(state);
      if (options.progress) {
        std::fprintf(options.progress, "resuming from %s (iteration %lld)\n", resume_dir.c_str(),
                     static_cast<long long>(start));
      }
    }
  }
  STRATA_RETURN_IF_ERROR(
      run(phases::kStart, start, {{"metrics_lines", static_cast<double>(metrics_lines)}}, resume_dir).status());

  for (int64_t it = start; it < spec.train.iterations; ++it) {
    json line;
    line["iteration"] = it;
    // The first line carries the starting policy's evaluation.
    if (it == 0 && spec.eval.every > 0) {
      STRATA_ASSIGN_OR_RETURN(auto initial, run(phases::kEvaluate, it));
      for (const auto& [key, value] : initial.metrics) {
        line[key] = value;
        if (key.rfind("eval/", 0) == 0) line["eval/initial_" + key.substr(5)] = value;
      }
    }
    const auto started = std::chrono::steady_clock::now();
    if (rl) {
      STRATA_ASSIGN_OR_RETURN(auto rollout, run(phases::kRollout, it));
      AddPhase(rollout.metrics, line);
      STRATA_ASSIGN_OR_RETURN(auto score, run(phases::kScore, it, controller.ScoreParams()));
      AddPhase(score.metrics, line);
      STRATA_ASSIGN_OR_RETURN(auto update, run(phases::kUpdate, it));
      AddPhase(update.metrics, line);
    } else {
      STRATA_ASSIGN_OR_RETURN(auto train, run(phases::kTrain, it));
      AddPhase(train.metrics, line);
    }
    line["time/iteration_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    controller.Observe(LineMetrics(line));
    const bool last = it + 1 == spec.train.iterations;
    if (spec.eval.every > 0 && ((it + 1) % spec.eval.every == 0 || last)) {
      STRATA_ASSIGN_OR_RETURN(auto eval, run(phases::kEvaluate, it));
      for (const auto& [key, value] : eval.metrics) line[key] = value;
    }
    const bool checkpoint = spec.checkpoint.every > 0 && (it + 1) % spec.checkpoint.every == 0 && !last;
    Metrics commit = {{"checkpoint", checkpoint ? 1.0 : 0.0},
                      {"metrics_lines", static_cast<double>(metrics_lines + 1)}};
    for (const auto& [key, value] : controller.State()) commit["state/" + key] = value;
    STRATA_ASSIGN_OR_RETURN(auto committed, run(phases::kCommit, it, commit, line.dump()));
    ++metrics_lines;
    if (options.on_metrics) options.on_metrics(line);
    if ((it + 1) % spec.train.log_every == 0 || last) Progress(options, it, spec.train.iterations, line);
    if (checkpoint && options.on_checkpoint) options.on_checkpoint(it + 1, committed.text);
  }
  return run(phases::kFinish, spec.train.iterations).status();
}

}  // namespace strata::services
