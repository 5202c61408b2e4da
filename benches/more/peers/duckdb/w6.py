"""W6 with DuckDB: the per-date loop in one process, each date's join COPYed into a
staging directory and swapped in."""

import os
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import duckdb
from _w6 import parse, replace_partitions, staging

QUERY = """
select l.l_orderkey, l.l_linenumber, o.o_custkey, c.c_name, n.n_name as nation,
       l.l_quantity, cast(l.l_extendedprice * (1 - l.l_discount) as decimal(18, 4)) as revenue
from read_parquet('{raw}/lineitem/l_shipdate={day}/*.parquet') l
join read_parquet('{raw}/orders/*.parquet') o on l.l_orderkey = o.o_orderkey
join read_parquet('{raw}/customer/*.parquet') c on o.o_custkey = c.c_custkey
join read_parquet('{raw}/nation/*.parquet') n on c.c_nationkey = n.n_nationkey
"""

a = parse()
con = duckdb.connect()
table = f"{a.out}/ship_revenue"
for day in a.dates:
    stage = staging(table)
    os.makedirs(f"{stage}/ship_date={day}")
    query = QUERY.format(raw=f"{a.data}/raw", day=day)
    con.sql(
        f"COPY ({query}) TO '{stage}/ship_date={day}/part-0.parquet' (FORMAT parquet, COMPRESSION snappy)"
    )
    replace_partitions(stage, table)
