// Seeds derived from a job's seed: pure functions of the job seed and where
// a draw happens, so a resumed, re-sharded or rescheduled run draws what an
// uninterrupted one would.
#ifndef STRATA_POLICIES_JOB_SEEDS_H_
#define STRATA_POLICIES_JOB_SEEDS_H_

#include <cstdint>

namespace strata::policies {

// The sampling seed of an iteration: a pure function of the job seed and the
// iteration, so a resumed run samples what an uninterrupted one would.
// Also derives a prompt's seed from its iteration's and its batch index.
uint64_t IterationSeed(uint64_t job_seed, int64_t iteration);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_JOB_SEEDS_H_
