#include "policies/job/seeds.h"

namespace strata::policies {

uint64_t IterationSeed(uint64_t job_seed, int64_t iteration) {
  // splitmix64 of the pair, so neighbouring iterations get unrelated seeds.
  uint64_t z = job_seed * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(iteration) + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace strata::policies
