#!/usr/bin/env bash
# Run HERE (the CPU machine, which reaches Debian's archive): downloads the
# few Debian packages a GPU machine lacks for a build without the job service
# (-DSTRATA_WITH_SERVICE=OFF) into .gpu-debs/ (git-ignored), about 25 MB.
# Then name .gpu-debs in the device run's `carry` and run deploy/gpu/build.sh
# there. See docs/BENCHMARKS.md ("On a GPU machine").
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="$root/.gpu-debs"
mkdir -p "$out"
cd "$out"
# Runtime libraries and their headers / CMake configs; header-only ones.
# protobuf (protoc for the TensorBoard event messages), prometheus-cpp and
# what its CMake config looks for (civetweb, zlib, curl), ICU for the
# tokenizers, and pkgconf in case the image has no pkg-config. No cairo: the
# GPU build has no `compare --plot` (STRATA_WITH_PLOT=OFF).
apt-get download libabsl20220623 libabsl-dev libyaml-cpp0.7 libyaml-cpp-dev liburing2 liburing-dev \
  nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev googletest \
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32 protobuf-compiler \
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0 \
  libcivetweb-dev libcivetweb1 civetweb zlib1g-dev libcurl4-openssl-dev libcurl4 \
  libicu-dev libicu72 pkgconf-bin libpkgconf3 libre2-dev libre2-9 python3-jinja2 python3-markupsafe 2>&1 | grep -v "couldn't be accessed by user '_apt'" || true
ls -1 "$out"/*.deb | wc -l | xargs echo "fetch-debs: packages in $out:"
