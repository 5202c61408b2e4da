"""End-to-end test of idem_pipelines.dagster against a real idem binary (no pytest):

    IDEM_BIN=target/release/idem /tmp/dagster-venv/bin/python deploy/dagster/test_idem_dagster.py

In a temporary directory it copies testdata/jobs/, generates the raw orders the
README's example job reads (`idem gen orders`, the same files as testdata/lake/raw/),
and materializes partitions in-process with dagster.materialize. Prints
"N passed, N failed[, N skipped]" last; exits 1 on any failure. A test that needs a
newer idem (exit code 5 comes with `idem dates`) is skipped on an older binary.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")  # preview/beta warnings of dagster APIs

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
try:  # the installed package, else the one in this checkout
    import idem_pipelines  # noqa: F401
except ImportError:
    sys.path.insert(0, str(REPO / "python"))

import dagster as dg
from idem_pipelines.dagster import idem_job_asset, idem_project_assets

RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"
FAST_RETRY = dg.RetryPolicy(max_retries=2, delay=0.1)
# Dagster's console logger at CRITICAL: the expected failures would fill the output.
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def materialize(assets, *, partition=None, first=None, last=None, selection=None,
                raise_on_error=True):
    tags = {RANGE_START: first, RANGE_END: last} if first else None
    return dg.materialize(
        assets, instance=dg.DagsterInstance.ephemeral(), partition_key=partition,
        tags=tags, run_config=QUIET, selection=selection, raise_on_error=raise_on_error,
    )


def materializations(result, asset_name):
    """{partition: {metadata key: value}} of the run's materializations of an asset."""
    out = {}
    for event in result.all_events:
        if event.event_type_value != "ASSET_MATERIALIZATION":
            continue
        m = event.event_specific_data.materialization
        if m.asset_key.path[-1] != asset_name:
            continue
        assert m.partition not in out, f"two materializations of {asset_name} {m.partition}"
        out[m.partition] = {k: v.value for k, v in m.metadata.items()}
    return out


def step_events(result):
    return [e.event_type_value for e in result.all_events if e.is_step_event]


def step_failure(result):
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert len(failures) == 1, step_events(result)
    data = failures[0].event_specific_data
    md = {k: v.value for k, v in (data.user_failure_data.metadata or {}).items()}
    return data, md


class Skip(Exception):
    """The test does not apply to this binary."""


class Lake:
    """A temporary project root: testdata/jobs/ and the generated raw orders."""

    def __init__(self, idem: str) -> None:
        self.idem = idem
        self.root = Path(tempfile.mkdtemp(prefix="idem-dagster-test-"))
        shutil.copytree(REPO / "testdata" / "jobs", self.root / "testdata" / "jobs")
        subprocess.run(
            [idem, "gen", "orders", "--out", "testdata/lake/raw/orders"],
            cwd=self.root, check=True, capture_output=True,
        )
        subprocess.run(
            [idem, "gen", "customers", "--out", "testdata/lake/raw/customers"],
            cwd=self.root, check=True, capture_output=True,
        )

    def job(self, name: str) -> Path:
        return self.root / "testdata" / "jobs" / f"{name}.toml"

    def write_job(self, name: str, text: str) -> Path:
        path = self.root / "testdata" / "jobs_extra" / f"{name}.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def asset(self, job: Path, **kw):
        kw.setdefault("retry_policy", FAST_RETRY)
        return idem_job_asset(job, start_date="2026-06-01", workdir=self.root, **kw)


# --------------------------------------------------------------------------- the tests


def test_partitions_follow_the_grain(lake: Lake) -> None:
    fct = lake.asset(lake.job("fct_orders"))
    assert isinstance(fct.partitions_def, dg.DailyPartitionsDefinition)
    assert fct.partitions_def.get_first_partition_key() == "2026-06-01"
    base = lake.job("fct_orders").read_text()
    hourly = lake.write_job("hourly", base.replace('grain = "day"', 'grain = "hour"').replace(
        'name = "fct_orders"', 'name = "hourly"'))
    monthly = lake.write_job("monthly", base.replace('grain = "day"', 'grain = "month"').replace(
        'name = "fct_orders"', 'name = "monthly"'))
    h = idem_job_asset(hourly, start_date="2026-06-01", end_date="2026-06-02")
    m = idem_job_asset(monthly, start_date="2026-01-01", end_date="2026-07")
    assert isinstance(h.partitions_def, dg.HourlyPartitionsDefinition)
    assert h.partitions_def.get_partition_keys()[:2] == ["2026-06-01T00", "2026-06-01T01"]
    assert len(h.partitions_def.get_partition_keys()) == 24
    assert isinstance(m.partitions_def, dg.MonthlyPartitionsDefinition)
    assert m.partitions_def.get_partition_keys() == [f"2026-0{i}" for i in range(1, 7)]
    # daily_sales.toml has no grain: idem's default, day.
    ds = lake.asset(lake.job("daily_sales"))
    assert isinstance(ds.partitions_def, dg.DailyPartitionsDefinition)


def test_a_range_is_one_backfill_then_unchanged(lake: Lake) -> None:
    fct = lake.asset(lake.job("fct_orders"))
    r = materialize([fct], first="2026-06-01", last="2026-06-03")
    assert r.success
    assert step_events(r).count("STEP_START") == 1, step_events(r)
    mats = materializations(r, "fct_orders")
    assert sorted(mats) == ["2026-06-01", "2026-06-02", "2026-06-03"], mats
    expected_rows = {"2026-06-01": 946, "2026-06-02": 946, "2026-06-03": 941}
    for key, md in mats.items():
        assert md["action"] == "written", (key, md)
        assert md["rows"] == expected_rows[key] == md["dagster/row_count"], (key, md)
        assert md["bytes"] > 0 and len(md["digest"]) == 32, md
        assert md["idem_partitions"][f"dt={key}"]["action"] == "written"
        # ONE idem process for the range:
        assert " backfill " in md["idem_command"], md["idem_command"]
        assert "--from 2026-06-01 --to 2026-06-03" in md["idem_command"], md["idem_command"]
        assert md["idem_summary"]["written"] == 3, md["idem_summary"]
    assert (lake.root / "lake/analytics/fct_orders/dt=2026-06-02").is_dir()
    digests = {k: md["digest"] for k, md in mats.items()}

    again = materialize([fct], first="2026-06-01", last="2026-06-03")
    mats2 = materializations(again, "fct_orders")
    assert sorted(mats2) == sorted(mats)
    for key, md in mats2.items():
        assert md["action"] == "unchanged", (key, md)
        assert md["digest"] == digests[key], (key, md)

    fresh = materialize([lake.asset(lake.job("fct_orders"), skip_fresh=True)],
                        first="2026-06-01", last="2026-06-03")
    for key, md in materializations(fresh, "fct_orders").items():
        assert md["action"] == "fresh", (key, md)
        assert "--skip-fresh" in md["idem_command"]
        assert md["digest"] == digests[key]
    one = materialize([lake.asset(lake.job("fct_orders"), skip_fresh=True)],
                      partition="2026-06-02")
    md = materializations(one, "fct_orders")["2026-06-02"]
    assert md["action"] == "fresh" and md["digest"] == digests["2026-06-02"], md


def test_one_partition_is_one_run(lake: Lake) -> None:
    fct = lake.asset(lake.job("fct_orders"))
    r = materialize([fct], partition="2026-06-04")
    md = materializations(r, "fct_orders")["2026-06-04"]
    assert md["action"] == "written", md
    assert " run " in md["idem_command"] and "--date 2026-06-04" in md["idem_command"], md
    r = materialize([fct], partition="2026-06-04")
    md = materializations(r, "fct_orders")["2026-06-04"]
    assert md["action"] == "unchanged", md
    # A day without raw orders: idem publishes an empty partition.
    r = materialize([fct], partition="2026-06-20")
    md = materializations(r, "fct_orders")["2026-06-20"]
    assert md["action"] == "emptied" and md["rows"] == 0, md


def test_a_bad_job_fails_without_retry(lake: Lake) -> None:
    text = lake.job("fct_orders").read_text()
    bad = lake.write_job("bad_sql", text.replace("amount_usd,", "no_such_column,").replace(
        'name = "fct_orders"', 'name = "bad_sql"').replace("fct_orders/", "bad_sql/"))
    for kwargs in ({"partition": "2026-06-02"}, {"first": "2026-06-01", "last": "2026-06-02"}):
        r = materialize([lake.asset(bad)], raise_on_error=False, **kwargs)
        assert not r.success
        events = step_events(r)
        assert "STEP_UP_FOR_RETRY" not in events, events  # RetryPolicy bypassed
        data, md = step_failure(r)
        assert data.error.cls_name == "Failure", data.error
        assert md["exit_code"] == 2 and md["retryable"] is False, md
        assert materializations(r, "bad_sql") == {}
    # With raise_on_error, the Failure itself says it may not be retried.
    try:
        materialize([lake.asset(bad)], partition="2026-06-02")
    except dg.Failure as failure:
        assert failure.allow_retries is False
        assert "exit 2" in failure.description, failure.description
    else:
        raise AssertionError("a bad job materialized")


def test_a_failed_check_is_final(lake: Lake) -> None:
    text = lake.job("fct_orders").read_text()
    chk = lake.write_job("too_few_rows", text.replace(
        'name = "fct_orders"', 'name = "too_few_rows"').replace(
        "fct_orders/", "too_few_rows/") + "\n[checks]\nmin_rows = 100000\n")
    r = materialize([lake.asset(chk)], partition="2026-06-02", raise_on_error=False)
    assert "STEP_UP_FOR_RETRY" not in step_events(r)
    _, md = step_failure(r)
    assert md["exit_code"] == 3 and md["retryable"] is False, md
    assert not (lake.root / "lake/analytics/too_few_rows/dt=2026-06-02").exists()


def test_a_transform_error_on_the_data_is_final(lake: Lake) -> None:
    # Exit code 5 ("the transform failed on this date's data") is newer than some
    # binaries, which exit 1 here; the test needs one that has `idem dates`.
    if subprocess.run([lake.idem, "dates", "--help"], capture_output=True).returncode != 0:
        raise Skip("this idem has no `dates` command, so no exit code 5 yet")
    text = lake.job("fct_orders").read_text()
    cast = lake.write_job("bad_cast", text.replace(
        "select order_id,", "select cast(status as int) as status_code, order_id,").replace(
        'name = "fct_orders"', 'name = "bad_cast"').replace("fct_orders/", "bad_cast/"))
    r = materialize([lake.asset(cast)], partition="2026-06-02", raise_on_error=False)
    assert "STEP_UP_FOR_RETRY" not in step_events(r), step_events(r)
    _, md = step_failure(r)
    assert md["exit_code"] == 5 and md["retryable"] is False, md


def test_a_store_error_is_retried(lake: Lake) -> None:
    # A stand-in for idem that fails as an unreachable store would: exit 1.
    fake = lake.root / "fake-idem"
    fake.write_text("#!/bin/sh\necho 'error: connection reset by peer' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    asset = lake.asset(lake.job("fct_orders"), idem_bin=str(fake))
    for kwargs in ({"partition": "2026-06-02"}, {"first": "2026-06-01", "last": "2026-06-02"}):
        r = materialize([asset], raise_on_error=False, **kwargs)
        events = step_events(r)
        assert events.count("STEP_UP_FOR_RETRY") == 2, events  # FAST_RETRY.max_retries
        data, md = step_failure(r)
        assert md["exit_code"] == 1 and md["retryable"] is True, md
        assert "connection reset" in md["stderr"], md


def test_a_range_that_fails_halfway_records_what_landed(lake: Lake) -> None:
    # orders exist for 2026-06-01..07 only; a job that refuses an empty output fails
    # on 2026-06-08 (a check: final) after 2026-06-07 landed.
    text = lake.job("fct_orders").read_text()
    job = lake.write_job("half", text.replace('name = "fct_orders"', 'name = "half"').replace(
        "fct_orders/", "half/") + "\n[checks]\nmin_rows = 1\n")
    r = materialize([lake.asset(job)], first="2026-06-07", last="2026-06-08",
                    raise_on_error=False)
    assert not r.success
    assert "STEP_UP_FOR_RETRY" not in step_events(r)
    mats = materializations(r, "half")
    assert list(mats) == ["2026-06-07"] and mats["2026-06-07"]["action"] == "written", mats
    _, md = step_failure(r)
    assert md["exit_code"] == 3, md
    assert "2026-06-08" in md["failed_dates"], md


def test_a_project_becomes_assets_in_dependency_order(lake: Lake) -> None:
    assets = idem_project_assets(lake.root / "testdata" / "jobs", start_date="2026-06-01",
                                 workdir=lake.root, retry_policy=FAST_RETRY)
    by_name = {a.key.path[-1]: a for a in assets}
    assert set(by_name) == {"fct_orders", "daily_sales", "orders_by_country"}, by_name
    deps = {k.path[-1] for k in by_name["daily_sales"].asset_deps[by_name["daily_sales"].key]}
    assert deps == {"fct_orders"}, deps
    r = materialize(assets, first="2026-06-01", last="2026-06-03",
                    selection=["fct_orders", "daily_sales"])
    assert r.success
    ds = materializations(r, "daily_sales")
    assert sorted(ds) == ["2026-06-01", "2026-06-02", "2026-06-03"]
    assert all(md["action"] == "written" and md["rows"] > 0 for md in ds.values()), ds
    fct = materializations(r, "fct_orders")
    assert all(md["action"] == "unchanged" for md in fct.values()), fct


def main() -> int:
    idem = os.environ.get("IDEM_BIN") or shutil.which("idem")
    if not idem or not shutil.which(idem):
        print("set IDEM_BIN to the idem binary (or put idem on PATH)", file=sys.stderr)
        return 2
    idem = str(Path(shutil.which(idem)).resolve())
    os.environ["IDEM_BIN"] = idem
    print(f"dagster {dg.__version__}, idem {subprocess.run([idem, '--version'], capture_output=True, text=True).stdout.strip()}")
    lake = Lake(idem)
    tests = [(n, f) for n, f in globals().items() if n.startswith("test_") and callable(f)]
    passed = failed = skipped = 0
    try:
        for name, fn in tests:
            try:
                fn(lake)
            except Skip as why:
                skipped += 1
                print(f"skip {name}: {why}")
            except Exception:
                failed += 1
                print(f"FAIL {name}")
                traceback.print_exc()
            else:
                passed += 1
                print(f"ok   {name}")
    finally:
        if failed == 0:
            shutil.rmtree(lake.root, ignore_errors=True)
        else:
            print(f"kept {lake.root}")
    print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
