#!/usr/bin/env bash
# Checks that every tracked C++ file (*.h, *.cc) is formatted as .clang-format
# says, with clang-format 14 exactly: another version formats differently, so
# a check passing here would fail elsewhere.
# Usage: deploy/format-check.sh         list the files that differ; exit 1 if any
#        deploy/format-check.sh --fix   rewrite those files in place
# CLANG_FORMAT overrides the binary (it must still report version 14).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

fix=0
case "${1:-}" in
  "") ;;
  --fix) fix=1 ;;
  *) echo "format-check: unknown argument '$1'; usage: deploy/format-check.sh [--fix]" >&2; exit 2 ;;
esac

clang_format="${CLANG_FORMAT:-}"
if [ -z "$clang_format" ]; then
  clang_format="$(command -v clang-format-14 || true)"
fi
if [ -z "$clang_format" ] || ! "$clang_format" --version >/dev/null 2>&1; then
  echo "format-check: clang-format-14 not found; install the Debian package clang-format-14" \
       "(deploy/install-deps.sh does)" >&2
  exit 1
fi
if ! "$clang_format" --version | grep -q 'clang-format version 14\.'; then
  echo "format-check: $clang_format is not clang-format 14 ($("$clang_format" --version));" \
       "install the Debian package clang-format-14" >&2
  exit 1
fi

if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "format-check: $root is not a git checkout; the check covers tracked files only" >&2
  exit 1
fi
mapfile -t files < <(git ls-files -- '*.h' '*.cc')
if [ ${#files[@]} -eq 0 ]; then
  echo "format-check: no tracked *.h or *.cc files" >&2
  exit 1
fi

present=()
for f in "${files[@]}"; do
  # A tracked file deleted in the work tree is someone's pending change.
  if [ -f "$f" ]; then present+=("$f"); fi
done

# One run over every file, one violation reported per file; anything else it
# prints (a bad .clang-format, a crash) fails the check as a tool error.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
rc=0
"$clang_format" --dry-run --Werror --ferror-limit=1 --style=file "${present[@]}" >/dev/null 2>"$log" || rc=$?
violation='^(.+):[0-9]+:[0-9]+: error: code should be clang-formatted \[-Wclang-format-violations\]$'
mapfile -t differ < <(sed -nE "s/$violation/\1/p" "$log" | sort -u)
if [ "$rc" -ne 0 ] && [ ${#differ[@]} -eq 0 ]; then
  echo "format-check: $clang_format failed (exit $rc):" >&2
  head -n 20 "$log" >&2
  exit 2
fi

if [ ${#differ[@]} -eq 0 ]; then
  echo "format-check: all ${#files[@]} files formatted"
  exit 0
fi
if [ "$fix" -eq 1 ]; then
  "$clang_format" -i --style=file "${differ[@]}"
  echo "format-check: reformatted ${#differ[@]} files:"
  printf '  %s\n' "${differ[@]}"
  exit 0
fi
echo "format-check: ${#differ[@]} of ${#files[@]} files differ from .clang-format:" >&2
printf '  %s\n' "${differ[@]}" >&2
echo "format-check: fix them with deploy/format-check.sh --fix" \
     "(or $clang_format -i --style=file FILE; see the changes first with: $clang_format --style=file FILE | diff FILE -)" >&2
exit 1
