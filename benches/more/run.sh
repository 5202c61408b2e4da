#!/usr/bin/env bash
# The project's own workloads beside the shared bench, idem and the peers in one run:
#   benches/more/run.sh w5 --engines idem-write,idem,duckdb,polars,pyarrow --repeat 3
#   benches/more/run.sh w6 --engines idem,duckdb,polars,duckdb-bulk --repeat 3
# W5: W1's day written to an S3-compatible server on 127.0.0.1 (moto). W6: a 30-day
# backfill of a TPC-H join (lineitem, orders, customer, nation) per ship date.
# The first argument picks the workload, the others go to its runner (w5.py, w6.py).
# Builds target/release/idem first (unless IDEM_BIN is set) and keeps the Python
# environment in target/bench-more-venv.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORKLOAD=${1:?usage: run.sh w5|w6 [ARGS]}
shift
VENV=$ROOT/target/bench-more-venv
if [ ! -x "$VENV/bin/python" ] || ! cmp -s "$ROOT/benches/more/requirements.txt" "$VENV/.ready"; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r "$ROOT/benches/more/requirements.txt"
  cp "$ROOT/benches/more/requirements.txt" "$VENV/.ready"
fi
command -v /usr/bin/time >/dev/null || apt-get install -y time
if [ -z "${IDEM_BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release -p idem-cli)
  export IDEM_BIN=$ROOT/target/release/idem
fi
PATH="$VENV/bin:$PATH" exec "$VENV/bin/python" "$ROOT/benches/more/$WORKLOAD.py" "$@"
