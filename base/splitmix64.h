// SplitMix64 (Steele, Lea and Flood 2014): a counter-based mix, so that a
// draw keyed by (key, index) depends on them alone. Used wherever strata
// derives per-row or per-tensor random streams from a key.
#ifndef STRATA_BASE_SPLITMIX64_H_
#define STRATA_BASE_SPLITMIX64_H_

#include <cstdint>

namespace strata {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace strata

#endif  // STRATA_BASE_SPLITMIX64_H_
