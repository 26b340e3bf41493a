// `strata bench figures`: what this machine does per second, written as the
// figures file `strata plan` turns into phase times (policies/job/
// hardware_figures.h). Each figure comes from a measurement in this run:
// matrix products per dtype over a grid of shapes, one small op's fixed
// cost, memory copies, the NVMe store (with fio as its peer, `bench io`),
// CPU AdamW (with torch's AdamW as its peer, `bench adam`; torch's rate is
// also the device optimizer's on a CPU device), the 2-rank gradient sum
// (`bench allreduce`), and the resident bytes of the process itself.
#ifndef STRATA_BENCH_FIGURES_BENCH_H_
#define STRATA_BENCH_FIGURES_BENCH_H_

#include <string>

#include "absl/status/statusor.h"

namespace strata::bench {

struct FiguresBenchRequest {
  std::string nvme_dir;  // an existing directory on the NVMe tier's disk
  std::string out;       // the figures file to write ("" prints it only)
  std::string machine;   // free text recorded in the file
  bool quick = false;    // smaller grid and sizes (tests)
};

// Returns a summary table; writes the JSON figures to `out`.
absl::StatusOr<std::string> RunFiguresBench(const FiguresBenchRequest& request);

}  // namespace strata::bench

#endif  // STRATA_BENCH_FIGURES_BENCH_H_
