// `strata bench chat-template`: conversations -> token ids as a job's data
// gets them, timed in two parts: every conversation of a JSONL file rendered
// through a model's chat template by ChatRenderer (one child process for all
// of them, add_generation_prompt false, no assistant spans), then every text
// encoded by strata's tokenizer. The peer, run apart by bench/chat_template.sh
// on the same file, is bench/chat_template_peer.mjs (@huggingface/jinja and
// Hugging Face's `tokenizers`); both print the same keys, and equal token
// totals are the check that both engines produced the same ids' worth.
#ifndef STRATA_BENCH_CHAT_TEMPLATE_BENCH_H_
#define STRATA_BENCH_CHAT_TEMPLATE_BENCH_H_

#include <string>

#include "absl/status/statusor.h"

namespace strata::bench {

struct ChatTemplateBenchRequest {
  // A model directory with tokenizer.json and tokenizer_config.json (its
  // chat template and special tokens).
  std::string tokenizer;
  // JSONL, one {"messages": [...]} a line (bench/make_chat_conversations.py).
  std::string conversations;
  bool json = false;
};

// {"conversations", "load_s" (template and tokenizer load), "render_s" (the
// one ChatRenderer::Render call: the child's start, template parse and every
// render), "tokenize_s" (Encode of every text, one thread), "tokens" (their
// total)}, or the same as text. INVALID_ARGUMENT naming the file and line for
// a record that is not {"messages": [...]}, or the conversation whose
// template raised; what LoadChatTemplate, Tokenizer::Load and
// ChatRenderer::Render return otherwise.
absl::StatusOr<std::string> RunChatTemplateBench(const ChatTemplateBenchRequest& request);

}  // namespace strata::bench

#endif  // STRATA_BENCH_CHAT_TEMPLATE_BENCH_H_
