#!/usr/bin/env bash
# The tree builds with CMake's default generator (Unix Makefiles, what
# `cmake -S . -B build` picks) as with Ninja (deploy/build.sh's). CI builds
# with one; this configures a scratch tree with the other and builds its
# generated sources (the strata_generated target: protoc's outputs, whose
# folders Ninja creates by itself and Make does not).
# Usage: tests/deploy/cmake_generator_test.sh SOURCE_DIR GENERATOR_IN_USE
set -euo pipefail
source_dir="$1"
in_use="$2"
if [ "$in_use" = "Ninja" ]; then other="Unix Makefiles"; else other="Ninja"; fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "cmake_generator_test: FAILED with \"$other\": $*" >&2; exit 1; }

cmake -S "$source_dir" -B "$tmp" -G "$other" -DSTRATA_BUILD_TESTS=OFF >"$tmp/configure.log" 2>&1 \
  || fail "configure: $(tail -20 "$tmp/configure.log")"
cmake --build "$tmp" --target strata_generated >"$tmp/build.log" 2>&1 \
  || fail "building strata_generated: $(tail -20 "$tmp/build.log")"
for f in gen/services/telemetry/tensorboard_event.pb.cc proto/strata/v1/worker.grpc.pb.cc \
         proto/strata/v1/coordinator.pb.h; do
  [ -f "$tmp/$f" ] || fail "$f was not generated"
done
echo "cmake_generator_test: \"$other\" configures and generates every source"
