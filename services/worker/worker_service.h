// The Worker gRPC service: one process's models for one job at a time,
// served over proto/strata/v1/worker.proto. The models and the work are a
// LocalWorkerGroup; this class adds the wire format, job-id checks, auth
// and threading.
//
// Threading: model work (loading, generation, forward/backward) runs for
// seconds to minutes, so no handler does it on gRPC's callback thread.
// Every call that touches the models is queued, in arrival order, to one
// thread owned by the service, which finishes the call's reactor when done.
// One job at a time per worker and one operation at a time per job: the
// models are not safe for concurrent use, and a worker's memory budget is
// planned for one operation. GetStats is answered at once from figures the
// work thread publishes, so a busy worker still says what it is doing.
#ifndef STRATA_SERVICES_WORKER_WORKER_SERVICE_H_
#define STRATA_SERVICES_WORKER_WORKER_SERVICE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "policies/dist/process_group.h"
#include "services/rank/job_rank.h"
#include "services/rank/local_worker_group.h"
#include "services/rpc/auth.h"
#include "services/rpc/executor.h"
#include "strata/v1/worker.grpc.pb.h"

namespace strata::services {

struct WorkerServiceOptions {
  // Reported by GetStats; the coordinator's registry uses the same name.
  std::string worker_id;
  // Bearer token callers must present; "" turns authentication off.
  std::string token;
  // This worker's NVMe tier and device budget, used for jobs whose spec
  // leaves memory.nvme_dir / memory.device_mib unset.
  std::string nvme_dir;
  int64_t device_budget_mib = 0;
  // Confinement: every path a job's spec names must resolve inside one of
  // these (PERMISSION_DENIED naming the key); nvme_dir is always allowed.
  // Empty: no confinement (in-process use and tests of the service alone).
  std::vector<std::string> data_roots;
  // What this worker accepts whatever the coordinator admitted
  // (RESOURCE_EXHAUSTED naming the key); zeros: no limit.
  policies::JobLimits limits;
  // What jobs' remote reward sources may reach (--allow-reward-host,
  // --reward-secret): nothing by default.
  RewardAccess reward_access;
};

class WorkerService final : public strata::v1::Worker::CallbackService {
 public:
  explicit WorkerService(WorkerServiceOptions options);
  // Calls Shutdown().
  ~WorkerService() override;
  WorkerService(const WorkerService&) = delete;
  WorkerService& operator=(const WorkerService&) = delete;

  // Finishes queued calls with UNAVAILABLE, waits for the running one, and
  // drops the models. Calls that arrive afterwards fail with UNAVAILABLE.
  // Idempotent. grpc::Server::Shutdown waits for every started call to be
  // finished, so call this before or while the server shuts down, and
  // destroy the service only after the server.
  void Shutdown();

  // What heartbeats report: the loaded job, or the job whose rank is
  // loading ("" when idle), and a number that changes whenever a job is
  // dropped or loaded.
  std::pair<std::string, uint64_t> LoadedJob();
  // Stops and drops `job_id` if it is still what was loaded as of
  // `generation`: the running operation is interrupted at its next decoding
  // step or layer (CANCELLED), then the job is dropped. The coordinator asks
  // for this when the job was cancelled or no job loop of its own owns it
  // (a gang lost with a previous coordinator); the generation keeps a job
  // loaded since the heartbeat safe.
  void DropOrphan(const std::string& job_id, uint64_t generation);

  // Rank 0 of a gang: opens the rendezvous on a free port (held for the
  // job's StartRank). A gang call for a new job drops a job still held from
  // a gang that was lost (its Unload never arrived): the coordinator assigns
  // only workers it counts as idle.
  grpc::ServerUnaryReactor* OpenRendezvous(grpc::CallbackServerContext* context,
                                           const strata::v1::OpenRendezvousRequest* request,
                                           strata::v1::OpenRendezvousResponse* response) override;
  // Joins the gang, loads the models and the job's data (JobRank). Returns
  // once every rank has joined; DEADLINE_EXCEEDED when they do not within
  // the request's timeout. Drops a stale job as OpenRendezvous does.
  grpc::ServerUnaryReactor* StartRank(grpc::CallbackServerContext* context, const strata::v1::StartRankRequest* request,
                                      strata::v1::StartRankResponse* response) override;
  // One phase on this rank: FAILED_PRECONDITION before StartRank and for a
  // job id other than the loaded one, INTERNAL (the exception's message)
  // when libtorch throws.
  grpc::ServerUnaryReactor* RunPhase(grpc::CallbackServerContext* context, const strata::v1::PhaseRequest* request,
                                     strata::v1::PhaseReply* response) override;
  // Answered on the callback thread: worker id, the loaded job ("" when
  // idle), device bytes now, and peak bytes per tier of the current phase as
  // of the last finished operation.
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context, const strata::v1::GetStatsRequest* request,
                                     strata::v1::WorkerStats* response) override;
  // Drops the job's models. OK when nothing is loaded; FAILED_PRECONDITION
  // for another job's id.
  grpc::ServerUnaryReactor* Unload(grpc::CallbackServerContext* context, const strata::v1::UnloadRequest* request,
                                   strata::v1::UnloadResponse* response) override;

 private:
  // Checks auth, then queues `work` for the work thread and finishes the call
  // with its status there. `work` runs only on the work thread.
  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* context, std::function<absl::Status()> work);
  // Submit for a call on the loaded job: checks `job_id` first.
  grpc::ServerUnaryReactor* SubmitForJob(grpc::CallbackServerContext* context, const std::string& job_id,
                                         std::function<absl::Status(LocalWorkerGroup&)> work);
  // Runs one queued call's work: auth already checked; exceptions become INTERNAL.
  absl::Status RunWork(grpc::CallbackServerContext* context, const std::function<absl::Status()>& work);
  // Publishes the loaded job and its current phase's peaks for GetStats.
  void PublishStats();
  // Publishes the job whose rank is loading, so that a cancel (through the
  // heartbeat) or an unload reaches the load; PublishStats ends that.
  void PublishLoading();
  // Drops the job: its rank, models and gang, in that order.
  void DropJob();
  // Interrupts the running operation if the job loaded as of `generation` is
  // still loaded (false otherwise); DropJob clears the interrupt.
  bool InterruptJob(uint64_t generation);
  // Drops a job other than `assigned` left from a lost gang, with a warning.
  void DropStaleJob(const std::string& assigned);
  // The spec of a job being loaded, with this worker's defaults filled in.
  absl::StatusOr<policies::JobSpec> ParseSpec(const std::string& job_id, const std::string& yaml);

  const WorkerServiceOptions options_;
  const TokenAuthenticator auth_;

  // Guards executor_ against Submit racing Shutdown.
  std::mutex executor_mu_;
  std::unique_ptr<Executor> executor_;  // one thread; null after Shutdown
  std::atomic<bool> stopping_{false};

  // Touched only on the work thread.
  std::unique_ptr<policies::Rendezvous> rendezvous_;  // rank 0, until StartRank
  std::unique_ptr<policies::ProcessGroup> gang_;
  std::unique_ptr<LocalWorkerGroup> group_;
  std::unique_ptr<JobRank> rank_;
  std::string job_id_;
  std::string phase_;

  // What GetStats reports, copied from the work thread's state.
  std::mutex stats_mu_;
  std::string published_job_id_;
  uint64_t published_generation_ = 0;
  // Incremented by DropJob, which every load calls first; with the process's
  // interrupt flag, guarded by interrupt_mu_ (a heartbeat thread and the
  // work thread both touch them).
  std::mutex interrupt_mu_;
  uint64_t generation_ = 0;
  std::map<std::string, int64_t> published_peaks_;
  // The loaded job's device (monitors live for the whole process).
  offload::DeviceMemoryMonitor* published_monitor_ = nullptr;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_WORKER_WORKER_SERVICE_H_
