#include "services/rank/local_worker_group.h"

#include <c10/core/GradMode.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "offload/device/device_memory.h"
#include "offload/device/device_transfer.h"
#include "base/file.h"
#include "base/log.h"
#include "policies/job/seeds.h"
#include "policies/model/generation.h"
#include "policies/rl/rl_algorithms.h"
#include "policies/rl/rl_losses.h"
#include "rewards/reward_model.h"
#include "services/rank/run_checkpoint.h"

namespace strata::services {
namespace {

using policies::LlamaHead;
using policies::LlamaModel;

// Prompt + response rows, right-padded, with the indices that pick out the
// response tokens' predictions: the output at position p-1+k predicts
// response token k.
struct Packed {
  at::Tensor ids;            // [N, S]
  at::Tensor mask;           // [N, S]
  at::Tensor positions;      // [N, R]
  at::Tensor targets;        // [N, R]
  at::Tensor response_mask;  // [N, R] float
};

// Built on the CPU, returned on `device` (where the models compute).
Packed Pack(const std::vector<const std::vector<int32_t>*>& prompts,
            const std::vector<const std::vector<int32_t>*>& responses, const at::Device& device) {
  const int64_t n = static_cast<int64_t>(prompts.size());
  int64_t s = 1, r = 1;
  for (int64_t i = 0; i < n; ++i) {
    s = std::max<int64_t>(s, static_cast<int64_t>(prompts[i]->size() + responses[i]->size()));
    r = std::max<int64_t>(r, static_cast<int64_t>(responses[i]->size()));
  }
  Packed p;
  p.ids = at::zeros({n, s}, at::kLong);
  p.mask = at::zeros({n, s}, at::kLong);
  p.positions = at::zeros({n, r}, at::kLong);
  p.targets = at::zeros({n, r}, at::kLong);
  p.response_mask = at::zeros({n, r}, at::kFloat);
  auto ids = p.ids.accessor<int64_t, 2>();
  auto mask = p.mask.accessor<int64_t, 2>();
  auto pos = p.positions.accessor<int64_t, 2>();
  auto tgt = p.targets.accessor<int64_t, 2>();
  auto rmask = p.response_mask.accessor<float, 2>();
  for (int64_t i = 0; i < n; ++i) {
    const auto& pr = *prompts[i];
    const auto& re = *responses[i];
    const int64_t pl = static_cast<int64_t>(pr.size());
    for (int64_t t = 0; t < pl; ++t) ids[i][t] = pr[static_cast<size_t>(t)], mask[i][t] = 1;
    for (size_t k = 0; k < re.size(); ++k) {
      const int64_t t = pl + static_cast<int64_t>(k);
      ids[i][t] = re[k];
      mask[i][t] = 1;
      pos[i][static_cast<int64_t>(k)] = t - 1;
      tgt[i][static_cast<int64_t>(k)] = re[k];
      rmask[i][static_cast<int64_t>(k)] = 1.0f;
    }
  }
  for (at::Tensor* t : {&p.ids, &p.mask, &p.positions, &p.targets, &p.response_mask}) *t = t->to(device);
  return p;
}

// log p(response token k) from full-sequence logits [N, S, V] -> [N, R].
at::Tensor ResponseLogProbs(const at::Tensor& logits, const Packed& p) {
  const int64_t v = logits.size(2);
  const at::Tensor rows = logits.gather(1, p.positions.unsqueeze(-1).expand({-1, -1, v}));
  return at::log_softmax(rows, -1).gather(-1, p.targets.unsqueeze(-1)).squeeze(-1) * p.response_mask;
}

// Critic values at the response positions from per-token scalars [N, S, 1].
at::Tensor ResponseValues(const at::Tensor& values, const Packed& p) {
  return values.squeeze(-1).gather(1, p.positions) * p.response_mask;
}

// Row ranges [begin, end) of `rows` rows in micro-batches of at most
// `micro` rows (train.micro_batch_size; 0: all at once). No rows still
// gives one (empty) range, so that a rank without rows joins the step.
std::vector<std::pair<size_t, size_t>> MicroBatches(size_t rows, int64_t micro) {
  const size_t size = micro > 0 ? static_cast<size_t>(micro) : std::max<size_t>(rows, 1);
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t begin = 0; begin < rows; begin += size) out.emplace_back(begin, std::min(rows, begin + size));
  if (out.empty()) out.emplace_back(0, 0);
  return out;
}

// The one-token row a rank feeds a pass it has no rows for (its loss is
// scaled by 0), so that it still joins the gang's gradient sums.
const std::vector<int32_t> kZeroWeightRow = {0};

// One micro-batch's forward and backward; `scale` is its share of the
// global batch (its loss is a mean over its own rows), so that the gang's
// summed, accumulated gradients are the global batch's. The last
// micro-batch of a step sums over the gang. Returns the scaled loss.
absl::StatusOr<double> AccumulateStep(policies::PlacedModel& model, const Packed& packed,
                                      const policies::LossFn& loss_fn, double scale, bool last) {
  auto scaled = [&](const at::Tensor& output) { return loss_fn(output) * scale; };
  return model.trainer()->ForwardBackward(packed.ids, packed.mask, scaled, /*sum_over_gang=*/last);
}

// This rank's share of a global count (0 when there is nothing at all).
double Share(double local, double global) { return global > 0 ? local / global : 0.0; }

size_t Tokens(const std::vector<const std::vector<int32_t>*>& responses) {
  size_t n = 0;
  for (const auto* r : responses) n += r->size();
  return n;
}

std::vector<std::vector<float>> Rows(const at::Tensor& t, const std::vector<policies::Rollout>& rollouts) {
  std::vector<size_t> lengths;
  for (const auto& r : rollouts) lengths.push_back(r.response.size());
  return policies::UnpadRows(t, lengths);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LoadOrInit(const policies::ModelSpec& spec, LlamaHead head,
                                                       const std::string& key, uint64_t seed) {
  STRATA_ASSIGN_OR_RETURN(auto dtype, policies::ParseModelDType(spec.dtype));
  auto prefix = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("models.", key, ": ", s.message()));
  };
  if (spec.path.empty()) {
    auto text = ReadFileToString(spec.init);
    if (!text.ok()) return prefix(text.status());
    auto config = policies::LlamaConfig::FromJson(*text, spec.init);
    if (!config.ok()) return prefix(config.status());
    return LlamaModel::RandomInit(*config, head, dtype, seed);
  }
  if (!IsDirectory(spec.path)) {
    return absl::NotFoundError(absl::StrCat("models.", key, ".path: ", spec.path, " is not a directory"));
  }
  auto model = LlamaModel::Load(spec.path, head, dtype);
  if (model.ok() || head != LlamaHead::kScalar || model.status().code() != absl::StatusCode::kNotFound) {
    if (!model.ok()) return prefix(model.status());
    return model;
  }
  // A causal LM (e.g. the SFT output) becomes a reward model or critic with a
  // fresh scalar head, as HF does when loading it for sequence classification.
  auto lm = LlamaModel::Load(spec.path, LlamaHead::kLanguageModel, dtype);
  if (!lm.ok()) return prefix(lm.status());
  return rewards::WithFreshScalarHead(**lm, seed);
}

}  // namespace

LocalWorkerGroup::~LocalWorkerGroup() {
  // Models (and their streamers) hold buffers of the arena and the store.
  actor_.reset();
  reference_.reset();
  reward_.reset();
  critic_.reset();
  nvme_.reset();
  if (!nvme_job_dir_.empty()) {
    if (!RemoveTree(nvme_job_dir_)) {
      STRATA_LOG(Warning) << "removing NVMe slots " << nvme_job_dir_ << ": some of it could not be removed";
    }
  }
}

absl::StatusOr<std::unique_ptr<LocalWorkerGroup>> LocalWorkerGroup::Create(const policies::JobSpec& spec,
                                                                          policies::ProcessGroup* gang) {
  STRATA_RETURN_IF_ERROR(spec.Validate());
  auto device = offload::ParseComputeDevice(spec.memory.device);
  if (!device.ok()) return absl::InvalidArgumentError(absl::StrCat("memory.device: ", device.status().message()));
  // Count device allocations from the start, so the models' own weights are
  // part of the device figures. Also refuses a device this build or
  // machine cannot use.
  auto monitor = offload::DeviceMemoryMonitor::ForDevice(*device);
  if (!monitor.ok()) {
    return absl::Status(monitor.status().code(), absl::StrCat("memory.device: ", monitor.status().message()));
  }
  std::unique_ptr<LocalWorkerGroup> group(new LocalWorkerGroup(spec));
  if (gang == nullptr) {
    group->solo_ = policies::ProcessGroup::Solo();
    gang = group->solo_.get();
  }
  group->gang_ = gang;
  group->device_ = *device;
  group->monitor_ = *monitor;
  offload::HostArenaOptions arena_options;
  arena_options.capacity_bytes = static_cast<size_t>(spec.memory.host_mib) << 20;
  // Unpinned, the arena is a budget touched as used; pinned, all of it is
  // committed and locked now, so a machine without the memory fails here.
  arena_options.lock_memory = spec.memory.pin_host;
  arena_options.populate = spec.memory.pin_host;
  arena_options.pin_for_cuda = !device->is_cpu();  // DMA and asynchronous copies
  auto arena = offload::HostArena::Create(arena_options);
  if (!arena.ok()) {
    // Name the setting that asked for what failed: locking, CUDA pinning, or the size.
    std::string key = "memory.host_mib";
    if (arena.status().message().find("cudaHostRegister") != std::string::npos ||
        arena.status().message().find("without CUDA") != std::string::npos) {
      key = "memory.device (pinning memory.host_mib)";
    } else if (spec.memory.pin_host) {
      key = "memory.pin_host (with memory.host_mib)";
    }
    return absl::Status(arena.status().code(), absl::StrCat(key, ": ", arena.status().message()));
  }
  group->arena_ = std::move(*arena);
  if (spec.UsesNvme() && spec.memory.nvme_dir.empty()) {
    return absl::InvalidArgumentError(
        "spec key 'memory.nvme_dir' is required when a placement uses nvme (this worker has no --nvme-dir)");
  }
  if (!spec.memory.nvme_dir.empty()) {
    // A directory of its own: ranks of a gang on one machine, and jobs
    // sharing a worker's --nvme-dir, never share a store.
    std::error_code ec;
    std::filesystem::create_directories(spec.memory.nvme_dir, ec);
    std::string pattern = JoinPath(spec.memory.nvme_dir, absl::StrCat("strata-rank", gang->rank(), "-XXXXXX"));
    if (::mkdtemp(pattern.data()) == nullptr) {
      return ErrnoToStatus(errno, absl::StrCat("memory.nvme_dir: cannot create a directory in ", spec.memory.nvme_dir));
    }
    group->nvme_job_dir_ = pattern;
    const std::string nvme_dir = pattern;
    offload::NvmeStoreOptions nvme_options;
    nvme_options.directory = nvme_dir;
    auto store = offload::NvmeStore::Open(nvme_options);
    if (!store.ok()) {
      return absl::Status(store.status().code(), absl::StrCat("memory.nvme_dir: ", store.status().message()));
    }
    // Streamers' I/O threads and optimizers stepping inside a backward pass
    // may drive it at once.
    group->nvme_ = offload::SynchronizedNvmeStore(std::move(*store));
    if (spec.memory.pin_host) {
      const std::span<std::byte> region = group->arena_->region();
      if (auto s = group->nvme_->RegisterBuffers({&region, 1}); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("memory.pin_host: ", s.message()));
      }
    }
  }
  STRATA_RETURN_IF_ERROR(group->LoadModels());
  return group;
}

absl::StatusOr<std::unique_ptr<policies::PlacedModel>> LocalWorkerGroup::Place(const std::string& key,
                                                                               const policies::ModelSpec& model,
                                                                               LlamaHead head, bool trainable,
                                                                               double lr) {
  STRATA_ASSIGN_OR_RETURN(auto loaded, LoadOrInit(model, head, key, spec_.train.seed));
  policies::PlacedModelOptions options;
  options.name = key;
  options.placement = model.placement;
  options.trainable = trainable;
  options.trainer.adam.adam.lr = lr;
  options.trainer.adam.adam.weight_decay = spec_.train.weight_decay;
  options.trainer.max_grad_norm = spec_.train.max_grad_norm;
  options.trainer.data_parallel = gang_;
  options.batch = spec_.train.batch_size;
  options.seq =
      spec_.data.max_prompt_tokens + std::max(spec_.data.max_response_tokens, spec_.generation.max_new_tokens);
  policies::OffloadContext context;
  context.arena = arena_.get();
  context.nvme = nvme_.get();
  context.device_budget_bytes = static_cast<size_t>(spec_.memory.device_mib) << 20;
  context.device = device_;
  return policies::PlacedModel::Create(std::move(loaded), options, context);
}

absl::Status LocalWorkerGroup::LoadModels() {
  using policies::Algorithm;
  const double lr = spec_.train.lr;
  lr_ = lr;
  auto assign = [](absl::StatusOr<std::unique_ptr<policies::PlacedModel>> placed,
                   std::unique_ptr<policies::PlacedModel>* out) -> absl::Status {
    if (!placed.ok()) return placed.status();
    *out = std::move(*placed);
    return absl::OkStatus();
  };
  std::string tokenizer_dir;
  switch (spec_.algorithm) {
    case Algorithm::kSft:
      STRATA_RETURN_IF_ERROR(assign(Place("actor", spec_.actor, LlamaHead::kLanguageModel, true, lr), &actor_));
      tokenizer_dir = spec_.actor.path;
      break;
    case Algorithm::kRewardModel:
      STRATA_RETURN_IF_ERROR(assign(Place("reward", spec_.reward, LlamaHead::kScalar, true, lr), &reward_));
      tokenizer_dir = spec_.reward.path;
      break;
    case Algorithm::kPpo:
    case Algorithm::kRemax:
    case Algorithm::kGrpo:
    case Algorithm::kRloo: {
      STRATA_RETURN_IF_ERROR(assign(Place("actor", spec_.actor, LlamaHead::kLanguageModel, true, lr), &actor_));
      policies::ModelSpec reference = spec_.reference;
      if (reference.path.empty()) reference.path = spec_.actor.path;
      if (auto s = assign(Place("reference", reference, LlamaHead::kLanguageModel, false, 0), &reference_); !s.ok()) {
        return s;
      }
      if (!spec_.reward.rule.empty()) {
        auto rule = rewards::MakeRule(spec_.reward.rule);
        if (!rule.ok())
          return absl::InvalidArgumentError(absl::StrCat("models.reward.rule: ", rule.status().message()));
        rule_ = *rule;
      } else if (auto s = assign(Place("reward", spec_.reward, LlamaHead::kScalar, false, 0), &reward_); !s.ok()) {
        return s;
      }
      if (spec_.algorithm == Algorithm::kPpo) {
        policies::ModelSpec critic = spec_.critic;
        if (critic.path.empty()) critic.path = spec_.reward.path;
        if (auto s = assign(Place("critic", critic, LlamaHead::kScalar, true, spec_.ppo.critic_lr), &critic_);
            !s.ok()) {
          return s;
        }
      }
      tokenizer_dir = spec_.actor.path;
      break;
    }
  }
  tokenizer_path_ = !spec_.data.tokenizer.empty() ? spec_.data.tokenizer : tokenizer_dir;
  if (tokenizer_path_.empty()) {
    return absl::InvalidArgumentError("data.tokenizer is required when the model is initialised from a config");
  }
  auto tokenizer = policies::Tokenizer::Load(tokenizer_path_);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(), absl::StrCat("data.tokenizer: ", tokenizer.status().message()));
  }
  tokenizer_ = std::move(*tokenizer);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<policies::Rollout>> LocalWorkerGroup::Generate(const policies::RolloutRequest& request) {
  if (actor_ == nullptr) return absl::FailedPreconditionError("this job has no actor to generate with");
  const LlamaModel& actor = actor_->model();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> prompt_index;
  for (size_t p = 0; p < request.prompts.size(); ++p) {
    for (int64_t g = 0; g < request.samples_per_prompt; ++g) {
      prompts.push_back(request.prompts[p]);
      prompt_index.push_back(static_cast<int64_t>(p));
    }
  }
  const auto& eos = actor.config().eos_token_ids;
  const int64_t pad = tokenizer_->pad_id() >= 0 ? tokenizer_->pad_id() : 0;
  if (!request.sampling.row_seeds.empty() && request.sampling.row_seeds.size() != request.prompts.size()) {
    return absl::InvalidArgumentError(absl::StrCat("rollout: ", request.sampling.row_seeds.size(), " row seeds for ",
                                                   request.prompts.size(), " prompts"));
  }
  policies::SamplingOptions sampling = request.sampling;
  if (!sampling.row_seeds.empty()) {
    // Sample g of prompt p draws from its own stream of the prompt's seed.
    sampling.row_seeds.clear();
    for (size_t i = 0; i < prompts.size(); ++i) {
      const uint64_t prompt_seed = request.sampling.row_seeds[static_cast<size_t>(prompt_index[i])];
      sampling.row_seeds.push_back(
          policies::SampleSeed(prompt_seed, static_cast<int64_t>(i % static_cast<size_t>(request.samples_per_prompt))));
    }
  }
  // Decoding in micro-batches of rows (train.micro_batch_size): the KV cache
  // and logits scale with a micro-batch, not the batch. Each row samples
  // from its own seed, so the split changes nothing but the padding.
  auto generate = [&](const std::vector<std::vector<int32_t>>& rows,
                      const policies::SamplingOptions& options) -> absl::StatusOr<policies::GenerationOutput> {
    const auto micros = MicroBatches(rows.size(), spec_.train.micro_batch_size);
    if (micros.size() == 1) return policies::Generate(actor, rows, options, eos, pad);  // no copy of the batch
    policies::GenerationOutput all;
    for (const auto& [begin, end] : micros) {
      const std::vector<std::vector<int32_t>> part(rows.begin() + begin, rows.begin() + end);
      policies::SamplingOptions part_options = options;
      if (!options.row_seeds.empty()) {
        part_options.row_seeds.assign(options.row_seeds.begin() + begin, options.row_seeds.begin() + end);
      }
      STRATA_ASSIGN_OR_RETURN(auto out, policies::Generate(actor, part, part_options, eos, pad));
      all.tokens.insert(all.tokens.end(), out.tokens.begin(), out.tokens.end());
      all.logprobs.insert(all.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
    }
    return all;
  };
  auto truncated = [&](const std::vector<int32_t>& response) {
    return response.empty() || std::find(eos.begin(), eos.end(), response.back()) == eos.end();
  };
  std::vector<policies::Rollout> out;
  STRATA_ASSIGN_OR_RETURN(auto sampled, generate(prompts, sampling));
  for (size_t i = 0; i < prompts.size(); ++i) {
    out.push_back({prompt_index[i], prompts[i], sampled.tokens[i], sampled.logprobs[i], false,
                   truncated(sampled.tokens[i])});
  }
  if (request.with_greedy) {
    policies::SamplingOptions greedy = request.sampling;
    greedy.greedy = true;
    greedy.row_seeds.clear();
    STRATA_ASSIGN_OR_RETURN(auto best, generate(request.prompts, greedy));
    for (size_t p = 0; p < request.prompts.size(); ++p) {
      out.push_back({static_cast<int64_t>(p), request.prompts[p], best.tokens[p], best.logprobs[p], true,
                     truncated(best.tokens[p])});
    }
  }
  return out;
}

absl::StatusOr<policies::Scores> LocalWorkerGroup::Score(const std::vector<policies::Rollout>& rollouts,
                                                         const policies::ScoreRequest& request) {
  // Forward passes in micro-batches (train.micro_batch_size), results in
  // the rollouts' order.
  const auto micros = MicroBatches(rollouts.size(), spec_.train.micro_batch_size);
  if (micros.size() == 1) return ScoreRows(rollouts, request);  // no copy of the batch
  policies::Scores all;
  for (const auto& [begin, end] : micros) {
    const std::vector<policies::Rollout> part(rollouts.begin() + begin, rollouts.begin() + end);
    STRATA_ASSIGN_OR_RETURN(auto s, ScoreRows(part, request));
    all.rewards.insert(all.rewards.end(), s.rewards.begin(), s.rewards.end());
    for (auto [to, from] : {std::pair{&all.reference_logprobs, &s.reference_logprobs},
                            std::pair{&all.actor_logprobs, &s.actor_logprobs}, std::pair{&all.values, &s.values}}) {
      to->insert(to->end(), from->begin(), from->end());
    }
  }
  return all;
}

absl::StatusOr<policies::Scores> LocalWorkerGroup::ScoreRows(const std::vector<policies::Rollout>& rollouts,
                                                             const policies::ScoreRequest& request) {
  policies::Scores scores;
  if (rollouts.empty()) return scores;
  c10::NoGradGuard no_grad;
  std::vector<const std::vector<int32_t>*> prompts, responses;
  for (const auto& r : rollouts) prompts.push_back(&r.prompt), responses.push_back(&r.response);
  const Packed packed = Pack(prompts, responses, device_);
  if (request.rewards) {
    if (rule_) {
      for (const auto& r : rollouts) {
        scores.rewards.push_back(
            static_cast<float>(rule_(tokenizer_->Decode(r.prompt), tokenizer_->Decode(r.response))));
      }
    } else {
      const at::Tensor s = reward_->model().Scores(packed.ids, packed.mask).select(1, 0).to(at::kCPU).contiguous();
      scores.rewards.assign(s.data_ptr<float>(), s.data_ptr<float>() + s.numel());
    }
  }
  if (request.reference_logprobs) {
    scores.reference_logprobs =
        Rows(ResponseLogProbs(reference_->model().Logits(packed.ids, packed.mask), packed), rollouts);
  }
  if (request.actor_logprobs) {
    scores.actor_logprobs = Rows(ResponseLogProbs(actor_->model().Logits(packed.ids, packed.mask), packed), rollouts);
  }
  if (request.values) {
    if (critic_ == nullptr) return absl::FailedPreconditionError("values requested but this job has no critic");
    scores.values = Rows(ResponseValues(critic_->model().TokenScores(packed.ids, packed.mask), packed), rollouts);
  }
  return scores;
}

absl::StatusOr<policies::UpdateStats> LocalWorkerGroup::Update(const policies::PolicyUpdate& update) {
  if (actor_ == nullptr) return absl::FailedPreconditionError("this job has no actor to update");
  const size_t n = update.rollouts.size();
  if (update.advantages.size() != n) return absl::InvalidArgumentError("update: one advantage row per rollout needed");
  const bool ppo = update.objective == policies::PolicyObjective::kPpo;
  if (ppo && (update.old_logprobs.size() != n || update.returns.size() != n || update.old_values.size() != n)) {
    return absl::InvalidArgumentError("update: PPO needs old_logprobs, returns and old_values per rollout");
  }
  if (ppo && critic_ == nullptr) return absl::FailedPreconditionError("PPO update but this job has no critic");
  // Minibatches are drawn from the global batch's rows, the same on every
  // rank; each rank trains on the rows of a minibatch it holds.
  const bool sharded = !update.rows.empty();
  if (sharded && update.rows.size() != n) return absl::InvalidArgumentError("update: one global row per rollout needed");
  const int64_t total = sharded ? update.global_rows : static_cast<int64_t>(n);
  std::map<int64_t, size_t> local_row;
  for (size_t i = 0; i < n; ++i) {
    const int64_t row = sharded ? update.rows[i] : static_cast<int64_t>(i);
    if (row < 0 || row >= total) return absl::InvalidArgumentError(absl::StrCat("update: row ", row, " of ", total));
    local_row[row] = i;
  }
  const int64_t epochs = ppo ? update.epochs : 1;
  const int64_t minibatches = ppo ? std::max<int64_t>(1, update.minibatches) : 1;
  std::vector<int64_t> order(static_cast<size_t>(total));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(update.shuffle_seed);
  std::vector<std::vector<size_t>> steps;  // local rows of each gradient step
  const size_t per = (static_cast<size_t>(total) + static_cast<size_t>(minibatches) - 1) / static_cast<size_t>(minibatches);
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    if (ppo) std::shuffle(order.begin(), order.end(), rng);
    for (size_t start = 0; start < order.size(); start += per) {
      std::vector<size_t> idx;
      for (size_t k = start; k < std::min(order.size(), start + per); ++k) {
        if (auto it = local_row.find(order[k]); it != local_row.end()) idx.push_back(it->second);
      }
      steps.push_back(std::move(idx));
    }
  }
  // Each step's token count over the gang, in one collective.
  std::vector<double> tokens(steps.size() * 2, 0.0);
  for (size_t k = 0; k < steps.size(); ++k) {
    for (size_t i : steps[k]) tokens[2 * k] += static_cast<double>(update.rollouts[i].response.size());
    tokens[2 * k + 1] = tokens[2 * k];
  }
  std::vector<double> global_tokens = tokens;
  STRATA_RETURN_IF_ERROR(SumOverGang(global_tokens));

  // A rank with no rows in a pass still joins the gradient sums, with a
  // row whose loss weighs nothing.
  const std::vector<float> zero = {0.0f};
  std::vector<size_t> rows_per_step;
  for (const auto& step : steps) rows_per_step.push_back(step.size());
  STRATA_ASSIGN_OR_RETURN(const auto micro_batches, GangMicroBatches(rows_per_step));
  // One micro-batch's inputs; each weighs its tokens' share of the step's.
  struct Micro {
    Packed packed;
    at::Tensor advantages, old_logprobs, returns, old_values;
    double scale = 0;
  };
  policies::UpdateStats stats;
  for (size_t k = 0; k < steps.size(); ++k) {
    std::vector<Micro> micros;
    for (const auto& [begin, end] : micro_batches[k]) {
      std::vector<const std::vector<int32_t>*> prompts, responses;
      std::vector<std::vector<float>> adv, old_lp, ret, old_v;
      double micro_tokens = 0;
      for (size_t j = begin; j < end; ++j) {
        const size_t i = steps[k][j];
        prompts.push_back(&update.rollouts[i].prompt);
        responses.push_back(&update.rollouts[i].response);
        micro_tokens += static_cast<double>(update.rollouts[i].response.size());
        adv.push_back(update.advantages[i]);
        if (ppo) {
          old_lp.push_back(update.old_logprobs[i]);
          ret.push_back(update.returns[i]);
          old_v.push_back(update.old_values[i]);
        }
      }
      if (begin == end) {
        prompts.push_back(&kZeroWeightRow), responses.push_back(&kZeroWeightRow);
        adv.push_back(zero), old_lp.push_back(zero), ret.push_back(zero), old_v.push_back(zero);
      }
      Micro m;
      m.packed = Pack(prompts, responses, device_);
      const int64_t width = m.packed.targets.size(1);
      auto rows = [&](const std::vector<std::vector<float>>& r) { return policies::PadRows(r, width).to(device_); };
      m.advantages = rows(adv);
      if (ppo) m.old_logprobs = rows(old_lp), m.returns = rows(ret), m.old_values = rows(old_v);
      m.scale = Share(micro_tokens, global_tokens[2 * k]);
      micros.push_back(std::move(m));
    }
    for (size_t j = 0; j < micros.size(); ++j) {
      const Micro& m = micros[j];
      double clipfrac = 0, approx_kl = 0;
      auto policy_loss = [&](const at::Tensor& logits) {
        const at::Tensor logp = ResponseLogProbs(logits, m.packed);
        if (!ppo) return policies::ReinforceLoss(logp, m.advantages, m.packed.response_mask);
        const auto out = policies::PpoClippedLoss(logp, m.old_logprobs, m.advantages, m.packed.response_mask,
                                                  update.clip_range);
        clipfrac = out.clipfrac.item<double>();
        approx_kl = out.approx_kl.item<double>();
        return out.loss;
      };
      STRATA_ASSIGN_OR_RETURN(auto loss, AccumulateStep(*actor_, m.packed, policy_loss, m.scale, j + 1 == micros.size()));
      stats.policy_loss += loss;
      stats.clipfrac += m.scale * clipfrac;
      stats.approx_kl += m.scale * approx_kl;
    }
    STRATA_RETURN_IF_ERROR(actor_->trainer()->OptimizerStep());
    if (!ppo) continue;
    for (size_t j = 0; j < micros.size(); ++j) {
      const Micro& m = micros[j];
      double value_clipfrac = 0;
      auto value_loss = [&](const at::Tensor& values) {
        const auto out = policies::PpoValueLossClipped(ResponseValues(values, m.packed), m.old_values, m.returns,
                                                       m.packed.response_mask, update.value_clip);
        value_clipfrac = out.clipfrac.item<double>();
        return out.loss;
      };
      STRATA_ASSIGN_OR_RETURN(auto vloss, AccumulateStep(*critic_, m.packed, value_loss, m.scale, j + 1 == micros.size()));
      stats.value_loss += vloss;
      stats.value_clipfrac += m.scale * value_clipfrac;
    }
    STRATA_RETURN_IF_ERROR(critic_->trainer()->OptimizerStep());
  }
  std::vector<double> sums = {stats.policy_loss, stats.value_loss, stats.clipfrac, stats.value_clipfrac,
                              stats.approx_kl};
  STRATA_RETURN_IF_ERROR(SumOverGang(sums));
  const double k = static_cast<double>(std::max<size_t>(steps.size(), 1));
  stats.policy_loss = sums[0] / k, stats.value_loss = sums[1] / k, stats.clipfrac = sums[2] / k;
  stats.value_clipfrac = sums[3] / k, stats.approx_kl = sums[4] / k;
  return stats;
}

absl::Status LocalWorkerGroup::SumOverGang(std::vector<double>& values) {
  if (gang_->world_size() == 1 || values.empty()) return absl::OkStatus();
  std::vector<at::Tensor> t = {at::tensor(values, at::kDouble)};
  STRATA_RETURN_IF_ERROR(gang_->AllReduceSum(t));
  const double* v = t[0].data_ptr<double>();
  values.assign(v, v + values.size());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<std::pair<size_t, size_t>>>> LocalWorkerGroup::GangMicroBatches(
    const std::vector<size_t>& rows_per_step) {
  std::vector<std::vector<std::pair<size_t, size_t>>> out;
  for (size_t rows : rows_per_step) out.push_back(MicroBatches(rows, spec_.train.micro_batch_size));
  const size_t world = static_cast<size_t>(gang_->world_size()), steps = out.size();
  if (world == 1 || spec_.train.micro_batch_size <= 0 || steps == 0) return out;
  // Every rank's counts in one sum: rank r's at [r * steps, (r + 1) * steps).
  std::vector<double> counts(world * steps, 0.0);
  const size_t rank = static_cast<size_t>(gang_->rank());
  for (size_t k = 0; k < steps; ++k) counts[rank * steps + k] = static_cast<double>(out[k].size());
  STRATA_RETURN_IF_ERROR(SumOverGang(counts));
  for (size_t k = 0; k < steps; ++k) {
    size_t most = 0;
    for (size_t r = 0; r < world; ++r) most = std::max(most, static_cast<size_t>(counts[r * steps + k]));
    while (out[k].size() < most) out[k].emplace_back(rows_per_step[k], rows_per_step[k]);
  }
  return out;
}

absl::StatusOr<policies::TrainStats> LocalWorkerGroup::TrainSft(const std::vector<policies::TextPair>& batch) {
  if (actor_ == nullptr || actor_->trainer() == nullptr) return absl::FailedPreconditionError("no trainable actor");
  if (batch.empty()) return absl::InvalidArgumentError("SFT step: empty batch");
  std::vector<const std::vector<int32_t>*> prompts, responses;
  for (const auto& pair : batch) prompts.push_back(&pair.prompt), responses.push_back(&pair.response);
  std::vector<double> tokens = {static_cast<double>(Tokens(responses))};
  STRATA_RETURN_IF_ERROR(SumOverGang(tokens));
  STRATA_ASSIGN_OR_RETURN(const auto gang_micros, GangMicroBatches({batch.size()}));
  const auto& micros = gang_micros[0];
  double loss = 0;
  for (size_t j = 0; j < micros.size(); ++j) {
    const auto [begin, end] = micros[j];
    std::vector<const std::vector<int32_t>*> p(prompts.begin() + begin, prompts.begin() + end),
        r(responses.begin() + begin, responses.begin() + end);
    const double scale = begin == end ? 0.0 : Share(static_cast<double>(Tokens(r)), tokens[0]);
    if (begin == end) p = {&kZeroWeightRow}, r = {&kZeroWeightRow};
    const Packed packed = Pack(p, r, device_);
    STRATA_ASSIGN_OR_RETURN(auto part, AccumulateStep(*actor_, packed, [&](const at::Tensor& logits) {
                              return policies::CrossEntropyLoss(ResponseLogProbs(logits, packed), packed.response_mask);
                            }, scale, j + 1 == micros.size()));
    loss += part;
  }
  STRATA_RETURN_IF_ERROR(actor_->trainer()->OptimizerStep());
  std::vector<double> sums = {loss};
  STRATA_RETURN_IF_ERROR(SumOverGang(sums));
  return policies::TrainStats{sums[0], 0};
}

namespace {

// Chosen rows first, then rejected rows, as one batch.
Packed PackPairs(const std::vector<policies::PreferencePair>& pairs, const at::Device& device) {
  std::vector<const std::vector<int32_t>*> prompts, responses;
  for (const auto& p : pairs) prompts.push_back(&p.prompt), responses.push_back(&p.chosen);
  for (const auto& p : pairs) prompts.push_back(&p.prompt), responses.push_back(&p.rejected);
  return Pack(prompts, responses, device);
}

}  // namespace

absl::StatusOr<policies::TrainStats> LocalWorkerGroup::TrainRewardModel(
    const std::vector<policies::PreferencePair>& batch) {
  if (reward_ == nullptr || reward_->trainer() == nullptr)
    return absl::FailedPreconditionError("no trainable reward model");
  if (batch.empty()) return absl::InvalidArgumentError("reward model step: empty batch");
  std::vector<double> pairs = {static_cast<double>(batch.size())};
  STRATA_RETURN_IF_ERROR(SumOverGang(pairs));
  STRATA_ASSIGN_OR_RETURN(const auto gang_micros, GangMicroBatches({batch.size()}));
  const auto& micros = gang_micros[0];
  double loss = 0, weighted_accuracy = 0;
  for (size_t j = 0; j < micros.size(); ++j) {
    const auto [begin, end] = micros[j];
    std::vector<policies::PreferencePair> part(batch.begin() + begin, batch.begin() + end);
    const double scale = begin == end ? 0.0 : Share(static_cast<double>(part.size()), pairs[0]);
    if (begin == end) part.push_back({kZeroWeightRow, kZeroWeightRow, kZeroWeightRow});
    const Packed packed = PackPairs(part, device_);
    const int64_t n = static_cast<int64_t>(part.size());
    double accuracy = 0;
    STRATA_ASSIGN_OR_RETURN(auto part_loss, AccumulateStep(*reward_, packed, [&](const at::Tensor& values) {
                              rewards::PreferenceObjective objective =
                                  rewards::PreferenceFromTokenScores(values, packed.mask, n);
                              accuracy = objective.accuracy;
                              return objective.loss;
                            }, scale, j + 1 == micros.size()));
    loss += part_loss;
    weighted_accuracy += scale * accuracy;
  }
  STRATA_RETURN_IF_ERROR(reward_->trainer()->OptimizerStep());
  std::vector<double> sums = {loss, weighted_accuracy};
  STRATA_RETURN_IF_ERROR(SumOverGang(sums));
  return policies::TrainStats{sums[0], sums[1]};
}

absl::StatusOr<policies::TrainStats> LocalWorkerGroup::EvaluateRewardModel(
    const std::vector<policies::PreferencePair>& pairs) {
  if (reward_ == nullptr) return absl::FailedPreconditionError("this job has no reward model");
  c10::NoGradGuard no_grad;
  const Packed packed = PackPairs(pairs, device_);
  const int64_t n = static_cast<int64_t>(pairs.size());
  const rewards::PreferenceObjective objective =
      rewards::PreferenceFromScores(reward_->model().Scores(packed.ids, packed.mask).select(1, 0), n);
  return policies::TrainStats{objective.loss.item<double>(), objective.accuracy};
}

policies::MemoryStats LocalWorkerGroup::BeginPhase(const std::string& phase) {
  policies::MemoryStats ended;
  if (!phase_.empty()) {
    ended = PhaseMemory(phase_);
    phase_memory_[phase_] = ended;
  }
  phase_ = phase;
  monitor_->ResetPeak();
  return ended;
}

absl::Status LocalWorkerGroup::BeginIteration(int64_t iteration) {
  const double scale = policies::LearningRateScale(spec_.train, iteration);
  for (auto& [name, model] : Trainable()) {
    const double base = name == "critic" ? spec_.ppo.critic_lr : spec_.train.lr;
    STRATA_RETURN_IF_ERROR(model->trainer()->SetLearningRate(base * scale));
  }
  lr_ = spec_.train.lr * scale;
  return absl::OkStatus();
}

std::map<std::string, double> LocalWorkerGroup::OptimizerMetrics() {
  std::map<std::string, double> out = {{"optimizer/lr", lr_}};
  for (auto& [name, model] : Trainable()) {
    out[name == "critic" ? "optimizer/critic_grad_norm" : "optimizer/grad_norm"] = model->trainer()->last_grad_norm();
  }
  return out;
}

std::map<std::string, int64_t> LocalWorkerGroup::MemoryInUse() const {
  return {{"device", static_cast<int64_t>(monitor_->current_bytes())},
          {"host", static_cast<int64_t>(arena_->stats().requested_bytes)},
          {"nvme", nvme_ ? nvme_->allocated_bytes() : 0}};
}

policies::MemoryStats LocalWorkerGroup::PhaseMemory(const std::string& phase) {
  if (phase != phase_) {
    auto it = phase_memory_.find(phase);
    return it == phase_memory_.end() ? policies::MemoryStats{} : it->second;
  }
  policies::MemoryStats stats;
  stats.peak_bytes["device"] = static_cast<int64_t>(monitor_->peak_bytes());
  stats.peak_bytes["host"] = static_cast<int64_t>(arena_->stats().peak_requested_bytes);
  stats.peak_bytes["nvme"] = nvme_ ? nvme_->allocated_bytes() : 0;
  // Master weights and moments this rank holds (ZeRO-1 shards them), and
  // host gradient buffers at most at once (ZeRO-2 keeps the held share).
  int64_t optimizer = 0, gradients = 0;
  for (auto& [name, model] : Trainable()) {
    optimizer += model->trainer()->optimizer_state_bytes();
    gradients += model->trainer()->gradient_peak_bytes();
  }
  stats.peak_bytes["optimizer_state"] = optimizer;
  stats.peak_bytes["gradient"] = gradients;
  return stats;
}

std::vector<std::pair<std::string, policies::PlacedModel*>> LocalWorkerGroup::Trainable() {
  std::vector<std::pair<std::string, policies::PlacedModel*>> out;
  for (auto* m : {actor_.get(), reward_.get(), critic_.get()}) {
    if (m != nullptr && m->trainer() != nullptr) out.emplace_back(m->name(), m);
  }
  return out;
}

absl::Status LocalWorkerGroup::SaveCheckpoint(const std::string& dir) {
  // The directory is the caller's to name; its parts are made below it.
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("checkpoint: cannot create ", dir, ": ", ec.message()));
  if (gang_->rank() == 0) STRATA_RETURN_IF_ERROR(SaveWeights(dir));
  return SaveOptimizerStates(dir);
}

absl::Status LocalWorkerGroup::SaveWeights(const std::string& dir) {
  for (auto& [name, model] : Trainable()) {
    STRATA_ASSIGN_OR_RETURN(const std::string sub, MakeModelCheckpointDirectory(dir, name));
    STRATA_RETURN_IF_ERROR(model->Save(sub));
  }
  return absl::OkStatus();
}

absl::Status LocalWorkerGroup::SaveOptimizerStates(const std::string& dir) {
  const int rank = gang_->rank(), world = gang_->world_size();
  for (auto& [name, model] : Trainable()) {
    STRATA_ASSIGN_OR_RETURN(const std::string sub, MakeModelCheckpointDirectory(dir, name));
    STRATA_RETURN_IF_ERROR(model->trainer()->SaveState(OptimizerStatePath(sub, rank, world)));
  }
  return absl::OkStatus();
}

absl::Status LocalWorkerGroup::LoadCheckpoint(const std::string& dir) {
  for (auto& [name, model] : Trainable()) {
    const std::string sub = ModelCheckpointDirectory(dir, name);
    STRATA_RETURN_IF_ERROR(model->LoadWeights(sub));
    STRATA_ASSIGN_OR_RETURN(const std::vector<std::string> files, OptimizerStateFiles(sub));
    STRATA_RETURN_IF_ERROR(model->trainer()->LoadState(files));
  }
  return absl::OkStatus();
}

absl::Status LocalWorkerGroup::CopyTokenizer(const std::string& dir) const {
  const std::string from =
      IsDirectory(tokenizer_path_) ? tokenizer_path_ : std::filesystem::path(tokenizer_path_).parent_path().string();
  for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json"}) {
    const std::string source = JoinPath(from, name);
    if (!IsRegularFile(source)) continue;
    STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(source));
    STRATA_RETURN_IF_ERROR(WriteFileAtomically(JoinPath(dir, name), text));
  }
  return absl::OkStatus();
}

absl::Status LocalWorkerGroup::SaveOutput(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("output.dir: cannot create ", dir, ": ", ec.message()));
  policies::PlacedModel* model = spec_.algorithm == policies::Algorithm::kRewardModel ? reward_.get() : actor_.get();
  STRATA_RETURN_IF_ERROR(model->Save(dir));
  return CopyTokenizer(dir);
}

}  // namespace strata::services
