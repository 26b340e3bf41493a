// A job's gang of remote workers, as the coordinator drives it: rank 0
// opens the rendezvous, every rank joins and loads the job (StartRank),
// then each phase goes to every rank at once and their scalar replies are
// checked against each other and merged.
//
// Errors: a rank that cannot be reached is UNAVAILABLE naming it (the
// coordinator requeues the job); the other ranks then fail their next
// collective within the collective timeout, and Unload, queued behind that,
// frees them. Replies that disagree on a global metric, or lack what their
// phase must report, are INTERNAL naming the rank: a faulty worker fails
// the job, not the coordinator.
#ifndef STRATA_SERVICES_COORDINATOR_REMOTE_GANG_H_
#define STRATA_SERVICES_COORDINATOR_REMOTE_GANG_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/coordinator/remote_rank.h"
#include "services/coordinator/worker_fleet.h"
#include "services/rpc/auth.h"

namespace strata::services {

class RemoteGang final : public JobGang {
 public:
  // `workers[r]` becomes rank r. Returns once every rank has joined and
  // loaded the job; `collective_timeout` bounds forming the gang and every
  // collective in it. Once one rank has ended a phase (done or failed), the
  // others get the collective timeout and a margin to end theirs: in a
  // phase that ends in a collective, ranks drift apart by at most the
  // collective timeout anyway. A rank still busy after it hangs; its call
  // is cancelled (UNAVAILABLE: the job is requeued), so such a phase never
  // waits on a hung rank for longer. Loading and the phases that end in no
  // collective (PhaseEndsInCollective: rollout, evaluate, rank 0's
  // checkpoint and output writes) may honestly take one rank longer
  // (generations of other lengths, a colder or slower disk): a rank still
  // busy there is given up only when it stops answering a health check
  // (1 s), asked once a period, or at once when another rank failed.
  static absl::StatusOr<std::unique_ptr<RemoteGang>> Start(std::vector<std::unique_ptr<RemoteRank>> workers,
                                                           const std::string& spec_yaml,
                                                           std::chrono::milliseconds collective_timeout);

  absl::StatusOr<PhaseReply> Run(const PhaseRequest& request) override;
  // Each rank's error is logged.
  void Unload(const std::function<void(int)>& unloaded) override;

 private:
  RemoteGang(std::vector<std::unique_ptr<RemoteRank>> workers, std::chrono::milliseconds grace)
      : workers_(std::move(workers)), grace_(grace) {}
  // Whether a phase's ranks meet in a collective at its end.
  enum class Ending { kInCollective, kWithoutCollective };
  // Runs `call(rank)` on every rank at once; the first cause of failure.
  template <typename T, typename Call>
  absl::StatusOr<std::vector<T>> OnEveryRank(Call call, Ending ending);

  std::vector<std::unique_ptr<RemoteRank>> workers_;
  const std::chrono::milliseconds grace_;  // after a rank failed, for the others
};

struct RemoteFleetOptions {
  std::string token;  // the bearer token workers accept from the coordinator
  TlsFiles tls;       // for dialing workers; empty for insecure channels
  // Bounds forming a gang and each of its collectives (RemoteGang::Start).
  std::chrono::milliseconds collective_timeout{60000};
};

// The workers as the coordinator reaches them: over gRPC, one RemoteRank
// each.
std::unique_ptr<WorkerFleet> MakeRemoteFleet(RemoteFleetOptions options);

// The host part of a "host:port" (or "[v6]:port") address.
std::string AddressHost(const std::string& address);

// Checks phase replies of every rank against each other: the global metrics
// (all but time/*, memory/* and mean shares) and the text must agree, and
// each phase must report what the driver reads from it. INTERNAL naming the
// rank otherwise.
absl::Status CheckPhaseReplies(const PhaseRequest& request, const std::vector<PhaseReply>& replies);

}  // namespace strata::services

#endif  // STRATA_SERVICES_COORDINATOR_REMOTE_GANG_H_
