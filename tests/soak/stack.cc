#include "tests/soak/stack.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/log.h"
#include "tests/testutil/redis_server.h"
#include "tests/testutil/testutil.h"

namespace strata::soak {
namespace {

using Clock = std::chrono::steady_clock;

// Runs a command and turns a non-zero exit into an error carrying its stderr.
absl::Status Run(const std::vector<std::string>& argv) {
  auto result = testing::RunCommand(argv);
  if (!result.ok()) return result.status();
  if (result->exit_code != 0) {
    return absl::InternalError(
        absl::StrCat(absl::StrJoin(argv, " "), ": exit ", result->exit_code, ": ", result->error));
  }
  return absl::OkStatus();
}

// The last `bytes` of a file, for failure messages.
std::string Tail(const std::string& path, size_t bytes) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return "";
  return text->size() <= bytes ? *text : text->substr(text->size() - bytes);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Stack>> Stack::Start(const StackOptions& options) {
  if (options.workers < 2) return absl::InvalidArgumentError("a soak needs at least 2 workers (gangs of 2)");
  std::unique_ptr<Stack> stack(new Stack(options));
  std::filesystem::create_directories(JoinPath(options.dir, "logs"));
  stack->tag_ = absl::StrFormat("%04x", ::getpid() & 0xffff);

  // A token only the stack's processes read.
  std::random_device random;
  stack->token_ = absl::StrFormat("soak-%08x%08x", random(), random());
  stack->token_file_ = JoinPath(options.dir, "token");
  testing::WriteTextFile(stack->token_file_, stack->token_);
  ::chmod(stack->token_file_.c_str(), 0600);

  if (options.isolate_network) {
    const absl::Status net = stack->SetUpNetwork();
    if (!net.ok()) {
      stack->TearDownNetwork();
      stack->network_note_ = absl::StrCat("partitions skipped: no network namespaces here (", net.message(), ")");
    }
  } else {
    stack->network_note_ = "partitions skipped: isolate_network is off";
  }
  if (!stack->network_isolated_) stack->workers_.resize(static_cast<size_t>(options.workers));
  for (int i = 0; i < options.workers; ++i) {
    stack->workers_[i].nvme_dir = JoinPath(options.dir, absl::StrCat("nvme", i));
    std::filesystem::create_directories(stack->workers_[i].nvme_dir);
  }
  if (options.small_disks) {
    const absl::Status disks = stack->SetUpDisks();
    if (!disks.ok())
      stack->disk_note_ = absl::StrCat("full disks skipped: cannot mount a tmpfs (", disks.message(), ")");
  } else {
    stack->disk_note_ = "full disks skipped: small_disks is off";
  }

  // Redis as deployed (deploy/k8s/base/redis.yaml): append-only, fsync
  // each second. A killed redis-server loses nothing it acknowledged (its
  // writes reached the kernel before the reply); only a machine that loses
  // power may lose the last second, which no soak here can deal.
  STRATA_ASSIGN_OR_RETURN(stack->redis_port_, testing::RedisServer::FreePort());
  stack->redis_dir_ = JoinPath(options.dir, "redis");
  std::filesystem::create_directories(stack->redis_dir_);
  stack->redis_.name = "redis";
  stack->redis_.log = JoinPath(options.dir, "logs/redis.log");
  stack->redis_.argv = {"redis-server",
                        "--port",
                        std::to_string(stack->redis_port_),
                        "--bind",
                        "127.0.0.1",
                        "--dir",
                        stack->redis_dir_,
                        "--appendonly",
                        "yes",
                        "--appendfsync",
                        "everysec",
                        "--save",
                        "",
                        "--daemonize",
                        "no"};
  STRATA_RETURN_IF_ERROR(stack->LaunchRedis());

  STRATA_ASSIGN_OR_RETURN(const int coordinator_port, testing::RedisServer::FreePort());
  stack->coordinator_address_ = absl::StrCat(stack->host_ip_, ":", coordinator_port);
  stack->coordinator_.name = "coordinator";
  stack->coordinator_.log = JoinPath(options.dir, "logs/coordinator.log");
  stack->coordinator_.argv = {testing::StrataBinary(),
                              "coordinator",
                              "--listen",
                              stack->coordinator_address_,
                              "--redis",
                              absl::StrCat("redis://127.0.0.1:", stack->redis_port_),
                              "--token-file",
                              stack->token_file_,
                              "--collective-timeout-ms",
                              std::to_string(options.collective_timeout_ms)};
  STRATA_RETURN_IF_ERROR(stack->Launch(stack->coordinator_));

  for (int i = 0; i < options.workers; ++i) {
    Worker& w = stack->workers_[i];
    if (w.address.empty()) {
      STRATA_ASSIGN_OR_RETURN(const int port, testing::RedisServer::FreePort());
      w.address = absl::StrCat("127.0.0.1:", port);
    }
    w.process.name = absl::StrCat("worker", i);
    w.process.log = JoinPath(options.dir, absl::StrCat("logs/worker", i, ".log"));
    std::vector<std::string> argv;
    if (!w.netns.empty()) {
      // Its own namespace, and its own hostname (its address): Gloo binds
      // the address the hostname resolves to. Each step execs the next, so
      // the pid is the worker's.
      const std::string ip = w.address.substr(0, w.address.find(':'));
      argv = {"ip",    "netns",   "exec",
              w.netns, "unshare", "--uts",
              "sh",    "-c",      "hostname " + ip + " && exec \"$0\" \"$@\""};
    }
    for (const std::string& a :
         {testing::StrataBinary(), std::string("worker"), std::string("--listen"), w.address,
          std::string("--coordinator"), stack->coordinator_address_, std::string("--token-file"), stack->token_file_,
          std::string("--id"), stack->worker_id(i), std::string("--nvme-dir"), w.nvme_dir, std::string("--allow-path"),
          options.model_dir, std::string("--allow-path"), testing::SourcePath("examples")}) {
      argv.push_back(a);
    }
    w.process.argv = std::move(argv);
    STRATA_RETURN_IF_ERROR(stack->Launch(w.process));
  }
  return stack;
}

std::string Stack::worker_id(int i) const { return absl::StrCat("w", i); }

absl::Status Stack::SetUpNetwork() {
  if (::geteuid() != 0) return absl::PermissionDeniedError("not root");
  for (const char* program : {"ip", "unshare"}) {
    if (!testing::HaveProgram(program)) return absl::FailedPreconditionError(absl::StrCat("no ", program, " command"));
  }
  // 10.201.<tag>.0/24: another soak on this machine uses another subnet.
  const int subnet = ::getpid() % 250;
  const std::string bridge = absl::StrCat("ssk", tag_, "b");
  STRATA_RETURN_IF_ERROR(Run({"ip", "link", "add", bridge, "type", "bridge"}));
  host_ip_ = absl::StrCat("10.201.", subnet, ".1");
  STRATA_RETURN_IF_ERROR(Run({"ip", "addr", "add", host_ip_ + "/24", "dev", bridge}));
  STRATA_RETURN_IF_ERROR(Run({"ip", "link", "set", bridge, "up"}));
  workers_.resize(static_cast<size_t>(options_.workers));
  for (int i = 0; i < options_.workers; ++i) {
    Worker& w = workers_[i];
    w.netns = absl::StrCat("ssk", tag_, "n", i);
    w.host_link = absl::StrCat("ssk", tag_, "h", i);
    const std::string peer = absl::StrCat("ssk", tag_, "p", i);
    const std::string ip = absl::StrCat("10.201.", subnet, ".", 10 + i);
    STRATA_RETURN_IF_ERROR(Run({"ip", "netns", "add", w.netns}));
    STRATA_RETURN_IF_ERROR(Run({"ip", "link", "add", w.host_link, "type", "veth", "peer", "name", peer}));
    STRATA_RETURN_IF_ERROR(Run({"ip", "link", "set", peer, "netns", w.netns}));
    STRATA_RETURN_IF_ERROR(Run({"ip", "link", "set", w.host_link, "master", bridge, "up"}));
    STRATA_RETURN_IF_ERROR(Run({"ip", "netns", "exec", w.netns, "ip", "addr", "add", ip + "/24", "dev", peer}));
    STRATA_RETURN_IF_ERROR(Run({"ip", "netns", "exec", w.netns, "ip", "link", "set", peer, "up"}));
    STRATA_RETURN_IF_ERROR(Run({"ip", "netns", "exec", w.netns, "ip", "link", "set", "lo", "up"}));
    w.address = absl::StrCat(ip, ":", 50100 + i);
  }
  network_isolated_ = true;
  return absl::OkStatus();
}

void Stack::TearDownNetwork() {
  for (Worker& w : workers_) {
    if (!w.netns.empty()) (void)Run({"ip", "netns", "del", w.netns});
    if (!w.host_link.empty()) (void)Run({"ip", "link", "del", w.host_link});
  }
  (void)Run({"ip", "link", "del", absl::StrCat("ssk", tag_, "b")});
  if (!network_isolated_) {
    for (Worker& w : workers_) w = Worker();
    host_ip_ = "127.0.0.1";
  }
}

absl::Status Stack::SetUpDisks() {
  if (::geteuid() != 0) return absl::PermissionDeniedError("not root");
  for (Worker& w : workers_) {
    STRATA_RETURN_IF_ERROR(
        Run({"mount", "-t", "tmpfs", "-o", absl::StrCat("size=", options_.disk_mib, "m"), "soak-nvme", w.nvme_dir}));
    mounts_.push_back(w.nvme_dir);
  }
  small_disks_ = true;
  return absl::OkStatus();
}

absl::Status Stack::LaunchRedis() {
  STRATA_RETURN_IF_ERROR(Launch(redis_));
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline) {
    auto ping = testing::RunCommand({"redis-cli", "-p", std::to_string(redis_port_), "ping"});
    if (ping.ok() && ping->output.find("PONG") != std::string::npos) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polls another process
  }
  return absl::UnavailableError(absl::StrCat("redis-server did not answer PING; log:\n", Tail(redis_.log, 2000)));
}

absl::Status Stack::Launch(Process& p) {
  STRATA_ASSIGN_OR_RETURN(p.child, testing::ChildProcess::Spawn(p.argv, p.log, options_.dir));
  p.held_down = false;
  return absl::OkStatus();
}

void Stack::Kill(Process& p, std::chrono::milliseconds down_for) {
  if (p.child != nullptr) p.child->Kill(SIGKILL);
  p.held_down = true;
  p.back_at = Clock::now() + down_for;
}

void Stack::KillRedis(std::chrono::milliseconds down_for) { Kill(redis_, down_for); }
void Stack::KillCoordinator(std::chrono::milliseconds down_for) { Kill(coordinator_, down_for); }
void Stack::KillWorker(int i, std::chrono::milliseconds down_for) {
  workers_[i].paused = false;  // a stopped process dies of SIGKILL too
  Kill(workers_[i].process, down_for);
}

void Stack::PauseWorker(int i) {
  Worker& w = workers_[i];
  if (w.process.child != nullptr) w.process.child->Signal(SIGSTOP);
  w.paused = true;
}

void Stack::ResumeWorker(int i) {
  Worker& w = workers_[i];
  if (w.process.child != nullptr) w.process.child->Signal(SIGCONT);
  w.paused = false;
}

absl::Status Stack::CutWorker(int i) {
  if (!network_isolated_) return absl::FailedPreconditionError(network_note_);
  STRATA_RETURN_IF_ERROR(Run({"ip", "link", "set", workers_[i].host_link, "down"}));
  workers_[i].cut = true;
  return absl::OkStatus();
}

absl::Status Stack::HealWorker(int i) {
  if (!workers_[i].cut) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(Run({"ip", "link", "set", workers_[i].host_link, "up"}));
  workers_[i].cut = false;
  return absl::OkStatus();
}

absl::Status Stack::FillDisk(int i) {
  if (!small_disks_) return absl::FailedPreconditionError(disk_note_);
  Worker& w = workers_[i];
  struct statvfs fs {};
  if (::statvfs(w.nvme_dir.c_str(), &fs) != 0) return ErrnoToStatus(errno, "statvfs " + w.nvme_dir);
  const int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  const int64_t ballast = free_bytes - 16 * 1024;  // a few blocks left: the next real write fails
  if (ballast <= 0) return absl::OkStatus();
  const std::string path = JoinPath(w.nvme_dir, ".soak-ballast");
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, "create " + path);
  const int rc = ::posix_fallocate(fd, 0, ballast);
  ::close(fd);
  if (rc != 0 && rc != ENOSPC) return ErrnoToStatus(rc, "fallocate " + path);
  w.disk_full = true;
  return absl::OkStatus();
}

absl::Status Stack::FreeDisk(int i) {
  Worker& w = workers_[i];
  const std::string path = JoinPath(w.nvme_dir, ".soak-ballast");
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoToStatus(errno, "remove " + path);
  w.disk_full = false;
  return absl::OkStatus();
}

std::vector<std::string> Stack::Supervise() {
  std::vector<std::string> restarted;
  const auto now = Clock::now();
  auto tend = [&](Process& p, bool is_redis) {
    if (p.held_down) {
      if (now < p.back_at) return;
    } else if (p.child == nullptr || p.child->Alive()) {
      return;
    } else {
      ++unexpected_exits_;
      exits_.push_back(absl::StrCat(p.name, ": ", p.child->HowItEnded()));
      STRATA_LOG(Warning) << "soak: " << p.name << " exited on its own (" << p.child->HowItEnded()
                          << "); restarting it";
    }
    const absl::Status s = is_redis ? LaunchRedis() : Launch(p);
    if (s.ok()) {
      restarted.push_back(p.name);
    } else {
      restarted.push_back(absl::StrCat(p.name, " failed to restart: ", s.message()));
      p.held_down = true;
      p.back_at = now + std::chrono::seconds(1);
    }
  };
  tend(redis_, true);
  tend(coordinator_, false);
  for (Worker& w : workers_) tend(w.process, false);
  return restarted;
}

void Stack::HealAll() {
  for (int i = 0; i < workers(); ++i) {
    if (workers_[i].paused) ResumeWorker(i);
    (void)HealWorker(i);
    (void)FreeDisk(i);
  }
  auto now = [](Process& p) {
    if (p.held_down) p.back_at = Clock::now();
  };
  now(redis_);
  now(coordinator_);
  for (Worker& w : workers_) now(w.process);
  Supervise();
}

std::vector<int> Stack::LivePids() const {
  std::vector<int> pids;
  auto add = [&](const Process& p) {
    if (p.child != nullptr && p.child->pid() > 0) pids.push_back(p.child->pid());
  };
  add(redis_);
  add(coordinator_);
  for (const Worker& w : workers_) add(w.process);
  return pids;
}

std::string Stack::LogTail(size_t bytes_per_log) const {
  std::string out;
  auto add = [&](const Process& p) { absl::StrAppend(&out, "==== ", p.name, " ====\n", Tail(p.log, bytes_per_log)); };
  add(redis_);
  add(coordinator_);
  for (const Worker& w : workers_) add(w.process);
  return out;
}

Stack::~Stack() {
  for (Worker& w : workers_) {
    if (w.process.child != nullptr) {
      w.process.child->Signal(SIGCONT);
      w.process.child->Kill(SIGKILL);
    }
  }
  if (coordinator_.child != nullptr) coordinator_.child->Kill(SIGKILL);
  if (redis_.child != nullptr) redis_.child->Kill(SIGKILL);
  for (const std::string& m : mounts_) (void)Run({"umount", "-l", m});
  if (network_isolated_) TearDownNetwork();
}

}  // namespace strata::soak
