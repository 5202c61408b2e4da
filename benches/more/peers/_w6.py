"""Helpers of the Python W6 contestants: arguments, the raw lake's files, and the
partition swap of the shared bench's contestants."""

import argparse
import datetime as dt
import os
import sys

SHARED = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..",
    "..",
    "..",
    "..",
    "shared",
    "bench",
    "peers",
)
sys.path.append(SHARED)
from _shared import replace_partitions, staging  # noqa: F401


def parse():
    ap = argparse.ArgumentParser(description="W6: a TPC-H join per ship date")
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--start", required=True)
    ap.add_argument("--days", type=int, required=True)
    a = ap.parse_args()
    d0 = dt.date.fromisoformat(a.start)
    a.dates = [d0 + dt.timedelta(days=i) for i in range(a.days)]
    return a
