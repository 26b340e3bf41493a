#include "offload/nvme/io_engine.h"

#include <algorithm>
#include <cerrno>
#include <deque>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/engine_counters.h"
#include "base/file.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "offload/nvme/io_backend.h"

namespace strata::offload {

namespace {

// io_uring lengths are 32-bit and a registered buffer is at most 1 GiB; one
// bound serves both.
constexpr int64_t kMaxPieceBytes = int64_t{1} << 30;
constexpr int64_t kMaxRegisteredSlice = int64_t{1} << 30;

const char* OpName(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

}  // namespace

std::string IoEngineKindName(IoEngineKind kind) {
  switch (kind) {
    case IoEngineKind::kAuto:
      return "auto";
    case IoEngineKind::kUring:
      return "uring";
    case IoEngineKind::kPosix:
      return "posix";
  }
  return "unknown";
}

absl::StatusOr<IoEngineKind> ParseIoEngineKind(const std::string& name) {
  if (name == "auto") return IoEngineKind::kAuto;
  if (name == "uring" || name == "io_uring") return IoEngineKind::kUring;
  if (name == "posix") return IoEngineKind::kPosix;
  return absl::InvalidArgumentError(absl::StrCat("unknown I/O engine '", name, "' (expected auto, uring or posix)"));
}

absl::Status IoEngineOptions::Validate() const {
  if (queue_depth < 1 || queue_depth > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("queue_depth must be in [1, 4096], got ", queue_depth));
  }
  if (chunk_size < 4096 || chunk_size % 4096 != 0 || chunk_size > kMaxPieceBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_size must be a multiple of 4096 in [4096, 1 GiB], got ", chunk_size));
  }
  if (max_registered_files < 0 || max_registered_files > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_registered_files must be in [0, 65536], got ", max_registered_files));
  }
  if (posix_threads < 0 || posix_threads > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("posix_threads must be in [0, 1024], got ", posix_threads));
  }
  if (max_retries < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_retries must be >= 0, got ", max_retries));
  }
  return absl::OkStatus();
}

class IoEngineImpl final : public IoEngine {
 public:
  IoEngineImpl(const IoEngineOptions& options, std::unique_ptr<IoBackend> backend);
  ~IoEngineImpl() override;
  absl::Status Submit(std::span<const IoRequest> requests) override;
  absl::Status Wait(int min_completions, std::vector<IoCompletion>* out) override;
  absl::Status Run(std::span<const IoRequest> requests) override;
  absl::Status RegisterBuffers(std::span<const std::span<std::byte>> regions) override;
  int pending() const override { return static_cast<int>(transfers_.size() + ready_.size()); }
  absl::StatusOr<int> RegisterFile(int fd) override { return backend_->RegisterFile(fd); }
  absl::Status UnregisterFile(int index) override { return backend_->UnregisterFile(index); }
  std::string backend_name() const override { return backend_->name(); }
  int queue_depth() const override { return queue_depth_; }
  int64_t chunk_size() const override { return chunk_size_; }
  const IoEngineStats& stats() const override { return stats_; }

 private:
  struct Transfer {
    IoRequest request;
    int64_t issued = 0;  // bytes handed out as first-time pieces
    int64_t done = 0;    // bytes confirmed by the backend
    int in_flight = 0;
    absl::Status status;
  };
  struct Piece {
    uint64_t transfer = 0;  // key into transfers_
    int64_t offset = 0;
    std::byte* buffer = nullptr;
    int64_t length = 0;
    int retries = 0;
  };
  struct RegisteredSlice {
    const std::byte* begin = nullptr;
    const std::byte* end = nullptr;
  };

  // Issues pieces (resubmissions first) while there is queue depth left.
  absl::Status Pump();
  void HandleResult(const IoBackendResult& result);
  void Fail(Transfer& transfer, absl::Status status);
  void MaybeFinish(uint64_t id);
  int FindRegisteredBuffer(const std::byte* buffer, int64_t length) const;

  std::unique_ptr<IoBackend> backend_;
  int queue_depth_;
  int64_t chunk_size_;
  int max_retries_;
  uint64_t next_transfer_ = 1;
  std::unordered_map<uint64_t, Transfer> transfers_;
  std::deque<uint64_t> to_issue_;  // transfers with bytes not yet handed out
  std::deque<Piece> retries_;      // pieces to resubmit, ahead of new pieces
  std::vector<Piece> slots_;       // in-flight pieces; backend tag = slot index
  std::vector<int> free_slots_;
  std::vector<IoCompletion> ready_;
  std::vector<RegisteredSlice> registered_;  // sorted by address
  IoEngineStats stats_;
  // Scratch space reused across calls to avoid per-call allocation.
  std::vector<IoBackendOp> issue_batch_;
  std::vector<IoBackendResult> results_;
};

absl::StatusOr<std::unique_ptr<IoEngine>> IoEngine::Create(const IoEngineOptions& options) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  absl::StatusOr<std::unique_ptr<IoBackend>> backend;
  switch (options.kind) {
    case IoEngineKind::kPosix:
      backend = CreatePosixBackend(options);
      break;
    case IoEngineKind::kUring:
      backend = CreateUringBackend(options);
      break;
    case IoEngineKind::kAuto:
      backend = CreateUringBackend(options);
      if (!backend.ok()) {
        // Containers with a default seccomp profile refuse io_uring_setup
        // (EPERM), old kernels lack it (ENOSYS): still serve, just slower.
        STRATA_LOG(Warning) << "io_uring unavailable (" << backend.status().ToString()
                            << "); using pread/pwrite threads";
        backend = CreatePosixBackend(options);
      }
      break;
  }
  if (!backend.ok()) return backend.status();
  return Create(options, *std::move(backend));
}

absl::StatusOr<std::unique_ptr<IoEngine>> IoEngine::Create(const IoEngineOptions& options,
                                                           std::unique_ptr<IoBackend> backend) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  if (backend == nullptr) return absl::InvalidArgumentError("IoEngine needs a backend");
  return std::unique_ptr<IoEngine>(new IoEngineImpl(options, std::move(backend)));
}

IoEngineImpl::IoEngineImpl(const IoEngineOptions& options, std::unique_ptr<IoBackend> backend)
    : backend_(std::move(backend)),
      queue_depth_(std::max(1, std::min(options.queue_depth, backend_->capacity()))),
      chunk_size_(options.chunk_size),
      max_retries_(options.max_retries) {
  slots_.resize(static_cast<size_t>(queue_depth_));
  for (int i = queue_depth_ - 1; i >= 0; --i) free_slots_.push_back(i);
}

IoEngineImpl::~IoEngineImpl() {
  // The kernel may still be writing into caller buffers: wait for every
  // operation before the backend (and the caller's memory) goes away.
  int in_flight = queue_depth_ - static_cast<int>(free_slots_.size());
  while (in_flight > 0) {
    results_.clear();
    const absl::Status status = backend_->Reap(1, &results_);
    if (!status.ok()) {
      STRATA_LOG(Error) << "abandoning " << in_flight << " in-flight I/O operations: " << status;
      return;
    }
    in_flight -= static_cast<int>(results_.size());
  }
}

absl::Status IoEngineImpl::Submit(std::span<const IoRequest> requests) {
  for (const IoRequest& r : requests) {
    if (r.offset < 0 || r.length < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(OpName(r.op), " ", r.path, ": negative offset ", r.offset, " or length ", r.length));
    }
    if (r.length > 0 && r.buffer == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(OpName(r.op), " ", r.path, ": null buffer"));
    }
    if (r.file < 0) {
      return absl::InvalidArgumentError(absl::StrCat(OpName(r.op), " ", r.path, ": invalid file ", r.file));
    }
  }
  for (const IoRequest& r : requests) {
    if (r.length == 0) {
      ready_.push_back({r.tag, absl::OkStatus()});
      continue;
    }
    const uint64_t id = next_transfer_++;
    Transfer transfer;
    transfer.request = r;
    transfers_.emplace(id, std::move(transfer));
    to_issue_.push_back(id);
  }
  return Pump();
}

int IoEngineImpl::FindRegisteredBuffer(const std::byte* buffer, int64_t length) const {
  if (registered_.empty()) return -1;
  auto it = std::upper_bound(registered_.begin(), registered_.end(), buffer,
                             [](const std::byte* p, const RegisteredSlice& slice) { return p < slice.begin; });
  if (it == registered_.begin()) return -1;
  --it;
  if (buffer + length > it->end) return -1;
  return static_cast<int>(it - registered_.begin());
}

absl::Status IoEngineImpl::Pump() {
  issue_batch_.clear();
  while (!free_slots_.empty()) {
    Piece piece;
    if (!retries_.empty()) {
      piece = retries_.front();
      retries_.pop_front();
      // A transfer that failed meanwhile has already been reported.
      auto it = transfers_.find(piece.transfer);
      if (it == transfers_.end() || !it->second.status.ok()) continue;
    } else if (!to_issue_.empty()) {
      const uint64_t id = to_issue_.front();
      auto it = transfers_.find(id);
      if (it == transfers_.end() || !it->second.status.ok()) {
        to_issue_.pop_front();
        continue;
      }
      Transfer& t = it->second;
      piece.transfer = id;
      piece.offset = t.request.offset + t.issued;
      piece.buffer = t.request.buffer + t.issued;
      piece.length = std::min(chunk_size_, t.request.length - t.issued);
      t.issued += piece.length;
      if (t.issued == t.request.length) to_issue_.pop_front();
    } else {
      break;
    }
    Transfer& t = transfers_.at(piece.transfer);
    ++t.in_flight;
    const int slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[static_cast<size_t>(slot)] = piece;
    IoBackendOp op;
    op.op = t.request.op;
    op.file = t.request.file;
    op.fixed_file = t.request.fixed_file;
    op.buffer_index = FindRegisteredBuffer(piece.buffer, piece.length);
    op.offset = piece.offset;
    op.buffer = piece.buffer;
    op.length = static_cast<uint32_t>(piece.length);
    op.tag = static_cast<uint64_t>(slot);
    if (op.buffer_index >= 0) ++stats_.fixed_buffer_ops;
    if (op.fixed_file) ++stats_.fixed_file_ops;
    issue_batch_.push_back(op);
  }
  if (issue_batch_.empty()) return absl::OkStatus();
  stats_.ops_issued += static_cast<int64_t>(issue_batch_.size());
  stats_.max_in_flight = std::max(stats_.max_in_flight, queue_depth_ - static_cast<int>(free_slots_.size()));
  return backend_->Issue(issue_batch_);
}

void IoEngineImpl::Fail(Transfer& transfer, absl::Status status) {
  if (transfer.status.ok()) transfer.status = std::move(status);
}

void IoEngineImpl::MaybeFinish(uint64_t id) {
  auto it = transfers_.find(id);
  Transfer& t = it->second;
  if (t.in_flight > 0) return;
  if (t.status.ok() && t.done < t.request.length) return;  // pieces still queued
  ready_.push_back({t.request.tag, std::move(t.status)});
  transfers_.erase(it);
}

void IoEngineImpl::HandleResult(const IoBackendResult& result) {
  const int slot = static_cast<int>(result.tag);
  Piece piece = slots_[static_cast<size_t>(slot)];
  free_slots_.push_back(slot);
  Transfer& t = transfers_.at(piece.transfer);
  --t.in_flight;
  const IoRequest& r = t.request;
  const int64_t res = result.res;
  if (!t.status.ok()) {
    // Another piece already failed; this one only had to drain.
  } else if (res == -EAGAIN || res == -EINTR || (res == 0 && r.op == IoOp::kWrite)) {
    // Transient: the kernel made no progress but may next time. Bounded so a
    // device that never recovers surfaces as an error instead of a hang.
    if (++piece.retries > max_retries_) {
      Fail(t, absl::UnavailableError(absl::StrCat(OpName(r.op), " ", r.path, " at offset ", piece.offset,
                                                  ": no progress after ", max_retries_, " retries (last result ", res,
                                                  ")")));
    } else {
      ++stats_.retry_resubmits;
      retries_.push_back(piece);
    }
  } else if (res == 0) {
    Fail(t, absl::OutOfRangeError(absl::StrCat("read ", r.path, " at offset ", piece.offset,
                                               ": unexpected end of file (", piece.length, " bytes missing)")));
  } else if (res < 0) {
    Fail(t, ErrnoToStatus(static_cast<int>(-res), absl::StrCat(OpName(r.op), " ", r.path, " at offset ", piece.offset,
                                                               " (", piece.length, " bytes)")));
  } else if (res > piece.length) {
    Fail(t,
         absl::InternalError(absl::StrCat(OpName(r.op), " ", r.path, " at offset ", piece.offset, ": kernel reported ",
                                          res, " bytes for a ", piece.length, "-byte request")));
  } else {
    stats_.bytes += res;
    EngineCounters& counters = GlobalEngineCounters();
    EngineCounters::Add(r.op == IoOp::kRead ? counters.nvme_read_bytes : counters.nvme_written_bytes, res);
    t.done += res;
    if (res < piece.length) {
      // Short transfer: the rest goes out again rather than being lost.
      ++stats_.short_resubmits;
      piece.offset += res;
      piece.buffer += res;
      piece.length -= res;
      piece.retries = 0;
      retries_.push_back(piece);
    }
  }
  MaybeFinish(piece.transfer);
}

absl::Status IoEngineImpl::Wait(int min_completions, std::vector<IoCompletion>* out) {
  int got = 0;
  while (true) {
    got += static_cast<int>(ready_.size());
    for (IoCompletion& c : ready_) out->push_back(std::move(c));
    ready_.clear();
    if (got >= min_completions || transfers_.empty()) return absl::OkStatus();
    STRATA_RETURN_IF_ERROR(Pump());
    if (free_slots_.size() == static_cast<size_t>(queue_depth_)) {
      return absl::InternalError(absl::StrCat("I/O engine stalled with ", transfers_.size(), " transfers pending"));
    }
    results_.clear();
    STRATA_RETURN_IF_ERROR(backend_->Reap(1, &results_));
    for (const IoBackendResult& result : results_) HandleResult(result);
  }
}

absl::Status IoEngineImpl::Run(std::span<const IoRequest> requests) {
  if (pending() > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("IoEngineImpl::Run with ", pending(), " other transfers pending"));
  }
  STRATA_RETURN_IF_ERROR(Submit(requests));
  std::vector<IoCompletion> completions;
  if (auto status = Wait(static_cast<int>(requests.size()), &completions); !status.ok()) {
    return status;
  }
  for (const IoCompletion& c : completions) {
    if (!c.status.ok()) return c.status;
  }
  return absl::OkStatus();
}

absl::Status IoEngineImpl::RegisterBuffers(std::span<const std::span<std::byte>> regions) {
  if (pending() > 0) {
    return absl::FailedPreconditionError("RegisterBuffers with transfers pending");
  }
  std::vector<RegisteredSlice> slices;
  for (const auto& region : regions) {
    for (size_t at = 0; at < region.size(); at += kMaxRegisteredSlice) {
      const size_t n = std::min(region.size() - at, static_cast<size_t>(kMaxRegisteredSlice));
      slices.push_back({region.data() + at, region.data() + at + n});
    }
  }
  std::sort(slices.begin(), slices.end(),
            [](const RegisteredSlice& a, const RegisteredSlice& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < slices.size(); ++i) {
    if (slices[i].begin < slices[i - 1].end) {
      return absl::InvalidArgumentError("RegisterBuffers: regions overlap");
    }
  }
  std::vector<std::span<std::byte>> spans;
  spans.reserve(slices.size());
  for (const RegisteredSlice& s : slices) {
    spans.emplace_back(const_cast<std::byte*>(s.begin), static_cast<size_t>(s.end - s.begin));
  }
  registered_.clear();
  STRATA_RETURN_IF_ERROR(backend_->RegisterBuffers(spans));
  registered_ = std::move(slices);
  return absl::OkStatus();
}

}  // namespace strata::offload
