#include "bench/chat_template_bench.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/file.h"
#include "base/status_macros.h"
#include "policies/data/chat_renderer.h"
#include "policies/data/chat_template.h"
#include "policies/tokenizer/tokenizer.h"

namespace strata::bench {
namespace {

using nlohmann::ordered_json;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// One RenderItem per non-blank line of `path`, as the peer reads the file.
absl::StatusOr<std::vector<policies::RenderItem>> ReadConversations(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(auto text, ReadFileToString(path));
  std::vector<policies::RenderItem> items;
  int64_t line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == absl::string_view::npos) continue;
    ordered_json record = ordered_json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("messages") || !record["messages"].is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--conversations ", path, ":", line_number, ": not a {\"messages\": [...]} record"));
    }
    items.push_back({std::move(record["messages"]), /*add_generation_prompt=*/false, /*assistant_spans=*/false});
  }
  return items;
}

}  // namespace

absl::StatusOr<std::string> RunChatTemplateBench(const ChatTemplateBenchRequest& request) {
  STRATA_ASSIGN_OR_RETURN(auto items, ReadConversations(request.conversations));

  // As the peer: template and tokenizer loaded outside both timings. (Jinja2
  // parses the template in the child, so that part falls in render_s.)
  auto start = std::chrono::steady_clock::now();
  STRATA_ASSIGN_OR_RETURN(auto chat_template, policies::LoadChatTemplate(request.tokenizer, {}));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<policies::Tokenizer> tokenizer, policies::Tokenizer::Load(request.tokenizer));
  const double load_s = Seconds(start);
  const policies::ChatRenderer renderer(std::move(chat_template), {});

  start = std::chrono::steady_clock::now();
  STRATA_ASSIGN_OR_RETURN(auto rendered, renderer.Render(items));
  const double render_s = Seconds(start);
  for (size_t i = 0; i < rendered.size(); ++i) {
    if (!rendered[i].error.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--conversations ", request.conversations, ": conversation ",
                                                     i + 1, " does not render: ", rendered[i].error));
    }
  }

  int64_t tokens = 0;
  start = std::chrono::steady_clock::now();
  for (const policies::Rendered& r : rendered) tokens += static_cast<int64_t>(tokenizer->Encode(r.text).size());
  const double tokenize_s = Seconds(start);

  const int64_t conversations = static_cast<int64_t>(items.size());
  if (request.json) {
    return ordered_json{{"conversations", conversations},
                        {"load_s", load_s},
                        {"render_s", render_s},
                        {"tokenize_s", tokenize_s},
                        {"tokens", tokens}}
               .dump() +
           "\n";
  }
  const double total_s = render_s + tokenize_s;
  return absl::StrFormat(
      "%s: %d conversations, %d tokens (%s)\n"
      "  load      %9.3fs  (template and tokenizer)\n"
      "  render    %9.3fs  (one Jinja2 child process for all)\n"
      "  tokenize  %9.3fs\n"
      "  total     %9.3fs  %.0f conversations/s\n",
      request.conversations, conversations, tokens, request.tokenizer, load_s, render_s, tokenize_s, total_s,
      total_s > 0 ? conversations / total_s : 0.0);
}

}  // namespace strata::bench
