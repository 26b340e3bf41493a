#include "services/cli/report_commands.h"

#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "services/cli/comparison_plot.h"

namespace strata::services {
namespace {

using nlohmann::json;

std::string MiB(double bytes) { return absl::StrFormat("%.1f MiB", bytes / (1 << 20)); }

// Figures a run reports now and then (evaluations: eval/score, each
// verifier's accuracy and pass@k), kept first and last. eval/initial_* only
// repeats the first evaluation of a continued job.
bool IsEvaluation(const std::string& key) { return key.starts_with("eval/") && !key.starts_with("eval/initial_"); }

}  // namespace

absl::StatusOr<std::string> RunCompare(const std::vector<std::string>& run_dirs, bool as_json,
                                       const std::string& plot_path) {
  json all = json::array();
  std::vector<RunCurves> curves;
  for (const auto& dir : run_dirs) {
    RunCurves run;
    run.name = std::filesystem::path(dir).lexically_normal().filename().string();
    if (run.name.empty()) run.name = std::filesystem::path(dir).lexically_normal().parent_path().filename().string();
    const std::string path = JoinPath(dir, "metrics.jsonl");
    STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(path));
    json summary{{"run", dir}, {"iterations", 0}};
    double sums[4] = {0, 0, 0, 0};
    std::map<std::string, double> source_seconds;  // time/score/<source>_s
    const char* times[4] = {"time/iteration_s", "time/rollout_s", "time/score_s", "time/update_s"};
    size_t pos = 0;
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      json line = json::parse(text.substr(pos, nl - pos), nullptr, false);
      pos = nl + 1;
      if (line.is_discarded()) return absl::DataLossError(absl::StrCat(path, ": a line is not JSON"));
      const double iteration = line.value("iteration", summary["iterations"].get<double>());
      if (line.contains("eval/score")) run.eval_score.emplace_back(iteration, line["eval/score"].get<double>());
      if (line.contains("objective/kl")) run.kl.emplace_back(iteration, line["objective/kl"].get<double>());
      summary["iterations"] = summary["iterations"].get<int64_t>() + 1;
      for (int i = 0; i < 4; ++i) sums[i] += line.value(times[i], 0.0);
      for (const char* tier : {"device", "host", "nvme", "process_rss"}) {
        const std::string key = absl::StrCat("memory/", tier, "_peak_bytes");
        summary[key] = std::max(summary.value(key, 0.0), line.value(key, 0.0));
      }
      for (const auto& [key, value] : line.items()) {
        if (!value.is_number()) continue;
        if (IsEvaluation(key)) {
          if (!summary.contains(key + "_first")) summary[key + "_first"] = value;
          summary[key + "_last"] = value;
        } else if (key.starts_with("time/score/")) {
          source_seconds[key] += value.get<double>();
        }
      }
      if (line.contains("objective/kl")) summary["objective/kl_last"] = line["objective/kl"];
    }
    const double n = std::max<double>(1, summary["iterations"].get<double>());
    for (int i = 0; i < 4; ++i) summary[std::string(times[i]) + "_mean"] = sums[i] / n;
    for (const auto& [key, seconds] : source_seconds) summary[key + "_mean"] = seconds / n;
    const char* phases[3] = {"rollout", "score", "update"};  // times[1..3]
    for (int i = 0; i < 3; ++i) run.phase_seconds[phases[i]] = sums[i + 1] / n;
    for (const char* tier : {"device", "host", "nvme"}) {
      run.peak_mib[tier] = summary.value(absl::StrCat("memory/", tier, "_peak_bytes"), 0.0) / (1 << 20);
    }
    all.push_back(summary);
    curves.push_back(std::move(run));
  }
  if (!plot_path.empty()) STRATA_RETURN_IF_ERROR(WriteComparisonPlot(curves, plot_path));
  if (as_json) return all.dump() + "\n";
  std::string out = absl::StrFormat("%-26s", "");
  for (const auto& s : all)
    out += absl::StrFormat("%18s", std::filesystem::path(s["run"].get<std::string>()).filename().string());
  out += "\n";
  auto row = [&](const std::string& label, const std::function<std::string(const json&)>& cell) {
    out += absl::StrFormat("%-26s", label);
    for (const auto& s : all) out += absl::StrFormat("%18s", cell(s));
    out += "\n";
  };
  auto num = [](const json& s, const std::string& key) {
    return s.contains(key) ? absl::StrFormat("%.3f", s[key].get<double>()) : std::string("-");
  };
  // The evaluation figures and reward sources any run has, each once.
  std::set<std::string> evaluations, sources;
  for (const auto& s : all) {
    for (const auto& [key, value] : s.items()) {
      if (IsEvaluation(key) && key.ends_with("_first")) evaluations.insert(key.substr(0, key.size() - 6));
      if (key.starts_with("time/score/")) sources.insert(key.substr(11, key.size() - 11 - 7));  // <name>_s_mean
    }
  }
  row("iterations", [](const json& s) { return std::to_string(s["iterations"].get<int64_t>()); });
  for (const std::string& key : evaluations) {
    const std::string name = key == "eval/score" ? "eval score" : key.substr(5);
    row(name + " (first)", [&](const json& s) { return num(s, key + "_first"); });
    row(name + " (last)", [&](const json& s) { return num(s, key + "_last"); });
  }
  row("KL (last iteration)", [&](const json& s) { return num(s, "objective/kl_last"); });
  row("s / iteration", [&](const json& s) { return num(s, "time/iteration_s_mean"); });
  row("  rollout s", [&](const json& s) { return num(s, "time/rollout_s_mean"); });
  row("  score s", [&](const json& s) { return num(s, "time/score_s_mean"); });
  for (const std::string& source : sources) {
    row("    reward " + source + " s", [&](const json& s) { return num(s, "time/score/" + source + "_s_mean"); });
  }
  row("  update s", [&](const json& s) { return num(s, "time/update_s_mean"); });
  for (const char* tier : {"device", "host", "nvme", "process_rss"}) {
    row(absl::StrCat("peak ", tier == std::string("process_rss") ? "process RSS" : tier),
        [&](const json& s) { return MiB(s.value(absl::StrCat("memory/", tier, "_peak_bytes"), 0.0)); });
  }
  return out;
}

}  // namespace strata::services
