#!/bin/bash
# W6 as users run idem: one backfill of the range; a re-run of unchanged input is
# confirmed unchanged date by date without writing.
source "$(dirname "$0")/../../../peers/idem/_common.sh"
HERE6=$(cd "$(dirname "$0")" && pwd)
exec "$IDEM" backfill "$HERE6/../ship_revenue.toml" --from "$START" --to "$(last_day)" ${IDEM_W6_FLAGS:-}
