// The Redis-backed job store: jobs, their state machine, progress,
// checkpoints, per-job event streams and the worker registry. The coordinator
// keeps nothing it cannot rebuild from here after a restart.
//
// Every call can fail with UNAVAILABLE (Redis down, refused, timed out, still
// loading its data set); those are safe to retry, and the next call after a
// failure reconnects on its own. Key layout (all under
// JobStoreOptions::key_prefix):
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
#ifndef STRATA_SERVICES_STORE_JOB_STORE_H_
#define STRATA_SERVICES_STORE_JOB_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::services {

enum class JobState { kQueued, kRunning, kSucceeded, kFailed, kCancelled };

// "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED".
const char* JobStateName(JobState state);
// Inverse of JobStateName; case-insensitive. INVALID_ARGUMENT for anything else.
absl::StatusOr<JobState> ParseJobState(const std::string& name);
// SUCCEEDED, FAILED and CANCELLED: a job in one of these never changes state.
bool IsTerminal(JobState state);

struct JobRecord {
  std::string id;  // assigned by JobStore::Create
  JobState state = JobState::kQueued;
  std::string algorithm;
  std::string name;
  std::string spec_yaml;
  std::string output_dir;
  int64_t iteration = 0;   // last completed iteration
  int64_t iterations = 0;  // planned total
  std::string error_code;  // FAILED jobs: a status code name
  std::string error_message;
  int64_t created_unix_ms = 0;  // Redis server clock
  int64_t updated_unix_ms = 0;
  int64_t started_unix_ms = 0;  // its first start (RUNNING); 0 before it
  // Not stored: true on the record Transition returns when that transition
  // was the job's first start.
  bool first_start = false;
  std::string worker;      // worker running it, if any
  std::string request_id;  // client's idempotency key, if any (unique per tenant)
  std::string tenant;      // who owns it ("" in single-token deployments)
  std::string checkpoint_dir;  // latest recorded checkpoint (highest iteration)
  int64_t checkpoint_iteration = 0;
  // Every run whose checkpoints this one may resume: the ended job it
  // continues and the jobs that one continued, newest first.
  std::vector<std::string> resumable_run_ids;
  std::string continued_by;  // set on an ended job once a new job continues it

  // The ended job this one continues ("" for a fresh job).
  std::string continues() const { return resumable_run_ids.empty() ? std::string() : resumable_run_ids.front(); }
};

struct JobEventRecord {
  std::string id;    // Redis stream entry id ("1700000000000-0"); resume after it
  std::string type;  // e.g. "metrics", "state"
  std::string json;
};

struct WorkerRecord {
  std::string id;
  std::string address;  // host:port of its gRPC service
  std::string job_id;   // job it is working on, "" when idle
  int64_t last_heartbeat_unix_ms = 0;  // Redis server clock; set by the store
};

struct JobStoreOptions {
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

// Thread-safe: concurrent calls each use their own pooled connection, so a
// blocking ReadEvents never stalls other calls. Every multi-key change is one
// Lua script, so it is atomic with respect to other clients and processes.
class JobStore {
 public:
  // Connects and loads the scripts. INVALID_ARGUMENT for bad options,
  // UNAVAILABLE (naming the address) when Redis cannot be reached.
  static absl::StatusOr<std::unique_ptr<JobStore>> Connect(const JobStoreOptions& options);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Creates a QUEUED job from `job` (its id, state, timestamps and error fields
  // are ignored) and returns it as stored. With a non-empty request_id, a
  // repeated call returns the job the first call created and sets
  // *created = false; this holds across concurrent callers and processes.
  // `created` may be null.
  absl::StatusOr<JobRecord> Create(JobRecord job, bool* created);

  // NOT_FOUND naming the id.
  absl::StatusOr<JobRecord> Get(const std::string& id);

  // One page of jobs, newest first, optionally only those in `state`, and the
  // token for the next page ("" on the last page). Tokens are opaque and stay
  // valid while jobs are created (no duplicates, no skips). page_size 0 means
  // 50; at most 1000. INVALID_ARGUMENT for a negative size or a bad token.
  absl::StatusOr<std::pair<std::vector<JobRecord>, std::string>> List(int page_size, const std::string& page_token,
                                                                      std::optional<JobState> state);

  // Atomically moves the job to `to` if its state is one of `from` and not
  // terminal, and its fields hold the values `expect` names (only worker:
  // the gang a run claimed the job for, so that a run's late write cannot
  // land on the next run's claim); otherwise FAILED_PRECONDITION naming the
  // current state or field. `fields` are written in the same step; allowed
  // keys: worker, error_code, error_message, output_dir, iteration,
  // iterations (INVALID_ARGUMENT for others). Returns the job as stored
  // after the change.
  absl::StatusOr<JobRecord> Transition(const std::string& id, std::vector<JobState> from, JobState to,
                                       const std::map<std::string, std::string>& fields = {},
                                       const std::map<std::string, std::string>& expect = {});

  // Records the last completed iteration. NOT_FOUND for an unknown job.
  // Accepted in any state: a late report from a cancelled job is still true.
  absl::Status SetProgress(const std::string& id, int64_t iteration);

  // Records a checkpoint written at `iteration` into `dir`. The job's
  // checkpoint_dir/checkpoint_iteration follow the highest iteration recorded;
  // recording an iteration again replaces its dir. NOT_FOUND for an unknown job.
  absl::Status RecordCheckpoint(const std::string& id, int64_t iteration, const std::string& dir);
  // All recorded checkpoints, ascending by iteration. NOT_FOUND for an unknown job.
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> ListCheckpoints(const std::string& id);

  // Appends {type, json} to the job's event stream and returns the entry id.
  // The stream keeps roughly max_events_per_job newest entries. NOT_FOUND for
  // an unknown job.
  absl::StatusOr<std::string> AppendEvent(const std::string& id, const std::string& type, const std::string& json);

  // Up to `count` (0 means 100) entries after `after_id` ("" = from the
  // start), oldest first. When there are none yet, waits up to `block_ms` for
  // one (0 = return at once) and returns an empty vector on timeout.
  // NOT_FOUND for an unknown job; INVALID_ARGUMENT for a malformed after_id.
  absl::StatusOr<std::vector<JobEventRecord>> ReadEvents(const std::string& id, const std::string& after_id, int count,
                                                         int block_ms);

  // The newest event of the job, if any. NOT_FOUND for an unknown job.
  absl::StatusOr<std::optional<JobEventRecord>> LastEvent(const std::string& id);

  // Every job in `state`, oldest first (coordinator restart recovery).
  absl::StatusOr<std::vector<JobRecord>> ListByState(JobState state);
  // How many jobs are in each state ("QUEUED" -> 3, ...), every state named.
  absl::StatusOr<std::map<std::string, int64_t>> CountByState();

  // Registers (or re-registers) a worker that is considered alive for
  // `ttl_ms` unless it heartbeats. last_heartbeat_unix_ms is set by the store.
  absl::Status RegisterWorker(const WorkerRecord& worker, int ttl_ms);
  // Extends the registration by `ttl_ms` and records the job it works on.
  // NOT_FOUND when the registration has expired (the worker must register again).
  absl::Status Heartbeat(const std::string& worker_id, const std::string& job_id, int ttl_ms);
  // Workers whose registration has not expired, sorted by id.
  absl::StatusOr<std::vector<WorkerRecord>> ListWorkers();
  // Ends a registration now (a worker that stopped answering). A live
  // worker registers again on its next heartbeat. Unknown ids are fine.
  absl::Status RemoveWorker(const std::string& worker_id);

  // Round trip to Redis.
  absl::Status Ping();

 private:
  class Impl;
  explicit JobStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_STORE_JOB_STORE_H_
