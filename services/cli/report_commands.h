// `strata compare RUN_DIR... [--plot FILE]` (side-by-side table and picture of
// finished runs).
#ifndef STRATA_SERVICES_CLI_REPORT_COMMANDS_H_
#define STRATA_SERVICES_CLI_REPORT_COMMANDS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::services {

// Each directory holds a run's metrics.jsonl (its output.dir). A non-empty
// `plot_path` also draws the comparison there (comparison_plot.h).
absl::StatusOr<std::string> RunCompare(const std::vector<std::string>& run_dirs, bool json,
                                       const std::string& plot_path = "");

}  // namespace strata::services

#endif  // STRATA_SERVICES_CLI_REPORT_COMMANDS_H_
