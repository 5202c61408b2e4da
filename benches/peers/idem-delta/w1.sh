#!/bin/bash
# W1 into a Delta table: replace one day's partition in one Delta commit (a re-run of
# unchanged input is confirmed unchanged and commits nothing, as users run it).
source "$(dirname "$0")/../idem/_common.sh"
exec "$IDEM" run "$(dirname "$0")/fct_orders.toml" --date "$DATE"
