"""W5: W1's day (one day of raw orders, cancelled dropped, dt added) written to an
S3-compatible server on 127.0.0.1 (moto), replacing partition dt=DATE of
s3://w5-<engine>/wh/fct_orders/, by each engine in turn; checked against the shared
bench's DuckDB reference after the timed runs, as the shared harness checks W1.

    benches/more/run.sh w5 --engines idem-write,idem,duckdb,polars,pyarrow --repeat 3

Contestants live in benches/more/peers/<engine>/w5(.py|.sh) and take
`--data DIR --out s3://BUCKET/wh --date D`, with the server in AWS_ENDPOINT_URL (and
AWS_ALLOW_HTTP, the keys and the region). Each engine first writes the day once,
untimed; the timed runs replace it. Engines without a partition overwrite of their
own write the day's new object and then delete the partition's older ones (not
atomic: a reader between the two sees both). Prints one markdown table.
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from common import (
    HERE,
    SHARED,
    command,
    free_port,
    runs,
    shared_harness,
    table,
    version,
)


def start_moto(workdir):
    port = free_port()
    server = os.path.join(os.path.dirname(sys.executable), "moto_server")
    log = open(os.path.join(workdir, "moto.log"), "w")  # noqa: SIM115 (open while moto runs)
    proc = subprocess.Popen(
        [server, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
    )
    for _ in range(150):
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("moto did not start; see moto.log")


def s3fs(endpoint):
    from pyarrow import fs

    return fs.S3FileSystem(
        endpoint_override=endpoint,
        scheme="http",
        access_key="bench",
        secret_key="bench",
        region="us-east-1",
        allow_bucket_creation=True,
    )


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--engines", default="idem-write,idem,duckdb,polars,pyarrow")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rows-per-day", type=int, default=5_000_000)
    ap.add_argument("--bench", default=SHARED)
    ap.add_argument(
        "--data", default=os.path.join(tempfile.gettempdir(), "idem-bench-data")
    )
    ap.add_argument("--peers", default=os.path.join(HERE, "peers"))
    ap.add_argument("--json", help="also write the results to this file")
    a = ap.parse_args()

    harness = shared_harness(a.bench)
    import duckdb

    data, _ = harness.dataset(
        a.data,
        f"w5-{a.rows_per_day}",
        rows_per_day=a.rows_per_day,
        days=2,
        customers=1000,
    )
    date = harness.day(0)
    con = duckdb.connect()
    expected = harness.fingerprint(
        con,
        f"(SELECT * FROM {harness.reference(data, 'fct_orders')} WHERE dt = DATE '{date}')",
        "fct_orders",
    )

    work = tempfile.mkdtemp(prefix="idem-w5-")
    moto, endpoint = start_moto(work)
    env = dict(
        os.environ,
        AWS_ENDPOINT_URL=endpoint,
        AWS_ALLOW_HTTP="true",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_REGION="us-east-1",
        AWS_DEFAULT_REGION="us-east-1",
    )
    store = s3fs(endpoint)
    rows = []
    try:
        for engine in a.engines.split(","):
            bucket = f"w5-{engine}"
            store.create_dir(bucket)
            out = f"s3://{bucket}/wh"
            cmd = [
                *command(engine, a.peers, "w5"),
                "--data",
                data,
                "--out",
                out,
                "--date",
                date,
            ]
            times, rss, status = runs(cmd, env, a.repeat)
            if times:
                local = os.path.join(work, bucket)
                from pyarrow import fs

                fs.copy_files(f"{bucket}/wh/fct_orders", local, source_filesystem=store)
                status = harness.check(con, local, "fct_orders", expected)
                shutil.rmtree(local, ignore_errors=True)
            rows.append((engine, version(engine, a.peers, env), times, rss, status))
            print(f"{engine}: {times} {status}", file=sys.stderr, flush=True)
    finally:
        moto.kill()
        shutil.rmtree(work, ignore_errors=True)

    table(
        rows,
        "idem-write",
        f"W5: one day of {a.rows_per_day:,} raw rows written to moto on 127.0.0.1, replacing "
        f"dt={date}; median of {a.repeat} timed runs",
        json_path=a.json,
    )


if __name__ == "__main__":
    main()
