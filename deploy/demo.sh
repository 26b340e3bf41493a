#!/usr/bin/env bash
# The README's main job: build strata, start a local stack (redis-server with
# AOF, the coordinator, two workers, all on loopback) and the math task's
# reward server (examples/math_task/reward_server.py, OpenRLHF's protocol,
# on a free loopback port that the workers are allowed to call), then run
# the math task through the job service: SFT of a Qwen3-shaped model on
# worked arithmetic solutions (real Qwen3 tokenizer and chat template), then
# ReMax, GRPO and PPO (parallel.workers: 2, each on both workers as one
# data-parallel gang) rewarded by the server and evaluated on 500 held-out
# problems by the built-in math verifier. It streams each job's
# progress and the stack's Prometheus metrics, prints the side-by-side table
# (held-out accuracy beside time per phase, reward-server time and peak
# memory per tier), draws it to out/math_task/remax_vs_ppo.png, shows each
# model's answer to a held-out problem, then stops the stack and the server.
# Outputs land in ./out (OUT_ROOT: run somewhere else; it gets a copy of
# examples/). `deploy/demo.sh --in-process` runs the chain without the
# service (examples/math_task/run.sh chain: strata train).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"
work="${OUT_ROOT:-$root}"
bash "$root/deploy/build.sh" strata
strata="$build_dir/strata"
export STRATA_BIN="$strata" STRATA_TOKENIZER_PACKAGES="$root/tests/policies/tokenizer/reference"

mkdir -p "$work"
if [ "$work" != "$root" ]; then cp -r "$root/examples" "$work/"; fi
cd "$work"
if [ "${1:-}" = "--in-process" ]; then
  exec bash examples/math_task/run.sh chain
fi

# A fresh chain every time: jobs resume from checkpoints in their output
# directory, so a previous run's would otherwise be continued.
rm -rf out/math_task
mkdir -p out/math_task
bash examples/math_task/run.sh fetch
start=$(date +%s)

# The reward server first: the workers are told which port they may call.
here="$work/examples/math_task"
source "$here/reward_server.sh"
start_reward_server out/math_task/reward_queries.jsonl

export STRATA_LOCAL_DIR="$work/out/local"
# The workers keep large allocations in the heap: a step's logits over the
# 151,936-token vocabulary would otherwise be a fresh mmap each time, page
# faults and all (examples/math_task/run.sh does the same; ~2x on 2 cores).
export MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4000000000 MALLOC_TOP_PAD_=268435456
export STRATA_WORKER_FLAGS="--allow-reward-host 127.0.0.1:$reward_port"
trap 'bash "$root/deploy/local/stop.sh"; kill "$server_pid" 2>/dev/null || true' EXIT
bash "$root/deploy/local/start.sh"
export STRATA_ADDR="127.0.0.1:${STRATA_COORD_PORT:-50051}" STRATA_TOKEN="$(cat "$STRATA_LOCAL_DIR/token")"
echo "== reward server on 127.0.0.1:$reward_port (every scored query in out/math_task/reward_queries.jsonl)"

id=$("$strata" submit examples/math_task/sft.yaml)
echo "== sft: job $id"
"$strata" watch "$id"
# One after the other, so that their time per iteration is comparable on
# this machine's two cores; each spans both workers (two ranks, Gloo over
# loopback), half of every batch on each, each rank calling the server.
metrics_port="${STRATA_METRICS_PORT:-9400}"
for stage in remax grpo ppo; do
  id=$("$strata" submit "examples/math_task/$stage.yaml" --set parallel.workers=2 --set "reward.sources=$(reward_sources)")
  echo "== $stage: job $id (parallel.workers=2)"
  "$strata" watch "$id"
  # What Prometheus would scrape: the coordinator's job figures and
  # worker 0's engine counters, moving from one job to the next.
  echo "-- metrics after $stage (curl http://127.0.0.1:$metrics_port/metrics and :$((metrics_port + 1))/metrics)"
  curl -sf "http://127.0.0.1:$metrics_port/metrics" | grep -E '^strata_(iterations_total|jobs\{state="SUCCEEDED"|job_queue_wait_seconds_count)' || true
  curl -sf "http://127.0.0.1:$((metrics_port + 1))/metrics" |
    grep -E '^strata_(generated_tokens_total|cpu_adam_parameters_total|phase_seconds_count|memory_phase_peak_bytes)' || true
done
echo
"$strata" jobs
echo "== chain done in $(( $(date +%s) - start )) s"
echo
echo "== ReMax vs GRPO vs PPO (strata compare out/math_task/{remax,grpo,ppo} --plot out/math_task/remax_vs_ppo.png)"
echo "   math/accuracy: one sampled answer (temperature 1) to each of the 500 held-out problems, judged by the math"
echo "   verifier against its label; (first) is the SFT model's"
"$strata" compare out/math_task/remax out/math_task/grpo out/math_task/ppo --plot out/math_task/remax_vs_ppo.png
echo "(picture: out/math_task/remax_vs_ppo.png; curves for TensorBoard: tensorboard --logdir out/math_task)"
echo

# One held-out problem, rendered with the chat template as the policy sees
# it, answered greedily by each model.
problem=$(head -n1 examples/math_task/data/heldout.jsonl)
python3 -c 'import json, sys; print(json.dumps(json.loads(sys.argv[1])["messages"]))' "$problem" > out/math_task/demo_chat.json
ids=$("$strata" tokenize --tokenizer examples/math_task/tokenizer --messages out/math_task/demo_chat.json \
  --add-generation-prompt --template-arg enable_thinking=false --json |
  python3 -c 'import json, sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))')
echo "== a held-out problem: $(python3 -c 'import json, sys; r = json.loads(sys.argv[1]); print(r["messages"][0]["content"], "(answer", r["answer"] + ")")' "$problem")"
for model in sft remax grpo ppo; do
  printf '%-6s ' "$model"
  # The RL stages trained LoRA adapters of the SFT model.
  adapter=()
  [[ $model != sft ]] && adapter=(--adapter "out/math_task/$model")
  "$strata" generate --model out/math_task/sft "${adapter[@]}" --prompt-ids "$ids" --greedy --max-new-tokens 28 --json |
    python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin).get("text", "")))'
done
