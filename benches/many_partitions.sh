#!/usr/bin/env bash
# One day of orders (the project's generator) written into many partitions a date:
# `partition_by = ["dt", "bucket"]` with `customer_id % N as bucket`, for each N.
# Times idem written in full, idem re-run (every partition unchanged), and DuckDB's
# `COPY … PARTITION_BY` of the same rows when a Python with duckdb is given:
#   IDEM_BIN=target/release/idem PEER_PYTHON=~/.cache/peers-venv/bin/python \
#     benches/many_partitions.sh [ROWS] [N...]
# Prints one line per contestant and N: wall seconds and peak RSS (MiB).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
IDEM=${IDEM_BIN:-$ROOT/target/release/idem}
ROWS=${1:-1000000}
shift || true
COUNTS=("$@")
[ ${#COUNTS[@]} -gt 0 ] || COUNTS=(50 500 5000)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$IDEM" gen orders --out "$WORK/raw/orders" --days 1 --rows-per-day "$ROWS" \
  --customers 100000 2>/dev/null

timed() { # LABEL N CMD...: runs CMD, prints its wall time and peak RSS
  local label=$1 n=$2
  shift 2
  /usr/bin/time -f "%e %M" -o "$WORK/time" "$@" >/dev/null 2>"$WORK/err" || {
    cat "$WORK/err" >&2
    exit 1
  }
  read -r wall kib <"$WORK/time"
  printf '%-14s %6s partitions  %7.2f s  %6d MiB\n' "$label" "$n" "$wall" $((kib / 1024))
}

for n in "${COUNTS[@]}"; do
  cat >"$WORK/job.toml" <<EOF
name = "buckets"
[sources.orders]
path = "$WORK/raw/orders/"
partitioned_by = ["created_date"]
[transform]
sql = """
select order_id, customer_id, store_id, amount_usd, status,
       cast(created_at as date) as dt, customer_id % $n as bucket
from orders where created_date = \$run_date and status <> 'cancelled'
"""
[target]
path = "$WORK/out/idem/"
partition_by = ["dt", "bucket"]
EOF
  rm -rf "$WORK/out"
  timed idem-write "$n" "$IDEM" run "$WORK/job.toml" --date 2026-06-01
  timed idem-rerun "$n" "$IDEM" run "$WORK/job.toml" --date 2026-06-01
  if [ -n "${PEER_PYTHON:-}" ]; then
    timed duckdb "$n" "$PEER_PYTHON" -c "
import duckdb
duckdb.connect().execute('''
copy (select order_id, customer_id, store_id, amount_usd, status,
             cast(created_at as date) as dt, customer_id % $n as bucket
      from read_parquet('$WORK/raw/orders/*/*.parquet', hive_partitioning = true)
      where created_date = '2026-06-01' and status <> 'cancelled')
to '$WORK/out/duckdb' (format parquet, partition_by (dt, bucket), compression snappy)''')"
  fi
done
