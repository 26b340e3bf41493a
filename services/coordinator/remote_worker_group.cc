#include "services/coordinator/remote_worker_group.h"

#include <cmath>

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "services/rpc/auth.h"
#include "services/rpc/wire.h"

namespace strata::services {
namespace {

namespace v1 = strata::v1;

}  // namespace

absl::Status RemoteWorkerOptions::Validate() const {
  if (address.empty()) return absl::InvalidArgumentError("worker address: empty");
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: empty");
  if (work_timeout.count() <= 0) return absl::InvalidArgumentError("work_timeout: must be > 0");
  if (control_timeout.count() <= 0) return absl::InvalidArgumentError("control_timeout: must be > 0");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RemoteWorkerGroup>> RemoteWorkerGroup::Create(
    RemoteWorkerOptions options, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  if (credentials == nullptr) return absl::InvalidArgumentError("worker credentials: null");
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxWorkerMessageBytes);
  args.SetMaxSendMessageSize(kMaxWorkerMessageBytes);
  auto channel = grpc::CreateCustomChannel(options.address, credentials, args);
  return std::make_unique<RemoteWorkerGroup>(std::move(channel), std::move(options));
}

RemoteWorkerGroup::RemoteWorkerGroup(std::shared_ptr<grpc::ChannelInterface> channel, RemoteWorkerOptions options)
    : options_(std::move(options)), channel_(std::move(channel)), stub_(v1::Worker::NewStub(channel_)) {}

bool RemoteWorkerGroup::Answers(std::chrono::milliseconds timeout) const {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  // NOT_SERVING (not registered right now) still means the process is alive.
  return health->Check(&context, request, &response).ok();
}

template <typename Request, typename Response>
absl::Status RemoteWorkerGroup::Call(const char* method,
                                     grpc::Status (v1::Worker::Stub::*rpc)(grpc::ClientContext*, const Request&,
                                                                           Response*),
                                     std::chrono::milliseconds timeout, const Request& request,
                                     Response* response) const {
  {
    std::lock_guard<std::mutex> lock(calls_mu_);
    ++calls_[method];
  }
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
    return absl::UnavailableError(
        absl::StrCat("worker ", options_.address, " unavailable: ", method, ": given up (", status.error_message(), ")"));
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

void RemoteWorkerGroup::CancelCalls() {
  std::lock_guard<std::mutex> lock(calls_mu_);
  cancelled_.store(true);
  for (grpc::ClientContext* context : active_) context->TryCancel();
}

namespace {

// A reply that parses but does not fit its request (rows that do not match
// the batch) would otherwise reach the algorithms' tensor code.
absl::Status CheckRollouts(const policies::RolloutRequest& request, const std::vector<policies::Rollout>& rollouts) {
  const size_t prompts = request.prompts.size();
  const size_t want = prompts * static_cast<size_t>(std::max<int64_t>(request.samples_per_prompt, 0)) +
                      (request.with_greedy ? prompts : 0);
  if (rollouts.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(rollouts.size(), " rollouts for ", prompts, " prompts x ",
                                                   request.samples_per_prompt, " samples",
                                                   request.with_greedy ? " + greedy" : "", "; expected ", want));
  }
  for (size_t i = 0; i < rollouts.size(); ++i) {
    const policies::Rollout& r = rollouts[i];
    if (r.prompt_index < 0 || static_cast<size_t>(r.prompt_index) >= prompts) {
      return absl::InvalidArgumentError(
          absl::StrCat("rollouts[", i, "].prompt_index ", r.prompt_index, " is not one of ", prompts, " prompts"));
    }
    if (r.logprobs.size() != r.response.size()) {
      return absl::InvalidArgumentError(absl::StrCat("rollouts[", i, "].logprobs has ", r.logprobs.size(),
                                                     " values for ", r.response.size(), " response tokens"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckScores(const std::vector<policies::Rollout>& rollouts, const policies::ScoreRequest& request,
                         const policies::Scores& scores) {
  if (request.rewards && scores.rewards.size() != rollouts.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rewards has ", scores.rewards.size(), " values for ", rollouts.size(), " rollouts"));
  }
  for (auto [wanted, rows, field] : {std::tuple{request.reference_logprobs, &scores.reference_logprobs,
                                                "reference_logprobs"},
                                     std::tuple{request.values, &scores.values, "values"},
                                     std::tuple{request.actor_logprobs, &scores.actor_logprobs, "actor_logprobs"}}) {
    if (!wanted) continue;
    if (rows->size() != rollouts.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " has ", rows->size(), " rows for ", rollouts.size(), " rollouts"));
    }
    for (size_t i = 0; i < rows->size(); ++i) {
      if ((*rows)[i].size() != rollouts[i].response.size()) {
        return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "] has ", (*rows)[i].size(), " values for ",
                                                       rollouts[i].response.size(), " response tokens"));
      }
    }
  }
  return absl::OkStatus();
}

// A reply that does not parse, or does not fit its request, is the worker's
// fault, not the caller's.
absl::Status BadReply(const std::string& address, const char* method, const absl::Status& status) {
  return absl::InternalError(absl::StrCat("worker ", address, ": ", method, ": malformed reply: ", status.message()));
}

}  // namespace

absl::StatusOr<RemoteWorkerGroup::Loaded> RemoteWorkerGroup::LoadModels(const std::string& spec_yaml) {
  v1::LoadModelsRequest request;
  request.set_job_id(options_.job_id);
  request.set_spec_yaml(spec_yaml);
  v1::LoadModelsResponse response;
  if (auto s = Call("LoadModels", &v1::Worker::Stub::LoadModels, options_.work_timeout, request, &response); !s.ok()) {
    return s;
  }
  return Loaded{response.tokenizer_path(), response.working_directory()};
}

absl::StatusOr<int> RemoteWorkerGroup::OpenRendezvous(int world_size, std::chrono::milliseconds timeout) {
  v1::OpenRendezvousRequest request;
  request.set_job_id(options_.job_id);
  request.set_world_size(world_size);
  request.set_timeout_ms(timeout.count());
  v1::OpenRendezvousResponse response;
  STRATA_RETURN_IF_ERROR(
      Call("OpenRendezvous", &v1::Worker::Stub::OpenRendezvous, options_.control_timeout, request, &response));
  if (response.port() <= 0 || response.port() > 65535) {
    return BadReply(options_.address, "OpenRendezvous", absl::InvalidArgumentError(absl::StrCat("port ", response.port())));
  }
  return response.port();
}

absl::StatusOr<RemoteWorkerGroup::Loaded> RemoteWorkerGroup::StartRank(const std::string& spec_yaml, int rank,
                                                                       int world_size,
                                                                       const std::string& rendezvous_host,
                                                                       int rendezvous_port,
                                                                       std::chrono::milliseconds timeout) {
  v1::StartRankRequest request;
  request.set_job_id(options_.job_id);
  request.set_spec_yaml(spec_yaml);
  request.set_rank(rank);
  request.set_world_size(world_size);
  request.set_rendezvous_host(rendezvous_host);
  request.set_rendezvous_port(rendezvous_port);
  request.set_timeout_ms(timeout.count());
  for (const std::string& id : options_.resumable_run_ids) request.add_resumable_run_ids(id);
  v1::LoadModelsResponse response;
  STRATA_RETURN_IF_ERROR(Call("StartRank", &v1::Worker::Stub::StartRank, options_.work_timeout, request, &response));
  return Loaded{response.tokenizer_path(), response.working_directory()};
}

absl::StatusOr<services::PhaseReply> RemoteWorkerGroup::RunPhase(const services::PhaseRequest& request) {
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

absl::Status RemoteWorkerGroup::Unload() {
  v1::UnloadRequest request;
  request.set_job_id(options_.job_id);
  v1::UnloadResponse response;
  return Call("Unload", &v1::Worker::Stub::Unload, options_.control_timeout, request, &response);
}

absl::StatusOr<v1::WorkerStats> RemoteWorkerGroup::GetStats() {
  v1::WorkerStats response;
  if (auto s =
          Call("GetStats", &v1::Worker::Stub::GetStats, options_.control_timeout, v1::GetStatsRequest(), &response);
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<std::vector<policies::Rollout>> RemoteWorkerGroup::Generate(const policies::RolloutRequest& request) {
  v1::RolloutRequest call;
  call.set_job_id(options_.job_id);
  ToProto(request, &call);
  v1::RolloutResponse response;
  STRATA_RETURN_IF_ERROR(Call("Rollout", &v1::Worker::Stub::Rollout, options_.work_timeout, call, &response));
  std::vector<policies::Rollout> rollouts;
  rollouts.reserve(static_cast<size_t>(response.rollouts_size()));
  for (int i = 0; i < response.rollouts_size(); ++i) {
    auto r = FromProto(response.rollouts(i), absl::StrCat("rollouts[", i, "]"));
    if (!r.ok()) return BadReply(options_.address, "Rollout", r.status());
    rollouts.push_back(std::move(*r));
  }
  if (auto s = CheckRollouts(request, rollouts); !s.ok()) return BadReply(options_.address, "Rollout", s);
  return rollouts;
}

absl::StatusOr<policies::Scores> RemoteWorkerGroup::Score(const std::vector<policies::Rollout>& rollouts,
                                                          const policies::ScoreRequest& request) {
  v1::ScoreRequest call;
  call.set_job_id(options_.job_id);
  ToProto(rollouts, request, &call);
  v1::ScoreResponse response;
  STRATA_RETURN_IF_ERROR(Call("Score", &v1::Worker::Stub::Score, options_.work_timeout, call, &response));
  auto scores = FromProto(response);
  if (!scores.ok()) return BadReply(options_.address, "Score", scores.status());
  if (auto s = CheckScores(rollouts, request, *scores); !s.ok()) return BadReply(options_.address, "Score", s);
  return scores;
}

absl::StatusOr<policies::UpdateStats> RemoteWorkerGroup::Update(const policies::PolicyUpdate& update) {
  v1::UpdateRequest call;
  call.set_job_id(options_.job_id);
  ToProto(update, &call);
  v1::UpdateResponse response;
  STRATA_RETURN_IF_ERROR(Call("Update", &v1::Worker::Stub::Update, options_.work_timeout, call, &response));
  return FromProto(response);
}

template <typename Request, typename Batch>
absl::StatusOr<policies::TrainStats> RemoteWorkerGroup::Train(
    const char* method, grpc::Status (v1::Worker::Stub::*rpc)(grpc::ClientContext*, const Request&, v1::TrainResponse*),
    const std::vector<Batch>& batch) {
  Request call;
  call.set_job_id(options_.job_id);
  ToProto(batch, &call);
  v1::TrainResponse response;
  STRATA_RETURN_IF_ERROR(Call(method, rpc, options_.work_timeout, call, &response));
  return FromProto(response);
}

absl::StatusOr<policies::TrainStats> RemoteWorkerGroup::TrainSft(const std::vector<policies::TextPair>& batch) {
  return Train("TrainSft", &v1::Worker::Stub::TrainSft, batch);
}

absl::StatusOr<policies::TrainStats> RemoteWorkerGroup::TrainRewardModel(
    const std::vector<policies::PreferencePair>& batch) {
  return Train("TrainRewardModel", &v1::Worker::Stub::TrainRewardModel, batch);
}

absl::StatusOr<policies::TrainStats> RemoteWorkerGroup::EvaluateRewardModel(
    const std::vector<policies::PreferencePair>& pairs) {
  return Train("EvaluateRewardModel", &v1::Worker::Stub::EvaluateRewardModel, pairs);
}

namespace {

v1::BeginPhaseRequest PhaseCall(const std::string& job_id, const std::string& phase) {
  v1::BeginPhaseRequest call;
  call.set_job_id(job_id);
  call.set_phase(phase);
  return call;
}

v1::CheckpointRequest CheckpointCall(const std::string& job_id, const std::string& dir) {
  v1::CheckpointRequest call;
  call.set_job_id(job_id);
  call.set_dir(dir);
  return call;
}

}  // namespace

std::map<std::string, int64_t> RemoteWorkerGroup::calls() const {
  std::lock_guard<std::mutex> lock(calls_mu_);
  return calls_;
}

policies::MemoryStats RemoteWorkerGroup::BeginPhase(const std::string& phase) {
  v1::PhaseMemory response;
  if (auto s = Call("BeginPhase", &v1::Worker::Stub::BeginPhase, options_.control_timeout,
                    PhaseCall(options_.job_id, phase), &response);
      !s.ok()) {
    STRATA_LOG(Warning) << s;
    return {};
  }
  return FromProto(response);
}

policies::MemoryStats RemoteWorkerGroup::PhaseMemory(const std::string& phase) {
  v1::PhaseMemory response;
  if (auto s = Call("GetPhaseMemory", &v1::Worker::Stub::GetPhaseMemory, options_.control_timeout,
                    PhaseCall(options_.job_id, phase), &response);
      !s.ok()) {
    STRATA_LOG(Warning) << s;
    return {};
  }
  return FromProto(response);
}

absl::Status RemoteWorkerGroup::SaveCheckpoint(const std::string& dir) {
  v1::CheckpointResponse response;
  return Call("SaveCheckpoint", &v1::Worker::Stub::SaveCheckpoint, options_.work_timeout,
              CheckpointCall(options_.job_id, dir), &response);
}

absl::Status RemoteWorkerGroup::LoadCheckpoint(const std::string& dir) {
  v1::CheckpointResponse response;
  return Call("LoadCheckpoint", &v1::Worker::Stub::LoadCheckpoint, options_.work_timeout,
              CheckpointCall(options_.job_id, dir), &response);
}

absl::Status RemoteWorkerGroup::SaveOutput(const std::string& dir) {
  v1::CheckpointResponse response;
  return Call("SaveOutput", &v1::Worker::Stub::SaveOutput, options_.work_timeout, CheckpointCall(options_.job_id, dir),
              &response);
}

}  // namespace strata::services
