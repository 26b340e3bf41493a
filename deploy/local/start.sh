#!/usr/bin/env bash
# Starts a local strata stack on loopback: redis-server (AOF on, in a data
# directory), the coordinator and N workers, all started from the current
# directory (spec paths resolve there). Logs, pids, the token and Redis data
# live in one state directory.
#   STRATA_LOCAL_DIR  state directory            (default ./out/local)
#   STRATA_WORKERS    number of workers          (default 2)
#   STRATA_REDIS_PORT / STRATA_COORD_PORT / STRATA_WORKER_PORT (first worker)
#   STRATA_METRICS_PORT  Prometheus /metrics of the coordinator; worker i
#                        serves on the next ports  (default 9400)
#   STRATA_BIN        the strata binary          (default <repo>/build/strata)
#   STRATA_WORKER_FLAGS  more flags for every worker, e.g. the reward hosts
#                        it may call: "--allow-reward-host 127.0.0.1:8000"
# Prints the environment a client needs (STRATA_ADDR, STRATA_TOKEN).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
state="${STRATA_LOCAL_DIR:-$PWD/out/local}"
workers="${STRATA_WORKERS:-2}"
redis_port="${STRATA_REDIS_PORT:-6390}"
coord_port="${STRATA_COORD_PORT:-50051}"
worker_port="${STRATA_WORKER_PORT:-50061}"
metrics_port="${STRATA_METRICS_PORT:-9400}"
read -ra worker_flags <<< "${STRATA_WORKER_FLAGS:-}"
strata="${STRATA_BIN:-$root/build/strata}"

mkdir -p "$state/redis" "$state/logs" "$state/pids"
if [ ! -s "$state/token" ]; then
  od -An -tx1 -N24 /dev/urandom | tr -d ' \n' > "$state/token"
  chmod 600 "$state/token"
fi

start() {  # name, command...
  local name=$1; shift
  if [ -f "$state/pids/$name" ] && kill -0 "$(cat "$state/pids/$name")" 2>/dev/null; then
    echo "local: $name already running (pid $(cat "$state/pids/$name"))"
    return
  fi
  "$@" >>"$state/logs/$name.log" 2>&1 &
  echo $! > "$state/pids/$name"
}

start redis redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$state/redis" \
  --appendonly yes --appendfsync everysec --save "" --protected-mode yes
for _ in $(seq 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$redis_port" ping >/dev/null || { echo "local: redis did not start; see $state/logs/redis.log" >&2; exit 1; }

start coordinator "$strata" coordinator --listen "127.0.0.1:$coord_port" \
  --redis "redis://127.0.0.1:$redis_port" --token-file "$state/token" --metrics-listen "127.0.0.1:$metrics_port"
for i in $(seq 0 $((workers - 1))); do
  start "worker$i" "$strata" worker --listen "127.0.0.1:$((worker_port + i))" \
    --coordinator "127.0.0.1:$coord_port" --token-file "$state/token" --nvme-dir "$state/nvme$i" \
    --metrics-listen "127.0.0.1:$((metrics_port + 1 + i))" "${worker_flags[@]}"
done

export STRATA_ADDR="127.0.0.1:$coord_port" STRATA_TOKEN="$(cat "$state/token")"
for _ in $(seq 100); do "$strata" jobs >/dev/null 2>&1 && break; sleep 0.1; done
"$strata" jobs >/dev/null || { echo "local: coordinator did not answer; see $state/logs" >&2; exit 1; }
echo "local: redis :$redis_port, coordinator :$coord_port, $workers workers; logs in $state/logs"
echo "local: metrics at http://127.0.0.1:$metrics_port/metrics (coordinator), :$((metrics_port + 1))... (workers)"
echo "export STRATA_ADDR=$STRATA_ADDR STRATA_TOKEN=$STRATA_TOKEN"
