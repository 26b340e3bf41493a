#include "policies/dist/process_group.h"

// Either backend brings c10d's stores; each is built only where its
// headers are (policies/CMakeLists.txt).
#if defined(STRATA_HAVE_GLOO) || defined(STRATA_HAVE_NCCL)
#define STRATA_HAVE_C10D 1
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "policies/dist/c10d_group.h"
#endif
#ifdef STRATA_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef STRATA_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
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
  absl::Status StartReduceScatterSum(std::vector<std::vector<at::Tensor>>) override { return absl::OkStatus(); }
  absl::Status WaitPending(size_t) override { return absl::OkStatus(); }
  absl::Status Broadcast(std::vector<at::Tensor>&, int root) override {
    if (root != 0) return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank of 1"));
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  Backend backend() const override { return Backend::kGloo; }  // none, in fact; nothing crosses
};

// c10d 1.13 counts connect timeouts in whole seconds: less is no wait at all.
constexpr std::chrono::milliseconds kMinTimeout{1000};

absl::Status CheckTimeout(const char* what, std::chrono::milliseconds timeout) {
  if (timeout < kMinTimeout) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " timeout must be at least ", kMinTimeout.count(), " ms, got ", timeout.count(), " ms"));
  }
  return absl::OkStatus();
}

absl::Status NoBackend(Backend backend) {
  if (backend == Backend::kNccl) {
    return absl::UnimplementedError(
        "this build has no NCCL (c10d's GPU backend, in a CUDA PyTorch): use parallel.backend: gloo");
  }
  return absl::UnimplementedError(
      "this build has no Gloo (c10d's CPU backend): a job of one rank runs, more need a build with libgloo-dev");
}

#ifdef STRATA_HAVE_C10D

}  // namespace

absl::Status FromC10dException(const std::string& what, const std::exception& e) {
  const std::string message = absl::StrCat(what, ": ", e.what());
  const std::string text = e.what();
  if (absl::StrContains(text, "imed out") || absl::StrContains(text, "imeout")) {
    return absl::DeadlineExceededError(message);
  }
  // A peer gone: Gloo's socket errors, NCCL's "remote process exited or
  // there was a network error" and its aborted communicator.
  for (const char* gone :
       {"onnection", "refused", "reset", "closed", "roken pipe", "network", "remote process", "aborted"}) {
    if (absl::StrContains(text, gone)) return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

namespace {

absl::Status CheckPort(int port) {
  if (port < 0 || port > std::numeric_limits<uint16_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous port must be in [0, 65535], got ", port));
  }
  return absl::OkStatus();
}

class RendezvousImpl final : public Rendezvous {
 public:
  RendezvousImpl(c10::intrusive_ptr<c10d::TCPStore> store, std::string secret)
      : store_(std::move(store)), secret_(std::move(secret)) {}
  int port() const override { return store_->getPort(); }
  const std::string& secret() const override { return secret_; }
  const c10::intrusive_ptr<c10d::TCPStore>& store() const { return store_; }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
  const std::string secret_;
};

constexpr size_t kSecretHexDigits = 32;

// 128 bits from the kernel's CSPRNG, in hex.
absl::StatusOr<std::string> NewSecret() {
  unsigned char bytes[kSecretHexDigits / 2];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::InternalError("getrandom failed: no secret for the rendezvous");
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string secret;
  for (unsigned char b : bytes) secret += {kHex[b >> 4], kHex[b & 15]};
  return secret;
}

absl::Status CheckSecret(const std::string& secret) {
  const bool hex = std::all_of(secret.begin(), secret.end(),
                               [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
  if (secret.size() != kSecretHexDigits || !hex) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous secret must be ", kSecretHexDigits, " hex digits (the one Host drew)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Rendezvous>> OpenStore(const std::string& host, int port, bool is_server, int world_size,
                                                      const std::string& secret, std::chrono::milliseconds timeout) {
  STRATA_RETURN_IF_ERROR(CheckPort(port));
  STRATA_RETURN_IF_ERROR(CheckTimeout("rendezvous", timeout));
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = is_server;
  if (is_server) options.numWorkers = static_cast<size_t>(world_size);
  options.waitWorkers = false;  // the ranks meet when they build the group
  options.timeout = timeout;
  try {
    return std::make_unique<RendezvousImpl>(c10::make_intrusive<c10d::TCPStore>(host, options), secret);
  } catch (const std::exception& e) {
    return FromC10dException(absl::StrCat(is_server ? "host" : "join", " rendezvous at ", host, ":", port), e);
  }
}

#endif  // STRATA_HAVE_C10D

}  // namespace

const char* BackendName(Backend backend) { return backend == Backend::kNccl ? "nccl" : "gloo"; }

absl::Status ProcessGroup::CheckAvailable(Backend backend) {
  return Available(backend) ? absl::OkStatus() : NoBackend(backend);
}

std::unique_ptr<ProcessGroup> ProcessGroup::Solo() { return std::make_unique<SoloProcessGroup>(); }

absl::StatusOr<std::vector<std::unique_ptr<ProcessGroup>>> ProcessGroup::CreateInProcess(
    int ranks, std::chrono::milliseconds timeout) {
  InProcessOptions options;
  options.timeout = timeout;
  return CreateInProcess(ranks, options);
}

absl::StatusOr<std::vector<std::unique_ptr<ProcessGroup>>> ProcessGroup::CreateInProcess(
    int ranks, const InProcessOptions& in_process) {
  if (ranks < 1) return absl::InvalidArgumentError(absl::StrCat("ranks must be >= 1, got ", ranks));
  if (in_process.backend == Backend::kNccl && ranks > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NCCL ranks in one process would share GPU ", in_process.device_index,
        ", which NCCL refuses: run one worker process per GPU (the service), or use Gloo for ", ranks, " local ranks"));
  }
  std::vector<std::unique_ptr<ProcessGroup>> groups(static_cast<size_t>(ranks));
  if (ranks == 1 && !in_process.group_of_one) {
    groups[0] = Solo();
    return groups;
  }
  STRATA_RETURN_IF_ERROR(CheckAvailable(in_process.backend));
  STRATA_ASSIGN_OR_RETURN(auto host, Rendezvous::Host("127.0.0.1", 0, ranks, in_process.timeout));
  const int port = host->port();
  const std::string secret = host->secret();
  std::vector<absl::Status> statuses(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  // Each rank's group forms only when all have joined: one thread each.
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r, rendezvous = r == 0 ? std::move(host) : nullptr]() mutable {
      absl::Status& status = statuses[static_cast<size_t>(r)];
      if (rendezvous == nullptr) {
        auto joined = Rendezvous::Join("127.0.0.1", port, secret, in_process.timeout);
        if (!joined.ok()) {
          status = joined.status();
          return;
        }
        rendezvous = std::move(*joined);
      }
      ProcessGroupOptions options;
      options.rank = r;
      options.world_size = ranks;
      options.backend = in_process.backend;
      options.device_index = in_process.device_index;
      options.timeout = in_process.timeout;
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
    return absl::InvalidArgumentError(absl::StrCat("process group rank must be in [0, ", world_size, "), got ", rank));
  }
  if (device_index < 0) {
    return absl::InvalidArgumentError(absl::StrCat("process group device_index must be >= 0, got ", device_index));
  }
  return CheckTimeout("process group", timeout);
}

namespace {
#ifdef STRATA_HAVE_GLOO
absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateGloo(const ProcessGroupOptions& options,
                                                         std::unique_ptr<Rendezvous> rendezvous,
                                                         c10::intrusive_ptr<c10d::Store> store) {
  auto gloo = c10d::ProcessGroupGloo::Options::create(options.timeout);
  // Loopback for a gang on one machine; the hostname's address otherwise.
  gloo->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, options.rank, options.world_size, gloo);
  return std::unique_ptr<ProcessGroup>(new C10dProcessGroup<c10d::ProcessGroupGloo>(options, std::move(rendezvous),
                                                                                    std::move(group), at::kCPU,
                                                                                    /*has_reduce_scatter=*/false));
}
#endif

#ifdef STRATA_HAVE_NCCL
absl::StatusOr<std::unique_ptr<ProcessGroup>> CreateNccl(const ProcessGroupOptions& options,
                                                         std::unique_ptr<Rendezvous> rendezvous,
                                                         c10::intrusive_ptr<c10d::Store> store) {
  // A wait that outlives the timeout throws on the waiting thread (instead
  // of c10d's watchdog ending the process), so a dead rank is a status here
  // as it is with Gloo. Read when the group is built; forced, since the
  // gang's bounded failure depends on it. libtorch 1.x reads the name
  // without the TORCH_ prefix.
  setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/1);
  setenv("NCCL_BLOCKING_WAIT", "1", /*overwrite=*/1);
  auto nccl = c10d::ProcessGroupNCCL::Options::create();
  nccl->timeout = options.timeout;
  auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, options.rank, options.world_size, nccl);
  const at::Device device(at::kCUDA, static_cast<at::DeviceIndex>(options.device_index));
  auto wrapped = std::unique_ptr<ProcessGroup>(
      new C10dProcessGroup<c10d::ProcessGroupNCCL>(options, std::move(rendezvous), std::move(group), device,
                                                   /*has_reduce_scatter=*/true));
  // The communicator forms at the first collective: issue one now, so that
  // a missing rank or a bad device fails Create, not the first gradient sum.
  STRATA_RETURN_IF_ERROR(wrapped->Barrier());
  return wrapped;
}
#endif
}  // namespace

#ifdef STRATA_HAVE_C10D
bool ProcessGroup::Available(Backend backend) {
#ifndef STRATA_HAVE_GLOO
  if (backend == Backend::kGloo) return false;
#endif
#ifndef STRATA_HAVE_NCCL
  if (backend == Backend::kNccl) return false;
#endif
  return true;
}

absl::StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::Host(const std::string& host, int port, int world_size,
                                                             std::chrono::milliseconds timeout) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous world_size must be >= 1, got ", world_size));
  }
  STRATA_ASSIGN_OR_RETURN(const std::string secret, NewSecret());
  return OpenStore(host, port, /*is_server=*/true, world_size, secret, timeout);
}

absl::StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::Join(const std::string& host, int port,
                                                             const std::string& secret,
                                                             std::chrono::milliseconds timeout) {
  STRATA_RETURN_IF_ERROR(CheckSecret(secret));
  return OpenStore(host, port, /*is_server=*/false, 0, secret, timeout);
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Create(const ProcessGroupOptions& options,
                                                                   std::unique_ptr<Rendezvous> rendezvous) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  if (rendezvous == nullptr) return absl::InvalidArgumentError("process group needs a rendezvous");
  STRATA_RETURN_IF_ERROR(CheckAvailable(options.backend));
  auto* rendezvous_impl = static_cast<RendezvousImpl*>(rendezvous.get());
  // One group per store, its keys under the gang's secret (see Rendezvous).
  auto store = c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("strata/", rendezvous_impl->secret()),
                                                      rendezvous_impl->store());
  try {
#ifdef STRATA_HAVE_NCCL
    if (options.backend == Backend::kNccl) return CreateNccl(options, std::move(rendezvous), std::move(store));
#endif
#ifdef STRATA_HAVE_GLOO
    if (options.backend == Backend::kGloo) return CreateGloo(options, std::move(rendezvous), std::move(store));
#endif
    return NoBackend(options.backend);
  } catch (const std::exception& e) {
    return FromC10dException(absl::StrCat("process group rank ", options.rank, " of ", options.world_size, " (",
                                          BackendName(options.backend), ")"),
                             e);
  }
}

#else
bool ProcessGroup::Available(Backend) { return false; }

absl::StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::Host(const std::string&, int, int, std::chrono::milliseconds) {
  return NoBackend(Backend::kGloo);
}
absl::StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::Join(const std::string&, int, const std::string&,
                                                             std::chrono::milliseconds) {
  return NoBackend(Backend::kGloo);
}
absl::StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::Create(const ProcessGroupOptions& options,
                                                                   std::unique_ptr<Rendezvous>) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  return NoBackend(options.backend);
}
#endif  // STRATA_HAVE_C10D

}  // namespace strata::policies
