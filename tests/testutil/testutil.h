// Helpers shared by all test binaries: temporary directories, running
// reference tools, locating the source tree.
#ifndef STRATA_TESTS_TESTUTIL_TESTUTIL_H_
#define STRATA_TESTS_TESTUTIL_TESTUTIL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents when
// the object is destroyed.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Result of a finished child process.
struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout
  std::string error;   // stderr
};

// Runs `argv` (no shell), waits for it, and captures stdout and stderr.
// Fails only if the process could not be started.
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv);

// True when `program` is an executable found on PATH or an absolute path.
bool HaveProgram(const std::string& program);

// Path of the built `strata` binary.
std::string StrataBinary();

// The Python that reference scripts run under (torch, numpy): Debian's
// /usr/bin/python3 (python3-torch), or $STRATA_REFERENCE_PYTHON where the
// machine keeps them elsewhere (the GPU machine's /opt/torch/.venv).
std::string ReferencePython();

// Absolute path of a file in the source tree, e.g. SourcePath("tests/policies/x.py").
std::string SourcePath(const std::string& relative);

// A model directory whose only file is examples/tiny/model.json as its
// config.json: what the memory planner reads of a model. Made once per
// process.
const std::string& TinyConfigDir();

// Writes `contents` to `path`, failing the current test on error.
void WriteTextFile(const std::string& path, const std::string& contents);

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTUTIL_TESTUTIL_H_
