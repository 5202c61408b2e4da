#!/usr/bin/env bash
# Ranks idem among the peer engines of ../shared/bench in one run, on the same data:
#   benches/run_peers.sh --engines idem,duckdb,polars --workloads w1 --repeat 3
# Every argument goes to run_peers.py. Builds target/release/idem first (up to 45
# minutes on 2 cores the first time; not when IDEM_BIN names a binary) and keeps the
# peers' Python environment in $PEERS_VENV (default ~/.cache/peers-venv).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH=${IDEM_PEER_BENCH:-$ROOT/../shared/bench}
VENV=${PEERS_VENV:-$HOME/.cache/peers-venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r "$BENCH/requirements.txt"
fi
command -v /usr/bin/time >/dev/null || apt-get install -y time
if [ -z "${IDEM_BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release -p idem-cli)
  IDEM_BIN=$ROOT/target/release/idem
fi
PEERS=$(mktemp -d)
trap 'rm -rf "$PEERS"' EXIT
for d in "$BENCH"/peers/*; do ln -s "$d" "$PEERS/"; done
ln -s "$ROOT/benches/peers/idem" "$PEERS/idem"
ln -s "$ROOT/benches/peers/idem-write" "$PEERS/idem-write"
ln -s "$ROOT/benches/peers/idem-delta" "$PEERS/idem-delta"
ln -s "$ROOT/benches/peers/idem-delta-write" "$PEERS/idem-delta-write"
IDEM_BIN="$IDEM_BIN" "$VENV/bin/python" "$BENCH/run_peers.py" --peers "$PEERS" "$@"
