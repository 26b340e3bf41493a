// A job's ranks talking to each other: a c10d process group (Gloo over TCP,
// or NCCL on a CUDA build) that meets through a TCPStore rendezvous hosted
// by rank 0. The
// trainer all-reduces gradients through it and the algorithms all-reduce
// their statistics, so that a gang of N ranks computes what one rank would.
// A gang of one uses ProcessGroup::Solo(), which needs no c10d at all.
//
// Every call completes or fails within its timeout. A rank that died or
// hangs becomes DEADLINE_EXCEEDED (or UNAVAILABLE when its connection broke)
// on every other rank, never a hang. c10d reports failures by throwing;
// nothing here throws.
//
// Thread-compatibility: one thread drives a ProcessGroup, and every rank
// issues the same collectives in the same order.
#ifndef STRATA_POLICIES_DIST_PROCESS_GROUP_H_
#define STRATA_POLICIES_DIST_PROCESS_GROUP_H_

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::policies {

// The key-value store the ranks meet at. Rank 0 hosts it: Host returns as
// soon as it listens, so its port and secret can be handed to the other
// ranks (by the coordinator, over the workers' authenticated channel),
// which Join it.
//
// c10d's TCPStore takes any connection and has no authentication hook, so
// the gang's keys are named under its secret, 128 random bits drawn when
// the store is hosted: a process that reaches the port without the secret
// cannot read, write or wait on any key the gang uses (the store lists no
// keys), so it can neither join nor mislead the gang. What it can still do
// is open connections; the NetworkPolicy keeps the port to the workers.
class Rendezvous {
 public:
  // Listens on host:port (0: a free port) for `world_size` ranks, itself
  // included, under a fresh secret. UNAVAILABLE when it cannot listen there.
  static absl::StatusOr<std::unique_ptr<Rendezvous>> Host(const std::string& host, int port, int world_size,
                                                          std::chrono::milliseconds timeout);
  // Connects to the store rank 0 hosts, under the secret it drew
  // (INVALID_ARGUMENT for one that is not 32 hex digits). DEADLINE_EXCEEDED
  // (or UNAVAILABLE) when it is not there within `timeout`.
  static absl::StatusOr<std::unique_ptr<Rendezvous>> Join(const std::string& host, int port, const std::string& secret,
                                                          std::chrono::milliseconds timeout);
  virtual ~Rendezvous() = default;
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // The port the store listens on.
  virtual int port() const = 0;
  // The gang's secret: 32 hex digits. A credential: never logged.
  virtual const std::string& secret() const = 0;

 protected:
  Rendezvous() = default;
};

// Which c10d backend carries the collectives. Gloo takes host tensors (a
// CUDA build's device tensors are copied through the host for it); NCCL
// takes device tensors, and host tensors are copied through the device.
enum class Backend { kGloo, kNccl };
const char* BackendName(Backend backend);  // "gloo", "nccl"

struct ProcessGroupOptions {
  int rank = 0;
  int world_size = 1;
  Backend backend = Backend::kGloo;
  // NCCL: the CUDA device this rank's collectives run on (its models' GPU).
  int device_index = 0;
  // Bounds the group's creation and every collective; at least 1 s (c10d
  // counts connect timeouts in whole seconds).
  std::chrono::milliseconds timeout{30000};

  // INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;
};

class ProcessGroup {
 public:
  // Builds a process group of options.backend through `rendezvous`, which
  // it keeps. Gloo returns once every rank has joined (DEADLINE_EXCEEDED
  // when they do not within options.timeout); NCCL's communicator forms at
  // the first collective, which Create issues (a one-element all-reduce) so
  // that a missing rank shows here too. UNIMPLEMENTED in a build without
  // the backend (see policies/CMakeLists.txt).
  static absl::StatusOr<std::unique_ptr<ProcessGroup>> Create(const ProcessGroupOptions& options,
                                                              std::unique_ptr<Rendezvous> rendezvous);
  // A gang of one: rank 0 of 1, every collective a no-op.
  static std::unique_ptr<ProcessGroup> Solo();
  // A gang of `ranks` inside this process (one thread per rank), over
  // loopback: element r is rank r. One rank is Solo() unless
  // `group_of_one` asks for a real group (to run a backend's path, NCCL's
  // on one GPU, say). NCCL takes one rank: ranks of one process would share
  // options.device_index's GPU, which NCCL refuses.
  struct InProcessOptions {
    Backend backend = Backend::kGloo;
    int device_index = 0;
    bool group_of_one = false;
    std::chrono::milliseconds timeout{30000};
  };
  static absl::StatusOr<std::vector<std::unique_ptr<ProcessGroup>>> CreateInProcess(int ranks,
                                                                                    const InProcessOptions& options);
  static absl::StatusOr<std::vector<std::unique_ptr<ProcessGroup>>> CreateInProcess(
      int ranks, std::chrono::milliseconds timeout);  // Gloo
  // True when Create can build multi-rank groups of `backend` in this build.
  static bool Available(Backend backend = Backend::kGloo);
  // OK where Available; else UNIMPLEMENTED saying what the build lacks.
  // Checked before a rendezvous: a rank that fails after joining leaves
  // the others retrying a store nobody serves.
  static absl::Status CheckAvailable(Backend backend);
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // In place: each tensor becomes its sum over the ranks. Tensors are
  // contiguous, of any dtypes and shapes, on the host (or, in a CUDA build,
  // the group's GPU), the same list on every rank. Each is its own
  // collective, all in flight together.
  virtual absl::Status AllReduceSum(std::vector<at::Tensor>& tensors) = 0;
  // Starts summing `tensors` in place and returns; they are one bucket (one
  // collective; Gloo flattens it), so they must share a dtype. The caller
  // keeps them alive and untouched until WaitPending. The trainer hands
  // over each layer's gradients this way while the next layer's backward
  // runs.
  virtual absl::Status StartAllReduceSum(std::vector<at::Tensor> tensors) = 0;
  // ZeRO-2: starts summing a bucket of which each rank needs only the
  // tensors it keeps: `owned[r]` are rank r's (the same lists on every
  // rank, one dtype). Once WaitPending has finished it, this rank's
  // `owned[rank()]` hold their sums and the others' are unspecified. NCCL
  // reduce-scatters (each rank receives only its part, padded to the
  // longest); Gloo, which has none, all-reduces the whole bucket. Counts as
  // one sum for WaitPending.
  virtual absl::Status StartReduceScatterSum(std::vector<std::vector<at::Tensor>> owned) = 0;
  // Finishes the oldest sums started (either way), in order, until at
  // most `keep_in_flight` are left (0: all of them); the first failure is
  // returned after all of those have ended. The trainer keeps one layer's
  // sum in flight and frees what the finished ones used.
  virtual absl::Status WaitPending(size_t keep_in_flight) = 0;
  // In place: every rank gets `root`'s values.
  virtual absl::Status Broadcast(std::vector<at::Tensor>& tensors, int root) = 0;
  // Returns once every rank has called it.
  virtual absl::Status Barrier() = 0;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual Backend backend() const = 0;

 protected:
  ProcessGroup() = default;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_DIST_PROCESS_GROUP_H_
