// The job store: jobs, their state machine, progress, checkpoints, per-job
// event streams and the worker registry. The coordinator keeps nothing it
// cannot rebuild from here after a restart.
//
// JobStore is the contract; RedisJobStore (redis_job_store.h) is what a
// deployment runs, MemoryJobStore (memory_job_store.h) what unit tests of
// the coordinator run. One contract suite (tests/services/store/
// job_store_contract_test.cc) runs against both, so the two cannot drift.
//
// Every call can fail with UNAVAILABLE (the backing service down, refused,
// timed out); those are safe to retry.
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
  std::string worker;          // worker running it, if any
  std::string request_id;      // client's idempotency key, if any (unique per tenant)
  std::string tenant;          // who owns it ("" in single-token deployments)
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
  std::string address;                 // host:port of its gRPC service
  std::string job_id;                  // job it is working on, "" when idle
  int64_t last_heartbeat_unix_ms = 0;  // Redis server clock; set by the store
};

// Thread-safe; a blocking ReadEvents never stalls other calls. Every change
// is atomic with respect to other callers (and, for Redis, other processes).
class JobStore {
 public:
  virtual ~JobStore() = default;

  // Creates a QUEUED job from `job` (its id, state, timestamps and error fields
  // are ignored) and returns it as stored. With a non-empty request_id, a
  // repeated call returns the job the first call created and sets
  // *created = false; this holds across concurrent callers and processes.
  // `created` may be null.
  virtual absl::StatusOr<JobRecord> Create(JobRecord job, bool* created) = 0;

  // NOT_FOUND naming the id.
  virtual absl::StatusOr<JobRecord> Get(const std::string& id) = 0;

  // One page of jobs, newest first, optionally only those in `state`, and the
  // token for the next page ("" on the last page). Tokens are opaque and stay
  // valid while jobs are created (no duplicates, no skips). page_size 0 means
  // 50; at most 1000. INVALID_ARGUMENT for a negative size or a bad token.
  virtual absl::StatusOr<std::pair<std::vector<JobRecord>, std::string>> List(int page_size,
                                                                              const std::string& page_token,
                                                                              std::optional<JobState> state) = 0;

  // Atomically moves the job to `to` if its state is one of `from` and not
  // terminal, and its fields hold the values `expect` names (only worker:
  // the gang a run claimed the job for, so that a run's late write cannot
  // land on the next run's claim); otherwise FAILED_PRECONDITION naming the
  // current state or field. `fields` are written in the same step; allowed
  // keys: worker, error_code, error_message, output_dir, iteration,
  // iterations (INVALID_ARGUMENT for others). Returns the job as stored
  // after the change.
  virtual absl::StatusOr<JobRecord> Transition(const std::string& id, std::vector<JobState> from, JobState to,
                                               const std::map<std::string, std::string>& fields = {},
                                               const std::map<std::string, std::string>& expect = {}) = 0;

  // Records the last completed iteration. NOT_FOUND for an unknown job.
  // Accepted in any state: a late report from a cancelled job is still true.
  virtual absl::Status SetProgress(const std::string& id, int64_t iteration) = 0;

  // Records a checkpoint written at `iteration` into `dir`. The job's
  // checkpoint_dir/checkpoint_iteration follow the highest iteration recorded;
  // recording an iteration again replaces its dir. NOT_FOUND for an unknown job.
  virtual absl::Status RecordCheckpoint(const std::string& id, int64_t iteration, const std::string& dir) = 0;
  // All recorded checkpoints, ascending by iteration. NOT_FOUND for an unknown job.
  virtual absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> ListCheckpoints(const std::string& id) = 0;

  // Appends {type, json} to the job's event stream and returns the entry id.
  // The stream keeps about the store's cap of newest entries. NOT_FOUND for
  // an unknown job.
  virtual absl::StatusOr<std::string> AppendEvent(const std::string& id, const std::string& type,
                                                  const std::string& json) = 0;

  // Up to `count` (0 means 100) entries after `after_id` ("" = from the
  // start), oldest first. When there are none yet, waits up to `block_ms` for
  // one (0 = return at once) and returns an empty vector on timeout.
  // NOT_FOUND for an unknown job; INVALID_ARGUMENT for a malformed after_id.
  virtual absl::StatusOr<std::vector<JobEventRecord>> ReadEvents(const std::string& id, const std::string& after_id,
                                                                 int count, int block_ms) = 0;

  // The newest event of the job, if any. NOT_FOUND for an unknown job.
  virtual absl::StatusOr<std::optional<JobEventRecord>> LastEvent(const std::string& id) = 0;

  // Every job in `state`, oldest first (coordinator restart recovery).
  virtual absl::StatusOr<std::vector<JobRecord>> ListByState(JobState state) = 0;
  // How many jobs are in each state ("QUEUED" -> 3, ...), every state named.
  virtual absl::StatusOr<std::map<std::string, int64_t>> CountByState() = 0;

  // Registers (or re-registers) a worker that is considered alive for
  // `ttl_ms` unless it heartbeats. last_heartbeat_unix_ms is set by the store.
  virtual absl::Status RegisterWorker(const WorkerRecord& worker, int ttl_ms) = 0;
  // Extends the registration by `ttl_ms` and records the job it works on.
  // NOT_FOUND when the registration has expired (the worker must register again).
  virtual absl::Status Heartbeat(const std::string& worker_id, const std::string& job_id, int ttl_ms) = 0;
  // Workers whose registration has not expired, sorted by id.
  virtual absl::StatusOr<std::vector<WorkerRecord>> ListWorkers() = 0;
  // Ends a registration now (a worker that stopped answering). A live
  // worker registers again on its next heartbeat. Unknown ids are fine.
  virtual absl::Status RemoveWorker(const std::string& worker_id) = 0;

  // Round trip to the backing service.
  virtual absl::Status Ping() = 0;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_STORE_JOB_STORE_H_
