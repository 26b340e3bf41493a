// Batched block I/O for the NVMe tier.
//
// Two layers; this header is the second, io_backend.h the first:
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
#ifndef STRATA_OFFLOAD_NVME_IO_ENGINE_H_
#define STRATA_OFFLOAD_NVME_IO_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
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

// The backend an engine drives (io_backend.h).
class IoBackend;

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
  int max_in_flight = 0;  // high-water mark of operations in flight
  int64_t bytes = 0;      // bytes transferred by successful operations
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
  virtual ~IoEngine() = default;
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // Queues `requests` and starts as many pieces as the queue depth allows.
  // INVALID_ARGUMENT (nothing queued) for a negative offset or length or a
  // null buffer; a zero-length request completes OK at the next Wait.
  virtual absl::Status Submit(std::span<const IoRequest> requests) = 0;
  absl::Status Submit(const IoRequest& request) { return Submit({&request, 1}); }

  // Drives I/O until at least `min_completions` transfers have finished (or
  // none is pending) and appends their completions to `out`, together with any
  // others that finished. A non-OK return means the backend broke; per
  // transfer errors are in the completions.
  virtual absl::Status Wait(int min_completions, std::vector<IoCompletion>* out) = 0;

  // Submits `requests`, waits for all of them, and returns the first error.
  // FAILED_PRECONDITION when other transfers are pending (their completions
  // would be consumed here).
  virtual absl::Status Run(std::span<const IoRequest> requests) = 0;

  // Transfers submitted and not yet returned by Wait.
  virtual int pending() const = 0;

  // Registers caller memory (e.g. the host arena) as io_uring fixed buffers;
  // pieces that lie inside one are issued as READ_FIXED / WRITE_FIXED.
  // Replaces an earlier registration; an empty span unregisters. Regions over
  // 1 GiB are registered in 1 GiB slices. Must not be called with transfers
  // pending.
  virtual absl::Status RegisterBuffers(std::span<const std::span<std::byte>> regions) = 0;
  // See IoBackend::RegisterFile.
  virtual absl::StatusOr<int> RegisterFile(int fd) = 0;
  virtual absl::Status UnregisterFile(int index) = 0;

  virtual std::string backend_name() const = 0;
  virtual int queue_depth() const = 0;
  virtual int64_t chunk_size() const = 0;
  virtual const IoEngineStats& stats() const = 0;

 protected:
  IoEngine() = default;
};

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_NVME_IO_ENGINE_H_
