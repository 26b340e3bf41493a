#include "policies/dist/process_group.h"

#ifdef STRATA_HAVE_GLOO
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

#include <exception>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace strata::policies {
namespace {

class SoloProcessGroup final : public ProcessGroup {
 public:
  absl::Status AllReduceSum(std::vector<at::Tensor>&) override { return absl::OkStatus(); }
  absl::Status StartAllReduceSum(std::vector<at::Tensor>) override { return absl::OkStatus(); }
  absl::Status WaitPending() override { return absl::OkStatus(); }
  absl::Status Broadcast(std::vector<at::Tensor>&, int root) override {
    if (root != 0) return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank of 1"));
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
};

// c10d 1.13 counts connect timeouts in whole seconds: less is no wait at all.
constexpr std::chrono::milliseconds kMinTimeout{1000};

absl::Status CheckTimeout(const char* what, std::chrono::milliseconds timeout) {
  if (timeout < kMinTimeout) {
    return absl::InvalidArgumentError(absl::StrCat(what, " timeout must be at least ", kMinTimeout.count(),
                                                   " ms, got ", timeout.count(), " ms"));
  }
  return absl::OkStatus();
}

#ifdef STRATA_HAVE_GLOO

// c10d's errors are exceptions whose text is all there is to go on.
absl::Status FromException(const std::string& what, const std::exception& e) {
  const std::string message = absl::StrCat(what, ": ", e.what());
  const std::string text = e.what();
  if (absl::StrContains(text, "imed out") || absl::StrContains(text, "imeout")) {
    return absl::DeadlineExceededError(message);
  }
  if (absl::StrContains(text, "onnection") || absl::StrContains(text, "refused") ||
      absl::StrContains(text, "reset") || absl::StrContains(text, "closed")) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

absl::Status CheckPort(int port) {
  if (port < 0 || port > std::numeric_limits<uint16_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous port must be in [0, 65535], got ", port));
  }
  return absl::OkStatus();
}

class RendezvousImpl final : public Rendezvous {
 public:
  explicit RendezvousImpl(c10::intrusive_ptr<c10d::TCPStore> store) : store_(std::move(store)) {}
  int port() const override { return store_->getPort(); }
  const c10::intrusive_ptr<c10d::TCPStore>& store() const { return store_; }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

absl::StatusOr<std::unique_ptr<Rendezvous>> OpenStore(const std::string& host, int port, bool is_server,
                                                      int world_size, std::chrono::milliseconds timeout) {
  STRATA_RETURN_IF_ERROR(CheckPort(port));
  STRATA_RETURN_IF_ERROR(CheckTimeout("rendezvous", timeout));
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = is_server;
  if (is_server) options.numWorkers = static_cast<size_t>(world_size);
  options.waitWorkers = false;  // the ranks meet when they build the group
  options.timeout = timeout;
  try {
    return std::make_unique<RendezvousImpl>(c10::make_intrusive<c10d::TCPStore>(host, options));
  } catch (const std::exception& e) {
    return FromException(absl::StrCat(is_server ? "host" : "join", " rendezvous at ", host, ":", port), e);
  }
}

class GlooProcessGroup final : public ProcessGroup {
 public:
  GlooProcessGroup(const ProcessGroupOptions& options, std::unique_ptr<Rendezvous> rendezvous,
                   c10::intrusive_ptr<c10d::ProcessGroupGloo> group)
      : options_(options), rendezvous_(std::move(rendezvous)), group_(std::move(group)) {}

  // c10d's tensor lists mean one tensor per device, so each tensor is its
  // own collective; they are all issued before the first wait.
  absl::Status AllReduceSum(std::vector<at::Tensor>& tensors) override {
    return Run("all-reduce", tensors.size(), [&](size_t i) {
      std::vector<at::Tensor> one = {tensors[i]};
      return group_->allreduce(one);
    });
  }

  absl::Status StartAllReduceSum(std::vector<at::Tensor> tensors) override {
    if (tensors.empty()) return absl::OkStatus();
    try {
      pending_.push_back({tensors, group_->allreduce_coalesced(tensors)});
    } catch (const std::exception& e) {
      return Failed("all-reduce", e);
    }
    return absl::OkStatus();
  }

  absl::Status WaitPending() override {
    absl::Status status;
    for (Pending& p : pending_) {
      try {
        p.work->wait(options_.timeout);
      } catch (const std::exception& e) {
        if (status.ok()) status = Failed("all-reduce", e);
      }
    }
    pending_.clear();
    return status;
  }

  absl::Status Broadcast(std::vector<at::Tensor>& tensors, int root) override {
    if (root < 0 || root >= options_.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank of ", options_.world_size));
    }
    c10d::BroadcastOptions broadcast;
    broadcast.rootRank = root;
    return Run("broadcast", tensors.size(), [&](size_t i) {
      std::vector<at::Tensor> one = {tensors[i]};
      return group_->broadcast(one, broadcast);
    });
  }

  absl::Status Barrier() override {
    return Run("barrier", 1, [&](size_t) { return group_->barrier(); });
  }

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }

 private:
  // Starts `count` collectives (`start(i)`), then waits for all of them.
  // After a failure the rest are still waited for (their buffers are the
  // caller's), each bounded by the group's timeout.
  absl::Status Failed(const char* what, const std::exception& e) const {
    return FromException(absl::StrCat(what, " on rank ", options_.rank, " of ", options_.world_size), e);
  }

  template <typename Start>
  absl::Status Run(const char* what, size_t count, Start start) {
    auto failed = [&](const std::exception& e) { return Failed(what, e); };
    std::vector<c10::intrusive_ptr<c10d::Work>> started;
    absl::Status status;
    try {
      for (size_t i = 0; i < count; ++i) started.push_back(start(i));
    } catch (const std::exception& e) {
      status = failed(e);
    }
    for (auto& work : started) {
      try {
        work->wait(options_.timeout);
      } catch (const std::exception& e) {
        if (status.ok()) status = failed(e);
      }
    }
    return status;
  }

  // A started bucket and its tensors (c10d holds them too; kept for clarity
  // of ownership until the wait).
  struct Pending {
    std::vector<at::Tensor> tensors;
    c10::intrusive_ptr<c10d::Work> work;
  };

  const ProcessGroupOptions options_;
  std::unique_ptr<Rendezvous> rendezvous_;  // the store outlives the group
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  std::vector<Pending> pending_;
};

#endif  // STRATA_HAVE_GLOO

}  // namespace

std::unique_ptr<ProcessGroup> ProcessGroup::Solo() { return std::make_unique<SoloProcessGroup>(); }

absl::StatusOr<std::vector<std::unique_ptr<ProcessGroup>>> ProcessGroup::CreateInProcess(
    int ranks, std::chrono::milliseconds timeout) {
  if (ranks < 1) return absl::InvalidArgumentError(absl::StrCat("ranks must be >= 1, got ", ranks));
  std::vector<std::unique_ptr<ProcessGroup>> groups(static_cast<size_t>(ranks));
  if (ranks == 1) {
    groups[0] = Solo();
    return groups;
  }
  STRATA_ASSIGN_OR_RETURN(auto host, Rendezvous::Host("127.0.0.1", 0, ranks, timeout));
  const int port = host->port();
  std::vector<absl::Status> statuses(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  // Each rank's group forms only when all have joined: one thread each.
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r, rendezvous = r == 0 ? std::move(host) : nullptr]() mutable {
      absl::Status& status = statuses[static_cast<size_t>(r)];
      if (rendezvous == nullptr) {
        auto joined = Rendezvous::Join("127.0.0.1", port, timeout);
        if (!joined.ok()) {
          status = joined.status();
          return;
        }
        rendezvous = std::move(*joined);
      }
      ProcessGroupOptions options;
      options.rank = r;
      options.world_size = ranks;
      options.timeout = timeout;
      auto group = Create(options, std::move(rendezvous));
      if (group.ok()) {
        groups[static_cast<size_t>(r)] = std::move(*group);
      } else {
        status = group.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : statuses) STRATA_RETURN_IF_ERROR(s);
  return groups;
}

absl::Status ProcessGroupOptions::Validate() const {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("process group world_size must be >= 1, got ", world_size));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("process group rank must be in [0, ", world_size, "), got ", rank));
  }
  return CheckTimeout("process group", timeout);
}

#ifdef STRATA_HAVE_GLOO
bool ProcessGroup::Available() { return true; }

absl::StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::Host(const std::string& host, int port, int world_size,
                                                             std::chrono::milliseconds timeout) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous world_size must be >= 1, got ", world_size));
  }
  return OpenStore(host, port, /*is_server=*/true, world_size, timeout);
}

absl::StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::Join(const std::string& host, int port,
                                                             std::chrono::milliseconds timeout) {
  return OpenStore(host, port, /*is_server=*/false, 0, timeout);
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Create(const ProcessGroupOptions& options,
                                                                   std::unique_ptr<Rendezvous> rendezvous) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  if (rendezvous == nullptr) return absl::InvalidArgumentError("process group needs a rendezvous");
  auto* store = static_cast<RendezvousImpl*>(rendezvous.get());
  try {
    auto gloo = c10d::ProcessGroupGloo::Options::create(options.timeout);
    // Loopback for a gang on one machine; the hostname's address otherwise.
    gloo->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    // One group per store: keys of a later group must not meet this one's.
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("strata", store->store());
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, options.rank, options.world_size, gloo);
    return std::unique_ptr<ProcessGroup>(new GlooProcessGroup(options, std::move(rendezvous), std::move(group)));
  } catch (const std::exception& e) {
    return FromException(absl::StrCat("process group rank ", options.rank, " of ", options.world_size), e);
  }
}

#else
bool ProcessGroup::Available() { return false; }

namespace {
absl::Status NoGloo() {
  return absl::UnimplementedError(
      "this build has no Gloo (c10d's CPU backend): a job of one rank runs, more need a build with libgloo-dev");
}
}  // namespace

absl::StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::Host(const std::string&, int, int,
                                                             std::chrono::milliseconds) {
  return NoGloo();
}
absl::StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::Join(const std::string&, int, std::chrono::milliseconds) {
  return NoGloo();
}
absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Create(const ProcessGroupOptions& options,
                                                                   std::unique_ptr<Rendezvous>) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  return NoGloo();
}
#endif  // STRATA_HAVE_GLOO

}  // namespace strata::policies
