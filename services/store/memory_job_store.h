// A job store in this process's memory: what unit tests of the coordinator
// run, in milliseconds, without a Redis. It keeps JobStore's contract (the
// suite in tests/services/store/job_store_contract_test.cc runs against it
// and against Redis), but nothing survives the process.
#ifndef STRATA_SERVICES_STORE_MEMORY_JOB_STORE_H_
#define STRATA_SERVICES_STORE_MEMORY_JOB_STORE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "services/store/job_store.h"

namespace strata::services {

struct MemoryStoreOptions {
  // Wall clock for timestamps and worker registrations; tests pass their
  // own to expire a registration without waiting.
  std::function<int64_t()> now_unix_ms;
  // Entries kept per job event stream (the newest).
  int64_t max_events_per_job = 10000;
};

class MemoryJobStore final : public JobStore {
 public:
  explicit MemoryJobStore(MemoryStoreOptions options = {});

  // Always OK: there is nothing to reach.
  absl::Status Ping() override;

  // Jobs and their state machine.
  absl::StatusOr<JobRecord> Create(JobRecord job, bool* created) override;
  absl::StatusOr<JobRecord> Get(const std::string& id) override;
  absl::StatusOr<std::pair<std::vector<JobRecord>, std::string>> List(int page_size, const std::string& page_token,
                                                                      std::optional<JobState> state) override;
  absl::StatusOr<std::vector<JobRecord>> ListByState(JobState state) override;
  absl::StatusOr<std::map<std::string, int64_t>> CountByState() override;
  absl::StatusOr<JobRecord> Transition(const std::string& id, std::vector<JobState> from, JobState to,
                                       const std::map<std::string, std::string>& fields,
                                       const std::map<std::string, std::string>& expect) override;

  // Events.
  absl::StatusOr<std::string> AppendEvent(const std::string& id, const std::string& type,
                                          const std::string& json) override;
  absl::StatusOr<std::vector<JobEventRecord>> ReadEvents(const std::string& id, const std::string& after_id, int count,
                                                         int block_ms) override;
  absl::StatusOr<std::optional<JobEventRecord>> LastEvent(const std::string& id) override;

  // Progress and checkpoints.
  absl::Status SetProgress(const std::string& id, int64_t iteration) override;
  absl::Status RecordCheckpoint(const std::string& id, int64_t iteration, const std::string& dir) override;
  absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> ListCheckpoints(const std::string& id) override;

  // Workers.
  absl::Status RegisterWorker(const WorkerRecord& worker, int ttl_ms) override;
  absl::Status Heartbeat(const std::string& worker_id, const std::string& job_id, int ttl_ms) override;
  absl::StatusOr<std::vector<WorkerRecord>> ListWorkers() override;
  absl::Status RemoveWorker(const std::string& worker_id) override;

 private:
  // A stream entry id, ordered as Redis orders them.
  using EventId = std::pair<int64_t, int64_t>;
  struct Job {
    JobRecord record;
    int64_t seq = 0;  // creation sequence: List's order and page tokens
    std::map<int64_t, std::string> checkpoints;
    std::map<EventId, JobEventRecord> events;
  };
  struct Worker {
    WorkerRecord record;
    int64_t expires_unix_ms = 0;
  };

  int64_t Now() const { return options_.now_unix_ms(); }
  // The job, or nullptr (mu_ held).
  Job* Find(const std::string& id);
  // Drops expired registrations (mu_ held).
  void PruneWorkers();

  const MemoryStoreOptions options_;
  std::mutex mu_;
  std::condition_variable appended_;  // an event was appended to some job
  int64_t next_seq_ = 1;
  EventId last_event_{0, 0};
  std::map<std::string, Job> jobs_;
  std::map<std::string, std::string> requests_;  // request key -> job id
  std::map<std::string, Worker> workers_;
};

}  // namespace strata::services

#endif  // STRATA_SERVICES_STORE_MEMORY_JOB_STORE_H_
