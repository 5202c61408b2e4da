#!/bin/bash
# W1 into a Delta table, written in full every time: --rewrite publishes the day even
# though its rows equal the live ones (a new commit, as delta-rs's overwrite makes).
source "$(dirname "$0")/../idem/_common.sh"
exec "$IDEM" run "$(dirname "$0")/../idem-delta/fct_orders.toml" --date "$DATE" --rewrite
