#include "bench/allreduce_bench.h"

#ifdef STRATA_HAVE_GLOO
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#endif

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "offload/host/host_arena.h"
#include "policies/dist/process_group.h"
#include "policies/model/llama.h"
#include "policies/train/layerwise_trainer.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kTimeout{120000};

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Forwards to a gang and counts the time spent blocked on it: in
// WaitPending (the part of the gradient sums backward did not hide) and in
// Broadcast (ZeRO-1's updated weights, after the optimizer step).
class TimedGroup final : public policies::ProcessGroup {
 public:
  explicit TimedGroup(policies::ProcessGroup& inner) : inner_(inner) {}
  absl::Status AllReduceSum(std::vector<at::Tensor>& t) override { return inner_.AllReduceSum(t); }
  absl::Status StartAllReduceSum(std::vector<at::Tensor> t) override { return inner_.StartAllReduceSum(std::move(t)); }
  absl::Status StartReduceScatterSum(std::vector<std::vector<at::Tensor>> owned) override {
    return inner_.StartReduceScatterSum(std::move(owned));
  }
  absl::Status WaitPending(size_t keep_in_flight) override {
    const auto start = Clock::now();
    absl::Status s = inner_.WaitPending(keep_in_flight);
    waited_s += Since(start);
    return s;
  }
  absl::Status Broadcast(std::vector<at::Tensor>& t, int root) override {
    const auto start = Clock::now();
    absl::Status s = inner_.Broadcast(t, root);
    broadcast_s += Since(start);
    return s;
  }
  absl::Status Barrier() override { return inner_.Barrier(); }
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  policies::Backend backend() const override { return inner_.backend(); }
  double waited_s = 0;
  double broadcast_s = 0;

 private:
  policies::ProcessGroup& inner_;
};

// Runs body(rank) on every rank at once; the first error.
absl::Status OnEveryRank(int ranks, const std::function<absl::Status(int)>& body) {
  std::vector<absl::Status> statuses(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 1; r < ranks; ++r) threads.emplace_back([&, r] { statuses[static_cast<size_t>(r)] = body(r); });
  statuses[0] = body(0);
  for (auto& t : threads) t.join();
  for (const auto& s : statuses) STRATA_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

// Parameters per bucket as the trainer hands them over: the head (norm,
// lm_head) first, each decoder layer, the embedding last.
std::vector<int64_t> Buckets(const policies::LlamaConfig& c) {
  const int64_t h = c.hidden_size, kv = c.num_key_value_heads * c.head_dim;
  const int64_t layer = 2 * h * h + 2 * h * kv + 3 * h * c.intermediate_size + 2 * h;
  std::vector<int64_t> out = {h + c.vocab_size * h};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) out.push_back(layer);
  out.push_back(c.vocab_size * h);
  return out;
}

#ifdef STRATA_HAVE_GLOO
// The peer: c10d's Gloo group used directly, one all-reduce of one tensor.
absl::StatusOr<std::vector<double>> BareC10dSeconds(int ranks, int64_t numel, int steps) {
  std::vector<double> best(static_cast<size_t>(ranks), std::numeric_limits<double>::infinity());
  c10d::TCPStoreOptions server;
  server.port = 0;
  server.isServer = true;
  server.numWorkers = static_cast<size_t>(ranks);
  server.waitWorkers = false;
  server.timeout = kTimeout;
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server);
  const int port = store->getPort();
  STRATA_RETURN_IF_ERROR(OnEveryRank(ranks, [&](int r) -> absl::Status {
    try {
      c10::intrusive_ptr<c10d::Store> mine = store;
      if (r != 0) {
        c10d::TCPStoreOptions client;
        client.port = static_cast<uint16_t>(port);
        client.timeout = kTimeout;
        mine = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", client);
      }
      auto options = c10d::ProcessGroupGloo::Options::create(kTimeout);
      options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      c10d::ProcessGroupGloo group(c10::make_intrusive<c10d::PrefixStore>("peer", mine), r, ranks, options);
      std::vector<at::Tensor> flat = {at::ones({numel}, at::kFloat)};
      for (int step = 0; step <= steps; ++step) {
        const auto start = Clock::now();
        group.allreduce(flat)->wait(kTimeout);
        if (step > 0) best[static_cast<size_t>(r)] = std::min(best[static_cast<size_t>(r)], Since(start));
      }
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("bare c10d rank ", r, ": ", e.what()));
    }
    return absl::OkStatus();
  }));
  return best;
}
#endif

}  // namespace

absl::StatusOr<std::string> RunAllReduceBench(const AllReduceBenchRequest& r) {
#ifndef STRATA_HAVE_GLOO
  (void)r;
  return absl::UnimplementedError("this build has no Gloo: the all-reduce bench needs libgloo-dev");
#else
  if (r.ranks < 2 || r.batch < 1 || r.seq < 2 || r.steps < 1) {
    return absl::InvalidArgumentError("--ranks >= 2, --batch >= 1, --seq >= 2 and --steps >= 1 are required");
  }
  STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(r.config));
  STRATA_ASSIGN_OR_RETURN(auto config, policies::LlamaConfig::FromJson(text, r.config));
  const std::vector<int64_t> buckets = Buckets(config);
  int64_t numel = 0;
  for (int64_t b : buckets) numel += b;
  const double bytes = static_cast<double>(numel) * sizeof(float);

  // 1. Bandwidth: strata's bucketed path, then the bare peer.
  STRATA_ASSIGN_OR_RETURN(auto groups, policies::ProcessGroup::CreateInProcess(r.ranks, kTimeout));
  std::vector<double> ours(static_cast<size_t>(r.ranks), std::numeric_limits<double>::infinity());
  STRATA_RETURN_IF_ERROR(OnEveryRank(r.ranks, [&](int rank) -> absl::Status {
    policies::ProcessGroup& group = *groups[static_cast<size_t>(rank)];
    std::vector<at::Tensor> grads;
    for (int64_t b : buckets) grads.push_back(at::ones({b}, at::kFloat));
    for (int step = 0; step <= r.steps; ++step) {
      const auto start = Clock::now();
      for (const at::Tensor& g : grads) STRATA_RETURN_IF_ERROR(group.StartAllReduceSum({g}));
      STRATA_RETURN_IF_ERROR(group.WaitPending(0));
      if (step > 0) ours[static_cast<size_t>(rank)] = std::min(ours[static_cast<size_t>(rank)], Since(start));
    }
    // Every rank summed r.ranks ones, (steps + 1) times over.
    const double want = std::pow(static_cast<double>(r.ranks), r.steps + 1);
    if (std::abs(grads[1][0].item<double>() - want) > 1e-3 * want) {
      return absl::InternalError(absl::StrCat("rank ", rank, ": the sums are wrong"));
    }
    return absl::OkStatus();
  }));
  STRATA_ASSIGN_OR_RETURN(auto peer, BareC10dSeconds(r.ranks, numel, r.steps));
  const double ours_s = *std::max_element(ours.begin(), ours.end());
  const double peer_s = *std::max_element(peer.begin(), peer.end());

  // 2. A data-parallel training step on every rank, resident weights, CPU Adam.
  std::vector<double> step_s(static_cast<size_t>(r.ranks), 1e30), wait_s(static_cast<size_t>(r.ranks), 0),
      broadcast_s(static_cast<size_t>(r.ranks), 0);
  STRATA_RETURN_IF_ERROR(OnEveryRank(r.ranks, [&](int rank) -> absl::Status {
    TimedGroup timed(*groups[static_cast<size_t>(rank)]);
    const at::ScalarType dtype = r.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
    policies::LlamaWeights weights =
        policies::LlamaModel::RandomInit(config, policies::LlamaHead::kLanguageModel, dtype, 1)->weights();
    offload::HostArenaOptions arena_options;
    arena_options.capacity_bytes = static_cast<size_t>(config.NumParameters()) * 16 + (64 << 20);
    STRATA_ASSIGN_OR_RETURN(auto arena, offload::HostArena::Create(arena_options));
    auto source = std::make_unique<policies::ResidentLayerSource>(std::move(weights.layers));
    weights.layers.clear();
    policies::LayerwiseTrainerOptions options;
    options.adam.threads = 1;  // two ranks share the two cores
    options.data_parallel = &timed;
    STRATA_ASSIGN_OR_RETURN(auto trainer,
                            policies::LayerwiseTrainer::Create(config, policies::LlamaHead::kLanguageModel, weights,
                                                               source.get(), arena.get(), options));
    at::Generator gen = at::detail::createCPUGenerator(7 + static_cast<uint64_t>(rank));
    const at::Tensor ids = at::randint(config.vocab_size, {r.batch, r.seq}, gen, at::kLong);
    const at::Tensor mask = at::ones_like(ids);
    auto loss_fn = [&](const at::Tensor& logits) {
      const at::Tensor logp = at::log_softmax(logits.narrow(1, 0, r.seq - 1), -1);
      return -logp.gather(-1, ids.narrow(1, 1, r.seq - 1).unsqueeze(-1)).mean();
    };
    for (int step = 0; step <= r.steps; ++step) {
      timed.waited_s = 0;
      timed.broadcast_s = 0;
      const auto start = Clock::now();
      STRATA_RETURN_IF_ERROR(trainer->ForwardBackward(ids, mask, loss_fn).status());
      STRATA_RETURN_IF_ERROR(trainer->OptimizerStep());
      const double seconds = Since(start);
      if (step > 0 && seconds < step_s[static_cast<size_t>(rank)]) {
        step_s[static_cast<size_t>(rank)] = seconds;
        wait_s[static_cast<size_t>(rank)] = timed.waited_s;
        broadcast_s[static_cast<size_t>(rank)] = timed.broadcast_s;
      }
    }
    return absl::OkStatus();
  }));
  const double step = *std::max_element(step_s.begin(), step_s.end());
  const double wait = *std::max_element(wait_s.begin(), wait_s.end());
  const double broadcast = *std::max_element(broadcast_s.begin(), broadcast_s.end());

  if (r.json) {
    nlohmann::json j{{"params", numel},
                     {"buckets", buckets.size()},
                     {"ranks", r.ranks},
                     {"strata_allreduce_s", ours_s},
                     {"strata_allreduce_gb_s", bytes / ours_s / 1e9},
                     {"bare_c10d_allreduce_s", peer_s},
                     {"bare_c10d_allreduce_gb_s", bytes / peer_s / 1e9},
                     {"step_dtype", r.dtype},
                     {"step_s", step},
                     {"step_wait_s", wait},
                     {"step_broadcast_s", broadcast},
                     {"step_communication_share", (wait + broadcast) / step}};
    return j.dump() + "\n";
  }
  return absl::StrFormat(
      "%d ranks (threads, Gloo over loopback), %s: %lld params, %.1f MB of fp32 gradients in %zu buckets\n"
      "all-reduce, strata (bucket per layer, async)  %8.3f s  %6.2f GB/s\n"
      "all-reduce, bare c10d Gloo (one tensor)       %8.3f s  %6.2f GB/s   (peer)\n"
      "training step per rank (batch %lld x %lld, %s)  %8.3f s, of which waiting on communication %.3f s (%.0f%%):\n"
      "  gradient sums not hidden by backward %.3f s, ZeRO-1 weight broadcast %.3f s\n",
      r.ranks, r.config, static_cast<long long>(numel), bytes / 1e6, buckets.size(), ours_s, bytes / ours_s / 1e9,
      peer_s, bytes / peer_s / 1e9, static_cast<long long>(r.batch), static_cast<long long>(r.seq), r.dtype, step,
      wait + broadcast, 100 * (wait + broadcast) / step, wait, broadcast);
#endif
}

}  // namespace strata::bench
