"""W5 with Polars: scan the day, transform, collect, write_parquet to the new object,
then delete the partition's older objects."""

import os
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import polars as pl
from _s3 import KEEP, drop_others, endpoint, new_key, parse, raw_files

a = parse()
df = (
    pl.scan_parquet(raw_files(a.data, a.date))
    .filter(pl.col("status") != "cancelled")
    .select(*KEEP, dt=pl.col("created_at").dt.date())
    .collect()
)
url, path = new_key(a.out, a.date)
df.drop("dt").write_parquet(
    url,
    compression="snappy",
    storage_options={
        "aws_endpoint_url": endpoint(),
        "aws_allow_http": "true",
        "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
        "aws_region": os.environ.get("AWS_REGION", "us-east-1"),
    },
)
drop_others(path.rsplit("/", 1)[0], path)
