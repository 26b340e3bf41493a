#include "tests/soak/invariants.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/file.h"
#include "services/driver/job_runner.h"
#include "tests/e2e/run_metrics.h"

namespace strata::soak {
namespace {

using nlohmann::json;

// The metrics file's lines as JSON; a line that is not JSON is a violation.
std::vector<json> ReadLines(const std::string& path, std::vector<Violation>* violations) {
  std::vector<json> lines;
  std::ifstream in(path);
  if (!in) return lines;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      violations->push_back({"corrupt metrics", absl::StrCat(path, ": line ", number, " is not a JSON object")});
      continue;
    }
    lines.push_back(std::move(j));
  }
  return lines;
}

}  // namespace

bool IsTerminal(const std::string& state) { return state == "SUCCEEDED" || state == "FAILED" || state == "CANCELLED"; }

std::vector<Violation> CheckNoJobLostOrStuck(const std::vector<std::string>& acknowledged,
                                             const std::map<std::string, JobOutcome>& listed) {
  std::vector<Violation> out;
  for (const std::string& id : acknowledged) {
    auto it = listed.find(id);
    if (it == listed.end()) {
      out.push_back({"lost job", absl::StrCat(id, ": acknowledged at submit, unknown to the coordinator now")});
    } else if (!IsTerminal(it->second.state) && !it->second.progressing) {
      out.push_back({"stuck job", absl::StrCat(id, ": ", it->second.state, " at iteration ", it->second.iteration,
                                               " of ", it->second.iterations, " and not moving")});
    }
  }
  return out;
}

std::vector<Violation> CheckMetricsOnce(const std::string& path, int64_t complete_iterations) {
  std::vector<Violation> out;
  const std::vector<json> lines = ReadLines(path, &out);
  for (size_t i = 0; i < lines.size(); ++i) {
    const json& line = lines[i];
    if (!line.contains("iteration") || !line["iteration"].is_number_integer()) {
      out.push_back({"corrupt metrics", absl::StrCat(path, ": line ", i + 1, " has no integer iteration")});
      continue;
    }
    const int64_t iteration = line["iteration"].get<int64_t>();
    if (iteration != static_cast<int64_t>(i)) {
      const bool seen = std::any_of(lines.begin(), lines.begin() + static_cast<std::ptrdiff_t>(i), [&](const json& l) {
        return l.contains("iteration") && l["iteration"] == iteration;
      });
      out.push_back({seen ? "duplicated iteration" : "missing iteration",
                     absl::StrCat(path, ": line ", i + 1, " is iteration ", iteration, ", expected ", i)});
      return out;  // one finding per file: the lines after it are all shifted
    }
  }
  if (complete_iterations >= 0 && static_cast<int64_t>(lines.size()) != complete_iterations) {
    out.push_back({"missing iteration", absl::StrCat(path, ": ", lines.size(), " iterations for a job that completed ",
                                                     complete_iterations)});
  }
  return out;
}

std::vector<Violation> CheckSameMetrics(const std::string& reference_path, const std::string& path,
                                        const std::string& job_id, int sequences, int ppo_epochs) {
  std::vector<Violation> out;
  std::vector<json> want = ReadLines(reference_path, &out), got = ReadLines(path, &out);
  if (want.empty()) {
    out.push_back({"no reference", absl::StrCat(job_id, ": the fault-free run wrote no metrics at ", reference_path)});
    return out;
  }
  if (want.size() != got.size()) {
    out.push_back({"metrics diverge",
                   absl::StrCat(job_id, ": ", got.size(), " iterations against the fault-free run's ", want.size())});
    return out;
  }
  const testing::CountedTokens counted{.sequences = sequences, .ppo_epochs = ppo_epochs};
  for (size_t i = 0; i < want.size(); ++i) {
    for (const auto& [key, value] : want[i].items()) {
      if (services::IsRankMeasurement(key) || !value.is_number()) continue;
      if (!got[i].contains(key) || !got[i][key].is_number()) {
        out.push_back({"metrics diverge", absl::StrCat(job_id, ": iteration ", i, " lacks ", key)});
        continue;
      }
      const double a = value.get<double>(), b = got[i][key].get<double>();
      double tolerance = testing::AfterAStep(i, key) ? testing::SteppedWeightsTolerance(a)
                                                     : testing::StartingWeightsTolerance(a);
      if (testing::IsClipFraction(key)) {
        tolerance = testing::ClipFractionTolerance(counted, want[i].value("objective/response_tokens", 1.0));
      }
      if (!(std::abs(a - b) <= tolerance)) {
        out.push_back(
            {"metrics diverge", absl::StrCat(job_id, ": iteration ", i, " ", key, " ", b,
                                             " against the fault-free run's ", a, " (tolerance ", tolerance, ")")});
      }
    }
  }
  return out;
}

std::vector<Violation> CheckFailedSaysWhy(const JobOutcome& job) {
  if (job.state != "FAILED") return {};
  // A user acts on a sentence that names something: at least a few words.
  const std::string& m = job.error_message;
  const auto words = std::count(m.begin(), m.end(), ' ');
  if (m.empty() || words < 3) {
    return {{"failure without a reason", absl::StrCat(job.id, ": FAILED with \"", m, "\"")}};
  }
  return {};
}

std::vector<Violation> CheckCheckpoints(const std::string& checkpoint_dir, const std::set<std::string>& run_ids) {
  std::vector<Violation> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoint_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!absl::StartsWith(name, "iter-")) continue;
    if (absl::StrContains(name, ".tmp")) {
      out.push_back({"leftover checkpoint", absl::StrCat(entry.path().string(), ": unfinished, and no job runs")});
      continue;
    }
    int64_t iteration = 0;
    if (!absl::SimpleAtoi(name.substr(5), &iteration)) continue;
    auto text = ReadFileToString(JoinPath(entry.path().string(), "state.json"));
    if (!text.ok()) continue;  // not committed (a state.json comes last)
    const json state = json::parse(*text, nullptr, false);
    if (state.is_discarded() || !state.is_object()) {
      out.push_back({"corrupt checkpoint", entry.path().string() + "/state.json is not JSON"});
      continue;
    }
    const int64_t lines = state.value("metrics_lines", int64_t{-1});
    if (lines != iteration) {
      out.push_back({"checkpoint out of step", absl::StrCat(entry.path().string(), ": follows ", lines,
                                                            " metrics lines after ", iteration, " iterations")});
    }
    const std::string run_id = state.value("run_id", std::string());
    if (!run_ids.contains(run_id)) {
      out.push_back(
          {"checkpoint of another run", absl::StrCat(entry.path().string(), ": written by run \"", run_id,
                                                     "\", not by this job (", absl::StrJoin(run_ids, ", "), ")")});
    }
  }
  return out;
}

std::vector<Violation> CheckNvmeDirectoryEmpty(const std::string& dir, const std::set<std::string>& ignored) {
  std::vector<Violation> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (ignored.contains(name) || name == "lost+found") continue;
    out.push_back({"leftover NVMe data", absl::StrCat(entry.path().string(), ": still there after every job ended")});
  }
  return out;
}

std::vector<Violation> CheckRedisKeys(const std::string& prefix, const std::vector<std::string>& keys,
                                      const std::map<std::string, JobOutcome>& jobs,
                                      const std::map<std::string, std::vector<std::string>>& state_members,
                                      const std::vector<std::string>& request_targets) {
  std::vector<Violation> out;
  const std::set<std::string> store_keys = {"jobs", "jobs:seq", "workers"};
  for (const std::string& key : keys) {
    if (!absl::StartsWith(key, prefix)) continue;
    const std::string rest = key.substr(prefix.size());
    if (store_keys.contains(rest) || absl::StartsWith(rest, "jobs:state:") || absl::StartsWith(rest, "worker:") ||
        absl::StartsWith(rest, "request:")) {
      continue;
    }
    if (absl::StartsWith(rest, "job:")) {
      std::string id = rest.substr(4);
      id = id.substr(0, id.find(':'));
      if (!jobs.contains(id)) out.push_back({"orphan Redis key", absl::StrCat(key, ": no job ", id, " is listed")});
      continue;
    }
    out.push_back({"orphan Redis key", absl::StrCat(key, ": not a key the job store makes")});
  }
  for (const std::string& target : request_targets) {
    if (!jobs.contains(target)) {
      out.push_back({"orphan Redis key", absl::StrCat("a request id points at job ", target, ", which is not listed")});
    }
  }
  std::map<std::string, int> sets_of;
  for (const auto& [state, members] : state_members) {
    for (const std::string& id : members) {
      ++sets_of[id];
      auto it = jobs.find(id);
      if (it == jobs.end()) {
        out.push_back({"orphan Redis key", absl::StrCat(prefix, "jobs:state:", state, " holds unknown job ", id)});
      } else if (it->second.state != state) {
        out.push_back({"state sets disagree",
                       absl::StrCat(id, " is ", it->second.state, " but sits in ", prefix, "jobs:state:", state)});
      }
    }
  }
  for (const auto& [id, job] : jobs) {
    if (sets_of[id] != 1) {
      out.push_back({"state sets disagree", absl::StrCat(id, " sits in ", sets_of[id], " state sets, not 1")});
    }
  }
  return out;
}

std::vector<Violation> CheckNoStrayProcesses(const std::string& marker, const std::vector<int>& live) {
  std::vector<Violation> out;
  std::error_code ec;
  // This process and those that started it (a shell, timeout) name the
  // directory too.
  std::set<int> ancestors;
  for (int pid = ::getpid(); pid > 1 && ancestors.insert(pid).second;) {
    auto status = ReadFileToString(absl::StrCat("/proc/", pid, "/status"));
    const size_t at = status.ok() ? status->find("PPid:") : std::string::npos;
    if (at == std::string::npos ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(status->substr(at + 5, status->find('\n', at) - at - 5)), &pid))
      break;
  }
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid) || ancestors.contains(pid)) continue;
    auto cmdline = ReadFileToString(entry.path().string() + "/cmdline");
    if (!cmdline.ok() || cmdline->empty()) continue;  // gone, or a zombie
    std::replace(cmdline->begin(), cmdline->end(), '\0', ' ');
    if (!absl::StrContains(*cmdline, marker)) continue;
    if (std::find(live.begin(), live.end(), pid) != live.end()) continue;
    out.push_back({"stray process", absl::StrCat("pid ", pid, ": ", cmdline->substr(0, 200))});
  }
  return out;
}

}  // namespace strata::soak
