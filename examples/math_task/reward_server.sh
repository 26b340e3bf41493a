# Sourced by examples/math_task/run.sh and deploy/demo.sh: the math task's
# reward server on a free loopback port, and the reward source that names it.
# Needs $here, the directory of reward_server.py.

# Starts the server (it prints the port it took first), logging every scored
# query to $1 as JSON lines and its requests to ${1%.jsonl}.log; sets
# server_pid and reward_port. The caller kills $server_pid when done.
start_reward_server() {
  local fifo
  fifo=$(mktemp -u) && mkfifo "$fifo"
  python3 "$here/reward_server.py" --port 0 --log "$1" > "$fifo" 2> "${1%.jsonl}.log" &
  server_pid=$!
  read -r reward_port < "$fifo"
  rm -f "$fifo"
  [ -n "$reward_port" ] || { echo "math_task: the reward server did not start; see ${1%.jsonl}.log" >&2; exit 1; }
}

# The specs name port 8000; this is their reward.sources with the port the
# server took, for --set "reward.sources=$(reward_sources)".
reward_sources() {
  echo "[{name: server, kind: remote, url: 'http://127.0.0.1:$reward_port/score', batch_size: 32, max_in_flight: 2, timeout_s: 30}]"
}
