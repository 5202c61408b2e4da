#!/bin/bash
# W5 as users run idem: the day to s3://BUCKET/wh/fct_orders; a re-run of the same
# input is confirmed unchanged without uploading.
source "$(dirname "$0")/../../../peers/idem/_common.sh"
S3=$(cd "$(dirname "$0")" && pwd)
exec "$IDEM" run "$S3/../fct_orders.toml" --date "$DATE" ${IDEM_W5_FLAGS:-}
