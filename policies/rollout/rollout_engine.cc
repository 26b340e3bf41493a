#include "policies/rollout/rollout_engine.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/engine_counters.h"
#include "base/interrupt.h"
#include "base/status_macros.h"
#include "policies/model/sampler.h"
#include "policies/rollout/captured_graph.h"
#include "policies/rollout/decode_step.h"
#include "policies/rollout/kv_block_pool.h"

namespace strata::policies {

namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What one prefill decodes from: a prompt and the continuations that fork
// from its blocks (all of them when prefixes are shared, else one).
struct Instance {
  int64_t prompt = 0;
  std::vector<int64_t> continuations;
};

// A prefilled instance whose continuations have not all forked.
struct Prefilled {
  Instance instance;
  std::vector<int64_t> blocks;  // ceil(length / block_tokens), one reference each
  at::Tensor logits;            // [V] at the prompt's last position, on the model's device
  size_t next = 0;              // the next continuation to fork
};

struct Sequence {
  int64_t prompt = 0, continuation = 0;
  std::vector<int64_t> table;
  int64_t cached = 0;    // positions in the pool
  int32_t last = 0;      // produced, not yet cached: the next step's input
  int64_t produced = 0;  // tokens so far
  int64_t cap = 0;       // new tokens at most
  int64_t budget = 0;    // blocks it may still allocate, reserved at admission
  bool greedy = false;
  uint64_t seed = 0;  // sampled continuations: the t-th token draws with (seed, t)
};

}  // namespace

RolloutEngine::RolloutEngine(const LlamaModel& model, RolloutEngineOptions options, std::vector<int64_t> stop_ids)
    : model_(model), options_(options), stop_ids_(std::move(stop_ids)) {}

int64_t RolloutEngine::WorstCaseBlocks(const std::vector<RolloutPrompt>& prompts, int64_t max_new_tokens,
                                       const RolloutEngineOptions& options) {
  std::vector<int64_t> lengths;
  std::vector<std::vector<int64_t>> caps;
  for (const RolloutPrompt& p : prompts) {
    lengths.push_back(static_cast<int64_t>(p.ids.size()));
    caps.emplace_back();
    for (int64_t c = 0; c < p.continuations(); ++c) caps.back().push_back(p.Cap(c, max_new_tokens));
  }
  return WorstCasePoolBlocks(lengths, caps, options);
}

absl::StatusOr<std::vector<std::vector<Continuation>>> RolloutEngine::Run(const std::vector<RolloutPrompt>& prompts,
                                                                          const SamplingOptions& sampling) {
  STRATA_RETURN_IF_ERROR(sampling.Validate());
  STRATA_RETURN_IF_ERROR(options_.Validate("generation"));
  stats_ = RolloutStats();
  const LlamaConfig& config = model_.config();
  const int64_t max_new = sampling.max_new_tokens;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& ids = prompts[i].ids;
    if (ids.empty()) return absl::InvalidArgumentError(absl::StrCat("prompt ", i, " is empty"));
    for (int32_t id : ids) {
      if (id < 0 || id >= config.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompt ", i, " has token id ", id, " outside the vocabulary [0, ", config.vocab_size, ")"));
      }
    }
    if (!prompts[i].max_new_tokens.empty() &&
        static_cast<int64_t>(prompts[i].max_new_tokens.size()) != prompts[i].continuations()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt ", i, " has ", prompts[i].max_new_tokens.size(),
                                                     " caps on new tokens for ", prompts[i].continuations(),
                                                     " continuations"));
    }
    for (int64_t cap : prompts[i].max_new_tokens) {
      if (cap < 1) return absl::InvalidArgumentError(absl::StrCat("prompt ", i, ": a cap on new tokens must be >= 1"));
    }
    int64_t longest = 0;
    for (int64_t c = 0; c < prompts[i].continuations(); ++c) longest = std::max(longest, prompts[i].Cap(c, max_new));
    if (static_cast<int64_t>(ids.size()) + longest > config.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("prompt ", i, " has ", ids.size(), " tokens; + max_new_tokens ",
                                                     longest, " exceeds max_position_embeddings ",
                                                     config.max_position_embeddings));
    }
  }
  std::vector<std::vector<Continuation>> out(prompts.size());
  for (size_t p = 0; p < prompts.size(); ++p) out[p].resize(static_cast<size_t>(prompts[p].continuations()));
  if (max_new == 0) return out;

  const int64_t bt = options_.kv_block_tokens;
  stats_.block_bytes = KvBlockPool::BlockBytes(config, bt, model_.dtype());
  const int64_t blocks = options_.kv_pool_mib > 0 ? (options_.kv_pool_mib << 20) / stats_.block_bytes
                                                  : WorstCaseBlocks(prompts, max_new, options_);
  stats_.pool_blocks = blocks;
  const at::Device device = model_.device();
  c10::NoGradGuard no_grad;
  // Decode steps in fixed shapes, captured as CUDA graphs where that pays:
  // on a CUDA device whose weights stay put (a streamed layer's copies
  // cannot be replayed).
  const std::unique_ptr<GraphSession> graphs = options_.cuda_graphs && !model_.streams_layers()
                                                   ? GraphSession::Begin(device)
                                                   : nullptr;
  const bool fixed_shapes = graphs != nullptr || options_.fixed_shape_steps;
  KvBlockPool pool(config, blocks, bt, at::TensorOptions().dtype(model_.dtype()).device(device));
  // The widest step's columns: a sequence's positions reach its prompt and
  // all but its last token (never fed back).
  int64_t max_columns = 1;
  for (const RolloutPrompt& p : prompts) {
    for (int64_t c = 0; c < p.continuations(); ++c) {
      max_columns = std::max(max_columns, static_cast<int64_t>(p.ids.size()) + p.Cap(c, max_new) - 1);
    }
  }
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<DecodeStep>> steps;  // by (rows, columns)
  const int64_t pad = config.PadId();
  const at::Tensor stops = at::tensor(std::vector<int64_t>(stop_ids_.begin(), stop_ids_.end()), at::kLong);

  std::deque<Instance> waiting;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const int64_t n = prompts[p].continuations();
    if (options_.share_prefixes) {
      Instance instance{static_cast<int64_t>(p), {}};
      for (int64_t c = 0; c < n; ++c) instance.continuations.push_back(c);
      if (n > 0) waiting.push_back(std::move(instance));
    } else {
      for (int64_t c = 0; c < n; ++c) waiting.push_back(Instance{static_cast<int64_t>(p), {c}});
    }
  }
  auto length_of = [&](const Instance& i) {
    return static_cast<int64_t>(prompts[static_cast<size_t>(i.prompt)].ids.size());
  };
  std::vector<Sequence> running;
  auto available = [&] {
    int64_t reserved = 0;
    for (const Sequence& s : running) reserved += s.budget;
    return pool.free_blocks() - reserved;
  };
  auto concurrency_left = [&](int64_t planned) {
    return options_.max_concurrency == 0 ? std::numeric_limits<int64_t>::max()
                                         : options_.max_concurrency - static_cast<int64_t>(running.size()) - planned;
  };
  auto cap_of = [&](const Instance& i, size_t k) {
    return prompts[static_cast<size_t>(i.prompt)].Cap(i.continuations[k], max_new);
  };
  // Blocks forking continuation k of `i` may take: its own copy of the
  // prompt's partly filled block (the last to fork takes the prompt's
  // own) and those it grows into.
  auto fork_need = [&](const Instance& i, size_t k) {
    const int64_t length = length_of(i);
    const bool last = k + 1 == i.continuations.size();
    return OwnKvBlocks(length, cap_of(i, k), bt) - (length % bt != 0 && last ? 1 : 0);
  };
  // Continuation k of `i`, with the prompt's blocks, needs `need` blocks.
  auto pool_error = [&](const Instance& i, size_t k, int64_t need) {
    return absl::InvalidArgumentError(
        absl::StrCat("generation.kv_pool_mib: the KV pool of ", blocks, " blocks (", blocks * stats_.block_bytes,
                     " bytes) cannot hold one continuation of prompt ", i.prompt, " (", length_of(i), " tokens + ",
                     cap_of(i, k), " new ones need ", need, " blocks of ", bt, " tokens)"));
  };

  // The first token of the continuations forked in a round: their rows of
  // the prefill's logits.
  std::vector<size_t> fresh;           // indices into `running`
  std::vector<at::Tensor> fresh_rows;  // [V] each
  auto fork = [&](Prefilled& from) {
    const Instance& i = from.instance;
    const int64_t length = length_of(i);
    const int64_t full = length / bt;
    const bool last = from.next + 1 == i.continuations.size();
    const RolloutPrompt& prompt = prompts[static_cast<size_t>(i.prompt)];
    Sequence s;
    s.prompt = i.prompt;
    s.continuation = i.continuations[from.next++];
    for (int64_t b = 0; b < full; ++b) {
      pool.AddReference(from.blocks[static_cast<size_t>(b)]);
      s.table.push_back(from.blocks[static_cast<size_t>(b)]);
    }
    if (length % bt != 0) {
      const int64_t partial = from.blocks[static_cast<size_t>(full)];
      if (last) {
        s.table.push_back(partial);  // the prompt's own reference passes to it
      } else {
        const int64_t copy = pool.Allocate();
        TORCH_CHECK(copy >= 0, "rollout: a reserved KV block was not free");
        pool.CopyPositions(partial, copy, length % bt);
        s.table.push_back(copy);
      }
    }
    if (last) {
      for (int64_t b = 0; b < full; ++b) pool.Release(from.blocks[static_cast<size_t>(b)]);
    }
    s.cached = length;
    s.cap = cap_of(i, from.next - 1);
    s.budget = OwnKvBlocks(length, s.cap, bt) - (length % bt != 0 ? 1 : 0);
    const auto seeds = static_cast<int64_t>(prompt.sample_seeds.size());
    s.greedy = sampling.greedy || s.continuation >= seeds;
    if (!s.greedy) s.seed = prompt.sample_seeds[static_cast<size_t>(s.continuation)];
    fresh.push_back(running.size());
    fresh_rows.push_back(from.logits);
    running.push_back(std::move(s));
  };

  // Draws each row's next token from `logits` ([rows, V] on the model's
  // device, row r for running[which[r]]).
  auto pick = [&](const at::Tensor& logits, const std::vector<size_t>& which) {
    // Callers put the sampled rows first, so one call draws both kinds with
    // one copy to the host.
    std::vector<RowDraw> draws;
    for (size_t r = 0; r < which.size(); ++r) {
      const Sequence& s = running[which[r]];
      if (s.greedy) continue;
      TORCH_CHECK(draws.size() == r, "rollout: a sampled row after a greedy one");
      draws.push_back({s.seed, s.produced});
    }
    return SampleThenGreedy(logits, sampling, draws);
  };
  // Appends each row's picked token (row r: running[which[r]]) and ends the
  // rows that stop.
  std::vector<bool> finished;
  auto take_tokens = [&](const SampledTokens& picked, const std::vector<size_t>& which) {
    const int64_t* token = picked.ids.data_ptr<int64_t>();
    const float* logp = picked.logprobs.data_ptr<float>();
    for (size_t r = 0; r < which.size(); ++r) {
      Sequence& s = running[which[r]];
      Continuation& c = out[static_cast<size_t>(s.prompt)][static_cast<size_t>(s.continuation)];
      c.tokens.push_back(static_cast<int32_t>(token[r]));
      c.logprobs.push_back(logp[r]);
      ++s.produced;
      c.stopped = sampling.stop_at_eos && std::find(stop_ids_.begin(), stop_ids_.end(), token[r]) != stop_ids_.end();
      if (c.stopped || s.produced >= s.cap) {
        for (int64_t b : s.table) pool.Release(b);
        s.table.clear();
        s.budget = 0;
        finished[which[r]] = true;
      } else {
        s.last = static_cast<int32_t>(token[r]);
      }
    }
    EngineCounters::Add(GlobalEngineCounters().generated_tokens, static_cast<int64_t>(which.size()));
  };
  auto drop_finished = [&] {
    std::vector<Sequence> kept;
    for (size_t j = 0; j < running.size(); ++j) {
      if (!finished[j]) kept.push_back(std::move(running[j]));
    }
    running = std::move(kept);
  };

  // The prompt first in line forks what the pool and the limit allow.
  std::optional<Prefilled> pending;
  auto fork_pending = [&] {
    while (pending && concurrency_left(0) > 0 && fork_need(pending->instance, pending->next) <= available()) {
      fork(*pending);
      if (pending->next == pending->instance.continuations.size()) pending.reset();
    }
  };
  while (true) {
    STRATA_RETURN_IF_ERROR(CheckInterrupt("while generating"));
    fresh.clear();
    fresh_rows.clear();
    // Continuations of the prompt first in line, as room frees up.
    fork_pending();
    // Then whole prompts, while all their continuations fit; the first in
    // line alone when nothing runs, forking what fits.
    std::vector<Prefilled> admitted;
    int64_t planned_forks = 0, planned_blocks = 0;
    bool partial = false;
    while (!pending && !partial && !waiting.empty()) {
      const Instance& i = waiting.front();
      const int64_t prompt_blocks = CeilDiv(length_of(i), bt);
      const auto n = static_cast<int64_t>(i.continuations.size());
      int64_t forks = 0;
      for (size_t k = 0; k < i.continuations.size(); ++k) forks += fork_need(i, k);
      const bool fits = n <= concurrency_left(planned_forks) && prompt_blocks + forks <= available() - planned_blocks;
      if (!fits) {
        if (!running.empty() || !admitted.empty()) break;
        if (prompt_blocks + fork_need(i, 0) > available()) return pool_error(i, 0, prompt_blocks + fork_need(i, 0));
        partial = true;
      }
      Prefilled p;
      p.instance = i;
      waiting.pop_front();
      for (int64_t b = 0; b < prompt_blocks; ++b) p.blocks.push_back(pool.Allocate());
      if (!partial) planned_forks += n, planned_blocks += forks;
      admitted.push_back(std::move(p));
    }
    if (!admitted.empty()) {
      // One prefill of the admitted prompts, left padded.
      const auto rows = static_cast<int64_t>(admitted.size());
      int64_t longest = 0;
      for (const Prefilled& p : admitted) longest = std::max(longest, length_of(p.instance));
      at::Tensor ids = at::full({rows, longest}, pad, at::kLong);
      at::Tensor mask = at::empty({rows, longest}, at::kLong);
      at::Tensor slots = at::empty({rows, longest}, at::kLong);
      int64_t* id = ids.data_ptr<int64_t>();
      int64_t* slot = slots.data_ptr<int64_t>();
      int64_t* real = mask.data_ptr<int64_t>();
      for (int64_t r = 0; r < rows; ++r) {
        const Prefilled& p = admitted[static_cast<size_t>(r)];
        const auto& prompt = prompts[static_cast<size_t>(p.instance.prompt)].ids;
        const int64_t length = length_of(p.instance), row = r * longest;
        std::copy(prompt.begin(), prompt.end(), id + row + longest - length);
        pool.FillRow(p.blocks, length, longest, slot + row, real + row);
        stats_.prefill_tokens += length;
      }
      PagedKvView view(pool, slots, longest);
      const at::Tensor hidden = model_.Hidden(ids.to(device), mask.to(device), &view);
      const at::Tensor logits = model_.LogitsFromHidden(hidden.select(1, longest - 1));
      for (int64_t r = 0; r < rows; ++r) {
        Prefilled& p = admitted[static_cast<size_t>(r)];
        p.logits = logits[r];
        const bool last_admitted = r + 1 == rows;
        if (last_admitted && partial) {
          pending = std::move(p);
          fork_pending();
        } else {
          while (p.next < p.instance.continuations.size()) fork(p);
        }
      }
    }
    finished.assign(running.size(), false);
    if (!fresh.empty()) {
      std::vector<size_t> order(fresh.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_partition(order.begin(), order.end(), [&](size_t j) { return !running[fresh[j]].greedy; });
      std::vector<size_t> which;
      std::vector<at::Tensor> rows;
      for (size_t j : order) which.push_back(fresh[j]), rows.push_back(fresh_rows[j]);
      take_tokens(pick(at::stack(rows), which), which);
      drop_finished();
      finished.assign(running.size(), false);
    }
    if (running.empty()) {
      if (!pending && waiting.empty()) break;
      // Nothing holds a block but the prompt first in line: a continuation
      // of it that does not fit now never will (one with a larger cap than
      // those that forked).
      if (pending && fork_need(pending->instance, pending->next) > available()) {
        return pool_error(pending->instance, pending->next,
                          static_cast<int64_t>(pending->blocks.size()) + fork_need(pending->instance, pending->next));
      }
      continue;
    }
    // One decode step of every running sequence.
    const auto rows = static_cast<int64_t>(running.size());
    stats_.peak_concurrency = std::max(stats_.peak_concurrency, rows);
    int64_t longest = 0;
    for (Sequence& s : running) {
      if (s.cached % bt == 0) {
        const int64_t block = pool.Allocate();
        TORCH_CHECK(block >= 0 && s.budget > 0, "rollout: a reserved KV block was not free");
        s.table.push_back(block);
        --s.budget;
      }
      longest = std::max(longest, s.cached);
    }
    const int64_t columns = longest + 1;
    // Sampled sequences first, then greedy ones (see take_tokens).
    std::vector<size_t> order(running.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_partition(order.begin(), order.end(), [&](size_t j) { return !running[j].greedy; });
    SampledTokens picked;
    if (fixed_shapes) {
      std::vector<StepRow> batch;
      for (size_t j : order) {
        const Sequence& s = running[j];
        batch.push_back({s.last, &s.table, s.cached,
                         s.greedy ? std::nullopt : std::optional<RowDraw>(RowDraw{s.seed, s.produced})});
      }
      const auto bucket = std::make_pair(RowBucket(rows), ColumnBucket(columns, bt, max_columns));
      std::unique_ptr<DecodeStep>& step = steps[bucket];
      if (step == nullptr) step = std::make_unique<DecodeStep>(model_, pool, sampling, bucket.first, bucket.second);
      step->Stage(batch);
      const bool replay = step->captured();
      step->Run(graphs.get());
      picked = step->Fetch(rows);
      stats_.padded_rows += bucket.first - rows;
      stats_.replayed_steps += replay ? 1 : 0;
      stats_.captured_graphs += !replay && step->captured() ? 1 : 0;
    } else {
      at::Tensor ids = at::empty({rows, 1}, at::kLong);
      at::Tensor mask = at::empty({rows, columns}, at::kLong);
      at::Tensor slots = at::empty({rows, columns}, at::kLong);
      int64_t* id = ids.data_ptr<int64_t>();
      int64_t* slot = slots.data_ptr<int64_t>();
      int64_t* real = mask.data_ptr<int64_t>();
      for (int64_t r = 0; r < rows; ++r) {
        const Sequence& s = running[order[static_cast<size_t>(r)]];
        id[r] = s.last;
        pool.FillRow(s.table, s.cached + 1, columns, slot + r * columns, real + r * columns);
      }
      PagedKvView view(pool, slots, 1);
      const at::Tensor hidden = model_.Hidden(ids.to(device), mask.to(device), &view);
      picked = pick(model_.LogitsFromHidden(hidden.select(1, 0)), order);
    }
    for (Sequence& s : running) ++s.cached;
    ++stats_.decode_steps;
    stats_.decoded_tokens += rows;
    take_tokens(picked, order);
    drop_finished();
  }
  stats_.peak_used_blocks = pool.peak_used_blocks();
  return out;
}

}  // namespace strata::policies
