#include "policies/data/chat_renderer.h"

#include <stdlib.h>
#include <unistd.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "base/subprocess.h"
#include "policies/job/job_spec.h"

namespace strata::policies {
namespace internal {
extern const char kChatRenderScript[];
}  // namespace internal

namespace {

using Json = nlohmann::ordered_json;

std::string NowIso() {
  return TemplateDateOf(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

// A private directory for one render's files, removed when it goes.
class ScratchDir {
 public:
  static absl::StatusOr<ScratchDir> Create(const std::string& parent) {
    std::string base = parent;
    if (base.empty()) {
      const char* tmp = ::getenv("TMPDIR");
      base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    }
    std::string pattern = JoinPath(base, "strata-chat-XXXXXX");
    if (::mkdtemp(pattern.data()) == nullptr) return ErrnoToStatus(errno, absl::StrCat("mkdtemp in ", base));
    return ScratchDir(std::move(pattern));
  }
  ScratchDir(ScratchDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ScratchDir& operator=(ScratchDir&&) = delete;
  ~ScratchDir() {
    if (!path_.empty()) RemoveTree(path_);
  }
  const std::string& path() const { return path_; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace

absl::Status ChatRendererOptions::Validate() const {
  if (python.empty()) return absl::InvalidArgumentError("ChatRendererOptions.python: empty");
  if (!(render_timeout_s > 0)) return absl::InvalidArgumentError("ChatRendererOptions.render_timeout_s: must be > 0");
  if (cpu_seconds < 1) return absl::InvalidArgumentError("ChatRendererOptions.cpu_seconds: must be >= 1");
  if (memory_bytes < (int64_t{64} << 20)) {
    return absl::InvalidArgumentError("ChatRendererOptions.memory_bytes: must be >= 64 MiB");
  }
  if (max_chars < 1) return absl::InvalidArgumentError("ChatRendererOptions.max_chars: must be >= 1");
  return absl::OkStatus();
}

ChatRenderer::ChatRenderer(ChatTemplate chat_template, ChatTemplateContext context, ChatRendererOptions options)
    : template_(std::move(chat_template)), context_(std::move(context)), options_(std::move(options)) {}

absl::StatusOr<std::vector<Rendered>> ChatRenderer::Render(const std::vector<RenderItem>& items) const {
  STRATA_RETURN_IF_ERROR(options_.Validate());
  std::vector<Rendered> out;
  if (items.empty()) return out;
  Json variables = template_.special_tokens;
  if (context_.template_args.is_object()) {
    for (const auto& [key, value] : context_.template_args.items()) variables[key] = value;
  }
  Json request = {{"template", template_.text},
                  {"variables", std::move(variables)},
                  {"date", context_.date.empty() ? NowIso() : context_.date},
                  {"max_chars", options_.max_chars},
                  {"timeout_s", options_.render_timeout_s},
                  {"memory_bytes", options_.memory_bytes},
                  {"cpu_seconds", options_.cpu_seconds},
                  {"stop_strings", context_.stop_strings},
                  {"items", Json::array()}};
  for (const RenderItem& item : items) {
    request["items"].push_back({{"messages", item.messages},
                                {"add_generation_prompt", item.add_generation_prompt},
                                {"assistant_spans", item.assistant_spans}});
  }
  STRATA_ASSIGN_OR_RETURN(auto scratch, ScratchDir::Create(options_.scratch_dir));
  const std::string request_path = JoinPath(scratch.path(), "request.json");
  // Messages are the job's data: invalid UTF-8 in them becomes U+FFFD rather
  // than failing the dump.
  STRATA_RETURN_IF_ERROR(
      WriteFileAtomically(request_path, request.dump(-1, ' ', false, Json::error_handler_t::replace)));
  absl::StatusOr<ProcessResult> run =
      RunProcess({options_.python, "-I", "-c", internal::kChatRenderScript, request_path}, scratch.path());
  if (!run.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("chat templates need Python 3 with Jinja2 at ", options_.python,
                                                      " (Debian: python3-jinja2): ", run.status().message()));
  }
  const ProcessResult& result = *run;
  if (result.exit_code != 0) {
    std::string why = result.error.size() > 2000 ? result.error.substr(result.error.size() - 2000) : result.error;
    return absl::FailedPreconditionError(absl::StrCat("chat template ", template_.origin, ": the renderer (",
                                                      options_.python, ") exited with ", result.exit_code, ": ", why));
  }
  const Json reply = Json::parse(result.output, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded() || !reply.is_object()) {
    return absl::InternalError(absl::StrCat("chat template ", template_.origin, ": the renderer's reply is not JSON"));
  }
  if (reply.contains("error")) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template ", template_.origin, ": ", reply["error"].get<std::string>()));
  }
  const Json& results = reply["results"];
  if (!results.is_array() || results.size() != items.size()) {
    return absl::InternalError(absl::StrCat("chat template ", template_.origin, ": the renderer answered ",
                                            results.is_array() ? results.size() : 0, " of ", items.size(), " items"));
  }
  for (const Json& r : results) {
    Rendered rendered;
    if (r.contains("error")) {
      rendered.error = r["error"].get<std::string>();
    } else {
      rendered.text = r["text"].get<std::string>();
      if (r.contains("spans")) {
        for (const Json& span : r["spans"]) rendered.assistant_spans.emplace_back(span[0], span[1]);
      }
    }
    out.push_back(std::move(rendered));
  }
  return out;
}

}  // namespace strata::policies
