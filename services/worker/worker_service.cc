#include "services/worker/worker_service.h"

#include <filesystem>

#include <c10/util/Exception.h>
#include <time.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/engine_counters.h"
#include "base/heap.h"
#include "base/interrupt.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "offload/device/device_memory.h"
#include "offload/device/device_transfer.h"
#include "policies/job/job_spec.h"
#include "services/rank/local_gang.h"
#include "services/rpc/wire.h"
#include "services/telemetry/service_metrics.h"

namespace strata::services {
namespace {

namespace v1 = strata::v1;

double ProcessCpuSeconds() {
  timespec ts{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Finishes `reactor` with `status`, for the paths that never reach the work thread.
grpc::ServerUnaryReactor* FinishNow(grpc::ServerUnaryReactor* reactor, const grpc::Status& status) {
  reactor->Finish(status);
  return reactor;
}

}  // namespace

WorkerService::WorkerService(WorkerServiceOptions options)
    : options_(std::move(options)), auth_(options_.token), executor_(std::make_unique<Executor>(1)) {
  // Count device allocations from start-up, so the figures include the
  // models' weights (as LocalWorkerGroup does for `strata train`).
  offload::DeviceMemoryMonitor::Install();
}

WorkerService::~WorkerService() { Shutdown(); }

void WorkerService::Shutdown() {
  std::unique_ptr<Executor> executor;
  {
    std::lock_guard<std::mutex> lock(executor_mu_);
    stopping_ = true;
    executor = std::move(executor_);
  }
  // Joins the work thread: the running call completes, the queued ones see
  // stopping_ and finish with UNAVAILABLE. Outside the lock so Submit never
  // waits behind a long operation.
  executor.reset();
  // Nothing else touches the work thread's state now.
  DropJob();
  PublishStats();
}

void WorkerService::DropJob() {
  {
    std::lock_guard<std::mutex> lock(interrupt_mu_);
    ++generation_;
    ClearInterrupt();  // an interrupt was for the job being dropped
  }
  rank_.reset();
  group_.reset();
  gang_.reset();
  rendezvous_.reset();
  job_id_.clear();
  phase_.clear();
  // The job's tensors are gone; the large blocks kept for their reuse go
  // back to the kernel too (base/heap.h).
  UnmapKeptLargeBlocks();
}

std::pair<std::string, uint64_t> WorkerService::LoadedJob() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return {published_job_id_, published_generation_};
}

bool WorkerService::InterruptJob(uint64_t generation) {
  std::lock_guard<std::mutex> lock(interrupt_mu_);
  if (generation_ != generation) return false;
  RequestInterrupt();
  return true;
}

void WorkerService::DropOrphan(const std::string& job_id, uint64_t generation) {
  if (!InterruptJob(generation)) return;
  std::lock_guard<std::mutex> lock(executor_mu_);
  if (executor_ == nullptr) return;
  executor_->Submit([this, job_id, generation] {
    {
      std::lock_guard<std::mutex> generation_lock(interrupt_mu_);
      if (job_id_ != job_id || generation_ != generation) return;
    }
    STRATA_LOG(Warning) << "worker " << options_.worker_id << " drops job " << job_id
                        << ": cancelled, or no job loop of the coordinator owns it";
    DropJob();
    PublishStats();
  });
}

void WorkerService::DropStaleJob(const std::string& assigned) {
  if ((group_ == nullptr && rendezvous_ == nullptr) || job_id_ == assigned) return;
  // The coordinator schedules only workers it counts as idle: the job held
  // here lost its gang, and the Unload that should have ended it never
  // arrived (the connection broke, or this worker was stopped).
  STRATA_LOG(Warning) << "worker " << options_.worker_id << " drops job " << job_id_ << ": assigned job " << assigned;
  DropJob();
}

absl::StatusOr<policies::JobSpec> WorkerService::ParseSpec(const std::string& job_id, const std::string& yaml) {
  STRATA_ASSIGN_OR_RETURN(auto spec, policies::ParseJobSpec(yaml, {}, absl::StrCat("job ", job_id)));
  if (spec.memory.nvme_dir.empty()) spec.memory.nvme_dir = options_.nvme_dir;
  if (absl::Status s = policies::CheckJobLimits(spec, options_.limits,
                                                "this worker accepts (--max-rows, --max-tokens, --max-host-mib)");
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("job ", job_id, ": ", s.message()));
  }
  if (!options_.data_roots.empty()) {
    std::vector<std::string> roots = options_.data_roots;
    if (!options_.nvme_dir.empty()) roots.push_back(options_.nvme_dir);
    if (absl::Status s = policies::CheckPathsWithin(spec, std::filesystem::current_path().string(), roots); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("job ", job_id, ": ", s.message()));
    }
  }
  if (spec.memory.device_mib == 0) spec.memory.device_mib = options_.device_budget_mib;
  // GetStats reports the new job's device from now on, during the load too.
  if (auto monitor = offload::DeviceMemoryMonitor::ForDevice(offload::ComputeDevice(spec.memory.device_index));
      monitor.ok()) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    published_monitor_ = *monitor;
  }
  return spec;
}

grpc::ServerUnaryReactor* WorkerService::Submit(grpc::CallbackServerContext* context,
                                                std::function<absl::Status()> work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status auth = auth_.Check(context); !auth.ok()) return FinishNow(reactor, auth);
  {
    std::lock_guard<std::mutex> lock(executor_mu_);
    if (executor_ != nullptr) {
      // The context, request and response stay valid until Finish.
      executor_->Submit(
          [this, context, reactor, work = std::move(work)] { reactor->Finish(ToGrpcStatus(RunWork(context, work))); });
      return reactor;
    }
  }
  return FinishNow(reactor, grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                         absl::StrCat("worker ", options_.worker_id, " is shutting down")));
}

grpc::ServerUnaryReactor* WorkerService::SubmitForJob(grpc::CallbackServerContext* context, const std::string& job_id,
                                                      std::function<absl::Status(LocalWorkerGroup&)> work) {
  return Submit(context, [this, job_id, work = std::move(work)]() -> absl::Status {
    if (group_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", options_.worker_id, " has no job loaded (call for job ", job_id, "); StartRank first"));
    }
    if (job_id != job_id_) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", options_.worker_id, " holds job ", job_id_, ", not job ", job_id));
    }
    return work(*group_);
  });
}

absl::Status WorkerService::RunWork(grpc::CallbackServerContext* context, const std::function<absl::Status()>& work) {
  if (stopping_) return absl::UnavailableError(absl::StrCat("worker ", options_.worker_id, " is shutting down"));
  // A caller that gave up (deadline, cancel) while the call was queued gets
  // nothing from work that may take minutes.
  if (context->IsCancelled()) return absl::CancelledError("the call was cancelled before its work started");
  absl::Status status;
  // libtorch reports shape, dtype and allocation failures by throwing; this
  // is the boundary where they become a status the caller can act on.
  try {
    status = work();
  } catch (const c10::Error& e) {
    status = absl::InternalError(absl::StrCat("libtorch: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    status = absl::InternalError(e.what());
  } catch (...) {
    status = absl::InternalError("unknown exception");
  }
  if (!status.ok()) {
    STRATA_LOG(Warning) << "worker " << options_.worker_id << ": call failed: " << status;
  }
  PublishStats();
  return status;
}

void WorkerService::PublishStats() {
  std::map<std::string, int64_t> peaks;
  if (group_ != nullptr) peaks = group_->PhaseMemory(phase_).peak_bytes;
  std::lock_guard<std::mutex> lock(stats_mu_);
  published_job_id_ = group_ != nullptr ? job_id_ : std::string();
  std::lock_guard<std::mutex> generation_lock(interrupt_mu_);
  published_generation_ = generation_;
  published_peaks_ = std::move(peaks);
  published_monitor_ = group_ != nullptr ? &group_->device_monitor() : &offload::DeviceMemoryMonitor::Install();
}

void WorkerService::PublishLoading() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  published_job_id_ = job_id_;
  std::lock_guard<std::mutex> generation_lock(interrupt_mu_);
  published_generation_ = generation_;
}

grpc::ServerUnaryReactor* WorkerService::OpenRendezvous(grpc::CallbackServerContext* context,
                                                        const v1::OpenRendezvousRequest* request,
                                                        v1::OpenRendezvousResponse* response) {
  return Submit(context, [this, request, response]() -> absl::Status {
    if (request->job_id().empty()) return absl::InvalidArgumentError("job_id: empty");
    DropStaleJob(request->job_id());
    DropJob();
    STRATA_ASSIGN_OR_RETURN(rendezvous_, policies::Rendezvous::Host("0.0.0.0", 0, request->world_size(),
                                                                    std::chrono::milliseconds(request->timeout_ms())));
    job_id_ = request->job_id();
    response->set_port(rendezvous_->port());
    response->set_secret(rendezvous_->secret());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* WorkerService::StartRank(grpc::CallbackServerContext* context,
                                                   const v1::StartRankRequest* request,
                                                   v1::StartRankResponse* response) {
  return Submit(context, [this, request, response]() -> absl::Status {
    if (request->job_id().empty()) return absl::InvalidArgumentError("job_id: empty");
    DropStaleJob(request->job_id());
    std::unique_ptr<policies::Rendezvous> rendezvous = std::move(rendezvous_);
    DropJob();
    // A rank that fails part-way is dropped whole: its group (and rank 0's
    // store, with its port) would otherwise live on beside no job, out of
    // Unload's reach, until the next job came.
    absl::Cleanup drop_on_failure = [this] { DropJob(); };
    // Loading a large model takes minutes: a cancel must reach it.
    job_id_ = request->job_id();
    PublishLoading();
    STRATA_ASSIGN_OR_RETURN(auto spec, ParseSpec(request->job_id(), request->spec_yaml()));
    policies::ProcessGroupOptions options;
    options.rank = request->rank();
    options.world_size = request->world_size();
    options.timeout = std::chrono::milliseconds(request->timeout_ms());
    STRATA_ASSIGN_OR_RETURN(const GangBackend backend, ChooseGangBackend(spec));
    options.backend = backend.backend;
    options.device_index = backend.device_index;
    STRATA_RETURN_IF_ERROR(options.Validate());
    if (options.world_size == 1 && !backend.group_of_one) {
      gang_ = policies::ProcessGroup::Solo();
    } else if (options.world_size == 1) {
      // A named backend for one rank: its own store, on loopback.
      STRATA_ASSIGN_OR_RETURN(auto own, policies::Rendezvous::Host("127.0.0.1", 0, 1, options.timeout));
      STRATA_ASSIGN_OR_RETURN(gang_, policies::ProcessGroup::Create(options, std::move(own)));
    } else {
      STRATA_RETURN_IF_ERROR(policies::ProcessGroup::CheckAvailable(options.backend));
      if (options.rank == 0 && rendezvous == nullptr) {
        return absl::FailedPreconditionError("rank 0 starts after OpenRendezvous");
      }
      if (options.rank != 0) {
        STRATA_ASSIGN_OR_RETURN(rendezvous,
                                policies::Rendezvous::Join(request->rendezvous_host(), request->rendezvous_port(),
                                                           request->rendezvous_secret(), options.timeout));
      }
      STRATA_ASSIGN_OR_RETURN(gang_, policies::ProcessGroup::Create(options, std::move(rendezvous)));
    }
    STRATA_ASSIGN_OR_RETURN(group_, LocalWorkerGroup::Create(spec, gang_.get(), options_.reward_access));
    JobRankOptions rank_options;
    rank_options.run_id = request->job_id();
    rank_options.resumable_run_ids.assign(request->resumable_run_ids().begin(), request->resumable_run_ids().end());
    STRATA_ASSIGN_OR_RETURN(rank_, JobRank::Create(spec, *group_, group_->tokenizer(), *gang_, rank_options));
    std::move(drop_on_failure).Cancel();
    response->set_tokenizer_path(group_->tokenizer_path());
    response->set_working_directory(std::filesystem::current_path().string());
    STRATA_LOG(Info) << "worker " << options_.worker_id << " is rank " << options.rank << " of " << options.world_size
                     << " for job " << job_id_;
    return absl::OkStatus();
  });
}

namespace {

// A timed phase's figures (its reply carries "time/<phase>_s" and the
// tiers' peaks) into this worker's Prometheus metrics.
void RecordPhaseMetrics(const policies::Metrics& metrics, const LocalWorkerGroup& group, int64_t generated_tokens) {
  ServiceMetrics& out = ServiceMetrics::Global();
  for (const auto& [key, value] : metrics) {
    if (key.rfind("time/", 0) == 0 && key.size() > 7 && key.substr(key.size() - 2) == "_s") {
      out.ObservePhase(key.substr(5, key.size() - 7), value, generated_tokens);
    }
  }
  for (const auto& [tier, bytes] : group.MemoryInUse()) {
    auto peak = metrics.find("memory/" + tier + "_peak_bytes");
    if (peak != metrics.end()) out.SetMemory(tier, bytes, static_cast<int64_t>(peak->second));
  }
}

}  // namespace

grpc::ServerUnaryReactor* WorkerService::RunPhase(grpc::CallbackServerContext* context, const v1::PhaseRequest* request,
                                                  v1::PhaseReply* response) {
  return SubmitForJob(context, request->job_id(), [this, request, response](LocalWorkerGroup& group) -> absl::Status {
    if (rank_ == nullptr) return absl::FailedPreconditionError("RunPhase before StartRank");
    PhaseRequest phase{
        request->phase(), request->iteration(), {request->params().begin(), request->params().end()}, request->text()};
    phase_ = phase.phase == phases::kTrain ? phases::kUpdate : phase.phase;
    const int64_t tokens_before = EngineCounters::Read(GlobalEngineCounters().generated_tokens);
    STRATA_ASSIGN_OR_RETURN(auto reply, rank_->Run(phase));
    RecordPhaseMetrics(reply.metrics, group,
                       EngineCounters::Read(GlobalEngineCounters().generated_tokens) - tokens_before);
    response->mutable_metrics()->insert(reply.metrics.begin(), reply.metrics.end());
    response->set_text(reply.text);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* WorkerService::GetStats(grpc::CallbackServerContext* context,
                                                  const v1::GetStatsRequest* /*request*/, v1::WorkerStats* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status auth = auth_.Check(context); !auth.ok()) return FinishNow(reactor, auth);
  const offload::DeviceMemoryMonitor* monitor = &offload::DeviceMemoryMonitor::Install();
  response->set_worker_id(options_.worker_id);
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    if (published_monitor_ != nullptr) monitor = published_monitor_;
    response->set_job_id(published_job_id_);
    for (const auto& [tier, bytes] : published_peaks_) (*response->mutable_peak_bytes())[tier] = bytes;
  }
  // The device counter is live, so a long operation's peak shows while it runs.
  auto& device_peak = (*response->mutable_peak_bytes())["device"];
  device_peak = std::max<int64_t>(device_peak, static_cast<int64_t>(monitor->peak_bytes()));
  (*response->mutable_current_bytes())["device"] = static_cast<int64_t>(monitor->current_bytes());
  response->set_cpu_seconds(ProcessCpuSeconds());
  return FinishNow(reactor, grpc::Status::OK);
}

grpc::ServerUnaryReactor* WorkerService::Unload(grpc::CallbackServerContext* context, const v1::UnloadRequest* request,
                                                v1::UnloadResponse* /*response*/) {
  // The job's gang has ended: what this worker still does for it (a rollout
  // its lost peer made pointless) stops at its next step, instead of
  // keeping the worker from the next gang until it is done.
  if (auth_.Check(context).ok()) {
    const auto [loaded, generation] = LoadedJob();
    if (!loaded.empty() && loaded == request->job_id()) InterruptJob(generation);
  }
  return Submit(context, [this, request]() -> absl::Status {
    if (group_ == nullptr && rendezvous_ == nullptr) return absl::OkStatus();
    if (request->job_id() != job_id_) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker ", options_.worker_id, " holds job ", job_id_, ", not job ", request->job_id()));
    }
    STRATA_LOG(Info) << "worker " << options_.worker_id << " unloaded job " << job_id_;
    DropJob();
    return absl::OkStatus();
  });
}

}  // namespace strata::services
