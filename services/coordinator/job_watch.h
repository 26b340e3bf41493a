// WatchJob: streams a job's events to one client, from the event after the
// client's last one, until the job has ended and said so.
#ifndef STRATA_SERVICES_COORDINATOR_JOB_WATCH_H_
#define STRATA_SERVICES_COORDINATOR_JOB_WATCH_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "services/coordinator/event_hub.h"
#include "services/rpc/executor.h"
#include "services/store/job_store.h"
#include "strata/v1/coordinator.grpc.pb.h"

namespace strata::services {

struct JobWatchContext {
  Executor& executor;  // runs the blocking store reads
  JobStore& store;
  EventHub& events;
};

// The reactor for one WatchJob call; it deletes itself when done. A
// non-OK `refused` (the caller failed authentication) finishes the call at
// once; `may_see` is asked before the first read (NOT_FOUND for another
// tenant's job).
grpc::ServerWriteReactor<strata::v1::JobEvent>* WatchJobEvents(const JobWatchContext& context,
                                                               const std::string& job_id,
                                                               const std::string& after_event_id,
                                                               const absl::Status& refused,
                                                               std::function<absl::Status()> may_see);

}  // namespace strata::services

#endif  // STRATA_SERVICES_COORDINATOR_JOB_WATCH_H_
