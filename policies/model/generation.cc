#include "policies/model/generation.h"

#include <c10/core/GradMode.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/engine_counters.h"
#include "base/interrupt.h"
#include "base/status_macros.h"
#include "policies/model/sampler.h"

namespace strata::policies {

namespace {

// A row's seed when the options give one seed for all: the row's own
// stream of it, so rows draw independently of one another.
uint64_t RowSeed(uint64_t seed, int64_t row) {
  const auto words =
      Philox4x32({static_cast<uint32_t>(row), static_cast<uint32_t>(static_cast<uint64_t>(row) >> 32), 0u, 1u}, seed);
  return static_cast<uint64_t>(words[0]) | static_cast<uint64_t>(words[1]) << 32;
}

}  // namespace

absl::StatusOr<GenerationOutput> Generate(const LlamaModel& model, const std::vector<std::vector<int32_t>>& prompts,
                                          const SamplingOptions& options, const std::vector<int64_t>& eos_ids,
                                          int64_t pad_id) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  if (prompts.empty()) return absl::InvalidArgumentError("no prompts given");
  if (!options.row_seeds.empty() && options.row_seeds.size() != prompts.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("row_seeds has ", options.row_seeds.size(), " seeds for ", prompts.size(), " prompts"));
  }
  if (!options.row_max_new_tokens.empty() && options.row_max_new_tokens.size() != prompts.size()) {
    return absl::InvalidArgumentError(absl::StrCat("row_max_new_tokens has ", options.row_max_new_tokens.size(),
                                                   " caps for ", prompts.size(), " prompts"));
  }
  const LlamaConfig& config = model.config();
  size_t longest = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) return absl::InvalidArgumentError(absl::StrCat("prompt ", i, " is empty"));
    for (int32_t id : prompts[i]) {
      if (id < 0 || id >= config.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompt ", i, " has token id ", id, " outside the vocabulary [0, ", config.vocab_size, ")"));
      }
    }
    longest = std::max(longest, prompts[i].size());
  }
  const int64_t batch = static_cast<int64_t>(prompts.size());
  const int64_t prompt_len = static_cast<int64_t>(longest);
  const int64_t total = prompt_len + options.max_new_tokens;
  if (total > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("prompt length ", prompt_len, " + max_new_tokens ",
                                                   options.max_new_tokens, " exceeds max_position_embeddings ",
                                                   config.max_position_embeddings));
  }

  // Left padding keeps every row's last prompt token in the last column.
  const int64_t pad = pad_id >= 0 ? pad_id : 0;
  at::Tensor ids = at::full({batch, prompt_len}, pad, at::kLong);
  at::Tensor mask = at::zeros({batch, prompt_len}, at::kLong);
  for (int64_t b = 0; b < batch; ++b) {
    const auto& p = prompts[static_cast<size_t>(b)];
    const int64_t offset = prompt_len - static_cast<int64_t>(p.size());
    for (size_t j = 0; j < p.size(); ++j) ids[b][offset + static_cast<int64_t>(j)] = p[j];
    mask[b].narrow(0, offset, static_cast<int64_t>(p.size())).fill_(1);
  }

  c10::NoGradGuard no_grad;
  // The model and the sampler run where the weights are; a row's draws
  // are keyed by its seed and step alone (sampler.h).
  const at::Device device = model.device();
  ids = ids.to(device);
  mask = mask.to(device);
  std::vector<RowDraw> draws(prompts.size());
  for (size_t i = 0; i < draws.size(); ++i) {
    draws[i].seed = options.row_seeds.empty() ? RowSeed(options.seed, static_cast<int64_t>(i)) : options.row_seeds[i];
  }
  std::unique_ptr<DenseKvCache> cache;
  if (options.use_kv_cache) {
    cache = std::make_unique<DenseKvCache>(config, batch, total,
                                           at::TensorOptions().dtype(model.dtype()).device(device));
  }
  const at::Tensor eos = at::tensor(std::vector<int64_t>(eos_ids.begin(), eos_ids.end()), at::kLong);

  GenerationOutput out;
  out.tokens.resize(prompts.size());
  out.logprobs.resize(prompts.size());
  // The rows still decoding, as indices into `prompts`; ids, mask, the cache
  // and the draws hold exactly these rows. A finished row leaves the
  // batch at once: nothing is computed for it afterwards.
  std::vector<int64_t> rows(prompts.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
  at::Tensor step_ids = ids;  // tokens fed this step
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    STRATA_RETURN_IF_ERROR(CheckInterrupt("while generating"));
    at::Tensor hidden = cache ? model.Hidden(step_ids, mask, cache.get()) : model.Hidden(ids, mask);
    for (RowDraw& d : draws) d.step = step;
    const SampledTokens picked = SampleNextTokens(model.LogitsFromHidden(hidden.select(1, hidden.size(1) - 1)), options,
                                                  draws);
    const at::Tensor& next = picked.ids;  // [B], on the CPU
    const at::Tensor& logp = picked.logprobs;
    const at::Tensor is_eos = (eos.numel() > 0 ? at::isin(next, eos) : at::zeros_like(next, at::kBool)).contiguous();
    const int64_t* next_ids = next.data_ptr<int64_t>();
    const float* next_logp = logp.data_ptr<float>();
    const bool* ended = is_eos.data_ptr<bool>();
    std::vector<int64_t> keep;  // positions in the batch of the rows that go on
    for (size_t j = 0; j < rows.size(); ++j) {
      const auto i = static_cast<size_t>(rows[j]);
      out.tokens[i].push_back(static_cast<int32_t>(next_ids[j]));
      out.logprobs[i].push_back(next_logp[j]);
      const bool capped = !options.row_max_new_tokens.empty() && step + 1 >= options.row_max_new_tokens[i];
      if (!(options.stop_at_eos && ended[j]) && !capped) keep.push_back(static_cast<int64_t>(j));
    }
    EngineCounters::Add(GlobalEngineCounters().generated_tokens, static_cast<int64_t>(rows.size()));
    if (keep.empty()) break;
    at::Tensor next_kept = next;
    if (keep.size() < rows.size()) {
      const at::Tensor index = at::tensor(keep, at::kLong);
      const at::Tensor index_on_device = index.to(device);
      ids = ids.index_select(0, index_on_device);
      mask = mask.index_select(0, index_on_device);
      if (cache) cache->KeepRows(index_on_device);
      next_kept = next.index_select(0, index);
      std::vector<int64_t> kept_rows;
      std::vector<RowDraw> kept_draws;
      for (int64_t j : keep) {
        kept_rows.push_back(rows[static_cast<size_t>(j)]);
        kept_draws.push_back(draws[static_cast<size_t>(j)]);
      }
      rows = std::move(kept_rows);
      draws = std::move(kept_draws);
    }
    step_ids = next_kept.unsqueeze(1).to(device);
    ids = at::cat({ids, step_ids}, 1);
    mask = at::cat({mask, at::ones({static_cast<int64_t>(rows.size()), 1}, mask.options())}, 1);
  }
  return out;
}

}  // namespace strata::policies
