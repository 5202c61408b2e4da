#!/usr/bin/env bash
# The merge benchmark: a 5 million-row customer dimension, 500 thousand changes of
# which 10% are new keys, upserted by idem, delta-rs (MERGE) and DuckDB (full rewrite),
# in one run of the peer harness on the same data:
#   benches/merge_peers.sh [--repeat 3] [--engines idem,deltalake,duckdb]
# The harness's W4 uses 20% new keys; this generates the 10% dataset into its own data
# folder first (the harness reuses a dataset whose arguments match), then runs W4 only.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH=${IDEM_PEER_BENCH:-$ROOT/../shared/bench}
VENV=${PEERS_VENV:-$HOME/.cache/peers-venv}
DATA=${MERGE_BENCH_DATA:-${TMPDIR:-/tmp}/bench/data-merge10}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r "$BENCH/requirements.txt"
fi
have=$("$VENV/bin/python" -c "import json,sys; a=json.load(open(sys.argv[1]))['args']; print(a['customers'], a['changes'], a['new_fraction'])" "$DATA/w4/manifest.json" 2>/dev/null || true)
if [ "$have" != "5000000 500000 0.1" ]; then
  rm -rf "$DATA/w4"
  "$VENV/bin/python" "$BENCH/gen_orders.py" --out "$DATA/w4" \
    --customers 5000000 --changes 500000 --new-fraction 0.1 >/dev/null
fi
exec "$ROOT/benches/run_peers.sh" --engines idem,deltalake,duckdb --workloads w4 \
  --data "$DATA" "$@"
