#include "policies/job/seeds.h"

namespace strata::policies {

uint64_t IterationSeed(uint64_t job_seed, int64_t iteration) {
  // splitmix64 of the pair, so neighbouring iterations get unrelated seeds.
  uint64_t z = job_seed * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(iteration) + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The same mix as an iteration's: a seed of seeds.
uint64_t PromptSeed(uint64_t batch_seed, int64_t batch_index) { return IterationSeed(batch_seed, batch_index); }

uint64_t SampleSeed(uint64_t prompt_seed, int64_t sample) { return IterationSeed(prompt_seed, sample); }

uint64_t EvaluationSeed(uint64_t job_seed) { return IterationSeed(job_seed, -1); }

uint64_t UpdateShuffleSeed(uint64_t job_seed, int64_t iteration) {
  return IterationSeed(job_seed, iteration) ^ 0x9e3779b97f4a7c15ULL;
}

uint64_t ModelInitSeed(uint64_t job_seed) { return job_seed; }

uint64_t AdapterSeed(uint64_t job_seed) { return IterationSeed(job_seed, -2); }

uint64_t GaloreSeed(uint64_t job_seed) { return IterationSeed(job_seed, -3); }

uint64_t EpochShuffleSeed(uint64_t job_seed, uint64_t epoch) { return job_seed * 1315423911ULL + epoch; }

}  // namespace strata::policies
