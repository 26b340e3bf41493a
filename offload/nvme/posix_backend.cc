// pread/pwrite backend for kernels or containers that refuse io_uring. A pool
// of threads stands in for the kernel's queue so that transfers still overlap
// with the caller's compute and with each other. Each thread issues exactly
// one system call per operation and reports its raw result: short transfers
// and EINTR are IoEngine's to resubmit, as with io_uring.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "offload/nvme/io_backend.h"

namespace strata::offload {

namespace {

class PosixBackend final : public IoBackend {
 public:
  PosixBackend(int capacity, int threads) : capacity_(capacity) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }

  ~PosixBackend() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& t : workers_) t.join();
  }

  std::string name() const override { return "posix"; }
  int capacity() const override { return capacity_; }

  absl::Status Issue(std::span<const IoBackendOp> ops) override {
    absl::MutexLock lock(&mu_);
    for (IoBackendOp op : ops) {
      if (op.fixed_file) {
        // Resolved here, on the issuing thread, so the table needs no lock.
        if (op.file < 0 || static_cast<size_t>(op.file) >= files_.size() || files_[static_cast<size_t>(op.file)] < 0) {
          done_.push_back({op.tag, -EBADF});
          continue;
        }
        op.file = files_[static_cast<size_t>(op.file)];
        op.fixed_file = false;
      }
      queue_.push_back(op);
    }
    return absl::OkStatus();
  }

  absl::Status Reap(int min_results, std::vector<IoBackendResult>* out) override {
    const size_t want = static_cast<size_t>(std::max(min_results, 0));
    auto enough = [this, want]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_.size() >= want; };
    absl::MutexLock lock(&mu_, absl::Condition(&enough));
    out->insert(out->end(), done_.begin(), done_.end());
    done_.clear();
    return absl::OkStatus();
  }

  // Registered buffers only save page pinning inside io_uring; pread needs
  // nothing, so registration is accepted and ignored.
  absl::Status RegisterBuffers(std::span<const std::span<std::byte>>) override { return absl::OkStatus(); }

  absl::StatusOr<int> RegisterFile(int fd) override {
    for (size_t i = 0; i < files_.size(); ++i) {
      if (files_[i] < 0) {
        files_[i] = fd;
        return static_cast<int>(i);
      }
    }
    files_.push_back(fd);
    return static_cast<int>(files_.size() - 1);
  }

  absl::Status UnregisterFile(int index) override {
    if (index < 0 || static_cast<size_t>(index) >= files_.size() || files_[static_cast<size_t>(index)] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("no registered file at index ", index));
    }
    files_[static_cast<size_t>(index)] = -1;
    return absl::OkStatus();
  }

 private:
  void WorkerLoop() {
    while (true) {
      IoBackendOp op;
      {
        auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
        absl::MutexLock lock(&mu_, absl::Condition(&has_work));
        // Drain the queue even when stopping: callers' buffers are promised
        // a result for every issued operation.
        if (queue_.empty()) return;
        op = queue_.front();
        queue_.pop_front();
      }
      const ssize_t n = op.op == IoOp::kRead ? ::pread(op.file, op.buffer, op.length, op.offset)
                                             : ::pwrite(op.file, op.buffer, op.length, op.offset);
      const int64_t res = n < 0 ? -static_cast<int64_t>(errno) : static_cast<int64_t>(n);
      absl::MutexLock lock(&mu_);
      done_.push_back({op.tag, res});
    }
  }

  const int capacity_;
  std::vector<int> files_;  // registered index -> fd; -1 when free. Issuing thread only.
  absl::Mutex mu_;
  std::deque<IoBackendOp> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<IoBackendResult> done_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;  // last: started after the state they use exists
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoBackend>> CreatePosixBackend(const IoEngineOptions& options) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  const int threads = options.posix_threads > 0 ? options.posix_threads : std::min(options.queue_depth, 16);
  return std::unique_ptr<IoBackend>(new PosixBackend(options.queue_depth, threads));
}

}  // namespace strata::offload
