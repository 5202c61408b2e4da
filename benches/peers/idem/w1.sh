#!/bin/bash
# W1: replace one day's partition of fct_orders.
source "$(dirname "$0")/_common.sh"
exec "$IDEM" run "$HERE/fct_orders.toml" --date "$DATE"
