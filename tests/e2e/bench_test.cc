// The offload benches that must also run without a GPU, as the real binary:
// `bench transfer --device cpu` (the plumbing of the H2D/D2H bench) and a
// small `bench stream`; and the clear refusal of a GPU device by a CPU build.
#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
#include "offload/host/cuda_host.h"
#include "policies/model/fused_attention.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

using nlohmann::json;

testing::CommandResult Strata(std::vector<std::string> args) {
  args.insert(args.begin(), testing::StrataBinary());
  auto result = testing::RunCommand(args);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : testing::CommandResult{};
}

TEST(BenchTest, TransferOnTheCpuDeviceReportsBothSides) {
  const auto run = Strata({"bench", "transfer", "--device", "cpu", "--size-mib", "4", "--repeats", "2", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.error;
  const json j = json::parse(run.output);
  EXPECT_EQ(j["device"], "cpu");
  for (const char* key : {"ours_h2d_gbps", "ours_d2h_gbps", "torch_h2d_gbps", "torch_d2h_gbps"}) {
    EXPECT_GT(j[key].get<double>(), 0) << key;
  }
  EXPECT_EQ(j["arena_pinned"], false);
}

TEST(BenchTest, GpuDevicesAreRefusedByACpuBuild) {
  if (offload::CudaBuilt()) GTEST_SKIP() << "CUDA build";
  for (const std::string sub : {"transfer", "stream", "rollout"}) {
    std::vector<std::string> args = {"bench", sub, "--device", "cuda"};
    if (sub == "rollout") {
      args.insert(args.end(),
                  {"--config", testing::SourcePath("examples/tiny/model.json"), "--prompts", "1", "--new-tokens", "2"});
    }
    const auto run = Strata(args);
    EXPECT_NE(run.exit_code, 0) << sub;
    EXPECT_NE(run.error.find("FAILED_PRECONDITION"), std::string::npos) << run.error;
    EXPECT_NE(run.error.find("without CUDA"), std::string::npos) << run.error;
  }
  const auto bad = Strata({"bench", "transfer", "--device", "tpu"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.error.find("expected cpu, cuda or cuda:N"), std::string::npos) << bad.error;
}

// `bench long` as the GPU stage runs it: the fused mode is skipped where
// libtorch lacks the kernel (Debian's 1.13), a LoRA step runs beside it,
// and a GPU or an unknown device is refused naming --device.
TEST(BenchTest, LongStepSkipsFusedAttentionWithoutTheKernelAndRefusesAMissingGpu) {
  testing::TempDir dir;
  const std::string config = testing::SourcePath("examples/tiny/model.json");
  const auto run = Strata({"bench", "long", "--config", config, "--layers", "1", "--tokens", "64", "--modes",
                           "blocked,fused", "--lora-rank", "4", "--nvme-dir", dir.Join("nvme"), "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.error;
  const json j = json::parse(run.output);
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["lora_rank"], 4);
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_GT(j["runs"][0]["step_s"].get<double>(), 0.0);
  EXPECT_EQ(j["runs"][1].contains("skipped"), !policies::FusedAttentionAvailable()) << run.output;
  if (!offload::CudaBuilt()) {
    const auto gpu = Strata({"bench", "long", "--config", config, "--tokens", "64", "--device", "cuda"});
    EXPECT_NE(gpu.error.find("without CUDA"), std::string::npos) << gpu.error;
  }
  const auto bad = Strata({"bench", "long", "--config", config, "--tokens", "64", "--device", "tpu"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.error.find("--device"), std::string::npos) << bad.error;
}

// The rollout bench as a user runs it, in the fixed-shape steps a GPU's
// CUDA graphs replay: every forced token decoded by both loops (the bench
// fails otherwise), some rows padded into their bucket. Whether tokens
// agree is the engine tests' to say, with their margins: here another
// CPU's kernels could meet a near-tie.
TEST(BenchTest, RolloutInFixedShapeStepsMatchesTheStaticLoop) {
  const auto run = Strata({"bench", "rollout", "--config", testing::SourcePath("examples/tiny/model.json"), "--prompts",
                           "6", "--new-tokens", "12", "--steps", "fixed", "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.error;
  const json j = json::parse(run.output);
  EXPECT_EQ(j["steps"], "fixed");
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_GT(j["engine_padded_rows"].get<int64_t>(), 0);
  EXPECT_EQ(j["engine_captured_graphs"].get<int64_t>(), 0) << "no graphs on the CPU";
  EXPECT_EQ(j["greedy_continuations"].get<int64_t>(), 6 * 5) << "each prompt's 4 samples and baseline, greedily";
  EXPECT_EQ(j["sampled_total"].get<int64_t>(), 6 * 4);
}

TEST(BenchTest, SmallStreamStepStaysWithinItsBudget) {
  testing::TempDir dir;
  // 230K parameters: weights + Adam states are 3.5 MiB, 1.75x the budget.
  const auto run = Strata({"bench", "stream", "--layers", "4", "--hidden", "64", "--vocab", "128", "--seq", "16",
                           "--steps", "1", "--device-budget-mib", "2", "--nvme-dir", dir.Join("nvme"), "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.error;
  const json j = json::parse(run.output);
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_TRUE(j["within_budget"].get<bool>()) << run.output;
  EXPECT_TRUE(j["losses_equal"].get<bool>()) << run.output;
  EXPECT_LE(j["peak_device_bytes"].get<size_t>(), j["device_budget_bytes"].get<size_t>());
  EXPECT_GT(j["oversubscription"].get<double>(), 1.5);
}

}  // namespace
}  // namespace strata
