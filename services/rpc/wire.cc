#include "services/rpc/wire.h"

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace strata::services {
namespace {

namespace v1 = strata::v1;

constexpr int kMaxStatusCode = 16;  // UNAUTHENTICATED, the last code both define

std::string Indexed(const std::string& field, int index) { return absl::StrCat(field, "[", index, "]"); }

void ToRows(const std::vector<std::vector<float>>& rows, google::protobuf::RepeatedPtrField<v1::Tensor>* out) {
  out->Clear();
  for (const auto& row : rows) ToProto(row, out->Add());
}

absl::StatusOr<std::vector<std::vector<float>>> FromRows(const google::protobuf::RepeatedPtrField<v1::Tensor>& rows,
                                                         const std::string& field) {
  std::vector<std::vector<float>> out;
  out.reserve(static_cast<size_t>(rows.size()));
  for (int i = 0; i < rows.size(); ++i) {
    STRATA_ASSIGN_OR_RETURN(auto row, FromProto(rows.Get(i), Indexed(field, i)));
    out.push_back(std::move(row));
  }
  return out;
}

// A singular message field the sender may leave unset when it has nothing to say.
absl::StatusOr<std::vector<float>> OptionalRow(bool present, const v1::Tensor& tensor, const std::string& field) {
  if (!present) return std::vector<float>{};
  return FromProto(tensor, field);
}

void ToRollouts(const std::vector<policies::Rollout>& rollouts, google::protobuf::RepeatedPtrField<v1::Rollout>* out) {
  out->Clear();
  for (const auto& r : rollouts) ToProto(r, out->Add());
}

absl::StatusOr<std::vector<policies::Rollout>> FromRollouts(const google::protobuf::RepeatedPtrField<v1::Rollout>& in) {
  std::vector<policies::Rollout> out;
  out.reserve(static_cast<size_t>(in.size()));
  for (int i = 0; i < in.size(); ++i) {
    STRATA_ASSIGN_OR_RETURN(auto r, FromProto(in.Get(i), Indexed("rollouts", i)));
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<int32_t> Ids(const google::protobuf::RepeatedField<int32_t>& ids) { return {ids.begin(), ids.end()}; }

void SetIds(const std::vector<int32_t>& ids, google::protobuf::RepeatedField<int32_t>* out) {
  out->Clear();
  out->Add(ids.begin(), ids.end());
}

absl::Status SameRowCount(const std::string& what, const std::vector<std::pair<std::string, int>>& counts) {
  for (const auto& [name, n] : counts) {
    if (n != counts.front().second) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", counts.front().first, " has ", counts.front().second,
                                                     " rows but ", name, " has ", n));
    }
  }
  return absl::OkStatus();
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int code = static_cast<int>(status.code());
  const auto grpc_code =
      code > 0 && code <= kMaxStatusCode ? static_cast<grpc::StatusCode>(code) : grpc::StatusCode::UNKNOWN;
  return grpc::Status(grpc_code, std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  const int code = static_cast<int>(status.error_code());
  const auto absl_code =
      code > 0 && code <= kMaxStatusCode ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown;
  return absl::Status(absl_code, status.error_message());
}

void ToProto(const std::vector<float>& values, v1::Tensor* out) {
  out->set_dtype("F32");
  out->clear_shape();
  out->add_shape(static_cast<int64_t>(values.size()));
  std::string* data = out->mutable_data();
  data->resize(values.size() * sizeof(float));
  if constexpr (std::endian::native == std::endian::little) {
    if (!values.empty()) std::memcpy(data->data(), values.data(), data->size());
  } else {
    for (size_t i = 0; i < values.size(); ++i) {
      const uint32_t bits = std::bit_cast<uint32_t>(values[i]);
      for (size_t b = 0; b < 4; ++b) (*data)[4 * i + b] = static_cast<char>((bits >> (8 * b)) & 0xff);
    }
  }
}

absl::StatusOr<std::vector<float>> FromProto(const v1::Tensor& tensor, const std::string& field) {
  if (tensor.dtype() != "F32") {
    return absl::InvalidArgumentError(absl::StrCat(field, ": dtype is \"", tensor.dtype(), "\", expected \"F32\""));
  }
  if (tensor.shape_size() != 1 || tensor.shape(0) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": shape is [", absl::StrJoin(tensor.shape(), ","), "], expected one dimension [n]"));
  }
  const uint64_t n = static_cast<uint64_t>(tensor.shape(0));
  // Compared by division so a huge shape cannot overflow into a match.
  if (tensor.data().size() % sizeof(float) != 0 || tensor.data().size() / sizeof(float) != n) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", tensor.data().size(), " data bytes for shape [", n,
                                                   "], expected ", n, " * 4"));
  }
  std::vector<float> out(n);
  const std::string& data = tensor.data();
  if constexpr (std::endian::native == std::endian::little) {
    if (n > 0) std::memcpy(out.data(), data.data(), data.size());
  } else {
    for (size_t i = 0; i < n; ++i) {
      uint32_t bits = 0;
      for (size_t b = 0; b < 4; ++b)
        bits |= static_cast<uint32_t>(static_cast<unsigned char>(data[4 * i + b])) << (8 * b);
      out[i] = std::bit_cast<float>(bits);
    }
  }
  return out;
}

void ToProto(const std::vector<std::vector<int32_t>>& rows, v1::IdRows* out) {
  out->Clear();
  for (const auto& row : rows) SetIds(row, out->add_rows()->mutable_ids());
}

std::vector<std::vector<int32_t>> FromProto(const v1::IdRows& rows) {
  std::vector<std::vector<int32_t>> out;
  out.reserve(static_cast<size_t>(rows.rows_size()));
  for (const auto& row : rows.rows()) out.push_back(Ids(row.ids()));
  return out;
}

void ToProto(const policies::Rollout& rollout, v1::Rollout* out) {
  out->set_prompt_index(rollout.prompt_index);
  SetIds(rollout.prompt, out->mutable_prompt());
  SetIds(rollout.response, out->mutable_response());
  ToProto(rollout.logprobs, out->mutable_logprobs());
  out->set_greedy(rollout.greedy);
  out->set_truncated(rollout.truncated);
}

absl::StatusOr<policies::Rollout> FromProto(const v1::Rollout& rollout, const std::string& field) {
  policies::Rollout out;
  out.prompt_index = rollout.prompt_index();
  out.prompt = Ids(rollout.prompt());
  out.response = Ids(rollout.response());
  auto logprobs = OptionalRow(rollout.has_logprobs(), rollout.logprobs(), field + ".logprobs");
  if (!logprobs.ok()) return logprobs.status();
  out.logprobs = std::move(*logprobs);
  out.greedy = rollout.greedy();
  out.truncated = rollout.truncated();
  return out;
}

void ToProto(const policies::SamplingOptions& options, v1::SamplingOptions* out) {
  out->set_greedy(options.greedy);
  out->set_temperature(options.temperature);
  out->set_top_k(options.top_k);
  out->set_top_p(options.top_p);
  out->set_max_new_tokens(options.max_new_tokens);
  out->set_stop_at_eos(options.stop_at_eos);
  out->set_seed(options.seed);
  out->mutable_row_seeds()->Add(options.row_seeds.begin(), options.row_seeds.end());
}

policies::SamplingOptions FromProto(const v1::SamplingOptions& options) {
  policies::SamplingOptions out;
  out.greedy = options.greedy();
  out.temperature = options.temperature();
  out.top_k = options.top_k();
  out.top_p = options.top_p();
  out.max_new_tokens = options.max_new_tokens();
  out.stop_at_eos = options.stop_at_eos();
  out.seed = options.seed();
  out.row_seeds.assign(options.row_seeds().begin(), options.row_seeds().end());
  return out;
}

void ToProto(const policies::RolloutRequest& request, v1::RolloutRequest* out) {
  ToProto(request.prompts, out->mutable_prompts());
  ToProto(request.sampling, out->mutable_sampling());
  out->set_samples_per_prompt(request.samples_per_prompt);
  out->set_with_greedy(request.with_greedy);
}

policies::RolloutRequest FromProto(const v1::RolloutRequest& request) {
  policies::RolloutRequest out;
  out.prompts = FromProto(request.prompts());
  out.sampling = FromProto(request.sampling());
  out.samples_per_prompt = request.samples_per_prompt();
  out.with_greedy = request.with_greedy();
  return out;
}

void ToProto(const std::vector<policies::Rollout>& rollouts, const policies::ScoreRequest& request,
             v1::ScoreRequest* out) {
  ToRollouts(rollouts, out->mutable_rollouts());
  out->set_rewards(request.rewards);
  out->set_reference_logprobs(request.reference_logprobs);
  out->set_values(request.values);
  out->set_actor_logprobs(request.actor_logprobs);
}

absl::Status FromProto(const v1::ScoreRequest& in, std::vector<policies::Rollout>* rollouts,
                       policies::ScoreRequest* request) {
  STRATA_ASSIGN_OR_RETURN(auto r, FromRollouts(in.rollouts()));
  *rollouts = std::move(r);
  request->rewards = in.rewards();
  request->reference_logprobs = in.reference_logprobs();
  request->values = in.values();
  request->actor_logprobs = in.actor_logprobs();
  return absl::OkStatus();
}

void ToProto(const policies::Scores& scores, v1::ScoreResponse* out) {
  ToProto(scores.rewards, out->mutable_rewards());
  ToRows(scores.reference_logprobs, out->mutable_reference_logprobs());
  ToRows(scores.values, out->mutable_values());
  ToRows(scores.actor_logprobs, out->mutable_actor_logprobs());
}

absl::StatusOr<policies::Scores> FromProto(const v1::ScoreResponse& scores) {
  policies::Scores out;
  auto rewards = OptionalRow(scores.has_rewards(), scores.rewards(), "rewards");
  if (!rewards.ok()) return rewards.status();
  out.rewards = std::move(*rewards);
  for (auto [rows, field, dest] :
       {std::tuple{&scores.reference_logprobs(), "reference_logprobs", &out.reference_logprobs},
        std::tuple{&scores.values(), "values", &out.values},
        std::tuple{&scores.actor_logprobs(), "actor_logprobs", &out.actor_logprobs}}) {
    STRATA_ASSIGN_OR_RETURN(auto r, FromRows(*rows, field));
    *dest = std::move(r);
  }
  return out;
}

void ToProto(const policies::PolicyUpdate& update, v1::UpdateRequest* out) {
  ToRollouts(update.rollouts, out->mutable_rollouts());
  ToRows(update.advantages, out->mutable_advantages());
  out->set_objective(update.objective == policies::PolicyObjective::kPpo ? v1::POLICY_OBJECTIVE_PPO
                                                                          : v1::POLICY_OBJECTIVE_REINFORCE);
  ToRows(update.old_logprobs, out->mutable_old_logprobs());
  ToRows(update.returns, out->mutable_returns());
  ToRows(update.old_values, out->mutable_old_values());
  out->set_clip_range(update.clip_range);
  out->set_value_clip(update.value_clip);
  out->set_epochs(update.epochs);
  out->set_minibatches(update.minibatches);
  out->set_shuffle_seed(update.shuffle_seed);
}

absl::StatusOr<policies::PolicyUpdate> FromProto(const v1::UpdateRequest& update) {
  policies::PolicyUpdate out;
  auto rollouts = FromRollouts(update.rollouts());
  if (!rollouts.ok()) return rollouts.status();
  out.rollouts = std::move(*rollouts);
  switch (update.objective()) {
    case v1::POLICY_OBJECTIVE_REINFORCE:
      out.objective = policies::PolicyObjective::kReinforce;
      break;
    case v1::POLICY_OBJECTIVE_PPO:
      out.objective = policies::PolicyObjective::kPpo;
      break;
    default:  // proto3 enums are open: a newer client may send a value we lack
      return absl::InvalidArgumentError(
          absl::StrCat("objective: unknown value ", static_cast<int>(update.objective())));
  }
  for (auto [rows, field, dest] : {std::tuple{&update.advantages(), "advantages", &out.advantages},
                                   std::tuple{&update.old_logprobs(), "old_logprobs", &out.old_logprobs},
                                   std::tuple{&update.returns(), "returns", &out.returns},
                                   std::tuple{&update.old_values(), "old_values", &out.old_values}}) {
    STRATA_ASSIGN_OR_RETURN(auto r, FromRows(*rows, field));
    *dest = std::move(r);
  }
  out.clip_range = update.clip_range();
  out.value_clip = update.value_clip();
  out.epochs = update.epochs();
  out.minibatches = update.minibatches();
  out.shuffle_seed = update.shuffle_seed();
  return out;
}

void ToProto(const policies::UpdateStats& stats, v1::UpdateResponse* out) {
  out->set_policy_loss(stats.policy_loss);
  out->set_value_loss(stats.value_loss);
  out->set_clipfrac(stats.clipfrac);
  out->set_value_clipfrac(stats.value_clipfrac);
  out->set_approx_kl(stats.approx_kl);
}

policies::UpdateStats FromProto(const v1::UpdateResponse& stats) {
  return {stats.policy_loss(), stats.value_loss(), stats.clipfrac(), stats.value_clipfrac(), stats.approx_kl()};
}

void ToProto(const std::vector<policies::TextPair>& batch, v1::TrainSftRequest* out) {
  out->clear_prompts();
  out->clear_responses();
  for (const auto& pair : batch) {
    SetIds(pair.prompt, out->mutable_prompts()->add_rows()->mutable_ids());
    SetIds(pair.response, out->mutable_responses()->add_rows()->mutable_ids());
  }
}

absl::StatusOr<std::vector<policies::TextPair>> FromProto(const v1::TrainSftRequest& batch) {
  const auto& prompts = batch.prompts().rows();
  const auto& responses = batch.responses().rows();
  if (auto s = SameRowCount("sft batch", {{"prompts", prompts.size()}, {"responses", responses.size()}}); !s.ok()) {
    return s;
  }
  std::vector<policies::TextPair> out;
  out.reserve(static_cast<size_t>(prompts.size()));
  for (int i = 0; i < prompts.size(); ++i) out.push_back({Ids(prompts.Get(i).ids()), Ids(responses.Get(i).ids())});
  return out;
}

void ToProto(const std::vector<policies::PreferencePair>& batch, v1::PreferenceBatch* out) {
  out->clear_prompts();
  out->clear_chosen();
  out->clear_rejected();
  for (const auto& pair : batch) {
    SetIds(pair.prompt, out->mutable_prompts()->add_rows()->mutable_ids());
    SetIds(pair.chosen, out->mutable_chosen()->add_rows()->mutable_ids());
    SetIds(pair.rejected, out->mutable_rejected()->add_rows()->mutable_ids());
  }
}

absl::StatusOr<std::vector<policies::PreferencePair>> FromProto(const v1::PreferenceBatch& batch) {
  const auto& prompts = batch.prompts().rows();
  const auto& chosen = batch.chosen().rows();
  const auto& rejected = batch.rejected().rows();
  if (auto s = SameRowCount("preference batch",
                            {{"prompts", prompts.size()}, {"chosen", chosen.size()}, {"rejected", rejected.size()}});
      !s.ok()) {
    return s;
  }
  std::vector<policies::PreferencePair> out;
  out.reserve(static_cast<size_t>(prompts.size()));
  for (int i = 0; i < prompts.size(); ++i) {
    out.push_back({Ids(prompts.Get(i).ids()), Ids(chosen.Get(i).ids()), Ids(rejected.Get(i).ids())});
  }
  return out;
}

void ToProto(const policies::TrainStats& stats, v1::TrainResponse* out) {
  out->set_loss(stats.loss);
  out->set_accuracy(stats.accuracy);
}

policies::TrainStats FromProto(const v1::TrainResponse& stats) { return {stats.loss(), stats.accuracy()}; }

void ToProto(const policies::MemoryStats& stats, v1::PhaseMemory* out) {
  out->clear_peak_bytes();
  for (const auto& [tier, bytes] : stats.peak_bytes) (*out->mutable_peak_bytes())[tier] = bytes;
}

policies::MemoryStats FromProto(const v1::PhaseMemory& stats) {
  policies::MemoryStats out;
  for (const auto& [tier, bytes] : stats.peak_bytes()) out.peak_bytes[tier] = bytes;
  return out;
}

}  // namespace strata::services
