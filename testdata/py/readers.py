"""Independent readers for idem's tests: what DuckDB, Polars and pyarrow see in a table.

    readers.py table DIR            rows of the Hive-partitioned table DIR, read by all
                                    three engines; fails unless they agree
    readers.py duckdb SQL           rows of a DuckDB query (the oracle)
    readers.py files DIR            the data files each engine reads from DIR
    readers.py s3-put ENDPOINT DIR s3://BUCKET/PREFIX
                                    uploads DIR's files (creating the bucket)
    readers.py s3-get ENDPOINT s3://BUCKET/PREFIX DIR
                                    downloads what a plain lister sees under PREFIX
    readers.py s3-list ENDPOINT s3://BUCKET/PREFIX
                                    the keys under PREFIX
    readers.py s3-uploads ENDPOINT s3://BUCKET/PREFIX
                                    keys of multipart uploads in progress under PREFIX
    readers.py s3-watch ENDPOINT s3://BUCKET/META/markers/P.json s3://BUCKET/TABLE/P STOPFILE
                                    reads the partition through its marker until STOPFILE
                                    exists: every file the marker lists must exist

Rows are printed as one JSON list: each row an object of column -> value rendered as
text (so DATE and '2026-06-04' compare equal across engines), sorted.
"""

import datetime
import decimal
import json
import sys


def canon(v):
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, datetime.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return v.isoformat(sep=" ")
    if isinstance(v, (datetime.date, decimal.Decimal, int)):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    return str(v)


def rows_out(rows):
    out = [{k: canon(v) for k, v in sorted(r.items())} for r in rows]
    out.sort(key=lambda r: json.dumps(r, sort_keys=True))
    return out


def duckdb_table(d):
    import duckdb

    con = duckdb.connect()
    rel = con.sql(
        f"select * from read_parquet('{d}/**/*.parquet', hive_partitioning=true, union_by_name=true)"
    )
    cols = rel.columns
    return [dict(zip(cols, r)) for r in rel.fetchall()]


def polars_table(d):
    import polars as pl

    df = pl.scan_parquet(d + "/", hive_partitioning=True).collect()
    return df.to_dicts()


def pyarrow_table(d):
    import pyarrow.dataset as ds

    t = ds.dataset(d, format="parquet", partitioning="hive").to_table()
    return t.to_pylist()


def files(d):
    import duckdb
    import polars as pl
    import pyarrow.dataset as ds

    con = duckdb.connect()
    duck = sorted(
        r[0]
        for r in con.sql(
            f"select distinct filename from read_parquet('{d}/**/*.parquet', hive_partitioning=true, filename=true)"
        ).fetchall()
    )
    try:
        pol = sorted(
            set(
                pl.scan_parquet(d + "/", hive_partitioning=True, include_file_paths="_path")
                .select("_path")
                .collect()["_path"]
                .to_list()
            )
        )
    except Exception as e:  # an empty table has no rows, so no paths
        pol = [f"error: {e}"]
    arrow = sorted(ds.dataset(d, format="parquet", partitioning="hive").files)
    return {"duckdb": duck, "polars": pol, "pyarrow": arrow}


def s3_client(endpoint):
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


def s3_put(endpoint, local, url):
    import os

    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    s3 = s3_client(endpoint)
    try:
        s3.create_bucket(Bucket=bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    keys = []
    for root, _, names in os.walk(local):
        for n in sorted(names):
            path = os.path.join(root, n)
            key = prefix.rstrip("/") + "/" + os.path.relpath(path, local)
            s3.upload_file(path, bucket, key.lstrip("/"))
            keys.append(key)
    return sorted(keys)


def split(url):
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return bucket, prefix


def s3_list(endpoint, url):
    bucket, prefix = split(url)
    s3 = s3_client(endpoint)
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(o["Key"] for o in page.get("Contents", []))
    return sorted(keys)


def s3_get(endpoint, url, local):
    import os

    bucket, prefix = split(url)
    s3 = s3_client(endpoint)
    keys = s3_list(endpoint, url)
    for k in keys:
        path = os.path.join(local, os.path.relpath(k, prefix))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        s3.download_file(bucket, k, path)
    return keys


def s3_watch(endpoint, marker_url, part_url, stop):
    """Reads a partition through its marker, as idem does, until `stop` exists."""
    import os

    bucket, marker_key = split(marker_url)
    _, part = split(part_url)
    s3 = s3_client(endpoint)

    def marker():
        try:
            o = s3.get_object(Bucket=bucket, Key=marker_key)
            return o["ETag"], json.loads(o["Body"].read())
        except s3.exceptions.NoSuchKey:
            return None, None

    def exists(key):
        try:
            s3.head_object(Bucket=bucket, Key=key)
            return True
        except Exception:
            return False

    reads, violations, versions = 0, [], set()
    while not os.path.exists(stop):
        etag, m = marker()
        if m is None:
            continue
        missing = [
            f["name"]
            for f in m["files"]
            if not exists(f"{part}/{f['name']}") and not exists(f"{m['staging']}/{f['staged']}")
        ]
        again, _ = marker()
        if again != etag:
            continue  # the marker moved while reading: read again
        reads += 1
        versions.add(m["seq"])
        if missing:
            violations.append({"seq": m["seq"], "missing": missing})
    return {"reads": reads, "markers_seen": len(versions), "violations": violations}


def main():
    cmd, arg = sys.argv[1], sys.argv[2]
    if cmd == "table":
        d = arg.rstrip("/")
        seen = {
            "duckdb": rows_out(duckdb_table(d)),
            "polars": rows_out(polars_table(d)),
            "pyarrow": rows_out(pyarrow_table(d)),
        }
        if not (seen["duckdb"] == seen["polars"] == seen["pyarrow"]):
            for name, rows in seen.items():
                print(f"{name}: {len(rows)} rows, first {rows[:3]}", file=sys.stderr)
            sys.exit("readers disagree")
        print(json.dumps(seen["duckdb"]))
    elif cmd == "duckdb":
        import duckdb

        rel = duckdb.connect().sql(arg)
        cols = rel.columns
        print(json.dumps(rows_out([dict(zip(cols, r)) for r in rel.fetchall()])))
    elif cmd == "files":
        print(json.dumps(files(arg.rstrip("/"))))
    elif cmd == "s3-get":
        print(json.dumps(s3_get(arg, sys.argv[3], sys.argv[4])))
    elif cmd == "s3-uploads":
        bucket, prefix = split(sys.argv[3])
        ups = s3_client(arg).list_multipart_uploads(Bucket=bucket, Prefix=prefix)
        print(json.dumps(sorted(u["Key"] for u in ups.get("Uploads", []))))
    elif cmd == "s3-list":
        print(json.dumps(s3_list(arg, sys.argv[3])))
    elif cmd == "s3-watch":
        print(json.dumps(s3_watch(arg, sys.argv[3], sys.argv[4], sys.argv[5])))
    elif cmd == "s3-put":
        # s3-put ENDPOINT LOCAL_DIR s3://bucket/prefix: create the bucket if needed and
        # upload every file under LOCAL_DIR, keeping relative paths.
        print(json.dumps(s3_put(arg, sys.argv[3], sys.argv[4])))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
