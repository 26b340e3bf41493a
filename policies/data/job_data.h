// A job's examples as its algorithm reads them: the records of data.train
// (and data.eval) mapped by key, conversations rendered through the chat
// template (the whole dataset in one render, once per job), tokenized, and
// cut to the spec's lengths.
#ifndef STRATA_POLICIES_DATA_JOB_DATA_H_
#define STRATA_POLICIES_DATA_JOB_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "policies/data/chat_renderer.h"
#include "policies/data/examples.h"
#include "policies/job/job_spec.h"
#include "policies/tokenizer/tokenizer.h"

namespace strata::policies {

// Prompts for RL: the ids the policy continues, the text they came from (the
// rendered conversation, or the raw string) and the record's label.
struct PromptSet {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> text;
  std::vector<std::string> labels;  // data.label_key's values; "" without one
  // The conversation each prompt was rendered from (a reward model with its
  // own template renders it again); null for a raw-text prompt.
  std::vector<nlohmann::ordered_json> messages;
};

struct JobData {
  std::vector<TextPair> sft;                      // SFT
  std::vector<PreferencePair> pairs, eval_pairs;  // reward model
  PromptSet prompts, eval_prompts;                // RL (eval: its first eval.prompts)
  size_t examples = 0;                            // the training examples, whichever kind
  // Prompts over data.max_prompt_tokens, truncated or dropped (train and eval).
  int64_t overlong_prompts = 0;
  // The first training prompt as the policy sees it, for the job's log.
  std::string sample_prompt;
};

// The chat template a job renders with, or why it has none (a template is
// needed only when a value is a conversation or data.apply_chat_template).
struct ChatSetup {
  const ChatRenderer* renderer = nullptr;
  absl::Status unavailable = absl::OkStatus();
};

// Reads the job's data. Errors name the file, the line and the key (a value
// of the wrong type, a malformed conversation, a template that raised on
// it, a conversation without an assistant turn to train on).
absl::StatusOr<JobData> ReadJobData(const JobSpec& spec, const Tokenizer& tokenizer, const ChatSetup& chat);

// The template context a job's spec gives: data.template_args and
// data.template_date, and the end-of-turn strings of `stop_ids`.
absl::StatusOr<ChatTemplateContext> ChatContextOf(const DataSpec& data, const Tokenizer& tokenizer,
                                                  const std::vector<int64_t>& stop_ids);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_DATA_JOB_DATA_H_
