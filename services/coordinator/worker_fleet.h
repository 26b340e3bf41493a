// How the coordinator reaches its workers: it forms a job's gang on them
// and asks whether a worker still answers. RemoteFleet (remote_gang.h) does
// both over gRPC; the coordinator's unit tests bring their own, so that
// its recovery paths run in milliseconds without a worker process.
#ifndef STRATA_SERVICES_COORDINATOR_WORKER_FLEET_H_
#define STRATA_SERVICES_COORDINATOR_WORKER_FLEET_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/driver/job_runner.h"
#include "services/store/job_store.h"

namespace strata::services {

// A job's gang as the coordinator holds it: the driver's Gang, and a way
// to let go of its workers.
class JobGang : public Gang {
 public:
  // Drops the job on every rank at once (best effort); `unloaded(r)` is
  // called as rank r's call returns.
  virtual void Unload(const std::function<void(int)>& unloaded) = 0;
};

class WorkerFleet {
 public:
  virtual ~WorkerFleet() = default;
  // Forms `job`'s gang, rank r on workers[r], and returns once every rank
  // has joined and loaded the job. UNAVAILABLE when a worker cannot be
  // reached (the job goes back to the queue).
  virtual absl::StatusOr<std::unique_ptr<JobGang>> StartGang(const JobRecord& job,
                                                             const std::vector<WorkerRecord>& workers) = 0;
  // Whether each of `workers` still answers; a live one answers in
  // milliseconds, a dead or stopped one is given about a second.
  virtual std::vector<bool> Answering(const std::string& job_id, const std::vector<WorkerRecord>& workers) = 0;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_COORDINATOR_WORKER_FLEET_H_
