#!/usr/bin/env bash
# Keeps `strata plan` honest: measures this machine's figures (quick grid),
# runs the tiny shape's ReMax and PPO jobs under four placements, and fails
# when a predicted peak of a tier (every phase) is more than 10% off the
# measured one, or the process's peak RSS more than 15% (the tiny jobs'
# ~300 MiB are mostly the process's own baseline, which moves by ~20 MiB
# from run to run; docs/REMAX_VS_PPO.md lists every figure). Times are not checked here
# (a loaded CI machine would make that a timed assertion); the benchmark
# run of bench/plan/validate.py checks them (docs/REMAX_VS_PPO.md).
#   plan_validation_test.sh STRATA_BINARY WORK_DIR
set -euo pipefail
strata=$1
work=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work"
mkdir -p "$work/nvme"
"$strata" bench figures --quick --nvme-dir "$work/nvme" --out "$work/figures.json" >/dev/null
python3 "$here/bench/plan/validate.py" --strata "$strata" --figures "$work/figures.json" --work "$work" \
  --shapes tiny --iterations 2 --check --rss-tolerance 0.15 --time-tolerance 0
rm -rf "$work"
