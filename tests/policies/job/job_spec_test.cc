#include "policies/job/job_spec.h"

#include <cmath>
#include <filesystem>

#include "gtest/gtest.h"
#include "tests/testutil/testutil.h"

namespace strata::policies {
namespace {

constexpr char kRemax[] = R"(
algorithm: remax
models:
  actor: {path: out/sft}
  reward: {rule: vowel_fraction}
data: {train: prompts.jsonl}
train: {iterations: 5, lr: 1.0e-4}
output: {dir: out/remax}
)";

std::string ErrorOf(const std::string& yaml, std::vector<std::string> overrides = {}) {
  auto spec = ParseJobSpec(yaml, overrides, "job.yaml");
  return spec.ok() ? "" : std::string(spec.status().message());
}

TEST(JobSpecTest, ParsesDefaultsAndFields) {
  auto spec = ParseJobSpec(kRemax, {}, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->algorithm, Algorithm::kRemax);
  EXPECT_EQ(spec->actor.path, "out/sft");
  EXPECT_EQ(spec->reward.rule, "vowel_fraction");
  EXPECT_EQ(spec->train.iterations, 5);
  EXPECT_DOUBLE_EQ(spec->train.lr, 1e-4);
  EXPECT_EQ(spec->train.batch_size, 16);                     // default
  EXPECT_EQ(spec->checkpoint.dir, "out/remax/checkpoints");  // derived default
  EXPECT_EQ(spec->actor.placement.weights, offload::Tier::kDevice);
}

TEST(JobSpecTest, SetOverridesAnyFieldIncludingNewOnes) {
  auto spec = ParseJobSpec(kRemax,
                           {"train.iterations=6", "train.seed=9", "train.lr=0.5", "checkpoint.every=2",
                            "models.actor.placement.weights=host", "algorithm=ppo", "models.critic.path=c"},
                           "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->train.iterations, 6);
  EXPECT_EQ(spec->train.seed, 9u);
  EXPECT_DOUBLE_EQ(spec->train.lr, 0.5);
  EXPECT_EQ(spec->checkpoint.every, 2);
  EXPECT_EQ(spec->actor.placement.weights, offload::Tier::kHost);
  EXPECT_EQ(spec->algorithm, Algorithm::kPpo);
  EXPECT_FALSE(spec->memory.pin_host);  // default
  auto pinned = ParseJobSpec(kRemax, {"memory.pin_host=true"}, "job.yaml");
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_TRUE(pinned->memory.pin_host);
  EXPECT_EQ(spec->memory.device, "cpu");  // default
  auto gpu = ParseJobSpec(kRemax, {"memory.device=cuda:1"}, "job.yaml");
  ASSERT_TRUE(gpu.ok()) << gpu.status();  // whether it exists is the worker's check
  EXPECT_EQ(gpu->memory.device, "cuda:1");
  // The device is parsed once, with the spec: what reads it needs no parser.
  EXPECT_EQ(gpu->memory.device_index, 1);
  EXPECT_FALSE(gpu->memory.on_cpu());
  EXPECT_EQ(spec->memory.device_index, -1);
  EXPECT_TRUE(spec->memory.on_cpu());
  // A spec built in code that names one device and carries another is refused.
  JobSpec mixed = *gpu;
  mixed.memory.device = "cuda:0";
  EXPECT_NE(std::string(mixed.Validate().message()).find("memory.device"), std::string::npos);
}

// A number in a --set path indexes a list: one field of one reward source.
TEST(JobSpecTest, SetReachesIntoAList) {
  const std::vector<std::string> two = {
      "reward.sources=[{name: a, kind: verifier, check: math}, {name: b, kind: verifier, check: exact}]"};
  auto spec = ParseJobSpec(kRemax, {two[0], "models.reward={}", "reward.sources.1.weight=0.5"}, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->reward_sources.size(), 2u);
  EXPECT_DOUBLE_EQ(spec->reward_sources[0].weight, 1.0);
  EXPECT_DOUBLE_EQ(spec->reward_sources[1].weight, 0.5);
  EXPECT_NE(ErrorOf(kRemax, {two[0], "models.reward={}", "reward.sources.2.weight=1"})
                .find("'sources' is a list of 2 items; '2' is not an index into it"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {two[0], "models.reward={}", "reward.sources.b.weight=1"}).find("'b' is not an index"),
            std::string::npos);
}

TEST(JobSpecTest, ErrorsNameTheKey) {
  EXPECT_NE(ErrorOf(kRemax, {"train.iteratons=3"}).find("train.iteratons"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"train.iterations=many"}).find("train.iterations"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"train.lr=-1"}).find("train.lr"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"algorithm=dpo"}).find("algorithm"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"generation.top_p=1.5"}).find("generation.top_p"), std::string::npos);
  // Sizes whose bytes would overflow int64 (2^43 MiB and up) are refused.
  EXPECT_NE(ErrorOf(kRemax, {"memory.device_mib=8796093022208"}).find("memory.device_mib"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"memory.host_mib=1073741825"}).find("memory.host_mib"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"generation.kv_pool_mib=1073741825"}).find("generation.kv_pool_mib"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"models.actor.placement.weights=gpu"}).find("models.actor.placement.weights"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"models.actor.placement.optimizer=device"}).find("placement"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"models.actor.path="}).find("models.actor.path"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"output.dir="}).find("output.dir"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"bogus=1"}).find("bogus"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"memory.pin_host=3"}).find("memory.pin_host"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"memory.device=gpu"}).find("memory.device"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"parallel.backend=mpi"}).find("parallel.backend"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"parallel.backend=nccl"}).find("memory.device: cpu"), std::string::npos);
  EXPECT_EQ(ErrorOf(kRemax, {"parallel.backend=nccl", "memory.device=cuda"}), "");
  EXPECT_NE(ErrorOf(kRemax, {"noequals"}).find("noequals"), std::string::npos);
  EXPECT_NE(ErrorOf("algorithm: [remax"), "");  // malformed YAML
  EXPECT_NE(ErrorOf("- a\n- b\n").find("mapping"), std::string::npos);
  EXPECT_EQ(ErrorOf(kRemax), "");  // the unmodified spec is fine
  EXPECT_NE(ErrorOf(kRemax, {"train.batch_size=0"}).find("job.yaml"), std::string::npos);
  // Greedy eval responses are all the same, so one per prompt.
  EXPECT_NE(ErrorOf(kRemax, {"eval.greedy=true"}).find("eval.samples_per_prompt"), std::string::npos);
  EXPECT_EQ(ErrorOf(kRemax, {"eval.greedy=true", "eval.samples_per_prompt=1"}), "");
  EXPECT_NE(ErrorOf(kRemax, {"eval.greedy=often"}).find("eval.greedy"), std::string::npos);
}

// models.<role>.lora: PEFT's settings, on the models that train only, and
// what each setting refuses named by its key.
TEST(JobSpecTest, LoraSettingsAndWhatTheyExclude) {
  auto spec = ParseJobSpec(kRemax,
                           {"models.actor.lora={rank: 8, alpha: 32, dropout: 0.05, use_rslora: true, "
                            "target_modules: [q_proj, v_proj]}",
                            "output.merge_lora=true"},
                           "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->actor.lora.rank, 8);
  EXPECT_DOUBLE_EQ(spec->actor.lora.alpha, 32);
  EXPECT_DOUBLE_EQ(spec->actor.lora.dropout, 0.05);
  EXPECT_TRUE(spec->actor.lora.use_rslora);
  EXPECT_DOUBLE_EQ(spec->actor.lora.scaling(), 32 / std::sqrt(8.0));
  EXPECT_EQ(spec->actor.lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_TRUE(spec->merge_lora);
  // The defaults: every projection, alpha 2 x rank.
  auto plain = ParseJobSpec(kRemax, {"models.actor.lora={rank: 4}"}, "job.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->actor.lora.Modules()->size(), 7u);
  EXPECT_DOUBLE_EQ(plain->actor.lora.scaling(), 2.0);
  EXPECT_FALSE(plain->reference.lora.enabled());

  auto error = [](std::vector<std::string> overrides) { return ErrorOf(kRemax, std::move(overrides)); };
  EXPECT_NE(error({"models.actor.lora={rank: 0}"}).find("'models.actor.lora.rank'"), std::string::npos);
  EXPECT_NE(error({"models.actor.lora={alpha: 8}"}).find("'models.actor.lora.rank'"), std::string::npos);
  EXPECT_NE(error({"models.actor.lora={rank: 4, target_modules: [qkv_proj]}"}).find("models.actor.lora.target_modules"),
            std::string::npos);
  EXPECT_NE(error({"models.actor.lora={rank: 4, dropout: 1}"}).find("models.actor.lora.dropout"), std::string::npos);
  EXPECT_NE(error({"models.actor.lora={rank: 4, ranks: 4}"}).find("models.actor.lora.ranks"), std::string::npos);
  EXPECT_NE(error({"models.reference.lora={rank: 4}"}).find("models.reference.lora"), std::string::npos);
  EXPECT_NE(error({"models.reward={path: /m, lora: {rank: 4}}"}).find("models.reward.lora"), std::string::npos);
  EXPECT_NE(error({"models.actor.lora={rank: 4}", "models.actor.placement.step_in_backward=true",
                   "train.max_grad_norm=0"})
                .find("models.actor.placement.step_in_backward"),
            std::string::npos);
  EXPECT_NE(error({"output.merge_lora=true"}).find("output.merge_lora"), std::string::npos);
  EXPECT_NE(error({"models.reference={path: out/sft, adapter: out/a}"}).find("models.reference.adapter"),
            std::string::npos);
  EXPECT_NE(error({"models.critic={init: c.json, adapter: out/a}", "algorithm=ppo"}).find("models.critic.adapter"),
            std::string::npos);
  EXPECT_EQ(error({"models.actor.adapter=out/sft-lora"}), "");
  EXPECT_EQ(error({"models.actor.lora={rank: 4, target_modules: all-linear}"}), "");
}

// models.<role>.galore: the paper's defaults, on models that train in full
// only, bad values named by their key.
TEST(JobSpecTest, GaloreSettingsAndWhatTheyExclude) {
  auto spec = ParseJobSpec(kRemax, {"models.actor.galore={rank: 64, update_proj_gap: 50, scale: 0.5}"}, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->actor.galore.rank, 64);
  EXPECT_EQ(spec->actor.galore.update_proj_gap, 50);
  EXPECT_DOUBLE_EQ(spec->actor.galore.scale, 0.5);
  auto plain = ParseJobSpec(kRemax, {"models.actor.galore={rank: 8}"}, "job.yaml");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->actor.galore.update_proj_gap, 200);
  EXPECT_DOUBLE_EQ(plain->actor.galore.scale, 0.25);
  EXPECT_FALSE(plain->critic.galore.enabled());

  auto error = [](std::vector<std::string> overrides) { return ErrorOf(kRemax, std::move(overrides)); };
  EXPECT_NE(error({"models.actor.galore={rank: 0}"}).find("'models.actor.galore.rank'"), std::string::npos);
  EXPECT_NE(error({"models.actor.galore={scale: 1}"}).find("'models.actor.galore.rank'"), std::string::npos);
  EXPECT_NE(error({"models.actor.galore={rank: 8, update_proj_gap: 0}"}).find("'models.actor.galore.update_proj_gap'"),
            std::string::npos);
  EXPECT_NE(error({"models.actor.galore={rank: 8, scale: -1}"}).find("'models.actor.galore.scale'"), std::string::npos);
  EXPECT_NE(error({"models.actor.galore={rank: 8, gap: 10}"}).find("models.actor.galore.gap"), std::string::npos);
  EXPECT_NE(error({"models.actor.galore={rank: 8}", "models.actor.lora={rank: 4}"}).find("models.actor.galore"),
            std::string::npos);
  EXPECT_NE(error({"models.reference.galore={rank: 8}"}).find("models.reference.galore"), std::string::npos);
  EXPECT_NE(error({"models.reward={path: /m, galore: {rank: 8}}"}).find("models.reward.galore"), std::string::npos);
  EXPECT_EQ(error({"models.critic={init: c.json, galore: {rank: 8}}", "algorithm=ppo"}), "");
}

// Learning-rate schedules: warmup ramps to 1, then constant, linear to 0 or
// half a cosine to 0 over the remaining iterations; bad keys are named.
TEST(JobSpecTest, LearningRateSchedules) {
  TrainSpec t;
  t.iterations = 10;
  t.warmup_iterations = 2;
  t.lr_schedule = "constant";
  EXPECT_DOUBLE_EQ(LearningRateScale(t, 0), 0.5);
  EXPECT_DOUBLE_EQ(LearningRateScale(t, 1), 1.0);
  EXPECT_DOUBLE_EQ(LearningRateScale(t, 9), 1.0);
  t.lr_schedule = "linear";
  EXPECT_DOUBLE_EQ(LearningRateScale(t, 2), 1.0);
  EXPECT_DOUBLE_EQ(LearningRateScale(t, 6), 0.5);
  EXPECT_DOUBLE_EQ(LearningRateScale(t, 9), 0.125);
  t.lr_schedule = "cosine";
  EXPECT_DOUBLE_EQ(LearningRateScale(t, 2), 1.0);
  EXPECT_NEAR(LearningRateScale(t, 6), 0.5, 1e-12);
  EXPECT_NEAR(LearningRateScale(t, 4), 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
  t.warmup_iterations = 0;
  EXPECT_DOUBLE_EQ(LearningRateScale(t, 0), 1.0);

  auto spec = ParseJobSpec(kRemax, {"train.lr_schedule=cosine", "train.warmup_iterations=2", "train.max_grad_norm=1"},
                           "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->train.lr_schedule, "cosine");
  EXPECT_EQ(spec->train.warmup_iterations, 2);
  EXPECT_DOUBLE_EQ(spec->train.max_grad_norm, 1.0);
  EXPECT_NE(ErrorOf(kRemax, {"train.lr_schedule=step"}).find("train.lr_schedule"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"train.warmup_iterations=6"}).find("train.warmup_iterations"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"train.max_grad_norm=-1"}).find("train.max_grad_norm"), std::string::npos);
}

// Found by a hostile probe: each of these used to pass or to confuse.
TEST(JobSpecTest, RefusesWhatAProbeGotThrough) {
  for (const char* bad : {"train.lr=.inf", "train.lr=.nan", "train.weight_decay=-.inf", "ppo.kl_coef=.inf"}) {
    const std::string error = ErrorOf(kRemax, {bad});
    const std::string key = std::string(bad).substr(0, std::string(bad).find('='));
    EXPECT_NE(error.find(key), std::string::npos) << bad << ": " << error;
    EXPECT_NE(error.find("finite"), std::string::npos) << bad << ": " << error;
  }
  // An unsigned setting given a negative number says so, not "not an integer".
  EXPECT_NE(ErrorOf(kRemax, {"train.seed=-1"}).find("train.seed' must be >= 0, got -1"), std::string::npos)
      << ErrorOf(kRemax, {"train.seed=-1"});
  // A repeated key would silently drop one of its values.
  const std::string twice = std::string(kRemax) + "train: {iterations: 9}\n";
  EXPECT_NE(ErrorOf(twice).find("'train' appears twice"), std::string::npos) << ErrorOf(twice);
  const std::string nested = "algorithm: remax\nmodels:\n  actor: {path: a, path: b}\n";
  EXPECT_NE(ErrorOf(nested).find("'models.actor.path' appears twice"), std::string::npos) << ErrorOf(nested);
  // Not UTF-8 (random bytes): named, with where.
  EXPECT_NE(ErrorOf(std::string("algorithm: remax\n\xff\xfe\x01") + "x").find("not UTF-8 text (byte 17)"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"name=\xc3("}).find("not UTF-8"), std::string::npos);
  // Control characters would be written back raw when the service stores
  // the spec, which then no longer parses (found by the job_spec fuzzer).
  EXPECT_NE(ErrorOf(std::string(kRemax) + "name: a\x01b\n").find("control character (byte"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {std::string("memory.nvme_dir=/\0\rx", 20)}).find("control character"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"name=a\nalgorithm: ppo"}).find("line break"), std::string::npos);
  EXPECT_EQ(ErrorOf(std::string(kRemax) + "name: \"tab\there\"\r\n"), "");  // tabs and CRLF are fine
}

TEST(JobSpecTest, HugeInputIsRefusedAndNeverEchoedWhole) {
  const std::string big(kMaxJobSpecBytes + 1, '#');  // a YAML comment, 1 MiB + 1
  EXPECT_NE(ErrorOf(big).find("at most 1048576"), std::string::npos);
  const std::string value(10 << 20, 'x');
  for (const std::string& o : {"algorithm=" + value.substr(0, 1000), "noequals" + value.substr(0, 1000),
                               "models.actor.placement.weights=" + value.substr(0, 1000), "k" + value + "=1"}) {
    const std::string error = ErrorOf(kRemax, {o});
    EXPECT_FALSE(error.empty());
    EXPECT_LT(error.size(), 400u) << error.substr(0, 400);
  }
}

TEST(JobSpecTest, NvmePlacementParsesWithoutADirectoryTheWorkerMayGiveOne) {
  auto spec = ParseJobSpec(kRemax, {"models.actor.placement.weights=nvme"}, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->UsesNvme());
  EXPECT_TRUE(spec->memory.nvme_dir.empty());
  auto plain = ParseJobSpec(kRemax, {}, "job.yaml");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->UsesNvme());
}

// Activations off the device: on a model that trains; NVMe ones need the
// NVMe tier like any other nvme placement.
TEST(JobSpecTest, ActivationPlacementIsForTrainedModels) {
  auto spec = ParseJobSpec(kRemax, {"models.actor.placement.activations=nvme"}, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->actor.placement.activations, offload::Tier::kNvme);
  EXPECT_TRUE(spec->UsesNvme());
  EXPECT_NE(ErrorOf(kRemax, {"models.reference.placement.activations=host"})
                .find("models.reference.placement.activations' is for a model that trains"),
            std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"models.actor.placement.activations=disk"}).find("models.actor.placement.activations"),
            std::string::npos);
}

// A worker's confinement: paths resolve (symlinks followed) inside its data
// roots or the job is refused naming the key, the same whether the target
// exists or not.
TEST(JobSpecTest, PathsMustStayInsideTheDataRoots) {
  testing::TempDir root, other;
  std::filesystem::create_directories(root.Join("out"));
  std::filesystem::create_symlink(other.path(), root.Join("escape"));
  auto check = [&](std::vector<std::string> overrides) -> std::string {
    auto spec = ParseJobSpec(kRemax, overrides, "job.yaml");
    EXPECT_TRUE(spec.ok()) << spec.status();
    const absl::Status s = CheckPathsWithin(*spec, root.path(), {root.path()});
    if (!s.ok()) {
      EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
    }
    return std::string(s.message());
  };
  EXPECT_EQ(check({}), "");  // relative paths under the root, existing or not
  EXPECT_EQ(check({"output.dir=" + root.Join("out/remax")}), "");
  EXPECT_NE(check({"output.dir=/tmp/x"}).find("spec key 'output.dir': /tmp/x is outside"), std::string::npos);
  EXPECT_NE(check({"output.dir=../../../../tmp/x"}).find("output.dir"), std::string::npos);
  EXPECT_NE(check({"output.dir=out/../../x"}).find("output.dir"), std::string::npos);
  EXPECT_NE(check({"data.train=escape/prompts.jsonl"}).find("data.train"), std::string::npos);
  EXPECT_NE(check({"memory.nvme_dir=/nvme"}).find("memory.nvme_dir"), std::string::npos);
  EXPECT_NE(check({"models.reference.path=/models/ref"}).find("models.reference.path"), std::string::npos);
  EXPECT_NE(check({"data.chat_template_file=/etc/t.jinja"}).find("data.chat_template_file"), std::string::npos);
  // No oracle: a file that exists and one that does not get the same answer.
  const std::string exists = check({"data.train=/etc/passwd"}), missing = check({"data.train=/etc/no-such-file"});
  EXPECT_NE(exists.find("data.train"), std::string::npos);
  EXPECT_EQ(exists.substr(0, exists.find("/etc/")), missing.substr(0, missing.find("/etc/")));
  // An allow-listed directory is fine.
  auto spec = ParseJobSpec(kRemax, {"data.train=" + other.Join("p.jsonl")}, "job.yaml");
  ASSERT_TRUE(spec.ok());
  EXPECT_TRUE(CheckPathsWithin(*spec, root.path(), {root.path(), other.path()}).ok());
}

TEST(JobSpecTest, DataKeysAndChatTemplateSettings) {
  auto defaults = ParseJobSpec(kRemax, {}, "job.yaml");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->data.prompt_key, "prompt");
  EXPECT_EQ(defaults->data.label_key, "");
  EXPECT_EQ(defaults->data.response_key, "response");
  EXPECT_EQ(defaults->data.chosen_key, "chosen");
  EXPECT_EQ(defaults->data.rejected_key, "rejected");
  EXPECT_FALSE(defaults->data.apply_chat_template);
  EXPECT_EQ(defaults->data.template_args_json, "{}");
  EXPECT_EQ(defaults->data.overlong_prompts, "truncate_left");
  EXPECT_TRUE(defaults->generation.stop_token_ids.empty());

  auto spec = ParseJobSpec(std::string(kRemax) + R"(
generation: {stop_token_ids: [151645, 151643]}
)",
                           {"data.prompt_key=messages", "data.label_key=answer", "data.apply_chat_template=true",
                            "data.template_args={enable_thinking: false, tools_note: \"x: y\", depth: 2, ratio: 0.5}",
                            "data.template_date=2026-11-27T15:40:00+00:00", "data.overlong_prompts=drop",
                            "data.chat_template_name=tool_use"},
                           "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->data.prompt_key, "messages");
  EXPECT_EQ(spec->data.label_key, "answer");
  EXPECT_TRUE(spec->data.apply_chat_template);
  // YAML's plain scalars keep their types in the template's arguments; a quoted one stays a string.
  EXPECT_EQ(spec->data.template_args_json, R"({"depth":2,"enable_thinking":false,"ratio":0.5,"tools_note":"x: y"})");
  EXPECT_EQ(spec->data.template_date, "2026-11-27T15:40:00+00:00");
  EXPECT_EQ(spec->data.overlong_prompts, "drop");
  EXPECT_EQ(spec->data.chat_template_name, "tool_use");
  EXPECT_EQ(spec->generation.stop_token_ids, (std::vector<int64_t>{151645, 151643}));

  EXPECT_EQ(ErrorOf(kRemax, {"data.overlong_prompts=left"}),
            "job.yaml: spec key 'data.overlong_prompts' must be truncate_left or drop, got 'left'");
  EXPECT_NE(ErrorOf(kRemax, {"data.template_date=yesterday"}).find("spec key 'data.template_date' must be an ISO 8601"),
            std::string::npos);
  EXPECT_EQ(ErrorOf(kRemax, {"data.template_args=[1]"}), "job.yaml: spec key 'data.template_args' must be a mapping");
  EXPECT_EQ(ErrorOf(kRemax, {"data.prompt_key=''"}), "job.yaml: spec key 'data.prompt_key' must not be empty");
  EXPECT_EQ(ErrorOf(kRemax, {"generation.stop_token_ids=[1, x]"}),
            "job.yaml: spec key 'generation.stop_token_ids[1]' must be an integer");
  EXPECT_EQ(ErrorOf(kRemax, {"generation.stop_token_ids=[-1]"}),
            "job.yaml: spec key 'generation.stop_token_ids[0]' must be >= 0");
  EXPECT_EQ(ErrorOf(kRemax, {"generation.stop_token_ids=7"}),
            "job.yaml: spec key 'generation.stop_token_ids' must be a list, each item an integer");
}

TEST(JobSpecTest, TemplateDatesAreUtcToTheSecond) {
  EXPECT_EQ(TemplateDateOf(0), "1970-01-01T00:00:00+00:00");
  EXPECT_EQ(TemplateDateOf(1795794000999), "2026-11-27T15:40:00+00:00");
}

TEST(JobSpecTest, ThePpoCriticStartsFromTheFirstRewardModelElseTheActor) {
  auto rule = ParseJobSpec(kRemax, {"algorithm=ppo"}, "job.yaml");
  ASSERT_TRUE(rule.ok()) << rule.status();
  EXPECT_EQ(DefaultCriticPath(*rule), "out/sft");  // a rule: the actor
  auto model = ParseJobSpec(kRemax, {"algorithm=ppo", "models.reward.rule=", "models.reward.path=rm"}, "job.yaml");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(DefaultCriticPath(*model), "rm");
  auto named = ParseJobSpec(kRemax,
                            {"algorithm=ppo", "models.reward.path=rm", "models.reward.rule=", "models.critic.path=c"},
                            "job.yaml");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(DefaultCriticPath(*named), "c");
  EXPECT_NE(ErrorOf(kRemax, {"algorithm=ppo", "models.reward.path=rm", "models.critic.path=c", "ppo.minibatches=3"})
                .find("ppo.minibatches"),
            std::string::npos);
}

TEST(JobSpecTest, RewardSourcesAreAListOfKindsAndTheShorthandIsOneOfThem) {
  constexpr char kSources[] = R"(
algorithm: grpo
models:
  actor: {path: out/sft}
reward:
  sources:
    - {name: correct, kind: verifier, check: math, strict: true, weight: 1.0}
    - {name: format, kind: verifier, check: regex, pattern: "#### -?[0-9]+$", weight: 0.2}
    - {name: judge, kind: model, path: out/rm, dtype: bf16}
    - {name: server, kind: remote, url: "http://127.0.0.1:8000/score", batch_size: 8, max_in_flight: 2,
       timeout_s: 5, retries: 1, token_secret: rm-token}
data: {train: prompts.jsonl}
output: {dir: out/grpo}
)";
  auto spec = ParseJobSpec(kSources, {}, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->reward_sources.size(), 4u);
  EXPECT_EQ(spec->reward_sources[0].check, "math");
  EXPECT_TRUE(spec->reward_sources[0].strict);
  EXPECT_EQ(spec->reward_sources[1].pattern, "#### -?[0-9]+$");
  EXPECT_DOUBLE_EQ(spec->reward_sources[1].weight, 0.2);
  EXPECT_EQ(spec->reward_sources[2].model.path, "out/rm");
  EXPECT_EQ(spec->reward_sources[2].model.dtype, "bf16");
  EXPECT_EQ(spec->reward_sources[3].batch_size, 8);
  EXPECT_EQ(spec->reward_sources[3].token_secret, "rm-token");
  EXPECT_EQ(DefaultCriticPath(*spec), "out/rm");
  // The shorthand becomes one source.
  auto shorthand = ParseJobSpec(kRemax, {}, "job.yaml");
  ASSERT_TRUE(shorthand.ok());
  ASSERT_EQ(shorthand->reward_sources.size(), 1u);
  EXPECT_EQ(shorthand->reward_sources[0].name, "vowel_fraction");
  EXPECT_EQ(shorthand->reward_sources[0].kind, "verifier");
  // Errors name the key.
  EXPECT_EQ(ErrorOf(kRemax, {"reward.sources=[{name: a, kind: verifier, check: exact}]"}),
            "job.yaml: spec keys 'models.reward' and 'reward.sources': give one (models.reward is the shorthand for "
            "one reward model or rule)");
  const std::vector<std::string> no_reward = {"models.reward.rule="};
  auto error = [&](const std::string& sources) {
    std::vector<std::string> o = no_reward;
    o.push_back("reward.sources=" + sources);
    return ErrorOf(kRemax, o);
  };
  EXPECT_NE(error("[{name: a, kind: oracle}]").find("'reward.sources[0].kind' must be model, verifier or remote"),
            std::string::npos);
  EXPECT_NE(error("[{name: a, kind: verifier, check: math}, {name: a, kind: verifier, check: exact}]")
                .find("'reward.sources[1].name' 'a' appears twice"),
            std::string::npos);
  EXPECT_NE(error("[{name: a, kind: verifier, check: regex}]").find("'reward.sources[0].pattern' is required"),
            std::string::npos);
  EXPECT_NE(error("[{name: a, kind: verifier, check: math, url: 'http://x'}]").find("reward.sources[0].url"),
            std::string::npos);  // a field its kind does not read
  EXPECT_NE(error("[{name: a, kind: remote, url: 'ftp://x'}]").find("must be an http:// or https:// URL"),
            std::string::npos);
  EXPECT_NE(error("[{name: 'a b', kind: verifier, check: math}]").find("reward.sources[0].name"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, no_reward).find("reward.sources"), std::string::npos);
  EXPECT_NE(ErrorOf(kRemax, {"algorithm=reward_model", "models.reward.rule=", "models.reward.init=rm.json",
                             "reward.sources=[{name: a, kind: verifier, check: math}]"})
                .find("is for RL jobs"),
            std::string::npos);
}

// A worker's row limits count its own rank's share: rank 0 takes
// ceil(batch / workers) prompts, each with all its responses.
TEST(JobSpecTest, RowLimitsCountOneRanksShare) {
  auto spec = ParseJobSpec(kRemax,
                           {"algorithm=grpo", "train.batch_size=5", "group.samples_per_prompt=4", "parallel.workers=2"},
                           "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(RowsPerIteration(*spec), 20);
  EXPECT_EQ(RowsPerRank(*spec), 12);  // 3 prompts x 4
  JobLimits limits;
  limits.max_rows = 12;
  EXPECT_TRUE(CheckJobLimits(*spec, limits, "this worker accepts").ok());
  limits.max_rows = 11;
  const absl::Status refused = CheckJobLimits(*spec, limits, "this worker accepts");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("'group.samples_per_prompt': an iteration would decode 12 rows (train.batch_size "
                                   "5 over parallel.workers 2 x group.samples_per_prompt 4) on a worker"),
            absl::string_view::npos)
      << refused;
  // Tokens likewise: 12 rows of (prompt + new tokens).
  limits.max_rows = 0;
  const int64_t per_row = spec->data.max_prompt_tokens +
                          std::max(spec->generation.max_new_tokens, spec->data.max_response_tokens);
  limits.max_tokens = 12 * per_row;
  EXPECT_TRUE(CheckJobLimits(*spec, limits, "this worker accepts").ok());
  limits.max_tokens = 12 * per_row - 1;
  EXPECT_EQ(CheckJobLimits(*spec, limits, "this worker accepts").code(), absl::StatusCode::kResourceExhausted);
  // ReMax decodes a sample and the greedy response of each prompt.
  auto remax = ParseJobSpec(kRemax, {"train.batch_size=7", "parallel.workers=3"}, "job.yaml");
  ASSERT_TRUE(remax.ok()) << remax.status();
  EXPECT_EQ(RowsPerRank(*remax), 6);
}

}  // namespace
}  // namespace strata::policies
