"""Independent readers for idem's tests: what DuckDB, Polars and pyarrow see in a table.

    readers.py table DIR            rows of the Hive-partitioned table DIR, read by all
                                    three engines; fails unless they agree
    readers.py duckdb SQL           rows of a DuckDB query (the oracle)
    readers.py delta DIR [VERSION]  rows of the Delta table DIR (at VERSION, else the
                                    latest), read through the Delta log by the deltalake
                                    package, Polars and DuckDB's delta extension; fails
                                    unless they agree
    readers.py delta-log DIR        the Delta table's version and history (deltalake)
    readers.py delta-overwrite DIR COLUMN VALUE
                                    another writer (deltalake's write_deltalake)
                                    overwrites the rows where COLUMN = VALUE with
                                    themselves, as a Spark `replaceWhere` would
    readers.py delta-write DIR MODE SQL [PARTITION_BY [PREDICATE [CONFIG]]]
                                    another writer (deltalake's write_deltalake) writes
                                    the rows of the DuckDB query SQL to the Delta table
                                    DIR: MODE append or overwrite, PARTITION_BY columns
                                    joined by commas, PREDICATE the rows an overwrite
                                    replaces, CONFIG a JSON object of table properties;
                                    new columns join the schema. Prints the version
    readers.py delta-op DIR OP DAY BASE
                                    another writer (the deltalake package) changes the
                                    Delta table DIR: OP append, merge-column (an append
                                    that adds column `note`), replace-where, overwrite
                                    (the whole table), delete (DAY's even order ids),
                                    optimize, vacuum (retention 0) or restore (the
                                    version before the latest); rows written are
                                    foreign_rows(OP, DAY, BASE) and the commit carries
                                    `testOp` = "OP DAY BASE". Prints the version
    readers.py delta-feature DIR FEATURE
                                    another writer (deltalake) adds the table feature
                                    FEATURE (a name of deltalake.TableFeatures) to the
                                    Delta table DIR's protocol. Prints the version
    readers.py delta-state DIR      the Delta table's rows (deltalake), columns and
                                    history: each commit's version, operation, idem's
                                    commitInfo, `testOp`, and a restore's version
    readers.py files DIR            the data files each engine reads from DIR
    readers.py put ENDPOINT DIR URL uploads DIR's files under URL (creating the bucket)
    readers.py get ENDPOINT URL DIR downloads what a plain lister sees under URL
    readers.py list ENDPOINT URL    the keys under URL
                                    (URL is s3://BUCKET/PREFIX on an S3 server at
                                    ENDPOINT, or az://CONTAINER/PREFIX on Azurite's blob
                                    service at ENDPOINT)
    readers.py s3-uploads ENDPOINT s3://BUCKET/PREFIX
                                    keys of multipart uploads in progress under PREFIX
    readers.py watch ENDPOINT URL/META/markers/P.json URL/TABLE/P STOPFILE
                                    reads the partition through its marker until STOPFILE
                                    exists: every file the marker lists must exist

Rows are printed as one JSON list: each row an object of column -> value rendered as
text (so DATE and '2026-06-04' compare equal across engines), sorted.
"""

import datetime
import decimal
import json
import os
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


def delta_tables(d, version):

    import deltalake
    import duckdb
    import duckdb_extension_delta
    import polars as pl

    v = None if version is None else int(version)
    seen = {}
    seen["deltalake"] = deltalake.DeltaTable(d, version=v).to_pyarrow_table().to_pylist()
    seen["polars"] = pl.read_delta(d, version=v).to_dicts()
    ext = os.path.join(
        os.path.dirname(duckdb_extension_delta.__file__),
        "extensions",
        "v" + duckdb.__version__,
        "delta.duckdb_extension",
    )
    con = duckdb.connect()
    con.load_extension(ext)
    at = "" if v is None else f", version := {v}"
    rel = con.sql(f"select * from delta_scan('{d}'{at})")
    seen["duckdb"] = [dict(zip(rel.columns, r)) for r in rel.fetchall()]
    return {k: rows_out(rows) for k, rows in seen.items()}


def delta_log(d):
    import deltalake

    t = deltalake.DeltaTable(d)
    return {
        "version": t.version(),
        "history": t.history(),
        "files": sorted(t.file_uris()),
    }


def delta_overwrite(d, column, value):
    import deltalake
    import pyarrow.compute as pc

    t = deltalake.DeltaTable(d)
    data = t.to_pyarrow_table()
    rows = data.filter(pc.equal(pc.cast(data[column], "string"), value))
    deltalake.write_deltalake(
        d,
        rows,
        mode="overwrite",
        predicate=f"{column} = '{value}'",
        partition_by=t.metadata().partition_columns,
    )
    return deltalake.DeltaTable(d).version()


def delta_write(d, mode, sql, partition_by="", predicate="", config=""):
    import deltalake
    import duckdb

    data = duckdb.connect().sql(sql).to_arrow_table()
    deltalake.write_deltalake(
        d,
        data,
        mode=mode,
        partition_by=[c for c in partition_by.split(",") if c] or None,
        predicate=predicate or None,
        configuration=json.loads(config) if config else None,
        schema_mode="merge" if mode == "append" else None,
    )
    return deltalake.DeltaTable(d).version()


def foreign_rows(op, day, base):
    """The rows another writer's OP writes: BASE + k as order ids, on DAY."""
    n = {"append": 3, "merge-column": 2, "replace-where": 2, "overwrite": 2}.get(op, 0)
    rows = []
    for k in range(n):
        row = {
            "order_id": base + k,
            "customer_id": k + 1,
            "amount_usd": decimal.Decimal("9.99"),
            "status": "foreign",
            "dt": datetime.date.fromisoformat(day),
        }
        if op == "merge-column":
            row["note"] = f"n{k}"
        rows.append(row)
    return rows


def delta_op(d, op, day, base):
    import deltalake
    import pyarrow as pa

    base = int(base)
    t = deltalake.DeltaTable(d)
    props = deltalake.CommitProperties(custom_metadata={"testOp": f"{op} {day} {base}"})
    if op in ("append", "merge-column", "replace-where", "overwrite"):
        schema = t.to_pyarrow_dataset().schema
        fields = list(schema)
        if op == "merge-column" and "note" not in schema.names:
            fields.append(pa.field("note", pa.string()))
        rows = foreign_rows(op, day, base)
        data = pa.table(
            {f.name: pa.array([r.get(f.name) for r in rows]).cast(f.type)
             if any(f.name in r for r in rows) else pa.nulls(len(rows), f.type)
             for f in fields}
        )
        deltalake.write_deltalake(
            t,
            data,
            mode="append" if op in ("append", "merge-column") else "overwrite",
            predicate=f"dt = '{day}'" if op == "replace-where" else None,
            schema_mode="merge" if op == "merge-column" else None,
            commit_properties=props,
        )
    elif op == "delete":
        t.delete(f"dt = '{day}' AND order_id % 2 = 0", commit_properties=props)
    elif op == "optimize":
        t.optimize.compact(commit_properties=props)
    elif op == "vacuum":
        t.vacuum(
            retention_hours=0,
            dry_run=False,
            enforce_retention_duration=False,
            commit_properties=props,
            full=True,
        )
    elif op == "restore":
        t.restore(t.version() - 1, commit_properties=props)
    else:
        sys.exit(f"unknown delta-op {op}")
    return deltalake.DeltaTable(d).version()


def delta_feature(d, feature):
    import deltalake

    t = deltalake.DeltaTable(d)
    t.alter.add_feature(
        getattr(deltalake.TableFeatures, feature), allow_protocol_versions_increase=True
    )
    return deltalake.DeltaTable(d).version()


def delta_state(d):
    import deltalake

    t = deltalake.DeltaTable(d)
    data = t.to_pyarrow_table()
    history = []
    for c in t.history():
        params = c.get("operationParameters") or {}
        history.append(
            {
                "version": c.get("version"),
                "operation": c.get("operation"),
                "idem": c.get("idem"),
                "testOp": c.get("testOp"),
                "restore": int(params["version"]) if c.get("operation") == "RESTORE" else None,
            }
        )
    history.sort(key=lambda h: h["version"])
    return {"rows": rows_out(data.to_pylist()), "columns": data.column_names, "history": history}


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


# Azurite's well-known development account.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def split(url):
    """(scheme, bucket, prefix) of s3://bucket/prefix or az://container/prefix."""
    scheme, _, rest = url.partition("://")
    bucket, _, prefix = rest.partition("/")
    return scheme, bucket, prefix


class Bucket:
    """The few operations the tests need, on an S3 bucket or an Azure container."""

    def __init__(self, endpoint, url):
        self.scheme, self.name, self.prefix = split(url)
        if self.scheme == "s3":
            self.s3 = s3_client(endpoint)
        elif self.scheme == "az":
            from azure.storage.blob import BlobServiceClient

            svc = BlobServiceClient(
                account_url=f"{endpoint.rstrip('/')}/{AZURITE_ACCOUNT}",
                credential={"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY},
            )
            self.az = svc.get_container_client(self.name)
        else:
            sys.exit(f"unsupported URL {url}")

    def create(self):
        if self.scheme == "s3":
            try:
                self.s3.create_bucket(Bucket=self.name)
            except self.s3.exceptions.BucketAlreadyOwnedByYou:
                pass
        else:
            from azure.core.exceptions import ResourceExistsError

            try:
                self.az.create_container()
            except ResourceExistsError:
                pass

    def upload(self, path, key):
        if self.scheme == "s3":
            self.s3.upload_file(path, self.name, key)
        else:
            with open(path, "rb") as f:
                self.az.upload_blob(key, f, overwrite=True)

    def keys(self):
        if self.scheme == "s3":
            out = []
            pages = self.s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.name, Prefix=self.prefix
            )
            for page in pages:
                out.extend(o["Key"] for o in page.get("Contents", []))
            return sorted(out)
        return sorted(b.name for b in self.az.list_blobs(name_starts_with=self.prefix))

    def read(self, key):
        """(etag, bytes) of the object at key, or None when there is none."""
        if self.scheme == "s3":
            try:
                o = self.s3.get_object(Bucket=self.name, Key=key)
            except self.s3.exceptions.NoSuchKey:
                return None
            return o["ETag"], o["Body"].read()
        from azure.core.exceptions import ResourceNotFoundError

        try:
            d = self.az.download_blob(key)
        except ResourceNotFoundError:
            return None
        return d.properties.etag, d.readall()

    def exists(self, key):
        if self.scheme == "s3":
            try:
                self.s3.head_object(Bucket=self.name, Key=key)
                return True
            except Exception:
                return False
        return self.az.get_blob_client(key).exists()

    def download(self, key, path):
        if self.scheme == "s3":
            self.s3.download_file(self.name, key, path)
        else:
            with open(path, "wb") as f:
                f.write(self.az.download_blob(key).readall())


def put_files(endpoint, local, url):
    import os

    b = Bucket(endpoint, url)
    b.create()
    keys = []
    for root, _, names in os.walk(local):
        for n in sorted(names):
            path = os.path.join(root, n)
            key = b.prefix.rstrip("/") + "/" + os.path.relpath(path, local)
            b.upload(path, key.lstrip("/"))
            keys.append(key)
    return sorted(keys)


def get_files(endpoint, url, local):
    import os

    b = Bucket(endpoint, url)
    keys = b.keys()
    for k in keys:
        path = os.path.join(local, os.path.relpath(k, b.prefix))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        b.download(k, path)
    return keys


def watch(endpoint, marker_url, part_url, stop):
    """Reads a partition through its marker, as idem does, until `stop` exists."""
    import os

    b = Bucket(endpoint, marker_url)
    marker_key = b.prefix
    _, _, part = split(part_url)

    def marker():
        got = b.read(marker_key)
        return (None, None) if got is None else (got[0], json.loads(got[1]))

    reads, violations, versions = 0, [], set()
    while not os.path.exists(stop):
        etag, m = marker()
        if m is None:
            continue
        missing = [
            f["name"]
            for f in m["files"]
            if not b.exists(f"{part}/{f['name']}")
            and not b.exists(f"{m['staging']}/{f['staged']}")
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
    elif cmd == "delta":
        seen = delta_tables(arg.rstrip("/"), sys.argv[3] if len(sys.argv) > 3 else None)
        first = next(iter(seen.values()))
        if any(rows != first for rows in seen.values()):
            for name, rows in seen.items():
                print(f"{name}: {len(rows)} rows, first {rows[:3]}", file=sys.stderr)
            sys.exit("Delta readers disagree")
        print(json.dumps(first))
    elif cmd == "delta-overwrite":
        print(json.dumps(delta_overwrite(arg.rstrip("/"), sys.argv[3], sys.argv[4])))
    elif cmd == "delta-write":
        print(json.dumps(delta_write(arg.rstrip("/"), *sys.argv[3:])))
    elif cmd == "delta-op":
        print(json.dumps(delta_op(arg.rstrip("/"), *sys.argv[3:])))
    elif cmd == "delta-feature":
        print(json.dumps(delta_feature(arg.rstrip("/"), sys.argv[3])))
    elif cmd == "delta-state":
        print(json.dumps(delta_state(arg.rstrip("/")), default=str))
    elif cmd == "delta-log":
        print(json.dumps(delta_log(arg.rstrip("/")), default=str))
    elif cmd == "duckdb":
        import duckdb

        rel = duckdb.connect().sql(arg)
        cols = rel.columns
        print(json.dumps(rows_out([dict(zip(cols, r)) for r in rel.fetchall()])))
    elif cmd == "files":
        print(json.dumps(files(arg.rstrip("/"))))
    elif cmd == "get":
        print(json.dumps(get_files(arg, sys.argv[3], sys.argv[4])))
    elif cmd == "s3-uploads":
        _, bucket, prefix = split(sys.argv[3])
        ups = s3_client(arg).list_multipart_uploads(Bucket=bucket, Prefix=prefix)
        print(json.dumps(sorted(u["Key"] for u in ups.get("Uploads", []))))
    elif cmd == "list":
        print(json.dumps(Bucket(arg, sys.argv[3]).keys()))
    elif cmd == "watch":
        print(json.dumps(watch(arg, sys.argv[3], sys.argv[4], sys.argv[5])))
    elif cmd == "put":
        # put ENDPOINT LOCAL_DIR URL: create the bucket if needed and upload every file
        # under LOCAL_DIR, keeping relative paths.
        print(json.dumps(put_files(arg, sys.argv[3], sys.argv[4])))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
    # Without the interpreter's teardown: Arrow's C++ threads sometimes abort it
    # ("terminate called without an active exception") after the answer is out.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
