#!/usr/bin/env bash
# LoRA against full-parameter training at Llama-2-7B width, on this machine,
# after bench/plan/remax_vs_ppo_7b_width.sh LAYERS WORK_DIR has run the
# full-parameter jobs there (their `plan --fit` specs and metrics are the
# peer). For ReMax and PPO, two LoRA runs (rank 16 on every projection of
# the actor, and of PPO's critic):
#   same: the full job's placements (step_in_backward off: LoRA steps the
#         adapters after backward), so the difference is LoRA's alone;
#   fit:  the placement `strata plan --fit` picks for the LoRA job.
# Then one table of both: peak memory per tier, NVMe bytes through the
# update, seconds per phase (the last iteration).
#   bench/plan/lora_vs_full_7b_width.sh WORK_DIR [STRATA_BINARY]
set -euo pipefail
work=${1:?work dir of remax_vs_ppo_7b_width.sh}
strata=${2:-build/strata}
ram=$(awk '/MemTotal/ {printf "%.0f", $2 * 1024}' /proc/meminfo)
runs=()
for algorithm in remax ppo; do
  [[ -f $work/$algorithm.fit.yaml && -f $work/$algorithm/metrics.jsonl ]] ||
    { echo "run bench/plan/remax_vs_ppo_7b_width.sh first: $work/$algorithm is missing" >&2; exit 1; }
  lora=(--set "models.actor.lora={rank: 16}")
  [[ $algorithm == ppo ]] && lora+=(--set "models.critic.lora={rank: 16}")
  rm -rf "$work/$algorithm-lora-same" "$work/$algorithm-lora-fit"
  "$strata" train "$work/$algorithm.fit.yaml" "${lora[@]}" --set output.dir="$work/$algorithm-lora-same" \
    --set models.actor.placement.step_in_backward=false \
    $([[ $algorithm == ppo ]] && echo --set models.critic.placement.step_in_backward=false)
  free_nvme=$(df -B1 --output=avail "$work/nvme" | tail -1)
  "$strata" plan "$work/$algorithm.yaml" "${lora[@]}" \
    --fit "device=cpu,host=$((ram - (2 << 30)))B,nvme=$((free_nvme - (8 << 30)))B" --write "$work/$algorithm-lora.fit.yaml"
  "$strata" train "$work/$algorithm-lora.fit.yaml" --set output.dir="$work/$algorithm-lora-fit"
  runs+=("$work/$algorithm" "$work/$algorithm-lora-same" "$work/$algorithm-lora-fit")
done
python3 - "${runs[@]}" <<'PY'
import json, sys
G = 2 ** 30
print("| run | device GiB | host arena GiB | NVMe GiB | RSS GiB | optimizer state GiB | NVMe read / written in the update, GB | rollout / score / update s | s / iteration |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for run in sys.argv[1:]:
    rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
    last = rows[-1]
    peak = lambda k: max(r.get(f"memory/{k}_peak_bytes", 0) for r in rows) / G
    print(f"| {run.split('/')[-1]} | {peak('device'):.2f} | {peak('host'):.2f} | {peak('nvme'):.2f} | "
          f"{peak('process_rss'):.2f} | {peak('optimizer_state'):.3f} | "
          f"{last.get('nvme/update_read_bytes', 0) / 1e9:.1f} / {last.get('nvme/update_written_bytes', 0) / 1e9:.1f} | "
          f"{last['time/rollout_s']:.2f} / {last['time/score_s']:.2f} / {last['time/update_s']:.2f} | "
          f"{last['time/iteration_s']:.2f} |")
PY
