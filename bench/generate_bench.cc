#include "bench/generate_bench.h"

#include <ATen/Parallel.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "policies/model/generation.h"
#include "policies/model/llama.h"
#include "policies/rollout/rollout_engine.h"

namespace strata::bench {

absl::StatusOr<std::string> RunGenerateBench(const GenerateBenchRequest& r) {
  policies::LlamaConfig config;
  config.num_hidden_layers = r.layers;
  config.hidden_size = r.hidden;
  config.num_attention_heads = r.heads;
  config.num_key_value_heads = r.kv_heads;
  config.head_dim = r.heads > 0 ? r.hidden / r.heads : 0;
  config.intermediate_size = r.intermediate;
  config.vocab_size = r.vocab;
  config.max_position_embeddings = r.prompt_tokens + r.new_tokens;
  config.eos_token_ids = {};
  STRATA_RETURN_IF_ERROR(config.Validate());
  if (r.prompt_tokens < 1 || r.new_tokens < 1 || r.batch < 1 || r.repeats < 1) {
    return absl::InvalidArgumentError("--prompt-tokens, --new-tokens, --batch and --repeats must be >= 1");
  }
  STRATA_ASSIGN_OR_RETURN(auto dtype, policies::ParseModelDType(r.dtype));
  auto model = policies::LlamaModel::RandomInit(config, policies::LlamaHead::kLanguageModel, dtype, 1);

  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(r.batch));
  for (size_t b = 0; b < prompts.size(); ++b) {
    for (int64_t t = 0; t < r.prompt_tokens; ++t) {
      prompts[b].push_back(
          static_cast<int32_t>((b * 31 + static_cast<size_t>(t) * 7 + 3) % static_cast<size_t>(r.vocab)));
    }
  }
  // The KV cache is the rollout engine's paged one (what every rollout
  // runs); the peer recomputes the whole sequence at each step (the static
  // loop without its cache).
  std::vector<policies::RolloutPrompt> rollout;
  for (const auto& p : prompts) rollout.push_back({p, {}, true, {}});
  auto measure = [&](bool cache) -> absl::StatusOr<double> {
    policies::SamplingOptions options;
    options.greedy = true;
    options.stop_at_eos = false;
    options.max_new_tokens = r.new_tokens;
    options.use_kv_cache = cache;
    policies::RolloutEngine engine(*model, policies::RolloutEngineOptions(), {});
    double best = 1e30;
    for (int64_t i = 0; i < r.repeats; ++i) {
      const auto start = std::chrono::steady_clock::now();
      if (cache) {
        STRATA_RETURN_IF_ERROR(engine.Run(rollout, options).status());
      } else {
        STRATA_RETURN_IF_ERROR(policies::Generate(*model, prompts, options, {}).status());
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
  };
  STRATA_ASSIGN_OR_RETURN(auto with_cache, measure(true));
  STRATA_ASSIGN_OR_RETURN(auto without_cache, measure(false));
  const double tokens = static_cast<double>(r.batch * r.new_tokens);
  const double cached_tps = tokens / with_cache;
  const double recompute_tps = tokens / without_cache;
  nlohmann::json j{{"parameters", config.NumParameters()},
                   {"layers", r.layers},
                   {"hidden", r.hidden},
                   {"batch", r.batch},
                   {"prompt_tokens", r.prompt_tokens},
                   {"new_tokens", r.new_tokens},
                   {"dtype", r.dtype},
                   {"threads", at::get_num_threads()},
                   {"kv_cache_tokens_per_s", cached_tps},
                   {"recompute_tokens_per_s", recompute_tps},
                   {"speedup", cached_tps / recompute_tps}};
  if (r.json) return j.dump() + "\n";
  return absl::StrFormat(
      "greedy generation, %d params, batch %d, %d prompt + %d new tokens, %s, %d threads\n"
      "  engine, KV cache: %7.1f tokens/s\n  full recompute:  %8.1f tokens/s\n  speedup:         %8.2fx\n",
      config.NumParameters(), r.batch, r.prompt_tokens, r.new_tokens, r.dtype, at::get_num_threads(), cached_tps,
      recompute_tps, cached_tps / recompute_tps);
}

}  // namespace strata::bench
