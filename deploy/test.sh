#!/usr/bin/env bash
# The README's test command: set up, build everything, run the whole suite,
# then a short libFuzzer run of every parser of untrusted bytes
# (STRATA_FUZZ_SECONDS each, default 30; 0 skips it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"
bash "$root/deploy/build.sh"
(cd "$build_dir" && ctest --output-on-failure --timeout 600 -j "$(nproc)" "$@")
fuzz_seconds="${STRATA_FUZZ_SECONDS:-30}"
if [ "$fuzz_seconds" != "0" ]; then
  bash "$root/deploy/fuzz.sh" "$fuzz_seconds"
fi
