#include "offload/host/host_arena.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "offload/host/cuda_host.h"

namespace strata::offload {

absl::Status HostArenaOptions::Validate() const {
  if (capacity_bytes == 0) return absl::InvalidArgumentError("host arena: capacity_bytes must be > 0");
  if (alignment < 64 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host arena: alignment must be a power of two >= 64, got ", alignment));
  }
  return absl::OkStatus();
}

size_t MemlockLimitBytes() {
  rlimit limit;
  if (::getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
  return static_cast<size_t>(limit.rlim_cur);
}

absl::Status CheckMemlock(size_t bytes, size_t limit, bool privileged) {
  if (privileged || bytes <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("host arena: cannot lock ", bytes, " bytes: RLIMIT_MEMLOCK is ", limit,
                   " bytes (raise it with `ulimit -l` or the container's memlock limit, or lower the host budget)"));
}

absl::StatusOr<std::unique_ptr<HostArena>> HostArena::Create(const HostArenaOptions& options) {
  STRATA_RETURN_IF_ERROR(options.Validate());
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t capacity = (options.capacity_bytes + page - 1) / page * page;
  if (options.lock_memory) {
    STRATA_RETURN_IF_ERROR(CheckMemlock(capacity, MemlockLimitBytes(), ::geteuid() == 0));
  }
  void* base = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return ErrnoToStatus(errno, absl::StrCat("host arena: mmap of ", capacity, " bytes"));
  // Huge pages where the kernel offers them on request (THP "madvise"):
  // fewer TLB misses for Adam's streaming passes and fewer pages to pin.
  // Advisory, so failure is ignored; it must precede populating.
  (void)::madvise(base, capacity, MADV_HUGEPAGE);
  if (options.populate) {
    // Touch every page now, so a machine without the memory fails here.
    if (::madvise(base, capacity, MADV_POPULATE_WRITE) != 0) {
      const int err = errno;
      if (err != EINVAL) {
        ::munmap(base, capacity);
        return ErrnoToStatus(err, absl::StrCat("host arena: populating ", capacity, " bytes"));
      }
      // Kernels before 5.14 lack MADV_POPULATE_WRITE: touch each page.
      auto* bytes = static_cast<volatile char*>(base);
      for (size_t offset = 0; offset < capacity; offset += page) bytes[offset] = 0;
    }
  }
  if (options.lock_memory && ::mlock(base, capacity) != 0) {
    const int err = errno;
    ::munmap(base, capacity);
    return ErrnoToStatus(err, absl::StrCat("host arena: mlock of ", capacity, " bytes"));
  }
  if (options.pin_for_cuda) {
    if (auto s = RegisterWithCuda(base, capacity); !s.ok()) {
      if (options.lock_memory) ::munlock(base, capacity);
      ::munmap(base, capacity);
      return s;
    }
  }
  STRATA_LOG(Debug) << "host arena: " << capacity << " bytes" << (options.lock_memory ? ", locked" : "")
                    << (options.pin_for_cuda ? ", pinned for CUDA" : "");
  return std::unique_ptr<HostArena>(new HostArena(static_cast<std::byte*>(base), capacity, options.alignment,
                                                  options.lock_memory, options.pin_for_cuda));
}

HostArena::HostArena(std::byte* base, size_t capacity, size_t alignment, bool locked, bool cuda_pinned)
    : base_(base), capacity_(capacity), alignment_(alignment), locked_(locked), cuda_pinned_(cuda_pinned) {
  stats_.capacity_bytes = capacity;
  stats_.locked = locked;
  stats_.cuda_pinned = cuda_pinned;
}

HostArena::~HostArena() {
  if (stats_.live_buffers != 0) {
    STRATA_LOG(Error) << "host arena destroyed with " << stats_.live_buffers << " live buffers";
  }
  if (cuda_pinned_) UnregisterWithCuda(base_);
  if (locked_) ::munlock(base_, capacity_);
  ::munmap(base_, capacity_);
}

absl::StatusOr<HostBuffer> HostArena::Allocate(size_t bytes) {
  const size_t reserved = std::max<size_t>(alignment_, (bytes + alignment_ - 1) / alignment_ * alignment_);
  std::lock_guard<std::mutex> lock(mu_);
  std::byte* data = nullptr;
  if (auto it = free_by_size_.find(reserved); it != free_by_size_.end() && !it->second.empty()) {
    data = it->second.back();
    it->second.pop_back();
    --stats_.pooled_buffers;
  } else {
    if (capacity_ - top_ < reserved) {
      return absl::ResourceExhaustedError(absl::StrCat("host arena: cannot allocate ", bytes,
                                                       " bytes: ", capacity_ - top_, " of ", capacity_,
                                                       " bytes left unreserved (", stats_.requested_bytes, " in use, ",
                                                       stats_.pooled_buffers, " pooled buffers of other sizes)"));
    }
    data = base_ + top_;
    top_ += reserved;
    stats_.reserved_bytes = top_;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, top_);
  }
  stats_.requested_bytes += bytes;
  stats_.peak_requested_bytes = std::max(stats_.peak_requested_bytes, stats_.requested_bytes);
  ++stats_.live_buffers;
  return HostBuffer(this, data, bytes, reserved);
}

void HostArena::Return(std::byte* data, size_t size, size_t reserved) {
  std::lock_guard<std::mutex> lock(mu_);
  free_by_size_[reserved].push_back(data);
  stats_.requested_bytes -= size;
  --stats_.live_buffers;
  ++stats_.pooled_buffers;
}

HostArenaStats HostArena::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : arena_(std::exchange(other.arena_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      reserved_(std::exchange(other.reserved_, 0)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    arena_ = std::exchange(other.arena_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    reserved_ = std::exchange(other.reserved_, 0);
  }
  return *this;
}

HostBuffer::~HostBuffer() { Release(); }

void HostBuffer::Release() {
  if (arena_ != nullptr && data_ != nullptr) arena_->Return(data_, size_, reserved_);
  arena_ = nullptr;
  data_ = nullptr;
}

}  // namespace strata::offload
