// An IoBackend wrapper that lies about what the kernel did, so tests can
// force the short transfers, -EAGAIN and ENOSPC that real disks produce only
// occasionally. Header-only: testutil's library compiles testutil.cc alone.
#ifndef STRATA_TESTS_TESTUTIL_FAULT_IO_BACKEND_H_
#define STRATA_TESTS_TESTUTIL_FAULT_IO_BACKEND_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status_macros.h"
#include "offload/nvme/io_backend.h"

namespace strata::testing {

class FaultIoBackend final : public offload::IoBackend {
 public:
  // Called as each operation is issued. A value completes the operation with
  // that result without running it (e.g. -EAGAIN, -ENOSPC); nullopt runs it.
  using IssueHook = std::function<std::optional<int64_t>(const offload::IoBackendOp&)>;
  // Called with the real result of an operation that ran; returns the result
  // the engine sees (e.g. fewer bytes, to fake a short read).
  using CompleteHook = std::function<int64_t(const offload::IoBackendOp&, int64_t)>;

  explicit FaultIoBackend(std::unique_ptr<offload::IoBackend> inner) : inner_(std::move(inner)) {}

  void set_on_issue(IssueHook hook) { on_issue_ = std::move(hook); }
  void set_on_complete(CompleteHook hook) { on_complete_ = std::move(hook); }
  // Operations issued, injected or real.
  int64_t ops_issued() const { return ops_issued_; }
  // Results the hooks replaced.
  int64_t faults() const { return faults_; }

  std::string name() const override { return inner_->name() + "+faults"; }
  int capacity() const override { return inner_->capacity(); }

  absl::Status Issue(std::span<const offload::IoBackendOp> ops) override {
    std::vector<offload::IoBackendOp> pass;
    for (const offload::IoBackendOp& op : ops) {
      ++ops_issued_;
      if (on_issue_) {
        if (std::optional<int64_t> res = on_issue_(op)) {
          ++faults_;
          injected_.push_back({op.tag, *res});
          continue;
        }
      }
      running_[op.tag] = op;
      pass.push_back(op);
    }
    if (pass.empty()) return absl::OkStatus();
    return inner_->Issue(pass);
  }

  absl::Status Reap(int min_results, std::vector<offload::IoBackendResult>* out) override {
    const int injected = static_cast<int>(injected_.size());
    out->insert(out->end(), injected_.begin(), injected_.end());
    injected_.clear();
    // Never wait for more than the inner backend actually has in flight.
    const int need = std::min(std::max(min_results - injected, 0), static_cast<int>(running_.size()));
    std::vector<offload::IoBackendResult> real;
    STRATA_RETURN_IF_ERROR(inner_->Reap(need, &real));
    for (offload::IoBackendResult& r : real) {
      auto it = running_.find(r.tag);
      if (on_complete_ && it != running_.end()) {
        const int64_t changed = on_complete_(it->second, r.res);
        if (changed != r.res) ++faults_;
        r.res = changed;
      }
      if (it != running_.end()) running_.erase(it);
      out->push_back(r);
    }
    return absl::OkStatus();
  }

  absl::Status RegisterBuffers(std::span<const std::span<std::byte>> buffers) override {
    return inner_->RegisterBuffers(buffers);
  }
  absl::StatusOr<int> RegisterFile(int fd) override { return inner_->RegisterFile(fd); }
  absl::Status UnregisterFile(int index) override { return inner_->UnregisterFile(index); }

 private:
  std::unique_ptr<offload::IoBackend> inner_;
  IssueHook on_issue_;
  CompleteHook on_complete_;
  std::vector<offload::IoBackendResult> injected_;
  std::unordered_map<uint64_t, offload::IoBackendOp> running_;
  int64_t ops_issued_ = 0;
  int64_t faults_ = 0;
};

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTUTIL_FAULT_IO_BACKEND_H_
