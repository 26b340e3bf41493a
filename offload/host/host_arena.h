// The host tier: one page-aligned region reserved (and optionally locked) up
// front, carved into exact-size buffers and pooled by size, as MemAscend
// does. Sizes are rounded only to the alignment O_DIRECT needs, never to a
// power of two, and a freed buffer goes back to the pool of its size, so a
// training loop that frees and reallocates the same shapes never fragments
// and never grows past its first iteration's peak.
#ifndef STRATA_OFFLOAD_HOST_HOST_ARENA_H_
#define STRATA_OFFLOAD_HOST_HOST_ARENA_H_

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::offload {

struct HostArenaOptions {
  // Bytes reserved for the arena; every buffer is carved from them. > 0.
  size_t capacity_bytes = 0;
  // Start and size granularity of each buffer; a power of two >= 64.
  // 4096 keeps buffers usable for O_DIRECT and io_uring fixed buffers.
  size_t alignment = 4096;
  // Lock the region in RAM (mlock) so it is never swapped and can be pinned
  // for DMA. Checked against RLIMIT_MEMLOCK at creation: too low fails there,
  // not as an OOM kill later.
  bool lock_memory = false;
  // Touch every page at creation so a machine without the memory fails now.
  bool populate = true;
  // Register the region with CUDA (cudaHostRegister) so device copies from
  // it are DMA and asynchronous. Fails at creation in a build without CUDA
  // or when the driver refuses.
  bool pin_for_cuda = false;

  absl::Status Validate() const;
};

class HostArena;

// A buffer owned by the arena; returns itself to its size pool when
// destroyed. Movable, not copyable.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  std::byte* data() const { return data_; }
  // The bytes the caller asked for.
  size_t size() const { return size_; }
  // The bytes reserved for it (size rounded up to the alignment).
  size_t reserved() const { return reserved_; }
  std::span<std::byte> bytes() const { return {data_, size_}; }
  std::span<float> floats() const { return {reinterpret_cast<float*>(data_), size_ / sizeof(float)}; }
  bool valid() const { return data_ != nullptr; }

 private:
  friend class HostArena;
  HostBuffer(HostArena* arena, std::byte* data, size_t size, size_t reserved)
      : arena_(arena), data_(data), size_(size), reserved_(reserved) {}
  void Release();

  HostArena* arena_ = nullptr;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t reserved_ = 0;
};

struct HostArenaStats {
  size_t capacity_bytes = 0;
  size_t requested_bytes = 0;  // live buffers, as asked for
  size_t reserved_bytes = 0;   // carved from the region: live + pooled
  size_t peak_requested_bytes = 0;
  size_t peak_reserved_bytes = 0;
  size_t live_buffers = 0;
  size_t pooled_buffers = 0;
  bool locked = false;
  bool cuda_pinned = false;
};

// Thread-safe. The arena must outlive its buffers.
class HostArena {
 public:
  static absl::StatusOr<std::unique_ptr<HostArena>> Create(const HostArenaOptions& options);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // An exact-size buffer (contents unspecified). Reuses a pooled buffer of
  // the same reserved size if one is free; RESOURCE_EXHAUSTED, with the
  // figures, when the region has no room left.
  absl::StatusOr<HostBuffer> Allocate(size_t bytes);

  HostArenaStats stats() const;
  // The whole region, for registering with io_uring or cudaHostRegister.
  std::span<std::byte> region() const { return {base_, capacity_}; }

 private:
  friend class HostBuffer;
  HostArena(std::byte* base, size_t capacity, size_t alignment, bool locked, bool cuda_pinned);
  void Return(std::byte* data, size_t size, size_t reserved);

  std::byte* const base_;
  const size_t capacity_;
  const size_t alignment_;
  const bool locked_;
  const bool cuda_pinned_;

  mutable std::mutex mu_;
  size_t top_ = 0;  // bytes carved so far
  std::map<size_t, std::vector<std::byte*>> free_by_size_;
  HostArenaStats stats_;
};

// RLIMIT_MEMLOCK's soft limit in bytes; SIZE_MAX when unlimited.
size_t MemlockLimitBytes();

// OK when `bytes` may be locked under `limit`; a privileged process
// (CAP_IPC_LOCK, e.g. root) may lock past it. RESOURCE_EXHAUSTED naming the
// limit and how to raise it otherwise.
absl::Status CheckMemlock(size_t bytes, size_t limit, bool privileged);

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_HOST_HOST_ARENA_H_
