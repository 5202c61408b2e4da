"""W6: a 30-day backfill of a TPC-H join per ship date. TPC-H data comes from DuckDB's
dbgen (the tpch extension's wheel) at `--sf`, written as a raw lake: lineitem
partitioned by l_shipdate, orders, customer and nation as plain Parquet. Each date
joins that day's lineitem with orders, customer and nation (re-reading the
dimensions, as a nightly job does) and replaces partition ship_date=DATE of
OUT/ship_revenue/. The peers run the same per-date loop in one process; duckdb-bulk
is DuckDB's one-statement `COPY ... PARTITION_BY` over the range, the non-idempotent
bulk reference. Checked against DuckDB's answer over the raw lake.

    benches/more/run.sh w6 --engines idem-write,idem,duckdb,polars,duckdb-bulk --repeat 3

Contestants: benches/more/peers/<engine>/w6(.py|.sh), taking
`--data DIR --out DIR --start D --days N`. Each engine first writes the range once,
untimed; the timed runs replace it.
"""

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import tempfile

from common import HERE, command, runs, table, version

QUERY = """
select l.l_orderkey, l.l_linenumber, o.o_custkey, c.c_name, n.n_name as nation,
       l.l_quantity, cast(l.l_extendedprice * (1 - l.l_discount) as decimal(18, 4)) as revenue,
       l.l_shipdate as ship_date
from lineitem l
join orders o on l.l_orderkey = o.o_orderkey
join customer c on o.o_custkey = c.c_custkey
join nation n on c.c_nationkey = n.n_nationkey
"""

ROW_HASH = (
    "hash(l_orderkey::BIGINT, l_linenumber::INTEGER, o_custkey::BIGINT, c_name::VARCHAR,"
    " nation::VARCHAR, l_quantity::DECIMAL(15,2), revenue::DECIMAL(18,4))"
)


def load(con, extension):
    import duckdb

    module = __import__(f"duckdb_extension_{extension}")
    con.load_extension(
        os.path.join(
            os.path.dirname(module.__file__),
            "extensions",
            "v" + duckdb.__version__,
            f"{extension}.duckdb_extension",
        )
    )


def dataset(root, sf):
    """root/tpch-sfN/raw: lineitem by l_shipdate, and the dimensions; made once."""
    import duckdb

    path = os.path.join(root, f"tpch-sf{sf}")
    manifest = os.path.join(path, "manifest.json")
    if os.path.exists(manifest):
        return path
    shutil.rmtree(path, ignore_errors=True)
    raw = os.path.join(path, "raw")
    os.makedirs(raw)
    print(f"generating TPC-H sf {sf} into {path}", file=sys.stderr, flush=True)
    con = duckdb.connect()
    load(con, "tpch")
    con.sql(f"CALL dbgen(sf = {sf})")
    con.sql(
        f"COPY lineitem TO '{raw}/lineitem' (FORMAT parquet, PARTITION_BY (l_shipdate), "
        "COMPRESSION snappy)"
    )
    for t in ("orders", "customer", "nation"):
        os.makedirs(f"{raw}/{t}")
        con.sql(
            f"COPY {t} TO '{raw}/{t}/part-0.parquet' (FORMAT parquet, COMPRESSION snappy)"
        )
    with open(manifest, "w") as f:
        json.dump({"sf": sf}, f)
    return path


def expected(con, data, start, days):
    end = start + dt.timedelta(days=days - 1)
    raw = f"{data}/raw"
    for t in ("orders", "customer", "nation"):
        con.sql(
            f"CREATE OR REPLACE VIEW {t} AS SELECT * FROM read_parquet('{raw}/{t}/*.parquet')"
        )
    con.sql(
        f"CREATE OR REPLACE VIEW lineitem AS SELECT * FROM "
        f"read_parquet('{raw}/lineitem/**/*.parquet', hive_partitioning = true)"
    )
    rel = f"({QUERY} where l.l_shipdate between DATE '{start}' and DATE '{end}')"
    return fingerprint(con, rel)


def fingerprint(con, relation):
    rows = con.sql(
        f"SELECT CAST(ship_date AS DATE)::VARCHAR, count(*), sum({ROW_HASH}::HUGEINT)::VARCHAR "
        f"FROM {relation} GROUP BY 1"
    ).fetchall()
    return {part: [n, h] for part, n, h in rows}


def check(con, out, want):
    files = []
    for root, dirs, names in os.walk(out):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        files += [
            os.path.join(root, n)
            for n in names
            if n.endswith(".parquet") and not n.startswith((".", "_"))
        ]
    if not files:
        return f"no parquet files under {out}"
    try:
        got = fingerprint(
            con, f"read_parquet({sorted(files)!r}, hive_partitioning = true)"
        )
    except Exception as e:  # noqa: BLE001 (a missing column, an unreadable file)
        return f"unreadable: {str(e).splitlines()[0][:200]}"
    errors = []
    for part in sorted(set(want) | set(got)):
        w, h = want.get(part), got.get(part)
        if w is None:
            errors.append(f"{part}: unexpected")
        elif h is None:
            errors.append(f"{part}: missing")
        elif h != w:
            errors.append(
                f"{part}: {h[0]} rows, want {w[0]}"
                if h[0] != w[0]
                else f"{part}: checksum differs"
            )
    return "; ".join(errors[:3]) or "ok"


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--engines", default="idem-write,idem,duckdb,polars,duckdb-bulk")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sf", type=float, default=1)
    ap.add_argument("--start", default="1995-03-01")
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument(
        "--data", default=os.path.join(tempfile.gettempdir(), "idem-bench-data")
    )
    ap.add_argument("--peers", default=os.path.join(HERE, "peers"))
    ap.add_argument("--json", help="also write the results to this file")
    a = ap.parse_args()
    import duckdb

    sf = int(a.sf) if a.sf == int(a.sf) else a.sf
    data = dataset(a.data, sf)
    start = dt.date.fromisoformat(a.start)
    con = duckdb.connect()
    want = expected(con, data, start, a.days)
    work = tempfile.mkdtemp(prefix="idem-w6-")
    env = dict(os.environ)
    rows = []
    try:
        for engine in a.engines.split(","):
            out = os.path.join(work, engine)
            cmd = [
                *command(engine, a.peers, "w6"),
                "--data",
                data,
                "--out",
                out,
                "--start",
                a.start,
                "--days",
                str(a.days),
            ]
            times, rss, status = runs(cmd, env, a.repeat)
            if times:
                status = check(con, os.path.join(out, "ship_revenue"), want)
            rows.append((engine, version(engine, a.peers, env), times, rss, status))
            print(f"{engine}: {times} {status}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = sum(n for n, _ in want.values())
    table(
        rows,
        "idem-write",
        f"W6: TPC-H sf {sf}, {a.days}-day backfill from {a.start} of lineitem x orders x customer "
        f"x nation per ship date ({total:,} rows); median of {a.repeat} timed runs",
        json_path=a.json,
    )


if __name__ == "__main__":
    main()
