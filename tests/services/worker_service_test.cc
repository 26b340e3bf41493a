// The worker API end to end: the wire format, the WorkerService on a real
// gRPC server, and RemoteWorkerGroup, which must be indistinguishable from
// a LocalWorkerGroup to the algorithms.
#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policies/job/job_spec.h"
#include "policies/model/llama.h"
#include "base/status_macros.h"
#include "policies/rl/rl_algorithms.h"
#include "services/runtime/job_runner.h"
#include "services/runtime/local_worker_group.h"
#include "services/coordinator/remote_worker_group.h"
#include "services/rpc/wire.h"
#include "services/worker/worker_service.h"
#include "tests/testutil/testutil.h"

namespace strata::services {
namespace {

namespace v1 = strata::v1;
using ::testing::HasSubstr;

// Bit patterns, so -0.0, infinities and NaN payloads count.
std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> out;
  for (float v : values) out.push_back(std::bit_cast<uint32_t>(v));
  return out;
}
std::vector<std::vector<uint32_t>> Bits(const std::vector<std::vector<float>>& rows) {
  std::vector<std::vector<uint32_t>> out;
  for (const auto& r : rows) out.push_back(Bits(r));
  return out;
}

auto Tie(const policies::Rollout& r) {
  return std::make_tuple(r.prompt_index, r.prompt, r.response, Bits(r.logprobs), r.greedy);
}
std::vector<decltype(Tie(policies::Rollout{}))> Tie(const std::vector<policies::Rollout>& rollouts) {
  std::vector<decltype(Tie(policies::Rollout{}))> out;
  for (const auto& r : rollouts) out.push_back(Tie(r));
  return out;
}

policies::Rollout SomeRollout(int64_t index, bool greedy) {
  return {index, {1, 50, 60}, {70, 80, 2}, {-0.5f, -0.0f, -std::numeric_limits<float>::infinity()}, greedy};
}

TEST(WireTest, FloatRowRoundTripsBitForBit) {
  const std::vector<float> values = {0.0f, -0.0f, 1.5f, -3.25e-30f, std::numeric_limits<float>::denorm_min(),
                                     std::numeric_limits<float>::infinity(), std::nanf("7"), 3.4e38f};
  v1::Tensor t;
  ToProto(values, &t);
  EXPECT_EQ(t.dtype(), "F32");
  ASSERT_EQ(t.shape_size(), 1);
  EXPECT_EQ(t.shape(0), 8);
  EXPECT_EQ(t.data().size(), 32u);
  // Little-endian on the wire: 1.5f is 0x3FC00000.
  EXPECT_EQ(t.data().substr(8, 4), std::string("\x00\x00\xc0\x3f", 4));
  auto back = FromProto(t, "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(Bits(*back), Bits(values));

  ToProto(std::vector<float>{}, &t);
  back = FromProto(t, "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->empty());
}

TEST(WireTest, BadTensorIsInvalidArgumentNamingTheField) {
  v1::Tensor good;
  ToProto(std::vector<float>{1, 2, 3}, &good);

  v1::Tensor wrong_dtype = good;
  wrong_dtype.set_dtype("F16");
  auto s = FromProto(wrong_dtype, "advantages[4]").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("advantages[4]"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("F16"));

  v1::Tensor short_data = good;
  short_data.mutable_data()->pop_back();
  s = FromProto(short_data, "values[0]").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("values[0]"));

  v1::Tensor long_shape = good;
  long_shape.set_shape(0, 4);  // 12 bytes for 4 elements
  EXPECT_EQ(FromProto(long_shape, "x").status().code(), absl::StatusCode::kInvalidArgument);

  v1::Tensor two_d = good;
  two_d.add_shape(1);
  EXPECT_EQ(FromProto(two_d, "x").status().code(), absl::StatusCode::kInvalidArgument);

  v1::Tensor negative = good;
  negative.set_shape(0, -3);
  EXPECT_EQ(FromProto(negative, "x").status().code(), absl::StatusCode::kInvalidArgument);

  // Nested in a message, the path to the tensor is named.
  policies::PolicyUpdate reinforce;
  reinforce.rollouts = {SomeRollout(0, false), SomeRollout(1, false)};
  reinforce.advantages = {{1, 2, 3}, {4, 5, 6}};
  v1::UpdateRequest update;
  ToProto(reinforce, &update);
  update.mutable_rollouts(1)->mutable_logprobs()->mutable_data()->append("x");
  s = FromProto(update).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rollouts[1].logprobs"));

  v1::ScoreResponse scores;
  ToProto(policies::Scores{{1, 2}, {{1}, {2}}, {{3}, {4}}, {}}, &scores);
  scores.mutable_values(1)->set_dtype("I32");
  s = FromProto(scores).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("values[1]"));
}

TEST(WireTest, RolloutRequestRoundTrips) {
  policies::RolloutRequest request;
  request.prompts = {{1, 2, 3}, {}, {4}};
  request.sampling.greedy = true;
  request.sampling.temperature = 0.7;
  request.sampling.top_k = 40;
  request.sampling.top_p = 0.9;
  request.sampling.max_new_tokens = 17;
  request.sampling.stop_at_eos = false;
  request.sampling.seed = 0xfedcba9876543210ull;
  request.samples_per_prompt = 4;
  request.with_greedy = true;
  v1::RolloutRequest wire;
  ToProto(request, &wire);
  const policies::RolloutRequest back = FromProto(wire);
  EXPECT_EQ(back.prompts, request.prompts);
  EXPECT_EQ(back.sampling.greedy, true);
  EXPECT_EQ(back.sampling.temperature, 0.7);
  EXPECT_EQ(back.sampling.top_k, 40);
  EXPECT_EQ(back.sampling.top_p, 0.9);
  EXPECT_EQ(back.sampling.max_new_tokens, 17);
  EXPECT_EQ(back.sampling.stop_at_eos, false);
  EXPECT_EQ(back.sampling.seed, 0xfedcba9876543210ull);
  EXPECT_EQ(back.samples_per_prompt, 4);
  EXPECT_EQ(back.with_greedy, true);
}

TEST(WireTest, RolloutsRoundTrip) {
  v1::RolloutResponse wire;
  const std::vector<policies::Rollout> rollouts = {SomeRollout(0, false), SomeRollout(3, true),
                                                   policies::Rollout{2, {5}, {}, {}, false}};
  for (const auto& r : rollouts) ToProto(r, wire.add_rollouts());
  std::vector<policies::Rollout> back;
  for (const auto& r : wire.rollouts()) {
    auto one = FromProto(r, "r");
    ASSERT_TRUE(one.ok()) << one.status();
    back.push_back(*one);
  }
  EXPECT_EQ(Tie(back), Tie(rollouts));
  // A sender that leaves logprobs unset means "none".
  v1::Rollout bare;
  bare.add_response(9);
  auto none = FromProto(bare, "r");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->logprobs.empty());
}

TEST(WireTest, ScoreRequestAndScoresRoundTrip) {
  const std::vector<policies::Rollout> rollouts = {SomeRollout(0, false), SomeRollout(1, true)};
  for (const policies::ScoreRequest what : {policies::ScoreRequest{true, false, true, false},
                                            policies::ScoreRequest{false, true, false, true}}) {
    v1::ScoreRequest wire;
    ToProto(rollouts, what, &wire);
    std::vector<policies::Rollout> back;
    policies::ScoreRequest back_what{!what.rewards, !what.reference_logprobs, !what.values, !what.actor_logprobs};
    ASSERT_TRUE(FromProto(wire, &back, &back_what).ok());
    EXPECT_EQ(Tie(back), Tie(rollouts));
    EXPECT_EQ(std::tie(back_what.rewards, back_what.reference_logprobs, back_what.values, back_what.actor_logprobs),
              std::tie(what.rewards, what.reference_logprobs, what.values, what.actor_logprobs));
  }

  const policies::Scores scores{{0.25f, -1.0f}, {{-1.0f, -2.0f}, {}}, {{0.5f}, {0.75f, 1.0f}}, {{-0.125f}, {-3.0f}}};
  v1::ScoreResponse wire;
  ToProto(scores, &wire);
  auto back = FromProto(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(Bits(back->rewards), Bits(scores.rewards));
  EXPECT_EQ(Bits(back->reference_logprobs), Bits(scores.reference_logprobs));
  EXPECT_EQ(Bits(back->values), Bits(scores.values));
  EXPECT_EQ(Bits(back->actor_logprobs), Bits(scores.actor_logprobs));
}

TEST(WireTest, PolicyUpdateAndStatsRoundTrip) {
  policies::PolicyUpdate update;
  update.rollouts = {SomeRollout(0, false), SomeRollout(1, false)};
  update.advantages = {{0.1f, 0.2f, 0.3f}, {-0.1f, -0.2f, -0.3f}};
  update.objective = policies::PolicyObjective::kPpo;
  update.old_logprobs = {{-1, -2, -3}, {-4, -5, -6}};
  update.returns = {{1, 1, 1}, {2, 2, 2}};
  update.old_values = {{0.5f, 0.5f, 0.5f}, {0.25f, 0.25f, 0.25f}};
  update.clip_range = 0.1;
  update.value_clip = 0.3;
  update.epochs = 3;
  update.minibatches = 2;
  update.shuffle_seed = 99;
  v1::UpdateRequest wire;
  ToProto(update, &wire);
  EXPECT_EQ(wire.objective(), v1::POLICY_OBJECTIVE_PPO);
  auto back = FromProto(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(Tie(back->rollouts), Tie(update.rollouts));
  EXPECT_EQ(Bits(back->advantages), Bits(update.advantages));
  EXPECT_EQ(back->objective, policies::PolicyObjective::kPpo);
  EXPECT_EQ(Bits(back->old_logprobs), Bits(update.old_logprobs));
  EXPECT_EQ(Bits(back->returns), Bits(update.returns));
  EXPECT_EQ(Bits(back->old_values), Bits(update.old_values));
  EXPECT_EQ(std::tie(back->clip_range, back->value_clip, back->epochs, back->minibatches, back->shuffle_seed),
            std::tie(update.clip_range, update.value_clip, update.epochs, update.minibatches, update.shuffle_seed));

  update.objective = policies::PolicyObjective::kReinforce;
  ToProto(update, &wire);
  back = FromProto(wire);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->objective, policies::PolicyObjective::kReinforce);

  wire.set_objective(static_cast<v1::PolicyObjective>(7));  // from a newer client
  EXPECT_EQ(FromProto(wire).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(FromProto(wire).status().message()), HasSubstr("objective"));

  const policies::UpdateStats stats{0.5, 1.5, 0.25, 0.125, 0.0625};
  v1::UpdateResponse stats_wire;
  ToProto(stats, &stats_wire);
  const policies::UpdateStats stats_back = FromProto(stats_wire);
  EXPECT_EQ(std::tie(stats_back.policy_loss, stats_back.value_loss, stats_back.clipfrac, stats_back.value_clipfrac,
                     stats_back.approx_kl),
            std::tie(stats.policy_loss, stats.value_loss, stats.clipfrac, stats.value_clipfrac, stats.approx_kl));
}

TEST(WireTest, TrainingBatchesAndStatsRoundTrip) {
  const std::vector<policies::TextPair> sft = {{{1, 2}, {3, 4, 2}}, {{1}, {}}};
  v1::TrainSftRequest sft_wire;
  ToProto(sft, &sft_wire);
  auto sft_back = FromProto(sft_wire);
  ASSERT_TRUE(sft_back.ok()) << sft_back.status();
  ASSERT_EQ(sft_back->size(), sft.size());
  for (size_t i = 0; i < sft.size(); ++i) {
    EXPECT_EQ((*sft_back)[i].prompt, sft[i].prompt);
    EXPECT_EQ((*sft_back)[i].response, sft[i].response);
  }
  sft_wire.mutable_responses()->add_rows();
  auto s = FromProto(sft_wire).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("responses"));

  const std::vector<policies::PreferencePair> prefs = {{{1, 2}, {3}, {4, 5}}, {{1}, {6, 2}, {}}};
  v1::PreferenceBatch pref_wire;
  ToProto(prefs, &pref_wire);
  auto pref_back = FromProto(pref_wire);
  ASSERT_TRUE(pref_back.ok()) << pref_back.status();
  ASSERT_EQ(pref_back->size(), prefs.size());
  for (size_t i = 0; i < prefs.size(); ++i) {
    EXPECT_EQ((*pref_back)[i].prompt, prefs[i].prompt);
    EXPECT_EQ((*pref_back)[i].chosen, prefs[i].chosen);
    EXPECT_EQ((*pref_back)[i].rejected, prefs[i].rejected);
  }
  pref_wire.mutable_rejected()->mutable_rows()->RemoveLast();
  s = FromProto(pref_wire).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rejected"));

  v1::TrainResponse train_wire;
  ToProto(policies::TrainStats{0.75, 0.5}, &train_wire);
  const policies::TrainStats train_back = FromProto(train_wire);
  EXPECT_EQ(train_back.loss, 0.75);
  EXPECT_EQ(train_back.accuracy, 0.5);

  policies::MemoryStats memory;
  memory.peak_bytes = {{"device", 1ll << 40}, {"host", 12345}, {"nvme", 0}};
  v1::PhaseMemory memory_wire;
  ToProto(memory, &memory_wire);
  EXPECT_EQ(FromProto(memory_wire).peak_bytes, memory.peak_bytes);
}

TEST(WireTest, StatusCodesMapOneToOneBothWays) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  for (int code = 1; code <= 16; ++code) {
    const absl::Status a(static_cast<absl::StatusCode>(code), "models.actor.path: missing");
    const grpc::Status g = ToGrpcStatus(a);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(g.error_message(), "models.actor.path: missing");
    const absl::Status back = FromGrpcStatus(g);
    EXPECT_EQ(back, a);
  }
  // Spot checks by name, in case the enums ever drift apart.
  EXPECT_EQ(ToGrpcStatus(absl::FailedPreconditionError("x")).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ToGrpcStatus(absl::UnauthenticatedError("x")).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "x")).code(),
            absl::StatusCode::kResourceExhausted);
}

// A tiny actor on disk, shared by the tests below (building it is the slow part).
class WorkerServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    const std::string model = dir_->Join("model");
    auto config = policies::LlamaConfig::FromJson(R"({
      "vocab_size": 259, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
      "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})",
                                                  "tiny config");
    ASSERT_TRUE(config.ok()) << config.status();
    auto m = policies::LlamaModel::RandomInit(*config, policies::LlamaHead::kLanguageModel, at::kFloat, 3);
    std::filesystem::create_directories(model);
    const absl::Status saved = m->Save(model);
    ASSERT_TRUE(saved.ok()) << saved;
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      std::filesystem::copy_file(testing::SourcePath(std::string("examples/tiny/data/") + f), model + "/" + f);
    }
    yaml_ = new std::string(R"(
algorithm: remax
models:
  actor: {path: )" + model + R"(}
  reward: {rule: vowel_fraction}
data:
  train: )" + testing::SourcePath("examples/tiny/data/prompts.jsonl") +
                            R"(
  max_prompt_tokens: 16
train: {iterations: 2, batch_size: 2, lr: 1.0e-3, seed: 7}
generation: {max_new_tokens: 6}
memory: {host_mib: 64}
output: {dir: )" + dir_->Join("out") +
                            R"(}
)");
  }
  static void TearDownTestSuite() {
    delete yaml_;
    delete dir_;
  }

  void SetUp() override { StartServer(""); }
  void TearDown() override { StopServer(); }

  void StartServer(const std::string& token, policies::JobLimits limits = {}, const std::string& nvme_dir = "") {
    WorkerServiceOptions options;
    options.worker_id = "worker-7";
    options.token = token;
    options.limits = limits;
    options.nvme_dir = nvme_dir;
    service_ = std::make_unique<WorkerService>(options);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    builder.SetMaxReceiveMessageSize(kMaxWorkerMessageBytes);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    address_ = "127.0.0.1:" + std::to_string(port);
  }

  void StopServer() {
    if (server_ == nullptr) return;
    service_->Shutdown();
    server_->Shutdown();
    server_.reset();
    service_.reset();
  }

  std::unique_ptr<RemoteWorkerGroup> Remote(const std::string& job_id, const std::string& token = "") {
    RemoteWorkerOptions options;
    options.address = address_;
    options.job_id = job_id;
    options.token = token;
    auto group = RemoteWorkerGroup::Create(options, grpc::InsecureChannelCredentials());
    EXPECT_TRUE(group.ok()) << group.status();
    return group.ok() ? std::move(*group) : nullptr;
  }

  static policies::JobSpec Spec() {
    auto spec = policies::ParseJobSpec(*yaml_, {}, "test spec");
    EXPECT_TRUE(spec.ok()) << spec.status();
    return spec.ok() ? *spec : policies::JobSpec{};
  }

  // One iteration of `algorithm`'s phases on a gang of one.
  static absl::StatusOr<policies::Metrics> Iterate(policies::RlAlgorithm& algorithm, policies::WorkerGroup& workers,
                                                   const std::vector<std::vector<int32_t>>& prompts, int64_t it) {
    auto gang = policies::ProcessGroup::Solo();
    std::vector<policies::BatchPrompt> batch;
    for (size_t i = 0; i < prompts.size(); ++i) batch.push_back({static_cast<int64_t>(i), prompts[i]});
    STRATA_RETURN_IF_ERROR(algorithm.Rollout(workers, batch, static_cast<int64_t>(batch.size()), it));
    STRATA_ASSIGN_OR_RETURN(auto metrics, algorithm.Score(workers, *gang, {}));
    STRATA_ASSIGN_OR_RETURN(auto update, algorithm.Update(workers, *gang, it));
    metrics.insert(update.begin(), update.end());
    return metrics;
  }

  static policies::Metrics WithoutTimeAndMemory(policies::Metrics m) {
    std::erase_if(m, [](const auto& kv) { return IsRankMeasurement(kv.first); });
    return m;
  }

  static testing::TempDir* dir_;
  static std::string* yaml_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

testing::TempDir* WorkerServiceTest::dir_ = nullptr;
std::string* WorkerServiceTest::yaml_ = nullptr;

// The algorithm cannot tell a remote worker from an in-process one: the
// same spec and prompts give the same metrics, iteration by iteration.
TEST_F(WorkerServiceTest, RemaxAgainstRemoteWorkerMatchesLocal) {
  const policies::JobSpec spec = Spec();
  auto local = LocalWorkerGroup::Create(spec);
  ASSERT_TRUE(local.ok()) << local.status();
  auto remote = Remote("job-1");
  auto loaded = remote->LoadModels(*yaml_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->tokenizer_path, (*local)->tokenizer_path());
  EXPECT_EQ(loaded->working_directory, std::filesystem::current_path().string());

  const std::vector<std::vector<int32_t>> prompts = {(*local)->tokenizer().Encode("snow fire =>"),
                                                     (*local)->tokenizer().Encode("road wind =>")};
  auto local_algorithm = policies::RlAlgorithm::Create(spec);
  auto remote_algorithm = policies::RlAlgorithm::Create(spec);
  ASSERT_TRUE(local_algorithm.ok() && remote_algorithm.ok());
  const std::map<std::string, int64_t> calls_before = remote->calls();
  for (int64_t it = 0; it < 2; ++it) {
    auto want = Iterate(**local_algorithm, **local, prompts, it);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = Iterate(**remote_algorithm, *remote, prompts, it);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_GE(WithoutTimeAndMemory(*got).size(), 4u);
    EXPECT_EQ(WithoutTimeAndMemory(*got), WithoutTimeAndMemory(*want)) << "iteration " << it;
    EXPECT_TRUE(got->contains("objective/scores"));
    EXPECT_TRUE(got->contains("loss/policy_avg"));
  }
  // Per iteration: Rollout, Score (sampled), Score (greedy), Update.
  std::map<std::string, int64_t> per_iteration;
  for (const auto& [method, n] : remote->calls()) {
    const int64_t made = n - (calls_before.count(method) ? calls_before.at(method) : 0);
    if (made > 0) per_iteration[method] = made / 2;
  }
  const std::map<std::string, int64_t> want_calls = {
      {"Rollout", 1}, {"Score", 2}, {"Update", 1}};
  EXPECT_EQ(per_iteration, want_calls);

  // The updated weights match too: both actors now greedily say the same.
  policies::RolloutRequest greedy{prompts, {}, 1, false};
  greedy.sampling.greedy = true;
  greedy.sampling.max_new_tokens = 6;
  auto a = (*local)->Generate(greedy);
  auto b = remote->Generate(greedy);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(Tie(*b), Tie(*a));
}

TEST_F(WorkerServiceTest, CheckpointsStatsAndUnload) {
  auto remote = Remote("job-1");
  ASSERT_TRUE(remote->LoadModels(*yaml_).ok());
  // A retried load of the same job and spec is a no-op.
  ASSERT_TRUE(remote->LoadModels(*yaml_).ok());

  auto stats = remote->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->worker_id(), "worker-7");
  EXPECT_EQ(stats->job_id(), "job-1");
  EXPECT_GT(stats->current_bytes().at("device"), 0);
  EXPECT_GT(stats->peak_bytes().at("device"), 0);
  EXPECT_TRUE(stats->peak_bytes().contains("host"));
  EXPECT_GT(stats->cpu_seconds(), 0);

  auto sft = remote->TrainSft({{{1, 40, 41}, {42, 43, 2}}, {{1, 44}, {45, 2}}});
  ASSERT_TRUE(sft.ok()) << sft.status();
  EXPECT_GT(sft->loss, 0);
  // The worker's own errors keep their code: a rule reward has nothing to train.
  auto rm = remote->TrainRewardModel({{{1}, {2}, {3}}});
  EXPECT_EQ(rm.status().code(), absl::StatusCode::kFailedPrecondition) << rm.status();
  EXPECT_THAT(std::string(rm.status().message()), HasSubstr(address_));

  const std::string checkpoint = dir_->Join("ckpt");
  ASSERT_TRUE(remote->SaveCheckpoint(checkpoint).ok());
  EXPECT_TRUE(std::filesystem::exists(checkpoint + "/actor/optimizer.safetensors"));
  ASSERT_TRUE(remote->LoadCheckpoint(checkpoint).ok());
  ASSERT_TRUE(remote->SaveOutput(dir_->Join("output")).ok());
  EXPECT_TRUE(std::filesystem::exists(dir_->Join("output/tokenizer.json")));

  ASSERT_TRUE(remote->Unload().ok());
  stats = remote->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->job_id(), "");
  EXPECT_EQ(remote->Generate({{{1, 5}}, {}, 1, false}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(remote->Unload().ok());  // nothing loaded: nothing to do
}

TEST_F(WorkerServiceTest, CallsBeforeLoadModelsAreFailedPrecondition) {
  auto remote = Remote("job-1");
  auto rollouts = remote->Generate({{{1, 5, 6}}, {}, 1, false});
  EXPECT_EQ(rollouts.status().code(), absl::StatusCode::kFailedPrecondition) << rollouts.status();
  EXPECT_THAT(std::string(rollouts.status().message()), HasSubstr("LoadModels"));
  EXPECT_EQ(remote->SaveCheckpoint(dir_->Join("never")).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(remote->PhaseMemory("rollout").peak_bytes.empty());
}

TEST_F(WorkerServiceTest, WrongJobIdIsFailedPreconditionNamingBoth) {
  ASSERT_TRUE(Remote("job-1")->LoadModels(*yaml_).ok());
  auto other = Remote("job-2");
  auto scores = other->Score({SomeRollout(0, false)}, policies::ScoreRequest{});
  EXPECT_EQ(scores.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(scores.status().message()), HasSubstr("job-1"));
  EXPECT_THAT(std::string(scores.status().message()), HasSubstr("job-2"));
  // Nor may another job load over it, or unload it.
  auto load = other->LoadModels(*yaml_);
  EXPECT_EQ(load.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(load.status().message()), HasSubstr("job-1"));
  EXPECT_EQ(other->Unload().code(), absl::StatusCode::kFailedPrecondition);
}

// A gang call for a new job replaces a job left from a lost gang (its
// Unload never arrived), and the new job's phases run; the old job's calls
// are then refused.
TEST_F(WorkerServiceTest, NewGangReplacesAStaleJob) {
  auto stale = Remote("job-1");
  ASSERT_TRUE(stale->StartRank(*yaml_, 0, 1, "", 0, std::chrono::seconds(5)).ok());
  auto fresh = Remote("job-2");
  auto started = fresh->StartRank(*yaml_, 0, 1, "", 0, std::chrono::seconds(5));
  ASSERT_TRUE(started.ok()) << started.status();
  auto found = fresh->RunPhase({"find_checkpoint", 0, {}, ""});
  EXPECT_TRUE(found.ok()) << found.status();
  auto old_phase = stale->RunPhase({"rollout", 0, {}, ""});
  EXPECT_EQ(old_phase.status().code(), absl::StatusCode::kFailedPrecondition) << old_phase.status();
  EXPECT_THAT(std::string(old_phase.status().message()), HasSubstr("job-2"));
}

// The worker enforces its own limits, whatever the coordinator admitted
// (a probe took a worker to 20 GB with group.samples_per_prompt=100000).
TEST_F(WorkerServiceTest, SpecsBeyondTheWorkersLimitsAreRefusedNamingTheKey) {
  StopServer();
  policies::JobLimits limits;
  limits.max_rows = 8;
  limits.max_host_mib = 100;
  limits.max_tokens = 400;  // the fixture's job: 4 rows x (16 prompt + 64 response) = 320
  StartServer("", limits);
  auto remote = Remote("job-1");
  auto spec = policies::ParseJobSpec(*yaml_, {}, "spec");
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (const auto& [override_, key] : std::vector<std::pair<std::string, std::string>>{
           {"memory.host_mib=101", "memory.host_mib"},
           {"train.batch_size=5", "train.batch_size"},  // ReMax: 5 prompts x (sample + greedy) = 10 rows
           {"algorithm=grpo", "group.samples_per_prompt"},
           {"generation.max_new_tokens=90", "generation.max_new_tokens"}}) {  // 4 x (16 + 90) = 424
    auto yaml = policies::ApplyOverrides(*yaml_, {override_, "group.samples_per_prompt=5"}, "spec");
    ASSERT_TRUE(yaml.ok()) << yaml.status();
    auto started = remote->StartRank(*yaml, 0, 1, "", 0, std::chrono::seconds(5));
    EXPECT_EQ(started.status().code(), absl::StatusCode::kResourceExhausted) << override_ << ": " << started.status();
    EXPECT_THAT(std::string(started.status().message()), HasSubstr(key + "'"));
  }
  EXPECT_TRUE(remote->StartRank(*yaml_, 0, 1, "", 0, std::chrono::seconds(5)).ok());
}

// A job that places state on NVMe without naming memory.nvme_dir uses the
// worker's --nvme-dir (submit used to refuse it, so the default never
// applied); its slots live in a directory of their own there, removed with
// the job.
TEST_F(WorkerServiceTest, NvmePlacementUsesTheWorkersNvmeDirAndCleansUp) {
  StopServer();
  const std::string nvme = dir_->Join("worker-nvme");
  std::filesystem::create_directories(nvme);
  StartServer("", {}, nvme);
  auto remote = Remote("job-1");
  auto yaml = policies::ApplyOverrides(*yaml_, {"models.actor.placement.optimizer=nvme"}, "spec");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  auto started = remote->StartRank(*yaml, 0, 1, "", 0, std::chrono::seconds(5));
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_FALSE(std::filesystem::is_empty(nvme));
  ASSERT_TRUE(remote->Unload().ok());
  EXPECT_TRUE(std::filesystem::is_empty(nvme));
}

TEST_F(WorkerServiceTest, BadSpecAndBadTensorsAreInvalidArgument) {
  auto remote = Remote("job-1");
  auto load = remote->LoadModels("algorithm: remax\nmodels: {actor: {pathh: x}}\n");
  EXPECT_EQ(load.status().code(), absl::StatusCode::kInvalidArgument) << load.status();
  EXPECT_THAT(std::string(load.status().message()), HasSubstr("pathh"));

  ASSERT_TRUE(remote->LoadModels(*yaml_).ok());
  // A raw call with a malformed tensor: the service names the field.
  auto stub = v1::Worker::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  v1::UpdateRequest update;
  update.set_job_id("job-1");
  ToProto(policies::Rollout{0, {1, 5}, {6, 2}, {-1, -2}, false}, update.add_rollouts());
  ToProto(std::vector<float>{0.5f, 0.5f}, update.add_advantages());
  update.mutable_advantages(0)->set_dtype("BF16");
  grpc::ClientContext context;
  v1::UpdateResponse response;
  const grpc::Status s = stub->Update(&context, update, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("advantages[0]"));
}

// libtorch throws on an out-of-vocabulary id; the worker answers INTERNAL
// with the message and keeps serving.
TEST_F(WorkerServiceTest, LibtorchExceptionsBecomeInternal) {
  auto remote = Remote("job-1");
  ASSERT_TRUE(remote->LoadModels(*yaml_).ok());
  policies::Rollout bad{0, {1, 5}, {100000}, {-1}, false};
  auto scores = remote->Score({bad}, policies::ScoreRequest{false, true, false, false});
  EXPECT_EQ(scores.status().code(), absl::StatusCode::kInternal) << scores.status();
  EXPECT_THAT(std::string(scores.status().message()), HasSubstr("index"));
  auto fine = remote->Score({SomeRollout(0, false)}, policies::ScoreRequest{false, true, false, false});
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(fine->reference_logprobs.size(), 1u);
}

TEST_F(WorkerServiceTest, BearerTokenIsRequiredWhenConfigured) {
  StopServer();
  StartServer("s3cret");
  auto anonymous = Remote("job-1");
  EXPECT_EQ(anonymous->GetStats().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anonymous->Generate({{{1}}, {}, 1, false}).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Remote("job-1", "wrong")->GetStats().status().code(), absl::StatusCode::kUnauthenticated);
  auto stats = Remote("job-1", "s3cret")->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->worker_id(), "worker-7");
}

// The coordinator reads UNAVAILABLE as "worker lost": a worker that is gone
// and one that does not answer in time both surface as that, with the
// address in the message.
TEST_F(WorkerServiceTest, LostWorkerIsUnavailableNamingTheAddress) {
  RemoteWorkerOptions options;
  options.address = address_;
  options.job_id = "job-1";
  options.work_timeout = std::chrono::milliseconds(1);  // loading takes longer
  auto impatient = RemoteWorkerGroup::Create(options, grpc::InsecureChannelCredentials());
  ASSERT_TRUE(impatient.ok());
  auto load = (*impatient)->LoadModels(*yaml_);
  EXPECT_EQ(load.status().code(), absl::StatusCode::kUnavailable) << load.status();
  EXPECT_THAT(std::string(load.status().message()), HasSubstr(address_));

  auto remote = Remote("job-1");
  ASSERT_TRUE(remote->GetStats().ok());  // connected
  StopServer();
  // A fresh channel waits out a reconnect backoff (about 1 s) before it
  // reports the refused connection; the deadline stands in for it.
  options.work_timeout = options.control_timeout = std::chrono::milliseconds(250);
  auto after = RemoteWorkerGroup::Create(options, grpc::InsecureChannelCredentials());
  ASSERT_TRUE(after.ok());
  for (RemoteWorkerGroup* group : {remote.get(), after->get()}) {
    auto rollouts = group->Generate({{{1, 5}}, {}, 1, false});
    EXPECT_EQ(rollouts.status().code(), absl::StatusCode::kUnavailable) << rollouts.status();
    EXPECT_THAT(std::string(rollouts.status().message()), HasSubstr(address_));
  }
  EXPECT_TRUE(remote->PhaseMemory("rollout").peak_bytes.empty());  // logged, not fatal
}

TEST(RemoteWorkerGroupTest, OptionsAreValidated) {
  RemoteWorkerOptions options;
  options.job_id = "j";
  EXPECT_EQ(RemoteWorkerGroup::Create(options, grpc::InsecureChannelCredentials()).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.address = "127.0.0.1:1";
  options.work_timeout = std::chrono::milliseconds(0);
  auto s = RemoteWorkerGroup::Create(options, grpc::InsecureChannelCredentials()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("work_timeout"));
  options.work_timeout = std::chrono::seconds(1);
  EXPECT_EQ(RemoteWorkerGroup::Create(options, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::services

namespace strata::services {
namespace {

// A worker that answers every Rollout and Score with well-formed messages
// that do not fit the request: one rollout too few, one reward too few, a
// log-prob row one token short.
class MisfitWorker final : public v1::Worker::Service {
 public:
  grpc::Status Rollout(grpc::ServerContext*, const v1::RolloutRequest*, v1::RolloutResponse* response) override {
    policies::Rollout r{0, {1, 2}, {3, 4}, {-0.5f, -0.25f}, false};
    ToProto(r, response->add_rollouts());
    return grpc::Status::OK;
  }
  grpc::Status Score(grpc::ServerContext*, const v1::ScoreRequest* request, v1::ScoreResponse* response) override {
    policies::Scores scores;
    scores.rewards.assign(static_cast<size_t>(request->rollouts_size()) - (short_rewards ? 1 : 0), 1.0f);
    for (const auto& r : request->rollouts()) {
      scores.reference_logprobs.emplace_back(static_cast<size_t>(r.response_size()) - (short_rewards ? 0 : 1), -1.0f);
    }
    ToProto(scores, response);
    return grpc::Status::OK;
  }
  bool short_rewards = true;
};

TEST(RemoteWorkerGroupTest, RepliesThatDoNotFitTheBatchAreInternalNamingTheField) {
  MisfitWorker misfit;
  grpc::ServerBuilder builder;
  builder.RegisterService(&misfit);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  RemoteWorkerOptions options;
  options.address = "misfit";
  options.job_id = "job-1";
  RemoteWorkerGroup group(server->InProcessChannel(grpc::ChannelArguments()), options);

  policies::RolloutRequest request;
  request.prompts = {{1, 2}, {5, 6}};
  auto rollouts = group.Generate(request);
  ASSERT_FALSE(rollouts.ok());
  EXPECT_EQ(rollouts.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(rollouts.status().message()),
              HasSubstr("worker misfit: Rollout: malformed reply: 1 rollouts for 2 prompts x 1 samples; expected 2"));

  std::vector<policies::Rollout> batch = {{0, {1, 2}, {3, 4}, {-1, -1}, false}, {1, {5, 6}, {7}, {-1}, false}};
  auto scores = group.Score(batch, policies::ScoreRequest{true, true, false, false});
  ASSERT_FALSE(scores.ok());
  EXPECT_EQ(scores.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(scores.status().message()), HasSubstr("rewards has 1 values for 2 rollouts"));

  misfit.short_rewards = false;  // rewards fit; the log-prob rows are one token short
  scores = group.Score(batch, policies::ScoreRequest{true, true, false, false});
  ASSERT_FALSE(scores.ok());
  EXPECT_THAT(std::string(scores.status().message()),
              HasSubstr("reference_logprobs[0] has 1 values for 2 response tokens"));
  server->Shutdown();
}

}  // namespace
}  // namespace strata::services
