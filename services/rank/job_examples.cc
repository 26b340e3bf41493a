#include "services/rank/job_examples.h"

#include <memory>
#include <optional>

#include "base/log.h"
#include "base/status_macros.h"
#include "policies/data/chat_renderer.h"
#include "policies/data/chat_template.h"

namespace strata::services {

absl::StatusOr<policies::JobData> ReadJobExamples(const policies::JobSpec& spec, const policies::Tokenizer& tokenizer,
                                                  const std::string& tokenizer_path,
                                                  const std::vector<int64_t>& stop_ids) {
  policies::ChatSetup chat;
  std::optional<policies::ChatRenderer> renderer;
  // A model without a template is fine until a record needs one.
  absl::StatusOr<policies::ChatTemplate> found =
      policies::LoadChatTemplate(tokenizer_path, {spec.data.chat_template_file, spec.data.chat_template_name});
  if (found.ok()) {
    STRATA_ASSIGN_OR_RETURN(auto context, policies::ChatContextOf(spec.data, tokenizer, stop_ids));
    renderer.emplace(*std::move(found), std::move(context));
    chat.renderer = &*renderer;
  } else if (!spec.data.chat_template_file.empty() || !spec.data.chat_template_name.empty() ||
             found.status().code() != absl::StatusCode::kNotFound) {
    return absl::Status(found.status().code(), absl::StrCat("data: ", found.status().message()));
  } else {
    chat.unavailable = found.status();
  }
  STRATA_ASSIGN_OR_RETURN(auto data, policies::ReadJobData(spec, tokenizer, chat));
  if (chat.renderer != nullptr) STRATA_LOG(Info) << "chat template: " << chat.renderer->chat_template().origin;
  return data;
}

}  // namespace strata::services
