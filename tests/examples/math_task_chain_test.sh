#!/usr/bin/env bash
# The math task's chain, quick (examples/math_task/run.sh chain --quick): SFT
# for 20 steps, then ReMax, GRPO and PPO for 2 iterations each, rewarded by
# the example reward server on a free loopback port and evaluated by the
# math verifier. Checks that the chain works end to end (not how well it
# learns: that is a benchmark, docs/BENCHMARKS.md): every run reports the
# server's reward, its time and the held-out accuracy; the server saw the
# rendered prompts with their labels; `strata compare` tabulates the runs.
# Usage: tests/examples/math_task_chain_test.sh STRATA_BINARY WORK_DIR
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
strata="$1" work="$2"
fail() { echo "math_task_chain_test: FAILED: $*" >&2; exit 1; }

rm -rf "$work" && mkdir -p "$work/examples"
cp -r "$root/examples/math_task" "$work/examples/"
rm -rf "$work/examples/math_task/data" "$work/examples/math_task/tokenizer"
cd "$work"
STRATA_BIN="$strata" STRATA_TOKENIZER_PACKAGES="$root/tests/policies/tokenizer/reference" \
  bash examples/math_task/run.sh chain --quick > chain.log 2>&1 || { cat chain.log >&2; fail "the chain failed"; }

out=out/math_task_quick
for algorithm in remax grpo ppo; do
  metrics="$out/$algorithm/metrics.jsonl"
  [ -f "$metrics" ] || fail "$metrics is missing"
  python3 - "$metrics" <<'PY' || fail "$metrics lacks a figure the chain reports"
import json, sys
lines = [json.loads(line) for line in open(sys.argv[1])]
assert len(lines) == 2, f"{len(lines)} lines, want 2"
for key in ("reward/server", "time/score/server_s", "eval/math/accuracy", "eval/initial_math/accuracy"):
    assert key in lines[0], f"no {key} in the first line"
assert 0 <= lines[-1]["eval/math/accuracy"] <= 1
PY
done
python3 - "$out/reward_queries.jsonl" <<'PY' || fail "the reward server's log is not what the protocol sends"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert rows, "no query reached the server"
labels = {json.loads(line)["messages"][0]["content"]: json.loads(line)["answer"]
          for line in open("examples/math_task/data/prompts.jsonl")}
for row in rows:
    assert row["query"].startswith(row["prompt"]), "a query does not start with its prompt"
    assert row["prompt"].startswith("<|im_start|>user\n"), "a prompt is not the rendered chat template"
    problem = row["prompt"].split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    assert labels[problem] == row["label"], f"label {row['label']!r} for {problem!r}"
PY
grep -q "math/accuracy (last)" chain.log || { cat chain.log >&2; fail "strata compare printed no accuracy row"; }
echo "math_task_chain_test: passed"
