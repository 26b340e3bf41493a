// The job store a deployment runs: Redis, one Lua script per change, so
// several coordinators (and their restarts) see one history.
//
// Key layout (all under RedisStoreOptions::key_prefix):
//   job:<id>              hash, one field per JobRecord member (+ "seq")
//   job:<id>:events       stream, entries {type, json}, capped (MAXLEN ~)
//   job:<id>:checkpoints  hash, iteration -> checkpoint dir
//   jobs                  sorted set of ids scored by creation sequence
//   jobs:state:<STATE>    sorted set per state, same scores
//   jobs:seq              counter behind the creation sequence
//   request:<request_id>  string -> job id (idempotent Create);
//                         request:<tenant>:<request_id> for a tenant's job
//   worker:<id>           hash {id, address, job_id, last_heartbeat_unix_ms}, expires
//   workers               set of registered worker ids (pruned lazily)
//
// UNAVAILABLE covers Redis down, refused, timed out or still loading its
// data set; the next call after a failure reconnects on its own.
#ifndef STRATA_SERVICES_STORE_REDIS_JOB_STORE_H_
#define STRATA_SERVICES_STORE_REDIS_JOB_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/store/job_store.h"

namespace strata::services {

struct RedisStoreOptions {
  // redis://[[user]:password@]host[:port][/db]; port defaults to 6379, db to 0.
  std::string redis_url = "redis://127.0.0.1:6379";
  // Replaces the URL's password when set (read from a file or the
  // environment, so that it appears in no command line).
  std::string password;
  // TCP connect timeout, milliseconds.
  int connect_timeout_ms = 2000;
  // Socket read/write timeout per command, milliseconds. A blocking event read
  // waits this long on top of its own block_ms.
  int command_timeout_ms = 5000;
  // Prepended to every key, so several deployments (or tests) can share one Redis.
  std::string key_prefix = "strata:";
  // Healthy connections kept open between calls. Calls running at the same
  // time each take their own connection; more than this are closed afterwards.
  int max_idle_connections = 4;
  // Approximate cap on entries kept per job event stream (XADD MAXLEN ~).
  int64_t max_events_per_job = 10000;

  // INVALID_ARGUMENT naming the field when one is out of range or the URL is malformed.
  absl::Status Validate() const;
};

// Connects and loads the scripts. INVALID_ARGUMENT for bad options,
// UNAVAILABLE (naming the address) when Redis cannot be reached. Concurrent
// calls each use their own pooled connection, so a blocking ReadEvents never
// stalls other calls.
absl::StatusOr<std::unique_ptr<JobStore>> ConnectRedisJobStore(const RedisStoreOptions& options);

}  // namespace strata::services

#endif  // STRATA_SERVICES_STORE_REDIS_JOB_STORE_H_
