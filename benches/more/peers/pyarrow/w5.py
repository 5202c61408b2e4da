"""W5 with pyarrow: read the day, filter, write_table to the new object through
pyarrow's S3 filesystem, then delete the partition's older objects."""

import os
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import pyarrow.compute as pc
import pyarrow.parquet as pq
from _s3 import KEEP, drop_others, new_key, parse, raw_files, store

a = parse()
t = pq.read_table(raw_files(a.data, a.date), columns=[*KEEP, "created_at"])
t = t.filter(pc.not_equal(t["status"], "cancelled")).select(KEEP)
_, path = new_key(a.out, a.date)
pq.write_table(t, path, filesystem=store(), compression="snappy")
drop_others(path.rsplit("/", 1)[0], path)
