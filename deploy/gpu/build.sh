#!/usr/bin/env bash
# Run ON THE GPU MACHINE (through the device tool, with .gpu-debs carried):
# unpacks the carried Debian packages into a private prefix, configures
# strata against the machine's Python PyTorch (CUDA) without the job service,
# and builds the binary and the test binaries. Prints the CUDA state CMake
# found. Usage: deploy/gpu/build.sh [build dir]   (default build-gpu)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir="${1:-$root/build-gpu}"
prefix="${STRATA_GPU_PREFIX:-/tmp/strata-prefix}"
debs="$root/.gpu-debs"
if ! ls "$debs"/*.deb >/dev/null 2>&1; then
  echo "build.sh: no packages in $debs; run deploy/gpu/fetch-debs.sh first and carry .gpu-debs" >&2
  exit 2
fi
mkdir -p "$prefix"
for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
multiarch="$prefix/usr/lib/x86_64-linux-gnu"
torch_cmake="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
echo "build.sh: torch $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)') from $torch_cmake"
export PKG_CONFIG_PATH="$multiarch/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export PKG_CONFIG_SYSROOT_DIR="$prefix"
export LD_LIBRARY_PATH="$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_WITH_SERVICE=OFF -DSTRATA_BUILD_DIST=OFF \
  -DCMAKE_PREFIX_PATH="$torch_cmake;$prefix/usr;$multiarch/cmake" \
  -DCMAKE_INCLUDE_PATH="$prefix/usr/include" -DCMAKE_LIBRARY_PATH="$multiarch" \
  -DCMAKE_BUILD_RPATH="$multiarch"
grep -E "^(absl_DIR|yaml-cpp_DIR|Torch_DIR|GTest_DIR)" "$build_dir/CMakeCache.txt" || true
cmake --build "$build_dir" -j "$(nproc)"
echo "build.sh: built $build_dir/strata; export LD_LIBRARY_PATH=$multiarch to run it"
