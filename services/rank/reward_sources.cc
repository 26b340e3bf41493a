#include "services/rank/reward_sources.h"

#include <c10/core/GradMode.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "policies/data/chat_renderer.h"
#include "policies/data/chat_template.h"
#include "policies/data/chat_tokens.h"
#include "policies/data/job_data.h"
#include "rewards/verifiers/verifiers.h"
#include "services/rank/gang_sum.h"
#include "services/rank/packed_batch.h"

namespace strata::services {

using Json = nlohmann::ordered_json;

class RewardSources::Source {
 public:
  virtual ~Source() = default;
  virtual absl::StatusOr<std::vector<double>> Score(const std::vector<ScoredResponse>& responses) = 0;
};

namespace {

absl::Status SourceError(const policies::RewardSourceSpec& spec, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("reward source '", spec.name, "': ", status.message()));
}

class VerifierSource final : public RewardSources::Source {
 public:
  explicit VerifierSource(rewards::VerifierFn check) : check_(std::move(check)) {}
  absl::StatusOr<std::vector<double>> Score(const std::vector<ScoredResponse>& responses) override {
    std::vector<double> out;
    for (const ScoredResponse& r : responses) out.push_back(check_(r.prompt_text, r.response_text, r.label));
    return out;
  }

 private:
  rewards::VerifierFn check_;
};

class RemoteSource final : public RewardSources::Source {
 public:
  explicit RemoteSource(std::unique_ptr<rewards::RemoteRewardClient> client) : client_(std::move(client)) {}
  absl::StatusOr<std::vector<double>> Score(const std::vector<ScoredResponse>& responses) override {
    std::vector<std::string> queries, prompts, labels;
    for (const ScoredResponse& r : responses) {
      queries.push_back(r.query_text);
      prompts.push_back(r.prompt_text);
      labels.push_back(r.label);
    }
    STRATA_ASSIGN_OR_RETURN(auto scores, client_->Score(queries, prompts, labels));
    return std::move(scores.rewards);
  }

 private:
  std::unique_ptr<rewards::RemoteRewardClient> client_;
};

// The tokenizer file of a model directory (or the file itself).
std::string TokenizerFileOf(const std::string& path) {
  if (!IsDirectory(path)) return path;
  for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
    const std::string candidate = JoinPath(path, name);
    if (IsRegularFile(candidate)) return candidate;
  }
  return "";
}

// Whether two tokenizer paths hold the same tokenizer and chat template:
// then ids in one are ids in the other.
bool SameTokenizerAndTemplate(const std::string& a, const std::string& b) {
  const std::string fa = TokenizerFileOf(a), fb = TokenizerFileOf(b);
  if (fa.empty() || fb.empty()) return false;
  auto ta = ReadFileToString(fa), tb = ReadFileToString(fb);
  if (!ta.ok() || !tb.ok() || *ta != *tb) return false;
  auto ca = policies::LoadChatTemplate(a, {}), cb = policies::LoadChatTemplate(b, {});
  if (ca.ok() != cb.ok()) return false;
  return !ca.ok() || (ca->text == cb->text && ca->special_tokens == cb->special_tokens);
}

class ModelSource final : public RewardSources::Source {
 public:
  ModelSource(std::unique_ptr<policies::PlacedModel> model, std::unique_ptr<policies::Tokenizer> tokenizer,
              std::optional<policies::ChatRenderer> renderer, bool actor_ids, PassOptions passes)
      : model_(std::move(model)),
        tokenizer_(std::move(tokenizer)),
        renderer_(std::move(renderer)),
        actor_ids_(actor_ids),
        passes_(passes) {}

  absl::StatusOr<std::vector<double>> Score(const std::vector<ScoredResponse>& responses) override {
    std::vector<std::vector<int32_t>> prompts, answers;
    if (actor_ids_) {
      for (const ScoredResponse& r : responses) prompts.push_back(*r.prompt_ids), answers.push_back(*r.response_ids);
    } else {
      STRATA_RETURN_IF_ERROR(Tokenize(responses, &prompts, &answers));
    }
    c10::NoGradGuard no_grad;
    std::vector<double> out;
    for (const auto& [begin, end] : MicroBatches(prompts.size(), passes_.micro_batch_size)) {
      std::vector<const std::vector<int32_t>*> p, a;
      for (size_t i = begin; i < end; ++i) p.push_back(&prompts[i]), a.push_back(&answers[i]);
      const Packed packed = Pack(p, a, passes_.device);
      const at::Tensor s = model_->model().Scores(packed.ids, packed.mask).select(1, 0).to(at::kCPU).contiguous();
      out.insert(out.end(), s.data_ptr<float>(), s.data_ptr<float>() + s.numel());
    }
    return out;
  }

 private:
  // The conversation rendered with this model's template and tokenized with
  // its tokenizer; raw text as the reward-model stage encodes it.
  absl::Status Tokenize(const std::vector<ScoredResponse>& responses, std::vector<std::vector<int32_t>>* prompts,
                        std::vector<std::vector<int32_t>>* answers) const {
    std::vector<policies::RenderItem> items;
    std::vector<size_t> rendered_as(responses.size(), SIZE_MAX);
    for (size_t i = 0; i < responses.size(); ++i) {
      const ScoredResponse& r = responses[i];
      if (r.messages == nullptr || !r.messages->is_array()) continue;
      if (!renderer_.has_value()) {
        return absl::FailedPreconditionError(
            "the prompts are conversations but the reward model has no chat template to render them with");
      }
      Json messages = *r.messages;
      messages.push_back(Json{{"role", "assistant"}, {"content", r.response_text}});
      rendered_as[i] = items.size();
      items.push_back({std::move(messages), false, false});
    }
    std::vector<policies::Rendered> rendered;
    if (!items.empty()) {
      STRATA_ASSIGN_OR_RETURN(rendered, renderer_->Render(items));
    }
    for (size_t i = 0; i < responses.size(); ++i) {
      std::vector<int32_t> ids;
      if (rendered_as[i] != SIZE_MAX) {
        const policies::Rendered& text = rendered[rendered_as[i]];
        if (!text.error.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("chat template ", renderer_->chat_template().origin, ": ", text.error));
        }
        ids = tokenizer_->Encode(text.text);
      } else {
        ids = tokenizer_->EncodeForPrompt(responses[i].prompt_text);
        const std::vector<int32_t> answer = tokenizer_->Encode(responses[i].response_text);
        ids.insert(ids.end(), answer.begin(), answer.end());
        if (tokenizer_->eos_id() >= 0) ids.push_back(tokenizer_->eos_id());
      }
      if (ids.empty()) ids.push_back(0);
      // The score is read at the last token; where the prompt ends does not matter.
      answers->push_back({ids.back()});
      ids.pop_back();
      if (ids.empty()) ids.push_back(answers->back()[0]);
      prompts->push_back(std::move(ids));
    }
    return absl::OkStatus();
  }

  std::unique_ptr<policies::PlacedModel> model_;
  std::unique_ptr<policies::Tokenizer> tokenizer_;
  std::optional<policies::ChatRenderer> renderer_;
  const bool actor_ids_;
  const PassOptions passes_;
};

absl::StatusOr<std::unique_ptr<RewardSources::Source>> MakeSource(
    const policies::RewardSourceSpec& source, const policies::JobSpec& spec, const std::string& actor_tokenizer_path,
    const RewardAccess& access, const PlaceRewardModel& place, PassOptions passes, bool first_model) {
  if (source.kind == "verifier") {
    STRATA_ASSIGN_OR_RETURN(auto check, rewards::MakeVerifier({source.check, source.pattern, source.strict}));
    return std::make_unique<VerifierSource>(std::move(check));
  }
  if (source.kind == "remote") {
    rewards::RemoteRewardOptions options;
    options.url = source.url;
    options.batch_size = source.batch_size;
    options.max_in_flight = source.max_in_flight;
    options.timeout_s = source.timeout_s;
    options.retries = source.retries;
    options.ca_file = source.ca_file;
    if (!source.token_secret.empty()) {
      const auto it = access.secrets.find(source.token_secret);
      if (it == access.secrets.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "token_secret '", source.token_secret,
            "' is not a secret this worker holds (its operator gives them with --reward-secret NAME=FILE)"));
      }
      options.bearer_token = it->second;
    }
    STRATA_ASSIGN_OR_RETURN(auto client, rewards::RemoteRewardClient::Create(options, access.hosts));
    return std::make_unique<RemoteSource>(std::move(client));
  }
  // A reward model: its own tokenizer and template, unless they are the actor's.
  STRATA_ASSIGN_OR_RETURN(auto model, place(first_model ? "reward" : "reward:" + source.name, source.model));
  // A reward model saved without a tokenizer reads the actor's ids (a
  // reward model trained by strata on the actor's tokenizer is one).
  if (TokenizerFileOf(source.model.path).empty()) {
    return std::make_unique<ModelSource>(std::move(model), nullptr, std::nullopt, /*actor_ids=*/true, passes);
  }
  const bool actor_ids = SameTokenizerAndTemplate(source.model.path, actor_tokenizer_path);
  STRATA_ASSIGN_OR_RETURN(auto tokenizer, policies::Tokenizer::Load(source.model.path));
  std::optional<policies::ChatRenderer> renderer;
  auto found = policies::LoadChatTemplate(source.model.path, {});
  if (found.ok()) {
    STRATA_ASSIGN_OR_RETURN(auto context, policies::ChatContextOf(spec.data, *tokenizer, {}));
    renderer.emplace(*std::move(found), std::move(context));
  } else if (found.status().code() != absl::StatusCode::kNotFound) {
    return found.status();
  }
  return std::make_unique<ModelSource>(std::move(model), std::move(tokenizer), std::move(renderer), actor_ids, passes);
}

}  // namespace

RewardSources::RewardSources(std::vector<policies::RewardSourceSpec> specs,
                             std::vector<std::unique_ptr<Source>> sources)
    : specs_(std::move(specs)), sources_(std::move(sources)) {}

RewardSources::~RewardSources() = default;

absl::StatusOr<std::unique_ptr<RewardSources>> RewardSources::Create(
    const std::vector<policies::RewardSourceSpec>& sources, const policies::JobSpec& spec,
    const std::string& actor_tokenizer_path, const RewardAccess& access, const PlaceRewardModel& place,
    PassOptions passes) {
  std::vector<std::unique_ptr<Source>> built;
  bool first_model = true;
  for (const policies::RewardSourceSpec& source : sources) {
    auto made = MakeSource(source, spec, actor_tokenizer_path, access, place, passes, first_model);
    if (!made.ok()) return SourceError(source, made.status());
    if (source.kind == "model") first_model = false;
    built.push_back(*std::move(made));
  }
  return std::unique_ptr<RewardSources>(new RewardSources(sources, std::move(built)));
}

absl::StatusOr<SourceScores> RewardSources::Score(const std::vector<ScoredResponse>& responses) {
  SourceScores out;
  out.total.assign(responses.size(), 0.0f);
  for (size_t k = 0; k < sources_.size(); ++k) {
    const policies::RewardSourceSpec& spec = specs_[k];
    const auto started = std::chrono::steady_clock::now();
    auto scores = sources_[k]->Score(responses);
    if (!scores.ok()) return SourceError(spec, scores.status());
    if (scores->size() != responses.size()) {
      return absl::InternalError(absl::StrCat("reward source '", spec.name, "' gave ", scores->size(), " scores for ",
                                              responses.size(), " responses"));
    }
    for (size_t i = 0; i < responses.size(); ++i) {
      if (!std::isfinite((*scores)[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("reward source '", spec.name, "' gave a score that is not a finite number"));
      }
      out.total[i] += static_cast<float>(spec.weight * (*scores)[i]);
    }
    out.seconds[spec.name] += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    out.by_source[spec.name] = *std::move(scores);
  }
  return out;
}

absl::StatusOr<RewardAccess> LoadRewardAccess(const std::vector<std::string>& hosts,
                                              const std::vector<std::string>& secrets) {
  RewardAccess access;
  auto allowed = rewards::HostAllowList::Parse(hosts);
  if (!allowed.ok())
    return absl::InvalidArgumentError(absl::StrCat("--allow-reward-host: ", allowed.status().message()));
  access.hosts = *std::move(allowed);
  for (const std::string& entry : secrets) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == entry.size()) {
      return absl::InvalidArgumentError(absl::StrCat("--reward-secret '", entry, "' is not NAME=FILE"));
    }
    const std::string name = entry.substr(0, eq), path = entry.substr(eq + 1);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("--reward-secret ", name, ": ", path));
    // A token others can read is not a secret: refuse it, as ssh does a key.
    if ((st.st_mode & 077) != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("--reward-secret ", name, ": ", path, " is readable by others (chmod 600 it)"));
    }
    STRATA_ASSIGN_OR_RETURN(auto token, ReadFileToString(path));
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) token.pop_back();
    if (token.empty())
      return absl::InvalidArgumentError(absl::StrCat("--reward-secret ", name, ": ", path, " is empty"));
    if (!access.secrets.emplace(name, std::move(token)).second) {
      return absl::InvalidArgumentError(absl::StrCat("--reward-secret ", name, " is given twice"));
    }
  }
  return access;
}

ScoredResponse ViewOf(const policies::Tokenizer& tokenizer, const std::vector<int64_t>& stop_ids,
                      const std::vector<int32_t>& prompt_ids, const std::vector<int32_t>& response_ids,
                      std::string prompt_text, const nlohmann::ordered_json* messages, std::string label) {
  ScoredResponse view;
  view.prompt_ids = &prompt_ids;
  view.response_ids = &response_ids;
  view.messages = messages;
  view.response_text = policies::ResponseText(tokenizer, response_ids, stop_ids);
  view.query_text = prompt_text + policies::DecodeWithSpecialTokens(tokenizer, response_ids);
  view.prompt_text = std::move(prompt_text);
  view.label = std::move(label);
  return view;
}

}  // namespace strata::services
