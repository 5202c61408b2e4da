"""W6 with Polars: the per-date loop in one process, each date's lazy join collected,
written into a staging directory and swapped in."""

import os
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import polars as pl
from _w6 import parse, replace_partitions, staging

a = parse()
raw = f"{a.data}/raw"
table = f"{a.out}/ship_revenue"
for day in a.dates:
    lineitem = pl.scan_parquet(f"{raw}/lineitem/l_shipdate={day}/*.parquet")
    orders = pl.scan_parquet(f"{raw}/orders/*.parquet").select(
        "o_orderkey", "o_custkey"
    )
    customer = pl.scan_parquet(f"{raw}/customer/*.parquet").select(
        "c_custkey", "c_name", "c_nationkey"
    )
    nation = pl.scan_parquet(f"{raw}/nation/*.parquet").select("n_nationkey", "n_name")
    df = (
        lineitem.join(orders, left_on="l_orderkey", right_on="o_orderkey")
        .join(customer, left_on="o_custkey", right_on="c_custkey")
        .join(nation, left_on="c_nationkey", right_on="n_nationkey")
        .select(
            "l_orderkey",
            "l_linenumber",
            "o_custkey",
            "c_name",
            pl.col("n_name").alias("nation"),
            "l_quantity",
            # At scale 4 on both sides: Polars keeps the larger input scale, not their sum.
            (
                pl.col("l_extendedprice").cast(pl.Decimal(18, 4))
                * (1 - pl.col("l_discount")).cast(pl.Decimal(18, 4))
            )
            .cast(pl.Decimal(18, 4))
            .alias("revenue"),
        )
        .collect()
    )
    stage = staging(table)
    os.makedirs(f"{stage}/ship_date={day}")
    df.write_parquet(f"{stage}/ship_date={day}/part-0.parquet", compression="snappy")
    replace_partitions(stage, table)
