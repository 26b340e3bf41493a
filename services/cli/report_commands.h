// `strata plan SPEC` (model-state memory by tier before anything loads) and
// `strata compare RUN_DIR...` (side-by-side table of finished runs).
#ifndef STRATA_SERVICES_CLI_REPORT_COMMANDS_H_
#define STRATA_SERVICES_CLI_REPORT_COMMANDS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::services {

absl::StatusOr<std::string> RunPlan(const std::vector<std::string>& spec_paths,
                                    const std::vector<std::string>& overrides, bool json);

// Each directory holds a run's metrics.jsonl (its output.dir).
absl::StatusOr<std::string> RunCompare(const std::vector<std::string>& run_dirs, bool json);

}  // namespace strata::services

#endif  // STRATA_SERVICES_CLI_REPORT_COMMANDS_H_
