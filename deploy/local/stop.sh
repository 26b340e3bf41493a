#!/usr/bin/env bash
# Stops what deploy/local/start.sh started (workers, coordinator, redis).
set -uo pipefail
state="${STRATA_LOCAL_DIR:-$PWD/out/local}"
[ -d "$state/pids" ] || { echo "local: nothing to stop in $state"; exit 0; }
for pidfile in "$state"/pids/worker* "$state/pids/coordinator" "$state/pids/redis"; do
  [ -f "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -f "$pidfile"
done
echo "local: stopped (state kept in $state)"
