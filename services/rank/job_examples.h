// The job's examples as a rank holds them: read and tokenized where the rank
// runs, all of them on every rank (each takes its shard per iteration).
#ifndef STRATA_SERVICES_RANK_JOB_EXAMPLES_H_
#define STRATA_SERVICES_RANK_JOB_EXAMPLES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/job/job_spec.h"
#include "policies/rl/worker_group.h"
#include "policies/tokenizer/tokenizer.h"

namespace strata::services {

struct JobExamples {
  std::vector<policies::TextPair> sft;                      // SFT
  std::vector<policies::PreferencePair> pairs, eval_pairs;  // reward model
  std::vector<std::vector<int32_t>> prompts, eval_prompts;  // RL
  std::vector<std::string> eval_prompt_text;                // RL: what the eval rule reads
  size_t examples = 0;                                      // the training examples, whichever kind
};

// Reads data.train (and data.eval: RL takes its first eval.prompts) as the
// job's algorithm needs them. Errors name the file, line and field.
absl::StatusOr<JobExamples> ReadJobExamples(const policies::JobSpec& spec, const policies::Tokenizer& tokenizer);

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_JOB_EXAMPLES_H_
