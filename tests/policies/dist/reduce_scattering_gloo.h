// A gang whose c10d backend has a reduce-scatter on the CPU, so that tests
// run ZeRO-2's reduce-scatter branch (NCCL's on a GPU) without a GPU. The
// backend is Gloo with one added: an all-reduce of the whole input, of
// which each rank receives its part only when the caller waits, as an
// asynchronous collective's result arrives. What NCCL adds on a GPU is the
// staging through the device and its own collective.
//
// Needs Gloo's headers: a test that includes it is compiled with
// STRATA_TEST_WITH_GLOO and USE_C10D_GLOO where the build has them
// (tests/CMakeLists.txt).
#ifndef STRATA_TESTS_POLICIES_DIST_REDUCE_SCATTERING_GLOO_H_
#define STRATA_TESTS_POLICIES_DIST_REDUCE_SCATTERING_GLOO_H_

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "policies/dist/c10d_group.h"

namespace strata::policies {

// Hands the rank its part of a finished all-reduce when waited for.
class PartOnWait final : public c10d::Work {
 public:
  PartOnWait(c10::intrusive_ptr<c10d::Work> sum, at::Tensor part, at::Tensor output)
      : sum_(std::move(sum)), part_(std::move(part)), output_(std::move(output)) {}

  bool wait(std::chrono::milliseconds timeout) override {
    sum_->wait(timeout);
    output_.copy_(part_);
    return true;
  }

 private:
  c10::intrusive_ptr<c10d::Work> sum_;
  at::Tensor part_;
  at::Tensor output_;
};

class ReduceScatteringGloo final : public c10d::ProcessGroupGloo {
 public:
  using c10d::ProcessGroupGloo::ProcessGroupGloo;

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions&) override {
    ++calls;
    TORCH_CHECK(input.numel() == output.numel() * getSize(), "input of ", input.numel(), " for ", getSize(),
                " parts of ", output.numel());
    std::vector<at::Tensor> sum = {input.clone()};
    c10::intrusive_ptr<c10d::Work> work = allreduce(sum);
    const at::Tensor part = sum[0].narrow(0, getRank() * output.numel(), output.numel());
    return c10::make_intrusive<PartOnWait>(std::move(work), part, output);
  }

  std::atomic<int> calls{0};  // reduce-scatters issued
};

struct ReduceScatteringGang {
  std::vector<std::unique_ptr<ProcessGroup>> groups;               // rank r's at r
  std::vector<c10::intrusive_ptr<ReduceScatteringGloo>> backends;  // rank r's at r
};

// `world` ranks over one in-memory store, built together (Gloo's groups
// form only once every rank has joined), each then driven by any thread.
inline ReduceScatteringGang MakeReduceScatteringGang(int world,
                                                     std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  ReduceScatteringGang gang;
  gang.groups.resize(static_cast<size_t>(world));
  gang.backends.resize(static_cast<size_t>(world));
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      auto gloo = c10d::ProcessGroupGloo::Options::create(timeout);
      gloo->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      auto backend = c10::make_intrusive<ReduceScatteringGloo>(store, rank, world, gloo);
      ProcessGroupOptions options;
      options.rank = rank;
      options.world_size = world;
      options.timeout = timeout;
      gang.groups[static_cast<size_t>(rank)] = std::make_unique<C10dProcessGroup<ReduceScatteringGloo>>(
          options, /*rendezvous=*/nullptr, backend, at::kCPU, /*has_reduce_scatter=*/true);
      gang.backends[static_cast<size_t>(rank)] = std::move(backend);
    });
  }
  for (auto& t : ranks) t.join();
  return gang;
}

}  // namespace strata::policies

#endif  // STRATA_TESTS_POLICIES_DIST_REDUCE_SCATTERING_GLOO_H_
