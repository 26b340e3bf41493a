#!/usr/bin/env python3
"""Held-out accuracy of a math-task model, through the strata CLI (stdlib
only). A stopgap until evaluation with the math verifier runs inside jobs.

    python3 examples/math_task/evaluate.py [--model out/math_task/sft] [-k 100] [--samples 8]

For each of the first K held-out problems: the prompt as the policy sees it
(`strata tokenize --messages ... --add-generation-prompt --template-arg
enable_thinking=false`), then `strata generate` once greedily and --samples
times at temperature 1 (seeds 0..samples-1). The answer is the text after
the last `####`, else the last number; it is right when it equals the
record's "answer" as a number. Prints greedy accuracy and pass@samples (any
sample right) over K.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def final_answer(text):
    if "####" in text:
        line = text.rsplit("####", 1)[1].split("\n", 1)[0].strip()
        if line:
            return line
    numbers = NUMBER.findall(text)
    return numbers[-1] if numbers else None


def correct(text, answer):
    got = final_answer(text)
    if got is None:
        return False
    try:
        return float(got.replace(",", "")) == float(answer)
    except ValueError:
        return got == answer


def byte_decoder():
    # GPT-2's byte-level alphabet, as the Qwen3 tokenizer uses it.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class Decoder:
    """Token ids to text, special tokens dropped (what the verifier reads)."""

    def __init__(self, tokenizer_json):
        with open(tokenizer_json) as f:
            tok = json.load(f)
        self.pieces = {i: p for p, i in tok["model"]["vocab"].items()}
        self.special = {t["id"] for t in tok["added_tokens"] if t["special"]}
        self.bytes = byte_decoder()

    def __call__(self, ids):
        raw = bytearray()
        for i in ids:
            if i in self.special or i not in self.pieces:
                continue
            raw.extend(self.bytes[c] for c in self.pieces[i])
        return raw.decode("utf-8", errors="replace")


def run_json(cmd):
    # The binary can be missing for a moment while it is rebuilt; wait for it.
    for attempt in range(30):
        try:
            return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        except OSError as e:
            print(f"  {cmd[0]}: {e}; retrying in 10 s", file=sys.stderr, flush=True)
            time.sleep(10)
    raise SystemExit(f"{cmd[0]} could not be run")


def prompt_ids(strata, tokenizer, messages, cache, cache_path):
    key = json.dumps(messages)
    if key not in cache:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"messages": messages}, f)
        try:
            cache[key] = run_json([strata, "tokenize", "--tokenizer", tokenizer, "--messages", f.name,
                                   "--add-generation-prompt", "--template-arg", "enable_thinking=false", "--json"])["ids"]
        finally:
            os.unlink(f.name)
        save_cache(cache_path, cache)
    return cache[key]


def save_cache(path, cache):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(cache, f)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="out/math_task/sft")
    ap.add_argument("--data", default=os.path.join(HERE, "data", "heldout.jsonl"))
    ap.add_argument("--tokenizer", default=os.path.join(HERE, "tokenizer"))
    ap.add_argument("--strata", default=os.environ.get("STRATA_BIN", os.path.join(ROOT, "build", "strata")))
    ap.add_argument("-k", type=int, default=100, help="held-out problems evaluated (the first K)")
    ap.add_argument("--samples", type=int, default=8, help="samples at temperature 1 for pass@samples (0: greedy only)")
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--cache", default="out/math_task/heldout_prompt_ids.json",
                    help="prompt ids already rendered, keyed by conversation (rendering takes a second each)")
    ap.add_argument("--show", type=int, default=3, help="greedy responses printed")
    args = ap.parse_args()

    with open(args.data) as f:
        rows = [json.loads(line) for line in f][:args.k]
    cache = {}
    if os.path.exists(args.cache):
        with open(args.cache) as f:
            cache = json.load(f)
    decode = Decoder(os.path.join(args.tokenizer, "tokenizer.json"))
    # The model without its tokenizer files: generate then skips loading the
    # 11 MB tokenizer.json on every call (we decode the ids here).
    model = tempfile.mkdtemp(prefix="math_eval_model_")
    for name in os.listdir(args.model):
        if name in ("config.json", "generation_config.json") or name.endswith(".safetensors"):
            os.symlink(os.path.abspath(os.path.join(args.model, name)), os.path.join(model, name))

    start = time.time()
    try:
        greedy_right, pass_right = score(args, rows, model, cache, decode)
    finally:
        for name in os.listdir(model):
            os.unlink(os.path.join(model, name))
        os.rmdir(model)
    k = len(rows)
    print(f"model {args.model}: greedy accuracy {100 * greedy_right / k:.1f}% ({greedy_right}/{k}), "
          f"pass@{args.samples} (temperature 1) {100 * pass_right / k:.1f}% ({pass_right}/{k}), K={k}, "
          f"{time.time() - start:.0f} s")


def score(args, rows, model, cache, decode):
    """(greedy right, pass@samples right) over `rows`; progress on stderr."""
    start = time.time()
    greedy_right = pass_right = 0
    for n, row in enumerate(rows, 1):
        ids = prompt_ids(args.strata, args.tokenizer, row["messages"], cache, args.cache)
        base = [args.strata, "generate", "--model", model, "--prompt-ids", ",".join(map(str, ids)),
                "--max-new-tokens", str(args.max_new_tokens), "--json"]
        greedy = decode(run_json(base + ["--greedy"])["output_ids"])
        g = correct(greedy, row["answer"])
        greedy_right += g
        for seed in range(args.samples):
            sample = decode(run_json(base + ["--temperature", "1", "--seed", str(seed)])["output_ids"])
            if correct(sample, row["answer"]):
                pass_right += 1
                break  # one right sample decides pass@k; the rest cannot change it
        if n <= args.show:
            print(f"[{row['answer']}] {row['messages'][-1]['content']}\n  greedy: {greedy!r}", flush=True)
        if n % 10 == 0:
            print(f"  {n}/{len(rows)}: greedy {greedy_right}/{n}, pass@{args.samples} {pass_right}/{n}, "
                  f"{time.time() - start:.0f} s", file=sys.stderr, flush=True)
    return greedy_right, pass_right


if __name__ == "__main__":
    main()
