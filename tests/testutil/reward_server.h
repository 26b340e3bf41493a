// A reward server (tests/rewards/remote/reward_server.py, or another
// script of the tree that prints its port the same way) as a child process
// on loopback, for the remote-reward tests and the jobs that call one.
#ifndef STRATA_TESTS_TESTUTIL_REWARD_SERVER_H_
#define STRATA_TESTS_TESTUTIL_REWARD_SERVER_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "tests/testutil/testutil.h"

extern char** environ;

namespace strata::testing {

// reward_server.py as a child process: its port comes from the first line
// of its stdout (read through a pipe, so nothing polls or sleeps); killed
// and reaped on destruction.
class RewardServer {
 public:
  // Runs tests/rewards/remote/reward_server.py with `flags`, or another
  // script of the tree that prints its port the same way.
  static absl::StatusOr<std::unique_ptr<RewardServer>> Start(const std::vector<std::string>& flags = {},
                                                             const std::string& script = "") {
    std::unique_ptr<RewardServer> server(new RewardServer());
    std::vector<std::string> argv = {"python3", "-I"};
    if (script.empty()) {
      argv.insert(argv.end(), {SourcePath("tests/rewards/remote/reward_server.py"), "--record", server->record_path()});
    } else {
      argv.push_back(SourcePath(script));
    }
    argv.insert(argv.end(), flags.begin(), flags.end());
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe2");
    server->port_fd_ = fds[0];
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, server->log_path().c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                     0644);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int rc = ::posix_spawnp(&server->pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    if (rc != 0) return ErrnoToStatus(rc, "spawn python3 reward_server.py");
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (line.find('\n') == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                              std::chrono::steady_clock::now());
      pollfd p{server->port_fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
        return absl::UnavailableError(absl::StrCat("reward_server.py printed no port; log:\n", server->Log()));
      }
      char buffer[64];
      const ssize_t n = ::read(server->port_fd_, buffer, sizeof(buffer));
      if (n <= 0) return absl::UnavailableError(absl::StrCat("reward_server.py exited; log:\n", server->Log()));
      line.append(buffer, static_cast<size_t>(n));
    }
    if (!absl::SimpleAtoi(line.substr(0, line.find('\n')), &server->port_)) {
      return absl::UnavailableError(absl::StrCat("reward_server.py printed \"", line, "\", not a port"));
    }
    return server;
  }
  ~RewardServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
    if (port_fd_ >= 0) ::close(port_fd_);
  }
  RewardServer(const RewardServer&) = delete;
  RewardServer& operator=(const RewardServer&) = delete;

  int port() const { return port_; }
  std::string Url(const std::string& path) const { return absl::StrCat("http://127.0.0.1:", port_, path); }
  // The requests the server received, in arrival order.
  std::vector<nlohmann::json> Requests() const {
    std::vector<nlohmann::json> out;
    auto text = ReadFileToString(record_path());
    if (!text.ok()) return out;
    for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
      out.push_back(nlohmann::json::parse(std::string(line)));
    }
    return out;
  }
  std::vector<std::string> Paths() const {
    std::vector<std::string> paths;
    for (const nlohmann::json& r : Requests()) paths.push_back(r["path"]);
    return paths;
  }
  std::string Log() const {
    auto text = ReadFileToString(log_path());
    return text.ok() ? *text : std::string();
  }

 private:
  RewardServer() = default;
  std::string record_path() const { return dir_.Join("requests.jsonl"); }
  std::string log_path() const { return dir_.Join("server.log"); }

  TempDir dir_;
  pid_t pid_ = -1;
  int port_fd_ = -1;
  int port_ = 0;
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTUTIL_REWARD_SERVER_H_
