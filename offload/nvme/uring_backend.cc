// io_uring backend: one SQE per operation, results straight from the CQEs.
// Interpretation of each result (short, -EAGAIN, errors) is IoEngine's job.
#include <liburing.h>
#include <sys/uio.h>

#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "offload/nvme/io_backend.h"

namespace strata::offload {

namespace {

// Submission errors that only mean "not now": the SQEs stay in the ring and go
// out with the next io_uring_enter.
bool IsTransientSubmitError(int rc) { return rc == -EAGAIN || rc == -EBUSY || rc == -EINTR; }

class UringBackend final : public IoBackend {
 public:
  static absl::StatusOr<std::unique_ptr<IoBackend>> Create(const IoEngineOptions& options) {
    std::unique_ptr<UringBackend> backend(new UringBackend());
    const unsigned entries = static_cast<unsigned>(options.queue_depth);
    io_uring_params params{};
    // COOP_TASKRUN spares an interrupt per completion; kernels before 5.19
    // reject the flag, so retry without it.
    params.flags = IORING_SETUP_COOP_TASKRUN;
    int rc = io_uring_queue_init_params(entries, &backend->ring_, &params);
    if (rc == -EINVAL) {
      params = io_uring_params{};
      rc = io_uring_queue_init_params(entries, &backend->ring_, &params);
    }
    if (rc < 0) {
      return ErrnoToStatus(-rc, absl::StrCat("io_uring_queue_init(", entries, " entries)"));
    }
    backend->ring_ready_ = true;
    backend->capacity_ = static_cast<int>(params.sq_entries);
    if (options.max_registered_files > 0) {
      rc = io_uring_register_files_sparse(&backend->ring_, static_cast<unsigned>(options.max_registered_files));
      if (rc < 0) {
        // Before 5.19 there is no sparse table; plain descriptors still work.
        STRATA_LOG(Info) << "io_uring fixed files unavailable: "
                         << ErrnoToStatus(-rc, "io_uring_register_files_sparse").ToString();
      } else {
        backend->file_used_.assign(static_cast<size_t>(options.max_registered_files), false);
      }
    }
    return std::unique_ptr<IoBackend>(std::move(backend));
  }

  ~UringBackend() override {
    if (ring_ready_) io_uring_queue_exit(&ring_);
  }

  std::string name() const override { return "io_uring"; }
  int capacity() const override { return capacity_; }

  absl::Status Issue(std::span<const IoBackendOp> ops) override {
    for (const IoBackendOp& op : ops) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) {
        // Only possible if SQEs from an earlier transient submit failure are
        // still queued; push them out and try once more.
        STRATA_RETURN_IF_ERROR(SubmitQueued());
        sqe = io_uring_get_sqe(&ring_);
        if (sqe == nullptr) return absl::InternalError("io_uring submission queue full");
      }
      if (op.op == IoOp::kRead) {
        if (op.buffer_index >= 0) {
          io_uring_prep_read_fixed(sqe, op.file, op.buffer, op.length, static_cast<__u64>(op.offset), op.buffer_index);
        } else {
          io_uring_prep_read(sqe, op.file, op.buffer, op.length, static_cast<__u64>(op.offset));
        }
      } else {
        if (op.buffer_index >= 0) {
          io_uring_prep_write_fixed(sqe, op.file, op.buffer, op.length, static_cast<__u64>(op.offset), op.buffer_index);
        } else {
          io_uring_prep_write(sqe, op.file, op.buffer, op.length, static_cast<__u64>(op.offset));
        }
      }
      if (op.fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data64(sqe, op.tag);
    }
    return SubmitQueued();
  }

  absl::Status Reap(int min_results, std::vector<IoBackendResult>* out) override {
    int got = 0;
    while (true) {
      io_uring_cqe* cqes[64];
      unsigned n;
      while ((n = io_uring_peek_batch_cqe(&ring_, cqes, 64)) > 0) {
        for (unsigned i = 0; i < n; ++i) {
          out->push_back({io_uring_cqe_get_data64(cqes[i]), cqes[i]->res});
        }
        io_uring_cq_advance(&ring_, n);
        got += static_cast<int>(n);
      }
      if (got >= min_results) return absl::OkStatus();
      // Also flushes SQEs left behind by a transient submit failure.
      const int rc = io_uring_submit_and_wait(&ring_, static_cast<unsigned>(min_results - got));
      if (rc < 0 && !IsTransientSubmitError(rc)) {
        return ErrnoToStatus(-rc, "io_uring_submit_and_wait");
      }
    }
  }

  absl::Status RegisterBuffers(std::span<const std::span<std::byte>> buffers) override {
    if (buffers_registered_) {
      const int rc = io_uring_unregister_buffers(&ring_);
      if (rc < 0) return ErrnoToStatus(-rc, "io_uring_unregister_buffers");
      buffers_registered_ = false;
    }
    if (buffers.empty()) return absl::OkStatus();
    std::vector<iovec> iovecs;
    size_t total = 0;
    for (const auto& b : buffers) {
      iovecs.push_back({b.data(), b.size()});
      total += b.size();
    }
    const int rc = io_uring_register_buffers(&ring_, iovecs.data(), static_cast<unsigned>(iovecs.size()));
    if (rc < 0) {
      return ErrnoToStatus(-rc,
                           absl::StrCat("io_uring_register_buffers (", iovecs.size(), " buffers, ", total, " bytes)"));
    }
    buffers_registered_ = true;
    return absl::OkStatus();
  }

  absl::StatusOr<int> RegisterFile(int fd) override {
    if (file_used_.empty()) return absl::UnimplementedError("io_uring fixed files unavailable");
    for (size_t i = 0; i < file_used_.size(); ++i) {
      if (file_used_[i]) continue;
      const int rc = io_uring_register_files_update(&ring_, static_cast<unsigned>(i), &fd, 1);
      if (rc < 0) return ErrnoToStatus(-rc, "io_uring_register_files_update");
      file_used_[i] = true;
      return static_cast<int>(i);
    }
    return absl::ResourceExhaustedError(absl::StrCat("io_uring fixed-file table full (", file_used_.size(), " files)"));
  }

  absl::Status UnregisterFile(int index) override {
    if (index < 0 || static_cast<size_t>(index) >= file_used_.size() || !file_used_[static_cast<size_t>(index)]) {
      return absl::InvalidArgumentError(absl::StrCat("no registered file at index ", index));
    }
    int none = -1;
    const int rc = io_uring_register_files_update(&ring_, static_cast<unsigned>(index), &none, 1);
    if (rc < 0) return ErrnoToStatus(-rc, "io_uring_register_files_update");
    file_used_[static_cast<size_t>(index)] = false;
    return absl::OkStatus();
  }

 private:
  UringBackend() = default;

  absl::Status SubmitQueued() {
    const int rc = io_uring_submit(&ring_);
    if (rc < 0 && !IsTransientSubmitError(rc)) return ErrnoToStatus(-rc, "io_uring_submit");
    return absl::OkStatus();
  }

  io_uring ring_{};
  bool ring_ready_ = false;
  int capacity_ = 0;
  bool buffers_registered_ = false;
  std::vector<bool> file_used_;  // empty: no fixed-file table
};

}  // namespace

absl::Status ProbeUring() {
  io_uring ring{};
  const int rc = io_uring_queue_init(2, &ring, 0);
  if (rc < 0) return ErrnoToStatus(-rc, "io_uring_queue_init");
  io_uring_queue_exit(&ring);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<IoBackend>> CreateUringBackend(const IoEngineOptions& options) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  return UringBackend::Create(options);
}

}  // namespace strata::offload
