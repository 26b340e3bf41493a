#include "policies/data/job_data.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "policies/data/chat_tokens.h"
#include "policies/data/dataset.h"
#include "policies/data/prompt_encoder.h"

namespace strata::policies {
namespace {

using Json = nlohmann::ordered_json;

// A string value as the conversation it stands for: one `role` message.
Json AsConversation(const TextValue& value, const char* role) {
  if (value.is_conversation()) return value.messages;
  return Json::array({Json{{"role", role}, {"content", value.text}}});
}

Json Concat(Json a, const Json& b) {
  for (const Json& m : b) a.push_back(m);
  return a;
}

template <typename T>
std::vector<T> Head(const std::vector<T>& v, size_t n) {
  return std::vector<T>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(std::min(n, v.size())));
}

template <typename T>
std::vector<T> Tail(const std::vector<T>& v, size_t from) {
  return std::vector<T>(v.begin() + static_cast<std::ptrdiff_t>(std::min(from, v.size())), v.end());
}

// The conversations of a dataset, rendered together in one call; each
// record's part of the result is found again by index.
class RenderBatch {
 public:
  RenderBatch(const ChatSetup& chat, const DataSpec& data) : chat_(chat), data_(data) {}

  size_t Add(Json messages, bool add_generation_prompt, bool assistant_spans, const Record& record,
             const std::string& key) {
    items_.push_back({std::move(messages), add_generation_prompt, assistant_spans});
    where_.push_back(record.where);
    keys_.push_back(key);
    return items_.size() - 1;
  }

  absl::Status Run() {
    if (items_.empty()) return absl::OkStatus();
    if (chat_.renderer == nullptr) {
      const absl::Status why = chat_.unavailable.ok() ? absl::FailedPreconditionError("no chat template was loaded")
                                                      : chat_.unavailable;
      return absl::Status(why.code(),
                          absl::StrCat(where_[0], ": key '", keys_[0], "' ",
                                       data_.apply_chat_template
                                           ? "is rendered through the chat template (data.apply_chat_template)"
                                           : "is a conversation",
                                       ", which needs a chat template: ", why.message()));
    }
    STRATA_ASSIGN_OR_RETURN(rendered_, chat_.renderer->Render(items_));
    for (size_t i = 0; i < rendered_.size(); ++i) {
      if (!rendered_[i].error.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(where_[i], ": key '", keys_[i], "': chat template ",
                                                       chat_.renderer->chat_template().origin, ": ",
                                                       rendered_[i].error));
      }
    }
    return absl::OkStatus();
  }

  const Rendered& operator[](size_t i) const { return rendered_[i]; }
  const std::string& where(size_t i) const { return where_[i]; }

 private:
  const ChatSetup& chat_;
  const DataSpec& data_;
  std::vector<RenderItem> items_;
  std::vector<std::string> where_, keys_;
  std::vector<Rendered> rendered_;
};

class DataReader {
 public:
  DataReader(const JobSpec& spec, const Tokenizer& tokenizer, const ChatSetup& chat, JobData* out)
      : data_(spec.data), tokenizer_(tokenizer), encode_(tokenizer, spec.data), chat_(chat), out_(out) {}

  absl::Status Sft() {
    STRATA_ASSIGN_OR_RETURN(auto records, ReadJsonl(data_.train));
    RenderBatch batch(chat_, data_);
    std::vector<std::optional<size_t>> item(records.size());
    std::vector<std::optional<TextPair>> raw(records.size());
    for (size_t i = 0; i < records.size(); ++i) {
      const Record& r = records[i];
      STRATA_ASSIGN_OR_RETURN(auto prompt, RequireText(r, data_.prompt_key));
      STRATA_ASSIGN_OR_RETURN(auto response, ReadText(r, data_.response_key));
      const bool templated = Templated(prompt) || (response.has_value() && Templated(*response));
      if (!templated) {
        if (!response.has_value()) {
          return absl::InvalidArgumentError(absl::StrCat(r.where, ": key '", data_.response_key, "' is missing"));
        }
        std::optional<std::vector<int32_t>> ids = Fit(tokenizer_.EncodeForPrompt(prompt.text));
        if (!ids.has_value()) continue;
        raw[i] = TextPair{*std::move(ids), encode_.Response(response->text), {}};
        continue;
      }
      // A conversation's assistant turns are the targets; a response, when
      // the record has one, is one more assistant turn after the prompt.
      Json messages = AsConversation(prompt, "user");
      if (response.has_value()) messages = Concat(std::move(messages), AsConversation(*response, "assistant"));
      item[i] = batch.Add(std::move(messages), false, true, r, data_.prompt_key);
    }
    STRATA_RETURN_IF_ERROR(batch.Run());
    for (size_t i = 0; i < records.size(); ++i) {
      if (!item[i].has_value()) {
        if (raw[i].has_value()) out_->sft.push_back(*std::move(raw[i]));
        continue;
      }
      const Rendered& rendered = batch[*item[i]];
      const MarkedTokens marked = EncodeMarked(tokenizer_, rendered.text, rendered.assistant_spans);
      const auto first = std::find(marked.assistant.begin(), marked.assistant.end(), 1);
      if (first == marked.assistant.end()) {
        return absl::InvalidArgumentError(absl::StrCat(records[i].where, ": key '", data_.prompt_key,
                                                       "': the conversation has no assistant turn to train on"));
      }
      const size_t split = static_cast<size_t>(first - marked.assistant.begin());
      std::optional<std::vector<int32_t>> prompt = Fit(Head(marked.ids, split));
      if (!prompt.has_value()) continue;
      const size_t keep = encode_.max_response_tokens();
      out_->sft.push_back(
          {*std::move(prompt), Head(Tail(marked.ids, split), keep), Head(Tail(marked.assistant, split), keep)});
    }
    NoteSample(out_->sft.empty() ? std::vector<int32_t>{} : out_->sft[0].prompt);
    out_->examples = out_->sft.size();
    return NonEmpty(out_->examples, data_.train);
  }

  absl::Status Pairs(const std::string& path, std::vector<PreferencePair>* pairs) {
    STRATA_ASSIGN_OR_RETURN(auto records, ReadJsonl(path));
    RenderBatch batch(chat_, data_);
    std::vector<std::optional<std::pair<size_t, size_t>>> items(records.size());
    std::vector<std::optional<PreferencePair>> raw(records.size());
    for (size_t i = 0; i < records.size(); ++i) {
      const Record& r = records[i];
      STRATA_ASSIGN_OR_RETURN(auto chosen, RequireText(r, data_.chosen_key));
      STRATA_ASSIGN_OR_RETURN(auto rejected, RequireText(r, data_.rejected_key));
      STRATA_ASSIGN_OR_RETURN(auto prompt, ReadText(r, data_.prompt_key));
      const bool templated = Templated(chosen) || Templated(rejected) || (prompt.has_value() && Templated(*prompt));
      if (!templated) {
        if (!prompt.has_value()) {
          return absl::InvalidArgumentError(absl::StrCat(r.where, ": key '", data_.prompt_key, "' is missing"));
        }
        std::optional<std::vector<int32_t>> ids = Fit(tokenizer_.EncodeForPrompt(prompt->text));
        if (!ids.has_value()) continue;
        raw[i] = PreferencePair{*std::move(ids), encode_.Response(chosen.text), encode_.Response(rejected.text)};
        continue;
      }
      const Json before = prompt.has_value() ? AsConversation(*prompt, "user") : Json::array();
      items[i] = {batch.Add(Concat(before, AsConversation(chosen, "assistant")), false, false, r, data_.chosen_key),
                  batch.Add(Concat(before, AsConversation(rejected, "assistant")), false, false, r,
                            data_.rejected_key)};
    }
    STRATA_RETURN_IF_ERROR(batch.Run());
    for (size_t i = 0; i < records.size(); ++i) {
      if (raw[i].has_value()) pairs->push_back(*std::move(raw[i]));
      if (!items[i].has_value()) continue;
      const std::vector<int32_t> chosen = tokenizer_.Encode(batch[items[i]->first].text);
      const std::vector<int32_t> rejected = tokenizer_.Encode(batch[items[i]->second].text);
      // What both sides share is the prompt; each keeps at least one id of
      // its own, where the reward model reads its score.
      const size_t shared = std::min({CommonPrefixLength(chosen, rejected), chosen.size() - 1, rejected.size() - 1});
      if (chosen.empty() || rejected.empty() || shared == 0) {
        return absl::InvalidArgumentError(absl::StrCat(records[i].where, ": keys '", data_.chosen_key, "' and '",
                                                       data_.rejected_key,
                                                       "' render with no common start (the prompt): give the prompt "
                                                       "under key '",
                                                       data_.prompt_key, "' or in both conversations"));
      }
      std::optional<std::vector<int32_t>> prompt = Fit(Head(chosen, shared));
      if (!prompt.has_value()) continue;
      const size_t keep = encode_.max_response_tokens();
      pairs->push_back({*std::move(prompt), Head(Tail(chosen, shared), keep), Head(Tail(rejected, shared), keep)});
    }
    return NonEmpty(pairs->size(), path);
  }

  // RL prompts of `path`: the first `limit` records (all when negative).
  absl::Status Prompts(const std::string& path, int64_t limit, PromptSet* set) {
    STRATA_ASSIGN_OR_RETURN(auto records, ReadJsonl(path));
    if (limit >= 0 && records.size() > static_cast<size_t>(limit)) records.resize(static_cast<size_t>(limit));
    RenderBatch batch(chat_, data_);
    std::vector<std::optional<size_t>> item(records.size());
    std::vector<std::string> text(records.size()), labels(records.size());
    std::vector<Json> messages(records.size());
    for (size_t i = 0; i < records.size(); ++i) {
      const Record& r = records[i];
      STRATA_ASSIGN_OR_RETURN(auto prompt, RequireText(r, data_.prompt_key));
      STRATA_ASSIGN_OR_RETURN(labels[i], ReadLabel(r, data_.label_key));
      if (Templated(prompt)) {
        messages[i] = AsConversation(prompt, "user");
        item[i] = batch.Add(messages[i], true, false, r, data_.prompt_key);
      } else {
        text[i] = prompt.text;
      }
    }
    STRATA_RETURN_IF_ERROR(batch.Run());
    for (size_t i = 0; i < records.size(); ++i) {
      std::optional<std::vector<int32_t>> ids;
      if (item[i].has_value()) {
        // The template writes BOS and every special token itself.
        text[i] = batch[*item[i]].text;
        ids = Fit(tokenizer_.Encode(text[i]));
      } else {
        ids = Fit(tokenizer_.EncodeForPrompt(text[i]));
      }
      if (!ids.has_value()) continue;
      set->ids.push_back(*std::move(ids));
      set->text.push_back(std::move(text[i]));
      set->labels.push_back(std::move(labels[i]));
      set->messages.push_back(std::move(messages[i]));
    }
    return absl::OkStatus();
  }

  // Prompt ids within data.max_prompt_tokens (PromptEncoder::FitPrompt),
  // counting the over-long ones.
  std::optional<std::vector<int32_t>> Fit(std::vector<int32_t> ids) {
    if (ids.size() > encode_.max_prompt_tokens()) ++out_->overlong_prompts;
    return encode_.FitPrompt(std::move(ids));
  }

  void NoteSample(const std::vector<int32_t>& ids) {
    // Plain decoding would drop the special tokens the template wrote.
    out_->sample_prompt = DecodeWithSpecialTokens(tokenizer_, ids);
  }

  static absl::Status NonEmpty(size_t n, const std::string& path) {
    if (n > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": every example was dropped as over-long (data.overlong_prompts: drop)"));
  }

  bool Templated(const TextValue& value) const { return value.is_conversation() || data_.apply_chat_template; }

 private:
  const DataSpec& data_;
  const Tokenizer& tokenizer_;
  const PromptEncoder encode_;
  const ChatSetup& chat_;
  JobData* out_;
};

}  // namespace

absl::StatusOr<JobData> ReadJobData(const JobSpec& spec, const Tokenizer& tokenizer, const ChatSetup& chat) {
  JobData data;
  DataReader reader(spec, tokenizer, chat, &data);
  if (spec.algorithm == Algorithm::kSft) {
    STRATA_RETURN_IF_ERROR(reader.Sft());
  } else if (spec.algorithm == Algorithm::kRewardModel) {
    STRATA_RETURN_IF_ERROR(reader.Pairs(spec.data.train, &data.pairs));
    if (!spec.data.eval.empty()) STRATA_RETURN_IF_ERROR(reader.Pairs(spec.data.eval, &data.eval_pairs));
    data.examples = data.pairs.size();
    if (!data.pairs.empty()) reader.NoteSample(data.pairs[0].prompt);
  } else {
    STRATA_RETURN_IF_ERROR(reader.Prompts(spec.data.train, -1, &data.prompts));
    STRATA_RETURN_IF_ERROR(DataReader::NonEmpty(data.prompts.ids.size(), spec.data.train));
    if (!spec.data.eval.empty()) {
      STRATA_RETURN_IF_ERROR(reader.Prompts(spec.data.eval, spec.eval.prompts, &data.eval_prompts));
    }
    data.examples = data.prompts.ids.size();
    data.sample_prompt = data.prompts.text[0];
  }
  return data;
}

absl::StatusOr<ChatTemplateContext> ChatContextOf(const DataSpec& data, const Tokenizer& tokenizer,
                                                  const std::vector<int64_t>& stop_ids) {
  ChatTemplateContext context;
  context.template_args = Json::parse(data.template_args_json, nullptr, /*allow_exceptions=*/false);
  if (context.template_args.is_discarded() || !context.template_args.is_object()) {
    return absl::InvalidArgumentError("data.template_args: must be a mapping");
  }
  context.date = data.template_date;
  for (int64_t id : stop_ids) {
    const std::string piece = tokenizer.IdToPiece(static_cast<int32_t>(id));
    if (!piece.empty() &&
        std::find(context.stop_strings.begin(), context.stop_strings.end(), piece) == context.stop_strings.end()) {
      context.stop_strings.push_back(piece);
    }
  }
  return context;
}

}  // namespace strata::policies
