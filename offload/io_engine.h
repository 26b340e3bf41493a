// Batched block I/O for the NVMe tier.
//
// Two layers:
//
//  - IoBackend runs single operations: one read or write system call's worth
//    each, up to capacity() in flight, and reports each raw result (bytes or
//    -errno) without interpreting it. Two implementations: io_uring
//    (CreateUringBackend) and a pool of pread/pwrite threads
//    (CreatePosixBackend) for kernels or containers that refuse io_uring.
//    Tests wrap a backend to inject short transfers and errors
//    (tests/testutil/fault_io_backend.h).
//
//  - IoEngine turns caller transfers of any length into backend operations:
//    it splits them into chunk_size pieces, keeps up to queue_depth pieces in
//    flight, checks every result, resubmits the remainder of a short transfer
//    and any -EAGAIN/-EINTR, and turns other errors into a Status that names
//    the file and offset. The retry logic therefore lives in one place and is
//    exercised identically for both backends.
//
// Neither class is thread-safe: one thread submits and waits (the streaming
// layer's I/O thread). Nothing here blocks except Wait/Run.
#ifndef STRATA_OFFLOAD_IO_ENGINE_H_
#define STRATA_OFFLOAD_IO_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::offload {

enum class IoOp { kRead, kWrite };

// Which backend IoEngine::Create builds.
enum class IoEngineKind {
  kAuto,   // io_uring, or pread/pwrite (logged) when the kernel refuses a ring
  kUring,  // io_uring; Create fails when the kernel refuses a ring
  kPosix,  // pread/pwrite worker threads
};

// "auto", "uring", "posix".
std::string IoEngineKindName(IoEngineKind kind);
// Accepts the names above (and "io_uring"); INVALID_ARGUMENT otherwise.
absl::StatusOr<IoEngineKind> ParseIoEngineKind(const std::string& name);

struct IoEngineOptions {
  // Backend to build; see IoEngineKind.
  IoEngineKind kind = IoEngineKind::kAuto;
  // Most backend operations in flight at once; also the io_uring ring size.
  int queue_depth = 32;
  // Largest single operation in bytes. Transfers are split into pieces of
  // this size so that one large tensor still keeps queue_depth requests busy.
  // A multiple of 4096 so that O_DIRECT pieces stay aligned.
  int64_t chunk_size = int64_t{1} << 20;
  // Slots in io_uring's fixed-file table (RegisterFile). 0 disables fixed
  // files; callers then pass plain descriptors.
  int max_registered_files = 1024;
  // pread/pwrite worker threads for the posix backend; 0 means
  // min(queue_depth, 16).
  int posix_threads = 0;
  // Consecutive -EAGAIN / -EINTR / zero-byte results one piece may get before
  // the transfer fails with UNAVAILABLE (a device that never makes progress
  // must not hang the caller).
  int max_retries = 64;

  absl::Status Validate() const;
};

// One operation as a backend runs it: a single read or write system call.
struct IoBackendOp {
  IoOp op = IoOp::kRead;
  // File descriptor, or an index from RegisterFile when fixed_file is true.
  int file = -1;
  bool fixed_file = false;
  // Index of the registered buffer that contains [buffer, buffer + length),
  // or -1 for an unregistered buffer.
  int buffer_index = -1;
  int64_t offset = 0;
  std::byte* buffer = nullptr;
  uint32_t length = 0;
  // Chosen by the issuer; returned unchanged in the result.
  uint64_t tag = 0;
};

// What the kernel said about one operation: bytes transferred, or -errno.
struct IoBackendResult {
  uint64_t tag = 0;
  int64_t res = 0;
};

class IoBackend {
 public:
  virtual ~IoBackend() = default;

  // "io_uring" or "posix" (wrappers may add to it).
  virtual std::string name() const = 0;
  // Most operations this backend accepts in flight at once.
  virtual int capacity() const = 0;
  // Starts `ops`. The caller guarantees that no more than capacity() are in
  // flight. A non-OK status means the backend itself broke (not one op).
  virtual absl::Status Issue(std::span<const IoBackendOp> ops) = 0;
  // Appends the results of finished operations to `out`, blocking until at
  // least `min_results` have been appended (min_results must not exceed the
  // number in flight). Returns every result already available.
  virtual absl::Status Reap(int min_results, std::vector<IoBackendResult>* out) = 0;
  // Registers `buffers` (replacing any earlier registration) so operations
  // whose buffer_index names one skip per-I/O page pinning. Each buffer must
  // be at most 1 GiB.
  virtual absl::Status RegisterBuffers(std::span<const std::span<std::byte>> buffers) = 0;
  // Registers `fd` and returns the index to use with fixed_file. The caller
  // keeps `fd` open until UnregisterFile. RESOURCE_EXHAUSTED when the table is
  // full, UNIMPLEMENTED when this backend has none.
  virtual absl::StatusOr<int> RegisterFile(int fd) = 0;
  virtual absl::Status UnregisterFile(int index) = 0;
};

// OK when this process may create an io_uring ring; otherwise the status the
// kernel gave (PERMISSION_DENIED for EPERM under seccomp, ...).
absl::Status ProbeUring();

// io_uring with a ring of options.queue_depth entries and a sparse fixed-file
// table of options.max_registered_files slots.
absl::StatusOr<std::unique_ptr<IoBackend>> CreateUringBackend(const IoEngineOptions& options);
// options.posix_threads (or min(queue_depth, 16)) threads running pread/pwrite.
absl::StatusOr<std::unique_ptr<IoBackend>> CreatePosixBackend(const IoEngineOptions& options);

// One caller transfer: `length` bytes at `offset` of a file.
struct IoRequest {
  IoOp op = IoOp::kRead;
  // File descriptor, or an index from RegisterFile when fixed_file is true.
  int file = -1;
  bool fixed_file = false;
  // Byte offset in the file. For O_DIRECT files, offset, buffer and length
  // must be multiples of 4096.
  int64_t offset = 0;
  // Destination of a read / source of a write. Must stay valid (and, for
  // writes, unchanged) until this request's completion has been returned.
  std::byte* buffer = nullptr;
  int64_t length = 0;
  // Returned in the IoCompletion; the engine does not interpret it.
  uint64_t tag = 0;
  // Names the file in error messages.
  std::string path;
};

struct IoCompletion {
  uint64_t tag = 0;
  // OK, or the first error of this transfer, naming path and offset.
  absl::Status status;
};

// Counters for tests and benchmarks. Monotonic over the engine's life.
struct IoEngineStats {
  int64_t ops_issued = 0;       // backend operations, resubmissions included
  int64_t short_resubmits = 0;  // remainders resubmitted after a short transfer
  int64_t retry_resubmits = 0;  // operations resubmitted after -EAGAIN / -EINTR / 0 bytes
  int64_t fixed_buffer_ops = 0;
  int64_t fixed_file_ops = 0;
  int max_in_flight = 0;        // high-water mark of operations in flight
  int64_t bytes = 0;            // bytes transferred by successful operations
};

class IoEngine {
 public:
  // Builds the backend options.kind names. kAuto falls back to pread/pwrite,
  // with a logged warning, when the kernel refuses an io_uring ring.
  static absl::StatusOr<std::unique_ptr<IoEngine>> Create(const IoEngineOptions& options);
  // Uses `backend` as given (tests inject fault wrappers here). The engine
  // keeps at most min(options.queue_depth, backend->capacity()) in flight.
  static absl::StatusOr<std::unique_ptr<IoEngine>> Create(const IoEngineOptions& options,
                                                          std::unique_ptr<IoBackend> backend);
  // Waits for operations still in flight: their buffers belong to callers.
  ~IoEngine();
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // Queues `requests` and starts as many pieces as the queue depth allows.
  // INVALID_ARGUMENT (nothing queued) for a negative offset or length or a
  // null buffer; a zero-length request completes OK at the next Wait.
  absl::Status Submit(std::span<const IoRequest> requests);
  absl::Status Submit(const IoRequest& request) { return Submit({&request, 1}); }

  // Drives I/O until at least `min_completions` transfers have finished (or
  // none is pending) and appends their completions to `out`, together with any
  // others that finished. A non-OK return means the backend broke; per
  // transfer errors are in the completions.
  absl::Status Wait(int min_completions, std::vector<IoCompletion>* out);

  // Submits `requests`, waits for all of them, and returns the first error.
  // FAILED_PRECONDITION when other transfers are pending (their completions
  // would be consumed here).
  absl::Status Run(std::span<const IoRequest> requests);

  // Transfers submitted and not yet returned by Wait.
  int pending() const { return static_cast<int>(transfers_.size() + ready_.size()); }

  // Registers caller memory (e.g. the host arena) as io_uring fixed buffers;
  // pieces that lie inside one are issued as READ_FIXED / WRITE_FIXED.
  // Replaces an earlier registration; an empty span unregisters. Regions over
  // 1 GiB are registered in 1 GiB slices. Must not be called with transfers
  // pending.
  absl::Status RegisterBuffers(std::span<const std::span<std::byte>> regions);
  // See IoBackend::RegisterFile.
  absl::StatusOr<int> RegisterFile(int fd) { return backend_->RegisterFile(fd); }
  absl::Status UnregisterFile(int index) { return backend_->UnregisterFile(index); }

  std::string backend_name() const { return backend_->name(); }
  int queue_depth() const { return queue_depth_; }
  int64_t chunk_size() const { return chunk_size_; }
  const IoEngineStats& stats() const { return stats_; }

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

  IoEngine(const IoEngineOptions& options, std::unique_ptr<IoBackend> backend);
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

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_IO_ENGINE_H_
