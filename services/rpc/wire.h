// Conversions between the Worker API's messages (proto/strata/v1/worker.proto)
// and the structs the algorithms use (policies/rl/worker_group.h), and between
// absl::Status and grpc::Status. Both sides of the worker API go through
// these functions, so a message means the same thing to the WorkerService
// and to RemoteWorkerGroup.
//
// Per-token float rows travel as strata.v1.Tensor: dtype "F32", shape [n],
// data = n little-endian floats. Messages arriving from the wire are
// untrusted: the From* functions return INVALID_ARGUMENT naming the field
// ("rollouts[3].logprobs: ...") instead of reading past a short buffer.
// The To* functions never fail. None of them keep pointers to their inputs.
#ifndef STRATA_SERVICES_RPC_WIRE_H_
#define STRATA_SERVICES_RPC_WIRE_H_

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "policies/rl/worker_group.h"
#include "strata/v1/worker.pb.h"

namespace strata::services {

// Largest worker message either side accepts. gRPC's default (4 MiB) is too
// small for a big batch of long rollouts; the server builder and the client
// channel both use this.
inline constexpr int kMaxWorkerMessageBytes = 512 << 20;
// Largest message between clients and the coordinator, the same on both
// sides: a request carries at most a 1 MiB spec and 1 MiB of overrides
// (more is refused by name), a list page carries summaries without specs.
inline constexpr int kMaxClientMessageBytes = 4 << 20;

// Status codes are numerically the same in Abseil and gRPC; the message is
// kept, payloads are dropped. A code outside 0..16 becomes UNKNOWN.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// One row of floats as an F32 tensor of shape [n].
void ToProto(const std::vector<float>& values, strata::v1::Tensor* out);
// INVALID_ARGUMENT naming `field` unless dtype is "F32", the shape is 1-D and
// data holds exactly numel * 4 bytes.
absl::StatusOr<std::vector<float>> FromProto(const strata::v1::Tensor& tensor, const std::string& field);

void ToProto(const std::vector<std::vector<int32_t>>& rows, strata::v1::IdRows* out);
std::vector<std::vector<int32_t>> FromProto(const strata::v1::IdRows& rows);

void ToProto(const policies::Rollout& rollout, strata::v1::Rollout* out);
// An absent logprobs tensor reads as no log-probs.
absl::StatusOr<policies::Rollout> FromProto(const strata::v1::Rollout& rollout, const std::string& field);

// `use_kv_cache` is not part of the API (how the worker decodes is its own
// business): it reads back as the default, true.
void ToProto(const policies::SamplingOptions& options, strata::v1::SamplingOptions* out);
policies::SamplingOptions FromProto(const strata::v1::SamplingOptions& options);

// The request messages carry the job id; these leave it to the caller.
void ToProto(const policies::RolloutRequest& request, strata::v1::RolloutRequest* out);
policies::RolloutRequest FromProto(const strata::v1::RolloutRequest& request);

void ToProto(const std::vector<policies::Rollout>& rollouts, const policies::ScoreRequest& request,
             strata::v1::ScoreRequest* out);
absl::Status FromProto(const strata::v1::ScoreRequest& in, std::vector<policies::Rollout>* rollouts,
                       policies::ScoreRequest* request);

void ToProto(const policies::Scores& scores, strata::v1::ScoreResponse* out);
absl::StatusOr<policies::Scores> FromProto(const strata::v1::ScoreResponse& scores);

void ToProto(const policies::PolicyUpdate& update, strata::v1::UpdateRequest* out);
// INVALID_ARGUMENT for an objective this build does not know.
absl::StatusOr<policies::PolicyUpdate> FromProto(const strata::v1::UpdateRequest& update);

void ToProto(const policies::UpdateStats& stats, strata::v1::UpdateResponse* out);
policies::UpdateStats FromProto(const strata::v1::UpdateResponse& stats);

void ToProto(const std::vector<policies::TextPair>& batch, strata::v1::TrainSftRequest* out);
// INVALID_ARGUMENT unless prompts and responses have the same number of rows.
absl::StatusOr<std::vector<policies::TextPair>> FromProto(const strata::v1::TrainSftRequest& batch);

void ToProto(const std::vector<policies::PreferencePair>& batch, strata::v1::PreferenceBatch* out);
// INVALID_ARGUMENT unless prompts, chosen and rejected have the same number of rows.
absl::StatusOr<std::vector<policies::PreferencePair>> FromProto(const strata::v1::PreferenceBatch& batch);

void ToProto(const policies::TrainStats& stats, strata::v1::TrainResponse* out);
policies::TrainStats FromProto(const strata::v1::TrainResponse& stats);

void ToProto(const policies::MemoryStats& stats, strata::v1::PhaseMemory* out);
policies::MemoryStats FromProto(const strata::v1::PhaseMemory& stats);

}  // namespace strata::services

#endif  // STRATA_SERVICES_RPC_WIRE_H_
