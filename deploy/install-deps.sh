#!/usr/bin/env bash
# Installs the Debian (bookworm) packages strata needs to build, test and run.
# Idempotent: packages already present are skipped and apt is not touched when
# nothing is missing. Needs root (or sudo) only when something must be installed.
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build pkg-config ccache git
  # tensors: libtorch (CPU) and a fast BLAS for it; Gloo's headers for c10d
  libtorch-dev libopenblas0-pthread libgloo-dev
  # service: gRPC, protobuf, Abseil, Redis client and server
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libhiredis-dev redis-server
  # offload engine
  liburing-dev fio
  # configuration, CLI, JSON
  libcli11-dev nlohmann-json3-dev libyaml-cpp-dev
  # tests: gtest/gmock, reference tokenizer tools, reference Llama forward
  googletest libgtest-dev libgmock-dev sentencepiece python3-torch python3-numpy openssl
  # fuzzing (deploy/fuzz.sh): clang with libFuzzer and the sanitizer runtimes
  clang libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
# redis-server's package starts a system instance; strata starts its own.
if command -v systemctl >/dev/null 2>&1; then $sudo systemctl disable --now redis-server >/dev/null 2>&1 || true; fi
echo "install-deps: done"
