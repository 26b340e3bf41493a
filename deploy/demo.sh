#!/usr/bin/env bash
# The README's main job: build strata, start a local stack (redis-server with
# AOF, the coordinator, two workers, all on loopback), run the tiny alignment
# demo through the job service (SFT -> reward model on one worker each; ReMax
# and PPO with parallel.workers: 2, each on both workers as one data-parallel
# gang), stream each job's progress and the stack's Prometheus metrics, print
# the ReMax vs PPO table, draw it to out/tiny/remax_vs_ppo.png, show a few
# sampled responses, then stop the stack.
# Outputs land in ./out (OUT_ROOT: run somewhere else; it gets a copy of
# examples/). `deploy/demo.sh --in-process` runs the same chain without the
# service (strata train).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"
work="${OUT_ROOT:-$root}"
bash "$root/deploy/build.sh" strata
strata="$build_dir/strata"

mkdir -p "$work"
if [ "$work" != "$root" ]; then cp -r "$root/examples" "$work/"; fi
cd "$work"
# A fresh chain every time: jobs resume from checkpoints in their output
# directory, so a previous run's would otherwise be continued.
rm -rf out/tiny
start=$(date +%s)

if [ "${1:-}" = "--in-process" ]; then
  for stage in sft reward; do
    echo "== strata train examples/tiny/$stage.yaml"
    "$strata" --log-level warning train "examples/tiny/$stage.yaml"
  done
  for stage in remax ppo; do
    echo "== strata train examples/tiny/$stage.yaml --workers 2"
    "$strata" --log-level warning train "examples/tiny/$stage.yaml" --workers 2
  done
else
  export STRATA_LOCAL_DIR="$work/out/local" STRATA_BIN="$strata"
  trap 'bash "$root/deploy/local/stop.sh"' EXIT
  bash "$root/deploy/local/start.sh"
  export STRATA_ADDR="127.0.0.1:${STRATA_COORD_PORT:-50051}" STRATA_TOKEN="$(cat "$STRATA_LOCAL_DIR/token")"
  for stage in sft reward; do
    id=$("$strata" submit "examples/tiny/$stage.yaml")
    echo "== $stage: job $id"
    "$strata" watch "$id"
  done
  # One after the other, so that their time per iteration is comparable on
  # this machine's two cores; each spans both workers (two ranks, Gloo over
  # loopback), half of every batch on each.
  metrics_port="${STRATA_METRICS_PORT:-9400}"
  for stage in remax ppo; do
    id=$("$strata" submit "examples/tiny/$stage.yaml" --set parallel.workers=2)
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
fi
echo "== chain done in $(( $(date +%s) - start )) s"
echo
echo "== ReMax vs PPO (strata compare out/tiny/remax out/tiny/ppo --plot out/tiny/remax_vs_ppo.png)"
"$strata" compare out/tiny/remax out/tiny/ppo --plot out/tiny/remax_vs_ppo.png
echo "(picture: out/tiny/remax_vs_ppo.png; curves for TensorBoard: tensorboard --logdir out/tiny)"
echo
echo "== sampled responses to 'sun tree =>' (the hidden rule rewards vowels)"
for model in sft remax ppo; do
  printf '%-6s ' "$model"
  "$strata" generate --model "out/tiny/$model" --prompt "sun tree =>" --max-new-tokens 24 --seed 7 --json
done
