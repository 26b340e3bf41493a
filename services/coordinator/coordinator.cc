#include "services/coordinator/coordinator.h"

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "policies/tokenizer/unicode.h"
#include "services/coordinator/admission.h"
#include "services/coordinator/gang_plan.h"
#include "services/coordinator/job_messages.h"
#include "services/coordinator/job_watch.h"
#include "services/coordinator/remote_gang.h"
#include "services/driver/job_runner.h"
#include "services/rpc/wire.h"
#include "services/telemetry/service_metrics.h"

namespace strata::services {
namespace v1 = strata::v1;

namespace {

// What each worker of a job's gang must run: its c10d backend when it has
// more than one rank (named, or Gloo for "auto" on the CPU; "auto" on a GPU
// takes NCCL or Gloo, whichever the build has), and a GPU for a GPU job.
std::vector<std::string> WorkerNeeds(const policies::JobSpec& spec) {
  std::vector<std::string> needs;
  const std::string& backend = spec.parallel.backend;
  if (backend == "gloo" || backend == "nccl") {
    needs.push_back(backend);
  } else if (spec.parallel.workers > 1 && spec.memory.on_cpu()) {
    needs.push_back("gloo");
  }
  if (!spec.memory.on_cpu()) needs.push_back("cuda");
  return needs;
}

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

std::unique_ptr<WorkerFleet> RemoteFleetFor(const CoordinatorOptions& options) {
  RemoteFleetOptions remote;
  remote.token = options.worker_token.empty() ? options.token : options.worker_token;
  remote.tls = options.worker_tls;
  remote.collective_timeout = std::chrono::milliseconds(options.collective_timeout_ms);
  return MakeRemoteFleet(std::move(remote));
}

}  // namespace

CoordinatorService::CoordinatorService(JobStore* store, CoordinatorOptions options, std::unique_ptr<WorkerFleet> fleet)
    : store_(store),
      options_(std::move(options)),
      auth_(AuthenticatedCallers(options_)),
      fleet_(fleet != nullptr ? std::move(fleet) : RemoteFleetFor(options_)),
      events_(*store),
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
      events_.Publish(job.id, "log", nlohmann::json{{"message", "coordinator restarted; job requeued"}}.dump());
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
  events_.WakeAll();
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

absl::Status CoordinatorService::Submit(const Caller& caller, const v1::SubmitJobRequest& request, v1::Job* response) {
  WorkerOffer offer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, memory] : worker_memory_) {
      for (const auto& [tier, bytes] : memory) offer.largest_bytes[tier] = std::max(offer.largest_bytes[tier], bytes);
    }
    if (!worker_directories_.empty()) offer.directory = worker_directories_.begin()->second;
    for (const auto& [id, dir] : worker_directories_) {
      const auto roots = worker_roots_.find(id);
      offer.paths.push_back({dir, roots != worker_roots_.end() ? roots->second : std::vector<std::string>()});
    }
  }
  AdmissionLimits limits;
  limits.max_rollout_rows = options_.max_rollout_rows;
  limits.max_rollout_tokens = options_.max_rollout_tokens;
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  STRATA_ASSIGN_OR_RETURN(AdmittedJob admitted, AdmitJob(*store_, specs_, caller, request, offer, limits, now_ms));
  bool created = false;
  STRATA_ASSIGN_OR_RETURN(auto stored, store_->Create(admitted.record, &created));
  if (created) {
    specs_.Remember(stored.id, admitted.spec);
    events_.Publish(stored.id, "state", nlohmann::json{{"state", "QUEUED"}}.dump());
  }
  ToProto(stored, response);
  cv_.notify_all();
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* CoordinatorService::SubmitJob(grpc::CallbackServerContext* context,
                                                        const v1::SubmitJobRequest* request, v1::Job* response) {
  return Handle(context,
                [this, request, response](const Caller& caller) { return Submit(caller, *request, response); });
}

grpc::ServerUnaryReactor* CoordinatorService::GetJob(grpc::CallbackServerContext* context,
                                                     const v1::GetJobRequest* request, v1::Job* response) {
  return Handle(context, [this, request, response](const Caller& caller) -> absl::Status {
    if (request->job_id().empty()) return absl::InvalidArgumentError("job_id is required");
    STRATA_ASSIGN_OR_RETURN(auto job, VisibleJob(*store_, caller, request->job_id()));
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
    STRATA_RETURN_IF_ERROR(VisibleJob(*store_, caller, request->job_id()).status());
    STRATA_ASSIGN_OR_RETURN(auto job, store_->Transition(request->job_id(), {JobState::kQueued, JobState::kRunning},
                                                         JobState::kCancelled));
    events_.Publish(job.id, "state", nlohmann::json{{"state", "CANCELLED"}}.dump());
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_backoff_.erase(job.id);
    }
    specs_.Forget(job.id);  // a running loop holds its own reference
    ToProto(job, response);
    return absl::OkStatus();
  });
}

grpc::ServerWriteReactor<v1::JobEvent>* CoordinatorService::WatchJob(grpc::CallbackServerContext* context,
                                                                     const v1::WatchJobRequest* request) {
  auto caller = auth_.Identify(context);
  const Caller who = caller.ok() ? *caller : Caller();
  return WatchJobEvents(JobWatchContext{watch_executor_, *store_, events_}, request->job_id(),
                        request->after_event_id(), caller.status(),
                        [this, who, id = request->job_id()] { return VisibleJob(*store_, who, id).status(); });
}

grpc::ServerUnaryReactor* CoordinatorService::ListCheckpoints(grpc::CallbackServerContext* context,
                                                              const v1::ListCheckpointsRequest* request,
                                                              v1::ListCheckpointsResponse* response) {
  return Handle(context, [this, request, response](const Caller& caller) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(auto job, VisibleJob(*store_, caller, request->job_id()));
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
    RememberWorkerDirectory(request->worker_id(), request->working_directory(),
                            {request->data_roots().begin(), request->data_roots().end()},
                            {request->runs().begin(), request->runs().end()});
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
    RememberWorkerDirectory(request->worker_id(), request->working_directory(),
                            {request->data_roots().begin(), request->data_roots().end()},
                            {request->runs().begin(), request->runs().end()});
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

void CoordinatorService::TellWaiting(const std::string& job_id, const std::string& message) {
  {
    std::lock_guard<std::mutex> guard(mu_);
    auto [told, added] = told_waiting_.emplace(job_id, message);
    if (!added && told->second == message) return;
    told->second = message;
  }
  events_.Publish(job_id, "log", nlohmann::json{{"message", message}}.dump());
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
        // Workers a queued job needs; 1 for a spec that no longer parses
        // (its run then fails naming the spec).
        auto spec = specs_.Of(job);
        planned.workers = spec.ok() ? (*spec)->parallel.workers : 1;
        if (spec.ok()) planned.needs = WorkerNeeds(**spec);
      }
      std::set<std::string> held_by_workers;  // jobs the workers' heartbeats name
      for (const WorkerRecord& w : *workers) held_by_workers.insert(w.job_id);
      std::map<std::string, const WorkerRecord*> by_id;
      for (const WorkerRecord& w : *workers) by_id[w.id] = &w;
      // Plan under the lock (the busy and kept-out workers are its state) and
      // mark the chosen workers busy; claim the jobs in Redis after it.
      GangPlan plan;
      std::vector<uint64_t> runs(jobs.size(), 0);
      std::set<std::string> live;  // jobs whose specs stay parsed
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
        for (const WorkerRecord& w : *workers) {
          const auto runs = worker_runs_.find(w.id);
          states.push_back({w.id, StateOfWorkerLocked(w.id, now),
                            runs != worker_runs_.end() ? std::optional(runs->second) : std::nullopt});
        }
        plan = PlanGangs(jobs, states);
        // What a job was told is forgotten once it says nothing new or has
        // left the queue, so that the next reason to wait is told again.
        std::erase_if(told_waiting_, [&](const auto& told) {
          return std::none_of(plan.decisions.begin(), plan.decisions.end(),
                              [&](const GangDecision& d) { return d.job_id == told.first && !d.waiting.empty(); });
        });
        for (size_t i = 0; i < jobs.size(); ++i) {
          const GangDecision& decision = plan.decisions[i];
          if (decision.gang.empty()) continue;
          runs[i] = next_run_++;
          for (const std::string& w : decision.gang) busy_workers_[w] = runs[i];
        }
        held_workers_ = plan.held;
        for (const auto& [job_id, loop_workers] : jobs_in_flight_) live.insert(job_id);
      }
      for (const JobRecord& job : *queued) live.insert(job.id);
      specs_.KeepOnly(live);
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
          events_.Publish(r.id, "state", nlohmann::json{{"state", "RUNNING"}, {"worker", r.worker}}.dump());
          RunOnGang(run, r, gang);
        });
      }
    } else {
      STRATA_LOG(Warning) << "scheduler: " << (queued.ok() ? workers.status() : queued.status());
    }
    lock.lock();
    cv_.wait_for(lock, std::chrono::milliseconds(options_.scheduler_interval_ms));
    lock.unlock();
    events_.WakeAll();  // lets parked watchers notice jobs that ended
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
  std::unique_ptr<JobGang> gang;  // set once every rank has joined
  bool progressed = false;        // an iteration completed in this run
  auto run_job = [&]() -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(auto spec, specs_.Of(job));
    STRATA_ASSIGN_OR_RETURN(gang, fleet_->StartGang(job, workers));
    // The loop below opens no file: data, tokenizer, checkpoints and the
    // metrics file are the ranks'; only scalars come back.
    JobRunOptions run;
    run.resume = true;  // a requeued job continues from its last checkpoint
    run.own_checkpoint = job.checkpoint_dir;
    run.on_metrics = [&](const nlohmann::json& line) {
      progressed = true;
      events_.Publish(job.id, "metrics", line.dump());
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
  bool requeued = false;
  auto fail = [&](absl::StatusCode code_of_failure, const std::string& error) {
    const std::string code = absl::StatusCodeToString(code_of_failure);
    RecordOutcome(job.id, job.worker, JobState::kFailed, {{"error_code", code}, {"error_message", error}},
                  {{"state", json{{"state", "FAILED"}, {"error_code", code}, {"error", error}}.dump()}});
    std::lock_guard<std::mutex> lock(mu_);
    job_backoff_.erase(job.id);
  };
  const bool disk_full = WorkerDiskFull(status);
  if (status.ok()) {
    // Progress reports may have been lost (Redis down); the end is not.
    RecordOutcome(job.id, job.worker, JobState::kSucceeded, {{"iteration", std::to_string(job.iterations)}},
                  {{"state", json{{"state", "SUCCEEDED"}}.dump()}});
    std::lock_guard<std::mutex> lock(mu_);
    job_backoff_.erase(job.id);
    for (const WorkerRecord& w : workers) worker_backoff_.erase(w.id);
  } else if (status.code() == absl::StatusCode::kCancelled) {
    // CancelJob already recorded the state and the event.
  } else if (status.code() == absl::StatusCode::kUnavailable || status.code() == absl::StatusCode::kDeadlineExceeded ||
             disk_full) {
    // A worker is gone (or a rank's collective timed out with it), or a
    // worker's disk is full: the machine's fault, not the job's. Back to
    // the queue; the next run resumes from the last checkpoint on a new
    // gang, without the workers that failed it until their backoff ends.
    const std::string lost = disk_full ? "" : KeepOutSilentWorkers(job.id, workers);
    const std::string full = disk_full ? KeepOutWorkersNamed(status, workers) : "";
    LossDecision decision;
    {
      std::lock_guard<std::mutex> lock(mu_);
      decision = OnGangLost(options_.backoff, job_backoff_[job.id], !lost.empty(), progressed,
                            std::chrono::steady_clock::now());
    }
    if (decision.fail && disk_full) {
      // Every try ran out of disk: the job needs more than the workers have.
      fail(status.code(), absl::StrCat("gang (", names, ") ran out of disk ", decision.losses_with_all_answering,
                                       " times in a row before an iteration: ", status.message(),
                                       "; free space where it names (a worker's --nvme-dir, checkpoint.dir) or "
                                       "keep less of the job on NVMe (models.<role>.placement)"));
    } else if (decision.fail) {
      // No worker was lost: fail with the cause rather than requeue for ever.
      // Every worker answers, so the cause is what the error names: a
      // service the ranks call (a reward server that stays down) or ranks
      // that cannot reach each other.
      fail(status.code(),
           absl::StrCat("gang (", names, ") failed ", decision.losses_with_all_answering,
                        " times in a row before an iteration, every worker answering: ", status.message(),
                        "; check what it names (a reward server that stays down) or that the "
                        "workers reach each other (rank 0's address, the ports the gang opens)"));
    } else {
      requeued = true;
      const std::string message = absl::StrCat("gang (", names, ") lost: ", status.message(),
                                               lost.empty() ? "" : "; not answering: ", lost,
                                               full.empty() ? "" : "; disk full on: ", full,
                                               "; job requeued, retried in ", decision.retry_in.count() / 1000.0, " s");
      RecordOutcome(job.id, job.worker, JobState::kQueued, {{"worker", ""}},
                    {{"log", json{{"message", message}}.dump()}, {"state", json{{"state", "QUEUED"}}.dump()}});
    }
  } else {
    fail(status.code(), std::string(status.message()));
  }
  if (!requeued) specs_.Forget(job.id);
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
      case WorkerState::kBusy:
        ++counts["busy"];
        break;
      case WorkerState::kKeptOut:
        ++counts["backoff"];
        break;
      case WorkerState::kFree:
        ++counts[held_workers_.count(worker.id) ? "held" : "idle"];
        break;
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

std::string CoordinatorService::KeepOutWorkersNamed(const absl::Status& status,
                                                    const std::vector<WorkerRecord>& workers) {
  const auto now = std::chrono::steady_clock::now();
  std::string named;
  std::lock_guard<std::mutex> lock(mu_);
  for (const WorkerRecord& w : workers) {
    // Rank errors start "worker <address>: ..." (RemoteRank).
    if (!absl::StrContains(status.message(), absl::StrCat("worker ", w.address, ":"))) continue;
    absl::StrAppend(&named, named.empty() ? "" : ", ", w.id);
    KeepOut(options_.backoff, worker_backoff_[w.id], now);
  }
  return named;
}

std::string CoordinatorService::KeepOutSilentWorkers(const std::string& job_id,
                                                     const std::vector<WorkerRecord>& workers) {
  const std::vector<bool> answering = fleet_->Answering(job_id, workers);
  const auto now = std::chrono::steady_clock::now();
  std::string silent;
  for (size_t i = 0; i < workers.size(); ++i) {
    if (i < answering.size() && answering[i]) continue;
    absl::StrAppend(&silent, silent.empty() ? "" : ", ", workers[i].id);
    // A live worker registers again on its next heartbeat; it still waits
    // out its backoff before it joins a gang.
    if (absl::Status s = store_->RemoveWorker(workers[i].id); !s.ok()) {
      STRATA_LOG(Warning) << "deregistering " << workers[i].id << ": " << s;
    }
    std::lock_guard<std::mutex> lock(mu_);
    KeepOut(options_.backoff, worker_backoff_[workers[i].id], now);
  }
  return silent;
}

void CoordinatorService::RecordOutcome(const std::string& job_id, const std::string& workers, JobState to,
                                       const std::map<std::string, std::string>& fields,
                                       const std::vector<std::pair<std::string, std::string>>& events) {
  std::chrono::milliseconds delay = std::max(options_.record_retry_first, std::chrono::milliseconds(1));
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
      for (const auto& [type, json] : events) events_.Publish(job_id, type, json);
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

void CoordinatorService::RememberWorkerDirectory(const std::string& worker_id, const std::string& dir,
                                                 const std::vector<std::string>& roots,
                                                 const std::vector<std::string>& runs) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!runs.empty()) worker_runs_[worker_id] = {runs.begin(), runs.end()};
  if (dir.empty()) return;
  worker_directories_[worker_id] = dir;
  worker_roots_[worker_id] = roots;
}

}  // namespace strata::services
