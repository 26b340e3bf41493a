#!/usr/bin/env bash
# The README's main job. Today: build strata, make a small Llama-shaped model
# directory in HF layout with its own SentencePiece tokenizer, and exercise
# the model CLI (tokenize, generate greedy and sampled, log-probs).
# Output lands in ./out/demo (OUT_DIR overrides).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"
out="${OUT_DIR:-$root/out/demo}"
bash "$root/deploy/build.sh" strata
strata="$build_dir/strata"

model="$out/model"
if [ ! -f "$model/config.json" ]; then
  mkdir -p "$model"
  echo "demo: training a 512-piece SentencePiece tokenizer (spm_train)"
  spm_train --input="$root/examples/generate/corpus.txt" --model_prefix="$out/spm" --vocab_size=512 \
    --model_type=bpe --byte_fallback=true --normalization_rule_name=identity --minloglevel=2 >/dev/null
  cp "$out/spm.model" "$model/tokenizer.model"
  echo "demo: initialising a Llama model (examples/generate/config.json)"
  "$strata" init-model --config "$root/examples/generate/config.json" --out "$model" --seed 1 --init-std 0.05
fi

run() { echo "\$ strata $*"; "$strata" "$@"; echo; }
run tokenize --tokenizer "$model" --text "The policy samples a greedy response." --json
run tokenize --tokenizer "$model" --decode 450,60,8,33 --json
run generate --model "$model" --prompt "The policy samples" --max-new-tokens 16 --greedy --json
run generate --model "$model" --prompt "The policy samples" --max-new-tokens 16 --temperature 0.8 --top-p 0.9 --seed 3 --json
run generate --model "$model" --prompt-ids 1,450,60,8 --max-new-tokens 8 --greedy --dtype bf16 --json
run logprobs --model "$model" --ids 1,450,60,8,33 --json
echo "demo: done (model in $model)"
