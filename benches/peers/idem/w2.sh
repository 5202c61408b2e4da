#!/bin/bash
# W2: backfill fct_orders over a range of days, one process.
source "$(dirname "$0")/_common.sh"
exec "$IDEM" backfill "$HERE/fct_orders.toml" --from "$START" --to "$(last_day)"
