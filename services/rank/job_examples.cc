#include "services/rank/job_examples.h"

#include "base/status_macros.h"
#include "policies/data/dataset.h"
#include "policies/data/prompt_encoder.h"

namespace strata::services {

using policies::Algorithm;

absl::StatusOr<JobExamples> ReadJobExamples(const policies::JobSpec& spec, const policies::Tokenizer& tokenizer) {
  JobExamples data;
  const policies::PromptEncoder encode(tokenizer, spec.data);
  auto read_pairs = [&](const std::string& path, std::vector<policies::PreferencePair>* out) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(auto rows, policies::ReadJsonl(path, {"prompt", "chosen", "rejected"}));
    for (const auto& r : rows) {
      out->push_back({encode.Prompt(r["prompt"]), encode.Response(r["chosen"]), encode.Response(r["rejected"])});
    }
    return absl::OkStatus();
  };
  if (spec.algorithm == Algorithm::kSft) {
    STRATA_ASSIGN_OR_RETURN(auto rows, policies::ReadJsonl(spec.data.train, {"prompt", "response"}));
    for (const auto& r : rows) data.sft.push_back({encode.Prompt(r["prompt"]), encode.Response(r["response"])});
    data.examples = data.sft.size();
  } else if (spec.algorithm == Algorithm::kRewardModel) {
    STRATA_RETURN_IF_ERROR(read_pairs(spec.data.train, &data.pairs));
    if (!spec.data.eval.empty()) {
      STRATA_RETURN_IF_ERROR(read_pairs(spec.data.eval, &data.eval_pairs));
    }
    data.examples = data.pairs.size();
  } else {
    STRATA_ASSIGN_OR_RETURN(auto rows, policies::ReadJsonl(spec.data.train, {"prompt"}));
    for (const auto& r : rows) data.prompts.push_back(encode.Prompt(r["prompt"]));
    if (!spec.data.eval.empty()) {
      STRATA_ASSIGN_OR_RETURN(auto eval_rows, policies::ReadJsonl(spec.data.eval, {"prompt"}));
      for (size_t i = 0; i < eval_rows.size() && static_cast<int64_t>(i) < spec.eval.prompts; ++i) {
        data.eval_prompt_text.push_back(eval_rows[i]["prompt"]);
        data.eval_prompts.push_back(encode.Prompt(data.eval_prompt_text.back()));
      }
    }
    data.examples = data.prompts.size();
  }
  return data;
}

}  // namespace strata::services
