// Renders conversations through a chat template with @huggingface/jinja, the
// engine transformers.js's `apply_chat_template` uses, called as it calls it:
// `new Template(template).render({messages, add_generation_prompt, tools,
// documents, ...special tokens, ...arguments})` (tools and documents null
// unless the arguments give them), with the library's own trim_blocks and
// lstrip_blocks and its `raise_exception`, `tojson` and `strftime_now`.
// `strftime_now` formats the clock, so each render runs with the clock set to
// the request's date (the library lets no render variable replace a global):
// the library's own directives and month names format it.
// The second engine behind tests/policies/data/chat_template_engines_test.py,
// which runs it with LC_ALL=C (month names in English, as Python's C locale
// gives them). The request is the one policies/data/chat_render.py reads, of
// which it uses "template", "variables", "date" and each item's "messages"
// and "add_generation_prompt" (no limits, stop strings or assistant spans).
//   node render_chat.mjs REQUEST.json
// Output: {"results": [{"text"} | {"error"}]}, or {"error"} when the template
// does not parse; exit 2 when the request cannot be read.
// As a module: specialTokens(tokenizerConfig) and compile(template, variables,
// date), for bench/chat_template_peer.mjs.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { Template } from "@huggingface/jinja";

// The template variables transformers sets from a tokenizer_config.json (its
// special_tokens_map): each special token by its content (an AddedToken dict
// by "content"), none where it is null or absent.
export function specialTokens(config) {
  const content = (token) => (token !== null && typeof token === "object" ? token.content : token);
  const variables = {};
  for (const key of ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]) {
    const value = content(config[key]);
    if (value !== null && value !== undefined) variables[key] = value;
  }
  if (Array.isArray(config.additional_special_tokens)) {
    variables.additional_special_tokens = config.additional_special_tokens.map(content);
  }
  return variables;
}

// The instant whose local date and time are the fields of an ISO 8601 date
// as written ("2026-11-27", "2026-11-27T10:30:00", an offset ignored): what
// Python's datetime.fromisoformat(...).strftime formats.
function parseDate(iso) {
  const m = /^(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2}))?)?/.exec(iso ?? "");
  if (!m) throw new Error(`"date" is not an ISO 8601 date: ${JSON.stringify(iso)}`);
  const [year, month, day, hour, minute, second] = m.slice(1).map((x) => Number(x ?? 0));
  return new Date(year, month - 1, day, hour, minute, second).getTime();
}

// A Date whose `new Date()` and Date.now() give `instant`.
function clockAt(instant) {
  return class FixedDate extends Date {
    constructor(...args) {
      super(...(args.length > 0 ? args : [instant]));
    }
    static now() {
      return instant;
    }
  };
}

// A render function (messages, addGenerationPrompt) -> text; throws what the
// template raises. Parses the template once (throws if it does not parse).
export function compile(template, variables, isoDate) {
  const FixedDate = clockAt(parseDate(isoDate));
  const parsed = new Template(template);
  return (messages, add_generation_prompt) => {
    const RealDate = globalThis.Date;
    globalThis.Date = FixedDate;
    try {
      return parsed.render({ messages, add_generation_prompt, tools: null, documents: null, ...variables });
    } finally {
      globalThis.Date = RealDate;
    }
  };
}

function main(requestPath) {
  let request;
  try {
    request = JSON.parse(readFileSync(requestPath, "utf8"));
    parseDate(request.date);
  } catch (e) {
    process.stderr.write(`render_chat: cannot read the request ${requestPath}: ${e.message}\n`);
    return 2;
  }
  let render;
  try {
    render = compile(request.template, request.variables ?? {}, request.date);
  } catch (e) {
    process.stdout.write(JSON.stringify({ error: `the template does not parse: ${e.message}` }));
    return 0;
  }
  const results = [];
  for (const item of request.items) {
    try {
      results.push({ text: render(item.messages, item.add_generation_prompt) });
    } catch (e) {
      results.push({ error: e instanceof Error ? e.message : String(e) });
    }
  }
  process.stdout.write(JSON.stringify({ results }));
  return 0;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  if (process.argv.length !== 3) {
    process.stderr.write("usage: node render_chat.mjs REQUEST.json\n");
    process.exitCode = 2;
  } else {
    process.exitCode = main(process.argv[2]);
  }
}
