// Seeds derived from a job's seed: pure functions of the job seed and where
// a draw happens, so a resumed, re-sharded or rescheduled run draws what an
// uninterrupted one would. Every seed a job draws with comes from here.
#ifndef STRATA_POLICIES_JOB_SEEDS_H_
#define STRATA_POLICIES_JOB_SEEDS_H_

#include <cstdint>

namespace strata::policies {

// The sampling seed of an iteration: a pure function of the job seed and the
// iteration, so a resumed run samples what an uninterrupted one would.
uint64_t IterationSeed(uint64_t job_seed, int64_t iteration);

// The seed of the prompt at `batch_index` of a batch sampled with
// `batch_seed` (an iteration's or the evaluation's): each prompt draws from
// its own stream, whichever rank holds it.
uint64_t PromptSeed(uint64_t batch_seed, int64_t batch_index);

// The seed of sample `sample` of a prompt (samples_per_prompt of them), from
// the prompt's seed: how many rows a decode batches together changes nothing.
uint64_t SampleSeed(uint64_t prompt_seed, int64_t sample);

// The seed of every evaluation: one fixed draw, so evaluations of different
// iterations compare (an iteration never is -1).
uint64_t EvaluationSeed(uint64_t job_seed);

// The seed that orders PPO's minibatches in `iteration`'s update: apart
// from the iteration's sampling seed, so the order and the samples are
// not the same draw.
uint64_t UpdateShuffleSeed(uint64_t job_seed, int64_t iteration);

// The seed of a model's random initialization (a model without weights, a
// fresh scalar head): the job seed itself, as every job so far drew it.
uint64_t ModelInitSeed(uint64_t job_seed);

// The seed of a model's LoRA adapters: their initial A matrices and (keyed
// further by step, micro-batch, layer and module) their dropout masks.
uint64_t AdapterSeed(uint64_t job_seed);

// The seed of a model's GaLore projections (keyed further by tensor and
// the step that computes each).
uint64_t GaloreSeed(uint64_t job_seed);

// The seed that shuffles the examples of `epoch`: batch contents depend only
// on (job seed, iteration). A linear mix, kept as first written: changing it
// would change every job's batches.
uint64_t EpochShuffleSeed(uint64_t job_seed, uint64_t epoch);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_JOB_SEEDS_H_
