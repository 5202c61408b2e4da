#!/usr/bin/env bash
# One-day write to a local S3-compatible server (moto) vs local disk, same data, same
# binary: the cost of the object-store commit protocol (upload, marker, apply).
#   benches/s3_write.sh [ROWS_PER_DAY] [REPEAT]
# Needs target/py-venv (created by the test suite or .ci/run) for moto and boto3.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROWS=${1:-1000000}
REPEAT=${2:-3}
IDEM=${IDEM_BIN:-$ROOT/target/release/idem}
PY=$ROOT/target/py-venv/bin/python
(cd "$ROOT" && cargo build --release -p idem-cli)
WORK=$(mktemp -d)
port=$("$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
"$ROOT/target/py-venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$WORK/moto.log" 2>&1 &
moto=$!
trap 'kill $moto; rm -rf "$WORK"' EXIT
export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=bench \
  AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1
for _ in $(seq 100); do "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null && break; sleep 0.2; done
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
TOML
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for where in local s3; do
  times=()
  for i in $(seq "$REPEAT"); do
    if [ "$where" = local ]; then target="$WORK/out/local$i"; else target="s3://bench/out/t$i"; fi
    job "$target" >"$WORK/job.toml"
    s=$(date +%s%N)
    "$IDEM" run "$WORK/job.toml" --date 2026-06-01 >/dev/null
    e=$(date +%s%N)
    times+=("$(( (e - s) / 1000000 ))")
  done
  ms=$(printf '%s\n' "${times[@]}" | median)
  echo "$where: one day of $ROWS raw rows, median of $REPEAT first writes: $ms ms"
done
