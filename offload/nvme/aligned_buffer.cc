#include "offload/nvme/aligned_buffer.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file.h"

namespace strata::offload {

absl::StatusOr<AlignedBuffer> AlignedBuffer::Allocate(size_t size, size_t alignment) {
  if (alignment < sizeof(void*) || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer alignment ", alignment, " is not a power of two >= ", sizeof(void*)));
  }
  if (size == 0) return AlignedBuffer();
  void* memory = nullptr;
  // posix_memalign reports its error as a return value, not through errno.
  const int rc = ::posix_memalign(&memory, alignment, size);
  if (rc != 0) return ErrnoToStatus(rc, absl::StrCat("allocate ", size, " aligned bytes"));
  return AlignedBuffer(static_cast<std::byte*>(memory), size);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace strata::offload
