#include "tests/testutil/testutil.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "base/subprocess.h"
#include "gtest/gtest.h"

namespace strata::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string templ = absl::StrCat(base && *base ? base : "/tmp", "/strata_test_XXXXXX");
  char* made = ::mkdtemp(templ.data());
  if (made == nullptr) {
    ADD_FAILURE() << "mkdtemp " << templ << " failed";
  }
  path_ = templ;
}

TempDir::~TempDir() { RemoveTree(path_); }

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv) {
  TempDir scratch;
  STRATA_ASSIGN_OR_RETURN(auto run, RunProcess(argv, scratch.path()));
  return CommandResult{run.exit_code, std::move(run.output), std::move(run.error)};
}

bool HaveProgram(const std::string& program) {
  if (!program.empty() && program[0] == '/') return ::access(program.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::string_view rest(path);
  while (!rest.empty()) {
    const size_t colon = rest.find(':');
    const std::string dir(rest.substr(0, colon));
    if (::access(JoinPath(dir, program).c_str(), X_OK) == 0) return true;
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return false;
}

std::string ReferencePython() {
  const char* python = std::getenv("STRATA_REFERENCE_PYTHON");
  return python != nullptr && python[0] != '\0' ? python : "/usr/bin/python3";
}

std::string StrataBinary() { return JoinPath(STRATA_BINARY_DIR, "strata"); }

std::string SourcePath(const std::string& relative) { return JoinPath(STRATA_SOURCE_DIR, relative); }

const std::string& TinyConfigDir() {
  static const TempDir* dir = [] {
    auto* d = new TempDir();
    std::filesystem::copy_file(SourcePath("examples/tiny/model.json"), d->Join("config.json"));
    return d;
  }();
  return dir->path();
}

void WriteTextFile(const std::string& path, const std::string& contents) {
  const absl::Status status = WriteFileAtomically(path, contents);
  ASSERT_TRUE(status.ok()) << status;
}

}  // namespace strata::testing
