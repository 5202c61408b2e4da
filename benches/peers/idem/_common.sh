# Shared by the w1..w3 wrappers: parse the harness's arguments, export them for the
# job files' ${...} paths, and find the idem binary.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
IDEM=${IDEM_BIN:-$HERE/../../../target/release/idem}
INIT=0
while [ $# -gt 0 ]; do
  case $1 in
    --data) export IDEM_BENCH_DATA=$2; shift 2;;
    --out) export IDEM_BENCH_OUT=$2; shift 2;;
    --date) DATE=$2; shift 2;;
    --start) START=$2; shift 2;;
    --days) DAYS=$2; shift 2;;
    --init) INIT=1; shift;;
    *) shift;;
  esac
done
last_day() { date -u -d "$START + $((DAYS - 1)) days" +%Y-%m-%d; }
