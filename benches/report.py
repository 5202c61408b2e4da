"""The one report of benches/all.sh: W1-W6 in one table, and each workload's best
peer over idem as users run it (`idem`) and written in full (`idem-write`), with
idem's peak memory over DuckDB's.

    python3 benches/report.py target/bench-all/<time>
"""

import json
import os
import statistics
import sys

# Contestants that are idem, and those that are not peers of a per-date run (the
# bulk statement writes the whole range at once, and is not idempotent).
IDEM = ("idem", "idem-write")
NOT_PEERS = ("duckdb-bulk",)
# The ratio to the best peer idem aims at: printed in bold from there on.
GOAL = 1.5


def shared_records(path):
    """(workload, engine, version, walls, peak RSS, check) from the harness."""
    with open(path) as f:
        summary = json.load(f)
    versions = summary.get("versions", {})
    for r in summary["records"]:
        runs = r.get("runs", [])
        ok = r["check"] == "ok" and runs
        yield (
            r["workload"],
            r["engine"],
            versions.get(r["engine"], r["engine"]),
            [x["wall_s"] for x in runs] if ok else [],
            max((x["rss_mib"] for x in runs), default=0),
            "ok" if ok else r["check"],
        )


def more_records(path, workload):
    with open(path) as f:
        more = json.load(f)
    for r in more["records"]:
        ok = r["check"] == "ok" and r["wall_s"]
        yield (
            workload,
            r["engine"],
            r["version"],
            r["wall_s"] if ok else [],
            max(r["rss_mib"], default=0),
            "ok" if ok else r["check"],
        )


def main():
    out = sys.argv[1]
    rows = list(shared_records(os.path.join(out, "shared", "summary.json")))
    for w in ("w5", "w6"):
        path = os.path.join(out, f"{w}.json")
        if os.path.exists(path):
            rows += list(more_records(path, w))
    with open(os.path.join(out, "header.txt")) as f:
        print(f.read().strip())
    with open(os.path.join(out, "shared", "summary.json")) as f:
        probe = json.load(f).get("cpu_probe_mib_s")
    if probe:
        print(f"cpu probe (sha256, one core, W1-W4): {probe[0]} MiB/s before, "
              f"{probe[1]} MiB/s after")
    print()
    print("| workload | engine | median wall s | min-max s | peak RSS MiB | check |")
    print("|---|---|---:|---:|---:|---|")
    for w, e, v, t, m, c in rows:
        if t:
            print(f"| {w.upper()} | {v} | {statistics.median(t):.2f} | "
                  f"{min(t):.2f}-{max(t):.2f} | {m:.0f} | {c} |")
        else:
            print(f"| {w.upper()} | {v} | - | - | - | {c} |")
    print()
    print("Best peer over idem (above 1: idem is faster; bold from the goal of "
          f"{GOAL}), and idem's peak memory over DuckDB's:")
    print()
    print("| workload | best peer | `idem` (as run) | `idem-write` (in full) "
          "| RSS `idem-write` / DuckDB |")
    print("|---|---|---:|---:|---:|")
    for w in sorted({r[0] for r in rows}):
        mine = {e: (statistics.median(t), m) for x, e, _, t, m, _ in rows if x == w and t}
        peers = [(mine[e][0], e) for e in mine if e not in IDEM + NOT_PEERS]
        if not peers:
            continue
        best, who = min(peers)

        def ratio(e):
            if e not in mine:
                return "-"
            r = best / mine[e][0]
            return f"**{r:.2f}**" if r >= GOAL else f"{r:.2f}"

        duck = mine.get("duckdb")
        rss = (f"{mine['idem-write'][1] / duck[1]:.2f}"
               if duck and "idem-write" in mine else "-")
        print(f"| {w.upper()} | {who} {best:.2f} s | {ratio('idem')} | {ratio('idem-write')} "
              f"| {rss} |")


if __name__ == "__main__":
    main()
