// The job's examples as a rank holds them: read, rendered through the chat
// template and tokenized where the rank runs, all of them on every rank
// (each takes its shard per iteration).
#ifndef STRATA_SERVICES_RANK_JOB_EXAMPLES_H_
#define STRATA_SERVICES_RANK_JOB_EXAMPLES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/data/job_data.h"
#include "policies/job/job_spec.h"
#include "policies/tokenizer/tokenizer.h"

namespace strata::services {

// Reads data.train (and data.eval) as the job's algorithm needs them, with
// the chat template of the tokenizer at `tokenizer_path` (or
// data.chat_template_file) and the end-of-turn ids `stop_ids`. Errors name
// the file, line and key, or the template.
absl::StatusOr<policies::JobData> ReadJobExamples(const policies::JobSpec& spec, const policies::Tokenizer& tokenizer,
                                                  const std::string& tokenizer_path,
                                                  const std::vector<int64_t>& stop_ids);

}  // namespace strata::services

#endif  // STRATA_SERVICES_RANK_JOB_EXAMPLES_H_
