// How the process's heap hands memory back to the kernel.
//
// glibc serves an allocation above its mmap threshold with its own mapping,
// returned to the kernel on free. The threshold is dynamic: after a mapped
// block is freed it rises to that block's size (up to 32 MiB), so later
// tensors of a few MiB come from the heap, and a heap fragmented by tensors
// of many sizes keeps their pages resident after they are freed. A job's
// peak RSS then exceeds what it holds: by ~160 MiB (11%) on the medium PPO
// job with NVMe placements, with no time saved (docs/BENCHMARKS.md). The
// memory planner predicts what a job holds, so the process keeps the two
// close by fixing the threshold.
//
// Below the threshold, glibc gives the heap's free top back to the kernel
// once it exceeds 128 KiB, so a loop of temporaries of a few MiB (blocked
// attention's block pairs) faults the same pages in again on every
// iteration: a 2k-token step took 4x as long. The heap keeps up to
// kKeptHeapBytes of free top instead, a bounded addition to RSS.
//
// A block that gets its own mapping is faulted in page by page each time it
// is allocated. With 4 KiB pages that is 256 faults a MiB, and in a virtual
// machine a fault can cost ~20 us: a long sequence's step, whose tensors
// are tens of MiB each, spent more time faulting than computing
// (docs/BENCHMARKS.md, "Long sequences"). Tensors of that size therefore
// take their mapping from MapLargeBlock, in transparent huge pages where
// the kernel offers them (512 times fewer faults).
#ifndef STRATA_BASE_HEAP_H_
#define STRATA_BASE_HEAP_H_

#include <cstddef>

namespace strata {

// A transparent huge page: x86-64's (and 4 KiB-page arm64's) PMD size.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Allocations of at least this many bytes get their own mapping.
inline constexpr size_t kOwnMappingBytes = size_t{4} << 20;

// Free heap top kept for reuse rather than returned to the kernel.
inline constexpr size_t kKeptHeapBytes = size_t{64} << 20;

// Fixes the mmap threshold at kOwnMappingBytes (which also stops it moving)
// and the heap's kept top at kKeptHeapBytes, each unless the environment
// sets it (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_
// or GLIBC_TUNABLES). Call once, first thing in main(). Returns false if
// glibc refused.
bool ConfigureHeap();

// Whether blocks of kOwnMappingBytes and more take their own mapping from
// MapLargeBlock: yes, unless the operator set glibc's mapping knobs
// (MALLOC_MMAP_MAX_, MALLOC_MMAP_THRESHOLD_ or their GLIBC_TUNABLES names),
// which then decide for tensors too. MALLOC_MMAP_MAX_=0, a heap that reuses
// freed tensors' pages instead of mapping and zeroing new ones, is the
// main job's setting (deploy/demo.sh).
bool LargeBlocksGetOwnMapping();

// A zeroed mapping of `bytes` rounded up to whole 4 KiB pages, aligned to a
// huge page and advised to use transparent huge pages (where the kernel has
// them in "madvise" or "always" mode; its tail past the last whole 2 MiB
// stays in small pages). nullptr when the kernel refuses.
// Release it with UnmapLargeBlock(block, bytes), the same `bytes`.
void* MapLargeBlock(size_t bytes);
void UnmapLargeBlock(void* block, size_t bytes);

// Freed large blocks stay mapped for reuse: a new mapping costs the kernel
// zeroing every page, and a training loop frees and asks again for tensors
// of the same sizes every step (the math task's ReMax took 3x as long,
// most of it in the kernel clearing pages). They are kept only while the
// blocks mapped, in use and kept, stay within the most ever mapped in use
// at once: a new mapping first unmaps the oldest kept blocks. So the large
// blocks never map more than they once did at their peak, which is up to a
// quarter more than the tensors in them asked for (the reuse slack below)
// plus a page each; kept blocks are not tensors, so the device counter
// and the planner do not see them. A worker unmaps them between jobs; a
// mapping the kernel refuses unmaps them and tries once more.

// A block of at least `bytes` (its contents whatever they were): the
// smallest kept block that holds it, whole when it is at most a quarter
// larger, else its head, the rest staying kept; a new MapLargeBlock when
// none holds it. Sets *mapped to its size, which ReleaseLargeBlock takes
// back. nullptr when the kernel refuses.
void* TakeLargeBlock(size_t bytes, size_t* mapped);
// Keeps the block for reuse, joined with the kept blocks that border it:
// a step that splits a large block for smaller tensors finds it whole
// again when they are freed. (Without splitting, a 7B-width layer's 64 MiB
// tensors unmapped the 500 MiB logits' block, mapped anew and zeroed a
// step later: 6% of a 4k-token step in the kernel clearing pages.)
void ReleaseLargeBlock(void* block, size_t mapped);
// Unmaps every kept block (a worker between jobs holds nothing it does not use).
void UnmapKeptLargeBlocks();
// Bytes of the blocks kept now.
size_t KeptLargeBlockBytes();

}  // namespace strata

#endif  // STRATA_BASE_HEAP_H_
