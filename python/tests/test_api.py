"""The Python API against the real binary: reports, streamed backfill events, and one
exception class per exit code, each with idem's error text and the table unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import idem_pipelines as idem
import pytest
from conftest import daily_job

FCT = "testdata/jobs/fct_orders.toml"


def files(root: Path) -> dict:
    """Every file under `root` with its size and mtime: what a failed run must not
    change."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def test_the_binary_is_the_wheels_when_installed():
    if os.environ.get("IDEM_BIN"):
        pytest.skip("IDEM_BIN points at a build from source")
    path = Path(idem.find_idem())
    assert path.parent == Path(sysconfig.get_path("scripts")), path
    out = subprocess.run(
        [sys.executable, "-m", "idem_pipelines", "--version"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and out.stdout.startswith("idem "), out


def test_run_reports_partitions_and_a_rerun_is_unchanged(lake: Path):
    first = idem.run(FCT, "2026-06-02", cwd=lake)
    assert first.job == "fct_orders"
    assert first.logical_date == "2026-06-02"
    assert [(p.partition, p.action) for p in first.partitions] == [
        ("dt=2026-06-02", "written")
    ]
    part = first.partitions[0]
    assert (
        part.rows > 0 and part.bytes > 0 and part.files == 1 and len(part.digest) == 32
    )
    assert first.written == [part] and first.unchanged == []

    again = idem.run(FCT, "2026-06-02", cwd=lake)
    assert [(p.partition, p.action) for p in again.partitions] == [
        ("dt=2026-06-02", "unchanged")
    ]
    assert again.partitions[0].digest == part.digest
    assert again.partitions[0].rows == part.rows

    status = idem.status("lake/analytics/fct_orders", cwd=lake)
    live = status.partition("dt=2026-06-02")
    assert live is not None
    assert (live.state, live.rows, live.digest, live.job) == (
        "managed",
        part.rows,
        part.digest,
        "fct_orders",
    )
    assert live.logical_date == "2026-06-02" and live.input_state == "current"
    assert status.rows == part.rows


def test_vars_are_bound(lake: Path):
    job = daily_job(lake, "by_status")
    job.write_text(
        job.read_text().replace(
            "where created_date = $run_date",
            "where created_date = $run_date and status = $wanted",
        )
    )
    paid = (
        idem.run(job, "2026-06-02", vars={"wanted": "paid"}, cwd=lake)
        .partitions[0]
        .rows
    )
    everything = (
        idem.run(daily_job(lake, "all"), "2026-06-02", cwd=lake).partitions[0].rows
    )
    assert 0 < paid < everything


def test_backfill_yields_each_event_and_a_summary(lake: Path):
    running = idem.backfill(
        FCT, "2026-06-01", "2026-06-03", cwd=lake, concurrency=1, oldest_first=True
    )
    assert isinstance(running, idem.Backfill)
    events = list(running)
    assert running.exit_code == 0
    kinds = [type(e).__name__ for e in events]
    assert kinds == [
        "Started",
        "Done",
        "Started",
        "Done",
        "Started",
        "Done",
        "Summary",
    ], kinds
    done = [e for e in events if isinstance(e, idem.Done)]
    assert [e.logical_date for e in done] == ["2026-06-01", "2026-06-02", "2026-06-03"]
    assert all(e.report.partitions[0].action == "written" for e in done)
    summary = events[-1]
    assert (summary.dates, summary.succeeded, summary.written, summary.failed) == (
        3,
        3,
        3,
        0,
    )
    assert summary.rows == sum(e.report.rows for e in done)

    again = idem.backfill(FCT, "2026-06-01", "2026-06-03", cwd=lake).wait()
    assert [
        p.action for e in again if isinstance(e, idem.Done) for p in e.report.partitions
    ] == ["unchanged"] * 3


def test_events_arrive_before_the_backfill_ends(lake: Path, tmp_path: Path):
    # Every date pauses before it publishes until `before_publish.resume` exists: the
    # first date's start must be seen while the backfill is held there.
    gate = tmp_path / "gate"
    gate.mkdir()
    running = idem.backfill(
        FCT,
        "2026-06-01",
        "2026-06-03",
        cwd=lake,
        concurrency=1,
        oldest_first=True,
        env={"IDEM_FAILPOINTS": f"before_publish=pause:{gate}"},
    )
    first = next(running)
    assert isinstance(first, idem.Started) and first.logical_date == "2026-06-01"
    deadline = time.monotonic() + 120
    while not (gate / "before_publish.paused").exists():
        assert time.monotonic() < deadline, "the run never reached its publish"
        time.sleep(0.05)
    assert running.exit_code is None and running._proc.poll() is None
    (gate / "before_publish.resume").touch()
    rest = running.wait()
    assert running.exit_code == 0
    assert [e.logical_date for e in rest if isinstance(e, idem.Done)] == [
        "2026-06-01",
        "2026-06-02",
        "2026-06-03",
    ]


def test_bad_input_names_the_argument(lake: Path):
    with pytest.raises(idem.BadInput) as e:
        idem.run(FCT, "2026-13-02", cwd=lake)
    assert e.value.exit_code == 2 and not e.value.retryable
    assert "invalid --date `2026-13-02`" in str(e.value)
    with pytest.raises(idem.BadInput, match="nope.toml"):
        idem.run("jobs/nope.toml", "2026-06-02", cwd=lake)
    assert not (lake / "lake").exists()


def test_check_failed_names_the_partition_and_publishes_nothing(lake: Path):
    ok = daily_job(lake, "checked")
    idem.run(ok, "2026-06-02", cwd=lake)
    before = files(lake / "out" / "checked")
    bad = ok.read_text() + '\n[checks]\naccepted_values = { status = ["paid"] }\n'
    ok.write_text(bad.replace("order_id, status", "order_id, upper(status) as status"))
    with pytest.raises(idem.CheckFailed) as e:
        idem.run(ok, "2026-06-02", cwd=lake)
    assert e.value.exit_code == 3
    assert e.value.partition == "dt=2026-06-02"
    assert "accepted_values" in e.value.message and "dt=2026-06-02" in e.value.message
    assert files(lake / "out" / "checked") == before


def test_a_transform_failing_on_the_data_is_a_data_error(lake: Path):
    job = daily_job(lake, "cast", select="cast(status as int) as n")
    with pytest.raises(idem.DataError) as e:
        idem.run(job, "2026-06-02", cwd=lake)
    assert e.value.exit_code == 5
    assert "cast" in e.value.message.lower()
    assert not (lake / "out" / "cast" / "dt=2026-06-02").exists()


def test_a_storage_failure_is_retryable(lake: Path):
    job = daily_job(lake, "flaky")
    with pytest.raises(idem.RunFailed) as e:
        idem.run(job, "2026-06-02", cwd=lake, env={"IDEM_FAULTS": "fail@4"})
    assert e.value.exit_code == 1 and e.value.retryable
    assert "injected fault" in e.value.message
    assert not (lake / "out" / "flaky" / "dt=2026-06-02").exists()
    assert idem.run(job, "2026-06-02", cwd=lake).partitions[0].action == "written"


def test_verify_and_not_deterministic(lake: Path):
    report = idem.verify(FCT, "2026-06-02", cwd=lake)
    assert report.deterministic and all(p.same for p in report.partitions)
    job = daily_job(
        lake,
        "random",
        select="order_id, random() as r",
        top="allow_nondeterministic = true",
    )
    with pytest.raises(idem.NotDeterministic) as e:
        idem.verify(job, "2026-06-02", cwd=lake)
    assert e.value.exit_code == 4
    assert isinstance(e.value.report, idem.VerifyReport)
    assert not e.value.report.deterministic
    assert not e.value.report.partitions[0].same


def test_a_failed_backfill_yields_its_events_then_raises(lake: Path):
    job = daily_job(
        lake,
        "some_fail",
        select="order_id, 1 / (extract(day from created_at)::int - 2) as x",
    )
    running = idem.backfill(job, "2026-06-01", "2026-06-03", cwd=lake)
    seen = []
    with pytest.raises(idem.DataError) as e:
        # One at a time: the events before the failure are kept.
        for event in running:
            seen.append(event)  # noqa: PERF402
    failed = [x for x in seen if isinstance(x, idem.Failed)]
    assert [f.logical_date for f in failed] == ["2026-06-02"]
    assert failed[0].exit_code == 5 and isinstance(
        failed[0].exception(), idem.DataError
    )
    assert sorted(x.logical_date for x in seen if isinstance(x, idem.Done)) == [
        "2026-06-01",
        "2026-06-03",
    ]
    assert "2026-06-02" in str(e.value)
    events = idem.backfill(job, "2026-06-01", "2026-06-03", cwd=lake, check=False)
    events.wait()
    assert events.exit_code == 5


def test_dates_and_plan_of_a_project(lake: Path):
    units = idem.dates("testdata/jobs", "2026-06-01", "2026-06-02", cwd=lake)
    by_job = {}
    for u in units:
        by_job.setdefault(u.job, []).append(u.date)
    assert by_job["fct_orders"] == ["2026-06-02", "2026-06-01"]
    sales = [u for u in units if u.job == "daily_sales"]
    fct = {u.date: u.index for u in units if u.job == "fct_orders"}
    assert all(fct[u.date] in u.after for u in sales)
    planned = {j.job: j for j in idem.plan("testdata/jobs", cwd=lake)}
    assert planned["daily_sales"].upstream == ["fct_orders"]


def test_closing_a_backfill_stops_it_after_the_running_date(lake: Path, tmp_path: Path):
    gate = tmp_path / "gate"
    gate.mkdir()
    with idem.backfill(
        FCT,
        "2026-06-01",
        "2026-06-05",
        cwd=lake,
        concurrency=1,
        oldest_first=True,
        check=False,
        env={"IDEM_FAILPOINTS": f"before_publish=pause:{gate}"},
    ) as running:
        assert isinstance(next(running), idem.Started)
        deadline = time.monotonic() + 120
        while not (gate / "before_publish.paused").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # The stop is asked for while the first date waits before its publish.
        running.interrupt()
        (gate / "before_publish.resume").touch()
    status = idem.status("lake/analytics/fct_orders", cwd=lake)
    assert [p.partition for p in status.partitions] == ["dt=2026-06-01"]
