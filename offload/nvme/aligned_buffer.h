// A minimal owning heap buffer whose start is aligned for O_DIRECT I/O.
//
// This is deliberately small: bounce buffers for the NVMe store's unaligned
// heads and tails, and test/benchmark data. The pinned host arena (pooled,
// cudaHostRegister'd) is a separate component.
#ifndef STRATA_OFFLOAD_NVME_ALIGNED_BUFFER_H_
#define STRATA_OFFLOAD_NVME_ALIGNED_BUFFER_H_

#include <cstddef>
#include <span>

#include "absl/status/statusor.h"

namespace strata::offload {

// O_DIRECT wants buffer addresses, file offsets and lengths aligned to the
// device's logical block size; 4096 covers every device we expect (512e and
// 4Kn NVMe) and is the page size, so it is used everywhere in offload/.
inline constexpr size_t kDirectIoAlignment = 4096;

// Rounds `n` up to a multiple of `alignment` (a power of two).
constexpr size_t RoundUpTo(size_t n, size_t alignment) { return (n + alignment - 1) & ~(alignment - 1); }

// Owns `size` bytes starting at an address aligned to `alignment`. The
// contents are NOT initialised (zeroing a multi-GiB buffer costs more than the
// I/O it feeds). Move-only; frees on destruction.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // RESOURCE_EXHAUSTED when the allocation fails; INVALID_ARGUMENT when
  // `alignment` is not a power of two multiple of sizeof(void*).
  static absl::StatusOr<AlignedBuffer> Allocate(size_t size, size_t alignment = kDirectIoAlignment);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<std::byte> span() const { return {data_, size_}; }

 private:
  AlignedBuffer(std::byte* data, size_t size) : data_(data), size_(size) {}
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace strata::offload

#endif  // STRATA_OFFLOAD_NVME_ALIGNED_BUFFER_H_
