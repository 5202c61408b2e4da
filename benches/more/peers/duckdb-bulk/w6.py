"""W6's bulk reference: DuckDB's one COPY ... PARTITION_BY over the whole range, into
a staging directory whose partitions are then swapped in (one statement, not a per-date
idempotent loop)."""

import os
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import duckdb
from _w6 import parse, replace_partitions, staging

a = parse()
raw = f"{a.data}/raw"
first, last = a.dates[0], a.dates[-1]
con = duckdb.connect()
table = f"{a.out}/ship_revenue"
stage = staging(table)
os.rmdir(stage)
con.sql(f"""
COPY (
  select l.l_orderkey, l.l_linenumber, o.o_custkey, c.c_name, n.n_name as nation,
         l.l_quantity, cast(l.l_extendedprice * (1 - l.l_discount) as decimal(18, 4)) as revenue,
         l.l_shipdate as ship_date
  from read_parquet('{raw}/lineitem/**/*.parquet', hive_partitioning = true) l
  join read_parquet('{raw}/orders/*.parquet') o on l.l_orderkey = o.o_orderkey
  join read_parquet('{raw}/customer/*.parquet') c on o.o_custkey = c.c_custkey
  join read_parquet('{raw}/nation/*.parquet') n on c.c_nationkey = n.n_nationkey
  where l.l_shipdate between DATE '{first}' and DATE '{last}'
) TO '{stage}' (FORMAT parquet, PARTITION_BY (ship_date), COMPRESSION snappy)
""")
replace_partitions(stage, table)
