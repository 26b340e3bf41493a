#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, AddressSanitizer + UBSan, every
# target instrumented) into build-fuzz/ and runs each for SECONDS (default
# 30) from its seed corpus in fuzz/corpus/. New inputs go to
# build-fuzz/corpus/<target>/, never into the repository; a crash fails the
# script and leaves its input in build-fuzz/findings/<target>/. Prints one
# line per target: executions, coverage, corpus size.
# Usage: deploy/fuzz.sh [SECONDS] [TARGET...]   (BUILD_FUZZ_DIR overrides build-fuzz)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_FUZZ_DIR:-$root/build-fuzz}"
seconds="${1:-30}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(job_spec safetensors llama_config tokenizer_json tokenizer_model nvme_store checkpoint_state math_answer
    reward_reply)
fi

bash "$root/deploy/install-deps.sh"
if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSTRATA_FUZZ=ON -DSTRATA_BUILD_TESTS=OFF >/dev/null
fi
start=$(date +%s)
cmake --build "$build" -j "${STRATA_BUILD_JOBS:-$(nproc)}" --target "${targets[@]/%/_fuzzer}"
echo "fuzz: built in $(( $(date +%s) - start ))s"

failed=0
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t" "$build/findings/$t"
  log="$build/findings/$t.log"
  # Leaks in third-party singletons (protobuf, gRPC) are not findings here.
  if ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
     "$build/fuzz/${t}_fuzzer" -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=25 \
       -artifact_prefix="$build/findings/$t/" -print_final_stats=1 \
       "$build/corpus/$t" "$root/fuzz/corpus/$t" >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
    ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
    printf 'fuzz: %-17s %4ss  %9s runs  cov %5s  ft %6s  corpus %s\n' "$t" "$seconds" "$runs" "$cov" "$ft" \
      "$(ls "$build/corpus/$t" | wc -l)"
  else
    echo "fuzz: $t FAILED; input in $build/findings/$t/, log $log" >&2
    tail -40 "$log" >&2
    failed=1
  fi
done
exit $failed
