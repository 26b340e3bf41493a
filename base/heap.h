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
#ifndef STRATA_BASE_HEAP_H_
#define STRATA_BASE_HEAP_H_

#include <cstddef>

namespace strata {

// Allocations of at least this many bytes get their own mapping.
inline constexpr size_t kOwnMappingBytes = size_t{4} << 20;

// Fixes the mmap threshold at kOwnMappingBytes (which also stops it moving).
// Call once, first thing in main(). Returns false if glibc refused.
bool ReturnLargeBlocksToKernel();

}  // namespace strata

#endif  // STRATA_BASE_HEAP_H_
