// The c10d group behind ProcessGroup (process_group.cc builds it over Gloo
// or NCCL). Internal to policies/dist: it is a header so that a test can
// put a CPU backend with a reduce-scatter behind it (libtorch 1.13's Gloo
// has none) and run ZeRO-2's reduce-scatter branch without a GPU. The
// includer brings the c10d backend's own header.
#ifndef STRATA_POLICIES_DIST_C10D_GROUP_H_
#define STRATA_POLICIES_DIST_C10D_GROUP_H_

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <deque>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "policies/dist/flat_bucket.h"
#include "policies/dist/process_group.h"

namespace strata::policies {

// c10d's errors are exceptions whose text is all there is to go on:
// DEADLINE_EXCEEDED for a timeout, UNAVAILABLE for a peer gone, INTERNAL
// otherwise; the message is `what: ` and the exception's text.
absl::Status FromC10dException(const std::string& what, const std::exception& e);

// A c10d backend (ProcessGroupGloo or ProcessGroupNCCL) behind
// ProcessGroup. `device` is where the backend wants tensors: the host for
// Gloo, which takes any; the rank's GPU for NCCL, for which host tensors are
// staged through the device and copied back once the collective is done.
// `has_reduce_scatter`: ZeRO-2's sums go through the backend's
// _reduce_scatter_base (NCCL's) rather than an all-reduce.
template <typename Group>
class C10dProcessGroup final : public ProcessGroup {
 public:
  C10dProcessGroup(const ProcessGroupOptions& options, std::unique_ptr<Rendezvous> rendezvous,
                   c10::intrusive_ptr<Group> group, at::Device device, bool has_reduce_scatter)
      : options_(options),
        rendezvous_(std::move(rendezvous)),
        group_(std::move(group)),
        device_(device),
        has_reduce_scatter_(has_reduce_scatter) {}

  // c10d's tensor lists mean one tensor per device, so each tensor is its
  // own collective; they are all issued before the first wait.
  absl::Status AllReduceSum(std::vector<at::Tensor>& tensors) override {
    STRATA_ASSIGN_OR_RETURN(std::vector<at::Tensor> staged, Stage(tensors));
    STRATA_RETURN_IF_ERROR(Run("all-reduce", staged.size(), [&](size_t i) {
      std::vector<at::Tensor> one = {staged[i]};
      return group_->allreduce(one);
    }));
    return Unstage(staged, tensors);
  }

  absl::Status StartAllReduceSum(std::vector<at::Tensor> tensors) override {
    if (tensors.empty()) return Nothing("all-reduce");
    try {
      const bool all_here = std::all_of(tensors.begin(), tensors.end(),
                                        [&](const at::Tensor& t) { return t.device() == device_; });
      if (!Staging() && all_here) {
        pending_.push_back({"all-reduce", tensors, {}, group_->allreduce_coalesced(tensors)});
        return absl::OkStatus();
      }
      // One flat buffer per bucket where the backend takes it (NCCL: the
      // rank's GPU; Gloo, whose coalesced all-reduce takes host tensors
      // only: the host): one collective, as Gloo's coalesced all-reduce is.
      std::vector<at::Tensor> flat = {at::empty({TotalElements(tensors)}, tensors[0].options().device(device_))};
      PackFlat(tensors, flat[0]);
      c10::intrusive_ptr<c10d::Work> work = group_->allreduce(flat);
      pending_.push_back({"all-reduce", std::move(tensors), flat[0], std::move(work)});
    } catch (const std::exception& e) {
      return Failed("all-reduce", e);
    }
    return absl::OkStatus();
  }

  absl::Status StartReduceScatterSum(std::vector<std::vector<at::Tensor>> owned) override {
    if (owned.size() != static_cast<size_t>(options_.world_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("reduce-scatter: ", owned.size(), " owner lists for ", options_.world_size, " ranks"));
    }
    // Gloo all-reduces (1.13's has no reduce-scatter; a later one's is an
    // all-reduce underneath); where the by-owner padding would cost more
    // than it saves, NCCL all-reduces too. Either way each rank keeps its part.
    if (!has_reduce_scatter_ || !ReduceScatterMovesLess(owned)) {
      std::vector<at::Tensor> all;
      for (const auto& tensors : owned) all.insert(all.end(), tensors.begin(), tensors.end());
      return StartAllReduceSum(std::move(all));
    }
    try {
      // Every rank receives an equal part of the bucket: its own tensors.
      STRATA_ASSIGN_OR_RETURN(OwnerPartitionedBucket input, PackByOwner(owned, device_));
      if (input.part_length == 0) return Nothing("reduce-scatter");
      at::Tensor output = at::empty({input.part_length}, input.flat.options());
      c10::intrusive_ptr<c10d::Work> work = group_->_reduce_scatter_base(output, input.flat,
                                                                         c10d::ReduceScatterOptions());
      pending_.push_back(
          {"reduce-scatter", std::move(owned[static_cast<size_t>(options_.rank)]), output, std::move(work)});
    } catch (const std::exception& e) {
      return Failed("reduce-scatter", e);
    }
    return absl::OkStatus();
  }

  absl::Status WaitPending(size_t keep_in_flight) override {
    absl::Status status;
    while (pending_.size() > keep_in_flight) {
      Pending& p = pending_.front();
      try {
        if (p.work) p.work->wait(options_.timeout);
        if (p.flat.defined() && status.ok()) UnpackFlat(p.flat, p.tensors);
      } catch (const std::exception& e) {
        if (status.ok()) status = Failed(p.what, e);
      }
      pending_.pop_front();
    }
    return status;
  }

  absl::Status Broadcast(std::vector<at::Tensor>& tensors, int root) override {
    if (root < 0 || root >= options_.world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("broadcast root ", root, " is not a rank of ", options_.world_size));
    }
    c10d::BroadcastOptions broadcast;
    broadcast.rootRank = root;
    // Only the root's values matter: the others' buffers are overwritten.
    STRATA_ASSIGN_OR_RETURN(std::vector<at::Tensor> staged, Stage(tensors, /*copy_values=*/root == options_.rank));
    STRATA_RETURN_IF_ERROR(Run("broadcast", staged.size(), [&](size_t i) {
      std::vector<at::Tensor> one = {staged[i]};
      return group_->broadcast(one, broadcast);
    }));
    return Unstage(staged, tensors);
  }

  absl::Status Barrier() override {
    if (!Staging()) return Run("barrier", 1, [&](size_t) { return group_->barrier(); });
    // NCCL's barrier guesses a device from the rank; a one-element sum on
    // this rank's GPU meets the same way without the guess.
    std::vector<at::Tensor> one;
    try {
      one.push_back(at::zeros({1}, at::TensorOptions().device(device_)));
    } catch (const std::exception& e) {
      return Failed("barrier", e);
    }
    return Run("barrier", 1, [&](size_t) { return group_->allreduce(one); });
  }

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  Backend backend() const override { return options_.backend; }

 private:
  bool Staging() const { return !device_.is_cpu(); }

  // A sum of no elements still counts as one for WaitPending, so that
  // callers can pair their buckets with the sums that end.
  absl::Status Nothing(const char* what) {
    pending_.push_back({what, {}, {}, {}});
    return absl::OkStatus();
  }

  // The tensors as the backend takes them: copied to its device (the
  // rank's GPU for NCCL, the host for Gloo) where they are elsewhere; or,
  // without `copy_values`, buffers of their shapes there to receive into.
  absl::StatusOr<std::vector<at::Tensor>> Stage(const std::vector<at::Tensor>& tensors, bool copy_values = true) const {
    std::vector<at::Tensor> staged;
    staged.reserve(tensors.size());
    try {
      for (const at::Tensor& t : tensors) {
        if (t.device() == device_) {
          staged.push_back(t);
        } else {
          staged.push_back(copy_values ? t.to(device_) : at::empty_like(t, t.options().device(device_)));
        }
      }
    } catch (const std::exception& e) {
      return Failed("copy to the device", e);
    }
    return staged;
  }

  absl::Status Unstage(const std::vector<at::Tensor>& staged, std::vector<at::Tensor>& tensors) const {
    try {
      for (size_t i = 0; i < tensors.size(); ++i) {
        if (!staged[i].is_same(tensors[i])) tensors[i].copy_(staged[i]);
      }
    } catch (const std::exception& e) {
      return Failed("copy back from the device", e);
    }
    return absl::OkStatus();
  }

  absl::Status Failed(const char* what, const std::exception& e) const {
    return FromC10dException(absl::StrCat(what, " on rank ", options_.rank, " of ", options_.world_size, " (",
                                          BackendName(options_.backend), ")"),
                             e);
  }

  // Starts `count` collectives (`start(i)`), then waits for all of them.
  // After a failure the rest are still waited for (their buffers are the
  // caller's), each bounded by the group's timeout.
  template <typename Start>
  absl::Status Run(const char* what, size_t count, Start start) {
    auto failed = [&](const std::exception& e) { return Failed(what, e); };
    std::vector<c10::intrusive_ptr<c10d::Work>> started;
    absl::Status status;
    try {
      for (size_t i = 0; i < count; ++i) started.push_back(start(i));
    } catch (const std::exception& e) {
      status = failed(e);
    }
    for (auto& work : started) {
      if (!work) continue;  // ran synchronously (torch 2.x returns no work for asyncOp=false)
      try {
        work->wait(options_.timeout);
      } catch (const std::exception& e) {
        if (status.ok()) status = failed(e);
      }
    }
    return status;
  }

  // A started bucket: the caller's tensors, and for a staged bucket the flat
  // device buffer summed in their place.
  struct Pending {
    const char* what;  // the collective, for its error
    std::vector<at::Tensor> tensors;
    at::Tensor flat;
    c10::intrusive_ptr<c10d::Work> work;
  };

  const ProcessGroupOptions options_;
  std::unique_ptr<Rendezvous> rendezvous_;  // the store outlives the group
  c10::intrusive_ptr<Group> group_;
  const at::Device device_;
  const bool has_reduce_scatter_;  // the backend's _reduce_scatter_base works
  std::deque<Pending> pending_;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_DIST_C10D_GROUP_H_
