// The NVMe tier: tensors stored as byte blobs in preallocated files, read
// and written through IoEngine (io_uring, or pread/pwrite where refused).
//
// The directory holds a LOCK, a MANIFEST snapshot, an append-only JOURNAL
// and one preallocated O_DIRECT file per tensor. Every write is crash-safe:
// after a crash at any point, a tensor the store calls valid holds exactly
// the bytes of a completed write. The on-disk format and the ordering that
// makes this true are described in nvme_store.cc.
//
// Thread-compatibility: one thread drives an NvmeStore (the streaming
// layer's I/O thread). I/O proceeds in the kernel (or the posix backend's
// threads) between StartRead/StartWrite and Wait. SynchronizedNvmeStore
// makes one safe for several threads.
#ifndef STRATA_OFFLOAD_NVME_NVME_STORE_H_
#define STRATA_OFFLOAD_NVME_NVME_STORE_H_

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

struct NvmeStoreOptions {
  // Existing, writable directory for the slot files and MANIFEST. It is not
  // created: a missing directory is NOT_FOUND, a read-only one
  // PERMISSION_DENIED.
  std::string directory;
  // Largest single I/O in bytes: a tensor is moved in pieces of this size,
  // queue_depth of them in flight. A multiple of 4096. Slots themselves are
  // padded only to 4096 (the O_DIRECT unit), so small tensors do not each
  // waste a block.
  int64_t block_size = int64_t{1} << 20;
  // I/O operations kept in flight (the io_uring ring size).
  int queue_depth = 32;
  // io_uring, pread/pwrite, or io_uring with pread/pwrite where refused.
  IoEngineKind engine = IoEngineKind::kAuto;
  // Upper bound in bytes on all slot files together; 0 means bounded only by
  // the filesystem. Exceeding it is RESOURCE_EXHAUSTED, like a full disk.
  int64_t capacity_bytes = 0;
  // Slot files kept open at once. Idle ones beyond this are closed and
  // reopened on demand, so thousands of tensors stay clear of RLIMIT_NOFILE.
  int max_open_files = 256;
  // JOURNAL bytes (see above) that trigger a compaction into a new MANIFEST;
  // when MANIFEST itself is larger, its size is the trigger instead, so a
  // compaction's cost stays proportional to the journal traffic it saves.
  // Also bounds the replay Open does. At least 4096.
  int64_t journal_limit_bytes = int64_t{1} << 20;

  absl::Status Validate() const;
};

// One tensor of a batched write. `data` must stay valid and unchanged until
// the batch's Wait returns.
struct NvmeWrite {
  std::string id;
  std::span<const std::byte> data;
};

// One tensor of a batched read. `out` must be exactly the tensor's size and
// stay valid until the batch's Wait returns.
struct NvmeRead {
  std::string id;
  std::span<std::byte> out;
};

class NvmeStore {
 public:
  // Identifies one batch started by StartWrite/StartRead.
  using Ticket = uint64_t;

  // Opens (or initialises) the store in options.directory: takes the LOCK,
  // reads MANIFEST, replays JOURNAL (compacting it into a new MANIFEST if it
  // held anything), deletes orphaned slot files, and builds the I/O engine
  // options.engine names. NOT_FOUND / PERMISSION_DENIED for a missing or
  // read-only directory, DATA_LOSS for a corrupt or truncated MANIFEST, a
  // corrupt JOURNAL (other than a torn last line) or a missing valid slot
  // file, FAILED_PRECONDITION when another NvmeStore has the directory open
  // or MANIFEST has an unknown format version.
  static absl::StatusOr<std::unique_ptr<NvmeStore>> Open(const NvmeStoreOptions& options);
  // As above with a caller-built engine (tests inject fault wrappers).
  static absl::StatusOr<std::unique_ptr<NvmeStore>> Open(const NvmeStoreOptions& options,
                                                         std::unique_ptr<IoEngine> engine);
  // Waits for in-flight I/O (it targets caller buffers), then closes. Writes
  // never waited for are left invalid.
  virtual ~NvmeStore() = default;
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Preallocates a slot of at least `bytes` for `id` (a later Put of up to
  // that size cannot hit ENOSPC). Keeps any valid contents.
  virtual absl::Status Reserve(const std::string& id, int64_t bytes) = 0;

  // Writes `data` as the contents of `id` and makes it durable before
  // returning. Any alignment: the store pads and bounces what O_DIRECT cannot
  // take directly. RESOURCE_EXHAUSTED on a full disk or capacity_bytes.
  virtual absl::Status Put(const std::string& id, std::span<const std::byte> data) = 0;
  // Reads `id` into `out`, which must be exactly Size(id) bytes. NOT_FOUND
  // when `id` has no valid contents.
  virtual absl::Status Get(const std::string& id, std::span<std::byte> out) = 0;

  // Asynchronous batches, so the streaming layer can overlap I/O with
  // compute. Start* validates, allocates, queues every transfer and returns;
  // Wait(ticket) blocks until the batch is done and returns its first error
  // (naming the tensor). A write batch is durable and readable only after its
  // Wait returns OK; items of a batch that succeeded stay valid even if
  // another item failed. A tensor may not be read while a write to it is in
  // flight, nor written while any I/O on it is in flight
  // (FAILED_PRECONDITION). Every ticket must be waited for exactly once.
  virtual absl::StatusOr<Ticket> StartWrite(std::span<const NvmeWrite> writes) = 0;
  virtual absl::StatusOr<Ticket> StartRead(std::span<const NvmeRead> reads) = 0;
  virtual absl::StatusOr<Ticket> StartWrite(const std::string& id, std::span<const std::byte> data) = 0;
  virtual absl::StatusOr<Ticket> StartRead(const std::string& id, std::span<std::byte> out) = 0;
  virtual absl::Status Wait(Ticket ticket) = 0;

  // Deletes `id` and its slot file. NOT_FOUND if unknown.
  virtual absl::Status Remove(const std::string& id) = 0;

  // Bytes of `id`'s valid contents; NOT_FOUND when there are none.
  virtual absl::StatusOr<int64_t> Size(const std::string& id) const = 0;
  virtual bool Contains(const std::string& id) const = 0;
  // Ids with valid contents, sorted.
  virtual std::vector<std::string> Ids() const = 0;
  // Bytes allocated to slot files.
  virtual int64_t allocated_bytes() const = 0;

  // Registers caller memory (the host arena) as io_uring fixed buffers; I/O
  // to or from it then skips per-request page pinning. No I/O may be in
  // flight. See IoEngine::RegisterBuffers.
  virtual absl::Status RegisterBuffers(std::span<const std::span<std::byte>> regions) = 0;

  virtual const std::string& directory() const = 0;
  // False when the filesystem refused O_DIRECT (e.g. ramfs) and the store
  // fell back to buffered I/O, with a logged warning.
  virtual bool o_direct() const = 0;
  virtual const IoEngine& engine() const = 0;

  // The slot file name `id` maps to (see the layout above).
  static std::string SlotFileName(const std::string& id);

 protected:
  NvmeStore() = default;
};

// `store` with every call made under one lock: for a store that more than
// one thread drives (a layer streamer's I/O thread prefetching layers while
// an optimizer steps each layer inside the backward pass). A Wait holds the
// lock until its batch is done, so the threads' I/O takes turns.
std::unique_ptr<NvmeStore> SynchronizedNvmeStore(std::unique_ptr<NvmeStore> store);

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_NVME_NVME_STORE_H_
