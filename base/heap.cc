#include "base/heap.h"

#include <malloc.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace strata {
namespace {

// x86-64's (and 4 KiB-page arm64's) small page.
constexpr size_t kSmallPage = 4096;

size_t RoundUp(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

// Whether the operator set a malloc parameter in the environment (glibc's
// MALLOC_..._ variable or its GLIBC_TUNABLES name).
bool SetByEnvironment(const char* variable, const char* tunable) {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  return std::getenv(variable) != nullptr || (tunables != nullptr && std::strstr(tunables, tunable) != nullptr);
}

// Sets a malloc parameter unless the operator set it, which wins.
bool SetUnlessSetByEnvironment(int parameter, size_t value, const char* variable, const char* tunable) {
  if (SetByEnvironment(variable, tunable)) return true;
  return mallopt(parameter, static_cast<int>(value)) == 1;
}

}  // namespace

bool ConfigureHeap() {
  return SetUnlessSetByEnvironment(M_MMAP_THRESHOLD, kOwnMappingBytes, "MALLOC_MMAP_THRESHOLD_",
                                   "glibc.malloc.mmap_threshold") &&
         SetUnlessSetByEnvironment(M_TRIM_THRESHOLD, kKeptHeapBytes, "MALLOC_TRIM_THRESHOLD_",
                                   "glibc.malloc.trim_threshold") &&
         SetUnlessSetByEnvironment(M_TOP_PAD, kKeptHeapBytes, "MALLOC_TOP_PAD_", "glibc.malloc.top_pad");
}

bool LargeBlocksGetOwnMapping() {
  static const bool own = !SetByEnvironment("MALLOC_MMAP_MAX_", "glibc.malloc.mmap_max") &&
                          !SetByEnvironment("MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold");
  return own;
}

void* MapLargeBlock(size_t bytes) {
  // Whole small pages: the kernel backs the huge-page-aligned part with huge
  // pages and the tail with small ones, so no tail is rounded up to 2 MiB.
  const size_t size = RoundUp(bytes, kSmallPage);
  // Map a huge page more than asked and cut the ends off, so the block
  // starts on a huge-page boundary.
  void* raw = mmap(nullptr, size + kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(start, kHugePageBytes);
  if (aligned > start) munmap(raw, aligned - start);
  if (const uintptr_t end = start + size + kHugePageBytes; end > aligned + size) {
    munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));
  }
  auto* block = reinterpret_cast<void*>(aligned);
  // Advice only: without transparent huge pages the block stays in 4 KiB pages.
  (void)madvise(block, size, MADV_HUGEPAGE);
  return block;
}

void UnmapLargeBlock(void* block, size_t bytes) {
  if (block != nullptr) munmap(block, RoundUp(bytes, kSmallPage));
}

}  // namespace strata
