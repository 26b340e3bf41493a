// The worker API end to end: the WorkerService on a real gRPC server and
// the coordinator's handle on it (RemoteRank). A remote rank must run a
// job's phases exactly as an in-process JobRank does.
#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policies/dist/process_group.h"
#include "policies/job/job_spec.h"
#include "policies/model/llama.h"
#include "services/coordinator/remote_rank.h"
#include "services/driver/job_runner.h"
#include "services/rank/job_rank.h"
#include "services/rank/local_worker_group.h"
#include "services/rpc/wire.h"
#include "services/worker/worker_service.h"
#include "tests/testutil/testutil.h"

namespace strata::services {
namespace {

using ::testing::HasSubstr;

TEST(WireStatusTest, StatusCodesMapOneToOneBothWays) {
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
  // A random tiny Llama with the tiny task's tokenizer in `dir`; `edit`
  // changes the weights before they are saved.
  static void SaveTinyModel(const std::string& dir, int64_t hidden,
                            const std::function<void(policies::LlamaModel&)>& edit = nullptr) {
    auto config = policies::LlamaConfig::FromJson(absl::StrCat(R"({
      "vocab_size": 259, "hidden_size": )",
                                                               hidden, R"(, "intermediate_size": )", 2 * hidden, R"(,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})"),
                                                  "tiny config");
    ASSERT_TRUE(config.ok()) << config.status();
    auto m = policies::LlamaModel::RandomInit(*config, policies::LlamaHead::kLanguageModel, at::kFloat, 3);
    if (edit) edit(*m);
    std::filesystem::create_directories(dir);
    const absl::Status saved = m->Save(dir);
    ASSERT_TRUE(saved.ok()) << saved;
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      std::filesystem::copy_file(testing::SourcePath(std::string("examples/tiny/data/") + f), dir + "/" + f);
    }
  }

  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    const std::string model = dir_->Join("model");
    SaveTinyModel(model, 64);
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

  std::unique_ptr<RemoteRank> Remote(const std::string& job_id, const std::string& token = "") {
    RemoteRankOptions options;
    options.address = address_;
    options.job_id = job_id;
    options.token = token;
    auto rank = RemoteRank::Create(options, grpc::InsecureChannelCredentials());
    EXPECT_TRUE(rank.ok()) << rank.status();
    return rank.ok() ? std::move(*rank) : nullptr;
  }

  // Joins a gang of one and loads `yaml` (the fixture's job by default).
  static absl::StatusOr<RemoteRank::Loaded> StartAlone(RemoteRank& rank, const std::string& yaml) {
    return rank.StartRank(yaml, 0, 1, {}, std::chrono::seconds(30));
  }

  static policies::JobSpec Spec() {
    auto spec = policies::ParseJobSpec(*yaml_, {}, "test spec");
    EXPECT_TRUE(spec.ok()) << spec.status();
    return spec.ok() ? *spec : policies::JobSpec{};
  }

  // The phases of a fresh run's first `iterations` RL iterations, each
  // phase's reply metrics without the rank's own time and memory.
  static absl::StatusOr<std::vector<policies::Metrics>> RunIterations(
      const std::function<absl::StatusOr<PhaseReply>(const PhaseRequest&)>& run, int64_t iterations) {
    std::vector<policies::Metrics> replies;
    STRATA_RETURN_IF_ERROR(run({"start", 0, {}, ""}).status());
    for (int64_t it = 0; it < iterations; ++it) {
      for (const char* phase : {"rollout", "score", "update"}) {
        STRATA_ASSIGN_OR_RETURN(PhaseReply reply, run({phase, it, {}, ""}));
        std::erase_if(reply.metrics, [](const auto& kv) { return IsRankMeasurement(kv.first); });
        replies.push_back(std::move(reply.metrics));
      }
    }
    return replies;
  }

  static testing::TempDir* dir_;
  static std::string* yaml_;
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

testing::TempDir* WorkerServiceTest::dir_ = nullptr;
std::string* WorkerServiceTest::yaml_ = nullptr;

// A remote rank runs the job's phases as an in-process JobRank over the
// same models does: the same replies, phase by phase, for two iterations.
TEST_F(WorkerServiceTest, RemoteRankRunsPhasesAsALocalRankDoes) {
  const policies::JobSpec spec = Spec();
  auto models = LocalWorkerGroup::Create(spec);
  ASSERT_TRUE(models.ok()) << models.status();
  auto solo = policies::ProcessGroup::Solo();
  JobRankOptions local_options;
  local_options.run_id = "local";
  local_options.metrics_path = dir_->Join("local-metrics.jsonl");
  auto local = JobRank::Create(spec, **models, (*models)->tokenizer(), *solo, local_options);
  ASSERT_TRUE(local.ok()) << local.status();

  auto remote = Remote("job-1");
  auto loaded = StartAlone(*remote, *yaml_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->tokenizer_path, (*models)->tokenizer_path());
  EXPECT_EQ(loaded->working_directory, std::filesystem::current_path().string());

  auto want = RunIterations([&](const PhaseRequest& r) { return (*local)->Run(r); }, 2);
  ASSERT_TRUE(want.ok()) << want.status();
  auto got = RunIterations([&](const PhaseRequest& r) { return remote->RunPhase(r); }, 2);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 6u);
  EXPECT_EQ(*got, *want);
  EXPECT_TRUE((*got)[1].contains("objective/scores"));
  EXPECT_TRUE((*got)[2].contains("loss/policy_avg"));
}

TEST_F(WorkerServiceTest, StatsErrorsAndUnload) {
  auto remote = Remote("job-1");
  ASSERT_TRUE(StartAlone(*remote, *yaml_).ok());

  auto stats = remote->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->worker_id(), "worker-7");
  EXPECT_EQ(stats->job_id(), "job-1");
  EXPECT_GT(stats->current_bytes().at("device"), 0);
  EXPECT_GT(stats->peak_bytes().at("device"), 0);
  EXPECT_GT(stats->cpu_seconds(), 0);
  ASSERT_TRUE(remote->RunPhase({"start", 0, {}, ""}).ok());
  ASSERT_TRUE(remote->RunPhase({"rollout", 0, {}, ""}).ok());
  stats = remote->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->peak_bytes().contains("host"));  // the rollout phase's peaks

  // The worker's own errors keep their code, with the worker's address.
  auto unknown = remote->RunPhase({"rollot", 0, {}, ""});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument) << unknown.status();
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr(address_));

  ASSERT_TRUE(remote->Unload().ok());
  stats = remote->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->job_id(), "");
  EXPECT_EQ(remote->RunPhase({"rollout", 0, {}, ""}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(remote->Unload().ok());  // nothing loaded: nothing to do
}

TEST_F(WorkerServiceTest, PhasesBeforeStartRankAreFailedPrecondition) {
  auto remote = Remote("job-1");
  auto reply = remote->RunPhase({"rollout", 0, {}, ""});
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition) << reply.status();
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("StartRank"));
}

TEST_F(WorkerServiceTest, WrongJobIdIsFailedPreconditionNamingBoth) {
  ASSERT_TRUE(StartAlone(*Remote("job-1"), *yaml_).ok());
  auto other = Remote("job-2");
  auto reply = other->RunPhase({"rollout", 0, {}, ""});
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("job-1"));
  EXPECT_THAT(std::string(reply.status().message()), HasSubstr("job-2"));
  // Nor may it unload the job it does not hold.
  const absl::Status unload = other->Unload();
  EXPECT_EQ(unload.code(), absl::StatusCode::kFailedPrecondition) << unload;
  EXPECT_THAT(std::string(unload.message()), HasSubstr("job-1"));
  auto stats = other->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->job_id(), "job-1");
}

// A gang call for a new job replaces a job left from a lost gang (its
// Unload never arrived), and the new job's phases run; the old job's calls
// are then refused.
TEST_F(WorkerServiceTest, NewGangReplacesAStaleJob) {
  auto stale = Remote("job-1");
  ASSERT_TRUE(stale->StartRank(*yaml_, 0, 1, {}, std::chrono::seconds(5)).ok());
  auto fresh = Remote("job-2");
  auto started = fresh->StartRank(*yaml_, 0, 1, {}, std::chrono::seconds(5));
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
    auto started = remote->StartRank(*yaml, 0, 1, {}, std::chrono::seconds(5));
    EXPECT_EQ(started.status().code(), absl::StatusCode::kResourceExhausted) << override_ << ": " << started.status();
    EXPECT_THAT(std::string(started.status().message()), HasSubstr(key + "'"));
  }
  EXPECT_TRUE(remote->StartRank(*yaml_, 0, 1, {}, std::chrono::seconds(5)).ok());
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
  auto started = remote->StartRank(*yaml, 0, 1, {}, std::chrono::seconds(5));
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_FALSE(std::filesystem::is_empty(nvme));
  ASSERT_TRUE(remote->Unload().ok());
  EXPECT_TRUE(std::filesystem::is_empty(nvme));
}

TEST_F(WorkerServiceTest, BadSpecIsInvalidArgumentNamingTheKey) {
  auto remote = Remote("job-1");
  auto started = StartAlone(*remote, "algorithm: remax\nmodels: {actor: {pathh: x}}\n");
  EXPECT_EQ(started.status().code(), absl::StatusCode::kInvalidArgument) << started.status();
  EXPECT_THAT(std::string(started.status().message()), HasSubstr("pathh"));
  auto stats = remote->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->job_id(), "") << "a failed start holds nothing";
}

// libtorch throws where it samples from a distribution of NaNs (here: a
// model whose final norm is NaN); the worker answers INTERNAL with the
// message and keeps serving.
TEST_F(WorkerServiceTest, LibtorchExceptionsBecomeInternal) {
  const std::string broken = dir_->Join("nan-model");
  int poisoned = 0;
  SaveTinyModel(broken, 32, [&](policies::LlamaModel& m) {
    for (auto& [name, tensor] : m.NamedParameters()) {
      if (name == "model.norm.weight") tensor.fill_(std::numeric_limits<float>::quiet_NaN()), ++poisoned;
    }
  });
  ASSERT_EQ(poisoned, 1);
  auto yaml = policies::ApplyOverrides(*yaml_, {"models.actor.path=" + broken}, "spec");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  auto remote = Remote("job-1");
  ASSERT_TRUE(StartAlone(*remote, *yaml).ok());
  ASSERT_TRUE(remote->RunPhase({"start", 0, {}, ""}).ok());
  auto rollout = remote->RunPhase({"rollout", 0, {}, ""});
  EXPECT_EQ(rollout.status().code(), absl::StatusCode::kInternal) << rollout.status();
  EXPECT_THAT(std::string(rollout.status().message()), HasSubstr("libtorch"));
  // Still serving: the same worker starts and runs a job that fits.
  auto fine = Remote("job-2");
  ASSERT_TRUE(StartAlone(*fine, *yaml_).ok());
  ASSERT_TRUE(fine->RunPhase({"start", 0, {}, ""}).ok());
  auto fine_rollout = fine->RunPhase({"rollout", 0, {}, ""});
  EXPECT_TRUE(fine_rollout.ok()) << fine_rollout.status();
}

TEST_F(WorkerServiceTest, BearerTokenIsRequiredWhenConfigured) {
  StopServer();
  StartServer("s3cret");
  auto anonymous = Remote("job-1");
  EXPECT_EQ(anonymous->GetStats().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(StartAlone(*anonymous, *yaml_).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anonymous->RunPhase({"rollout", 0, {}, ""}).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(anonymous->Unload().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Remote("job-1", "wrong")->GetStats().status().code(), absl::StatusCode::kUnauthenticated);
  auto stats = Remote("job-1", "s3cret")->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->worker_id(), "worker-7");
}

// The coordinator reads UNAVAILABLE as "worker lost": a worker that is gone
// and one that does not answer in time both surface as that, with the
// address in the message.
TEST_F(WorkerServiceTest, LostWorkerIsUnavailableNamingTheAddress) {
  RemoteRankOptions options;
  options.address = address_;
  options.job_id = "job-1";
  options.work_timeout = std::chrono::milliseconds(1);  // loading takes longer
  auto impatient = RemoteRank::Create(options, grpc::InsecureChannelCredentials());
  ASSERT_TRUE(impatient.ok());
  auto started = StartAlone(**impatient, *yaml_);
  EXPECT_EQ(started.status().code(), absl::StatusCode::kUnavailable) << started.status();
  EXPECT_THAT(std::string(started.status().message()), HasSubstr(address_));

  auto remote = Remote("job-1");
  ASSERT_TRUE(remote->GetStats().ok());  // connected
  StopServer();
  // A fresh channel waits out a reconnect backoff (about 1 s) before it
  // reports the refused connection; the deadline stands in for it.
  options.work_timeout = options.control_timeout = std::chrono::milliseconds(250);
  auto after = RemoteRank::Create(options, grpc::InsecureChannelCredentials());
  ASSERT_TRUE(after.ok());
  for (RemoteRank* rank : {remote.get(), after->get()}) {
    auto reply = rank->RunPhase({"rollout", 0, {}, ""});
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kUnavailable) << reply.status();
    EXPECT_THAT(std::string(reply.status().message()), HasSubstr(address_));
    const absl::Status unload = rank->Unload();
    EXPECT_EQ(unload.code(), absl::StatusCode::kUnavailable) << unload;
  }
}

TEST(RemoteRankTest, OptionsAreValidated) {
  RemoteRankOptions options;
  options.job_id = "j";
  EXPECT_EQ(RemoteRank::Create(options, grpc::InsecureChannelCredentials()).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.address = "127.0.0.1:1";
  options.work_timeout = std::chrono::milliseconds(0);
  auto s = RemoteRank::Create(options, grpc::InsecureChannelCredentials()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("work_timeout"));
  options.work_timeout = std::chrono::seconds(1);
  EXPECT_EQ(RemoteRank::Create(options, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::services
