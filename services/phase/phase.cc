#include "services/phase/phase.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace strata::services {

using policies::Metrics;

bool PhaseEndsInCollective(const std::string& phase) {
  return phase != phases::kRollout && phase != phases::kFindCheckpoint && phase != phases::kEvaluate &&
         phase != phases::kCommit && phase != phases::kFinish;
}

constexpr char kMeanSumPrefix[] = "mean_sum/";
constexpr char kMeanCountPrefix[] = "mean_count/";

std::string MeanCountKey(const std::string& key) { return kMeanCountPrefix + key; }

void AddMeanShare(const std::string& key, double sum, double count, Metrics& out) {
  out[kMeanSumPrefix + key] = sum;
  out[MeanCountKey(key)] = count;
}

bool IsMeanShare(const std::string& metric) {
  return absl::StartsWith(metric, kMeanSumPrefix) || absl::StartsWith(metric, kMeanCountPrefix);
}

std::string MeanOfSumShare(const std::string& metric) {
  return absl::StartsWith(metric, kMeanSumPrefix) ? metric.substr(sizeof(kMeanSumPrefix) - 1) : "";
}

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

}  // namespace strata::services
