#include "services/store/memory_job_store.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "services/store/job_store_checks.h"

namespace strata::services {
namespace {

using namespace store_checks;  // NOLINT: this file implements their contract

int64_t SystemNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// "<ms>" or "<ms>-<seq>", already checked by EventCount.
std::pair<int64_t, int64_t> ParseEventId(const std::string& id) {
  int64_t ms = 0;
  int64_t seq = 0;
  const size_t dash = id.find('-');
  (void)absl::SimpleAtoi(id.substr(0, dash), &ms);
  if (dash != std::string::npos) (void)absl::SimpleAtoi(id.substr(dash + 1), &seq);
  return {ms, seq};
}

MemoryStoreOptions WithSystemClock(MemoryStoreOptions options) {
  if (!options.now_unix_ms) options.now_unix_ms = SystemNowMs;
  return options;
}

}  // namespace

MemoryJobStore::MemoryJobStore(MemoryStoreOptions options) : options_(WithSystemClock(std::move(options))) {}

MemoryJobStore::Job* MemoryJobStore::Find(const std::string& id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::StatusOr<JobRecord> MemoryJobStore::Create(JobRecord job, bool* created) {
  if (created != nullptr) *created = false;
  STRATA_RETURN_IF_ERROR(ValidateRequestId(job.tenant, job.request_id));
  for (const std::string& run : job.resumable_run_ids) STRATA_RETURN_IF_ERROR(ValidateJobId("resumable run id", run));
  const std::string continued = job.continues();
  const std::string request_key = RequestKey(job.tenant, job.request_id);
  std::lock_guard<std::mutex> lock(mu_);
  if (!job.request_id.empty()) {
    if (auto existing = requests_.find(request_key); existing != requests_.end()) {
      const Job* first = Find(existing->second);
      if (first == nullptr) {
        return absl::InternalError(
            absl::StrCat("request_id ", job.request_id, " names job ", existing->second, ", which no longer exists"));
      }
      return first->record;
    }
  }
  Job* ended = nullptr;
  if (!continued.empty()) {
    ended = Find(continued);
    if (ended == nullptr) return JobNotFound(continued);
    const JobState state = ended->record.state;
    if (state != JobState::kFailed && state != JobState::kCancelled)
      return NotContinuable(continued, JobStateName(state));
    if (!ended->record.continued_by.empty()) return ContinuedAlready(continued, ended->record.continued_by);
  }
  std::string id = NewJobId();
  for (int attempt = 0; attempt < 5 && jobs_.count(id); ++attempt) id = NewJobId();
  if (jobs_.count(id)) return absl::InternalError("could not draw an unused job id in 5 attempts");

  Job& stored = jobs_[id];
  stored.seq = next_seq_++;
  stored.record = std::move(job);
  JobRecord& r = stored.record;
  r.id = id;
  r.state = JobState::kQueued;
  r.created_unix_ms = r.updated_unix_ms = Now();
  r.started_unix_ms = 0;
  r.first_start = false;
  r.error_code.clear();
  r.error_message.clear();
  r.continued_by.clear();
  if (ended != nullptr) ended->record.continued_by = id;
  if (!r.request_id.empty()) requests_[request_key] = id;
  if (created != nullptr) *created = true;
  return r;
}

absl::StatusOr<JobRecord> MemoryJobStore::Get(const std::string& id) {
  STRATA_RETURN_IF_ERROR(ValidateJobId("job id", id));
  std::lock_guard<std::mutex> lock(mu_);
  const Job* job = Find(id);
  if (job == nullptr) return JobNotFound(id);
  return job->record;
}

absl::StatusOr<std::pair<std::vector<JobRecord>, std::string>> MemoryJobStore::List(int page_size,
                                                                                    const std::string& page_token,
                                                                                    std::optional<JobState> state) {
  STRATA_ASSIGN_OR_RETURN(page_size, PageSize(page_size));
  int64_t before = INT64_MAX;
  if (!page_token.empty()) {
    STRATA_ASSIGN_OR_RETURN(before, DecodePageToken(page_token));
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const Job*> matching;
  for (const auto& [id, job] : jobs_) {
    if (job.seq < before && (!state.has_value() || job.record.state == *state)) matching.push_back(&job);
  }
  std::sort(matching.begin(), matching.end(), [](const Job* a, const Job* b) { return a->seq > b->seq; });
  std::pair<std::vector<JobRecord>, std::string> page;
  for (size_t i = 0; i < matching.size() && i < static_cast<size_t>(page_size); ++i) {
    page.first.push_back(matching[i]->record);
  }
  if (matching.size() > static_cast<size_t>(page_size)) page.second = EncodePageToken(matching[page_size - 1]->seq);
  return page;
}

absl::StatusOr<JobRecord> MemoryJobStore::Transition(const std::string& id, std::vector<JobState> from, JobState to,
                                                     const std::map<std::string, std::string>& fields,
                                                     const std::map<std::string, std::string>& expect) {
  STRATA_RETURN_IF_ERROR(ValidateJobId("job id", id));
  STRATA_RETURN_IF_ERROR(CheckTransition(from, fields, expect));
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = Find(id);
  if (job == nullptr) return JobNotFound(id);
  JobRecord& r = job->record;
  if (IsTerminal(r.state) || std::find(from.begin(), from.end(), r.state) == from.end()) {
    return TransitionRefused(id, r.state, from, to);
  }
  for (const auto& [field, value] : expect) {  // only "worker" (CheckTransition)
    if (r.worker != value) return ClaimMoved(id, r.state, field, r.worker, value, to);
  }
  for (const auto& [field, value] : fields) {
    if (field == "worker") r.worker = value;
    if (field == "error_code") r.error_code = value;
    if (field == "error_message") r.error_message = value;
    if (field == "output_dir") r.output_dir = value;
    if (field == "iteration") (void)absl::SimpleAtoi(value, &r.iteration);
    if (field == "iterations") (void)absl::SimpleAtoi(value, &r.iterations);
  }
  r.state = to;
  r.updated_unix_ms = Now();
  JobRecord moved = r;
  moved.first_start = to == JobState::kRunning && r.started_unix_ms == 0;
  if (moved.first_start) moved.started_unix_ms = r.started_unix_ms = r.updated_unix_ms;
  return moved;
}

absl::Status MemoryJobStore::SetProgress(const std::string& id, int64_t iteration) {
  STRATA_RETURN_IF_ERROR(ValidateJobId("job id", id));
  STRATA_RETURN_IF_ERROR(ValidateIteration(iteration));
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = Find(id);
  if (job == nullptr) return JobNotFound(id);
  job->record.iteration = iteration;
  job->record.updated_unix_ms = Now();
  return absl::OkStatus();
}

absl::Status MemoryJobStore::RecordCheckpoint(const std::string& id, int64_t iteration, const std::string& dir) {
  STRATA_RETURN_IF_ERROR(ValidateJobId("job id", id));
  STRATA_RETURN_IF_ERROR(ValidateIteration(iteration));
  if (dir.empty()) return absl::InvalidArgumentError("checkpoint dir is empty");
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = Find(id);
  if (job == nullptr) return JobNotFound(id);
  job->checkpoints[iteration] = dir;
  JobRecord& r = job->record;
  if (r.checkpoint_dir.empty() || iteration >= r.checkpoint_iteration) {
    r.checkpoint_iteration = iteration;
    r.checkpoint_dir = dir;
  }
  r.updated_unix_ms = Now();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> MemoryJobStore::ListCheckpoints(const std::string& id) {
  STRATA_RETURN_IF_ERROR(ValidateJobId("job id", id));
  std::lock_guard<std::mutex> lock(mu_);
  const Job* job = Find(id);
  if (job == nullptr) return JobNotFound(id);
  return std::vector<std::pair<int64_t, std::string>>(job->checkpoints.begin(), job->checkpoints.end());
}

absl::StatusOr<std::string> MemoryJobStore::AppendEvent(const std::string& id, const std::string& type,
                                                        const std::string& json) {
  STRATA_RETURN_IF_ERROR(ValidateJobId("job id", id));
  if (type.empty()) return absl::InvalidArgumentError("event type is empty");
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = Find(id);
  if (job == nullptr) return JobNotFound(id);
  // Ids grow as Redis's do: the clock's millisecond, or a sequence within the
  // last one when the clock has not moved on.
  const int64_t now = Now();
  last_event_ = now > last_event_.first ? EventId{now, 0} : EventId{last_event_.first, last_event_.second + 1};
  const std::string entry_id = absl::StrCat(last_event_.first, "-", last_event_.second);
  job->events[last_event_] = JobEventRecord{entry_id, type, json};
  const int64_t cap = std::max<int64_t>(options_.max_events_per_job, 1);
  while (static_cast<int64_t>(job->events.size()) > cap) job->events.erase(job->events.begin());
  appended_.notify_all();
  return entry_id;
}

absl::StatusOr<std::vector<JobEventRecord>> MemoryJobStore::ReadEvents(const std::string& id,
                                                                       const std::string& after_id, int count,
                                                                       int block_ms) {
  STRATA_RETURN_IF_ERROR(ValidateJobId("job id", id));
  STRATA_ASSIGN_OR_RETURN(count, EventCount(after_id, count, block_ms));
  const EventId after = after_id.empty() ? EventId{0, 0} : ParseEventId(after_id);
  std::unique_lock<std::mutex> lock(mu_);
  if (Find(id) == nullptr) return JobNotFound(id);
  std::vector<JobEventRecord> events;
  auto collect = [&] {
    const Job* job = Find(id);
    if (job == nullptr) return false;
    for (auto it = job->events.upper_bound(after);
         it != job->events.end() && events.size() < static_cast<size_t>(count); ++it) {
      events.push_back(it->second);
    }
    return !events.empty();
  };
  if (!collect() && block_ms > 0) appended_.wait_for(lock, std::chrono::milliseconds(block_ms), collect);
  return events;
}

absl::StatusOr<std::optional<JobEventRecord>> MemoryJobStore::LastEvent(const std::string& id) {
  STRATA_RETURN_IF_ERROR(ValidateJobId("job id", id));
  std::lock_guard<std::mutex> lock(mu_);
  const Job* job = Find(id);
  if (job == nullptr) return JobNotFound(id);
  if (job->events.empty()) return std::optional<JobEventRecord>();
  return std::optional<JobEventRecord>(job->events.rbegin()->second);
}

absl::StatusOr<std::vector<JobRecord>> MemoryJobStore::ListByState(JobState state) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const Job*> matching;
  for (const auto& [id, job] : jobs_) {
    if (job.record.state == state) matching.push_back(&job);
  }
  std::sort(matching.begin(), matching.end(), [](const Job* a, const Job* b) { return a->seq < b->seq; });
  std::vector<JobRecord> records;
  for (const Job* job : matching) records.push_back(job->record);
  return records;
}

absl::StatusOr<std::map<std::string, int64_t>> MemoryJobStore::CountByState() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, int64_t> counts;
  for (const JobState state : kAllStates) counts[JobStateName(state)] = 0;
  for (const auto& [id, job] : jobs_) ++counts[JobStateName(job.record.state)];
  return counts;
}

void MemoryJobStore::PruneWorkers() {
  const int64_t now = Now();
  // As Redis expires a key: once its time has passed.
  std::erase_if(workers_, [now](const auto& entry) { return entry.second.expires_unix_ms < now; });
}

absl::Status MemoryJobStore::RegisterWorker(const WorkerRecord& worker, int ttl_ms) {
  STRATA_RETURN_IF_ERROR(ValidateWorkerId(worker.id));
  STRATA_RETURN_IF_ERROR(ValidateTtl(ttl_ms));
  std::lock_guard<std::mutex> lock(mu_);
  Worker& registered = workers_[worker.id];
  registered.record = worker;
  registered.record.last_heartbeat_unix_ms = Now();
  registered.expires_unix_ms = registered.record.last_heartbeat_unix_ms + ttl_ms;
  return absl::OkStatus();
}

absl::Status MemoryJobStore::Heartbeat(const std::string& worker_id, const std::string& job_id, int ttl_ms) {
  STRATA_RETURN_IF_ERROR(ValidateWorkerId(worker_id));
  STRATA_RETURN_IF_ERROR(ValidateTtl(ttl_ms));
  std::lock_guard<std::mutex> lock(mu_);
  PruneWorkers();
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return WorkerNotRegistered(worker_id);
  it->second.record.job_id = job_id;
  it->second.record.last_heartbeat_unix_ms = Now();
  it->second.expires_unix_ms = it->second.record.last_heartbeat_unix_ms + ttl_ms;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<WorkerRecord>> MemoryJobStore::ListWorkers() {
  std::lock_guard<std::mutex> lock(mu_);
  PruneWorkers();
  std::vector<WorkerRecord> workers;
  for (const auto& [id, worker] : workers_) workers.push_back(worker.record);  // sorted by id: a map
  return workers;
}

absl::Status MemoryJobStore::RemoveWorker(const std::string& worker_id) {
  STRATA_RETURN_IF_ERROR(ValidateWorkerId(worker_id));
  std::lock_guard<std::mutex> lock(mu_);
  workers_.erase(worker_id);
  return absl::OkStatus();
}

absl::Status MemoryJobStore::Ping() { return absl::OkStatus(); }

}  // namespace strata::services
