// The local stack a soak runs against, and the faults it can be dealt:
// redis-server (append-only file, fsync on every write), a coordinator and
// N workers, each a real process, restarted the way an operator's
// supervisor (Kubernetes, systemd) would bring it back.
//
// Where this machine allows it (root, network namespaces), each worker runs
// in a network namespace of its own, joined to the others by a bridge, so a
// partition is a link taken down: the worker keeps running and sees every
// peer go silent, and they see it go silent. Each worker's NVMe directory
// is then a small tmpfs of its own, so a full disk is real ENOSPC. Without
// those rights the stack runs on loopback and the harness skips the two
// faults, saying why (Stack::network_note / disk_note).
#ifndef STRATA_TESTS_SOAK_STACK_H_
#define STRATA_TESTS_SOAK_STACK_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/testutil/child_process.h"

namespace strata::soak {

struct StackOptions {
  std::string dir;        // state: logs, Redis data, token, the workers' NVMe directories
  std::string model_dir;  // job paths the workers may read besides `dir` (--allow-path)
  int workers = 4;
  int collective_timeout_ms = 5000;
  bool isolate_network = true;  // namespaces + bridge where allowed
  bool small_disks = true;      // a tmpfs per worker NVMe directory where allowed
  int disk_mib = 192;           // each worker's NVMe filesystem
};

class Stack {
 public:
  static absl::StatusOr<std::unique_ptr<Stack>> Start(const StackOptions& options);
  // Kills every process and removes the namespaces, bridge and mounts.
  ~Stack();
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;

  const std::string& coordinator_address() const { return coordinator_address_; }
  const std::string& token() const { return token_; }
  int workers() const { return static_cast<int>(workers_.size()); }
  const std::string& worker_address(int i) const { return workers_[i].address; }
  std::string worker_id(int i) const;
  const std::string& nvme_dir(int i) const { return workers_[i].nvme_dir; }
  bool network_isolated() const { return network_isolated_; }
  bool small_disks() const { return small_disks_; }
  const std::string& network_note() const { return network_note_; }
  const std::string& disk_note() const { return disk_note_; }
  int redis_port() const { return redis_port_; }

  // Faults. A killed process stays down until Supervise() brings it back
  // (after `down_for`), as a supervisor's restart back-off would.
  void KillRedis(std::chrono::milliseconds down_for);
  void KillCoordinator(std::chrono::milliseconds down_for);
  void KillWorker(int i, std::chrono::milliseconds down_for);
  void PauseWorker(int i);         // SIGSTOP
  void ResumeWorker(int i);        // SIGCONT
  absl::Status CutWorker(int i);   // its link down: no packet in or out
  absl::Status HealWorker(int i);  // link up again
  // Fills the worker's NVMe filesystem to its last few KiB with a ballast
  // file; FreeDisk removes it.
  absl::Status FillDisk(int i);
  absl::Status FreeDisk(int i);

  // Restarts every process that is down and due back (or died on its own:
  // those are counted in unexpected_exits). Returns what it restarted.
  std::vector<std::string> Supervise();
  // Brings everything back at once: resumes, heals, frees, restarts.
  void HealAll();
  int unexpected_exits() const { return unexpected_exits_; }
  // "worker3: signal 11" for each process that exited on its own.
  const std::vector<std::string>& exits() const { return exits_; }

  // Pids of the processes the stack runs now (for the leak check).
  std::vector<int> LivePids() const;
  // The logs of every process, concatenated with headers (for a failure).
  std::string LogTail(size_t bytes_per_log) const;

 private:
  struct Process {
    std::string name;
    std::vector<std::string> argv;
    std::unique_ptr<testing::ChildProcess> child;
    std::chrono::steady_clock::time_point back_at{};
    bool held_down = false;  // killed by the nemesis, due back at back_at
    std::string log;
  };
  struct Worker {
    Process process;
    std::string address;  // HOST:PORT it serves on
    std::string nvme_dir;
    std::string netns;      // "" on loopback
    std::string host_link;  // the bridge side of its veth
    bool paused = false;
    bool cut = false;
    bool disk_full = false;
  };

  explicit Stack(StackOptions options) : options_(std::move(options)) {}
  absl::Status SetUpNetwork();
  void TearDownNetwork();
  absl::Status SetUpDisks();
  absl::Status Launch(Process& p);
  absl::Status LaunchRedis();
  void Kill(Process& p, std::chrono::milliseconds down_for);

  StackOptions options_;
  std::string token_, token_file_, coordinator_address_, redis_dir_;
  int redis_port_ = 0;
  std::string host_ip_ = "127.0.0.1";
  std::string tag_;  // names this stack's namespaces and links
  Process redis_, coordinator_;
  std::vector<Worker> workers_;
  bool network_isolated_ = false, small_disks_ = false;
  std::string network_note_, disk_note_;
  std::vector<std::string> mounts_;
  int unexpected_exits_ = 0;
  std::vector<std::string> exits_;
};

}  // namespace strata::soak

#endif  // STRATA_TESTS_SOAK_STACK_H_
