#!/usr/bin/env bash
# GaLore against full Adam at Llama-2-7B width, on this machine, after
# bench/plan/remax_vs_ppo_7b_width.sh LAYERS WORK_DIR has written the
# full-parameter jobs' `plan --fit` specs there. For ReMax and PPO, at those
# placements (Adam on NVMe): the full-Adam peer, run again now, and GaLore
# at each rank in RANKS (default 512; the actor's, and PPO's critic's)
# with the paper's update_proj_gap 200 and scale 0.25. Then one table: peak
# memory per tier, optimizer state, NVMe bytes through the update, seconds
# per phase, for the first iteration (its update computes every projection)
# and the last (it computes none).
#   [RANKS="128 512"] bench/plan/galore_vs_full_7b_width.sh WORK_DIR [STRATA_BINARY]
set -euo pipefail
work=${1:?work dir of remax_vs_ppo_7b_width.sh}
strata=${2:-build/strata}
runs=()
for algorithm in remax ppo; do
  [[ -f $work/$algorithm.fit.yaml ]] ||
    { echo "run bench/plan/remax_vs_ppo_7b_width.sh first: $work/$algorithm.fit.yaml is missing" >&2; exit 1; }
  rm -rf "$work/$algorithm-adam"
  "$strata" train "$work/$algorithm.fit.yaml" --set output.dir="$work/$algorithm-adam"
  runs+=("$work/$algorithm-adam")
  for rank in ${RANKS:-512}; do
    galore=(--set "models.actor.galore={rank: $rank}")
    [[ $algorithm == ppo ]] && galore+=(--set "models.critic.galore={rank: $rank}")
    rm -rf "$work/$algorithm-galore$rank"
    "$strata" plan "$work/$algorithm.fit.yaml" "${galore[@]}" > "$work/$algorithm-galore$rank.plan.txt"
    # The small state lives in the host arena: room for it beside the fit.
    "$strata" train "$work/$algorithm.fit.yaml" "${galore[@]}" --set output.dir="$work/$algorithm-galore$rank" \
      --set memory.host_mib=6144
    runs+=("$work/$algorithm-galore$rank")
  done
done
python3 - "${runs[@]}" <<'PY'
import json, sys
G = 2 ** 30
print("| run | device GiB | host arena GiB | NVMe GiB | RSS GiB | optimizer state GiB | NVMe read / written in the update, GB | update s, first / last iteration | rollout / score s | s / iteration, last |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for run in sys.argv[1:]:
    rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
    first, last = rows[0], rows[-1]
    peak = lambda k: max(r.get(f"memory/{k}_peak_bytes", 0) for r in rows) / G
    print(f"| {run.split('/')[-1]} | {peak('device'):.2f} | {peak('host'):.2f} | {peak('nvme'):.2f} | "
          f"{peak('process_rss'):.2f} | {peak('optimizer_state'):.3f} | "
          f"{last.get('nvme/update_read_bytes', 0) / 1e9:.1f} / {last.get('nvme/update_written_bytes', 0) / 1e9:.1f} | "
          f"{first['time/update_s']:.2f} / {last['time/update_s']:.2f} | "
          f"{last['time/rollout_s']:.2f} / {last['time/score_s']:.2f} | {last['time/iteration_s']:.2f} |")
PY
