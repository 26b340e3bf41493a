// A model's chat template as Hugging Face keeps it, and the variables
// `transformers`' apply_chat_template hands it besides the messages.
#ifndef STRATA_POLICIES_DATA_CHAT_TEMPLATE_H_
#define STRATA_POLICIES_DATA_CHAT_TEMPLATE_H_

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace strata::policies {

// Which template a job uses (data.chat_template_file, data.chat_template_name).
struct ChatTemplateChoice {
  std::string file;  // a Jinja file that replaces the model's template; "" = the model's
  std::string name;  // one of the model's named templates; "" = "default"
};

struct ChatTemplate {
  std::string text;    // the Jinja source
  std::string origin;  // where it came from, for errors: "DIR/tokenizer_config.json (chat_template)"
  // The tokenizer's special tokens by their transformers names (bos_token,
  // eos_token, unk_token, sep_token, pad_token, cls_token, mask_token,
  // additional_special_tokens): strings, `AddedToken` objects by content.
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
};

// The template of the tokenizer at `tokenizer_path` (a model directory, or a
// file in one): `choice.file` when set, else the directory's
// chat_template.jinja, else tokenizer_config.json's `chat_template` (a
// string, or a list of {"name", "template"} from which `choice.name` or
// "default" is taken). The special tokens come from tokenizer_config.json
// either way. NOT_FOUND naming the directory when it has no template (with
// the fix: data.chat_template_file) or no template of that name (listing the
// names); INVALID_ARGUMENT naming the file for malformed JSON.
absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& tokenizer_path, const ChatTemplateChoice& choice);

}  // namespace strata::policies

#endif  // STRATA_POLICIES_DATA_CHAT_TEMPLATE_H_
