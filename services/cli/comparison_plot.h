// The picture behind `strata compare --plot FILE`: eval score and KL per
// iteration as curves, mean time per phase and peak memory per tier as bars,
// one colour per run. Drawn with cairo; FILE ending in .svg gives SVG,
// anything else PNG.
#ifndef STRATA_SERVICES_CLI_COMPARISON_PLOT_H_
#define STRATA_SERVICES_CLI_COMPARISON_PLOT_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace strata::services {

struct RunCurves {
  std::string name;                                   // the run directory's last component
  std::vector<std::pair<double, double>> eval_score;  // (iteration, score)
  std::vector<std::pair<double, double>> kl;          // (iteration, objective/kl)
  std::map<std::string, double> phase_seconds;        // "rollout" -> mean s per iteration
  std::map<std::string, double> peak_mib;             // "device" -> peak MiB over the run
};

absl::Status WriteComparisonPlot(const std::vector<RunCurves>& runs, const std::string& path);

}  // namespace strata::services

#endif  // STRATA_SERVICES_CLI_COMPARISON_PLOT_H_
