#include "policies/model/generation.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "base/engine_counters.h"
#include "base/interrupt.h"
#include "base/splitmix64.h"
#include "base/status_macros.h"

namespace strata::policies {

namespace {

// The random bits of a row's vocabulary entries: four xorshift128 streams
// (Marsaglia 2003) seeded from the row's key, one per SSE lane, so that
// entry i's top 32 bits are lane i % 4's output at step i / 4 and depend on
// (key, i) alone, four entries at a time; its low 21 bits come from
// SplitMix64 only when the entry needs them.
class EntryBits {
 public:
  explicit EntryBits(uint64_t key) {
    for (int lane = 0; lane < 4; ++lane) {
      const uint64_t a = SplitMix64(key + 2 * static_cast<uint64_t>(lane));
      const uint64_t b = SplitMix64(key + 2 * static_cast<uint64_t>(lane) + 1);
      x_[lane] = static_cast<uint32_t>(a), y_[lane] = static_cast<uint32_t>(a >> 32);
      z_[lane] = static_cast<uint32_t>(b), w_[lane] = static_cast<uint32_t>(b >> 32) | 1u;  // never all zero
    }
  }
  // The next four entries' top bits.
  void Next(uint32_t out[4]) {
    for (int lane = 0; lane < 4; ++lane) {
      const uint32_t t = x_[lane] ^ (x_[lane] << 11);
      x_[lane] = y_[lane], y_[lane] = z_[lane], z_[lane] = w_[lane];
      w_[lane] = w_[lane] ^ (w_[lane] >> 19) ^ t ^ (t >> 8);
      out[lane] = w_[lane];
    }
  }

 private:
  alignas(16) uint32_t x_[4], y_[4], z_[4], w_[4];
};

// One draw from the distribution p[0, n): argmax p_i / E_i with E_i ~
// Exp(1), the race at::multinomial runs, E_i = -log(u_i) for entry i's
// uniform u_i in (0, 1] (53 bits: the stream's 32 above SplitMix64's 21).
// Each u_i comes from (key, i) alone, so a float-level change to one
// probability (a gang's rounding against one rank's) changes the draw only
// if that entry was about to win or lose; an inverse CDF would move with
// every entry before the draw. E_i >= 1 - u_i, so an entry with p_i <= best
// x (1 - u_i) cannot win: a float bound on that, four entries at a time,
// skips nearly the whole vocabulary without its low bits or a log. -1 when
// no entry is positive and finite (NaN probabilities compare false).
int64_t ExponentialRace(const float* p, int64_t n, uint64_t key) {
  EntryBits bits(key);
  int64_t best = -1;
  double best_score = 0;
  // Below best_score by more than float rounding: an entry under
  // scale x (1 - u_i's upper bound) is under best_score x (1 - u_i).
  float scale = 0;
  auto consider = [&](int64_t i, uint32_t top) {
    const double pi = p[i];
    if (!(pi > 0)) return;
    const uint64_t low = SplitMix64(key ^ (0xD1B54A32D192ED03ULL * static_cast<uint64_t>(i + 1))) >> 43;
    const double u = (static_cast<double>((static_cast<uint64_t>(top) << 21) | low) + 1.0) * 0x1.0p-53;
    if (pi <= best_score * (1.0 - u)) return;
    const double score = pi / -std::log(u);
    if (score > best_score) {
      best_score = score, best = i;
      scale = static_cast<float>(best_score) * (1.0f - 0x1.0p-20f);
    }
  };
  uint32_t top[4];
  for (int64_t i = 0; i < n; i += 4) {
    bits.Next(top);
    // u_i <= ((top >> 8) + 1) / 2^24, so 1 - u_i is at least this exact float.
    int candidates = 0;
#if defined(__SSE2__)
    if (i + 4 <= n) {
      const __m128i r = _mm_srli_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(top)), 8);
      const __m128 above = _mm_sub_ps(_mm_set1_ps(1.0f), _mm_mul_ps(_mm_add_ps(_mm_cvtepi32_ps(r), _mm_set1_ps(1.0f)),
                                                                    _mm_set1_ps(0x1.0p-24f)));
      candidates = _mm_movemask_ps(_mm_cmpgt_ps(_mm_loadu_ps(p + i), _mm_mul_ps(_mm_set1_ps(scale), above)));
    } else
#endif
    {
      for (int lane = 0; lane < 4 && i + lane < n; ++lane) {
        const float above = 1.0f - (static_cast<float>(top[lane] >> 8) + 1.0f) * 0x1.0p-24f;
        if (p[i + lane] > scale * above) candidates |= 1 << lane;
      }
    }
    for (int lane = 0; candidates != 0; ++lane, candidates >>= 1) {
      if (candidates & 1) consider(i + lane, top[lane]);
    }
  }
  return best;
}

// The index of x[0, n)'s largest entry, the first of equals; a NaN is
// larger than anything (the first NaN wins), as at::argmax has it.
int64_t RowArgmax(const float* x, int64_t n) {
  float best = -std::numeric_limits<float>::infinity();
  bool nan = false;
  int64_t i = 0;
#if defined(__SSE2__)
  __m128 most = _mm_set1_ps(best);
  __m128 unordered = _mm_setzero_ps();
  for (; i + 4 <= n; i += 4) {
    const __m128 v = _mm_loadu_ps(x + i);
    most = _mm_max_ps(most, v);
    unordered = _mm_or_ps(unordered, _mm_cmpunord_ps(v, v));
  }
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, most);
  for (float v : lanes) best = std::max(best, v);
  nan = _mm_movemask_ps(unordered) != 0;
#endif
  for (; i < n; ++i) {
    if (std::isnan(x[i])) nan = true;
    else best = std::max(best, x[i]);
  }
  for (int64_t j = 0; j < n; ++j) {
    if (nan ? std::isnan(x[j]) : x[j] == best) return j;
  }
  return 0;  // n == 0
}

// log p(next) under softmax(logits): the logit less the row's logsumexp.
at::Tensor RawLogProbs(const at::Tensor& logits, const at::Tensor& next) {
  const at::Tensor scores = logits.to(at::kFloat);
  return (scores.gather(-1, next.unsqueeze(-1)).squeeze(-1) - scores.logsumexp(-1)).contiguous();
}

}  // namespace

at::Tensor SampleNextTokens(const at::Tensor& logits, const SamplingOptions& options,
                            std::vector<at::Generator>& generators, at::Tensor* raw_logprobs) {
  if (options.greedy) {
    const at::Tensor scores = logits.to(at::kFloat).contiguous();
    const int64_t rows = scores.size(0), vocab = scores.size(1);
    at::Tensor next = at::empty({rows}, at::kLong);
    const float* x = scores.data_ptr<float>();
    int64_t* out = next.data_ptr<int64_t>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) out[b] = RowArgmax(x + b * vocab, vocab);
    });
    if (raw_logprobs != nullptr) *raw_logprobs = RawLogProbs(scores, next);
    return next;
  }
  const float neg_inf = -std::numeric_limits<float>::infinity();
  at::Tensor scores = logits.to(at::kFloat) / options.temperature;
  if (options.top_k > 0 && options.top_k < scores.size(-1)) {
    const at::Tensor kth = std::get<0>(scores.topk(options.top_k, -1)).narrow(-1, options.top_k - 1, 1);
    scores = scores.masked_fill(scores < kth, neg_inf);
  }
  if (options.top_p < 1.0) {
    // As HF does: sort ascending and drop the low tail whose total mass is at
    // most 1 - top_p; the most likely token always survives.
    auto [sorted, order] = scores.sort(-1, /*descending=*/false);
    const at::Tensor cumulative = sorted.softmax(-1).cumsum(-1);
    at::Tensor drop_sorted = cumulative <= (1.0 - options.top_p);
    drop_sorted.narrow(-1, drop_sorted.size(-1) - 1, 1).fill_(false);
    const at::Tensor drop = drop_sorted.scatter(-1, order, drop_sorted);
    scores = scores.masked_fill(drop, neg_inf);
  }
  const at::Tensor probs = scores.softmax(-1).contiguous();  // [B, V]
  const int64_t rows = probs.size(0), vocab = probs.size(1);
  // One key per row from the row's generator (in row order when all rows
  // share one), then the race, rows in parallel.
  std::vector<uint64_t> keys(static_cast<size_t>(rows));
  for (int64_t b = 0; b < rows; ++b) {
    at::Generator& g = generators[generators.size() == 1 ? 0 : static_cast<size_t>(b)];
    std::lock_guard<std::mutex> lock(g.mutex());
    keys[static_cast<size_t>(b)] = at::check_generator<at::CPUGeneratorImpl>(g)->random64();
  }
  at::Tensor next = at::empty({rows}, at::kLong);
  const float* p = probs.data_ptr<float>();
  int64_t* out = next.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) out[b] = ExponentialRace(p + b * vocab, vocab, keys[static_cast<size_t>(b)]);
  });
  // As at::multinomial does: a broken model (NaN or infinite logits) is an
  // error, never a token. Either makes its row's softmax all NaN, and a
  // row of NaN has no entry to draw.
  TORCH_CHECK(std::all_of(out, out + rows, [](int64_t t) { return t >= 0; }),
              "sampling: the probabilities are not finite (NaN or inf logits)");
  if (raw_logprobs != nullptr) {
    const bool untouched = options.temperature == 1.0 && options.top_k == 0 && options.top_p >= 1.0;
    // When the sampled distribution is the raw one, its probabilities give
    // the log-probs without another pass over the vocabulary. A drawn
    // token's probability is positive (the race skips zeros); below float's
    // normal range its log loses digits, so those rows take the slow way.
    if (untouched) {
      const at::Tensor drawn = probs.gather(1, next.unsqueeze(1)).squeeze(1);
      *raw_logprobs = drawn.log().contiguous();
      const at::Tensor tiny = drawn < std::numeric_limits<float>::min();
      if (tiny.any().item<bool>()) {
        *raw_logprobs = at::where(tiny, RawLogProbs(logits, next), *raw_logprobs).contiguous();
      }
    } else {
      *raw_logprobs = RawLogProbs(logits, next);
    }
  }
  return next;
}

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
  // The model runs where its weights are; sampling stays on the CPU with a
  // CPU generator, so a seed draws the same tokens on every device.
  const at::Device device = model.device();
  ids = ids.to(device);
  mask = mask.to(device);
  std::vector<at::Generator> generators;
  if (options.row_seeds.empty()) {
    generators.push_back(at::detail::createCPUGenerator(options.seed));
  } else {
    for (uint64_t seed : options.row_seeds) generators.push_back(at::detail::createCPUGenerator(seed));
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
  // and the generators hold exactly these rows. A finished row leaves the
  // batch at once: nothing is computed for it afterwards.
  std::vector<int64_t> rows(prompts.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
  at::Tensor step_ids = ids;  // tokens fed this step
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    STRATA_RETURN_IF_ERROR(CheckInterrupt("while generating"));
    at::Tensor hidden = cache ? model.Hidden(step_ids, mask, cache.get()) : model.Hidden(ids, mask);
    const at::Tensor logits =
        model.LogitsFromHidden(hidden.select(1, hidden.size(1) - 1)).to(at::kCPU).to(at::kFloat);  // [B, V]
    at::Tensor logp;                                                                               // [B]
    const at::Tensor next = SampleNextTokens(logits, options, generators, &logp);                  // [B]
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
      std::vector<at::Generator> kept_generators;
      for (int64_t j : keep) {
        kept_rows.push_back(rows[static_cast<size_t>(j)]);
        if (generators.size() > 1) kept_generators.push_back(generators[static_cast<size_t>(j)]);
      }
      rows = std::move(kept_rows);
      if (generators.size() > 1) generators = std::move(kept_generators);
    }
    step_ids = next_kept.unsqueeze(1).to(device);
    ids = at::cat({ids, step_ids}, 1);
    mask = at::cat({mask, at::ones({static_cast<int64_t>(rows.size()), 1}, mask.options())}, 1);
  }
  return out;
}

}  // namespace strata::policies
