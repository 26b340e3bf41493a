#include "services/coordinator/coordinator.h"

#include <chrono>
#include <optional>
#include <tuple>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "policies/job/job_spec.h"
#include "policies/job/memory_plan.h"
#include "policies/tokenizer/unicode.h"
#include "services/driver/job_runner.h"
#include "services/coordinator/gang_plan.h"
#include "services/coordinator/remote_gang.h"
#include "services/coordinator/remote_rank.h"
#include "services/rpc/wire.h"
#include "services/telemetry/service_metrics.h"

namespace strata::services {
namespace v1 = strata::v1;

strata::v1::JobState ToProtoState(JobState state) {
  switch (state) {
    case JobState::kQueued: return v1::QUEUED;
    case JobState::kRunning: return v1::RUNNING;
    case JobState::kSucceeded: return v1::SUCCEEDED;
    case JobState::kFailed: return v1::FAILED;
    case JobState::kCancelled: return v1::CANCELLED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

void ToProto(const JobRecord& r, v1::Job* job) {
  job->set_id(r.id);
  job->set_state(ToProtoState(r.state));
  job->set_algorithm(r.algorithm);
  job->set_name(r.name);
  job->set_iteration(r.iteration);
  job->set_iterations(r.iterations);
  job->set_error_code(r.error_code);
  job->set_error_message(r.error_message);
  job->set_created_unix_ms(r.created_unix_ms);
  job->set_updated_unix_ms(r.updated_unix_ms);
  job->set_started_unix_ms(r.started_unix_ms);
  job->set_worker(r.worker);
  job->set_spec_yaml(r.spec_yaml);
  job->set_output_dir(r.output_dir);
  job->set_continues(r.continues());
  job->set_continued_by(r.continued_by);
}

namespace {

// The state a "state" event announces (nullopt for any other event, or
// JSON without a known state).
std::optional<JobState> AnnouncedState(const JobEventRecord& e, const nlohmann::json& j) {
  if (e.type != "state" || !j.is_object() || !j.contains("state") || !j["state"].is_string()) return std::nullopt;
  auto state = ParseJobState(j["state"].get<std::string>());
  return state.ok() ? std::optional<JobState>(*state) : std::nullopt;
}

}  // namespace

// Streams a job's events: reads what Redis has after the client's last event,
// writes them one by one, and when it has caught up parks until the job
// publishes more. Exactly one step (a read on the executor, a write, or
// parking) is in progress at a time, and that step owns the next one, so
// Finish is called once.
class WatchReactor final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  WatchReactor(CoordinatorService* service, std::string job_id, std::string after, Caller caller)
      : service_(service), job_id_(std::move(job_id)), last_(std::move(after)), caller_(std::move(caller)) {}

  void Read() {
    service_->watch_executor_.Submit([this] {
      if (cancelled_.load()) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
      if (!allowed_) {
        if (auto job = service_->GetVisible(caller_, job_id_); !job.ok()) return Finish(ToGrpcStatus(job.status()));
        allowed_ = true;
      }
      auto events = service_->store_->ReadEvents(job_id_, last_, 64, /*block_ms=*/0);
      if (!events.ok()) return Finish(ToGrpcStatus(events.status()));
      pending_ = std::move(*events);
      next_ = 0;
      if (!pending_.empty()) {
        reread_ = false;
        return WriteNext();
      }
      // Caught up: a terminal job has nothing more to say once its final
      // state event is out (writing it ends the stream).
      auto job = service_->store_->Get(job_id_);
      if (!job.ok()) return Finish(ToGrpcStatus(job.status()));
      if (IsTerminal(job->state)) {
        auto last = service_->store_->LastEvent(job_id_);
        if (!last.ok()) return Finish(ToGrpcStatus(last.status()));
        // Appended since the read above (the final state event, as a rule):
        // read it before deciding anything. Once: a client's after-id past
        // the newest event must not spin here.
        if (last->has_value() && (*last)->id != last_ && !reread_) {
          reread_ = true;
          return Read();
        }
        if (FinalEventIsOut(*last)) return Finish(grpc::Status::OK);
      }
      if (!service_->Park(job_id_, this)) Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
    });
  }

  bool cancelled() const { return cancelled_.load(); }

  void Wake() { Read(); }

  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
    if (next_ < pending_.size()) return WriteNext();
    if (stop_after_write_) return Finish(grpc::Status::OK);
    Read();
  }

  void OnCancel() override {
    cancelled_.store(true);
    // If parked, nothing else will move this reactor: finish it here.
    if (service_->Unpark(job_id_, this)) Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    const JobEventRecord& e = pending_[next_++];
    last_ = e.id;
    event_.Clear();
    event_.set_id(e.id);
    event_.set_type(e.type);
    event_.set_json(e.json);
    const nlohmann::json j = nlohmann::json::parse(e.json, nullptr, false);
    if (j.is_object() && j.contains("iteration") && j["iteration"].is_number_integer()) {
      event_.set_iteration(j["iteration"].get<int64_t>());
    }
    if (const auto state = AnnouncedState(e, j)) {
      event_.set_state(ToProtoState(*state));
      if (IsTerminal(*state)) stop_after_write_ = true;
    }
    StartWrite(&event_);
  }

  // A job's end is recorded before its final state event is appended: a
  // watcher that catches up in between waits for that event (Publish, or
  // the scheduler's sweep of parked watchers, wakes it), so that the stream
  // does not end without the state it ended in. `last`, the job's newest
  // event, is the caller's newest too (Read checks): if it is a terminal
  // state, it was written (to this caller or, resuming, to an earlier
  // stream). The wait is bounded for a coordinator that died between the
  // two. (Before Read compared the ids, a final event appended between its
  // read and this check ended the stream unwritten.)
  bool FinalEventIsOut(const std::optional<JobEventRecord>& last) {
    if (last.has_value()) {
      const auto state = AnnouncedState(*last, nlohmann::json::parse(last->json, nullptr, false));
      if (state.has_value() && IsTerminal(*state)) return true;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!terminal_seen_.has_value()) terminal_seen_ = now;
    return now - *terminal_seen_ >= std::chrono::seconds(5);
  }

  CoordinatorService* const service_;
  const std::string job_id_;
  std::string last_;
  std::vector<JobEventRecord> pending_;
  size_t next_ = 0;
  v1::JobEvent event_;
  const Caller caller_;
  bool allowed_ = false;  // the caller may see the job (checked on the first read)
  std::optional<std::chrono::steady_clock::time_point> terminal_seen_;
  bool stop_after_write_ = false;
  bool reread_ = false;  // caught up, read again for an event newer than last_
  std::atomic<bool> cancelled_{false};
};

namespace {

// Gang losses in a row, before an iteration and with every worker
// answering, after which a job fails instead of going back to the queue:
// about 8 s of retries at the backoff's 0.5, 1, 2, 4 s.
constexpr int kMaxLossesWithAllAnswering = 5;

// Who may call: the tenants' tokens and the worker token, or in
// single-token mode one token that is both admin and worker.
std::map<std::string, Caller> AuthenticatedCallers(const CoordinatorOptions& options) {
  std::map<std::string, Caller> callers = options.callers;
  if (callers.empty()) {
    if (!options.token.empty()) callers[options.token] = Caller{"", /*admin=*/true, /*worker=*/true};
    return callers;
  }
  if (!options.worker_token.empty()) callers[options.worker_token] = Caller{"", /*admin=*/false, /*worker=*/true};
  return callers;
}

bool MayUseJobs(const Caller& caller) { return caller.admin || !caller.tenant.empty(); }

}  // namespace

CoordinatorService::CoordinatorService(JobStore* store, CoordinatorOptions options)
    : store_(store),
      options_(std::move(options)),
      auth_(AuthenticatedCallers(options_)),
      rpc_executor_(options_.rpc_threads),
      watch_executor_(options_.rpc_threads) {}

CoordinatorService::~CoordinatorService() { Stop(); }

absl::Status CoordinatorService::Start() {
  STRATA_ASSIGN_OR_RETURN(auto running, store_->ListByState(JobState::kRunning));
  for (const JobRecord& job : running) {
    // The loop that ran it died with the previous coordinator; its
    // checkpoints are on disk, so it resumes when scheduled again.
    auto requeued = store_->Transition(job.id, {JobState::kRunning}, JobState::kQueued, {{"worker", ""}});
    if (requeued.ok()) {
      Publish(job.id, "log", nlohmann::json{{"message", "coordinator restarted; job requeued"}}.dump());
      STRATA_LOG(Info) << "requeued " << job.id << " after a coordinator restart";
    }
  }
  ServiceMetrics& metrics = ServiceMetrics::Global();
  metrics.SetJobStateSource([this]() -> std::map<std::string, int64_t> {
    auto counts = store_->CountByState();
    return counts.ok() ? *counts : std::map<std::string, int64_t>{};
  });
  metrics.SetWorkerStateSource([this] { return WorkerStateCounts(); });
  scheduler_ = std::thread([this] { SchedulerLoop(); });
  return absl::OkStatus();
}

void CoordinatorService::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  ServiceMetrics::Global().SetJobStateSource(nullptr);
  ServiceMetrics::Global().SetWorkerStateSource(nullptr);
  if (scheduler_.joinable()) scheduler_.join();
  std::map<uint64_t, std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(job_threads_);
  }
  for (auto& [id, t] : threads) t.join();
  WakeAllWatchers();
}

grpc::ServerUnaryReactor* CoordinatorService::Handle(grpc::CallbackServerContext* context,
                                                     std::function<absl::Status(const Caller&)> work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto caller = auth_.Identify(context);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  rpc_executor_.Submit(
      [reactor, caller = *caller, work = std::move(work)] { reactor->Finish(ToGrpcStatus(work(caller))); });
  return reactor;
}

absl::StatusOr<JobRecord> CoordinatorService::GetVisible(const Caller& caller, const std::string& id) {
  if (!MayUseJobs(caller)) return absl::PermissionDeniedError("a worker credential cannot read jobs");
  STRATA_ASSIGN_OR_RETURN(auto job, store_->Get(id));
  if (!caller.admin && job.tenant != caller.tenant) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  return job;
}

absl::Status CoordinatorService::Submit(const Caller& caller, const v1::SubmitJobRequest& request,
                                        v1::Job* response) {
  if (!MayUseJobs(caller)) return absl::PermissionDeniedError("a worker credential cannot submit jobs");
  std::vector<std::string> overrides(request.overrides().begin(), request.overrides().end());
  STRATA_ASSIGN_OR_RETURN(auto yaml, policies::ApplyOverrides(request.spec_yaml(), overrides, "spec"));
  STRATA_ASSIGN_OR_RETURN(auto spec, policies::ParseJobSpec(yaml, {}, "spec"));
  if (spec.parallel.workers > 1) {
    STRATA_ASSIGN_OR_RETURN(auto registered, store_->ListWorkers());
    if (static_cast<int64_t>(registered.size()) < spec.parallel.workers) {
      return absl::ResourceExhaustedError(absl::StrCat("spec key 'parallel.workers' asks for ", spec.parallel.workers,
                                                       " workers; ", registered.size(), " are registered"));
    }
  }
  // Admission against what the workers reported at registration: the
  // largest worker's figures, since any of them may be picked.
  std::map<std::string, int64_t> largest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, memory] : worker_memory_) {
      for (const auto& [tier, bytes] : memory) largest[tier] = std::max(largest[tier], bytes);
    }
  }
  policies::JobLimits limits;
  limits.max_rows = options_.max_rollout_rows;
  limits.max_tokens = options_.max_rollout_tokens;
  limits.max_host_mib = largest["host"] >> 20;
  limits.max_device_mib = largest["device"] >> 20;
  STRATA_RETURN_IF_ERROR(policies::CheckJobLimits(spec, limits, "workers accept"));
  // Paths resolve on the workers, which report a missing model or data file
  // when they start the job (naming the spec key); the coordinator opens no
  // job file. What the memory planner predicts at the job's peak (model
  // states, activations, KV cache, staging: `strata plan`) must fit too.
  // That needs the models' config.json and is skipped where the coordinator
  // cannot see them.
  const std::string worker_dir = AnyWorkerDirectory();
  const policies::JobSpec resolved = worker_dir.empty() ? spec : policies::ResolvePaths(spec, worker_dir);
  if (!worker_dir.empty()) {
    auto models = policies::JobModels(resolved);
    if (models.ok()) {
      const policies::JobPrediction plan = policies::PredictJob(resolved, *models, policies::BuiltInHardwareFigures(),
                                                                spec.parallel.workers);
      // Host: the process's predicted peak RSS (the arena, mapped model
      // files, and on a CPU device the device tier too), what the OOM
      // killer would see.
      const std::pair<const char*, int64_t> needs[] = {
          {"host", plan.process_rss_bytes}, {"device", plan.peak[0]}, {"nvme", plan.peak[2]}};
      for (const auto& [tier, bytes] : needs) {
        auto offer = largest.find(tier);
        if (offer != largest.end() && offer->second > 0 && bytes > offer->second) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "spec key 'models': at its peak the job needs ", bytes >> 20, " MiB of ", tier,
              std::string(tier) == "nvme" ? " space" : " memory",
              " per worker (strata plan: model states, activations, KV cache, staging), but the largest worker "
              "offers ",
              offer->second >> 20, " MiB; `strata plan SPEC --fit ...` finds a placement that fits"));
        }
      }
    }
  }

  JobRecord job;
  job.algorithm = policies::AlgorithmName(spec.algorithm);
  job.name = spec.name;
  job.spec_yaml = yaml;
  job.output_dir = spec.output_dir;
  job.iterations = spec.train.iterations;
  job.request_id = request.request_id();
  job.tenant = caller.tenant;
  if (!request.continue_job_id().empty()) {
    // A job that ended before its end (a failure, a cancel) continues in a
    // new job from its newest checkpoint, which the new job may resume as
    // its own (with those of the jobs the ended one continued). The store
    // checks the ended state and claims the continuation (once) atomically
    // with the creation.
    STRATA_ASSIGN_OR_RETURN(auto ended, GetVisible(caller, request.continue_job_id()));
    if (ended.tenant != caller.tenant) {
      return absl::FailedPreconditionError(absl::StrCat("job ", ended.id, " belongs to tenant '", ended.tenant,
                                                        "'; only its tenant can continue it"));
    }
    // It writes where the ended job wrote: its metrics file goes on from
    // the checkpoint's line, and its checkpoints join the ended job's.
    STRATA_ASSIGN_OR_RETURN(auto ended_spec,
                            policies::ParseJobSpec(ended.spec_yaml, {}, absl::StrCat("job ", ended.id)));
    for (const auto& [key, now, then] : {std::tuple<const char*, std::string, std::string>{
                                             "output.dir", spec.output_dir, ended_spec.output_dir},
                                         {"checkpoint.dir", spec.checkpoint.dir, ended_spec.checkpoint.dir}}) {
      if (now != then) {
        return absl::InvalidArgumentError(absl::StrCat("spec key '", key, "' is '", now, "' where job ", ended.id,
                                                       " had '", then, "': a job continues where the job it "
                                                       "continues wrote"));
      }
    }
    job.resumable_run_ids = ended.resumable_run_ids;
    job.resumable_run_ids.insert(job.resumable_run_ids.begin(), ended.id);
    job.checkpoint_dir = ended.checkpoint_dir;
    job.checkpoint_iteration = ended.checkpoint_iteration;
    job.iteration = ended.checkpoint_iteration;
  }
  bool created = false;
  STRATA_ASSIGN_OR_RETURN(auto stored, store_->Create(job, &created));
  if (created) Publish(stored.id, "state", nlohmann::json{{"state", "QUEUED"}}.dump());
  ToProto(stored, response);
  cv_.notify_all();
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* CoordinatorService::SubmitJob(grpc::CallbackServerContext* context,
                                                        const v1::SubmitJobRequest* request, v1::Job* response) {
  return Handle(context, [this, request, response](const Caller& caller) { return Submit(caller, *request, response); });
}

grpc::ServerUnaryReactor* CoordinatorService::GetJob(grpc::CallbackServerContext* context,
                                                     const v1::GetJobRequest* request, v1::Job* response) {
  return Handle(context, [this, request, response](const Caller& caller) -> absl::Status {
    if (request->job_id().empty()) return absl::InvalidArgumentError("job_id is required");
    STRATA_ASSIGN_OR_RETURN(auto job, GetVisible(caller, request->job_id()));
    ToProto(job, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::ListJobs(grpc::CallbackServerContext* context,
                                                       const v1::ListJobsRequest* request,
                                                       v1::ListJobsResponse* response) {
  return Handle(context, [this, request, response](const Caller& caller) -> absl::Status {
    if (!MayUseJobs(caller)) return absl::PermissionDeniedError("a worker credential cannot list jobs");
    if (request->page_size() < 0 || request->page_size() > 200) {
      return absl::InvalidArgumentError("page_size must be in [0, 200]");
    }
    std::optional<JobState> state;
    if (request->state() != v1::JOB_STATE_UNSPECIFIED) {
      auto parsed = ParseJobState(v1::JobState_Name(request->state()));
      if (!parsed.ok()) return absl::InvalidArgumentError("state is not a job state");
      state = *parsed;
    }
    // A tenant's page is filled from as many store pages as it takes; each
    // store page is consumed whole, so the store's token stays exact.
    const int want = request->page_size() == 0 ? 20 : request->page_size();
    std::string token = request->page_token();
    do {
      STRATA_ASSIGN_OR_RETURN(auto page, store_->List(want - response->jobs_size(), token, state));
      for (const JobRecord& r : page.first) {
        if (!caller.admin && r.tenant != caller.tenant) continue;
        // Summaries: a page of full specs could outgrow any message limit.
        v1::Job* job = response->add_jobs();
        ToProto(r, job);
        job->clear_spec_yaml();
      }
      token = page.second;
    } while (!token.empty() && response->jobs_size() < want);
    response->set_next_page_token(token);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::CancelJob(grpc::CallbackServerContext* context,
                                                        const v1::CancelJobRequest* request, v1::Job* response) {
  return Handle(context, [this, request, response](const Caller& caller) -> absl::Status {
    STRATA_RETURN_IF_ERROR(GetVisible(caller, request->job_id()).status());
    STRATA_ASSIGN_OR_RETURN(
        auto job, store_->Transition(request->job_id(), {JobState::kQueued, JobState::kRunning}, JobState::kCancelled));
    Publish(job.id, "state", nlohmann::json{{"state", "CANCELLED"}}.dump());
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_backoff_.erase(job.id);
    }
    ToProto(job, response);
    return absl::OkStatus();
  });
}

grpc::ServerWriteReactor<v1::JobEvent>* CoordinatorService::WatchJob(grpc::CallbackServerContext* context,
                                                                     const v1::WatchJobRequest* request) {
  auto caller = auth_.Identify(context);
  auto* reactor = new WatchReactor(this, request->job_id(), request->after_event_id(),
                                   caller.ok() ? *caller : Caller());
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  reactor->Read();
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ListCheckpoints(grpc::CallbackServerContext* context,
                                                              const v1::ListCheckpointsRequest* request,
                                                              v1::ListCheckpointsResponse* response) {
  return Handle(context, [this, request, response](const Caller& caller) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(auto job, GetVisible(caller, request->job_id()));
    // The jobs it continues first, oldest first: a later job's checkpoint
    // of the same iteration replaces an earlier one's on disk.
    std::map<int64_t, std::string> by_iteration;
    std::vector<std::string> runs(job.resumable_run_ids.rbegin(), job.resumable_run_ids.rend());
    runs.push_back(job.id);
    for (const std::string& run : runs) {
      STRATA_ASSIGN_OR_RETURN(auto list, store_->ListCheckpoints(run));
      for (const auto& [iteration, dir] : list) by_iteration[iteration] = dir;
    }
    for (const auto& [iteration, dir] : by_iteration) {
      auto* c = response->add_checkpoints();
      c->set_iteration(iteration);
      c->set_dir(dir);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::RegisterWorker(grpc::CallbackServerContext* context,
                                                             const v1::RegisterWorkerRequest* request,
                                                             v1::RegisterWorkerResponse* response) {
  return Handle(context, [this, request, response](const Caller& caller) -> absl::Status {
    if (!caller.worker) return absl::PermissionDeniedError("only a worker credential may register workers");
    if (request->worker_id().empty() || request->address().empty()) {
      return absl::InvalidArgumentError("worker_id and address are required");
    }
    RememberWorkerDirectory(request->worker_id(), request->working_directory());
    {
      std::lock_guard<std::mutex> lock(mu_);
      worker_memory_[request->worker_id()] = {request->memory_bytes().begin(), request->memory_bytes().end()};
    }
    WorkerRecord worker;
    worker.id = request->worker_id();
    worker.address = request->address();
    STRATA_RETURN_IF_ERROR(store_->RegisterWorker(worker, options_.worker_ttl_ms));
    response->set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
    cv_.notify_all();
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CoordinatorService::Heartbeat(grpc::CallbackServerContext* context,
                                                        const v1::HeartbeatRequest* request,
                                                        v1::HeartbeatResponse* response) {
  return Handle(context, [this, request, response](const Caller& caller) -> absl::Status {
    if (!caller.worker) return absl::PermissionDeniedError("only a worker credential may heartbeat");
    RememberWorkerDirectory(request->worker_id(), request->working_directory());
    STRATA_RETURN_IF_ERROR(store_->Heartbeat(request->worker_id(), request->job_id(), options_.worker_ttl_ms));
    if (!request->job_id().empty()) {
      // Reconciliation: a worker holding a job that no loop here runs on it
      // holds it for nobody (its gang was lost, maybe with a previous
      // coordinator).
      bool in_flight;
      {
        std::lock_guard<std::mutex> lock(mu_);
        const auto loops = jobs_in_flight_.find(request->job_id());
        in_flight = loops != jobs_in_flight_.end() && loops->second.count(request->worker_id()) > 0;
      }
      // A cancelled job's loop is still in flight until the worker's current
      // phase returns: the worker interrupts it at its next step or layer.
      auto job = in_flight ? store_->Get(request->job_id()) : absl::StatusOr<JobRecord>();
      response->set_cancel(!in_flight || (job.ok() && job->state == JobState::kCancelled));
    }
    return absl::OkStatus();
  });
}

namespace {

// Workers a queued job needs (parallel.workers); 1 for a spec that no longer parses.
int64_t GangSize(const JobRecord& job) {
  auto spec = policies::ParseJobSpec(job.spec_yaml, {}, "job");
  return spec.ok() ? spec->parallel.workers : 1;
}

}  // namespace

void CoordinatorService::TellWaiting(const std::string& job_id, const std::string& message) {
  {
    std::lock_guard<std::mutex> guard(mu_);
    auto [told, added] = told_waiting_.emplace(job_id, message);
    if (!added && told->second == message) return;
    told->second = message;
  }
  Publish(job_id, "log", nlohmann::json{{"message", message}}.dump());
}

void CoordinatorService::SchedulerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    // Reap loops that have returned.
    for (uint64_t run : finished_runs_) {
      auto it = job_threads_.find(run);
      if (it != job_threads_.end()) {
        it->second.join();
        job_threads_.erase(it);
      }
    }
    finished_runs_.clear();
    lock.unlock();
    // Redis is only called with mu_ released: heartbeats and RPC handlers take it.
    auto queued = store_->ListByState(JobState::kQueued);
    auto workers = store_->ListWorkers();
    if (queued.ok() && workers.ok()) {
      // Stable: jobs submitted in the same millisecond keep their order.
      std::stable_sort(queued->begin(), queued->end(),
                       [](const JobRecord& a, const JobRecord& b) { return a.created_unix_ms < b.created_unix_ms; });
      std::vector<QueuedGangJob> jobs;
      for (const JobRecord& job : *queued) {
        QueuedGangJob& planned = jobs.emplace_back();
        planned.id = job.id;
        planned.tenant = job.tenant;
        planned.workers = GangSize(job);
      }
      std::set<std::string> held_by_workers;  // jobs the workers' heartbeats name
      for (const WorkerRecord& w : *workers) held_by_workers.insert(w.job_id);
      std::map<std::string, const WorkerRecord*> by_id;
      for (const WorkerRecord& w : *workers) by_id[w.id] = &w;
      // Plan under the lock (the busy and kept-out workers are its state) and
      // mark the chosen workers busy; claim the jobs in Redis after it.
      GangPlan plan;
      std::vector<uint64_t> runs(jobs.size(), 0);
      {
        std::lock_guard<std::mutex> guard(mu_);
        const auto now = std::chrono::steady_clock::now();
        for (size_t i = 0; i < jobs.size(); ++i) {
          QueuedGangJob& job = jobs[i];
          auto b = job_backoff_.find(job.id);
          job.backing_off = b != job_backoff_.end() && b->second.until > now;
          // A continuation starts once the run it continues has stopped: a
          // cancelled or failed run is recorded before its ranks stop.
          const std::string ended = (*queued)[i].continues();
          if (!ended.empty() && (jobs_in_flight_.count(ended) || held_by_workers.count(ended))) job.waits_for = ended;
        }
        std::vector<SchedulableWorker> states;
        for (const WorkerRecord& w : *workers) states.push_back({w.id, StateOfWorkerLocked(w.id, now)});
        plan = PlanGangs(jobs, states);
        // What a job was told is forgotten once it says nothing new or has
        // left the queue, so that the next reason to wait is told again.
        std::erase_if(told_waiting_, [&](const auto& told) {
          return std::none_of(plan.decisions.begin(), plan.decisions.end(), [&](const GangDecision& d) {
            return d.job_id == told.first && !d.waiting.empty();
          });
        });
        for (size_t i = 0; i < jobs.size(); ++i) {
          const GangDecision& decision = plan.decisions[i];
          if (decision.gang.empty()) continue;
          runs[i] = next_run_++;
          for (const std::string& w : decision.gang) busy_workers_[w] = runs[i];
        }
        held_workers_ = plan.held;
      }
      for (size_t i = 0; i < jobs.size(); ++i) {
        const JobRecord& job = (*queued)[i];
        const GangDecision& decision = plan.decisions[i];
        if (!decision.waiting.empty()) TellWaiting(job.id, decision.waiting);
        if (decision.gang.empty()) continue;  // stays QUEUED
        const uint64_t run = runs[i];
        std::vector<WorkerRecord> gang;
        for (const std::string& id : decision.gang) gang.push_back(*by_id.at(id));
        std::string ids;
        for (const WorkerRecord& w : gang) ids += (ids.empty() ? "" : ",") + w.id;
        auto running = store_->Transition(job.id, {JobState::kQueued}, JobState::kRunning, {{"worker", ids}});
        // Once a job, at its first start: a requeue's wait is not a queue's,
        // and a continuation that starts from inherited checkpoints is new.
        if (running.ok() && running->first_start) {
          ServiceMetrics::Global().ObserveQueueWait(
              static_cast<double>(running->started_unix_ms - running->created_unix_ms) / 1000.0);
        }
        std::lock_guard<std::mutex> guard(mu_);
        if (!running.ok()) {  // cancelled or taken meanwhile
          for (const WorkerRecord& w : gang) busy_workers_.erase(w.id);
          continue;
        }
        for (const WorkerRecord& w : gang) jobs_in_flight_[job.id].insert(w.id);
        job_threads_[run] = std::thread([this, run, r = *running, gang] {
          Publish(r.id, "state", nlohmann::json{{"state", "RUNNING"}, {"worker", r.worker}}.dump());
          RunOnGang(run, r, gang);
        });
      }
    } else {
      STRATA_LOG(Warning) << "scheduler: " << (queued.ok() ? workers.status() : queued.status());
    }
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(options_.scheduler_interval_ms));
    lock.unlock();
    WakeAllWatchers();  // lets parked watchers notice jobs that ended
    lock.lock();
  }
}

void CoordinatorService::RunOnGang(uint64_t run, JobRecord job, std::vector<WorkerRecord> workers) {
  auto release = [&](const WorkerRecord& worker) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto held = busy_workers_.find(worker.id); held != busy_workers_.end() && held->second == run) {
      busy_workers_.erase(held);
    }
    cv_.notify_all();
  };
  auto finish = [&] {
    for (const WorkerRecord& w : workers) release(w);
    std::lock_guard<std::mutex> lock(mu_);
    if (auto loops = jobs_in_flight_.find(job.id); loops != jobs_in_flight_.end()) {
      for (const WorkerRecord& w : workers) {
        if (auto one = loops->second.find(w.id); one != loops->second.end()) loops->second.erase(one);
      }
      if (loops->second.empty()) jobs_in_flight_.erase(loops);
    }
    finished_runs_.insert(run);
    cv_.notify_all();
  };
  std::string names;
  for (const WorkerRecord& w : workers) names += (names.empty() ? "" : ", ") + w.id;
  std::unique_ptr<RemoteGang> gang;  // set once every rank has joined
  bool progressed = false;           // an iteration completed in this run
  auto run_job = [&]() -> absl::Status {
    auto spec = policies::ParseJobSpec(job.spec_yaml, {}, absl::StrCat("job ", job.id));
    if (!spec.ok()) return spec.status();
    STRATA_ASSIGN_OR_RETURN(auto channel_credentials, MakeChannelCredentials(options_.worker_tls));
    std::vector<std::unique_ptr<RemoteRank>> ranks;
    for (const WorkerRecord& worker : workers) {
      RemoteRankOptions remote;
      remote.address = worker.address;
      remote.token = options_.worker_token.empty() ? options_.token : options_.worker_token;
      remote.job_id = job.id;
      remote.resumable_run_ids = job.resumable_run_ids;
      STRATA_ASSIGN_OR_RETURN(auto rank, RemoteRank::Create(remote, channel_credentials));
      ranks.push_back(std::move(rank));
    }
    STRATA_ASSIGN_OR_RETURN(gang, RemoteGang::Start(std::move(ranks), job.spec_yaml,
                                                    std::chrono::milliseconds(options_.collective_timeout_ms)));
    // The loop below opens no file: data, tokenizer, checkpoints and the
    // metrics file are the ranks'; only scalars come back.
    JobRunOptions run;
    run.resume = true;  // a requeued job continues from its last checkpoint
    run.own_checkpoint = job.checkpoint_dir;
    run.on_metrics = [&](const nlohmann::json& line) {
      progressed = true;
      Publish(job.id, "metrics", line.dump());
      if (auto seconds = line.find("time/iteration_s"); seconds != line.end() && seconds->is_number()) {
        ServiceMetrics::Global().CountIteration(job.algorithm, seconds->get<double>());
      }
      if (line.contains("iteration")) (void)store_->SetProgress(job.id, line["iteration"].get<int64_t>() + 1);
    };
    run.on_checkpoint = [&](int64_t iteration, const std::string& dir) {
      (void)store_->RecordCheckpoint(job.id, iteration, dir);
    };
    run.cancelled = [&] {
      auto current = store_->Get(job.id);
      return current.ok() && current->state == JobState::kCancelled;
    };
    return RunJob(*spec, *gang, run);
  };
  // The loop runs JSON code on what workers say; an exception there fails
  // this job (and unloads its workers), never the coordinator and its other jobs.
  absl::Status status;
  try {
    status = run_job();
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("job ", job.id, " on workers ", names, ": ", e.what()));
  }
  // Workers' messages carry what they read (paths, replies): bytes that are
  // not UTF-8 would make the events' JSON throw here, out of the try, and
  // the recorded error unreadable to clients (proto3 strings are UTF-8).
  status = absl::Status(status.code(), policies::ToValidUtf8Lossy(std::string(status.message())));

  using nlohmann::json;
  auto fail = [&](absl::StatusCode code_of_failure, const std::string& error) {
    const std::string code = absl::StatusCodeToString(code_of_failure);
    RecordOutcome(job.id, job.worker, JobState::kFailed, {{"error_code", code}, {"error_message", error}},
                  {{"state", json{{"state", "FAILED"}, {"error_code", code}, {"error", error}}.dump()}});
    std::lock_guard<std::mutex> lock(mu_);
    job_backoff_.erase(job.id);
  };
  if (status.ok()) {
    // Progress reports may have been lost (Redis down); the end is not.
    RecordOutcome(job.id, job.worker, JobState::kSucceeded, {{"iteration", std::to_string(job.iterations)}},
                  {{"state", json{{"state", "SUCCEEDED"}}.dump()}});
    std::lock_guard<std::mutex> lock(mu_);
    job_backoff_.erase(job.id);
    for (const WorkerRecord& w : workers) worker_backoff_.erase(w.id);
  } else if (status.code() == absl::StatusCode::kCancelled) {
    // CancelJob already recorded the state and the event.
  } else if (status.code() == absl::StatusCode::kUnavailable || status.code() == absl::StatusCode::kDeadlineExceeded) {
    // A worker is gone (or a rank's collective timed out with it): back to
    // the queue; the next run resumes from the last checkpoint on a new gang.
    std::string lost;
    std::chrono::milliseconds retry_in{0};
    BackOffAfterLoss(job.id, workers, &lost, &retry_in);
    // Every worker answering, yet the gang failed again and again before an
    // iteration: no worker was lost, so another try is the same try (ranks
    // that cannot reach rank 0's rendezvous address, a port blocked between
    // them). Fail the job with the cause rather than requeue it for ever.
    int losses = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Backoff& b = job_backoff_[job.id];
      b.losses_with_all_answering = lost.empty() ? (progressed ? 0 : b.losses_with_all_answering) + 1 : 0;
      losses = b.losses_with_all_answering;
    }
    if (losses >= kMaxLossesWithAllAnswering) {
      fail(status.code(),
           absl::StrCat("gang (", names, ") failed ", losses,
                        " times in a row before an iteration, every worker answering: ", status.message(),
                        "; check that the workers reach each other (rank 0's address, the ports c10d picks)"));
    } else {
      const std::string message =
          absl::StrCat("gang (", names, ") lost: ", status.message(), lost.empty() ? "" : "; not answering: ", lost,
                       "; job requeued, retried in ", retry_in.count() / 1000.0, " s");
      RecordOutcome(job.id, job.worker, JobState::kQueued, {{"worker", ""}},
                    {{"log", json{{"message", message}}.dump()}, {"state", json{{"state", "QUEUED"}}.dump()}});
    }
  } else {
    fail(status.code(), std::string(status.message()));
  }
  // The job's state is recorded first: a rank that hangs answers Unload only
  // at its deadline, and the requeued job must not wait for it. Each worker
  // becomes schedulable again as its unload returns.
  if (gang != nullptr) gang->Unload([&](int r) { release(workers[static_cast<size_t>(r)]); });
  finish();
}

std::map<std::string, int64_t> CoordinatorService::WorkerStateCounts() {
  auto workers = store_->ListWorkers();
  if (!workers.ok()) return {};
  std::map<std::string, int64_t> counts = {{"idle", 0}, {"busy", 0}, {"backoff", 0}, {"held", 0}};
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  for (const WorkerRecord& worker : *workers) {
    switch (StateOfWorkerLocked(worker.id, now)) {
      case WorkerState::kBusy: ++counts["busy"]; break;
      case WorkerState::kKeptOut: ++counts["backoff"]; break;
      case WorkerState::kFree: ++counts[held_workers_.count(worker.id) ? "held" : "idle"]; break;
    }
  }
  return counts;
}

WorkerState CoordinatorService::StateOfWorkerLocked(const std::string& id,
                                                    std::chrono::steady_clock::time_point now) const {
  if (busy_workers_.count(id)) return WorkerState::kBusy;
  auto b = worker_backoff_.find(id);
  return b != worker_backoff_.end() && b->second.until > now ? WorkerState::kKeptOut : WorkerState::kFree;
}

namespace {

// 0.5 s after the first failure, doubling up to 30 s.
std::chrono::milliseconds BackoffDelay(int failures) {
  const int shift = std::min(failures - 1, 6);
  return std::min(std::chrono::milliseconds(500) * (1 << shift), std::chrono::milliseconds(30000));
}

}  // namespace

void CoordinatorService::BackOffAfterLoss(const std::string& job_id, const std::vector<WorkerRecord>& workers,
                                          std::string* lost, std::chrono::milliseconds* retry_in) {
  // Probe every worker of the gang at once; a live one answers in
  // milliseconds, a dead or stopped one is given a second.
  std::vector<char> answers(workers.size(), 0);
  auto credentials = MakeChannelCredentials(options_.worker_tls);
  std::vector<std::thread> probes;
  for (size_t i = 0; i < workers.size() && credentials.ok(); ++i) {
    probes.emplace_back([&, i] {
      RemoteRankOptions remote;
      remote.address = workers[i].address;
      remote.job_id = job_id;
      auto worker = RemoteRank::Create(remote, *credentials);
      answers[i] = worker.ok() && (*worker)->Answers(std::chrono::seconds(1));
    });
  }
  for (auto& t : probes) t.join();
  const auto now = std::chrono::steady_clock::now();
  for (size_t i = 0; i < workers.size(); ++i) {
    if (answers[i]) continue;
    absl::StrAppend(lost, lost->empty() ? "" : ", ", workers[i].id);
    // A live worker registers again on its next heartbeat; it still waits
    // out its backoff before it joins a gang.
    if (absl::Status s = store_->RemoveWorker(workers[i].id); !s.ok()) {
      STRATA_LOG(Warning) << "deregistering " << workers[i].id << ": " << s;
    }
    std::lock_guard<std::mutex> lock(mu_);
    Backoff& b = worker_backoff_[workers[i].id];
    b.until = now + BackoffDelay(++b.failures);
  }
  std::lock_guard<std::mutex> lock(mu_);
  Backoff& b = job_backoff_[job_id];
  *retry_in = BackoffDelay(++b.failures);
  b.until = now + *retry_in;
}

void CoordinatorService::RecordOutcome(const std::string& job_id, const std::string& workers, JobState to,
                                       const std::map<std::string, std::string>& fields,
                                       const std::vector<std::pair<std::string, std::string>>& events) {
  std::chrono::milliseconds delay(100);
  for (int attempt = 1;; ++attempt) {
    auto moved = store_->Transition(job_id, {JobState::kRunning}, to, fields, {{"worker", workers}});
    bool recorded = moved.ok();
    if (!recorded && moved.status().code() == absl::StatusCode::kFailedPrecondition) {
      // Cancelled meanwhile, or an earlier attempt landed but its reply was lost.
      auto current = store_->Get(job_id);
      if (!current.ok() || current->state != to || attempt == 1) return;
      recorded = true;
    }
    if (recorded) {
      for (const auto& [type, json] : events) Publish(job_id, type, json);
      if (attempt > 1) STRATA_LOG(Info) << job_id << ": " << JobStateName(to) << " recorded on attempt " << attempt;
      return;
    }
    if (moved.status().code() != absl::StatusCode::kUnavailable) {
      STRATA_LOG(Error) << job_id << ": cannot record " << JobStateName(to) << ": " << moved.status();
      return;
    }
    STRATA_LOG(Warning) << job_id << ": recording " << JobStateName(to) << " (attempt " << attempt
                        << "): " << moved.status() << "; retrying";
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, delay, [this] { return stopping_; })) {
      STRATA_LOG(Warning) << job_id << ": left RUNNING at shutdown; the next coordinator requeues it";
      return;
    }
    delay = std::min(delay * 2, std::chrono::milliseconds(5000));
  }
}

void CoordinatorService::RememberWorkerDirectory(const std::string& worker_id, const std::string& dir) {
  if (dir.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  worker_directories_[worker_id] = dir;
}

std::string CoordinatorService::AnyWorkerDirectory() {
  std::lock_guard<std::mutex> lock(mu_);
  return worker_directories_.empty() ? std::string() : worker_directories_.begin()->second;
}

void CoordinatorService::Publish(const std::string& job_id, const std::string& type, const std::string& json) {
  auto appended = store_->AppendEvent(job_id, type, json);
  if (!appended.ok()) STRATA_LOG(Warning) << "event for " << job_id << " not recorded: " << appended.status();
  WakeWatchers(job_id);
}

bool CoordinatorService::Park(const std::string& job_id, WatchReactor* reactor) {
  std::lock_guard<std::mutex> lock(watch_mu_);
  // A cancel that came after the reactor last looked found nothing parked
  // to finish (OnCancel unparks under this lock): the reactor finishes.
  if (reactor->cancelled()) return false;
  parked_.emplace(job_id, reactor);
  return true;
}

bool CoordinatorService::Unpark(const std::string& job_id, WatchReactor* reactor) {
  std::lock_guard<std::mutex> lock(watch_mu_);
  auto [begin, end] = parked_.equal_range(job_id);
  for (auto it = begin; it != end; ++it) {
    if (it->second == reactor) {
      parked_.erase(it);
      return true;
    }
  }
  return false;
}

void CoordinatorService::WakeWatchers(const std::string& job_id) {
  std::vector<WatchReactor*> woken;
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    auto [begin, end] = parked_.equal_range(job_id);
    for (auto it = begin; it != end; ++it) woken.push_back(it->second);
    parked_.erase(begin, end);
  }
  for (WatchReactor* r : woken) r->Wake();
}

void CoordinatorService::WakeAllWatchers() {
  std::multimap<std::string, WatchReactor*> woken;
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    woken.swap(parked_);
  }
  for (auto& [id, r] : woken) r->Wake();
}

}  // namespace strata::services
