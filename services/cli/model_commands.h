// The model-level CLI commands (`strata generate`, `strata logprobs`,
// `strata tokenize`). main() parses flags into these structs; each Run*
// returns the text to print on stdout, or a Status for the user.
#ifndef STRATA_SERVICES_CLI_MODEL_COMMANDS_H_
#define STRATA_SERVICES_CLI_MODEL_COMMANDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace strata::services {

struct GenerateRequest {
  std::string model_dir;
  std::string adapter_dir;  // a PEFT LoRA adapter of the model, applied on the fly; "" = none
  // Exactly one of the three: text (tokenized, BOS added when the tokenizer
  // config asks for one), ids used as given, or a JSONL file of prompts,
  // one record per line: {"prompt": TEXT}, {"prompt_ids": [...]} or
  // {"messages": [...]} (rendered through the model's chat template with
  // the generation prompt), each with an optional "max_new_tokens".
  std::optional<std::string> prompt;
  std::optional<std::vector<int32_t>> prompt_ids;
  std::optional<std::string> prompts_file;
  int64_t samples = 1;                  // continuations per prompt, each from its own seed
  std::vector<int32_t> stop_token_ids;  // besides the model's own end-of-turn ids
  // The rollout engine's settings (generation.kv_block_tokens, ...).
  int64_t kv_block_tokens = 16;
  int64_t max_concurrency = 0;
  int64_t max_new_tokens = 64;
  bool greedy = false;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 0;
  std::string dtype = "fp32";
  bool ignore_eos = false;
  bool json = false;
};

struct LogProbsRequest {
  std::string model_dir;
  std::string adapter_dir;   // as GenerateRequest's
  std::vector<int32_t> ids;  // at least two
  std::string dtype = "fp32";
  bool json = false;
};

struct TokenizeRequest {
  std::string tokenizer_path;  // model dir, tokenizer.json or tokenizer.model
  // Exactly one of the three: text to encode, ids to decode, or a JSON file
  // holding a conversation (a list of {"role", "content", ...} messages, or
  // {"messages": [...]}) to render through the model's chat template.
  std::optional<std::string> text;
  std::optional<std::vector<int32_t>> decode_ids;
  std::optional<std::string> messages_file;
  // The rest only with messages_file, as a job's data.* keys of the same
  // meaning render it.
  bool add_generation_prompt = false;
  // NAME=VALUE each (data.template_args): VALUE as JSON when it parses
  // (true, 3, "x", {...}), else as a string. A repeated NAME: the last wins.
  std::vector<std::string> template_args;
  std::string chat_template_file;  // replaces the model's template (data.chat_template_file)
  std::string template_name;       // one of the model's named templates (data.chat_template_name)
  std::string template_date;       // ISO 8601, what strftime_now() formats; "" = now
  bool json = false;
};

struct InitModelRequest {
  std::string config_path;  // a HF config.json for a Llama model
  std::string out_dir;      // created if missing; must not already hold a model
  std::string head = "lm";  // "lm" (LlamaForCausalLM) or "scalar" (LlamaForSequenceClassification)
  std::string dtype = "fp32";
  uint64_t seed = 0;
  double init_std = 0.02;
};

absl::StatusOr<std::string> RunGenerate(const GenerateRequest& request);
absl::StatusOr<std::string> RunLogProbs(const LogProbsRequest& request);
// With messages_file: the rendered text and its ids (Tokenizer::Encode, no
// special tokens added beyond what the template wrote, as
// apply_chat_template(tokenize=True) gives them). INVALID_ARGUMENT naming
// the file for one that is not a conversation, or naming the template's
// origin with Jinja's message when the template raises; NOT_FOUND when the
// model has no chat template.
absl::StatusOr<std::string> RunTokenize(const TokenizeRequest& request);

// The conversation in a --messages file: a list of messages, or an object
// holding one under "messages", checked as a job's data is checked. Errors
// name the flag and the file.
absl::StatusOr<nlohmann::ordered_json> ReadConversation(const std::string& path);
// Writes a freshly initialised model directory (config.json + safetensors).
absl::StatusOr<std::string> RunInitModel(const InitModelRequest& request);

// Parses "1,2,3" (spaces allowed). INVALID_ARGUMENT naming `flag` otherwise.
absl::StatusOr<std::vector<int32_t>> ParseIdList(const std::string& text, const std::string& flag);

}  // namespace strata::services

#endif  // STRATA_SERVICES_CLI_MODEL_COMMANDS_H_
