#include "services/cli/server_commands.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "offload/device/device_transfer.h"
#include "policies/dist/process_group.h"
#include "services/coordinator/coordinator.h"
#include "services/rank/rank_memory.h"
#include "services/rank/reward_sources.h"
#include "services/rpc/rpc_metrics.h"
#include "services/rpc/wire.h"
#include "services/store/redis_client.h"
#include "services/store/redis_job_store.h"
#include "services/telemetry/service_metrics.h"
#include "services/worker/worker_service.h"

namespace strata::services {
namespace {

namespace v1 = strata::v1;

// Blocks SIGINT and SIGTERM in every thread (call before starting any) so
// that WaitForShutdownSignal receives them.
sigset_t BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

int WaitForShutdownSignal(const sigset_t& set) {
  int signal = 0;
  sigwait(&set, &signal);
  return signal;
}

void ConfigureServer(grpc::ServerBuilder& builder, const std::string& listen,
                     std::shared_ptr<grpc::ServerCredentials> credentials, int* port, int max_message_bytes) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  builder.AddListeningPort(listen, std::move(credentials), port);
  // Keepalive: notice dead peers on idle connections within ~30 s.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.SetMaxReceiveMessageSize(max_message_bytes);
  builder.SetMaxSendMessageSize(max_message_bytes);
  AddRpcMetrics(builder);
}

// The Prometheus endpoint, started before the gRPC server so that a bad
// address fails the command before anything is served.
absl::Status ServeMetrics(const std::string& listen) {
  if (listen.empty()) return absl::OkStatus();
  ServiceMetrics& metrics = ServiceMetrics::Global();
  STRATA_RETURN_IF_ERROR(metrics.Serve(listen));
  STRATA_LOG(Info) << "metrics on http://" << listen.substr(0, listen.rfind(':')) << ":" << metrics.port()
                   << "/metrics";
  return absl::OkStatus();
}

// The token a server checks and the credentials it listens with.
struct ServerSecurity {
  std::string token;
  std::shared_ptr<grpc::ServerCredentials> credentials;

  static absl::StatusOr<ServerSecurity> Resolve(const std::string& token_file, const TlsFiles& tls, bool insecure) {
    STRATA_ASSIGN_OR_RETURN(auto token, ResolveToken(token_file));
    if (token.empty() && !insecure) {
      return absl::FailedPreconditionError(
          "no --token-file or STRATA_TOKEN: give a token, or pass --insecure to serve without authentication");
    }
    if (token.empty()) STRATA_LOG(Warning) << "--insecure: authentication is OFF";
    STRATA_ASSIGN_OR_RETURN(auto credentials, MakeServerCredentials(tls));
    return ServerSecurity{token, credentials};
  }
};

}  // namespace

absl::StatusOr<std::string> RunCoordinatorServer(const CoordinatorCommand& command) {
  const sigset_t signals = BlockShutdownSignals();
  // Tenant mode: tokens per tenant, and one token shared with the workers.
  std::map<std::string, Caller> callers;
  std::string worker_token;
  if (!command.tokens_file.empty()) {
    if (!command.token_file.empty())
      return absl::InvalidArgumentError("--tokens-file and --token-file exclude each other");
    if (command.worker_token_file.empty()) {
      return absl::InvalidArgumentError(
          "--tokens-file needs --worker-token-file: the token workers and the coordinator share");
    }
    STRATA_ASSIGN_OR_RETURN(callers, ReadTokensFile(command.tokens_file));
    STRATA_ASSIGN_OR_RETURN(worker_token, ReadSecretFile(command.worker_token_file, "--worker-token-file"));
    if (callers.count(worker_token)) {
      return absl::InvalidArgumentError("--worker-token-file: the worker token is also a tenant's token");
    }
  }
  STRATA_ASSIGN_OR_RETURN(auto security, ServerSecurity::Resolve(command.token_file, command.tls,
                                                                 command.insecure || !callers.empty()));
  RedisStoreOptions store_options;
  store_options.redis_url = command.redis;
  STRATA_ASSIGN_OR_RETURN(auto endpoint, ParseRedisUrl(command.redis));
  if (!endpoint.password.empty()) {
    return absl::InvalidArgumentError(
        "--redis: the URL carries a password, which ps and logs would show; use --redis-password-file or "
        "STRATA_REDIS_PASSWORD");
  }
  if (!command.redis_password_file.empty()) {
    STRATA_ASSIGN_OR_RETURN(store_options.password,
                            ReadSecretFile(command.redis_password_file, "--redis-password-file"));
  } else if (const char* env = std::getenv("STRATA_REDIS_PASSWORD"); env != nullptr && *env) {
    store_options.password = env;
  }
  // Redis down at start (restarting, or not yet up after a node failure)
  // is waited for, as it is once running: exiting would only put the
  // coordinator in its supervisor's crash loop, whose back-off outlasts
  // Redis's restart. Anything but UNAVAILABLE fails at once.
  auto store = ConnectRedisJobStore(store_options);
  for (int wait_ms = 100; !store.ok() && store.status().code() == absl::StatusCode::kUnavailable;
       wait_ms = std::min(2 * wait_ms, 5000)) {
    STRATA_LOG(Warning) << "--redis: " << store.status().message() << "; trying again in " << wait_ms << " ms";
    const timespec wait{wait_ms / 1000, (wait_ms % 1000) * 1000000L};
    if (const int signal = sigtimedwait(&signals, nullptr, &wait); signal > 0) {
      return absl::StrCat("coordinator stopped (signal ", signal, ") while waiting for redis\n");
    }
    store = ConnectRedisJobStore(store_options);
  }
  if (!store.ok()) return absl::Status(store.status().code(), absl::StrCat("--redis: ", store.status().message()));
  CoordinatorOptions options;
  options.token = security.token;
  options.callers = std::move(callers);
  options.worker_token = worker_token;
  // The coordinator dials workers with its own certificate, so workers that
  // require client certificates (their --tls-ca) accept it: mTLS both ways.
  options.worker_tls = command.tls;
  options.collective_timeout_ms = command.collective_timeout_ms;
  STRATA_RETURN_IF_ERROR(ServeMetrics(command.metrics_listen));
  auto service = std::make_unique<CoordinatorService>(store->get(), options);
  STRATA_RETURN_IF_ERROR(service->Start());
  grpc::ServerBuilder builder;
  int port = 0;
  ConfigureServer(builder, command.listen, security.credentials, &port, kMaxClientMessageBytes);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("--listen: cannot listen on ", command.listen));
  }
  STRATA_LOG(Info) << "coordinator listening on " << command.listen << " (redis " << command.redis << ")";
  // Health follows Redis: without its job store the coordinator can neither
  // take nor track jobs, and a load balancer should route elsewhere.
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
  std::thread redis_watch([&] {
    grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
    bool serving = true;
    while (!stop.load()) {
      const absl::Status ping = (*store)->Ping();
      if (ping.ok() != serving) {
        serving = ping.ok();
        if (health != nullptr) health->SetServingStatus(serving);
        if (serving) {
          STRATA_LOG(Info) << "redis answers again: health SERVING";
        } else {
          STRATA_LOG(Warning) << "redis unreachable (" << ping << "): health NOT_SERVING";
        }
      }
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::seconds(1), [&] { return stop.load(); });
    }
  });
  const int signal = WaitForShutdownSignal(signals);
  STRATA_LOG(Info) << "coordinator: signal " << signal << ", shutting down";
  stop.store(true);
  cv.notify_all();
  redis_watch.join();
  service->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return std::string("coordinator stopped\n");
}

absl::StatusOr<std::string> RunWorkerServer(const WorkerCommand& command) {
  const sigset_t signals = BlockShutdownSignals();
  STRATA_ASSIGN_OR_RETURN(auto security, ServerSecurity::Resolve(command.token_file, command.tls, command.insecure));
  WorkerServiceOptions options;
  options.worker_id = command.worker_id.empty() ? "worker-" + command.listen : command.worker_id;
  options.token = security.token;
  options.nvme_dir = command.nvme_dir;
  // What ranks of this worker's earlier life (killed with -9) left there.
  SweepAbandonedNvmeDirs(command.nvme_dir);
  options.device_budget_mib = command.device_budget_mib;
  const int64_t physical_mib =
      (static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(::sysconf(_SC_PAGESIZE))) >> 20;
  options.limits.max_host_mib = command.max_host_mib > 0 ? command.max_host_mib : physical_mib * 9 / 10;
  options.limits.max_rows = command.max_rows;
  options.limits.max_tokens = command.max_tokens;
  options.limits.max_device_mib = command.device_budget_mib;
  options.data_roots.push_back(command.data_root.empty() ? std::filesystem::current_path().string()
                                                         : command.data_root);
  options.data_roots.insert(options.data_roots.end(), command.allow_paths.begin(), command.allow_paths.end());
  for (const std::string& root : options.data_roots) {
    if (!std::filesystem::is_directory(root)) {
      return absl::InvalidArgumentError(absl::StrCat("--data-root / --allow-path: ", root, " is not a directory"));
    }
  }
  // What the coordinator's submit checks spec paths against: the same
  // directories ParseSpec allows.
  std::vector<std::string> served = options.data_roots;
  if (!command.nvme_dir.empty()) served.push_back(command.nvme_dir);
  // What the scheduler matches a job's needs against.
  std::vector<std::string> runs;
  if (policies::ProcessGroup::Available(policies::Backend::kGloo)) runs.push_back("gloo");
  if (policies::ProcessGroup::Available(policies::Backend::kNccl)) runs.push_back("nccl");
  if (offload::CheckComputeDevice(at::Device(at::kCUDA, 0)).ok()) runs.push_back("cuda");
  STRATA_ASSIGN_OR_RETURN(options.reward_access, LoadRewardAccess(command.allow_reward_hosts, command.reward_secrets));
  STRATA_RETURN_IF_ERROR(ServeMetrics(command.metrics_listen));
  WorkerService service(options);
  grpc::ServerBuilder builder;
  int port = 0;
  ConfigureServer(builder, command.listen, security.credentials, &port, kMaxWorkerMessageBytes);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("--listen: cannot listen on ", command.listen));
  }
  STRATA_LOG(Info) << options.worker_id << " listening on " << command.listen;
  // Health says SERVING only while the worker is registered: a job can be
  // scheduled on it exactly then (readiness probes and tests wait for it).
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  auto set_ready = [health](bool ready) {
    if (health != nullptr) health->SetServingStatus(ready);
  };
  set_ready(false);

  // Registration and heartbeats until shutdown. A coordinator that is down or
  // restarting is retried; an expired registration is renewed.
  STRATA_ASSIGN_OR_RETURN(auto channel_credentials, MakeChannelCredentials(command.tls));
  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(command.coordinator, channel_credentials));
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
  std::thread heartbeat([&] {
    bool registered = false;
    int interval_ms = 1000;
    while (!stop.load()) {
      grpc::ClientContext context;
      AddBearer(&context, security.token);
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      grpc::Status status;
      if (!registered) {
        v1::RegisterWorkerRequest request;
        request.set_worker_id(options.worker_id);
        request.set_address(command.listen);
        request.set_working_directory(std::filesystem::current_path().string());
        for (const std::string& root : served) request.add_data_roots(root);
        for (const std::string& can : runs) request.add_runs(can);
        // What this worker can hold, for the coordinator's admission check.
        (*request.mutable_memory_bytes())["host"] = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) *
                                                    static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
        if (command.device_budget_mib > 0) {
          (*request.mutable_memory_bytes())["device"] = command.device_budget_mib << 20;
        }
        // Free space where jobs that name no memory.nvme_dir keep NVMe state.
        if (struct statvfs fs{}; !command.nvme_dir.empty() && ::statvfs(command.nvme_dir.c_str(), &fs) == 0) {
          (*request.mutable_memory_bytes())["nvme"] = static_cast<int64_t>(fs.f_bavail) *
                                                      static_cast<int64_t>(fs.f_frsize);
        }
        v1::RegisterWorkerResponse response;
        status = stub->RegisterWorker(&context, request, &response);
        if (status.ok()) {
          registered = true;
          set_ready(true);
          interval_ms = static_cast<int>(std::max<int64_t>(100, response.heartbeat_interval_ms()));
          STRATA_LOG(Info) << options.worker_id << " registered with " << command.coordinator;
        }
      } else {
        const auto [job_id, generation] = service.LoadedJob();
        v1::HeartbeatRequest request;
        request.set_worker_id(options.worker_id);
        request.set_job_id(job_id);
        request.set_working_directory(std::filesystem::current_path().string());
        for (const std::string& root : served) request.add_data_roots(root);
        for (const std::string& can : runs) request.add_runs(can);
        v1::HeartbeatResponse response;
        status = stub->Heartbeat(&context, request, &response);
        if (status.error_code() == grpc::StatusCode::NOT_FOUND) registered = false;  // expired: register again
        if (status.ok() && response.cancel() && !job_id.empty()) service.DropOrphan(job_id, generation);
      }
      if (!status.ok() && status.error_code() != grpc::StatusCode::NOT_FOUND) {
        STRATA_LOG(Warning) << options.worker_id << ": coordinator " << command.coordinator << ": "
                            << status.error_message();
        registered = false;
      }
      if (!registered) set_ready(false);
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::milliseconds(interval_ms), [&] { return stop.load(); });
    }
  });
  const int signal = WaitForShutdownSignal(signals);
  STRATA_LOG(Info) << options.worker_id << ": signal " << signal << ", shutting down";
  stop.store(true);
  cv.notify_all();
  heartbeat.join();
  service.Shutdown();  // finishes queued calls first: Server::Shutdown waits for them
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return std::string("worker stopped\n");
}

}  // namespace strata::services
