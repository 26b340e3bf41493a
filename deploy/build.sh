#!/usr/bin/env bash
# Installs dependencies if missing, configures and builds strata.
# Usage: deploy/build.sh [ninja targets...]   (BUILD_DIR overrides ./build)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${BUILD_DIR:-$root/build}"

bash "$root/deploy/install-deps.sh"
if [ ! -f "$build_dir/build.ninja" ]; then
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
jobs="${STRATA_BUILD_JOBS:-$(nproc)}"
start=$(date +%s)
cmake --build "$build_dir" -j "$jobs" ${1:+--target "$@"}
echo "build: done in $(( $(date +%s) - start ))s ($build_dir)"
