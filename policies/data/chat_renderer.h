// Conversations -> text through a chat template, with a real Jinja engine
// set up as `transformers`' apply_chat_template sets it up: Debian's
// python3-jinja2 (the engine transformers itself uses) running
// policies/data/chat_render.py, which is embedded in the binary. Why Python's
// Jinja2 and not a JavaScript or C++ engine: templates are written against
// it (Python string methods, its filters and tests), so it is the only engine
// that renders every template exactly as transformers does.
//
// A template is untrusted input: it renders in Jinja2's immutable sandbox (no
// file, import or unsafe attribute access), in a child process that bounds
// its own memory, CPU time, each render's wall time and each render's output.
#ifndef STRATA_POLICIES_DATA_CHAT_RENDERER_H_
#define STRATA_POLICIES_DATA_CHAT_RENDERER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "policies/data/chat_template.h"

namespace strata::policies {

struct ChatRendererOptions {
  // The interpreter with Jinja2: Debian's, not whatever python3 is first on PATH.
  std::string python = "/usr/bin/python3";
  // Wall time of one render (one conversation or one of its prefixes).
  double render_timeout_s = 10;
  // CPU time of the whole rendering process (all of a dataset's renders).
  int64_t cpu_seconds = 600;
  // Address space of the rendering process.
  int64_t memory_bytes = int64_t{2} << 30;
  // Characters one render may produce.
  int64_t max_chars = int64_t{1} << 22;
  // Where the request file and the child's stderr are written; "" = $TMPDIR or /tmp.
  std::string scratch_dir;

  absl::Status Validate() const;
};

// What the template is given besides the messages.
struct ChatTemplateContext {
  // data.template_args: a JSON object (e.g. {"enable_thinking": false}); its
  // keys win over the special tokens of the same name.
  nlohmann::ordered_json template_args = nlohmann::ordered_json::object();
  // What strftime_now() formats (ISO 8601); "" = the time of the call.
  std::string date;
  // The text of the end-of-turn tokens: an assistant turn found by rendering
  // prefixes ends after the last of them in it.
  std::vector<std::string> stop_strings;
};

struct RenderItem {
  nlohmann::ordered_json messages;  // [{"role", "content", ...}, ...]
  bool add_generation_prompt = false;
  bool assistant_spans = false;  // also find the assistant turns
};

struct Rendered {
  std::string text;
  // Byte ranges [begin, end) of `text` the assistant wrote, when asked for:
  // from the template's {% generation %} marks, else by rendering prefixes.
  std::vector<std::pair<size_t, size_t>> assistant_spans;
  std::string error;  // the template raised or the turns could not be found: Jinja's message
};

// Thread-safe (const, and each call runs its own process).
class ChatRenderer {
 public:
  ChatRenderer(ChatTemplate chat_template, ChatTemplateContext context, ChatRendererOptions options = {});

  // Renders every item in one child process. An item whose template raised
  // carries its message in Rendered::error; the status fails only when the
  // engine cannot run (FAILED_PRECONDITION naming what is missing: python3,
  // Jinja2) or the template does not parse (INVALID_ARGUMENT naming origin).
  absl::StatusOr<std::vector<Rendered>> Render(const std::vector<RenderItem>& items) const;

  const ChatTemplate& chat_template() const { return template_; }

 private:
  ChatTemplate template_;
  ChatTemplateContext context_;
  ChatRendererOptions options_;
};

}  // namespace strata::policies

#endif  // STRATA_POLICIES_DATA_CHAT_RENDERER_H_
