// The NVMe tier: tensors stored as byte blobs in preallocated files, read
// and written through IoEngine (io_uring, or pread/pwrite where refused).
//
// On-disk layout of `NvmeStoreOptions::directory`:
//
//   LOCK          flock'ed while an NvmeStore has the directory open
//   MANIFEST      snapshot of which tensor lives in which slot file, replaced
//                 atomically
//   JOURNAL       the state changes since that snapshot, appended in place
//   <name>.slot   one preallocated (fallocate) file per tensor id, opened
//                 O_DIRECT; its length is the tensor's size rounded up to 4096
//
// Slot file names are derived from the tensor id alone: up to 64 characters
// of the id with everything outside [A-Za-z0-9._-] replaced by '_', a '-',
// the 16 hex digits of the id's FNV-1a 64-bit hash, and ".slot". The same id
// gets the same file in every store, so a directory can be checkpointed by
// copying it; MANIFEST + JOURNAL are still the authority on which file holds
// what.
//
// MANIFEST is text, one record per line:
//
//   strata-nvme-store 2 <generation>
//   slot <valid 0|1> <size> <capacity> <file> <id, C-escaped>
//   ...
//   end <number of slot lines> <FNV-1a 64 of every byte before this line, hex>
//
// A missing or mismatched end line means a truncated or corrupt manifest:
// Open returns DATA_LOSS naming the file rather than guessing. A version 1
// manifest (header "strata-nvme-store 1": no generation, no JOURNAL) is read
// as generation 0 and rewritten in this format by Open; any other version is
// FAILED_PRECONDITION naming the file and the version.
//
// JOURNAL is text as well. Its first line names the snapshot it continues;
// every further line is one commit, a group of operations that became
// durable together (one write + one fdatasync), numbered 1, 2, ...:
//
//   strata-nvme-journal 1 <generation> <FNV-1a 64 of the line before this field, hex>
//   <seq> <op> [<op> ...] <FNV-1a 64 of the line before this field, hex>
//
// where each <op> is one of
//
//   slot <capacity> <file> <id>   slot file created (invalid) or grown to
//                                 <capacity> bytes; contents unchanged
//   inv <id>                      contents invalid
//   val <size> <id>               contents valid, <size> bytes
//   rm <id>                       tensor removed
//
// and <id> is C-escaped with spaces written as \040, so no field holds a
// space. Past the last line the file is zero-filled preallocation (NUL bytes,
// so that an append overwrites written blocks and fdatasync need not commit
// a size change); readers ignore trailing NULs.
//
// Open loads MANIFEST and replays JOURNAL when its generation matches. A
// JOURNAL of an older generation is a leftover from before the latest
// snapshot and is ignored. A last line that lacks its newline or fails its
// checksum is a commit torn by a crash: it is dropped with a warning (safe by
// the ordering below). A bad line followed by good ones, a commit out of
// sequence or describing an impossible change, a JOURNAL newer than MANIFEST,
// or a version 2 MANIFEST without a JOURNAL is DATA_LOSS naming the JOURNAL
// and the line. If the journal held any commit (or anything was dropped),
// Open then compacts: it writes MANIFEST generation+1 (write temporary +
// fsync + rename + fsync of the directory) and afterwards empties JOURNAL for
// the new generation (truncate to the old header, zero-fill, fdatasync, then
// overwrite the header, fdatasync). A crash inside compaction leaves either
// the old generation's JOURNAL, ignored, or an empty one. The running store
// compacts the same way once JOURNAL holds more than
// max(journal_limit_bytes, size of MANIFEST) bytes.
//
// Crash safety. An `inv` commit is durable before any byte of a slot the
// on-disk state calls valid is overwritten, and a `val` commit is appended
// only after the slot's data has been written and fdatasync'ed (and, for a
// new slot file, after the directory holding its name was fsync'ed). A torn
// last commit therefore never hides anything unsafe: a torn `inv` means no
// data was written yet, a torn `val` leaves the slot invalid. So after a
// crash at any point a slot that MANIFEST + JOURNAL call valid holds exactly
// the bytes of a completed write; a half-written slot is never valid. Slot
// files that neither mentions (a crash between creating a slot and recording
// it, or between recording a removal and unlinking it) are deleted by Open.
//
// Failed writes. When a write fails (ENOSPC, EIO, ...) the tensor has no
// readable value in this store object: Get/StartRead return NOT_FOUND until a
// later write succeeds. If the failure came before any byte of an old value
// was overwritten, reopening the directory may still find that old value
// intact; it never finds a partial one.
//
// Thread-compatibility: one thread drives an NvmeStore (the streaming
// layer's I/O thread). I/O proceeds in the kernel (or the posix backend's
// threads) between StartRead/StartWrite and Wait.
#ifndef STRATA_OFFLOAD_NVME_STORE_H_
#define STRATA_OFFLOAD_NVME_STORE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/aligned_buffer.h"
#include "offload/io_engine.h"

namespace strata::offload {

namespace nvme_store_internal {
// MANIFEST + JOURNAL machinery, defined in nvme_store.cc.
class Journal;
struct JournalOp;
}  // namespace nvme_store_internal

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
  ~NvmeStore();
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;

  // Preallocates a slot of at least `bytes` for `id` (a later Put of up to
  // that size cannot hit ENOSPC). Keeps any valid contents.
  absl::Status Reserve(const std::string& id, int64_t bytes);

  // Writes `data` as the contents of `id` and makes it durable before
  // returning. Any alignment: the store pads and bounces what O_DIRECT cannot
  // take directly. RESOURCE_EXHAUSTED on a full disk or capacity_bytes.
  absl::Status Put(const std::string& id, std::span<const std::byte> data);
  // Reads `id` into `out`, which must be exactly Size(id) bytes. NOT_FOUND
  // when `id` has no valid contents.
  absl::Status Get(const std::string& id, std::span<std::byte> out);

  // Asynchronous batches, so the streaming layer can overlap I/O with
  // compute. Start* validates, allocates, queues every transfer and returns;
  // Wait(ticket) blocks until the batch is done and returns its first error
  // (naming the tensor). A write batch is durable and readable only after its
  // Wait returns OK; items of a batch that succeeded stay valid even if
  // another item failed. A tensor may not be read while a write to it is in
  // flight, nor written while any I/O on it is in flight
  // (FAILED_PRECONDITION). Every ticket must be waited for exactly once.
  absl::StatusOr<Ticket> StartWrite(std::span<const NvmeWrite> writes);
  absl::StatusOr<Ticket> StartRead(std::span<const NvmeRead> reads);
  absl::StatusOr<Ticket> StartWrite(const std::string& id, std::span<const std::byte> data);
  absl::StatusOr<Ticket> StartRead(const std::string& id, std::span<std::byte> out);
  absl::Status Wait(Ticket ticket);

  // Deletes `id` and its slot file. NOT_FOUND if unknown.
  absl::Status Remove(const std::string& id);

  // Bytes of `id`'s valid contents; NOT_FOUND when there are none.
  absl::StatusOr<int64_t> Size(const std::string& id) const;
  bool Contains(const std::string& id) const;
  // Ids with valid contents, sorted.
  std::vector<std::string> Ids() const;
  // Bytes allocated to slot files.
  int64_t allocated_bytes() const { return allocated_bytes_; }

  // Registers caller memory (the host arena) as io_uring fixed buffers; I/O
  // to or from it then skips per-request page pinning. No I/O may be in
  // flight. See IoEngine::RegisterBuffers.
  absl::Status RegisterBuffers(std::span<const std::span<std::byte>> regions);

  const std::string& directory() const { return options_.directory; }
  // False when the filesystem refused O_DIRECT (e.g. ramfs) and the store
  // fell back to buffered I/O, with a logged warning.
  bool o_direct() const { return o_direct_; }
  const IoEngine& engine() const { return *engine_; }

  // The slot file name `id` maps to (see the layout above).
  static std::string SlotFileName(const std::string& id);

 private:
  using Journal = nvme_store_internal::Journal;
  using JournalOp = nvme_store_internal::JournalOp;

  struct Entry {
    std::string id;
    std::string file;           // name inside the directory
    int64_t size = 0;           // bytes of contents (meaningful when valid)
    int64_t capacity = 0;       // bytes allocated to the slot file
    bool valid = false;         // readable in this process
    bool durable_valid = false; // the on-disk state may call it valid
    bool name_durable = true;   // the slot file's directory entry is synced
    int64_t recorded_capacity = -1;  // capacity the on-disk state records; -1: unknown
    bool writing = false;
    int readers = 0;
    int fd = -1;
    int fixed_index = -1;       // io_uring fixed-file index, or -1
    uint64_t last_use = 0;
  };
  // One tensor of a batch and the bounce buffer that covers what O_DIRECT
  // cannot take from the caller's memory directly.
  struct Item {
    Entry* entry = nullptr;
    std::byte* caller = nullptr;
    int64_t size = 0;
    AlignedBuffer bounce;
    int64_t bounce_offset = 0;  // where the bounce buffer's bytes go in the tensor
    int64_t bounce_bytes = 0;   // tensor bytes carried by the bounce buffer
    int pending = 0;            // engine transfers outstanding
    absl::Status status;
  };
  struct Batch {
    IoOp op = IoOp::kRead;
    std::vector<Item> items;
    int pending = 0;
  };

  NvmeStore(const NvmeStoreOptions& options, int lock_fd, bool o_direct);
  absl::Status Load();
  // Writes MANIFEST generation+1 from memory, then empties JOURNAL for it.
  absl::Status Compact();
  // Makes `ops` durable: one journal commit, or a compaction when the
  // journal is over its bound or unusable after a failure. Memory must
  // already reflect `ops` (a compaction snapshots it).
  absl::Status Commit(const std::vector<JournalOp>& ops);
  std::string PathOf(const Entry& entry) const;
  absl::Status EnsureOpen(Entry& entry);
  void CloseFile(Entry& entry);
  void CloseIdleFiles();
  // Creates `id` (or grows its slot) so it holds at least `bytes`.
  absl::StatusOr<Entry*> Allocate(const std::string& id, int64_t bytes);
  // Queues the engine transfers for one item of `batch`.
  absl::Status SubmitItem(uint64_t batch_id, size_t index, Batch& batch);
  void Dispatch(const IoCompletion& completion);
  absl::Status FinishRead(Batch& batch);
  absl::Status FinishWrite(Batch& batch);

  NvmeStoreOptions options_;
  std::unique_ptr<IoEngine> engine_;
  std::unique_ptr<Journal> journal_;
  uint64_t generation_ = 0;     // of the latest MANIFEST written or read
  int64_t manifest_bytes_ = 0;  // its size
  int lock_fd_ = -1;
  bool o_direct_ = true;
  std::map<std::string, Entry> entries_;  // ordered: MANIFEST is deterministic
  std::unordered_set<std::string> files_in_use_;
  int64_t allocated_bytes_ = 0;
  int open_files_ = 0;
  uint64_t use_clock_ = 0;
  uint64_t next_batch_ = 1;
  std::unordered_map<uint64_t, Batch> batches_;
  std::vector<IoCompletion> completions_;
  bool warned_fallocate_ = false;
};

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_NVME_STORE_H_
