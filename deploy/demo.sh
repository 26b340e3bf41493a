#!/usr/bin/env bash
# The README's main job. Today: build strata, then run the tiny alignment
# demo in-process: SFT -> reward model -> ReMax and PPO, each stage with a
# progress bar, then a side-by-side ReMax vs PPO table and a few sampled
# responses. Outputs land in ./out/tiny (OUT_ROOT overrides the directory the
# chain runs in; it gets a copy of examples/).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"
work="${OUT_ROOT:-$root}"
bash "$root/deploy/build.sh" strata
strata="$build_dir/strata"

mkdir -p "$work"
if [ "$work" != "$root" ]; then cp -r "$root/examples" "$work/"; fi
cd "$work"
start=$(date +%s)
for stage in sft reward remax ppo; do
  echo "== strata train examples/tiny/$stage.yaml"
  "$strata" --log-level warning train "examples/tiny/$stage.yaml"
done
echo "== chain done in $(( $(date +%s) - start )) s"
echo
echo "== ReMax vs PPO (strata compare out/tiny/remax out/tiny/ppo)"
"$strata" compare out/tiny/remax out/tiny/ppo
echo
echo "== sampled responses to 'sun tree =>' (the rule rewards vowels)"
for model in sft remax ppo; do
  printf '%-6s ' "$model"
  "$strata" generate --model "out/tiny/$model" --prompt "sun tree =>" --max-new-tokens 24 --seed 7 --json
done
