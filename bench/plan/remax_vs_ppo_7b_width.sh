#!/usr/bin/env bash
# ReMax vs PPO at Llama-2-7B width on this machine, as a user would do it:
# random-weight models with Llama-2-7B's per-layer sizes (hidden 4096,
# intermediate 11008, 32 heads, vocabulary 32000; bf16, or DTYPE=fp32 where
# the CPU has no fast bf16 products: libtorch 1.13 on an AVX2-only CPU
# multiplies bf16 in a slow reference loop) and LAYERS decoder
# layers; `strata plan --fit` picks each job's placement for this machine
# (CPU device, its RAM, the free disk) and writes the spec; `strata train`
# runs it; `strata compare` draws both. docs/REMAX_VS_PPO.md has a run.
#   bench/plan/remax_vs_ppo_7b_width.sh LAYERS [WORK_DIR] [STRATA_BINARY]
set -euo pipefail
layers=${1:?layers}
work=${2:-out/7b-width-$layers}
strata=${3:-build/strata}
dtype=${DTYPE:-bf16}
mkdir -p "$work/nvme"
python3 - "$work/config.json" "$layers" <<'PY'
import json, sys
c = json.load(open("examples/llama2-7b/config.json"))
c["num_hidden_layers"] = int(sys.argv[2])
c["max_position_embeddings"] = 256
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
for head in lm scalar; do
  dir=$work/$([[ $head == lm ]] && echo base || echo reward)
  if [[ ! -f $dir/config.json ]]; then
    "$strata" init-model --config "$work/config.json" --out "$dir" --head $head --dtype $dtype --seed 1 >/dev/null
  fi
done
cp examples/tiny/data/tokenizer.json examples/tiny/data/tokenizer_config.json "$work/base/"
ram=$(awk '/MemTotal/ {printf "%.0f", $2 * 1024}' /proc/meminfo)
for algorithm in remax ppo; do
  critic=""
  [[ $algorithm == ppo ]] && critic="  critic: {path: $work/reward, dtype: $dtype}"
  cat > "$work/$algorithm.yaml" <<YAML
algorithm: $algorithm
models:
  actor: {path: $work/base, dtype: $dtype}
  reference: {path: $work/base, dtype: $dtype}
  reward: {path: $work/reward, dtype: $dtype}
$critic
data: {train: examples/tiny/data/prompts.jsonl, max_prompt_tokens: 16}
train: {iterations: 2, batch_size: 2, lr: 1.0e-6, seed: 3}
generation: {max_new_tokens: 8}
memory: {nvme_dir: $work/nvme}
output: {dir: $work/$algorithm}
YAML
  # Leave 2 GiB of the RAM and 8 GiB of the disk (the saved actor) to the rest.
  free_nvme=$(df -B1 --output=avail "$work/nvme" | tail -1)
  "$strata" plan "$work/$algorithm.yaml" --fit "device=cpu,host=$((ram - (2 << 30)))B,nvme=$((free_nvme - (8 << 30)))B" \
    --write "$work/$algorithm.fit.yaml"
  rm -rf "$work/$algorithm"
  "$strata" train "$work/$algorithm.fit.yaml"
done
"$strata" compare "$work/remax" "$work/ppo" --plot "$work/remax_vs_ppo.png"
