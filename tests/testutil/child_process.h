// A background child process for end-to-end tests (servers): output to a
// log file, signals, and a kill + reap on destruction.
#ifndef STRATA_TESTS_TESTUTIL_CHILD_PROCESS_H_
#define STRATA_TESTS_TESTUTIL_CHILD_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"

extern char** environ;

namespace strata::testing {

class ChildProcess {
 public:
  // Starts `argv` in `cwd` with stdout and stderr appended to `log_path`.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const std::vector<std::string>& argv,
                                                             const std::string& log_path, const std::string& cwd) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    posix_spawn_file_actions_addchdir_np(&actions, cwd.c_str());
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = 0;
    const int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return ErrnoToStatus(rc, absl::StrCat("spawn ", argv[0]));
    return std::unique_ptr<ChildProcess>(new ChildProcess(pid, log_path));
  }
  ~ChildProcess() { Kill(SIGKILL); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Sends `signal` and waits for the child to exit; returns its wait status.
  int Kill(int signal) {
    if (pid_ <= 0) return status_;
    ::kill(pid_, signal);
    while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return status_;
  }
  // Sends `signal` without waiting (SIGSTOP, SIGCONT).
  void Signal(int signal) const {
    if (pid_ > 0) ::kill(pid_, signal);
  }
  // True while the child has not exited (reaps it when it has).
  bool Alive() {
    if (pid_ <= 0) return false;
    if (::waitpid(pid_, &status_, WNOHANG) == 0) return true;
    pid_ = -1;
    return false;
  }
  // The child's pid while it runs, -1 once reaped.
  pid_t pid() const { return pid_; }
  // How it ended, once reaped: "exit 3", "signal 11" ("" while it runs).
  std::string HowItEnded() const {
    if (pid_ > 0) return "";
    if (WIFSIGNALED(status_)) return absl::StrCat("signal ", WTERMSIG(status_));
    return absl::StrCat("exit ", WEXITSTATUS(status_));
  }
  std::string Log() const {
    auto text = ReadFileToString(log_path_);
    return text.ok() ? *text : std::string();
  }

 private:
  ChildProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_;
  int status_ = 0;
  std::string log_path_;
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTUTIL_CHILD_PROCESS_H_
