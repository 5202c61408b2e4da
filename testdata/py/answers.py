"""The differential search of idem's answers: generated tables, generated queries, each
run through idem (job file -> `idem backfill` of a folder of jobs -> table) and through
DuckDB, the independent oracle, compared as multisets of rows.

    answers.py search --idem BIN --seed S --worlds W --queries Q [--cluster]
                      [--keep DIR] [--report FILE]
    answers.py replay --idem BIN --seed S --world K [--query J] [--keep DIR]

A world is a few tables of generated columns (every type idem's digest supports, at
its extremes, NULLs and all-NULL columns, dictionary and view strings, timestamps of
every unit, zoned and not, before 1970 and on day boundaries, decimals of several
scales) written by pyarrow over several files of small row groups, so that statistics
pruning matters. Its queries are projections, filters, joins of every kind, global and
grouped aggregations, GROUPING SETS / ROLLUP / CUBE, DISTINCT, windows, set operations,
ORDER BY ... LIMIT, subqueries and casts, written once for each dialect. Each world's
jobs run twice: the second run must report every partition `unchanged` (same input,
same table). Metamorphic checks need no oracle: TLP (a query's rows are the union of
its rows under P, NOT P and P IS NULL) and NoREC (a filter's count equals the count of
rows where the predicate, evaluated as a value, is true), both through idem. With
`--cluster` the jobs run a third time on `--cluster standalone` and must give the same
digests.

Every failure names its seed, world and query; `replay` runs one world (or one query)
again, prints both dialects' SQL and the differing rows. Prints one JSON summary on
stdout.
"""

import argparse
import collections
import datetime
import decimal
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile

RUN_DATE = "2026-06-04"
# 38 digits and a scale, exactly (the default context rounds to 28).
decimal.getcontext().prec = 80

# ---------------------------------------------------------------------------------
# Columns and values
# ---------------------------------------------------------------------------------


class Col:
    """A generated column: its name, the expression family it belongs to (`kind`)
    and its exact Arrow type."""

    def __init__(self, name, kind, pa_type, **info):
        self.name = name
        self.kind = kind  # int, big (64-bit ints), float, dec, str, bool, date, ts
        self.pa_type = pa_type
        self.info = info

    def __repr__(self):
        return f"{self.name}:{self.pa_type}"


def col_types(pa):
    """(kind, arrow type, info) of every column type the search draws from."""
    out = []
    for t, bits, signed in [
        (pa.int8(), 8, True),
        (pa.int16(), 16, True),
        (pa.int32(), 32, True),
        (pa.uint8(), 8, False),
        (pa.uint16(), 16, False),
        (pa.uint32(), 32, False),
    ]:
        out.append(("int", t, {"bits": bits, "signed": signed}))
    out.append(("big", pa.int64(), {"bits": 64, "signed": True}))
    out.append(("big", pa.uint64(), {"bits": 64, "signed": False}))
    out.append(("float", pa.float32(), {}))
    out.append(("float", pa.float64(), {}))
    for p, s in [(9, 2), (18, 4), (38, 10), (5, 0)]:
        out.append(("dec", pa.decimal128(p, s), {"p": p, "s": s}))
    out.append(("str", pa.string(), {}))
    out.append(("str", pa.large_string(), {}))
    out.append(("str", pa.string_view(), {}))
    out.append(("str", pa.dictionary(pa.int32(), pa.string()), {"dict": True}))
    out.append(("bool", pa.bool_(), {}))
    out.append(("date", pa.date32(), {}))
    for unit in ["s", "ms", "us", "ns"]:
        for tz in [None, "UTC", "+02:00", "America/New_York"]:
            out.append(("ts", pa.timestamp(unit, tz=tz), {"unit": unit, "tz": tz}))
    return out


STRINGS = [
    "",
    "a",
    "A",
    "b",
    "ab",
    "abc",
    "a b",
    "zz",
    "é",
    "naïve",
    "x" * 13,  # longer than a string view's inline 12 bytes
    "y" * 40,
    "%",
    "_",
    "2026-06-04",
]

UNIT_PER_S = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
DAY = 86_400


def gen_value(rnd, col):
    """One value of `col`: extremes, day boundaries and ordinary values."""
    v = gen_raw(rnd, col)
    if col.kind == "ts" and col.info["unit"] == "ns" and (col.info["tz"] is not None or v < 0):
        # DuckDB reads a zoned timestamp as microseconds, and truncates nanoseconds
        # toward 1970 where it converts them: keep the oracle exact.
        v -= v % 1000
    return v


def gen_raw(rnd, col):
    k, info = col.kind, col.info
    if k in ("int", "big"):
        bits, signed = info["bits"], info["signed"]
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        r = rnd.random()
        if r < 0.15:
            return rnd.choice([lo, hi, lo + 1, hi - 1])
        if r < 0.85:
            return max(lo, min(hi, rnd.randint(-5, 20)))
        return rnd.randint(lo, hi)
    if k == "float":
        r = rnd.random()
        if r < 0.1:
            return rnd.choice([1e30, -1e30, 1e-30, 3.4e38, -3.4e38])
        return rnd.randint(-40, 40) / 4
    if k == "dec":
        p, s = info["p"], info["s"]
        top = 10**p - 1
        r = rnd.random()
        if r < 0.12:
            unscaled = rnd.choice([top, -top, top - 1, 1, -1])
        elif r < 0.85:
            unscaled = rnd.randint(-2000, 2000) * (10 ** max(0, s - 2))
        else:
            unscaled = rnd.randint(-top, top)
        return decimal.Decimal(unscaled).scaleb(-s)
    if k == "str":
        return rnd.choice(STRINGS)
    if k == "bool":
        return rnd.random() < 0.5
    if k == "date":
        r = rnd.random()
        if r < 0.15:
            return rnd.choice(
                [
                    datetime.date(1, 1, 1),
                    datetime.date(9999, 12, 31),
                    datetime.date(1969, 12, 31),
                    datetime.date(1970, 1, 1),
                    datetime.date(1900, 2, 28),
                ]
            )
        return datetime.date(2026, 6, 4) + datetime.timedelta(days=rnd.randint(-3, 3))
    if k == "ts":
        unit = info["unit"]
        per = UNIT_PER_S[unit]
        run_day = (datetime.date(2026, 6, 4) - datetime.date(1970, 1, 1)).days * DAY
        r = rnd.random()
        if r < 0.15:
            secs = rnd.choice(
                [-1, 0, -DAY, -DAY * 365 * 70 - 17, run_day, run_day + DAY - 1, run_day - 1]
            )
            sub = rnd.choice([0, per - 1]) if per > 1 else 0
            return secs * per + sub
        if r < 0.2 and unit != "ns":
            # Far from 1970: years 1 and 9999 do not fit nanoseconds.
            return rnd.choice([-62135596800, 253402300799]) * per
        # Around the run's date, some on the day boundaries.
        secs = run_day + rnd.randint(-2, 2) * DAY + rnd.choice([0, 1, 3600, DAY - 1, rnd.randint(0, DAY - 1)])
        return secs * per + (rnd.randint(0, per - 1) if per > 1 else 0)
    raise AssertionError(k)


# ---------------------------------------------------------------------------------
# A world: tables written as Parquet
# ---------------------------------------------------------------------------------


class Table:
    def __init__(self, name, cols, rows):
        self.name = name
        self.cols = cols
        self.rows = rows  # list of dicts

    def of_kind(self, *kinds):
        return [c for c in self.cols if c.kind in kinds]


def make_world(rnd, pa):
    types = col_types(pa)
    tables = []
    for ti in range(rnd.choice([2, 3, 3])):
        name = f"t{ti}"
        cols = [
            Col("id", "big", pa.int64(), bits=64, signed=True),
            Col("k", "int", pa.int32(), bits=32, signed=True),
            Col("g", "str", pa.string(), dict=False),
        ]
        # One name shared by every table, so that joins meet columns of one name.
        cols.append(Col("v", "int", pa.int16(), bits=16, signed=True))
        for ci in range(rnd.randint(3, 7)):
            kind, t, info = rnd.choice(types)
            cols.append(Col(f"c{ci}", kind, t, **info))
        n = rnd.choice([0, 1, 3, 8, 20, 40, 60]) if ti else rnd.choice([8, 20, 40, 60])
        all_null = {c.name for c in cols[4:] if rnd.random() < 0.08}
        rows = []
        for i in range(n):
            row = {"id": i * 7 + ti}
            row["k"] = None if rnd.random() < 0.1 else rnd.randint(0, 6)
            row["g"] = None if rnd.random() < 0.1 else rnd.choice(["a", "b", "c", "é", ""])
            row["v"] = None if rnd.random() < 0.1 else rnd.randint(-3, 3)
            for c in cols[4:]:
                if c.name in all_null or rnd.random() < 0.12:
                    row[c.name] = None
                else:
                    row[c.name] = gen_value(rnd, c)
            rows.append(row)
        tables.append(Table(name, cols, rows))
    return tables


def write_world(rnd, pa, pq, tables, src):
    """Each table as 1-5 Parquet files of small row groups, some sorted by a column so
    that statistics prune."""
    layout = {}
    for t in tables:
        d = os.path.join(src, t.name)
        os.makedirs(d)
        rows = list(t.rows)
        if rows and rnd.random() < 0.5:
            key = rnd.choice(t.cols).name
            rows.sort(key=lambda r: (r[key] is None, sort_key(r[key])))
        nfiles = max(1, min(len(rows), rnd.randint(1, 5)))
        cuts = sorted(rnd.sample(range(1, len(rows)), nfiles - 1)) if len(rows) > 1 and nfiles > 1 else []
        parts = [rows[a:b] for a, b in zip([0] + cuts, cuts + [len(rows)])]
        schema = pa.schema([pa.field(c.name, c.pa_type) for c in t.cols])
        groups = []
        for i, part in enumerate(parts):
            arrays = []
            for c in t.cols:
                vals = [r[c.name] for r in part]
                arrays.append(to_array(pa, c, vals))
            table = pa.Table.from_arrays(arrays, schema=schema)
            rg = rnd.choice([1, 2, 2, 3, 5, 100])
            pq.write_table(
                table,
                os.path.join(d, f"part-{i}.parquet"),
                row_group_size=rg,
                use_dictionary=rnd.random() < 0.7,
                data_page_size=rnd.choice([64, 1 << 20]),
                compression=rnd.choice(["snappy", "zstd", "none"]),
            )
            groups.append(rg)
        layout[t.name] = {"files": len(parts), "row_groups": groups}
    return layout


def sort_key(v):
    if isinstance(v, (int, float, decimal.Decimal)):
        return (0, float(v), "")
    return (1, 0.0, str(v))


def to_array(pa, col, vals):
    t = col.pa_type
    if col.kind == "ts":
        return pa.array(vals, type=pa.int64()).cast(t)
    if pa.types.is_dictionary(t):
        return pa.array(vals, type=pa.string()).dictionary_encode().cast(t)
    if t == pa.string_view():
        return pa.array(vals, type=pa.string()).cast(t)
    return pa.array(vals, type=t)


# ---------------------------------------------------------------------------------
# Expressions, written once for both dialects
# ---------------------------------------------------------------------------------


class X:
    """An expression: its kind and its text in DataFusion's (`df`) and DuckDB's
    (`dk`) dialects."""

    def __init__(self, kind, df, dk=None, **info):
        self.kind = kind
        self.df = df
        self.dk = df if dk is None else dk
        self.info = info

    def map(self, kind, f, **info):
        return X(kind, f(self.df), f(self.dk), **info)


def both(fmt, *xs, kind, **info):
    return X(kind, fmt.format(*[x.df for x in xs]), fmt.format(*[x.dk for x in xs]), **info)


def col_x(alias, c):
    ref = f"{alias}.{c.name}" if alias else c.name
    return X(c.kind, ref, ref, col=c, **c.info)


class Gen:
    def __init__(self, rnd, tables):
        self.rnd = rnd
        self.tables = tables

    def pick(self, xs):
        return self.rnd.choice(xs)

    def literal(self, c):
        """A literal of column `c`'s type, typed the same way in both dialects."""
        v = gen_value(self.rnd, c)
        k = c.kind
        if k in ("int", "big"):
            return X("int", str(v))
        if k == "float":
            return X("float", f"cast({v!r} as double)")
        if k == "dec":
            return X("dec", f"cast('{v:f}' as decimal({c.info['p']},{c.info['s']}))", **c.info)
        if k == "str":
            return X("str", "'" + v.replace("'", "''") + "'")
        if k == "bool":
            return X("bool", "true" if v else "false")
        if k == "date":
            return X("date", f"cast('{v.isoformat()}' as date)")
        if k == "ts":
            # A UTC instant as a timestamp literal of the column's zone and unit.
            per = UNIT_PER_S[c.info["unit"]]
            secs, sub = divmod(v, per)
            try:
                text = (
                    datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=secs)
                ).isoformat(sep=" ")
            except OverflowError:
                text = "2026-06-04 00:00:00"
            if sub:
                text += "." + str(sub).rjust(len(str(per)) - 1, "0")
            # DataFusion reads a plain timestamp literal as wall time in the zone of
            # the column it meets (UTC here); DuckDB's TIMESTAMP is microseconds.
            if c.info["tz"] is None:
                duck = "timestamp_ns" if c.info["unit"] == "ns" else "timestamp"
                return X("ts", f"cast('{text}' as timestamp)", f"cast('{text}' as {duck})")
            return X("ts", f"cast('{text}' as timestamp)", f"cast('{text}+00:00' as timestamptz)")
        raise AssertionError(k)

    def comparable(self, c):
        """Whether `c` may be compared with a literal: a zoned timestamp only in UTC
        (DataFusion reads a plain timestamp literal as wall time in the column's zone,
        DuckDB in the session's)."""
        return not (c.kind == "ts" and c.info["tz"] not in (None, "UTC"))

    def predicate(self, alias, table, depth=0):
        """A boolean expression over `table`'s columns (aliased `alias`)."""
        rnd = self.rnd
        r = rnd.random()
        if depth < 2 and r < 0.2:
            a = self.predicate(alias, table, depth + 1)
            b = self.predicate(alias, table, depth + 1)
            return both("({} " + rnd.choice(["and", "or"]) + " {})", a, b, kind="bool")
        if depth < 2 and r < 0.27:
            return both("not ({})", self.predicate(alias, table, depth + 1), kind="bool")
        c = self.pick(table.cols)
        x = col_x(alias, c)
        r = rnd.random()
        if r < 0.1:
            return both("{} is " + rnd.choice(["", "not "]) + "null", x, kind="bool")
        if c.kind == "bool":
            return both("{} = " + rnd.choice(["true", "false"]), x, kind="bool")
        if not self.comparable(c):
            others = [o for o in table.cols if o.pa_type == c.pa_type and o is not c]
            if not others:
                return both("{} is " + rnd.choice(["", "not "]) + "null", x, kind="bool")
            y = col_x(alias, self.pick(others))
            return both("{} " + rnd.choice(["=", "<>", "<", ">="]) + " {}", x, y, kind="bool")
        if r < 0.2 and c.kind != "float":
            lits = [self.literal(c) for _ in range(rnd.randint(1, 3))]
            return self._in(x, lits)
        if r < 0.28:
            a, b = self.literal(c), self.literal(c)
            return both("{} between {} and {}", x, a, b, kind="bool")
        if r < 0.33 and c.kind == "str":
            pat = rnd.choice(["a%", "%b", "_", "%é%", "x%"])
            return X("bool", f"{x.df} like '{pat}'")
        if r < 0.4:
            others = [o for o in table.cols if o.pa_type == c.pa_type and o is not c]
            if others:
                y = col_x(alias, self.pick(others))
                op = rnd.choice(["=", "<>", "<", "<=", ">", ">=", "is distinct from"])
                return both("{} " + op + " {}", x, y, kind="bool")
        if r < 0.45 and c.kind in ("int", "big"):
            # Arithmetic inside a predicate: the rewrite must keep the meaning.
            if c.kind == "int":
                return both("cast({} as bigint) + 1 > {}", x, self.literal(c), kind="bool")
        if r < 0.5 and c.kind == "ts" and c.info["tz"] in (None, "UTC"):
            return X("bool", f"cast({x.df} as date) = cast($run_date as date)",
                     f"cast({x.dk} as date) = cast('{RUN_DATE}' as date)")
        op = rnd.choice(["=", "<>", "<", "<=", ">", ">="])
        return both("{} " + op + " {}", x, self.literal(c), kind="bool")

    def _in(self, x, lits):
        neg = self.rnd.choice(["", "not "])
        return X(
            "bool",
            f"{x.df} {neg}in ({', '.join(l.df for l in lits)})",
            f"{x.dk} {neg}in ({', '.join(l.dk for l in lits)})",
        )

    def scalar(self, alias, table):
        """A value expression over one row of `table`: a column or a computation on
        one, of a type both engines agree on."""
        rnd = self.rnd
        c = self.pick(table.cols)
        x = col_x(alias, c)
        r = rnd.random()
        if r < 0.5:
            return x
        if c.kind == "int" and r < 0.65:
            return rnd.choice(
                [
                    both("cast({} as bigint) + 1", x, kind="big"),
                    both("cast({} as bigint) * 3 - 7", x, kind="big"),
                    both("abs(cast({} as bigint))", x, kind="big"),
                    both("coalesce(cast({} as bigint), -1)", x, kind="big"),
                ]
            )
        # DuckDB keeps DECIMAL(18) + DECIMAL(18) at 18 digits and overflows where
        # DataFusion widens to 19: add to narrow decimals only.
        if c.kind == "dec" and c.info["p"] <= 9 and r < 0.65:
            p, s = c.info["p"], c.info["s"]
            return rnd.choice(
                [
                    both("{} + " + f"cast('1.5' as decimal({p},{s}))", x, kind="dec", p=p + 1, s=s),
                    both("cast({} as decimal(38,10))", x, kind="dec", p=38, s=10),
                    # DataFusion's cast to an integer truncates, DuckDB's rounds.
                    X(
                        "dec",
                        f"cast(cast({x.df} as bigint) as decimal(20,2))",
                        f"cast(cast(trunc({x.dk}) as bigint) as decimal(20,2))",
                        p=20,
                        s=2,
                    ),
                ]
            )
        if c.kind == "str" and r < 0.65:
            return rnd.choice(
                [
                    both("coalesce({}, 'none')", x, kind="str"),
                    both("{} || '-'", x, kind="str"),
                    both("substr({}, 1, 2)", x, kind="str"),
                    both("length({})", x, kind="big"),
                    both("case when {} < 'b' then 'lo' else 'hi' end", x, kind="str"),
                ]
            )
        if c.kind == "ts" and c.info["tz"] in (None, "UTC") and r < 0.7:
            return X(
                "date",
                f"cast({x.df} as date)",
                f"cast({x.dk} as date)",
            )
        if c.kind == "float" and r < 0.65:
            return both("cast({} as double) * 2", x, kind="float")
        if c.kind == "bool" and r < 0.65:
            return both("case when {} then 1 else 0 end", x, kind="big")
        if c.kind == "date" and r < 0.65:
            return both("{} > cast('2026-06-03' as date)", x, kind="bool")
        return x

    def aggregate(self, alias, table, supported_only=False):
        """An aggregate over `table`: (df, dk) texts."""
        rnd = self.rnd
        c = self.pick(table.cols)
        x = col_x(alias, c)
        choices = [both("count({})", x, kind="big"), X("big", "count(*)")]
        if c.kind not in ("bool",):
            choices += [both("min({})", x, kind=c.kind), both("max({})", x, kind=c.kind)]
            if not supported_only:
                choices.append(both("count(distinct {})", x, kind="big"))
        if c.kind == "int":
            choices.append(both("sum(cast({} as bigint))", x, kind="big"))
            choices.append(both("max(cast({} as bigint) + 1)", x, kind="big"))
            choices.append(both("round(avg(cast({} as double)), 6)", x, kind="float"))
        if c.kind == "dec" and c.info["p"] <= 18:
            choices.append(both("sum({})", x, kind="dec"))
        if c.kind == "bool":
            choices += [both("bool_and({})", x, kind="bool"), both("bool_or({})", x, kind="bool")]
        if c.kind == "ts" and c.info["tz"] in (None, "UTC"):
            choices.append(both("min(cast({} as date))", x, kind="date"))
        return self.pick(choices)


# ---------------------------------------------------------------------------------
# Queries
# ---------------------------------------------------------------------------------


class Query:
    """A generated query: its text in both dialects and, for metamorphic checks, the
    variants that must give the same rows."""

    def __init__(self, shape, df, dk, variants=()):
        self.shape = shape
        self.df = df
        self.dk = dk
        self.variants = list(variants)  # (check name, df text, dk text)


def select_list(items):
    """`items`: X values; aliased q0.. so output names are unique in both dialects."""
    return (
        ", ".join(f"{x.df} as q{i}" for i, x in enumerate(items)),
        ", ".join(f"{x.dk} as q{i}" for i, x in enumerate(items)),
    )


def gen_query(g):
    rnd = g.rnd
    shape = rnd.choice(
        [
            "filter",
            "filter",
            "global_agg",
            "group_by",
            "group_by",
            "join",
            "join",
            "semi",
            "join_agg",
            "dup_names",
            "grouping_sets",
            "distinct",
            "window",
            "setop",
            "topk",
            "scalar_subquery",
        ]
    )
    return getattr(sys.modules[__name__], "q_" + shape)(g), shape


def q_filter(g):
    t = g.pick(g.tables)
    items = [col_x("", t.cols[0])] + [g.scalar("", t) for _ in range(g.rnd.randint(1, 4))]
    p0 = g.predicate("", t)
    sdf, sdk = select_list(items)
    df = f"select {sdf} from {t.name} where {p0.df}"
    dk = f"select {sdk} from {t.name} where {p0.dk}"
    # TLP: the rows of a filter are the rows under P, NOT P and P IS NULL.
    p = g.predicate("", t)
    parts_df = [f"select {sdf} from {t.name} where ({p0.df}) and {w}" for w in tlp(p.df)]
    parts_dk = [f"select {sdk} from {t.name} where ({p0.dk}) and {w}" for w in tlp(p.dk)]
    variants = [("tlp", " union all ".join(parts_df), " union all ".join(parts_dk))]
    # NoREC: count(*) under a filter equals the count of rows where it is true.
    variants.append(
        (
            "norec",
            f"select count(*) as q0 from {t.name} where {p.df}",
            f"select coalesce(sum(case when ({p.df}) then 1 else 0 end), 0) as q0 from {t.name}",
        )
    )
    return Query("filter", df, dk, variants)


def tlp(p):
    return [f"({p})", f"(not ({p}))", f"(({p}) is null)"]


def q_global_agg(g):
    t = g.pick(g.tables)
    aggs = [g.aggregate("", t) for _ in range(g.rnd.randint(1, 4))]
    if g.rnd.random() < 0.5:
        # The class of apache/datafusion#24816: min/max of a column beside an
        # aggregate of an expression.
        ints = t.of_kind("int")
        if ints:
            c = col_x("", g.pick(ints))
            aggs += [both("min({})", c, kind="int"), both("max(cast({} as bigint) + 1)", c, kind="big")]
    sdf, sdk = select_list(aggs)
    where = g.predicate("", t) if g.rnd.random() < 0.4 else None
    w_df = f" where {where.df}" if where else ""
    w_dk = f" where {where.dk}" if where else ""
    df = f"select {sdf}, cast($run_date as date) as dt from {t.name}{w_df}"
    dk = f"select {sdk}, cast('{RUN_DATE}' as date) as dt from {t.name}{w_dk}"
    return Query("global_agg", df, dk)


def group_keys(g, alias, t, n):
    keys = []
    for _ in range(n):
        keys.append(g.scalar(alias, t))
    return keys


def q_group_by(g):
    t = g.pick(g.tables)
    keys = group_keys(g, "", t, g.rnd.randint(1, 3))
    aggs = [g.aggregate("", t) for _ in range(g.rnd.randint(1, 3))]
    items = keys + aggs
    sdf, sdk = select_list(items)
    gdf = ", ".join(k.df for k in keys)
    gdk = ", ".join(k.dk for k in keys)
    having_df = having_dk = ""
    if g.rnd.random() < 0.3:
        having_df = having_dk = " having count(*) > 1"
    df = f"select {sdf} from {t.name} group by {gdf}{having_df}"
    dk = f"select {sdk} from {t.name} group by {gdk}{having_dk}"
    # TLP for a grouped count: the groups' counts under P, NOT P and P IS NULL add up.
    p = g.predicate("", t)
    inner_df = " union all ".join(
        f"select {', '.join(f'{k.df} as k{i}' for i, k in enumerate(keys))}, count(*) as n from {t.name} where {w} group by {gdf}"
        for w in tlp(p.df)
    )
    kcols = ", ".join(f"k{i}" for i in range(len(keys)))
    variant_df = f"select {kcols}, sum(n) as n from ({inner_df}) u group by {kcols}"
    direct_df = f"select {', '.join(f'{k.df} as k{i}' for i, k in enumerate(keys))}, count(*) as n from {t.name} group by {gdf}"
    # Both sides through idem: the direct count is the oracle of the partitioned one.
    return Query("group_by", df, dk, [("tlp-groups", variant_df, direct_df)])


def join_on(g, a, ta, b, tb):
    on_df = f"{a}.k = {b}.k"
    if g.rnd.random() < 0.3:
        on_df += f" and {a}.v <= {b}.v"
    return on_df


def q_join(g):
    ta, tb = g.pick(g.tables), g.pick(g.tables)
    kind = g.pick(["join", "left join", "right join", "full join", "join"])
    on = join_on(g, "a", ta, "b", tb)
    items = [col_x("a", ta.cols[0]), col_x("b", tb.cols[0]), g.scalar("a", ta), g.scalar("b", tb)]
    sdf, sdk = select_list(items)
    where_df = where_dk = ""
    if g.rnd.random() < 0.5:
        p = g.predicate("a" if g.rnd.random() < 0.5 else "b", ta if True else tb)
        p = g.predicate("a", ta)
        where_df, where_dk = f" where {p.df}", f" where {p.dk}"
    df = f"select {sdf} from {ta.name} a {kind} {tb.name} b on {on}{where_df}"
    dk = f"select {sdk} from {ta.name} a {kind} {tb.name} b on {on}{where_dk}"
    return Query("join", df, dk)


def q_semi(g):
    ta, tb = g.pick(g.tables), g.pick(g.tables)
    items = [col_x("a", ta.cols[0]), g.scalar("a", ta)]
    sdf, sdk = select_list(items)
    p = g.predicate("b", tb)
    form = g.pick(["in", "not in", "exists", "not exists"])
    if form in ("in", "not in"):
        cond_df = f"a.k {form} (select b.k from {tb.name} b where {p.df})"
        cond_dk = f"a.k {form} (select b.k from {tb.name} b where {p.dk})"
    else:
        cond_df = f"{form} (select 1 from {tb.name} b where b.k = a.k and {p.df})"
        cond_dk = f"{form} (select 1 from {tb.name} b where b.k = a.k and {p.dk})"
    return Query("semi", f"select {sdf} from {ta.name} a where {cond_df}", f"select {sdk} from {ta.name} a where {cond_dk}")


def q_join_agg(g):
    """A join to an aggregated derived table: dynamic filters of the join meet the
    aggregation (classes 2 and 3 of the correct-answers issue)."""
    ta, tb = g.pick(g.tables), g.pick(g.tables)
    rnd = g.rnd
    # The grouping key is a cast of a column, named like the column.
    decs = [c for c in tb.of_kind("dec") if c.info["p"] <= 18]
    tss = [c for c in tb.cols if c.kind == "ts" and c.info["tz"] in (None, "UTC")]
    choices = [("v", X("int", "v"), "v")]
    for c in decs:
        choices.append(
            (
                c.name,
                X(
                    "dec",
                    f"cast(cast({c.name} as int) as decimal(12,2))",
                    f"cast(cast(trunc({c.name}) as int) as decimal(12,2))",
                ),
                c.name,
            )
        )
    for c in tss:
        choices.append((c.name, X("date", f"cast({c.name} as date)"), c.name))
    name, key, _ = rnd.choice(choices)
    agg = g.aggregate("", tb, supported_only=True)
    inner_df = f"select {key.df} as {name}, {agg.df} as m, count(*) as n from {tb.name} group by {key.df}"
    inner_dk = f"select {key.dk} as {name}, {agg.dk} as m, count(*) as n from {tb.name} group by {key.dk}"
    if rnd.random() < 0.5:
        # The build side: a one-row constant, or the other table's column of that type.
        if key.kind == "dec":
            lit = X("dec", f"cast('{rnd.randint(-6, 6)}.00' as decimal(12,2))")
        elif key.kind == "date":
            lit = X("date", f"cast('2026-06-0{rnd.randint(2, 6)}' as date)")
        else:
            lit = X("int", str(rnd.randint(-4, 4)))
        build_df = f"(select {lit.df} as x) s"
        build_dk = f"(select {lit.dk} as x) s"
    else:
        build_df = build_dk = f"(select v as x from {ta.name}) s"
        if name != "v":
            return q_join(g)
    df = f"select s.x as q0, d.{name} as q1, d.m as q2, d.n as q3 from {build_df} join ({inner_df}) d on s.x = d.{name}"
    dk = f"select s.x as q0, d.{name} as q1, d.m as q2, d.n as q3 from {build_dk} join ({inner_dk}) d on s.x = d.{name}"
    return Query("join_agg", df, dk)


def q_dup_names(g):
    """Two grouping columns of one name from the two sides of a join, joined on the
    second (apache/datafusion#25264)."""
    ta, tb, tc = g.pick(g.tables), g.pick(g.tables), g.pick(g.tables)
    kind = g.pick(["left join", "join"])
    inner = f"select a.v, b.v from {ta.name} a {kind} {tb.name} b on a.k = b.k group by a.v, b.v"
    # DuckDB names the second `v` `v_1` in a derived table; name both by position.
    df = (
        f"select s.v as q0, d.av as q1, d.bv as q2 from {tc.name} s join "
        f"(select a.v as av, b.v as bv from {ta.name} a {kind} {tb.name} b on a.k = b.k group by a.v, b.v) d "
        f"on s.v = d.bv"
    )
    _ = inner
    return Query("dup_names", df, df)


def q_grouping_sets(g):
    t = g.pick(g.tables)
    keys = [col_x("", c) for c in g.rnd.sample(t.cols[1:], 2)]
    keys = [k for k in keys if k.kind != "float"] or [col_x("", t.cols[1])]
    agg = g.aggregate("", t)
    form = g.pick(["rollup", "cube", "sets"])
    kl = ", ".join(k.df for k in keys)
    if form == "sets":
        by = f"grouping sets (({kl}), ({keys[0].df}), ())"
    else:
        by = f"{form}({kl})"
    grouping = ", ".join(f"grouping({k.df}) as gr{i}" for i, k in enumerate(keys))
    items = ", ".join(f"{k.df} as q{i}" for i, k in enumerate(keys))
    df = f"select {items}, {grouping}, {agg.df} as a0, count(*) as n from {t.name} group by {by}"
    dk = f"select {items}, {grouping}, {agg.dk} as a0, count(*) as n from {t.name} group by {by}"
    return Query("grouping_sets", df, dk)


def q_distinct(g):
    t = g.pick(g.tables)
    items = [g.scalar("", t) for _ in range(g.rnd.randint(1, 3))]
    sdf, sdk = select_list(items)
    p = g.predicate("", t)
    # TLP for DISTINCT: the distinct rows under P, NOT P and P IS NULL, united.
    union_df = " union ".join(f"select {sdf} from {t.name} where {w}" for w in tlp(p.df))
    return Query(
        "distinct",
        f"select distinct {sdf} from {t.name}",
        f"select distinct {sdk} from {t.name}",
        [("tlp-distinct", union_df, f"select distinct {sdf} from {t.name}")],
    )


def q_window(g):
    t = g.pick(g.tables)
    o = col_x("", g.pick([c for c in t.cols if c.kind != "float"]))
    nulls = g.pick(["nulls first", "nulls last"])
    d = g.pick(["asc", "desc"])
    order = f"order by {o.df} {d} {nulls}, id"
    ints = t.of_kind("int")
    fns = [
        f"row_number() over (partition by g {order})",
        f"rank() over (partition by k {order})",
        f"dense_rank() over ({order})",
        "lag(v) over (partition by g order by id)",
        "lead(id, 2) over (order by id)",
        "count(*) over (partition by k)",
    ]
    if ints:
        c = g.pick(ints).name
        fns.append(
            f"sum(cast({c} as bigint)) over (partition by g order by id rows between unbounded preceding and current row)"
        )
        fns.append(f"max({c}) over (partition by k order by id rows between 1 preceding and 1 following)")
    chosen = g.rnd.sample(fns, g.rnd.randint(1, 3))
    items = ", ".join(f"{f} as w{i}" for i, f in enumerate(chosen))
    q = f"select id as q0, {items} from {t.name}"
    return Query("window", q, q)


def q_setop(g):
    ta, tb = g.pick(g.tables), g.pick(g.tables)
    # Columns of one type on both sides.
    pairs = [(a, b) for a in ta.cols for b in tb.cols if a.pa_type == b.pa_type and a.kind != "float"]
    a, b = g.pick(pairs)
    op = g.pick(["union", "union all", "intersect", "except", "intersect all", "except all"])
    pa_ = g.predicate("", ta)
    pb = g.predicate("", tb)
    df = f"select {a.name} as q0, k as q1 from {ta.name} where {pa_.df} {op} select {b.name} as q0, k as q1 from {tb.name} where {pb.df}"
    dk = f"select {a.name} as q0, k as q1 from {ta.name} where {pa_.dk} {op} select {b.name} as q0, k as q1 from {tb.name} where {pb.dk}"
    return Query("setop", df, dk)


def q_topk(g):
    t = g.pick(g.tables)
    rnd = g.rnd
    n = rnd.choice([1, 2, 3, 5, 10])
    if rnd.random() < 0.5:
        # Over a grouped, cast key: the top-k's filter meets the aggregation.
        keys = group_keys(g, "", t, 1)
        k = keys[0]
        if k.kind == "float":
            k = col_x("", t.cols[1])
        nulls = rnd.choice(["nulls first", "nulls last"])
        d = rnd.choice(["asc", "desc"])
        df = f"select {k.df} as q0, count(*) as n from {t.name} group by {k.df} order by q0 {d} {nulls} limit {n}"
        dk = f"select {k.dk} as q0, count(*) as n from {t.name} group by {k.dk} order by q0 {d} {nulls} limit {n}"
        return Query("topk", df, dk)
    items = [col_x("", t.cols[0])] + [g.scalar("", t) for _ in range(2)]
    sdf, sdk = select_list(items)
    o = items[1 if items[1].kind != "float" else 0]
    nulls = rnd.choice(["nulls first", "nulls last"])
    d = rnd.choice(["asc", "desc"])
    df = f"select {sdf} from {t.name} order by q{items.index(o)} {d} {nulls}, q0 limit {n}"
    dk = f"select {sdk} from {t.name} order by q{items.index(o)} {d} {nulls}, q0 limit {n}"
    return Query("topk", df, dk)


def q_scalar_subquery(g):
    ta, tb = g.pick(g.tables), g.pick(g.tables)
    ints = tb.of_kind("int")
    c = g.pick(ints).name if ints else "v"
    df = (
        f"select a.id as q0, (select max({c}) from {tb.name}) as q1, "
        f"(select count(*) from {tb.name} b where b.k = a.k) as q2 from {ta.name} a "
        f"where a.v >= (select min(v) from {tb.name})"
    )
    return Query("scalar_subquery", df, df)


# ---------------------------------------------------------------------------------
# Running idem and DuckDB
# ---------------------------------------------------------------------------------


def job_text(name, tables, src, sql, partitioned, merge_key=None, partition_by=None, target=None):
    lines = [f'name = "{name}"']
    for t in tables:
        lines += [f"[sources.{t.name}]", f"path = {json.dumps(os.path.join(src, t.name) + '/')}", 'format = "parquet"']
    if partitioned:
        sql = f"select q.*, cast($run_date as date) as dt from ({sql}) q"
    lines += ["[transform]", f"sql = {json.dumps(sql)}", "[target]"]
    lines.append('path = "${IDEM_ANSWERS_OUT}/' + (target or name) + '"')
    by = ["dt"] if partitioned else (partition_by or [])
    lines.append(f"partition_by = {json.dumps(by)}")
    if merge_key:
        lines += ['mode = "merge"', f"key = {json.dumps(merge_key)}"]
    return "\n".join(lines) + "\n", sql


def run_one(idem, job, out):
    """`idem run` of one job: (exit code, actions, error text)."""
    args = [idem, "run", job, "--date", RUN_DATE, "--json"]
    p = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, IDEM_ANSWERS_OUT=out), timeout=600)
    actions = []
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            e = json.loads(line)
            actions += [pp.get("action") for pp in e.get("partitions", [])]
    return p.returncode, actions, p.stderr.strip()[-800:]


def run_idem(idem, jobs_dir, out, cluster=False):
    """One `idem backfill` of the folder of jobs; per job, (exit code or 0, actions,
    error text)."""
    args = [idem, "backfill", jobs_dir, "--from", RUN_DATE, "--to", RUN_DATE, "--json"]
    if cluster:
        args += ["--cluster", "standalone"]
    env = dict(os.environ, IDEM_ANSWERS_OUT=out)
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=1800)
    per_job = {}
    # A project's jobs run one after another; a job's `done`/`failed` event comes
    # before the `summary` that names it.
    last = None
    for line in p.stdout.splitlines():
        if not line.startswith("{"):
            continue
        e = json.loads(line)
        ev = e.get("event")
        if ev == "done":
            rep = e.get("report", {})
            last = {
                "code": 0,
                "actions": [pp.get("action") for pp in rep.get("partitions", [])],
                "digests": {pp.get("partition"): pp.get("digest") for pp in rep.get("partitions", [])},
            }
        elif ev in ("failed", "skipped"):
            last = {"code": e.get("exit_code"), "error": e.get("error") or e.get("reason")}
        elif ev == "summary" and last is not None:
            per_job[e["job"]] = last
            last = None
    return p.returncode, per_job, p.stderr


def duck():
    import duckdb

    con = duckdb.connect()
    con.execute("set TimeZone = 'UTC'")
    con.execute("set threads = 1")
    return con


def canon_rel(con, rel):
    """A relation's rows as a multiset of canonical tuples, columns by name."""
    names = rel.columns
    exprs = []
    for n, t in zip(names, rel.types):
        t = str(t).upper()
        q = '"' + n.replace('"', '""') + '"'
        if t.startswith("TIMESTAMP_NS"):
            exprs.append(f"cast(epoch_ns({q}) as hugeint)")
        elif t.startswith("TIMESTAMP"):
            exprs.append(f"cast(epoch_us({q}) as hugeint) * 1000")
        elif t in ("DATE", "TIME", "INTERVAL") or t.startswith("TIME "):
            exprs.append(f"cast({q} as varchar)")
        elif t == "BLOB":
            exprs.append(f"hex({q})")
        else:
            exprs.append(q)
    order = sorted(range(len(names)), key=lambda i: names[i])
    sel = ", ".join(exprs[i] for i in order)
    rows = con.execute(f"select {sel} from rel").fetchall() if names else []
    return [names[i] for i in order], collections.Counter(tuple(canon(v) for v in r) for r in rows)


def canon(v):
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if v == 0:
            return "0"
        return repr(float(f"{v:.10g}")) if math.isfinite(v) else str(v)
    if isinstance(v, decimal.Decimal):
        n = v.normalize()
        return "0" if n == 0 else format(n, "f")
    if isinstance(v, int):
        return str(v)
    return str(v)


def oracle_rows(con, views, sql):
    for name, d in views.items():
        con.execute(f"create or replace view {name} as select * from read_parquet('{d}/*.parquet')")
    rel = con.sql(sql)
    return canon_rel(con, rel)


def table_rows(con, d):
    files = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs if f.endswith(".parquet")]
    if not files:
        return None
    rel = con.sql(f"select * from read_parquet('{d}/**/*.parquet', hive_partitioning=true, hive_types_autocast=false, union_by_name=true)")
    return canon_rel(con, rel)


def diff(a, b, limit=5):
    only_a = list((a - b).elements())[:limit]
    only_b = list((b - a).elements())[:limit]
    return only_a, only_b


# ---------------------------------------------------------------------------------
# The search
# ---------------------------------------------------------------------------------


def world_seed(seed, w):
    return seed * 1_000_003 + w


def build_world(seed, w, nq, base, nmerges=0):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rnd = random.Random(world_seed(seed, w))
    tables = make_world(rnd, pa)
    root = os.path.join(base, f"w{w}")
    src = os.path.join(root, "src")
    os.makedirs(src)
    layout = write_world(rnd, pa, pq, tables, src)
    g = Gen(rnd, tables)
    jobs_dir = os.path.join(root, "jobs")
    os.makedirs(jobs_dir)

    def write_job(name, sql, partitioned=False):
        text, sql = job_text(name, tables, src, sql, partitioned)
        with open(os.path.join(jobs_dir, name + ".toml"), "w") as f:
            f.write(text)
        return sql

    cases = []
    for qi in range(nq):
        q, shape = gen_query(g)
        partitioned = " as dt " not in q.df and rnd.random() < 0.3
        name = f"w{w}q{qi}"
        df = write_job(name, q.df, partitioned)
        dk = q.dk
        if partitioned:
            dk = f"select q.*, cast('{RUN_DATE}' as date) as dt from ({q.dk}) q"
        case = {"name": name, "query": qi, "shape": shape, "df": df, "dk": dk, "pairs": []}
        # Metamorphic pairs: both sides through idem, compared with each other.
        for vi, (check, one, other) in enumerate(q.variants):
            a, b = f"{name}m{vi}a", f"{name}m{vi}b"
            write_job(a, one)
            write_job(b, other)
            case["pairs"].append({"check": check, "a": a, "b": b, "a_sql": one, "b_sql": other})
        cases.append(case)
    merges = []
    merges_dir = os.path.join(root, "merges")
    os.makedirs(merges_dir)
    for mi in range(nmerges):
        merges.append(gen_merge(g, tables, src, merges_dir, f"w{w}m{mi}"))
    return tables, layout, jobs_dir, src, cases, merges


def gen_merge(g, tables, src, merges_dir, name):
    """A merge by `id` into a table a replace run wrote: some keys matched (their `k`
    and partition column `v` changed), some new. The oracle is the base's rows whose
    key the source lacks, and the source's rows."""
    t = tables[0]
    extra = g.rnd.sample(t.cols[4:], min(len(t.cols) - 4, g.rnd.randint(1, 3)))
    cols = ", ".join(c.name for c in extra)
    p1, p2 = g.predicate("", t), g.predicate("", t)
    base = f"select id, k, g, v, {cols} from {t.name} where {p1.df}"
    base_dk = f"select id, k, g, v, {cols} from {t.name} where {p1.dk}"
    change = (
        "select id, cast(coalesce(k, 0) + 1 as int) as k, g, "
        "cast(coalesce(v, 0) + {} as smallint) as v, " + cols + " from " + t.name + " where {}"
    )
    shift = g.rnd.choice([0, 1])
    src_df, src_dk = change.format(shift, p2.df), change.format(shift, p2.dk)
    by = g.rnd.choice([[], ["v"]])
    paths = []
    for job, sql, key in ((name + "base", base, None), (name, src_df, ["id"])):
        text, _ = job_text(job, tables, src, sql, False, merge_key=key, partition_by=by, target=name)
        path = os.path.join(merges_dir, job + ".toml")
        with open(path, "w") as f:
            f.write(text)
        paths.append(path)
    oracle = f"select * from ({base_dk}) b where id not in (select id from ({src_dk}) s) union all {src_dk}"
    return {"name": name, "base_job": paths[0], "merge_job": paths[1], "dk": oracle, "base": base, "source": src_df,
            "partition_by": by}


def check_world(idem, seed, w, nq, base, cluster, only=None, nmerges=0):
    """Builds world `w` of `seed`, runs its jobs through idem (twice, and on a cluster
    with `cluster`) and compares. Returns counts, failures and idem's refusals."""
    tables, layout, jobs_dir, src, cases, merges = build_world(seed, w, nq, base, nmerges)
    if only is not None:
        cases = [c for c in cases if c["query"] == only]
        keep = {c["name"] for c in cases} | {p[k] for c in cases for p in c["pairs"] for k in ("a", "b")}
        for f in os.listdir(jobs_dir):
            if f[: -len(".toml")] not in keep:
                os.remove(os.path.join(jobs_dir, f))
    out = os.path.join(base, f"w{w}", "out")
    stats = collections.Counter()
    failures = []
    refusals = []

    def fail(case, what, **more):
        failures.append(
            {
                "replay": f"--seed {seed} --world {w} --queries {nq} --merges {nmerges} --query {case['query']}",
                "case": case["name"],
                "shape": case["shape"],
                "what": what,
                **more,
            }
        )

    _, first, stderr = run_idem(idem, jobs_dir, out)
    _, second, _ = run_idem(idem, jobs_dir, out)
    stats["idem_runs"] += 2
    third = None
    if cluster:
        _, third, _ = run_idem(idem, jobs_dir, os.path.join(base, f"w{w}", "out-cluster"), cluster=True)
        stats["idem_runs"] += 1
    con = duck()
    views = {t.name: os.path.join(src, t.name) for t in tables}
    for case in cases:
        stats["queries"] += 1
        stats["shape:" + case["shape"]] += 1
        r = first.get(case["name"])
        if r is None:
            fail(case, "idem reported nothing for the job", stderr=stderr[-2000:])
            continue
        try:
            o_names, o_rows = oracle_rows(con, views, case["dk"])
            o_err = None
        except Exception as e:  # noqa: BLE001 - the oracle's refusal, compared below
            o_err = str(e).splitlines()[0]
        if r["code"] != 0:
            stats["refused"] += 1
            if r["code"] not in (2, 5):
                fail(case, f"idem exited {r['code']}: a failure of the query itself must exit 2 or 5",
                     error=r.get("error"), sql=case["df"])
            elif o_err is None:
                refusals.append({"case": case["name"], "code": r["code"], "error": (r.get("error") or "")[-400:]})
            continue
        if o_err is not None:
            fail(case, "idem wrote rows where the oracle fails", oracle_error=o_err, df=case["df"], dk=case["dk"])
            continue
        got = table_rows(con, os.path.join(out, case["name"]))
        if got is None:
            fail(case, "idem's table has no files")
            continue
        names, rows = got
        stats["rows_compared"] += sum(o_rows.values())
        if names != o_names:
            fail(case, "columns differ", idem=names, oracle=o_names, df=case["df"])
        elif rows != o_rows:
            only_idem, only_oracle = diff(rows, o_rows)
            fail(case, "rows differ from the oracle's", only_idem=only_idem, only_oracle=only_oracle,
                 df=case["df"], dk=case["dk"])
        else:
            stats["queries_equal"] += 1
        r2 = second.get(case["name"], {})
        if r2.get("code") != 0 or any(a != "unchanged" for a in r2.get("actions", ["?"])):
            fail(case, "the re-run was not `unchanged`", first=r, second=r2, df=case["df"])
        else:
            stats["reruns_unchanged"] += 1
        if third is not None:
            r3 = third.get(case["name"], {})
            if r3.get("code") == 2:
                refusals.append({"case": case["name"] + " (cluster)", "code": 2, "error": (r3.get("error") or "")[-400:]})
            elif r3.get("code") != 0 or r3.get("digests") != r.get("digests"):
                fail(case, "--cluster standalone wrote other rows", local=r.get("digests"), cluster=r3, df=case["df"])
            else:
                stats["cluster_same"] += 1
        for pair in case["pairs"]:
            ra, rb = first.get(pair["a"], {}), first.get(pair["b"], {})
            if ra.get("code") != 0 or rb.get("code") != 0:
                for side, rr in (("a", ra), ("b", rb)):
                    if rr.get("code") not in (0, 2, 5):
                        fail(case, f"{pair['check']} query exited {rr.get('code')}", error=rr.get("error"),
                             sql=pair[side + "_sql"])
                continue
            a = table_rows(con, os.path.join(out, pair["a"]))
            b = table_rows(con, os.path.join(out, pair["b"]))
            stats[pair["check"].split("-")[0]] += 1
            if a is None or b is None or a[1] != b[1]:
                x, y = diff(a[1], b[1]) if a and b else ([], [])
                fail(case, f"{pair['check']}: the two forms give different rows", only_first=x, only_second=y,
                     first=pair["a_sql"], second=pair["b_sql"])
    for m in merges:
        replay = f"--seed {seed} --world {w} --queries {nq} --merges {nmerges}"
        check_merge(idem, con, views, m, out, stats, failures, refusals, replay)
    return stats, failures, refusals, layout


def check_merge(idem, con, views, m, out, stats, failures, refusals, replay):
    """Runs a merge case: the base, the merge, the merge again (`unchanged`)."""
    def fail(what, **more):
        failures.append({"replay": replay, "case": m["name"], "shape": "merge",
                         "what": what, "base": m["base"], "source": m["source"],
                         "partition_by": m["partition_by"], **more})

    stats["merges"] += 1
    code, _, err = run_one(idem, m["base_job"], out)
    if code != 0:
        if code not in (2, 5):
            fail(f"the base run exited {code}", error=err)
        else:
            refusals.append({"case": m["name"] + "base", "code": code, "error": err})
        return
    code, _, err = run_one(idem, m["merge_job"], out)
    if code != 0:
        if code not in (2, 5):
            fail(f"the merge exited {code}", error=err)
        else:
            refusals.append({"case": m["name"], "code": code, "error": err})
        return
    code, actions, err = run_one(idem, m["merge_job"], out)
    if code != 0 or any(a != "unchanged" for a in actions):
        fail("the merge run again was not `unchanged`", code=code, actions=actions, error=err)
    else:
        stats["merge_reruns_unchanged"] += 1
    _, want = oracle_rows(con, views, m["dk"])
    if m["partition_by"]:
        # A partition column comes back as text from the directory names.
        want_sql = f"select * replace (cast(v as varchar) as v) from ({m['dk']})"
        _, want = oracle_rows(con, views, want_sql)
    got = table_rows(con, os.path.join(out, m["name"]))
    if got is None and m["partition_by"]:
        got = ([], collections.Counter())  # a partitioned table of no rows has no files
    stats["rows_compared"] += sum(want.values())
    if got is None or got[1] != want:
        a, b = diff(got[1], want) if got else ([], [])
        fail("merged rows differ from the oracle's", only_idem=a, only_oracle=b)
    else:
        stats["merges_equal"] += 1


def search(args):
    base = args.keep or tempfile.mkdtemp(prefix="idem-answers-")
    os.makedirs(base, exist_ok=True)
    total = collections.Counter()
    failures, refusals = [], []
    try:
        for w in range(args.worlds):
            stats, fails, refused, _ = check_world(args.idem, args.seed, w, args.queries, base, args.cluster, None, args.merges)
            total.update(stats)
            total["worlds"] += 1
            failures += fails
            refusals += refused
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    summary = {"seed": args.seed, **dict(sorted(total.items())), "refusals": refusals, "failures": failures}
    print(json.dumps(summary, default=str))


def replay(args):
    base = args.keep or tempfile.mkdtemp(prefix="idem-answers-")
    os.makedirs(base, exist_ok=True)
    stats, fails, refused, layout = check_world(
        args.idem, args.seed, args.world, args.queries, base, args.cluster, args.query, args.merges
    )
    out = {"stats": stats, "layout": layout, "refusals": refused, "failures": fails, "dir": base}
    print(json.dumps(out, indent=1, default=str))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("search", "replay"):
        p = sub.add_parser(name)
        p.add_argument("--idem", required=True)
        p.add_argument("--seed", type=int, required=True)
        p.add_argument("--queries", type=int, default=16)
        p.add_argument("--merges", type=int, default=0)
        p.add_argument("--cluster", action="store_true")
        p.add_argument("--keep")
        if name == "search":
            p.add_argument("--worlds", type=int, default=4)
        else:
            p.add_argument("--world", type=int, required=True)
            p.add_argument("--query", type=int)
    args = ap.parse_args()
    (search if args.cmd == "search" else replay)(args)


if __name__ == "__main__":
    main()
