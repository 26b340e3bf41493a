// A throwaway redis-server for tests: its own loopback port and data
// directory, append-only file on, so a test can stop it, restart it on the
// same port and directory, and see what survived. Header-only.
//
//   auto server = strata::testing::RedisServer::Start();
//   if (!server.ok()) GTEST_SKIP() << server.status();   // no redis-server here
//   options.redis_url = (*server)->url();
#ifndef STRATA_TESTS_TESTUTIL_REDIS_SERVER_H_
#define STRATA_TESTS_TESTUTIL_REDIS_SERVER_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "tests/testutil/testutil.h"

extern char** environ;

namespace strata::testing {

class RedisServer {
 public:
  // How long Start/Restart wait for the server to answer PING, and Stop for
  // it to exit after SIGTERM, before giving up.
  static constexpr std::chrono::milliseconds kReadyTimeout{10000};
  static constexpr std::chrono::milliseconds kStopTimeout{10000};

  // True when a redis-server binary is on PATH; tests GTEST_SKIP otherwise.
  static bool Available() { return HaveProgram("redis-server"); }

  // Starts a server on a free loopback port. FAILED_PRECONDITION when
  // redis-server is not installed; UNAVAILABLE when it does not come up.
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start() {
    if (!Available()) return absl::FailedPreconditionError("redis-server is not on PATH");
    std::unique_ptr<RedisServer> server(new RedisServer());
    // The port is free when probed but another process may take it before the
    // server binds; a few fresh ports make that race harmless.
    absl::Status status;
    for (int attempt = 0; attempt < 5; ++attempt) {
      STRATA_ASSIGN_OR_RETURN(auto port, FreePort());
      server->port_ = port;
      status = server->Launch();
      if (status.ok()) return server;
    }
    return status;
  }

  ~RedisServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Reap(/*block=*/true);
    }
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Graceful shutdown (SIGTERM: Redis flushes its append-only file), then
  // waits for the process. SIGKILL if it outlives kStopTimeout.
  absl::Status Stop() {
    if (pid_ <= 0) return absl::OkStatus();
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + kStopTimeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (Reap(/*block=*/false)) return absl::OkStatus();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ::kill(pid_, SIGKILL);
    Reap(/*block=*/true);
    return absl::DeadlineExceededError(absl::StrCat("redis-server on port ", port_, " ignored SIGTERM"));
  }

  // Starts the server again on the same port and directory; it reloads what
  // its append-only file holds.
  absl::Status Restart() {
    if (pid_ > 0) return absl::FailedPreconditionError("redis-server is still running");
    return Launch();
  }

  bool running() const { return pid_ > 0; }
  int port() const { return port_; }
  std::string url() const { return absl::StrCat("redis://127.0.0.1:", port_); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  const std::string& dir() const { return dir_.path(); }
  // The server's log, for a failing test's message.
  std::string Log() const {
    auto log = ReadFileToString(dir_.Join("redis.log"));
    return log.ok() ? *log : std::string();
  }

  // A loopback port nothing listens on right now.
  static absl::StatusOr<int> FreePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return ErrnoToStatus(errno, "socket");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoToStatus(err, "bind a loopback port");
    }
    ::close(fd);
    return static_cast<int>(ntohs(addr.sin_port));
  }

 private:
  RedisServer() = default;

  absl::Status Launch() {
    const std::vector<std::string> argv = {
        "redis-server",
        "--port",
        std::to_string(port_),
        "--bind",
        "127.0.0.1",
        "--dir",
        dir_.path(),
        "--appendonly",
        "yes",
        "--save",
        "",  // no RDB snapshots: the append-only file alone must carry the data
        "--daemonize",
        "no",
        "--logfile",
        dir_.Join("redis.log"),
        "--databases",
        "1",
        // Cron at 100 Hz: a SIGTERM'd server exits in ~10 ms instead of ~100 ms.
        "--hz",
        "100",
    };
    std::vector<char*> args;
    for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    pid_t pid = 0;
    const int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return ErrnoToStatus(rc, "spawn redis-server");
    pid_ = pid;
    const auto deadline = std::chrono::steady_clock::now() + kReadyTimeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (Reap(/*block=*/false)) {
        return absl::UnavailableError(
            absl::StrCat("redis-server on port ", port_, " exited during start-up; log:\n", Log()));
      }
      if (AnswersPing()) return absl::OkStatus();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ::kill(pid_, SIGKILL);
    Reap(/*block=*/true);
    return absl::UnavailableError(
        absl::StrCat("redis-server on port ", port_, " did not answer PING in time; log:\n", Log()));
  }

  // True once the child has exited (and is reaped).
  bool Reap(bool block) {
    int status = 0;
    while (true) {
      const pid_t r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
      if (r < 0 && errno == EINTR) continue;
      if (r == pid_ || r < 0) {
        pid_ = -1;
        return true;
      }
      return false;
    }
  }

  // One inline PING over a plain socket ("+PONG"); also false while the
  // server is still loading its data ("-LOADING ...").
  bool AnswersPing() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    bool ok = false;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      constexpr char kPing[] = "PING\r\n";
      if (::write(fd, kPing, sizeof(kPing) - 1) == static_cast<ssize_t>(sizeof(kPing) - 1)) {
        pollfd pfd{fd, POLLIN, 0};
        char buf[64] = {};
        if (::poll(&pfd, 1, 1000) == 1) {
          const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
          ok = n >= 5 && std::string(buf, 5) == "+PONG";
        }
      }
    }
    ::close(fd);
    return ok;
  }

  TempDir dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTUTIL_REDIS_SERVER_H_
