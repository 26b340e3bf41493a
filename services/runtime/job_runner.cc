#include "services/runtime/job_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "policies/rl/rl_algorithms.h"

namespace strata::services {
namespace {

using nlohmann::json;
using policies::Algorithm;
using policies::Metrics;

void Progress(const JobRunOptions& o, int64_t it, int64_t total, const json& m) {
  if (o.progress == nullptr) return;
  auto get = [&](const char* key) { return m.contains(key) && m[key].is_number() ? m[key].get<double>() : NAN; };
  std::string detail;
  for (auto [label, key] : {std::pair{"reward", "objective/scores"}, std::pair{"kl", "objective/kl"},
                            std::pair{"loss", "loss/train_avg"}, std::pair{"acc", "eval/pairwise_accuracy"},
                            std::pair{"eval", "eval/score"}}) {
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

bool IsRankMeasurement(const std::string& metric) {
  return metric.rfind("time/", 0) == 0 || metric.rfind("memory/", 0) == 0 || metric.rfind("nvme/", 0) == 0;
}

absl::StatusOr<PhaseReply> MergeReplies(const std::vector<PhaseReply>& replies) {
  if (replies.empty()) return absl::InternalError("a phase ended with no replies");
  PhaseReply merged = replies[0];
  for (size_t r = 1; r < replies.size(); ++r) {
    for (const auto& [key, value] : replies[r].metrics) {
      if (!IsRankMeasurement(key)) continue;
      auto it = merged.metrics.find(key);
      if (it == merged.metrics.end() || value > it->second) merged.metrics[key] = value;
    }
  }
  // Mean shares: every rank must report the ones rank 0 does, and no other.
  std::erase_if(merged.metrics, [](const auto& kv) { return IsMeanShare(kv.first); });
  for (size_t r = 0; r < replies.size(); ++r) {
    for (const auto& [key, value] : replies[r].metrics) {
      if (IsMeanShare(key) && !replies[0].metrics.contains(key)) {
        return absl::InternalError(absl::StrCat("rank ", r, ": malformed reply: ", key, " which rank 0 lacks"));
      }
    }
  }
  for (const auto& [key, value] : replies[0].metrics) {
    const std::string mean = MeanOfSumShare(key);
    if (mean.empty()) continue;
    const std::string count_key = MeanCountKey(mean);
    double sum = 0, count = 0;
    for (size_t r = 0; r < replies.size(); ++r) {
      const auto s = replies[r].metrics.find(key), c = replies[r].metrics.find(count_key);
      if (s == replies[r].metrics.end() || c == replies[r].metrics.end()) {
        return absl::InternalError(absl::StrCat("rank ", r, ": malformed reply: ",
                                                s == replies[r].metrics.end() ? key : count_key, " is missing"));
      }
      if (!(c->second >= 0)) {
        return absl::InternalError(absl::StrCat("rank ", r, ": malformed reply: ", count_key, " = ", c->second));
      }
      sum += s->second;
      count += c->second;
    }
    // As a collective's sum would: a gang that counted nothing reports 0.
    merged.metrics[mean] = sum / std::max(count, 1e-30);
  }
  return merged;
}

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
    STRATA_ASSIGN_OR_RETURN(auto found, run("find_checkpoint", 0, {}, options.own_checkpoint));
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
  STRATA_RETURN_IF_ERROR(run("start", start, {{"metrics_lines", static_cast<double>(metrics_lines)}}, resume_dir)
                             .status());

  for (int64_t it = start; it < spec.train.iterations; ++it) {
    json line;
    line["iteration"] = it;
    // The first line carries the starting policy's evaluation.
    if (it == 0 && spec.eval.every > 0) {
      STRATA_ASSIGN_OR_RETURN(auto initial, run("evaluate", it));
      for (const auto& [key, value] : initial.metrics) {
        line[key] = value;
        if (key.rfind("eval/", 0) == 0) line["eval/initial_" + key.substr(5)] = value;
      }
    }
    const auto started = std::chrono::steady_clock::now();
    if (rl) {
      STRATA_ASSIGN_OR_RETURN(auto rollout, run("rollout", it));
      AddPhase(rollout.metrics, line);
      STRATA_ASSIGN_OR_RETURN(auto score, run("score", it, controller.ScoreParams()));
      AddPhase(score.metrics, line);
      STRATA_ASSIGN_OR_RETURN(auto update, run("update", it));
      AddPhase(update.metrics, line);
    } else {
      STRATA_ASSIGN_OR_RETURN(auto train, run("train", it));
      AddPhase(train.metrics, line);
    }
    line["time/iteration_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    controller.Observe(LineMetrics(line));
    const bool last = it + 1 == spec.train.iterations;
    if (spec.eval.every > 0 && ((it + 1) % spec.eval.every == 0 || last)) {
      STRATA_ASSIGN_OR_RETURN(auto eval, run("evaluate", it));
      for (const auto& [key, value] : eval.metrics) line[key] = value;
    }
    const bool checkpoint = spec.checkpoint.every > 0 && (it + 1) % spec.checkpoint.every == 0 && !last;
    Metrics commit = {{"checkpoint", checkpoint ? 1.0 : 0.0},
                      {"metrics_lines", static_cast<double>(metrics_lines + 1)}};
    for (const auto& [key, value] : controller.State()) commit["state/" + key] = value;
    STRATA_ASSIGN_OR_RETURN(auto committed, run("commit", it, commit, line.dump()));
    ++metrics_lines;
    if (options.on_metrics) options.on_metrics(line);
    if ((it + 1) % spec.train.log_every == 0 || last) Progress(options, it, spec.train.iterations, line);
    if (checkpoint && options.on_checkpoint) options.on_checkpoint(it + 1, committed.text);
  }
  return run("finish", spec.train.iterations).status();
}

}  // namespace strata::services
