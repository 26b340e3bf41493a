// A file for bytes that must not outlive the process that wrote them: the
// activations a training step keeps for its backward pass (SSDTrain's
// offload). Unlike NvmeStore it promises no durability (nothing is synced,
// nothing journaled) and has no name: it is opened with O_TMPFILE, or
// created and unlinked at once, so a process killed at any point leaves no
// file behind and the kernel frees the blocks.
//
// The file is `slots` fixed slots of `slot_bytes` each, preallocated at
// Create (a full disk fails there, not in the middle of a step), read and
// written asynchronously through an IoEngine of its own.
//
// Thread-compatible: one thread starts and waits.
#ifndef STRATA_OFFLOAD_NVME_SCRATCH_FILE_H_
#define STRATA_OFFLOAD_NVME_SCRATCH_FILE_H_

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

struct ScratchFileOptions {
  // Existing, writable directory (the NVMe tier's). NOT_FOUND when missing.
  std::string directory;
  // Bytes of one slot; rounded up to 4096.
  int64_t slot_bytes = 0;
  int64_t slots = 0;
  IoEngineKind engine = IoEngineKind::kAuto;
  // Pieces in flight; a slot is split into this many pieces at most, so one
  // slot's transfer keeps the device busy without the caller driving it.
  int queue_depth = 16;
};

class ScratchFile {
 public:
  using Ticket = uint64_t;

  // Opens the unnamed file and preallocates every slot: RESOURCE_EXHAUSTED
  // naming the directory when the disk cannot hold them.
  static absl::StatusOr<std::unique_ptr<ScratchFile>> Create(const ScratchFileOptions& options);
  // As above over a caller-built engine (tests inject faults through it).
  static absl::StatusOr<std::unique_ptr<ScratchFile>> Create(const ScratchFileOptions& options,
                                                             std::unique_ptr<IoEngine> engine);
  // Waits for transfers still in flight (they use caller buffers), then
  // closes: the blocks go back to the filesystem.
  ~ScratchFile();
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  // Starts moving `bytes` to or from slot `slot`. `bytes` must start at a
  // 4096-aligned address and its size be a multiple of 4096 of at most
  // slot_bytes() (O_DIRECT's rules); it must stay valid (unchanged for a
  // write) until the ticket's Wait returns. INVALID_ARGUMENT otherwise.
  absl::StatusOr<Ticket> StartWrite(int64_t slot, std::span<const std::byte> bytes);
  absl::StatusOr<Ticket> StartRead(int64_t slot, std::span<std::byte> bytes);
  // Blocks until the transfer is done; its error names the file's directory
  // and the slot. Every ticket must be waited for exactly once.
  absl::Status Wait(Ticket ticket);

  // Bytes preallocated by this process's open scratch files: they share the
  // NVMe tier's disk with the NvmeStore, and its figure counts both.
  static int64_t OpenBytes();

  int64_t slot_bytes() const { return slot_bytes_; }
  int64_t slots() const { return slots_; }
  // False when the filesystem refused O_DIRECT (tmpfs): buffered I/O then.
  bool o_direct() const { return o_direct_; }
  const IoEngine& engine() const { return *engine_; }

 private:
  ScratchFile(std::string directory, int fd, bool o_direct, int64_t slot_bytes, int64_t slots,
              std::unique_ptr<IoEngine> engine);
  absl::StatusOr<Ticket> Start(IoOp op, int64_t slot, std::byte* data, int64_t length);

  const std::string directory_;
  const int fd_;
  const bool o_direct_;
  const int64_t slot_bytes_;
  const int64_t slots_;
  std::unique_ptr<IoEngine> engine_;
  Ticket next_ticket_ = 1;
  // Finished transfers not yet waited for, with their status.
  std::vector<IoCompletion> finished_;
};

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_NVME_SCRATCH_FILE_H_
