// Running a helper program (fio, reference tools) and capturing its output.
#ifndef STRATA_BASE_SUBPROCESS_H_
#define STRATA_BASE_SUBPROCESS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

struct ProcessResult {
  int exit_code = -1;  // 128 + signal when killed
  std::string output;  // stdout
  std::string error;   // stderr
};

// Runs `argv` (looked up on PATH, no shell) and waits for it. stderr goes
// through a file in `scratch_dir` (removed afterwards) so that a chatty child
// cannot block on a full pipe while stdout is drained. Fails only when the
// program could not be started.
absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv, const std::string& scratch_dir);

}  // namespace strata

#endif  // STRATA_BASE_SUBPROCESS_H_
