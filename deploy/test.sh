#!/usr/bin/env bash
# The README's test command: set up, build everything, run the whole suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"
bash "$root/deploy/build.sh"
cd "$build_dir"
ctest --output-on-failure --timeout 600 -j "$(nproc)" "$@"
