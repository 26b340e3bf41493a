// `strata plan SPEC...`: what a job needs per tier and phase and how long an
// iteration takes under its placement; with --fit, the fastest placement
// that fits given hardware (policies/job/memory_plan.h).
#ifndef STRATA_SERVICES_CLI_PLAN_COMMAND_H_
#define STRATA_SERVICES_CLI_PLAN_COMMAND_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::services {

struct PlanOptions {
  std::vector<std::string> specs;
  std::vector<std::string> overrides;  // key.path=value
  bool json = false;
  // "device=80GiB,host=128GiB,nvme=2TiB" (or device=cpu): search placements.
  std::string fit;
  int64_t workers = 0;  // 0: the spec's parallel.workers
  // `strata bench figures` output; "" finds $STRATA_FIGURES or
  // ~/.cache/strata/figures.json, else the built-in figures.
  std::string figures;
  // With --fit: write the spec with the chosen placement here (one spec only).
  std::string write;
  // With --fit: keep train.micro_batch_size as the spec says (placements only).
  bool fixed_micro_batch = false;
  // With --fit: keep each trained model's placement.activations.
  bool fixed_activations = false;
};

absl::StatusOr<std::string> RunPlan(const PlanOptions& options);

// The figures file `strata plan` reads when none is named.
std::string DefaultFiguresPath();

}  // namespace strata::services

#endif  // STRATA_SERVICES_CLI_PLAN_COMMAND_H_
