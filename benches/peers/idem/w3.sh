#!/bin/bash
# W3: daily aggregate per store over a range of days.
source "$(dirname "$0")/_common.sh"
exec "$IDEM" backfill "$HERE/agg_store_daily.toml" --from "$START" --to "$(last_day)"
