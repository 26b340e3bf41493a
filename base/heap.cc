#include "base/heap.h"

#include <malloc.h>

namespace strata {

bool ReturnLargeBlocksToKernel() { return mallopt(M_MMAP_THRESHOLD, static_cast<int>(kOwnMappingBytes)) == 1; }

}  // namespace strata
