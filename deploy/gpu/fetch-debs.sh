#!/usr/bin/env bash
# Run HERE (the CPU machine, which reaches Debian's archive): downloads the
# few Debian packages a GPU machine lacks for a build without the job service
# (-DSTRATA_WITH_SERVICE=OFF) into .gpu-debs/ (git-ignored), about 3 MB.
# Then name .gpu-debs in the device run's `carry` and run deploy/gpu/build.sh
# there. See docs/BENCHMARKS.md ("On a GPU machine").
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="$root/.gpu-debs"
mkdir -p "$out"
cd "$out"
# Runtime libraries and their headers / CMake configs; header-only ones.
apt-get download libabsl20220623 libabsl-dev libyaml-cpp0.7 libyaml-cpp-dev liburing2 liburing-dev \
  nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev googletest 2>&1 | grep -v "couldn't be accessed by user '_apt'" || true
ls -1 "$out"/*.deb | wc -l | xargs echo "fetch-debs: packages in $out:"
