#!/usr/bin/env bash
# One day written to a local S3-compatible server (moto) three ways, same data, same
# binary: in the process, on Ballista's in-process cluster (`--cluster standalone`),
# and on a scheduler and two executor processes on 127.0.0.1. Prints the median of
# REPEAT first writes of each and its ratio to the local run, and checks that all
# three wrote the same digest.
#   benches/cluster.sh [ROWS_PER_DAY] [REPEAT] [PARTITIONS]
# Needs target/py-venv (created by the test suite or .ci/run) for moto.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROWS=${1:-1000000}
REPEAT=${2:-3}
PARTITIONS=${3:-4}
IDEM=${IDEM_BIN:-$ROOT/target/release/idem}
PY=$ROOT/target/py-venv/bin/python
[ -n "${IDEM_BIN:-}" ] || (cd "$ROOT" && cargo build --release -p idem-cli)
WORK=$(mktemp -d)
free_port() { "$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
wait_port() { for _ in $(seq 150); do "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $1), 1)" 2>/dev/null && return 0; sleep 0.2; done; echo "nothing listens on $1" >&2; exit 1; }
port=$(free_port)
"$PY" "$ROOT/testdata/py/s3_server.py" 127.0.0.1 "$port" >"$WORK/moto.log" 2>&1 &
pids=($!)
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=bench \
  AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1
wait_port "$port"
sched=$(free_port)
"$IDEM" scheduler --port "$sched" >"$WORK/scheduler.log" 2>&1 &
pids+=($!)
wait_port "$sched"
for n in 1 2; do
  flight=$(free_port); grpc=$(free_port)
  IDEM_STAGING=$WORK/staging$n "$IDEM" executor --scheduler "127.0.0.1:$sched" --port "$flight" \
    --grpc-port "$grpc" --concurrent-tasks 2 --work-dir "$WORK/ex$n" >"$WORK/ex$n.log" 2>&1 &
  pids+=($!)
  wait_port "$flight"
done
sleep 2 # the executors' first heartbeats
mkdir -p "$WORK/empty"
"$PY" "$ROOT/testdata/py/readers.py" put "$AWS_ENDPOINT_URL" "$WORK/empty" s3://bench/ >/dev/null
"$IDEM" gen orders --out "$WORK/raw" --start 2026-06-01 --days 1 --rows-per-day "$ROWS" >/dev/null
job() { # job TARGET
  cat <<TOML
name = "fct_orders"
[sources.orders]
path = "$WORK/raw/"
partitioned_by = ["created_date"]
[transform]
sql = "select order_id, customer_id, store_id, amount_usd, status, cast(created_at as date) as dt from orders where created_date = \$run_date and status <> 'cancelled'"
[target]
path = "$1"
partition_by = ["dt"]
[execution]
partitions = $PARTITIONS
TOML
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
base=
for where in local standalone processes; do
  case $where in
    local) flag=() ;;
    standalone) flag=(--cluster standalone) ;;
    processes) flag=(--cluster "df://127.0.0.1:$sched") ;;
  esac
  times=()
  for i in $(seq "$REPEAT"); do
    target="s3://bench/out/$where$i"
    job "$target" >"$WORK/job.toml"
    s=$(date +%s%N)
    out=$("$IDEM" run "$WORK/job.toml" --date 2026-06-01 --json "${flag[@]}")
    e=$(date +%s%N)
    times+=("$(( (e - s) / 1000000 ))")
    digest=$(printf '%s' "$out" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['partitions'][0]['digest'])")
    if [ -z "${want:-}" ]; then want=$digest; elif [ "$digest" != "$want" ]; then
      echo "$where wrote digest $digest, the local run $want" >&2; exit 1; fi
  done
  ms=$(printf '%s\n' "${times[@]}" | median)
  [ -n "$base" ] || base=$ms
  ratio=$("$PY" -c "print(f'{$ms / $base:.2f}')")
  echo "$where: one day of $ROWS raw rows to moto, median of $REPEAT first writes: $ms ms (${ratio}x local)"
done
echo "digest of every run: $want"
