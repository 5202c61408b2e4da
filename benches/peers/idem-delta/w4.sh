#!/bin/bash
# W4 into a Delta table: upsert the customer changes by customer_id, committed
# copy-on-write (--init: load the customers table, untimed).
source "$(dirname "$0")/../idem/_common.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "$INIT" = 1 ]; then
  exec "$IDEM" run "$HERE/customers_init.toml" --date 2024-01-01
fi
exec "$IDEM" run "$HERE/customers_merge.toml" --date 2024-01-01
