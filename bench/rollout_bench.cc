#include "bench/rollout_bench.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "policies/model/generation.h"
#include "policies/model/llama.h"
#include "policies/rollout/kv_block_pool.h"
#include "policies/rollout/rollout_engine.h"

namespace strata::bench {

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// What both loops decode: continuation (p, c) of prompt p, its seed and
// its forced length.
struct Workload {
  std::vector<policies::RolloutPrompt> prompts;
  int64_t tokens = 0;  // new tokens in all
};

Workload MakeWorkload(const RolloutBenchRequest& r, int64_t vocab) {
  Workload w;
  int64_t j = 0;
  for (int64_t p = 0; p < r.prompts; ++p) {
    policies::RolloutPrompt prompt;
    // Lengths spread evenly over [min, max], in an order that mixes them.
    const int64_t span = r.max_prompt_tokens - r.min_prompt_tokens + 1;
    const int64_t length = r.min_prompt_tokens + (p * 37) % span;
    for (int64_t t = 0; t < length; ++t) prompt.ids.push_back(static_cast<int32_t>((p * 31 + t * 7 + 3) % vocab));
    for (int64_t c = 0; c < r.samples + (r.greedy_baseline ? 1 : 0); ++c, ++j) {
      if (c < r.samples) prompt.sample_seeds.push_back(static_cast<uint64_t>(1000 * p + c));
      // A golden-ratio sequence: lengths from 10% to 100% of new_tokens,
      // evenly spread and mixed across prompts and samples.
      const double fraction = std::fmod(static_cast<double>(j) * 0.6180339887498949, 1.0);
      const int64_t cap = std::max<int64_t>(
          1, static_cast<int64_t>(std::ceil(static_cast<double>(r.new_tokens) * (0.1 + 0.9 * fraction))));
      prompt.max_new_tokens.push_back(cap);
      w.tokens += cap;
    }
    prompt.greedy = r.greedy_baseline;
    w.prompts.push_back(std::move(prompt));
  }
  return w;
}

// The static loop as rollouts ran it: the samples in one padded batch (each
// prompt repeated, each row its seed), the greedy baselines in a second.
// Continuations in the engine's order.
absl::StatusOr<std::vector<std::vector<policies::Continuation>>> RunStatic(const policies::LlamaModel& model,
                                                                           const Workload& w,
                                                                           const policies::SamplingOptions& sampling,
                                                                           int64_t* kv_bytes) {
  std::vector<std::vector<int32_t>> rows, baselines;
  policies::SamplingOptions sampled = sampling, greedy = sampling;
  greedy.greedy = true;
  size_t longest = 0;
  for (const auto& p : w.prompts) {
    longest = std::max(longest, p.ids.size());
    for (size_t c = 0; c < p.sample_seeds.size(); ++c) {
      rows.push_back(p.ids);
      sampled.row_seeds.push_back(p.sample_seeds[c]);
      sampled.row_max_new_tokens.push_back(p.max_new_tokens[c]);
    }
    if (p.greedy) baselines.push_back(p.ids), greedy.row_max_new_tokens.push_back(p.max_new_tokens.back());
  }
  const policies::LlamaConfig& c = model.config();
  // DenseKvCache: every row at the longest prompt + new tokens, per call.
  const int64_t per_position = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim *
                               static_cast<int64_t>(c10::elementSize(model.dtype()));
  const int64_t width = static_cast<int64_t>(longest) + sampling.max_new_tokens;
  *kv_bytes = static_cast<int64_t>(std::max(rows.size(), baselines.size())) * width * per_position;
  std::vector<std::vector<policies::Continuation>> out(w.prompts.size());
  // The bench forces lengths and stops at no id: nothing is `stopped`.
  auto keep = [&](const policies::GenerationOutput& g, size_t row, size_t p) {
    out[p].push_back({g.tokens[row], g.logprobs[row], false});
  };
  policies::GenerationOutput s, b;
  if (!rows.empty()) {
    STRATA_ASSIGN_OR_RETURN(s, policies::Generate(model, rows, sampled, {}));
  }
  if (!baselines.empty()) {
    STRATA_ASSIGN_OR_RETURN(b, policies::Generate(model, baselines, greedy, {}));
  }
  size_t row = 0;
  for (size_t p = 0; p < w.prompts.size(); ++p) {
    for (size_t k = 0; k < w.prompts[p].sample_seeds.size(); ++k) keep(s, row++, p);
    if (w.prompts[p].greedy) keep(b, p, p);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> RunRolloutBench(const RolloutBenchRequest& r) {
  if (r.config.empty() == r.model.empty())
    return absl::InvalidArgumentError("give exactly one of --config and --model");
  if (r.prompts < 1 || r.samples < 0 || r.samples + (r.greedy_baseline ? 1 : 0) < 1 || r.new_tokens < 1 ||
      r.min_prompt_tokens < 1 || r.max_prompt_tokens < r.min_prompt_tokens) {
    return absl::InvalidArgumentError(
        "--prompts, --new-tokens and --min-prompt-tokens must be >= 1, --max-prompt-tokens >= --min-prompt-tokens, "
        "and each prompt needs a sample or the greedy baseline");
  }
  STRATA_ASSIGN_OR_RETURN(auto dtype, policies::ParseModelDType(r.dtype));
  at::Device device(at::kCPU);
  try {
    device = at::Device(r.device);
  } catch (const c10::Error&) {
    return absl::InvalidArgumentError(absl::StrCat("--device: '", r.device, "' is not a device (cpu, cuda, cuda:N)"));
  }
  if (device.is_cuda() && !at::hasCUDA()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device ", r.device,
                     ": this strata was built without CUDA, or sees no GPU (configure against a CUDA "
                     "libtorch on a machine with one)"));
  }
  std::unique_ptr<policies::LlamaModel> model;
  if (!r.model.empty()) {
    STRATA_ASSIGN_OR_RETURN(model, policies::LlamaModel::Load(r.model, policies::LlamaHead::kLanguageModel, dtype));
  } else {
    STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(r.config));
    STRATA_ASSIGN_OR_RETURN(auto config, policies::LlamaConfig::FromJson(text, r.config));
    // Room for the workload whatever the file says.
    config.max_position_embeddings = std::max(config.max_position_embeddings, r.max_prompt_tokens + r.new_tokens);
    model = policies::LlamaModel::RandomInit(config, policies::LlamaHead::kLanguageModel, dtype, 1);
  }
  if (!device.is_cpu()) {
    policies::LlamaWeights weights = model->weights();
    policies::MoveToDevice(weights, device, /*include_layers=*/true);
    model = std::make_unique<policies::LlamaModel>(model->config(), policies::LlamaHead::kLanguageModel, weights);
  }
  const policies::LlamaConfig& config = model->config();
  if (r.max_prompt_tokens + r.new_tokens > config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-prompt-tokens + --new-tokens exceed the model's context ", config.max_position_embeddings));
  }
  const Workload w = MakeWorkload(r, config.vocab_size);
  policies::SamplingOptions sampling;
  sampling.max_new_tokens = r.new_tokens;
  sampling.stop_at_eos = false;
  policies::RolloutEngineOptions options;
  options.kv_block_tokens = r.kv_block_tokens;
  options.max_concurrency = r.max_concurrency;
  options.cuda_graphs = r.steps == "auto";
  options.fixed_shape_steps = r.steps == "fixed";

  policies::RolloutEngine engine(*model, options, {});
  auto start = std::chrono::steady_clock::now();
  STRATA_ASSIGN_OR_RETURN(auto engine_out, engine.Run(w.prompts, sampling));
  const double engine_s = Seconds(start);
  const policies::RolloutStats stats = engine.stats();
  int64_t static_kv = 0;
  start = std::chrono::steady_clock::now();
  STRATA_ASSIGN_OR_RETURN(auto static_out, RunStatic(*model, w, sampling, &static_kv));
  const double static_s = Seconds(start);

  // Both decoded every forced token.
  auto count = [](const std::vector<std::vector<policies::Continuation>>& out) {
    int64_t n = 0;
    for (const auto& p : out) {
      for (const auto& c : p) n += static_cast<int64_t>(c.tokens.size());
    }
    return n;
  };
  if (count(engine_out) != w.tokens || count(static_out) != w.tokens) {
    return absl::InternalError(absl::StrCat("the loops decoded ", count(engine_out), " and ", count(static_out),
                                            " tokens of the workload's ", w.tokens));
  }
  int64_t sampled_equal = 0, sampled_total = 0;
  for (size_t p = 0; p < w.prompts.size(); ++p) {
    for (size_t c = 0; c < w.prompts[p].sample_seeds.size(); ++c, ++sampled_total) {
      sampled_equal += engine_out[p][c].tokens == static_out[p][c].tokens;
    }
  }
  nlohmann::json j{{"parameters", config.NumParameters()},
                   {"layers", config.num_hidden_layers},
                   {"hidden", config.hidden_size},
                   {"vocab", config.vocab_size},
                   {"dtype", r.dtype},
                   {"threads", at::get_num_threads()},
                   {"prompts", r.prompts},
                   {"samples", r.samples},
                   {"greedy_baseline", r.greedy_baseline},
                   {"prompt_tokens", {r.min_prompt_tokens, r.max_prompt_tokens}},
                   {"new_tokens", r.new_tokens},
                   {"generated_tokens", w.tokens},
                   {"kv_block_tokens", r.kv_block_tokens},
                   {"max_concurrency", r.max_concurrency},
                   {"engine_seconds", engine_s},
                   {"static_seconds", static_s},
                   {"engine_tokens_per_s", static_cast<double>(w.tokens) / engine_s},
                   {"static_tokens_per_s", static_cast<double>(w.tokens) / static_s},
                   {"speedup", static_s / engine_s},
                   {"engine_kv_peak_bytes", stats.peak_kv_bytes()},
                   {"engine_kv_pool_bytes", stats.pool_blocks * stats.block_bytes},
                   {"static_kv_peak_bytes", static_kv},
                   {"engine_prefill_tokens", stats.prefill_tokens},
                   {"engine_decode_steps", stats.decode_steps},
                   {"engine_peak_concurrency", stats.peak_concurrency},
                   {"device", device.str()},
                   {"steps", r.steps},
                   {"engine_padded_rows", stats.padded_rows},
                   {"engine_captured_graphs", stats.captured_graphs},
                   {"engine_replayed_steps", stats.replayed_steps},
                   {"sampled_equal", sampled_equal},
                   {"sampled_total", sampled_total}};
  if (r.check_greedy) {
    policies::SamplingOptions greedy = sampling;
    greedy.greedy = true;
    STRATA_ASSIGN_OR_RETURN(auto engine_greedy, engine.Run(w.prompts, greedy));
    int64_t unused = 0;
    STRATA_ASSIGN_OR_RETURN(auto static_greedy, RunStatic(*model, w, greedy, &unused));
    int64_t equal = 0, total = 0;
    for (size_t p = 0; p < w.prompts.size(); ++p) {
      for (size_t c = 0; c < engine_greedy[p].size(); ++c, ++total) {
        equal += engine_greedy[p][c].tokens == static_greedy[p][c].tokens;
      }
    }
    j["greedy_equal"] = equal == total;
    j["greedy_equal_continuations"] = equal;
    j["greedy_continuations"] = total;
  }
  if (r.json) return j.dump() + "\n";
  std::string out = absl::StrFormat(
      "rollout, %d params, %d prompts of %d-%d tokens x (%d samples%s), up to %d new tokens (%d in all), %s, "
      "%d threads\n"
      "  engine:       %9.1f tokens/s  KV peak %8.1f MiB (%d prefill tokens, %d decode steps, %s steps on %s: "
      "%d pad rows, %d graphs captured, %d steps replayed)\n"
      "  static loop:  %9.1f tokens/s  KV peak %8.1f MiB\n"
      "  speedup:      %9.2fx\n  sampled continuations equal: %d of %d\n",
      config.NumParameters(), r.prompts, r.min_prompt_tokens, r.max_prompt_tokens, r.samples,
      r.greedy_baseline ? " + greedy" : "", r.new_tokens, w.tokens, r.dtype, at::get_num_threads(),
      static_cast<double>(w.tokens) / engine_s, static_cast<double>(stats.peak_kv_bytes()) / (1 << 20),
      stats.prefill_tokens, stats.decode_steps, r.steps, device.str(), stats.padded_rows, stats.captured_graphs,
      stats.replayed_steps, static_cast<double>(w.tokens) / static_s, static_cast<double>(static_kv) / (1 << 20),
      static_s / engine_s, sampled_equal, sampled_total);
  if (r.check_greedy) {
    absl::StrAppend(&out, absl::StrFormat("  greedy continuations equal: %d of %d\n",
                                          j["greedy_equal_continuations"].get<int64_t>(),
                                          j["greedy_continuations"].get<int64_t>()));
  }
  return out;
}

}  // namespace strata::bench
