#include "policies/job/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "base/file.h"
#include "gtest/gtest.h"
#include "policies/config/tensor_dealer.h"
#include "tests/testutil/testutil.h"

namespace strata::policies {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// Figures with round numbers, so that expectations can be worked by hand.
HardwareFigures Figures() {
  HardwareFigures f;
  f.matmul_fp32 = {{1, 1024, 1e9}, {1024, 1024, 100e9}};
  f.matmul_bf16 = f.matmul_fp32;
  f.op_overhead_s = 1e-6;
  f.layer_overhead_s = 1e-4;
  f.decode_step_overhead_s = 1e-4;
  f.memory_copy_bytes_per_s = 10e9;
  f.host_stream_bytes_per_s = 5e9;
  f.nvme_stream_bytes_per_s = 1e9;
  f.nvme_read_bytes_per_s = 2e9;
  f.nvme_write_bytes_per_s = 2e9;
  f.adam_params_per_s = 1e9;
  f.device_adam_params_per_s = 0.5e9;
  f.allreduce_bytes_per_s = 1e9;
  f.process_baseline_bytes = 100 << 20;
  return f;
}

// A spec over the tiny example model (3.0M parameters per model).
JobSpec Spec(const std::string& algorithm, const std::vector<std::string>& overrides = {}) {
  const std::string& model = testing::TinyConfigDir();
  const std::string yaml = "algorithm: " + algorithm + "\nmodels:\n  actor: {path: " + model +
                           "}\n  reference: {path: " + model + "}\n  reward: {path: " + model +
                           "}\n  critic: {path: " + model +
                           "}\ndata: {train: p.jsonl, max_prompt_tokens: 16}\ntrain: {batch_size: 16}\n"
                           "generation: {max_new_tokens: 24}\nmemory: {nvme_dir: /tmp}\noutput: {dir: out}\n";
  auto spec = ParseJobSpec(yaml, overrides, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(MemoryPlanTest, ParsesHardwareAndNamesWhatDoesNotParse) {
  auto hw = ParseHardware("device=80GiB,host=128GiB,nvme=2TiB");
  ASSERT_TRUE(hw.ok()) << hw.status();
  EXPECT_EQ(hw->device_bytes, 80 * kGiB);
  EXPECT_EQ(hw->host_bytes, 128 * kGiB);
  EXPECT_EQ(hw->nvme_bytes, 2048 * kGiB);
  EXPECT_FALSE(hw->cpu_device);
  hw = ParseHardware("device=cpu,host=24GiB");
  ASSERT_TRUE(hw.ok()) << hw.status();
  EXPECT_TRUE(hw->cpu_device);
  EXPECT_EQ(hw->nvme_bytes, 0);

  EXPECT_NE(ParseHardware("device=80GiB").status().message().find("host=SIZE is required"), std::string::npos);
  EXPECT_NE(ParseHardware("device=8XB,host=1GiB").status().message().find("'device=8XB': unknown unit"),
            std::string::npos);
  EXPECT_NE(ParseHardware("gpu=8GiB,host=1GiB").status().message().find("unknown tier"), std::string::npos);
  EXPECT_NE(ParseHardware("host=lots,device=cpu").status().message().find("not a number"), std::string::npos);
}

TEST(MemoryPlanTest, FiguresRoundTripAndErrorsNameTheField) {
  const HardwareFigures f = Figures();
  auto parsed = ParseHardwareFigures(f.ToJson(), "f.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_DOUBLE_EQ(parsed->nvme_stream_bytes_per_s, 1e9);
  EXPECT_EQ(parsed->matmul_bf16.size(), 2u);
  auto bad = ParseHardwareFigures(R"({"matmul_fp32": [{"m": 1, "k": 8, "flops": 1}]})", "f.json");
  EXPECT_NE(bad.status().message().find("f.json: field 'matmul_bf16'"), std::string::npos) << bad.status();
  EXPECT_NE(ParseHardwareFigures("[1]", "f.json").status().message().find("not a JSON object"), std::string::npos);

  // The NVMe Adam rate: files from before it was measured lack it, and it is
  // then derived from the disk's rates (12 bytes read and written a
  // parameter), never faster than CPU Adam; once measured it round-trips.
  EXPECT_DOUBLE_EQ(parsed->nvme_adam_params_per_s, 0.0);
  EXPECT_NEAR(parsed->NvmeAdamParamsPerSecond(),
              1.0 / (12.0 / f.nvme_read_bytes_per_s + 12.0 / f.nvme_write_bytes_per_s), 1e-6);
  HardwareFigures measured = f;
  measured.nvme_adam_params_per_s = 2.5e8;
  auto with_rate = ParseHardwareFigures(measured.ToJson(), "f.json");
  ASSERT_TRUE(with_rate.ok()) << with_rate.status();
  EXPECT_DOUBLE_EQ(with_rate->NvmeAdamParamsPerSecond(), 2.5e8);
  std::string zero = measured.ToJson();
  zero.replace(zero.find("250000000"), 9, "0");
  EXPECT_NE(ParseHardwareFigures(zero, "f.json").status().message().find("field 'nvme_adam_params_per_s'"),
            std::string::npos);
}

// Blocked attention's rate at a head_dim: the rate at 64 alone in files
// from before the rate at 128 was measured; with both, interpolated in
// log(head_dim), held at the nearer one outside them.
TEST(MemoryPlanTest, BlockedAttentionsRateFollowsTheHeadDim) {
  HardwareFigures f = Figures();
  f.blocked_attention_flops_per_s = 60e9;
  for (int64_t d : {32, 64, 128, 256}) EXPECT_DOUBLE_EQ(f.BlockedAttentionFlops(d), 60e9) << d;
  f.blocked_attention_d128_flops_per_s = 90e9;
  auto parsed = ParseHardwareFigures(f.ToJson(), "f.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_DOUBLE_EQ(parsed->blocked_attention_d128_flops_per_s, 90e9);
  EXPECT_DOUBLE_EQ(parsed->BlockedAttentionFlops(32), 60e9);
  EXPECT_DOUBLE_EQ(parsed->BlockedAttentionFlops(64), 60e9);
  EXPECT_NEAR(parsed->BlockedAttentionFlops(91), 60e9 + 30e9 * (std::log2(91.0) - 6.0), 1.0);
  EXPECT_DOUBLE_EQ(parsed->BlockedAttentionFlops(128), 90e9);
  EXPECT_DOUBLE_EQ(parsed->BlockedAttentionFlops(256), 90e9);
}

TEST(MemoryPlanTest, MatmulTimeIsLinearInRowsBetweenMeasuredPoints) {
  const HardwareFigures f = Figures();
  // 1 row at 1 GFLOP/s: 2 ms for 1024 x 1024; 1024 rows at 100 GFLOP/s: 21.5 ms.
  const double one = f.MatmulSeconds(1, 1024, 1024, "fp32") - f.op_overhead_s;
  const double all = f.MatmulSeconds(1024, 1024, 1024, "fp32") - f.op_overhead_s;
  EXPECT_NEAR(one, 2.0 * 1024 * 1024 / 1e9, 1e-9);
  EXPECT_NEAR(all, 2.0 * 1024 * 1024 * 1024 / 100e9, 1e-9);
  const double mid = f.MatmulSeconds(512, 1024, 1024, "fp32") - f.op_overhead_s;
  EXPECT_NEAR(mid, one + (512.0 - 1) / (1024 - 1) * (all - one), 1e-9);
}

TEST(MemoryPlanTest, ModelStatesAreExactPerTier) {
  const JobSpec spec = Spec("remax");
  auto models = JobModels(spec);
  ASSERT_TRUE(models.ok()) << models.status();
  ASSERT_EQ(models->size(), 3u);  // actor, reference, reward
  const int64_t actor = models->at(0).config.NumParameters();
  JobPrediction p = PredictJob(spec, *models, Figures(), 1);
  // Host: the actor's fp32 master weights, gradients and two moments.
  EXPECT_EQ(p.peak[1], 16 * actor);
  EXPECT_EQ(p.peak[2], 0);
  // Device: three fp32 models and more (activations).
  EXPECT_GT(p.peak[0], 4 * (3 * actor - 2 * 259 * 256));
  EXPECT_EQ(p.phases.size(), 3u);
  EXPECT_GT(p.iteration_s, 0.0);
  EXPECT_GE(p.process_rss_bytes, p.peak[0] + p.peak[1]);  // a CPU device is host memory

  // Adam on NVMe: 12 bytes a parameter there, gradients and staging tiles on the host.
  const JobSpec nvme = Spec("remax", {"models.actor.placement.optimizer=nvme"});
  p = PredictJob(nvme, *JobModels(nvme), Figures(), 1);
  EXPECT_GE(p.peak[2], 12 * actor);
  EXPECT_LT(p.peak[2], 12 * actor + (1 << 20));
  EXPECT_EQ(p.peak[1], 4 * actor + 3 * 12 * (int64_t{1} << 20));
}

// LoRA: the adapters are all that trains (12 bytes of Adam state and 4 of
// gradient a parameter, nothing for the base), they sit on the device, and
// the reference is the actor's own base, with no bytes and no placement of
// its own.
TEST(MemoryPlanTest, LoraTrainsTheAdaptersAndTheReferenceIsTheActorsBase) {
  const JobSpec spec = Spec("remax", {"models.actor.lora={rank: 4}"});
  auto models = JobModels(spec);
  ASSERT_TRUE(models.ok()) << models.status();
  ASSERT_EQ(models->at(1).role, "reference");
  EXPECT_EQ(models->at(1).shares_base_of, "actor");
  // Per layer of the tiny model (H 256, I 688, q 256, k and v 128 wide):
  // 4 x ((256+256) + 2 (256+128) + (256+256) + 3 (256+688)); four layers.
  const int64_t adapters = 4 * 4 * (512 + 2 * 384 + 512 + 3 * 944);
  auto states = PlanModelStates(spec);
  ASSERT_TRUE(states.ok()) << states.status();
  const ModelFootprint& actor = states->models[0];
  EXPECT_EQ(actor.trained_parameters, adapters);
  EXPECT_EQ(actor.optimizer[1], 12 * adapters);
  EXPECT_EQ(actor.gradients[1], 4 * adapters);
  EXPECT_EQ(actor.weights[0], 4 * (actor.parameters + adapters));
  const ModelFootprint& reference = states->models[1];
  EXPECT_EQ(reference.shares_base_of, "actor");
  EXPECT_EQ(reference.total(0) + reference.total(1) + reference.total(2), 0);

  const JobPrediction lora = PredictJob(spec, *models, Figures(), 1);
  const JobSpec full_spec = Spec("remax");
  const JobPrediction full = PredictJob(full_spec, *JobModels(full_spec), Figures(), 1);
  EXPECT_EQ(lora.peak[1], 16 * adapters);  // the host holds the adapters' Adam state and gradients alone
  EXPECT_EQ(full.peak[1], 16 * models->at(0).config.NumParameters());
  // The device holds one copy of the base where it held two.
  EXPECT_LE(lora.peak[0], full.peak[0] - 4 * (models->at(0).config.NumParameters() - adapters));
  EXPECT_LT(lora.phases.at("update").seconds, full.phases.at("update").seconds);
  EXPECT_EQ(lora.shares_base_of.at("reference"), "actor");
  EXPECT_EQ(lora.placement.count("reference"), 0u);

  // A fit places the actor (the reference follows it), never steps layers in
  // the backward pass (the base does not train), and writes no reference key.
  auto hardware = ParseHardware("device=cpu,host=24GiB,nvme=60GB");
  ASSERT_TRUE(hardware.ok());
  const FitResult fit = FitJob(spec, *models, Figures(), *hardware, 1);
  ASSERT_TRUE(fit.fits);
  for (const JobPrediction& p : fit.candidates) EXPECT_FALSE(p.placement.at("actor").step_in_backward);
  for (const std::string& o : PredictionOverrides(fit.chosen))
    EXPECT_EQ(o.find("models.reference"), std::string::npos) << o;
}

// GaLore: the projected matrices keep a 4-byte master and their small state
// (in the host arena beside NVMe masters); everything else full Adam.
TEST(MemoryPlanTest, GaloreShrinksTheOptimizerStateOnEveryTier) {
  const JobSpec spec = Spec("remax", {"models.actor.galore={rank: 32}"});
  auto models = JobModels(spec);
  ASSERT_TRUE(models.ok()) << models.status();
  const LlamaConfig& c = models->at(0).config;
  const int64_t projected = spec.actor.galore.ProjectedParameters(c);
  const int64_t small = spec.actor.galore.StateElements(c);
  ASSERT_GT(projected, 0);
  ModelSpec model = spec.actor;
  const int64_t params = PlanModel("actor", c, model, true, false).trained_parameters;
  EXPECT_EQ(PlanModel("actor", c, model, true, false).optimizer[1],
            12 * (params - projected) + 4 * projected + 4 * small);
  model.placement.optimizer = offload::Tier::kNvme;
  const ModelFootprint nvme = PlanModel("actor", c, model, true, false);
  EXPECT_EQ(nvme.optimizer[2], 12 * (params - projected) + 4 * projected);
  EXPECT_EQ(nvme.optimizer[1], 4 * small);
  // Predicted: the host holds the small state instead of the moments.
  const JobPrediction with = PredictJob(spec, *models, Figures(), 1);
  const JobSpec full_spec = Spec("remax");
  const JobPrediction full = PredictJob(full_spec, *JobModels(full_spec), Figures(), 1);
  EXPECT_LT(with.peak[1], full.peak[1]);
  EXPECT_GT(with.phases.at("update").seconds, 0.0);
}

// When nothing fits with full Adam, a fit puts GaLore on the models that
// train in full, at the largest rank that fits, and says so in the spec it
// writes.
TEST(MemoryPlanTest, FitTurnsToGaloreWhenFullAdamFitsNowhere) {
  const JobSpec spec = Spec("ppo");
  auto models = JobModels(spec);
  ASSERT_TRUE(models.ok()) << models.status();
  Hardware hw;
  hw.cpu_device = true;
  hw.host_bytes = 64 * kGiB;
  const FitResult roomy = FitJob(spec, *models, Figures(), hw, 1);
  ASSERT_TRUE(roomy.fits);
  EXPECT_TRUE(roomy.chosen.galore_rank.empty());
  int64_t least = roomy.chosen.process_rss_bytes;
  for (const auto& c : roomy.candidates) least = std::min(least, c.process_rss_bytes);
  hw.host_bytes = least - 1;  // no placement of full Adam fits
  const FitResult fit = FitJob(spec, *models, Figures(), hw, 1);
  ASSERT_TRUE(fit.fits) << fit.binding_tier;
  ASSERT_EQ(fit.chosen.galore_rank.size(), 2u);  // the actor and the critic
  const int64_t rank = fit.chosen.galore_rank.at("actor");
  EXPECT_GE(rank, 32);
  EXPECT_LE(fit.chosen.process_rss_bytes, hw.host_bytes);
  const std::vector<std::string> overrides = PredictionOverrides(fit.chosen);
  EXPECT_NE(std::find(overrides.begin(), overrides.end(), "models.critic.galore={rank: " + std::to_string(rank) + "}"),
            overrides.end());
  const JobSpec chosen = Spec("ppo", overrides);
  EXPECT_EQ(chosen.actor.galore.rank, rank);
  EXPECT_EQ(PredictJob(chosen, *JobModels(chosen), Figures(), 1).peak, fit.chosen.peak);
}

// Activations off the device (SSDTrain): the update keeps three layer
// inputs on the device instead of every layer's and the top's; NVMe ones
// take two staging buffers in the arena and a slot on NVMe for each layer
// but the last two (they stay staged). A fit
// moves them off the device when that is what makes a job fit.
TEST(MemoryPlanTest, ActivationOffloadKeepsAWindowOnTheDevice) {
  const std::vector<std::string> long_responses = {"generation.max_new_tokens=2000", "train.batch_size=4"};
  const JobSpec kept_spec = Spec("remax", long_responses);
  std::vector<std::string> nvme = long_responses;
  nvme.push_back("models.actor.placement.activations=nvme");
  const JobSpec nvme_spec = Spec("remax", nvme);
  auto models = JobModels(kept_spec);
  ASSERT_TRUE(models.ok()) << models.status();
  const LlamaConfig& c = models->at(0).config;
  const JobPrediction kept = PredictJob(kept_spec, *models, Figures(), 1);
  const JobPrediction off = PredictJob(nvme_spec, *JobModels(nvme_spec), Figures(), 1);
  const int64_t input = 4 * 2016 * c.hidden_size * 4;  // R x T x H x fp32
  const int64_t layers = c.num_hidden_layers;
  EXPECT_EQ(kept.phases.at("update").peak[0] - off.phases.at("update").peak[0], (layers + 1 - 3) * input);
  const int64_t stride = (input + 4095) / 4096 * 4096;
  EXPECT_EQ(off.peak[2] - kept.peak[2], (layers - 2) * stride);
  const int64_t huge = int64_t{2} << 20;
  EXPECT_EQ(off.peak[1] - kept.peak[1], 2 * ((stride + huge - 1) / huge * huge));
  EXPECT_GT(off.phases.at("update").seconds, kept.phases.at("update").seconds);

  // A GPU too small for any placement with the activations kept.
  Hardware hw;
  hw.device_bytes = 64 * kGiB, hw.host_bytes = 64 * kGiB, hw.nvme_bytes = 64 * kGiB;
  const FitResult roomy = FitJob(kept_spec, *models, Figures(), hw, 1);
  ASSERT_TRUE(roomy.fits);
  int64_t least = roomy.chosen.peak[0];
  for (const auto& candidate : roomy.candidates) least = std::min(least, candidate.peak[0]);
  EXPECT_EQ(roomy.chosen.placement.at("actor").activations, offload::Tier::kDevice);
  hw.device_bytes = least - 1;
  const FitResult fit = FitJob(kept_spec, *models, Figures(), hw, 1);
  ASSERT_TRUE(fit.fits) << fit.binding_tier;
  EXPECT_EQ(fit.chosen.placement.at("actor").activations, offload::Tier::kHost);
  EXPECT_LE(fit.chosen.peak[0], hw.device_bytes);
  const std::vector<std::string> overrides = PredictionOverrides(fit.chosen);
  EXPECT_NE(std::find(overrides.begin(), overrides.end(), "models.actor.placement.activations=host"), overrides.end());
}

// On a CPU device a decoding step's products and the streamer's copy from
// the host arena contend for DRAM and add up; reads from NVMe are the
// disk's DMA and hide behind the step as any other pass's streaming does.
// With streaming far faster than a step's compute, the NVMe rollout costs
// what the resident one does at any rate, and the host one grows with its
// streaming time.
TEST(MemoryPlanTest, OnACpuDeviceDecodingAddsHostCopiesAndHidesNvmeReads) {
  const JobSpec resident_spec = Spec("remax");
  auto models = JobModels(resident_spec);
  ASSERT_TRUE(models.ok()) << models.status();
  const double resident = PredictJob(resident_spec, *models, Figures(), 1).phases.at("rollout").seconds;
  const JobSpec nvme_spec = Spec("remax", {"models.actor.placement.weights=nvme"});
  const JobSpec host_spec = Spec("remax", {"models.actor.placement.weights=host"});
  double host_before = 0;
  for (const double rate : {1e12, 2e12}) {
    HardwareFigures f = Figures();
    f.nvme_stream_bytes_per_s = f.host_stream_bytes_per_s = rate;
    const double nvme = PredictJob(nvme_spec, *JobModels(nvme_spec), f, 1).phases.at("rollout").seconds;
    const double host = PredictJob(host_spec, *JobModels(host_spec), f, 1).phases.at("rollout").seconds;
    EXPECT_DOUBLE_EQ(nvme, resident) << "at " << rate << " B/s";
    EXPECT_GT(host, resident) << "at " << rate << " B/s";
    if (host_before > 0) EXPECT_LT(host, host_before);
    host_before = host;
  }
}

// A decode step samples over its logits: top-p sorts them (values,
// indices and a cumulative sum, 16 bytes an entry beside the sampler's 8),
// and the rollout's device peak grows by that, nothing else.
TEST(MemoryPlanTest, TruncatedSamplingAddsItsSortToTheDecodeStep) {
  // One-token prompts with 16 samples each: the decode step, not the
  // prefill, sets the rollout's peak.
  const std::vector<std::string> shape = {"data.max_prompt_tokens=1", "generation.max_new_tokens=2",
                                          "group.samples_per_prompt=16"};
  std::vector<std::string> raw_overrides = shape, top_p_overrides = shape;
  raw_overrides.push_back("generation.top_p=1.0");
  top_p_overrides.push_back("generation.top_p=0.9");
  const JobSpec raw_spec = Spec("grpo", raw_overrides), top_p_spec = Spec("grpo", top_p_overrides);
  const JobPrediction raw = PredictJob(raw_spec, *JobModels(raw_spec), Figures(), 1);
  const JobPrediction top_p = PredictJob(top_p_spec, *JobModels(top_p_spec), Figures(), 1);
  // 16 prompts x 16 samples over 259 entries.
  const int64_t rows = 256, vocab = 259;
  EXPECT_EQ(top_p.phases.at("rollout").peak[0] - raw.phases.at("rollout").peak[0], 16 * rows * vocab);
  EXPECT_EQ(top_p.phases.at("rollout").seconds, raw.phases.at("rollout").seconds);
}

// Off the CPU a decode step attends over a gathered copy of its KV blocks:
// the rollout on a GPU prices, beside everything the CPU device prices,
// each layer's keys and values read and written once more at every step.
TEST(MemoryPlanTest, AGpuDecodeStepPaysForGatheringItsBlocks) {
  const JobSpec cpu_spec = Spec("remax");
  const JobSpec gpu_spec = Spec("remax", {"memory.device=cuda"});
  const double cpu = PredictJob(cpu_spec, *JobModels(cpu_spec), Figures(), 1).phases.at("rollout").seconds;
  const double gpu = PredictJob(gpu_spec, *JobModels(gpu_spec), Figures(), 1).phases.at("rollout").seconds;
  // The tiny model: 4 layers, 4 key/value heads of 32 dims, fp32; 16
  // prompts of 16 tokens, each a sample and the greedy baseline (32 rows),
  // 24 new tokens: 23 decode steps over 17 .. 39 positions.
  double gathered = 0;
  for (int64_t c = 17; c <= 39; ++c) gathered += 4 * (2.0 * 2.0 * 32 * c * 4 * 32 * 4);
  EXPECT_NEAR(gpu - cpu, gathered / Figures().memory_copy_bytes_per_s, 1e-9 * cpu);
}

// With CUDA graphs the graphs' pool keeps a decode step of the widest
// bucket for the whole rollout, and prefills run beside it: the rollout's
// device peak grows on a GPU whose actor is resident, nowhere else.
TEST(MemoryPlanTest, CudaGraphsKeepADecodeStepBesideThePrefills) {
  auto rollout_peak = [](std::vector<std::string> overrides, bool graphs) {
    overrides.push_back(std::string("generation.cuda_graphs=") + (graphs ? "true" : "false"));
    const JobSpec spec = Spec("remax", overrides);
    return PredictJob(spec, *JobModels(spec), Figures(), 1).phases.at("rollout").peak[0];
  };
  EXPECT_GT(rollout_peak({"memory.device=cuda"}, true), rollout_peak({"memory.device=cuda"}, false));
  EXPECT_EQ(rollout_peak({}, true), rollout_peak({}, false)) << "the CPU runs exact steps";
  const std::vector<std::string> streamed = {"memory.device=cuda", "models.actor.placement.weights=host"};
  EXPECT_EQ(rollout_peak(streamed, true), rollout_peak(streamed, false)) << "streamed layers run exact steps";
}

// The KV pool bounds how many continuations decode at once. A pool the
// spec sizes (kv_pool_mib) is priced whole and holds what the engine
// admits: the tiny model caches 4 layers x 2 x 4 heads x 32 dims x 4 bytes
// = 4 KiB a position, 64 KiB a block of 16, so 1 MiB is 16 blocks; a
// 16-token prompt (1 block) and its 4 continuations of 24 new tokens (2
// blocks of their own each: positions 16..38) take 9, so one prompt's 4
// decode at a time, in 16 waves. With kv_pool_mib 0 the default pool takes
// what memory.device_mib leaves: fewer continuations at once, in more
// waves, and the rollout's device peak within the budget.
TEST(MemoryPlanTest, TheKvPoolBoundsTheRolloutsConcurrency) {
  auto predict = [](std::vector<std::string> overrides) {
    overrides.push_back("group.samples_per_prompt=4");
    const JobSpec spec = Spec("grpo", overrides);
    return PredictJob(spec, *JobModels(spec), Figures(), 1);
  };
  const JobPrediction free = predict({});
  EXPECT_EQ(free.rollout_concurrency, 64);
  const JobPrediction pooled = predict({"generation.kv_pool_mib=1"});
  EXPECT_EQ(pooled.rollout_concurrency, 4);
  EXPECT_GT(pooled.phases.at("rollout").seconds, free.phases.at("rollout").seconds) << "16 waves, not 1";
  EXPECT_EQ(predict({"generation.kv_pool_mib=1", "generation.share_prefixes=false"}).rollout_concurrency, 5)
      << "a continuation alone: 16 / ceil(39 / 16)";
  EXPECT_EQ(predict({"generation.max_concurrency=5"}).rollout_concurrency, 5);

  // A budget halfway between the rollout's peak one continuation at a time
  // and its peak with all 64 at once.
  const int64_t free_peak = free.phases.at("rollout").peak[0];
  const int64_t least = predict({"generation.max_concurrency=1"}).phases.at("rollout").peak[0];
  const int64_t budget_mib = (least + (free_peak - least) / 2) >> 20;
  ASSERT_GT(free_peak, budget_mib << 20) << "the free rollout must not fit the budget for this test";
  const JobPrediction bounded = predict({"memory.device_mib=" + std::to_string(budget_mib)});
  EXPECT_LT(bounded.rollout_concurrency, 64);
  EXPECT_GT(bounded.rollout_concurrency, 1);
  EXPECT_LE(bounded.phases.at("rollout").peak[0], budget_mib << 20);
  EXPECT_GT(bounded.phases.at("rollout").seconds, free.phases.at("rollout").seconds);
  // A budget the free rollout fits changes nothing.
  const JobPrediction roomy = predict({"memory.device_mib=" + std::to_string((free_peak >> 20) + 1)});
  EXPECT_EQ(roomy.rollout_concurrency, 64);
  EXPECT_EQ(roomy.phases.at("rollout").seconds, free.phases.at("rollout").seconds);
}

// `--fit device=80GiB,...` plans a GPU even for a spec left on the CPU
// (memory.device's default): its costs and RSS are the GPU's, and the
// written spec says so.
TEST(MemoryPlanTest, AFitPricesTheDeviceItsHardwareNames) {
  const JobSpec cpu_spec = Spec("remax");
  const auto gpu = ParseHardware("device=80GiB,host=128GiB,nvme=2TiB");
  ASSERT_TRUE(gpu.ok());
  const FitResult fit = FitJob(cpu_spec, *JobModels(cpu_spec), Figures(), *gpu, 1);
  ASSERT_TRUE(fit.fits);
  EXPECT_EQ(fit.chosen.device, "cuda:0");
  std::vector<std::string> overrides = PredictionOverrides(fit.chosen);
  ASSERT_NE(std::find(overrides.begin(), overrides.end(), "memory.device=cuda:0"), overrides.end());
  const JobSpec placed = Spec("remax", overrides);
  const JobPrediction again = PredictJob(placed, *JobModels(placed), Figures(), 1);
  EXPECT_DOUBLE_EQ(again.iteration_s, fit.chosen.iteration_s);
  EXPECT_EQ(again.peak, fit.chosen.peak);
  EXPECT_EQ(again.process_rss_bytes, fit.chosen.process_rss_bytes);
  // The same placements priced on the CPU device differ.
  overrides.push_back("memory.device=cpu");
  const JobSpec on_cpu = Spec("remax", overrides);
  EXPECT_NE(PredictJob(on_cpu, *JobModels(on_cpu), Figures(), 1).iteration_s, fit.chosen.iteration_s);
  // A fit for the CPU device keeps the spec's device.
  const auto cpu = ParseHardware("device=cpu,host=24GiB,nvme=60GB");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(FitJob(cpu_spec, *JobModels(cpu_spec), Figures(), *cpu, 1).chosen.device, "");
}

// Models load one at a time: a model's tensors are read whole, then its
// streamed layers go home and only what it keeps stays. With every model's
// layers on NVMe (and the actor stepping each layer in its backward, so no
// whole-model gradient buffer), peak RSS is one model's tensors and what the
// placed models keep, well below two models' tensors.
TEST(MemoryPlanTest, ModelsLoadOneAtATime) {
  // 8 wide layers (16.8M parameters each) and a small vocabulary: the
  // layers are nearly all of a model's 537 MB.
  testing::TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.Join("config.json"), R"({"architectures": ["LlamaForCausalLM"],
      "model_type": "llama", "vocab_size": 1000, "hidden_size": 1024, "intermediate_size": 4096,
      "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8,
      "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "tie_word_embeddings": false})")
                  .ok());
  const std::string yaml =
      "algorithm: remax\nmodels:\n  actor: {path: " + dir.path() +
      ", placement: {weights: nvme, optimizer: nvme, step_in_backward: true}}\n  reference: {path: " + dir.path() +
      ", placement: {weights: nvme}}\n  reward: {path: " + dir.path() +
      ", placement: {weights: nvme}}\ndata: {train: p.jsonl, max_prompt_tokens: 16}\n"
      "train: {batch_size: 4, max_grad_norm: 0}\ngeneration: {max_new_tokens: 8}\n"
      "memory: {nvme_dir: /tmp, host_mib: 4096}\noutput: {dir: out}\n";
  auto spec = ParseJobSpec(yaml, {}, "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto models = JobModels(*spec);
  ASSERT_TRUE(models.ok()) << models.status();
  const int64_t model_bytes = 4 * models->at(0).config.NumParameters();
  const JobPrediction p = PredictJob(*spec, *models, Figures(), 1);
  const int64_t held = p.process_rss_bytes - Figures().process_baseline_bytes;
  // A whole model's tensors at the moment it loads...
  EXPECT_GT(held, model_bytes);
  // ...but never two (three models at once would be 3 * model_bytes).
  EXPECT_LT(held, 2 * model_bytes) << held;
}

TEST(MemoryPlanTest, ShardedOptimizerStatesShrinkPerRank) {
  const JobSpec spec = Spec("ppo");
  auto models = JobModels(spec);
  ASSERT_TRUE(models.ok()) << models.status();
  const JobPrediction one = PredictJob(spec, *models, Figures(), 1);
  const JobPrediction two = PredictJob(spec, *models, Figures(), 2);
  // Master and moments halve (12 B -> 6 B per parameter), and so do the
  // gradients (4 B -> 2 B, ZeRO-2) but for two layers' borrowed share: more
  // than half of the 16 B, less than ZeRO-1 alone left (10 of 16).
  const double ratio = static_cast<double>(two.peak[1]) / static_cast<double>(one.peak[1]);
  EXPECT_GT(ratio, 8.0 / 16.0);
  EXPECT_LT(ratio, 10.0 / 16.0 - 0.02) << ratio;
  EXPECT_LT(two.peak[0], one.peak[0]);  // half the rows' activations
}

// Ranks hold whole tensors (TensorDealer, as the trainer deals them), so
// the fullest rank's NVMe optimizer states are 12 bytes for each parameter
// of its deal: more than an even 1/N of the model once tensors are few per
// rank.
TEST(MemoryPlanTest, ShardedStatesAreTheFullestRanksDeal) {
  const JobSpec spec = Spec("ppo", {"models.actor.placement.optimizer=nvme", "models.critic.placement.optimizer=nvme"});
  auto models = JobModels(spec);
  ASSERT_TRUE(models.ok()) << models.status();
  const JobPrediction one = PredictJob(spec, *models, Figures(), 1);
  for (int workers : {2, 8}) {
    int64_t left = 0;  // parameters whose states leave the fullest rank
    for (const PlannedModel& m : *models) {
      if (!m.trainable) continue;
      const std::vector<int64_t> tensors = m.config.TrainedTensorElements(m.scalar_head);
      int64_t params = 0;
      for (int64_t t : tensors) params += t;
      left += params - FullestShard(tensors, workers);
      if (workers == 8) {
        EXPECT_GT(FullestShard(tensors, 8), params / 8) << m.role << ": 4 layers over 8 ranks";
      }
    }
    const JobPrediction many = PredictJob(spec, *models, Figures(), workers);
    EXPECT_EQ(one.peak[2] - many.peak[2], 12 * left) << workers << " workers";
  }
}

TEST(MemoryPlanTest, FitPicksAPlacementThatFitsAndWritesItBack) {
  const JobSpec spec = Spec("ppo");
  auto models = JobModels(spec);
  ASSERT_TRUE(models.ok()) << models.status();
  // Resident PPO needs ~58 MiB of device; 40 MiB forces streaming or smaller micro-batches.
  Hardware hw;
  hw.device_bytes = 40 << 20;
  hw.host_bytes = 1 * kGiB;
  hw.nvme_bytes = 1 * kGiB;
  const FitResult fit = FitJob(spec, *models, Figures(), hw, 1);
  ASSERT_TRUE(fit.fits);
  EXPECT_LE(fit.chosen.peak[0], hw.device_bytes);
  EXPECT_GT(fit.tried, 100);
  for (const auto& c : fit.candidates) EXPECT_GE(c.iteration_s, fit.chosen.iteration_s);
  // The spec the overrides make predicts what was chosen.
  std::vector<std::string> overrides = PredictionOverrides(fit.chosen);
  const JobSpec chosen = Spec("ppo", overrides);
  const JobPrediction again = PredictJob(chosen, *JobModels(chosen), Figures(), 1);
  EXPECT_EQ(again.peak, fit.chosen.peak);
  EXPECT_DOUBLE_EQ(again.iteration_s, fit.chosen.iteration_s);
  EXPECT_GE(chosen.memory.host_mib << 20, again.peak[1]);

  // 1 MiB of device fits nothing: the device tier binds.
  hw.device_bytes = 1 << 20;
  const FitResult none = FitJob(spec, *models, Figures(), hw, 1);
  EXPECT_FALSE(none.fits);
  EXPECT_EQ(none.binding_tier, "device");
  EXPECT_TRUE(none.candidates.empty());
  // Enough device but a host too small for the process: the host binds.
  hw.device_bytes = 1 * kGiB;
  hw.host_bytes = 64 << 20;
  EXPECT_EQ(FitJob(spec, *models, Figures(), hw, 1).binding_tier, "host");
}

// A reward model among reward.sources has its placement under its source,
// and --write puts the chosen one there (models.reward would be an error
// next to reward.sources).
TEST(MemoryPlanTest, AFitWritesARewardSourcesPlacementUnderThatSource) {
  const std::string model = std::filesystem::path(Spec("sft").actor.path).string();
  const std::string yaml = "algorithm: remax\nmodels:\n  actor: {path: " + model + "}\n  reference: {path: " + model +
                           "}\nreward:\n  sources:\n    - {name: math, kind: verifier, check: math}\n"
                           "    - {name: rm, kind: model, path: " +
                           model +
                           "}\ndata: {train: p.jsonl, max_prompt_tokens: 16}\ntrain: {batch_size: 16}\n"
                           "generation: {max_new_tokens: 24}\nmemory: {nvme_dir: /tmp}\noutput: {dir: out}\n";
  auto spec = ParseJobSpec(yaml, {}, "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto models = JobModels(*spec);
  ASSERT_TRUE(models.ok()) << models.status();
  Hardware hw;
  hw.device_bytes = 24 << 20;  // less than the three models resident: some stream
  hw.host_bytes = 1 * kGiB;
  hw.nvme_bytes = 1 * kGiB;
  const FitResult fit = FitJob(*spec, *models, Figures(), hw, 1);
  ASSERT_TRUE(fit.fits);
  const std::vector<std::string> overrides = PredictionOverrides(fit.chosen);
  bool under_source = false;
  for (const std::string& o : overrides) {
    EXPECT_EQ(o.find("models.reward."), std::string::npos) << o;
    under_source = under_source || o.rfind("reward.sources.1.placement.weights=", 0) == 0;
  }
  EXPECT_TRUE(under_source);
  auto chosen = ParseJobSpec(yaml, overrides, "test");
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(chosen->reward_sources[1].model.placement.weights, fit.chosen.placement.at("reward").weights);
  const JobPrediction again = PredictJob(*chosen, *JobModels(*chosen), Figures(), 1);
  EXPECT_EQ(again.peak, fit.chosen.peak);
}

}  // namespace
}  // namespace strata::policies
