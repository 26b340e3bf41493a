#include "base/heap.h"

#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

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

namespace {

// The kept blocks: few (each of kOwnMappingBytes or more), so a list
// searched in full.
struct KeptBlock {
  void* block;
  size_t mapped;
  uint64_t released;  // order of release: the oldest goes first
};
struct LargeBlocks {
  std::mutex mu;
  std::vector<KeptBlock> kept;
  size_t kept_bytes = 0;
  size_t in_use = 0;       // bytes of blocks taken and not released
  size_t most_in_use = 0;  // the most ever at once: the bound on in_use + kept_bytes
  uint64_t releases = 0;
};

LargeBlocks& Blocks() {
  static auto* blocks = new LargeBlocks;  // never destroyed: tensors outlive statics
  return *blocks;
}

// Takes kept block `i` out of the list (under the lock).
KeptBlock Remove(LargeBlocks& b, size_t i) {
  const KeptBlock k = b.kept[i];
  b.kept_bytes -= k.mapped;
  b.kept[i] = b.kept.back();
  b.kept.pop_back();
  return k;
}

}  // namespace

void* TakeLargeBlock(size_t bytes, size_t* mapped) {
  const size_t size = RoundUp(bytes, kSmallPage);
  std::vector<KeptBlock> unmap;
  size_t previous_most = 0;
  LargeBlocks& b = Blocks();
  {
    std::lock_guard<std::mutex> lock(b.mu);
    size_t best = b.kept.size();
    for (size_t i = 0; i < b.kept.size(); ++i) {
      const size_t m = b.kept[i].mapped;
      if (m >= size && (best == b.kept.size() || m < b.kept[best].mapped)) best = i;
    }
    if (best < b.kept.size()) {
      KeptBlock k = Remove(b, best);
      if (k.mapped > size + size / 4) {
        // Much larger: its head serves, its tail stays kept (merged back
        // when the head returns, if the tail is still there).
        b.kept.push_back({static_cast<char*>(k.block) + size, k.mapped - size, k.released});
        b.kept_bytes += k.mapped - size;
        k.mapped = size;
      }
      b.in_use += k.mapped;
      *mapped = k.mapped;
      return k.block;
    }
    // A new mapping: unmap the oldest kept blocks until what is mapped stays
    // within the most ever in use (this request's counted in).
    b.in_use += size;
    previous_most = b.most_in_use;
    b.most_in_use = std::max(b.most_in_use, b.in_use);
    while (!b.kept.empty() && b.in_use + b.kept_bytes > b.most_in_use) {
      size_t oldest = 0;
      for (size_t i = 1; i < b.kept.size(); ++i) {
        if (b.kept[i].released < b.kept[oldest].released) oldest = i;
      }
      unmap.push_back(Remove(b, oldest));
    }
  }
  for (const KeptBlock& k : unmap) UnmapLargeBlock(k.block, k.mapped);  // outside the lock
  void* block = MapLargeBlock(size);
  if (block == nullptr) {
    // Under memory pressure the kept blocks hold what this one needs.
    UnmapKeptLargeBlocks();
    block = MapLargeBlock(size);
  }
  if (block == nullptr) {
    std::lock_guard<std::mutex> lock(b.mu);
    b.in_use -= size;
    b.most_in_use = std::max(previous_most, b.in_use);  // never mapped: no new high water
  }
  *mapped = size;
  return block;
}

void ReleaseLargeBlock(void* block, size_t mapped) {
  if (block == nullptr) return;
  LargeBlocks& b = Blocks();
  std::lock_guard<std::mutex> lock(b.mu);
  b.in_use -= mapped;
  // Kept blocks that border it join it, undoing splits (and joining
  // neighbouring mappings: one munmap unmaps both). No two kept blocks
  // border each other, so there is at most one on each side.
  KeptBlock joined{block, mapped, b.releases++};
  for (size_t i = 0; i < b.kept.size();) {
    char* start = static_cast<char*>(joined.block);
    char* other = static_cast<char*>(b.kept[i].block);
    if (other + b.kept[i].mapped != start && start + joined.mapped != other) {
      ++i;
      continue;
    }
    joined.mapped += Remove(b, i).mapped;  // the last block moved to i: look at it next
    joined.block = std::min(start, other);
  }
  b.kept.push_back(joined);
  b.kept_bytes += joined.mapped;
}

void UnmapKeptLargeBlocks() {
  LargeBlocks& b = Blocks();
  std::vector<KeptBlock> unmap;
  {
    std::lock_guard<std::mutex> lock(b.mu);
    unmap.swap(b.kept);
    b.kept_bytes = 0;
    b.most_in_use = b.in_use;  // a fresh start: the next job's own high water
  }
  for (const KeptBlock& k : unmap) UnmapLargeBlock(k.block, k.mapped);
}

size_t KeptLargeBlockBytes() {
  LargeBlocks& b = Blocks();
  std::lock_guard<std::mutex> lock(b.mu);
  return b.kept_bytes;
}

}  // namespace strata
