#!/usr/bin/env bash
# A job with long responses at Llama-2-7B width on this machine, as a user
# would run it: an SFT job (random-weight fp32 model with Llama-2-7B's
# per-layer sizes and LAYERS decoder layers; the tiny example's byte-level
# tokenizer) over one example whose response is cut to TOKENS tokens,
# trained once with each layer's input kept on the device (the peer) and
# once with `placement.activations: nvme`. `strata plan` predicts each run
# first; the table puts the prediction beside the run's own metrics.
# CONFIG names another shape's config.json (LAYERS 0: all of its layers);
# PLAN_ONLY=1 writes the specs and their plans and trains nothing;
# PROMPT_TOKENS sets the prompt's length (16), DTYPE the model's (fp32),
# LORA_RANK > 0 trains adapters of that rank on every projection instead.
#   [ACTIVATIONS="device nvme"] [CONFIG=...] [PLAN_ONLY=1] [PROMPT_TOKENS=16] [DTYPE=fp32] [LORA_RANK=0] bench/plan/long_response_7b_width.sh LAYERS TOKENS [WORK_DIR] [STRATA_BINARY]
set -euo pipefail
layers=${1:?layers}
tokens=${2:?tokens}
work=${3:-out/long-$layers-$tokens}
strata=${4:-build/strata}
mkdir -p "$work/nvme"
prompt_tokens=${PROMPT_TOKENS:-16}
python3 - "$work" "$layers" "$tokens" "${CONFIG:-examples/llama2-7b/config.json}" "$prompt_tokens" <<'PY'
import json, random, sys
work, layers, tokens, config, prompt_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
c = json.load(open(config))
c.update(max_position_embeddings=prompt_tokens + tokens + 64, torch_dtype="float32")
if layers:
    c.update(num_hidden_layers=layers)
json.dump(c, open(f"{work}/config.json", "w"), indent=1)
# Letters and spaces: about a token a character with a byte-level
# vocabulary, so twice the characters always reach the cut.
rng = random.Random(5)
letters = lambda n: "".join(rng.choice("abcdefghij klmnop qrstu vwxyz ") for _ in range(n))
response = letters(2 * tokens)
prompt = "write at length =>" + (letters(2 * prompt_tokens) if prompt_tokens > 16 else "")
with open(f"{work}/sft.jsonl", "w") as f:
    f.write(json.dumps({"prompt": prompt, "response": response}) + "\n")
PY
if [[ ! -f $work/base/config.json ]]; then
  "$strata" init-model --config "$work/config.json" --out "$work/base" --seed 1 >/dev/null
fi
cp examples/tiny/data/tokenizer.json examples/tiny/data/tokenizer_config.json "$work/base/"
lora=""
[[ ${LORA_RANK:-0} -gt 0 ]] && lora=", lora: {rank: $LORA_RANK}"
runs=()
for activations in ${ACTIVATIONS:-device nvme}; do
  cat > "$work/$activations.yaml" <<YAML
algorithm: sft
models:
  actor: {path: $work/base, dtype: ${DTYPE:-fp32}, placement: {activations: $activations}$lora}
data: {train: $work/sft.jsonl, max_prompt_tokens: $prompt_tokens, max_response_tokens: $tokens}
train: {iterations: 1, batch_size: 1, lr: 1.0e-5, seed: 3}
memory: {nvme_dir: $work/nvme}
checkpoint: {every: 0}
output: {dir: $work/$activations}
YAML
  "$strata" plan "$work/$activations.yaml" --json > "$work/$activations.plan.json"
  [[ ${PLAN_ONLY:-0} == 1 ]] && continue
  # The host arena the plan asks for, with 10% to spare.
  host_mib=$(python3 -c "import json, sys; print(int(json.load(open(sys.argv[1]))[0]['peak_bytes']['host'] * 1.1 / 2**20) + 64)" \
    "$work/$activations.plan.json")
  rm -rf "$work/$activations"
  "$strata" train "$work/$activations.yaml" --set memory.host_mib="$host_mib"
  runs+=("$work/$activations")
done
[[ ${PLAN_ONLY:-0} == 1 ]] && exit 0
python3 - "${runs[@]}" <<'PY'
import json, sys
M = 2 ** 20
print("| activations | device peak MiB, run / plan | host arena MiB, run / plan | NVMe MiB, run / plan | RSS MiB, run / plan | update s, run / plan | loss |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for run in sys.argv[1:]:
    rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
    plan = json.load(open(run + ".plan.json"))[0]
    peak = lambda k: max(r.get(f"memory/{k}_peak_bytes", 0) for r in rows) / M
    last = rows[-1]
    p = plan["peak_bytes"]
    print(f"| {run.split('/')[-1]} | {peak('device'):.0f} / {p['device'] / M:.0f} | {peak('host'):.0f} / {p['host'] / M:.0f} | "
          f"{peak('nvme'):.0f} / {p['nvme'] / M:.0f} | {peak('process_rss'):.0f} / {plan['process_rss_bytes'] / M:.0f} | "
          f"{last['time/update_s']:.1f} / {plan['phases']['update']['seconds']:.1f} | {last.get('loss/train_avg', float('nan')):.4f} |")
PY
