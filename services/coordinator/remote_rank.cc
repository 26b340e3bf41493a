#include "services/coordinator/remote_rank.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "services/rpc/auth.h"
#include "services/rpc/wire.h"

namespace strata::services {
namespace {

namespace v1 = strata::v1;

// A reply that does not parse, or does not fit its request, is the worker's
// fault, not the caller's.
absl::Status BadReply(const std::string& address, const char* method, const absl::Status& status) {
  return absl::InternalError(absl::StrCat("worker ", address, ": ", method, ": malformed reply: ", status.message()));
}

}  // namespace

absl::Status RemoteRankOptions::Validate() const {
  if (address.empty()) return absl::InvalidArgumentError("worker address: empty");
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: empty");
  if (work_timeout.count() <= 0) return absl::InvalidArgumentError("work_timeout: must be > 0");
  if (control_timeout.count() <= 0) return absl::InvalidArgumentError("control_timeout: must be > 0");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RemoteRank>> RemoteRank::Create(RemoteRankOptions options,
                                                               std::shared_ptr<grpc::ChannelCredentials> credentials) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  if (credentials == nullptr) return absl::InvalidArgumentError("worker credentials: null");
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxWorkerMessageBytes);
  args.SetMaxSendMessageSize(kMaxWorkerMessageBytes);
  auto channel = grpc::CreateCustomChannel(options.address, credentials, args);
  return std::make_unique<RemoteRank>(std::move(channel), std::move(options));
}

RemoteRank::RemoteRank(std::shared_ptr<grpc::ChannelInterface> channel, RemoteRankOptions options)
    : options_(std::move(options)), channel_(std::move(channel)), stub_(v1::Worker::NewStub(channel_)) {}

bool RemoteRank::Answers(std::chrono::milliseconds timeout) const {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  // NOT_SERVING (not registered right now) still means the process is alive.
  return health->Check(&context, request, &response).ok();
}

template <typename Request, typename Response>
absl::Status RemoteRank::Call(const char* method,
                              grpc::Status (v1::Worker::Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
                              std::chrono::milliseconds timeout, const Request& request, Response* response) const {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  AddBearer(&context, options_.token);
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    active_.insert(&context);
  }
  const grpc::Status status = (stub_.get()->*rpc)(&context, request, response);
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    active_.erase(&context);
  }
  if (status.ok()) return absl::OkStatus();
  if (status.error_code() == grpc::StatusCode::CANCELLED && cancelled_.load()) {
    // CancelCalls gave up on this worker: to the coordinator, it is lost.
    return absl::UnavailableError(absl::StrCat("worker ", options_.address, " unavailable: ", method, ": given up (",
                                               status.error_message(), ")"));
  }
  // No reply in time is indistinguishable from a dead worker to the
  // coordinator, and both mean the same to it: the job moves elsewhere.
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::UnavailableError(
        absl::StrCat("worker ", options_.address, " unavailable: ", method, ": ", status.error_message()));
  }
  const absl::Status s = FromGrpcStatus(status);
  return absl::Status(s.code(), absl::StrCat("worker ", options_.address, ": ", method, ": ", s.message()));
}

void RemoteRank::CancelCalls() {
  std::lock_guard<std::mutex> lock(calls_mu_);
  cancelled_.store(true);
  for (grpc::ClientContext* context : active_) context->TryCancel();
}

absl::StatusOr<RemoteRank::RendezvousPoint> RemoteRank::OpenRendezvous(int world_size,
                                                                       std::chrono::milliseconds timeout) {
  v1::OpenRendezvousRequest request;
  request.set_job_id(options_.job_id);
  request.set_world_size(world_size);
  request.set_timeout_ms(timeout.count());
  v1::OpenRendezvousResponse response;
  STRATA_RETURN_IF_ERROR(
      Call("OpenRendezvous", &v1::Worker::Stub::OpenRendezvous, options_.control_timeout, request, &response));
  if (response.port() <= 0 || response.port() > 65535) {
    return BadReply(options_.address, "OpenRendezvous",
                    absl::InvalidArgumentError(absl::StrCat("port ", response.port())));
  }
  return RendezvousPoint{"", response.port(), response.secret()};
}

absl::StatusOr<RemoteRank::Loaded> RemoteRank::StartRank(const std::string& spec_yaml, int rank, int world_size,
                                                         const RendezvousPoint& rendezvous,
                                                         std::chrono::milliseconds timeout) {
  v1::StartRankRequest request;
  request.set_job_id(options_.job_id);
  request.set_spec_yaml(spec_yaml);
  request.set_rank(rank);
  request.set_world_size(world_size);
  request.set_rendezvous_host(rendezvous.host);
  request.set_rendezvous_port(rendezvous.port);
  request.set_rendezvous_secret(rendezvous.secret);
  request.set_timeout_ms(timeout.count());
  for (const std::string& id : options_.resumable_run_ids) request.add_resumable_run_ids(id);
  v1::StartRankResponse response;
  STRATA_RETURN_IF_ERROR(Call("StartRank", &v1::Worker::Stub::StartRank, options_.work_timeout, request, &response));
  return Loaded{response.tokenizer_path(), response.working_directory()};
}

absl::StatusOr<services::PhaseReply> RemoteRank::RunPhase(const services::PhaseRequest& request) {
  v1::PhaseRequest call;
  call.set_job_id(options_.job_id);
  call.set_phase(request.phase);
  call.set_iteration(request.iteration);
  call.mutable_params()->insert(request.params.begin(), request.params.end());
  call.set_text(request.text);
  v1::PhaseReply response;
  STRATA_RETURN_IF_ERROR(Call("RunPhase", &v1::Worker::Stub::RunPhase, options_.work_timeout, call, &response));
  services::PhaseReply reply;
  for (const auto& [key, value] : response.metrics()) {
    if (!std::isfinite(value)) {  // JSON has no NaN; a diverged loss stops the job here, named
      return absl::InternalError(
          absl::StrCat("worker ", options_.address, ": ", request.phase, " metric ", key, " is ", value));
    }
    reply.metrics[key] = value;
  }
  reply.text = response.text();
  return reply;
}

absl::Status RemoteRank::Unload() {
  v1::UnloadRequest request;
  request.set_job_id(options_.job_id);
  v1::UnloadResponse response;
  return Call("Unload", &v1::Worker::Stub::Unload, options_.control_timeout, request, &response);
}

absl::StatusOr<v1::WorkerStats> RemoteRank::GetStats() {
  v1::WorkerStats response;
  if (auto s = Call("GetStats", &v1::Worker::Stub::GetStats, options_.control_timeout, v1::GetStatsRequest(),
                    &response);
      !s.ok()) {
    return s;
  }
  return response;
}

}  // namespace strata::services
