#!/bin/bash
# W2, written in full every time (see w1.sh).
source "$(dirname "$0")/../idem/_common.sh"
rm -rf "$IDEM_BENCH_OUT"/fct_orders/dt=*
exec "$IDEM" backfill "$HERE/fct_orders.toml" --from "$START" --to "$(last_day)"
