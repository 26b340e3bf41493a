// Encodes and decodes every string of a JSON corpus with Hugging Face's
// tokenizers (the npm package wraps its Rust core) and prints, as JSON, what
// strata's tokenizer must match, plus load time and encode throughput.
//   node encode.mjs TOKENIZER_JSON CORPUS_JSON [REPEAT]
// Output: {"load_s": .., "encode_s": .., "tokens": .., "lines": [{"ids": [..], "decoded": ".."}, ..]}
// Encoding adds no special tokens (strata's Encode does not); decoding
// skips them (strata's Decode does).
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

// One thread, as strata's tokenizer runs: the throughput is per core.
process.env.TOKENIZERS_PARALLELISM ??= "false";
const require = createRequire(import.meta.url);
const { Tokenizer } = require("tokenizers");

const [tokenizerPath, corpusPath, repeatArg] = process.argv.slice(2);
const corpus = JSON.parse(readFileSync(corpusPath, "utf8"));
const repeat = Number(repeatArg ?? 1);

let start = process.hrtime.bigint();
const tokenizer = Tokenizer.fromFile(tokenizerPath);
const loadS = Number(process.hrtime.bigint() - start) / 1e9;

const lines = [];
for (const text of corpus) {
  const encoding = await tokenizer.encode(text, null, { addSpecialTokens: false });
  const ids = Array.from(encoding.getIds());
  lines.push({ ids, decoded: await tokenizer.decode(ids, true) });
}
// Throughput: the corpus `repeat` times over, as one batch.
const batch = [];
for (let r = 0; r < repeat; ++r) batch.push(...corpus);
start = process.hrtime.bigint();
const encodings = await tokenizer.encodeBatch(batch, { addSpecialTokens: false });
const encodeS = Number(process.hrtime.bigint() - start) / 1e9;
let tokens = 0;
for (const encoding of encodings) tokens += encoding.getIds().length;
process.stdout.write(JSON.stringify({ load_s: loadS, encode_s: encodeS, tokens, lines }));
