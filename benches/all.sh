#!/usr/bin/env bash
# Every peer workload in one invocation, one report: W1-W4 on the shared harness
# (../shared/bench), W5 (a day to moto on 127.0.0.1) and W6 (a TPC-H join backfill)
# beside it, then the table of all six with each one's ratios to the best peer:
#   benches/all.sh --repeat 5
# Writes target/bench-all/<UTC time>/ (the harness's results, w5.json, w6.json and
# report.md). Builds target/release/idem once, first (unless IDEM_BIN is set).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REPEAT=3
while [ $# -gt 0 ]; do
  case $1 in
    --repeat) REPEAT=$2; shift 2;;
    *) echo "usage: benches/all.sh [--repeat N]" >&2; exit 2;;
  esac
done
OUT=$ROOT/target/bench-all/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
if [ -z "${IDEM_BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release -p idem-cli)
  export IDEM_BIN=$ROOT/target/release/idem
fi
{
  echo "build: $(cd "$ROOT" && git rev-parse --short HEAD)$(cd "$ROOT" && git diff --quiet HEAD || echo ' (with uncommitted changes)')"
  echo "started: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "machine: $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB, $(uname -r)"
  echo "command: benches/all.sh --repeat $REPEAT"
} >"$OUT/header.txt"
"$ROOT/benches/run_peers.sh" --engines idem,idem-write,duckdb,polars \
  --workloads w1,w2,w3,w4 --repeat "$REPEAT" --results "$OUT/shared"
"$ROOT/benches/more/run.sh" w5 --rows-per-day 5000000 --repeat "$REPEAT" --json "$OUT/w5.json"
"$ROOT/benches/more/run.sh" w6 --sf 1 --repeat "$REPEAT" --json "$OUT/w6.json"
echo "finished: $(date -u '+%Y-%m-%d %H:%M UTC')" >>"$OUT/header.txt"
python3 "$ROOT/benches/report.py" "$OUT" | tee "$OUT/report.md"
