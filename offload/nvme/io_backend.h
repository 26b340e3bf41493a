// The first layer of the NVMe tier's I/O (see io_engine.h): a backend runs
// single read / write operations and reports each raw result. io_uring and
// pread/pwrite threads implement it; tests wrap one to inject faults
// (tests/testutil/fault_io_backend.h). Everything else uses IoEngine.
#ifndef STRATA_OFFLOAD_NVME_IO_BACKEND_H_
#define STRATA_OFFLOAD_NVME_IO_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/nvme/io_engine.h"

namespace strata::offload {

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

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_NVME_IO_BACKEND_H_
