#!/bin/bash
# W3, written in full every time (see w1.sh).
source "$(dirname "$0")/../idem/_common.sh"
rm -rf "$IDEM_BENCH_OUT"/agg_store_daily/dt=*
exec "$IDEM" backfill "$HERE/agg_store_daily.toml" --from "$START" --to "$(last_day)"
