#!/usr/bin/env bash
# Beyond RAM: one ReMax job on a 3.43B-parameter Llama shape whose training
# state (fp32 master weights, Adam moments, gradients: 54.9 GB) is twice
# this machine's 24 GiB of RAM. Makes the random-weight model (bf16,
# 6.9 GB), asks the planner what fits, and runs examples/scale/remax.yaml.
# A benchmark, not a test: about 10 minutes on 2 cores, ~62 GB of disk at
# the peak (NVMe Adam tiles 41 GB, the reference's layers 6.9 GB, the model
# and the saved actor 6.9 GB each). Run from the repository root:
#   bash examples/scale/run.sh [STRATA_BINARY]
set -euo pipefail
strata=${1:-build/strata}
out=out/scale
mkdir -p "$out/nvme"
if [[ ! -f $out/base/model.safetensors ]]; then
  echo "== making the random-weight model in $out/base (bf16)"
  "$strata" init-model --config examples/scale/model.json --out "$out/base" --dtype bf16 --seed 1
  cp examples/tiny/data/tokenizer.json examples/tiny/data/tokenizer_config.json "$out/base/"
fi
free_nvme=$(df -B1 --output=avail "$out/nvme" | tail -1)
ram=$(awk '/MemTotal/ {printf "%.0f", $2 * 1024}' /proc/meminfo)
echo "== strata plan: this machine (CPU device, ${ram} B RAM, ${free_nvme} B free for NVMe)"
"$strata" plan examples/scale/remax.yaml --fit "device=cpu,host=${ram}B,nvme=${free_nvme}B"
echo "== strata plan: the spec as written"
"$strata" plan examples/scale/remax.yaml
echo "== strata train (peak RSS from /usr/bin/time)"
rm -rf "$out/remax"
/usr/bin/time -v "$strata" train examples/scale/remax.yaml 2> >(tee "$out/time.txt" >&2)
python3 - "$out/remax/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows:
    keys = ["time/iteration_s", "time/rollout_s", "time/score_s", "time/update_s"]
    print("iteration", r["iteration"], " ".join(f"{k.split('/')[1]} {r[k]:.1f}" for k in keys))
    for p in ("rollout", "score", "update"):
        print(f"  {p:8s}", " ".join(f"{t} {r.get(f'memory/{p}/{t}_peak_bytes', 0) / 2**30:.2f} GiB"
                                     for t in ("device", "host", "nvme")))
    print("  process peak RSS %.2f GiB" % (r["memory/process_rss_peak_bytes"] / 2**30))
    print("  NVMe traffic", " ".join(f"{p} read {r.get(f'nvme/{p}_read_bytes', 0) / 1e9:.1f} GB / written "
                                     f"{r.get(f'nvme/{p}_written_bytes', 0) / 1e9:.1f} GB;"
                                     for p in ("rollout", "score", "update")))
PY
grep -E "Maximum resident|Elapsed" "$out/time.txt"
