#include "tests/testutil/testutil.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "offload/file.h"

extern char** environ;

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

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv) {
  // stderr goes to a file so that a chatty child cannot block on a full pipe
  // while we drain stdout.
  TempDir scratch;
  const std::string stderr_path = scratch.Join("stderr");
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) return ErrnoToStatus(errno, "pipe");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[1]);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  const int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  if (rc != 0) {
    ::close(pipe_fds[0]);
    return ErrnoToStatus(rc, absl::StrCat("spawn ", argv[0]));
  }
  CommandResult result;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(pipe_fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(buf, static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  auto error = ReadFileToString(stderr_path);
  if (error.ok()) result.error = std::move(*error);
  return result;
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

std::string StrataBinary() { return JoinPath(STRATA_BINARY_DIR, "strata"); }

std::string SourcePath(const std::string& relative) {
  return JoinPath(STRATA_SOURCE_DIR, relative);
}

void WriteTextFile(const std::string& path, const std::string& contents) {
  const absl::Status status = WriteFileAtomically(path, contents);
  ASSERT_TRUE(status.ok()) << status;
}

}  // namespace strata::testing
