#include "services/cli/model_commands.h"

#include <c10/core/GradMode.h>

#include <charconv>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "policies/data/chat_renderer.h"
#include "policies/data/chat_template.h"
#include "policies/data/dataset.h"
#include "policies/job/seeds.h"
#include "policies/model/llama.h"
#include "policies/model/lora.h"
#include "policies/model/peft_adapter.h"
#include "policies/rollout/rollout_engine.h"
#include "policies/tokenizer/tokenizer.h"

namespace strata::services {
namespace {

using nlohmann::json;

// Invalid UTF-8 is replaced rather than thrown on: a model can emit any bytes.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

// A model directory may ship its tokenizer; absent is fine for id-only use.
absl::StatusOr<std::unique_ptr<policies::Tokenizer>> MaybeLoadTokenizer(const std::string& dir) {
  if (!IsRegularFile(JoinPath(dir, "tokenizer.json")) && !IsRegularFile(JoinPath(dir, "tokenizer.model"))) {
    return std::unique_ptr<policies::Tokenizer>();
  }
  return policies::Tokenizer::Load(dir);
}

// A language model and, when given, the LoRA adapter it computes with (the
// model refers to the adapters: they live as long as it does).
struct AdaptedModel {
  std::unique_ptr<policies::LoraAdapters> adapters;
  std::unique_ptr<policies::LlamaModel> model;
};

absl::StatusOr<AdaptedModel> LoadLanguageModel(const std::string& dir, const std::string& adapter_dir,
                                               const std::string& dtype_name) {
  auto dtype = policies::ParseModelDType(dtype_name);
  if (!dtype.ok()) return absl::InvalidArgumentError(absl::StrCat("--dtype: ", dtype.status().message()));
  if (!IsDirectory(dir)) return absl::NotFoundError(absl::StrCat("--model: ", dir, " is not a directory"));
  AdaptedModel out;
  STRATA_ASSIGN_OR_RETURN(out.model, policies::LlamaModel::Load(dir, policies::LlamaHead::kLanguageModel, *dtype));
  if (adapter_dir.empty()) return out;
  if (!policies::IsPeftAdapterDir(adapter_dir)) {
    return absl::NotFoundError(absl::StrCat("--adapter: ", adapter_dir, " has no ", policies::kPeftConfigFile));
  }
  auto adapter = policies::LoadPeftAdapter(adapter_dir, out.model->config(), policies::LlamaHead::kLanguageModel,
                                           *dtype, out.model->device());
  if (!adapter.ok()) {
    return absl::Status(adapter.status().code(), absl::StrCat("--adapter: ", adapter.status().message()));
  }
  out.adapters = std::move(adapter->adapters);
  out.model->UseAdapters(out.adapters.get());
  return out;
}

// --template-arg NAME=VALUE, repeated: VALUE as JSON when it parses, else
// the string itself (so enable_thinking=false is a boolean, name=Ada text).
absl::StatusOr<json> TemplateArgs(const std::vector<std::string>& items) {
  json args = json::object();
  for (const std::string& item : items) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--template-arg: '", item, "' is not NAME=VALUE"));
    }
    const std::string value = item.substr(eq + 1);
    json parsed = json::parse(value, /*cb=*/nullptr, /*allow_exceptions=*/false);
    args[item.substr(0, eq)] = parsed.is_discarded() ? json(value) : std::move(parsed);
  }
  return args;
}

// The conversation rendered once through the model's chat template, as a
// job's data would be (policies/data/job_data.h).
absl::StatusOr<std::string> RenderConversation(const TokenizeRequest& request) {
  STRATA_ASSIGN_OR_RETURN(nlohmann::ordered_json messages, ReadConversation(*request.messages_file));
  policies::ChatTemplateContext context;
  STRATA_ASSIGN_OR_RETURN(context.template_args, TemplateArgs(request.template_args));
  // The spec's data.template_date rule: what Python's fromisoformat reads.
  static const std::regex kIso(R"(\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:\d{2})?)?)");
  if (!request.template_date.empty() && !std::regex_match(request.template_date, kIso)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--template-date: must be an ISO 8601 date and time (2026-11-27T15:40:00+00:00), got '",
                     request.template_date, "'"));
  }
  context.date = request.template_date;
  auto found = policies::LoadChatTemplate(request.tokenizer_path, {request.chat_template_file, request.template_name});
  if (!found.ok()) {
    // The fix it names is the spec's key; say the flag that does the same here.
    const std::string why(found.status().message());
    const char* flag = absl::StrContains(why, "data.chat_template_file")   ? " (here: --chat-template FILE)"
                       : absl::StrContains(why, "data.chat_template_name") ? " (here: --template-name)"
                                                                           : "";
    return absl::Status(found.status().code(), absl::StrCat(why, flag));
  }
  const std::string origin = found->origin;
  const policies::ChatRenderer renderer(*std::move(found), std::move(context));
  STRATA_ASSIGN_OR_RETURN(auto rendered, renderer.Render({{std::move(messages), request.add_generation_prompt}}));
  if (!rendered[0].error.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("chat template ", origin, ": ", rendered[0].error));
  }
  return std::move(rendered[0].text);
}

}  // namespace

// The conversation in a --messages file: a list of messages, or an object
// holding one under "messages", checked as a job's data is checked.
absl::StatusOr<nlohmann::ordered_json> ReadConversation(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return absl::Status(text.status().code(), absl::StrCat("--messages: ", text.status().message()));
  // Ordered: a message's keys reach the template in the file's order.
  nlohmann::ordered_json file;
  try {
    file = nlohmann::ordered_json::parse(*text);
  } catch (const nlohmann::ordered_json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("--messages: ", path, ": not JSON (error at byte ", e.byte, ")"));
  }
  nlohmann::ordered_json messages = file.is_object() && file.contains("messages") ? file["messages"] : file;
  if (!messages.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--messages: ", path,
        ": not a conversation (expected a list of {\"role\", \"content\"} messages, or {\"messages\": [...]})"));
  }
  const policies::Record record{nlohmann::ordered_json{{"messages", messages}}, path};
  if (auto checked = policies::ReadText(record, "messages"); !checked.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--messages: ", checked.status().message()));
  }
  return messages;
}

absl::StatusOr<std::vector<int32_t>> ParseIdList(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    int32_t value = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", item, "' is not a token id (expected comma-separated integers >= 0)"));
    }
    ids.push_back(value);
    pos = comma + 1;
  }
  return ids;
}

namespace {

// The prompts of a --prompts-file, encoded: errors name the file and line.
struct FilePrompt {
  std::vector<int32_t> ids;
  int64_t max_new_tokens = -1;  // the record's own, or -1
  std::string where;            // what errors name: "FILE:LINE", or the flag
};

absl::StatusOr<std::vector<FilePrompt>> ReadPromptsFile(const std::string& path, const std::string& model_dir,
                                                        const policies::Tokenizer* tokenizer, int64_t vocab) {
  auto records = policies::ReadJsonl(path);
  if (!records.ok()) {
    return absl::Status(records.status().code(), absl::StrCat("--prompts-file: ", records.status().message()));
  }
  std::optional<policies::ChatRenderer> renderer;
  std::vector<FilePrompt> out;
  for (const policies::Record& record : *records) {
    const auto& f = record.fields;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("--prompts-file: ", record.where, ": ", why));
    };
    const int given = f.contains("prompt") + f.contains("prompt_ids") + f.contains("messages");
    if (given != 1) return bad("give exactly one of \"prompt\", \"prompt_ids\" and \"messages\"");
    FilePrompt prompt;
    prompt.where = absl::StrCat("--prompts-file: ", record.where);
    if (f.contains("prompt_ids")) {
      const auto& ids = f["prompt_ids"];
      if (!ids.is_array() || ids.empty()) return bad("\"prompt_ids\" must be a non-empty list of token ids");
      for (const auto& id : ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab) {
          return bad(absl::StrCat("\"prompt_ids\" holds ", id.dump(), ", not a token id in [0, ", vocab, ")"));
        }
        prompt.ids.push_back(id.get<int32_t>());
      }
    } else {
      if (tokenizer == nullptr) return bad(absl::StrCat("text needs a tokenizer, and ", model_dir, " has none"));
      const std::string key = f.contains("prompt") ? "prompt" : "messages";
      STRATA_ASSIGN_OR_RETURN(auto text, policies::RequireText(record, key));
      if (text.is_conversation()) {
        if (!renderer) {
          auto found = policies::LoadChatTemplate(model_dir, {});
          if (!found.ok()) return bad(std::string(found.status().message()));
          renderer.emplace(*std::move(found), policies::ChatTemplateContext());
        }
        STRATA_ASSIGN_OR_RETURN(auto rendered, renderer->Render({{text.messages, /*add_generation_prompt=*/true}}));
        if (!rendered[0].error.empty()) return bad(absl::StrCat("chat template: ", rendered[0].error));
        prompt.ids = tokenizer->Encode(rendered[0].text);  // the template wrote the special tokens
      } else {
        prompt.ids = tokenizer->EncodeForPrompt(text.text);
      }
      if (prompt.ids.empty()) return bad("the prompt encodes to no tokens");
    }
    if (f.contains("max_new_tokens")) {
      const auto& cap = f["max_new_tokens"];
      if (!cap.is_number_integer() || cap.get<int64_t>() < 1) return bad("\"max_new_tokens\" must be an integer >= 1");
      prompt.max_new_tokens = cap.get<int64_t>();
    }
    out.push_back(std::move(prompt));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> RunGenerate(const GenerateRequest& request) {
  if (request.prompt.has_value() + request.prompt_ids.has_value() + request.prompts_file.has_value() != 1) {
    return absl::InvalidArgumentError("give exactly one of --prompt, --prompt-ids and --prompts-file");
  }
  if (request.samples < 1) return absl::InvalidArgumentError("--samples must be >= 1");
  STRATA_ASSIGN_OR_RETURN(AdaptedModel adapted,
                          LoadLanguageModel(request.model_dir, request.adapter_dir, request.dtype));
  const std::unique_ptr<policies::LlamaModel>& model = adapted.model;
  const policies::LlamaConfig& config = model->config();
  // A trained adapter's directory carries the tokenizer it was trained with.
  const bool adapter_tokenizer = !request.adapter_dir.empty() &&
                                 (IsRegularFile(JoinPath(request.adapter_dir, "tokenizer.json")) ||
                                  IsRegularFile(JoinPath(request.adapter_dir, "tokenizer.model")));
  const std::string tokenizer_dir = adapter_tokenizer ? request.adapter_dir : request.model_dir;
  STRATA_ASSIGN_OR_RETURN(auto tokenizer, MaybeLoadTokenizer(tokenizer_dir));

  std::vector<FilePrompt> prompts;
  if (request.prompts_file.has_value()) {
    STRATA_ASSIGN_OR_RETURN(prompts,
                            ReadPromptsFile(*request.prompts_file, tokenizer_dir, tokenizer.get(), config.vocab_size));
  } else if (request.prompt.has_value()) {
    if (tokenizer == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat("--prompt needs a tokenizer, but ", request.model_dir,
                                                        " has no tokenizer.json or tokenizer.model"));
    }
    prompts.push_back({tokenizer->EncodeForPrompt(*request.prompt), -1, "--prompt"});
    if (prompts[0].ids.empty()) return absl::InvalidArgumentError("--prompt: encodes to no tokens");
  } else {
    prompts.push_back({*request.prompt_ids, -1, "--prompt-ids"});
  }

  policies::SamplingOptions options;
  options.greedy = request.greedy;
  options.temperature = request.temperature;
  options.top_p = request.top_p;
  options.top_k = request.top_k;
  options.max_new_tokens = request.max_new_tokens;
  options.stop_at_eos = !request.ignore_eos;
  // Each prompt gets what fits of its context window.
  std::vector<policies::RolloutPrompt> rollout;
  int64_t longest_cap = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t room = config.max_position_embeddings - static_cast<int64_t>(prompts[i].ids.size());
    if (room <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(prompts[i].where, ": the prompt has ", prompts[i].ids.size(),
                                                     " tokens; the model's context (max_position_embeddings) is ",
                                                     config.max_position_embeddings));
    }
    int64_t cap = prompts[i].max_new_tokens > 0 ? prompts[i].max_new_tokens : request.max_new_tokens;
    if (cap > room) {
      STRATA_LOG(Warning) << prompts[i].where << ": " << cap << " new tokens exceed the context window; using " << room;
      cap = room;
    }
    longest_cap = std::max(longest_cap, cap);
    policies::RolloutPrompt p{prompts[i].ids, {}, false, {}};
    const uint64_t prompt_seed = policies::PromptSeed(request.seed, static_cast<int64_t>(i));
    for (int64_t g = 0; g < request.samples; ++g) {
      p.sample_seeds.push_back(policies::SampleSeed(prompt_seed, g));
      p.max_new_tokens.push_back(std::max<int64_t>(cap, 1));
    }
    rollout.push_back(std::move(p));
  }
  options.max_new_tokens = std::min(options.max_new_tokens, longest_cap);
  std::vector<int64_t> stops = config.eos_token_ids;
  stops.insert(stops.end(), request.stop_token_ids.begin(), request.stop_token_ids.end());
  policies::RolloutEngineOptions engine_options;
  engine_options.kv_block_tokens = request.kv_block_tokens;
  engine_options.max_concurrency = request.max_concurrency;
  policies::RolloutEngine engine(*model, engine_options, stops);
  std::vector<std::vector<policies::Continuation>> out;
  if (options.max_new_tokens > 0) {
    STRATA_ASSIGN_OR_RETURN(out, engine.Run(rollout, options));
  } else {
    out.assign(rollout.size(), std::vector<policies::Continuation>(static_cast<size_t>(request.samples)));
  }

  std::string printed;
  for (size_t i = 0; i < out.size(); ++i) {
    for (size_t g = 0; g < out[i].size(); ++g) {
      const policies::Continuation& c = out[i][g];
      const std::string text = tokenizer ? tokenizer->Decode(c.tokens) : std::string();
      if (request.json || request.prompts_file.has_value()) {
        absl::StrAppend(&printed, Dump(json{{"index", i},
                                            {"sample", g},
                                            {"prompt_ids", rollout[i].ids},
                                            {"output_ids", c.tokens},
                                            {"logprobs", c.logprobs},
                                            {"finish_reason", c.stopped ? "stop" : "length"},
                                            {"text", text}}));
      } else {
        absl::StrAppend(&printed, tokenizer ? text : absl::StrJoin(c.tokens, ","), "\n");
      }
    }
  }
  return printed;
}

absl::StatusOr<std::string> RunLogProbs(const LogProbsRequest& request) {
  if (request.ids.size() < 2) return absl::InvalidArgumentError("--ids: need at least two token ids");
  STRATA_ASSIGN_OR_RETURN(AdaptedModel adapted,
                          LoadLanguageModel(request.model_dir, request.adapter_dir, request.dtype));
  const std::unique_ptr<policies::LlamaModel>& model = adapted.model;
  const auto& config = model->config();
  for (int32_t id : request.ids) {
    if (id >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ids: token id ", id, " is outside the vocabulary [0, ", config.vocab_size, ")"));
    }
  }
  if (static_cast<int64_t>(request.ids.size()) > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ids: ", request.ids.size(), " tokens exceed max_position_embeddings ", config.max_position_embeddings));
  }
  c10::NoGradGuard no_grad;
  const at::Tensor ids =
      at::tensor(std::vector<int64_t>(request.ids.begin(), request.ids.end()), at::kLong).unsqueeze(0);
  const at::Tensor logp = policies::SequenceLogProbs(*model, ids, at::ones_like(ids))[0].contiguous();
  std::vector<float> values(logp.data_ptr<float>(), logp.data_ptr<float>() + logp.numel());
  if (request.json) return Dump(json{{"logprobs", values}});
  return absl::StrJoin(values, " ") + "\n";
}

absl::StatusOr<std::string> RunTokenize(const TokenizeRequest& request) {
  if (request.text.has_value() + request.decode_ids.has_value() + request.messages_file.has_value() != 1) {
    return absl::InvalidArgumentError("give exactly one of --text, --decode and --messages");
  }
  if (!request.messages_file.has_value() &&
      (request.add_generation_prompt || !request.template_args.empty() || !request.chat_template_file.empty() ||
       !request.template_name.empty() || !request.template_date.empty())) {
    return absl::InvalidArgumentError(
        "--add-generation-prompt, --template-arg, --chat-template, --template-name and --template-date need "
        "--messages");
  }
  STRATA_ASSIGN_OR_RETURN(auto tokenizer, policies::Tokenizer::Load(request.tokenizer_path));
  if (request.messages_file.has_value()) {
    STRATA_ASSIGN_OR_RETURN(const std::string text, RenderConversation(request));
    // The template wrote every special token; Encode adds none.
    const std::vector<int32_t> ids = tokenizer->Encode(text);
    if (request.json) return Dump(json{{"text", text}, {"ids", ids}});
    const bool ends_line = !text.empty() && text.back() == '\n';
    return absl::StrCat(text, ends_line ? "" : "\n", absl::StrJoin(ids, ","), "\n");
  }
  if (request.text.has_value()) {
    const std::vector<int32_t> ids = tokenizer->Encode(*request.text);
    if (request.json) return Dump(json{{"ids", ids}});
    return absl::StrJoin(ids, ",") + "\n";
  }
  for (int32_t id : *request.decode_ids) {
    if (id >= tokenizer->vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--decode: token id ", id, " is outside the vocabulary [0, ", tokenizer->vocab_size(), ")"));
    }
  }
  const std::string text = tokenizer->Decode(*request.decode_ids);
  if (request.json) return Dump(json{{"text", text}});
  return text + "\n";
}

absl::StatusOr<std::string> RunInitModel(const InitModelRequest& request) {
  STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(request.config_path));
  STRATA_ASSIGN_OR_RETURN(auto config, policies::LlamaConfig::FromJson(text, request.config_path));
  auto dtype = policies::ParseModelDType(request.dtype);
  if (!dtype.ok()) return absl::InvalidArgumentError(absl::StrCat("--dtype: ", dtype.status().message()));
  if (request.head != "lm" && request.head != "scalar") {
    return absl::InvalidArgumentError(absl::StrCat("--head: '", request.head, "' is not lm or scalar"));
  }
  if (IsRegularFile(JoinPath(request.out_dir, "config.json"))) {
    return absl::AlreadyExistsError(absl::StrCat("--out: ", request.out_dir, " already holds a model"));
  }
  std::error_code ec;
  std::filesystem::create_directories(request.out_dir, ec);
  if (ec)
    return absl::PermissionDeniedError(absl::StrCat("--out: cannot create ", request.out_dir, ": ", ec.message()));
  const auto head = request.head == "lm" ? policies::LlamaHead::kLanguageModel : policies::LlamaHead::kScalar;
  auto model = policies::LlamaModel::RandomInit(config, head, *dtype, request.seed, request.init_std);
  STRATA_RETURN_IF_ERROR(model->Save(request.out_dir));
  return absl::StrCat("wrote ", request.out_dir, " (", config.NumParameters(), " parameters)\n");
}

}  // namespace strata::services
