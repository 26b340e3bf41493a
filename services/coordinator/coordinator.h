// The Coordinator gRPC service: accepts jobs (admission.h), keeps them in
// the job store, schedules each on a gang of registered workers
// (gang_plan.h), drives the job's loop phase by phase on its ranks through
// a WorkerFleet, streams events to watchers (event_hub.h, job_watch.h), and
// recovers: a gang lost mid-job sends the job back to the queue, with a
// backoff (job_backoff.h), to resume from its last checkpoint, and a
// restarted coordinator requeues the RUNNING jobs it finds.
#ifndef STRATA_SERVICES_COORDINATOR_COORDINATOR_H_
#define STRATA_SERVICES_COORDINATOR_COORDINATOR_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "services/coordinator/event_hub.h"
#include "services/coordinator/gang_plan.h"
#include "services/coordinator/job_backoff.h"
#include "services/coordinator/job_specs.h"
#include "services/coordinator/worker_fleet.h"
#include "services/rpc/auth.h"
#include "services/rpc/executor.h"
#include "services/store/job_store.h"
#include "strata/v1/coordinator.grpc.pb.h"

namespace strata::services {

struct CoordinatorOptions {
  // Single-token mode: the bearer token clients and workers present; its
  // holder is an admin and a worker. "" with no `callers` turns auth off.
  std::string token;
  // Tenant mode (--tokens-file): token -> caller. Each tenant sees and
  // cancels only its own jobs, an admin every job; only a worker token may
  // register workers. Takes precedence over `token`.
  std::map<std::string, Caller> callers;
  // Token the coordinator presents to workers, and which workers present to
  // it ("" = `token`). In tenant mode it is the one worker credential:
  // tenants' tokens reach no worker.
  std::string worker_token;
  // TLS files for dialing workers: their CA, and the certificate presented
  // to workers that require one; empty for insecure channels.
  TlsFiles worker_tls;
  // Threads for blocking Redis calls made on behalf of RPCs.
  int rpc_threads = 8;
  // A worker whose heartbeat is older than this is gone.
  int worker_ttl_ms = 6000;
  int heartbeat_interval_ms = 1000;
  // How often the scheduler looks for queued jobs and idle workers.
  int scheduler_interval_ms = 200;
  // Most rows (prompts x responses) an iteration may decode or score on one
  // worker (its rank's share of the batch), and most tokens across them
  // (rows x (prompt + new or response tokens)).
  int64_t max_rollout_rows = 4096;
  int64_t max_rollout_tokens = int64_t{4} << 20;
  // Bounds forming a job's gang and each of its collectives: a rank that
  // died or hangs fails the others' collectives within this (c10d timeout).
  int collective_timeout_ms = 60000;
  // How lost gangs back off, and when they fail instead.
  BackoffPolicy backoff;
  // The first wait before a job's end is written again while the store is
  // unreachable; it doubles up to 5 s.
  std::chrono::milliseconds record_retry_first{100};
};

class CoordinatorService final : public strata::v1::Coordinator::CallbackService {
 public:
  // `fleet` reaches the workers; null: over gRPC, with `options`' worker
  // token, TLS files and collective timeout.
  CoordinatorService(JobStore* store, CoordinatorOptions options, std::unique_ptr<WorkerFleet> fleet = nullptr);
  ~CoordinatorService() override;

  // Requeues RUNNING jobs left by a previous coordinator and starts the
  // scheduler. Call once, before serving.
  absl::Status Start();
  // Stops scheduling and waits for running job loops to return.
  void Stop();

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context, const strata::v1::SubmitJobRequest* request,
                                      strata::v1::Job* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context, const strata::v1::GetJobRequest* request,
                                   strata::v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context, const strata::v1::ListJobsRequest* request,
                                     strata::v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context, const strata::v1::CancelJobRequest* request,
                                      strata::v1::Job* response) override;
  grpc::ServerWriteReactor<strata::v1::JobEvent>* WatchJob(grpc::CallbackServerContext* context,
                                                           const strata::v1::WatchJobRequest* request) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* context,
                                            const strata::v1::ListCheckpointsRequest* request,
                                            strata::v1::ListCheckpointsResponse* response) override;
  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const strata::v1::RegisterWorkerRequest* request,
                                           strata::v1::RegisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context, const strata::v1::HeartbeatRequest* request,
                                      strata::v1::HeartbeatResponse* response) override;

 private:
  // Runs `work` on the RPC executor unless the call is unauthenticated, then
  // finishes the reactor with its status.
  grpc::ServerUnaryReactor* Handle(grpc::CallbackServerContext* context,
                                   std::function<absl::Status(const Caller&)> work);
  absl::Status Submit(const Caller& caller, const strata::v1::SubmitJobRequest& request, strata::v1::Job* response);
  void SchedulerLoop();
  // Publishes a queued job's reason to wait, once per reason.
  void TellWaiting(const std::string& job_id, const std::string& message);
  void RunOnGang(uint64_t run, JobRecord job, std::vector<WorkerRecord> workers);
  // A gang was lost: its workers that no longer answer are deregistered
  // and kept out of gangs for a while. Returns their ids ("" when all answer).
  std::string KeepOutSilentWorkers(const std::string& job_id, const std::vector<WorkerRecord>& workers);
  // A gang failed on a full disk: the workers its error names are kept out
  // of gangs for a while (they stay registered). Returns their ids.
  std::string KeepOutWorkersNamed(const absl::Status& status, const std::vector<WorkerRecord>& workers);
  // Moves a job RUNNING on the gang `workers` (the claim's worker field) to
  // `to` and publishes `events`. While the store is unreachable it retries until
  // the write lands (or the coordinator stops): an end that was not recorded
  // would leave the job RUNNING and have the next coordinator run it again.
  // An attempt whose reply was lost may have landed, and the job been
  // claimed again since: the gang condition keeps a retry off that claim.
  void RecordOutcome(const std::string& job_id, const std::string& workers, JobState to,
                     const std::map<std::string, std::string>& fields,
                     const std::vector<std::pair<std::string, std::string>>& events);
  // Where workers resolve relative spec paths (from registration and heartbeats).
  // What a worker says of itself in each registration and heartbeat.
  void RememberWorkerDirectory(const std::string& worker_id, const std::string& dir,
                               const std::vector<std::string>& roots, const std::vector<std::string>& runs);

  JobStore* const store_;
  const CoordinatorOptions options_;
  const CallerAuthenticator auth_;
  const std::unique_ptr<WorkerFleet> fleet_;
  EventHub events_;
  JobSpecs specs_;
  Executor rpc_executor_;
  Executor watch_executor_;

  // Registered workers as idle, busy (in a gang here) or backing off, for
  // strata_workers{state}.
  std::map<std::string, int64_t> WorkerStateCounts();
  // In a gang of this coordinator, kept out after it stopped answering, or
  // free (mu_ held).
  WorkerState StateOfWorkerLocked(const std::string& id, std::chrono::steady_clock::time_point now) const;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  // The run (job loop) that holds each busy worker. A loop frees only the
  // workers it still holds: it frees each as its unload returns, and once
  // more at its end, when one may already serve another run.
  std::map<std::string, uint64_t> busy_workers_;
  // The workers of each job's loops here, by job id. A requeued job can run
  // again on a new gang while its previous loop still waits for a hung
  // rank's unload: that loop's end must not make the new gang's workers
  // look orphaned, and the old gang's workers are not the new loop's.
  std::map<std::string, std::multiset<std::string>> jobs_in_flight_;
  std::map<std::string, Backoff> job_backoff_;  // jobs requeued after a lost gang
  // Queued jobs told why they wait (too few registered workers, or behind
  // an older gang job), and what they were told, so that each reason is
  // said once.
  std::map<std::string, std::string> told_waiting_;
  // Free workers an older queued gang job holds (as of the last scheduling pass).
  std::set<std::string> held_workers_;
  std::map<std::string, Backoff> worker_backoff_;  // workers that stopped answering
  std::map<std::string, std::string> worker_directories_;
  std::map<std::string, std::vector<std::string>> worker_roots_;         // what each serves
  std::map<std::string, std::set<std::string>> worker_runs_;             // what each said it runs
  std::map<std::string, std::map<std::string, int64_t>> worker_memory_;  // tier -> bytes, by worker
  // Job loops by run number, not job id: a requeued job can be scheduled
  // again before its previous loop has been reaped.
  uint64_t next_run_ = 0;
  std::map<uint64_t, std::thread> job_threads_;
  std::set<uint64_t> finished_runs_;
  std::thread scheduler_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_COORDINATOR_COORDINATOR_H_
