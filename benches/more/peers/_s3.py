"""Helpers of the Python W5 contestants: arguments, the server from the environment,
and the replace step of engines without a partition overwrite of their own."""

import argparse
import glob
import os
import uuid

KEEP = ["order_id", "customer_id", "store_id", "amount_usd", "status"]


def parse():
    ap = argparse.ArgumentParser(
        description="W5: a day of raw orders to s3://BUCKET/wh"
    )
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True, help="s3://BUCKET/PREFIX")
    ap.add_argument("--date", required=True)
    return ap.parse_args()


def raw_files(data, day):
    return sorted(glob.glob(f"{data}/raw/orders/created_date={day}/*.parquet"))


def endpoint():
    return os.environ["AWS_ENDPOINT_URL"]


def store():
    from pyarrow import fs

    return fs.S3FileSystem(
        endpoint_override=endpoint(),
        scheme="http",
        access_key=os.environ["AWS_ACCESS_KEY_ID"],
        secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        region=os.environ.get("AWS_REGION", "us-east-1"),
    )


def new_key(out, day):
    """A key no earlier run used, in the partition's prefix: (s3 URL, bucket/key path)."""
    path = f"{out.removeprefix('s3://')}/fct_orders/dt={day}/part-{uuid.uuid4().hex}.parquet"
    return f"s3://{path}", path


def drop_others(day_prefix, keep):
    """Deletes the partition's objects other than `keep` (bucket/key paths)."""
    from pyarrow import fs

    s = store()
    for info in s.get_file_info(fs.FileSelector(day_prefix, allow_not_found=True)):
        if info.type == fs.FileType.File and info.path != keep:
            s.delete_file(info.path)
