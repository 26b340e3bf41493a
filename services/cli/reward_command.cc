#include "services/cli/reward_command.h"

#include <optional>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "policies/data/chat_renderer.h"
#include "policies/data/chat_template.h"
#include "policies/data/job_data.h"
#include "policies/dist/process_group.h"
#include "policies/job/job_spec.h"
#include "services/cli/model_commands.h"
#include "services/rank/rank_memory.h"
#include "services/rank/reward_sources.h"

namespace strata::services {

using Json = nlohmann::ordered_json;

absl::StatusOr<std::string> RunReward(const RewardRequest& request) {
  STRATA_ASSIGN_OR_RETURN(auto spec, policies::LoadJobSpec(request.spec_path, request.overrides));
  if (spec.reward_sources.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(request.spec_path, ": an RL spec with reward sources is needed"));
  }
  if (request.prompt.empty() == request.messages_file.empty()) {
    return absl::InvalidArgumentError("give the prompt as --prompt TEXT or --messages FILE (one of them)");
  }
  const std::string tokenizer_path = !spec.data.tokenizer.empty() ? spec.data.tokenizer : spec.actor.path;
  STRATA_ASSIGN_OR_RETURN(auto tokenizer, policies::Tokenizer::Load(tokenizer_path));
  // The prompt as the policy would see it.
  std::optional<Json> messages;
  if (!request.messages_file.empty()) {
    STRATA_ASSIGN_OR_RETURN(messages, ReadConversation(request.messages_file));
  } else if (spec.data.apply_chat_template) {
    messages = Json::array({Json{{"role", "user"}, {"content", request.prompt}}});
  }
  std::string prompt_text = request.prompt;
  std::vector<int32_t> prompt_ids;
  if (messages.has_value()) {
    STRATA_ASSIGN_OR_RETURN(auto found, policies::LoadChatTemplate(tokenizer_path, {spec.data.chat_template_file,
                                                                                    spec.data.chat_template_name}));
    STRATA_ASSIGN_OR_RETURN(auto context, policies::ChatContextOf(spec.data, *tokenizer, {}));
    const policies::ChatRenderer renderer(std::move(found), std::move(context));
    STRATA_ASSIGN_OR_RETURN(auto rendered, renderer.Render({{*messages, true, false}}));
    if (!rendered[0].error.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template ", renderer.chat_template().origin, ": ", rendered[0].error));
    }
    prompt_text = rendered[0].text;
    prompt_ids = tokenizer->Encode(prompt_text);
  } else {
    prompt_ids = tokenizer->EncodeForPrompt(prompt_text);
  }
  const std::vector<int32_t> response_ids = tokenizer->Encode(request.response);

  STRATA_ASSIGN_OR_RETURN(auto access, LoadRewardAccess(request.allow_reward_hosts, request.reward_secrets));
  auto solo = policies::ProcessGroup::Solo();
  STRATA_ASSIGN_OR_RETURN(auto memory, RankMemory::Create(spec, *solo));
  auto place = [&](const std::string& key, const policies::ModelSpec& model) {
    return memory->Place(key, model, policies::LlamaHead::kScalar, false, 0);
  };
  PassOptions passes;
  passes.gang = solo.get();
  passes.device = memory->device();
  STRATA_ASSIGN_OR_RETURN(auto sources,
                          RewardSources::Create(spec.reward_sources, spec, tokenizer_path, access, place, passes));
  const Json* conversation = messages.has_value() ? &*messages : nullptr;
  const ScoredResponse view = ViewOf(*tokenizer, {}, prompt_ids, response_ids, prompt_text, conversation,
                                     request.label);
  STRATA_ASSIGN_OR_RETURN(auto scored, sources->Score({view}));
  Json out = {{"sources", Json::object()}, {"reward", scored.total[0]}};
  std::string lines;
  for (const policies::RewardSourceSpec& source : spec.reward_sources) {
    const double score = scored.by_source[source.name][0];
    out["sources"][source.name] = score;
    lines += absl::StrFormat("%-24s %10.6f  (weight %g)\n", source.name, score, source.weight);
  }
  if (request.json) return out.dump() + "\n";
  return lines + absl::StrFormat("%-24s %10.6f\n", "reward", scored.total[0]);
}

}  // namespace strata::services
