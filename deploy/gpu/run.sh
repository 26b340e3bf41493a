#!/usr/bin/env bash
# The GPU session's checks, in stages, each bounded, each writing its output
# under $OUT (the device tool brings that folder back) and a line to
# $OUT/summary.txt. A failed stage is recorded and the next one runs.
# Usage (on the GPU machine, .gpu-debs carried):
#   bash deploy/gpu/run.sh build dist unit      # about 7 minutes with the machine's start
#   bash deploy/gpu/run.sh build bench chain    # then, warm
#   bash deploy/gpu/run.sh build long           # fused vs blocked attention, activation offload (5 minutes at most)
#   bash deploy/gpu/run.sh build rollout        # the rollout engine: CUDA graphs vs eager steps (5 minutes at most)
# Tried on the CPU first: STRATA_GPU_DEVICE=cpu STRATA_GPU_BUILD=build bash deploy/gpu/run.sh chain
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${OUT:-/tmp/strata-gpu-out}"
mkdir -p "$out"
build_dir="$(realpath -m "${STRATA_GPU_BUILD:-$root/build-gpu}")"
device="${STRATA_GPU_DEVICE:-cuda}"
strata="$build_dir/strata"
export LD_LIBRARY_PATH="${STRATA_GPU_PREFIX:-/tmp/strata-prefix}/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Reference scripts (torch, numpy) run under the Python that has them there
# (/opt/torch/.venv), not the image's /usr/bin/python3.
export STRATA_REFERENCE_PYTHON="${STRATA_REFERENCE_PYTHON:-$(command -v python3)}"
summary="$out/summary.txt"

# stage NAME SECONDS: runs the function NAME in a child of this script with
# a time bound, output to $out/NAME.log.
stage() {
  local name="$1" seconds="$2"
  local start=$SECONDS
  timeout --kill-after=10 "$seconds" bash "${BASH_SOURCE[0]}" --one "$name" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $((SECONDS - start)) s" | tee -a "$summary"
  return $rc
}

probe() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  nproc
}

build() {
  bash "$root/deploy/gpu/build.sh" "$build_dir"
}

# The data-parallel checks alone (a minute): the process group on NCCL
# (the staged all-reduce, broadcast, barrier and ZeRO-2's reduce-scatter),
# the bucket layouts it packs with, and a training job on the GPU.
dist() {
  "$build_dir/tests/policies_test" --gtest_filter='ProcessGroupTest.*:FlatBucketTest.*'
  local a=$?
  "$build_dir/tests/e2e_test" --gtest_filter='*_CUDA*'
  local b=$?
  return $((a || b))
}

unit() {
  "$build_dir/tests/offload_test" --gtest_filter='*_CUDA*'
  local a=$?
  "$build_dir/tests/policies_test" --gtest_filter='ProcessGroupTest.*:*_CUDA*'
  local b=$?
  "$build_dir/tests/e2e_test" --gtest_filter='*_CUDA*'
  local c=$?
  # The rest, messages of failures included. Left out by name: the CUDA
  # tests (run above, one binary at a time, not side by side on one GPU),
  # and the tests that read the npm packages (tokenizer references through
  # node, the recipes' tokenizer.json files): node_modules is git-ignored
  # and 479 MB, so it does not travel, and the image has no node. Nor has
  # it kubectl (k8s_manifests) or python3-crc32c (the TensorBoard check).
  # Two torch threads a test, half as many tests as cores: each test's
  # torch would otherwise take every core, and -j16 of those starved the
  # heaviest past their timeout.
  (cd "$build_dir" && OMP_NUM_THREADS=2 ctest -j "$(($(nproc) / 2))" --timeout 200 --output-on-failure \
    -E '_CUDA|plan_validation|fuzz|cuda_compile_check|HfReferenceTest|QwenAndLlama3RecipesRunTheirChain|k8s_manifests|TensorBoardCurves')
  local d=$?
  return $((a || b || c || d))
}

# What failed in `unit`, one test at a time, with its messages; a crash
# under cuda-gdb for the stack.
diag() {
  local offload="$build_dir/tests/offload_test" policies="$build_dir/tests/policies_test"
  "$policies" --gtest_filter='ProcessGroupTest.*'
  for t in RoundTripFromPinnedArena_CUDA MonitorSeesCachingAllocatorBytes_CUDA StreamedLayersMatchHostHomesWithinBudget_CUDA; do
    "$offload" --gtest_filter="DeviceTransferTest.$t" 2>&1 | tail -30
  done
  "$offload" --gtest_filter='NvmeStoreTest.DataSurvivesReopen:IoEngineTest.PosixRoundTripsBufferedAndDirect' 2>&1 | tail -40
  "$policies" --gtest_filter='SafetensorsTest.MetadataIsPreserved' 2>&1 | tail -30
  if command -v cuda-gdb >/dev/null; then
    cuda-gdb -batch -ex run -ex bt --args "$offload" --gtest_filter='DeviceTransferTest.*_CUDA' 2>&1 | tail -60
  fi
  df -h /tmp; mount | grep -E " /tmp | / " || true
}

# Who called address 0: the return address on the stack names the caller.
crash() {
  local gdb=(cuda-gdb -batch -ex run -ex 'x/4a $sp' -ex 'info symbol *(void**)$sp' -ex 'x/3i *(void**)$sp - 8')
  "${gdb[@]}" --args "$build_dir/tests/policies_test" --gtest_filter='SafetensorsTest.MetadataIsPreserved' 2>&1 |
    grep -v "Cuda Driver error\|New Thread\|exited" | tail -25
  "${gdb[@]}" --args "$strata" bench stream --layers 4 --hidden 1024 --vocab 32000 --seq 256 --batch 2 --steps 1 \
    --device "$device" --nvme-dir /tmp/strata-stream-crash --json 2>&1 | grep -v "Cuda Driver error\|New Thread\|exited" | tail -25
  ldd "$build_dir/tests/policies_test" | grep -E "stdc|gcc_s|uring|absl_base"
  ls -la /opt/gcc/lib64/libstdc++.so* /lib/x86_64-linux-gnu/libstdc++.so* 2>&1 | head
}

bench() {
  "$strata" bench transfer --device "$device" --size-mib 1024 --json >"$out/transfer.json" &&
    "$strata" bench stream --layers 16 --hidden 2048 --vocab 32000 --seq 512 --batch 4 --device "$device" \
      --nvme-dir /tmp/strata-stream-bench --json >"$out/stream.json"
}

# One training step over one long sequence (issue 35): libtorch's fused
# attention against the blocked kernel, then the kept layer inputs on the
# host and on NVMe (SSDTrain's offload), at Llama-2-7B width in bf16; on
# the CPU a small shape, to try the stage.
long() {
  local config=examples/llama2-7b/config.json layers=2 tokens=4096,16384
  [ "$device" = cpu ] && config=examples/medium/model.json layers=1 tokens=512
  "$strata" bench long --config "$root/$config" --layers "$layers" --dtype bf16 --tokens "$tokens" \
    --modes blocked,fused,host,nvme --device "$device" --warmup 1 --steps 2 --nvme-dir /tmp/strata-long --json \
    >"$out/long.json"
}

# The rollout engine on the device (issue 32): decode steps replayed as
# CUDA graphs (--steps auto) against eager exact steps, each beside the
# static loop, on the 51M shape and at Llama-2-7B's in bf16 (random
# weights; lengths forced from 10-100% of 128 new tokens); on the CPU the
# 51M shape's exact steps, to try the stage. One JSON object a line.
rollout() {
  local steps="auto exact" dtype=bf16 prompts=64
  local configs=("$root/examples/medium/model.json" "$root/examples/llama2-7b/config.json")
  if [ "$device" = cpu ]; then
    steps=exact dtype=fp32 prompts=8 configs=("$root/examples/medium/model.json")
  fi
  : >"$out/rollout.jsonl"
  for config in "${configs[@]}"; do
    for s in $steps; do
      "$strata" bench rollout --config "$config" --device "$device" --dtype "$dtype" --steps "$s" \
        --prompts "$prompts" --check-greedy false --json >>"$out/rollout.jsonl" || return 1
    done
  done
}

# The tiny chain on the device: SFT and reward model, then ReMax and PPO
# with a real NCCL group of one (parallel.backend=nccl) and, for the peer,
# a gang of one with no group at all (auto), then the comparison table.
chain() {
  local work=/tmp/strata-chain backend=nccl
  [ "$device" = cpu ] && backend=gloo
  rm -rf "$work" && mkdir -p "$work" && cp -r "$root/examples" "$work/" && cd "$work" || return 1
  local set=(--set "memory.device=$device")
  "$strata" --log-level warning train examples/tiny/sft.yaml "${set[@]}" || return 1
  "$strata" --log-level warning train examples/tiny/reward.yaml "${set[@]}" || return 1
  for algorithm in remax ppo; do
    "$strata" --log-level warning train "examples/tiny/$algorithm.yaml" "${set[@]}" --set "parallel.backend=$backend" \
      --out "out/tiny/$algorithm-$backend" || return 1
    "$strata" --log-level warning train "examples/tiny/$algorithm.yaml" "${set[@]}" --out "out/tiny/$algorithm-solo" || return 1
  done
  "$strata" compare out/tiny/remax-$backend out/tiny/remax-solo out/tiny/ppo-$backend out/tiny/ppo-solo
}

if [ "${1:-}" = --one ]; then
  "$2"
  exit
fi
: >"$summary"
for name in "$@"; do
  case "$name" in
    probe) stage probe 60 ;;
    build) stage build 300 || { grep -E "error|Error" "$out/build.log" | head -80 >"$out/build-errors.txt"; break; } ;;
    dist) stage dist 120 ;;
    unit) stage unit 240 ;;
    bench) stage bench 100 ;;
    long) stage long 300 ;;
    rollout) stage rollout 300 ;;
    diag) stage diag 150 ;;
    crash) stage crash 150 ;;
    chain) stage chain 330 ;;
    *) echo "run.sh: unknown stage '$name' (probe, build, dist, unit, diag, crash, bench, long, rollout, chain)" >&2; exit 2 ;;
  esac
done
cat "$summary"
