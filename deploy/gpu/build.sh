#!/usr/bin/env bash
# Run ON THE GPU MACHINE (through the device tool, with .gpu-debs carried):
# unpacks the carried Debian packages into a private prefix, configures
# strata against the machine's Python PyTorch (CUDA, with c10d's Gloo and
# NCCL) without the job service and without `compare --plot`, and builds the
# binary and the test binaries. Keeps going past a failed file so that one
# run shows every error. Prints what CMake found.
# Usage: deploy/gpu/build.sh [build dir]   (default build-gpu)
# Extra CMake arguments: STRATA_GPU_CMAKE_ARGS.
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
echo "build.sh: torch $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)') from $torch_cmake"
echo "build.sh: $(g++ --version | head -1); cmake $(cmake --version | head -1 | awk '{print $3}'); $(nproc) cores"
# NCCL's header and library come with the nvidia-nccl wheel beside torch.
nccl_root="$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)"
echo "build.sh: NCCL from ${nccl_root:-nowhere}"
# ProcessGroupNCCL::Options holds NCCL's ncclConfig_t, allocated by our code
# (Options::create is inline) and filled by libtorch_cuda: the header we
# compile with must be the NCCL torch runs with, or the layouts differ.
if [[ -n "$nccl_root" && -f "$nccl_root/include/nccl.h" ]]; then
  header_nccl="$(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{printf "%s%s", sep, $3; sep="."}' "$nccl_root/include/nccl.h")"
  torch_nccl="$(python3 -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null || echo unknown)"
  echo "build.sh: nccl.h is $header_nccl, torch runs NCCL $torch_nccl"
  if [[ "$header_nccl" != "$torch_nccl" ]]; then
    echo "build.sh: WARNING: nccl.h $header_nccl is not torch's NCCL $torch_nccl; the NCCL group's options may be laid out differently" >&2
  fi
fi
export PATH="$prefix/usr/bin:$PATH"  # protoc
export PKG_CONFIG_PATH="$multiarch/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export PKG_CONFIG_SYSROOT_DIR="$prefix"
export LD_LIBRARY_PATH="$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LIBRARY_PATH="$multiarch${LIBRARY_PATH:+:$LIBRARY_PATH}"  # -lcivetweb and the like
pkg_config_arg=()
if ! command -v pkg-config >/dev/null; then pkg_config_arg=(-DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf"); fi
# CMake 4's FindProtobuf there gave protobuf::libprotobuf no library for
# this build type, so the binaries name it themselves (-lprotobuf, last).
# shellcheck disable=SC2086 # STRATA_GPU_CMAKE_ARGS is a list of arguments
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_WITH_SERVICE=OFF \
  -DSTRATA_WITH_PLOT=OFF -DTORCH_CUDA_ARCH_LIST=9.0 ${nccl_root:+-DSTRATA_NCCL_ROOT="$nccl_root"} \
  "${pkg_config_arg[@]}" -DProtobuf_PROTOC_EXECUTABLE="$prefix/usr/bin/protoc" \
  -DCMAKE_PREFIX_PATH="$torch_cmake;$prefix/usr;$multiarch/cmake" \
  -DCMAKE_INCLUDE_PATH="$prefix/usr/include" -DCMAKE_LIBRARY_PATH="$multiarch" \
  -DCMAKE_BUILD_RPATH="$multiarch" -DCMAKE_CXX_STANDARD_LIBRARIES="-lprotobuf" ${STRATA_GPU_CMAKE_ARGS:-}
grep -E "^(absl_DIR|yaml-cpp_DIR|Torch_DIR|GTest_DIR|STRATA_GLOO_INCLUDE_DIR|STRATA_NCCL)" "$build_dir/CMakeCache.txt" || true
cmake --build "$build_dir" -j "$(nproc)" -- -k 0
echo "build.sh: built $build_dir/strata; export LD_LIBRARY_PATH=$multiarch to run it"
