// The coordinator's handle on one rank of a job, held by a worker process:
// the Worker API's calls (proto/strata/v1/worker.proto) for that job. The
// rank runs the job's phases itself (services/rank/job_rank.h); the
// coordinator sends phase names and scalars, never tensors.
//
// A worker that cannot be reached or does not answer in time (UNAVAILABLE
// or DEADLINE_EXCEEDED on the channel) surfaces as UNAVAILABLE naming the
// worker's address: the coordinator reads that code as "worker lost" and
// requeues the job. Every other error keeps the code the worker sent, with
// the address and the method prepended to the message.
//
// Thread-safety: calls may be made from any thread; each is independent.
// The worker itself runs one operation at a time.
#ifndef STRATA_SERVICES_COORDINATOR_REMOTE_RANK_H_
#define STRATA_SERVICES_COORDINATOR_REMOTE_RANK_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/phase/phase.h"
#include "strata/v1/worker.grpc.pb.h"

namespace strata::services {

struct RemoteRankOptions {
  // host:port of the worker; named in every error.
  std::string address;
  // The job whose models the worker holds; sent with every call.
  std::string job_id;
  // Ended jobs whose checkpoints this job continues (StartRank).
  std::vector<std::string> resumable_run_ids;
  // Sent as "authorization: Bearer <token>"; "" sends no credentials.
  std::string token;
  // Deadline of calls that run model work: StartRank and RunPhase. Loading
  // a 7B model or an update that streams weights from NVMe takes minutes.
  std::chrono::milliseconds work_timeout = std::chrono::minutes(10);
  // Deadline of bookkeeping calls: OpenRendezvous, GetStats, Unload. They
  // queue behind any running operation on the worker, so this is generous
  // too.
  std::chrono::milliseconds control_timeout = std::chrono::minutes(2);

  // INVALID_ARGUMENT naming the field: empty address or job id, timeouts <= 0.
  absl::Status Validate() const;
};

class RemoteRank final {
 public:
  // Dials options.address with `credentials` (grpc::InsecureChannelCredentials()
  // for plain TCP) and a message limit fit for big batches. The channel
  // connects lazily: an unreachable worker shows up on the first call.
  static absl::StatusOr<std::unique_ptr<RemoteRank>> Create(RemoteRankOptions options,
                                                            std::shared_ptr<grpc::ChannelCredentials> credentials);
  // Over an existing channel (in-process channels, tests). options.address
  // is used only in errors.
  RemoteRank(std::shared_ptr<grpc::ChannelInterface> channel, RemoteRankOptions options);

  // What StartRank tells about the worker's side of the file system.
  struct Loaded {
    std::string tokenizer_path;     // as the worker resolved it
    std::string working_directory;  // where it resolves relative spec paths
  };
  // Where rank 0's rendezvous listens and the secret its keys are under.
  struct RendezvousPoint {
    std::string host;
    int port = 0;
    std::string secret;
  };
  // The gang calls (see worker.proto): rank 0's rendezvous (its host is
  // left for the caller); joining the gang as `rank` of `world_size` and
  // loading the job; one phase.
  absl::StatusOr<RendezvousPoint> OpenRendezvous(int world_size, std::chrono::milliseconds timeout);
  absl::StatusOr<Loaded> StartRank(const std::string& spec_yaml, int rank, int world_size,
                                   const RendezvousPoint& rendezvous, std::chrono::milliseconds timeout);
  absl::StatusOr<PhaseReply> RunPhase(const PhaseRequest& request);
  // Drops the job's models on the worker.
  absl::Status Unload();
  // What the worker is doing and its memory per tier.
  absl::StatusOr<strata::v1::WorkerStats> GetStats();

  // Cancels the calls in flight (from other threads); they, and any later
  // call that is cancelled, return UNAVAILABLE: the worker counts as lost.
  // For a gang whose rank hangs after another rank failed.
  void CancelCalls();

  // Whether the worker process answers at all (its health service, which
  // needs no token and does not queue behind model work) within `timeout`.
  // After a gang fails, it tells the rank that died from those that only
  // lost their peer.
  bool Answers(std::chrono::milliseconds timeout) const;

  const RemoteRankOptions& options() const { return options_; }

 private:
  // One unary call with `timeout` as its deadline and the bearer token; the
  // status in the worker API's terms (see the file comment).
  template <typename Request, typename Response>
  absl::Status Call(const char* method,
                    grpc::Status (strata::v1::Worker::Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
                    std::chrono::milliseconds timeout, const Request& request, Response* response) const;

  const RemoteRankOptions options_;
  std::shared_ptr<grpc::ChannelInterface> channel_;
  std::unique_ptr<strata::v1::Worker::Stub> stub_;
  mutable std::mutex calls_mu_;
  mutable std::set<grpc::ClientContext*> active_;  // calls in flight; guarded by calls_mu_
  std::atomic<bool> cancelled_{false};
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_COORDINATOR_REMOTE_RANK_H_
