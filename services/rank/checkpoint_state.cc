#include "services/rank/checkpoint_state.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace strata::services {

using nlohmann::json;

absl::StatusOr<CheckpointState> ParseCheckpointState(const std::string& text, const std::string& dir,
                                                     int64_t iteration) {
  json state = json::parse(text, nullptr, false);
  if (state.is_discarded() || !state.is_object() || !state.contains("metrics_lines") ||
      !state["metrics_lines"].is_number_integer()) {
    return absl::DataLossError(absl::StrCat(dir, "/state.json is corrupt"));
  }
  CheckpointState out;
  out.metrics_lines = state["metrics_lines"].get<int64_t>();
  // One metrics line per completed iteration, and the directory's name says
  // how many completed: anything else is a damaged or forged file.
  if (out.metrics_lines < 0 || out.metrics_lines > iteration) {
    return absl::DataLossError(absl::StrCat(dir, "/state.json: metrics_lines ", out.metrics_lines,
                                            " does not fit iteration ", iteration, " (expected 0..", iteration, ")"));
  }
  if (state.contains("iteration") &&
      (!state["iteration"].is_number_integer() || state["iteration"].get<int64_t>() != iteration)) {
    return absl::DataLossError(absl::StrCat(dir, "/state.json: iteration ", state["iteration"].dump(),
                                            " differs from the directory's ", iteration));
  }
  if (state.contains("run_id")) {
    if (!state["run_id"].is_string())
      return absl::DataLossError(absl::StrCat(dir, "/state.json: run_id is not a string"));
    out.run_id = state["run_id"].get<std::string>();
  }
  if (state.contains("algorithm") && state["algorithm"].is_object()) {
    for (const auto& [key, value] : state["algorithm"].items()) {
      if (!value.is_number()) return absl::DataLossError(absl::StrCat(dir, "/state.json: algorithm.", key));
      out.algorithm[key] = value.get<double>();
    }
  }
  return out;
}

std::string SerializeCheckpointState(const CheckpointState& state, int64_t iteration, int world_size) {
  json algorithm = json::object();
  for (const auto& [key, value] : state.algorithm) algorithm[key] = value;
  const json out{{"iteration", iteration},
                 {"metrics_lines", state.metrics_lines},
                 {"run_id", state.run_id},
                 {"world_size", world_size},
                 {"algorithm", algorithm}};
  return out.dump();
}

}  // namespace strata::services
