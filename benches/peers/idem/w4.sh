#!/bin/bash
# W4: upsert the day's customer changes into the customers table by customer_id
# (--init: load the customers table, untimed).
source "$(dirname "$0")/_common.sh"
if [ "$INIT" = 1 ]; then
  exec "$IDEM" run "$HERE/customers_init.toml" --date 2024-01-01
fi
exec "$IDEM" run "$HERE/customers_merge.toml" --date 2024-01-01
