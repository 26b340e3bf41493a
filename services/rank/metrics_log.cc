#include "services/rank/metrics_log.h"

#include <chrono>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"

namespace strata::services {
namespace {

using nlohmann::json;

// A metrics line's numbers as one TensorBoard event at its iteration.
absl::Status WriteCurves(TensorBoardWriter& writer, const std::string& line) {
  const json metrics = json::parse(line, nullptr, false);
  if (!metrics.is_object()) return absl::OkStatus();  // not a metrics line: nothing to plot
  std::map<std::string, double> scalars;
  int64_t step = 0;
  for (const auto& [key, value] : metrics.items()) {
    if (!value.is_number()) continue;
    if (key == "iteration") {
      step = value.get<int64_t>();
    } else {
      scalars[key] = value.get<double>();
    }
  }
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return writer.WriteScalars(step, scalars, now);
}

// Keeps the first `lines` lines of the metrics file (a resumed run rewrites
// what came after its checkpoint).
absl::Status TruncateLines(const std::string& path, int64_t lines) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return text.status().code() == absl::StatusCode::kNotFound ? absl::OkStatus() : text.status();
  size_t pos = 0;
  for (int64_t i = 0; i < lines; ++i) {
    const size_t nl = text->find('\n', pos);
    if (nl == std::string::npos || json::parse(text->substr(pos, nl - pos), nullptr, false).is_discarded()) {
      return absl::DataLossError(absl::StrCat("metrics file ", path, ": line ", i + 1,
                                              nl == std::string::npos ? " is missing or cut short" : " is not JSON",
                                              "; the checkpoint resumed from follows ", lines,
                                              " lines (remove the output directory to start over)"));
    }
    pos = nl + 1;
  }
  return WriteFileAtomically(path, text->substr(0, pos));
}

}  // namespace

MetricsLog::MetricsLog(const std::string& output_dir, const std::string& metrics_path)
    : path_(metrics_path.empty() ? JoinPath(output_dir, "metrics.jsonl") : metrics_path),
      tensorboard_dir_(JoinPath(output_dir, "tensorboard")) {}

MetricsLog::~MetricsLog() = default;

absl::Status MetricsLog::Start(std::optional<int64_t> resumed_lines) {
  if (!resumed_lines.has_value()) {
    STRATA_RETURN_IF_ERROR(WriteFileAtomically(path_, ""));
  } else {
    STRATA_RETURN_IF_ERROR(TruncateLines(path_, *resumed_lines));
  }
  STRATA_ASSIGN_OR_RETURN(tensorboard_,
                          TensorBoardWriter::Open(tensorboard_dir_, /*fresh=*/!resumed_lines.has_value()));
  return absl::OkStatus();
}

absl::Status MetricsLog::Append(const std::string& line) {
  absl::Status appended = AppendDurably(path_, line + "\n");
  if (!appended.ok()) {
    return absl::Status(appended.code(), absl::StrCat("metrics file: ", appended.message()));
  }
  if (tensorboard_ != nullptr) STRATA_RETURN_IF_ERROR(WriteCurves(*tensorboard_, line));
  return absl::OkStatus();
}

}  // namespace strata::services
