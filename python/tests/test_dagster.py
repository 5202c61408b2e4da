"""The Dagster integration: job files become partitioned assets; materializations carry
the run's report, and re-materializing unchanged input reports `unchanged`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

dg = pytest.importorskip("dagster")

import idem_pipelines as idem
from idem_pipelines.dagster import idem_job_asset, idem_project_assets


def materializations(result, name: str) -> dict:
    return {
        m.partition: {k: v.value for k, v in m.metadata.items()}
        for m in result.asset_materializations_for_node(name)
    }


@pytest.fixture()
def in_lake(lake: Path):
    old = os.getcwd()
    os.chdir(lake)
    yield lake
    os.chdir(old)


def test_a_project_becomes_assets_with_their_upstreams(in_lake: Path):
    assets = {
        a.key.to_user_string(): a
        for a in idem_project_assets("testdata/jobs", start_date="2026-06-01")
    }
    assert set(assets) == {"fct_orders", "daily_sales", "orders_by_country"}
    assert set(assets["daily_sales"].dependency_keys) == {dg.AssetKey("fct_orders")}
    assert not assets["fct_orders"].dependency_keys
    parts = assets["fct_orders"].partitions_def
    assert isinstance(parts, dg.DailyPartitionsDefinition)
    assert parts.get_partition_keys()[:2] == ["2026-06-01", "2026-06-02"]
    assert assets["fct_orders"].backfill_policy == dg.BackfillPolicy.single_run()


def test_three_partitions_then_unchanged(in_lake: Path):
    fct = idem_job_asset("testdata/jobs/fct_orders.toml", start_date="2026-06-01")
    instance = dg.DagsterInstance.ephemeral()
    first = {}
    for day in ["2026-06-01", "2026-06-02", "2026-06-03"]:
        result = dg.materialize([fct], partition_key=day, instance=instance)
        assert result.success
        first.update(materializations(result, "fct_orders"))
    assert set(first) == {"2026-06-01", "2026-06-02", "2026-06-03"}
    for day, meta in first.items():
        assert meta["action"] == "written", meta
        assert meta["rows"] > 0 and meta["bytes"] > 0 and len(meta["digest"]) == 32
    live = idem.status("lake/analytics/fct_orders")
    for day, meta in first.items():
        p = live.partition(f"dt={day}")
        assert (p.rows, p.digest) == (meta["rows"], meta["digest"])

    # The same three partitions again, as one run (a single-run backfill: one
    # `idem backfill`): each reports unchanged, with the same digest.
    again = dg.materialize(
        [fct],
        instance=instance,
        tags={
            "dagster/asset_partition_range_start": "2026-06-01",
            "dagster/asset_partition_range_end": "2026-06-03",
        },
    )
    assert again.success
    second = materializations(again, "fct_orders")
    assert set(second) == set(first)
    for day, meta in second.items():
        assert meta["action"] == "unchanged", meta
        assert meta["digest"] == first[day]["digest"]
        assert meta["rows"] == first[day]["rows"]
    assert instance.get_materialized_partitions(dg.AssetKey("fct_orders")) == set(first)


def test_a_failed_check_fails_the_materialization_with_idems_exception(in_lake: Path):
    job = in_lake / "jobs" / "strict.toml"
    job.parent.mkdir(exist_ok=True)
    job.write_text(
        (in_lake / "testdata/jobs/fct_orders.toml")
        .read_text()
        .replace('name = "fct_orders"', 'name = "strict"')
        .replace("lake/analytics/fct_orders/", "lake/analytics/strict/")
        + "\n[checks]\nmax_rows = 10\n"
    )
    asset = idem_job_asset(
        job, start_date="2026-06-01", retry_policy=dg.RetryPolicy(max_retries=2)
    )
    result = dg.materialize(
        [asset],
        partition_key="2026-06-02",
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not result.success
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert len(failures) == 1, "a final exit code is not retried"
    data = failures[0].event_specific_data.user_failure_data
    md = {k: v.value for k, v in data.metadata.items()}
    assert (md["exit_code"], md["retryable"], md["partition"]) == (
        3,
        False,
        "dt=2026-06-02",
    )
    assert "max_rows" in data.description
    assert not (in_lake / "lake/analytics/strict/dt=2026-06-02").exists()


def test_partition_keys_are_idem_dates():
    from idem_pipelines.dagster import partitions_def_for_grain

    month = partitions_def_for_grain("month", "2026-01-01")
    assert month.get_partition_keys()[:2] == ["2026-01", "2026-02"]
    hour = partitions_def_for_grain("hour", "2026-06-01")
    assert hour.get_partition_keys()[13] == "2026-06-01T13"
