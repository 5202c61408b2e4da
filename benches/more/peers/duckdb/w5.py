"""W5 with DuckDB 1.5.5 and its httpfs extension (from the duckdb-extension-httpfs
wheel): COPY the query to the new object, then delete the partition's older objects."""

import os
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import duckdb
import duckdb_extension_httpfs
from _s3 import KEEP, drop_others, endpoint, new_key, parse, raw_files

a = parse()
con = duckdb.connect()
con.load_extension(
    os.path.join(
        os.path.dirname(duckdb_extension_httpfs.__file__),
        "extensions",
        "v" + duckdb.__version__,
        "httpfs.duckdb_extension",
    )
)
host = endpoint().removeprefix("http://")
con.sql(
    f"""CREATE SECRET (TYPE s3, KEY_ID '{os.environ["AWS_ACCESS_KEY_ID"]}',
        SECRET '{os.environ["AWS_SECRET_ACCESS_KEY"]}', REGION 'us-east-1',
        ENDPOINT '{host}', URL_STYLE 'path', USE_SSL false)"""
)
url, path = new_key(a.out, a.date)
files = raw_files(a.data, a.date)
con.sql(
    f"""COPY (SELECT {", ".join(KEEP)} FROM read_parquet({files!r})
              WHERE status <> 'cancelled')
        TO '{url}' (FORMAT parquet, COMPRESSION snappy)"""
)
drop_others(path.rsplit("/", 1)[0], path)
