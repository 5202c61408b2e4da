"""Dagster partitioned assets backed by idem job files.

    import dagster as dg
    from idem_pipelines.dagster import idem_job_asset, idem_project_assets

    fct_orders = idem_job_asset("jobs/fct_orders.toml", start_date="2026-06-01",
                                workdir="/srv/lake")
    defs = dg.Definitions(assets=idem_project_assets("/srv/lake/jobs",
                                                     start_date="2026-06-01",
                                                     workdir="/srv/lake"))

One idem job file becomes one partitioned asset:

* partitions follow the job's `[target] grain`: day -> DailyPartitionsDefinition
  (keys `2026-06-01`), hour -> HourlyPartitionsDefinition (`2026-06-01T05`), month ->
  MonthlyPartitionsDefinition (`2026-06`), all in UTC, which is how idem cuts a run's
  window, so a partition key is exactly an idem `--date`;
* one partition runs `idem run JOB --date KEY`;
* a range (a backfill launched from the UI, `BackfillPolicy.single_run()`) runs ONE
  `idem backfill JOB --from FIRST --to LAST`, so idem schedules the dates itself
  (`--concurrency`, newest first) in one process;
* every partition gets its own materialization metadata from idem's report:
  `action` (written / unchanged / emptied / fresh, or `mixed` when one date published
  several partitions with different actions), `rows` (also `dagster/row_count`),
  `bytes`, `digest`, the idem run id, the table and every published partition;
* idem's exit codes decide retries: 2 bad input, 3 check failed, 4 not deterministic,
  5 the transform failed on this date's data are final (`Failure(allow_retries=False)`:
  the asset's RetryPolicy is bypassed); anything else (1 I/O or store error, lost
  lease, 130 interrupted, a signal, a panic) raises a retryable `Failure`, and the
  RetryPolicy runs it again. A retry of a range adds `--skip-fresh`, so the dates that
  already landed cost a manifest read.

Dates of a range that idem published before another date failed are still recorded
as materialized (they were published) before the step fails.

The binary is the factory's `idem_bin`, else the one `idem_pipelines.find_idem`
finds (`IDEM_BIN`, the wheel's, the PATH), looked up when the asset runs. Relative
paths in a job file resolve against idem's current directory, so pass `workdir` (the
project root) unless every path is absolute or an object-store URL.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

import dagster as dg

from ._api import Done, Failed, RunReport, Skipped, Summary, backfill, plan, run
from .errors import IdemError

__all__ = [
    "FINAL_EXIT_CODES",
    "idem_job_asset",
    "idem_project_assets",
    "partitions_def_for_grain",
]

# idem's exit codes (docs/cli.md). These are final: running again gives the same answer.
FINAL_EXIT_CODES: Mapping[int, str] = {
    2: "bad input (job file, arguments or SQL)",
    3: "a check on the staged output failed",
    4: "not deterministic: two runs of the date differ",
    5: "the transform failed on this date's data",
}
# Everything else may succeed on a retry; these have known causes.
RETRYABLE_EXIT_CODES: Mapping[int, str] = {
    1: "failed while reading, writing or committing (I/O, store, contention, lost lease)",
    101: "idem panicked",
    130: "interrupted",
}

_GRAIN_FORMATS = {"day": "%Y-%m-%d", "hour": "%Y-%m-%dT%H", "month": "%Y-%m"}


# ---------------------------------------------------------------------------- job files


def read_job(job_file: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed TOML of a job file."""
    with open(job_file, "rb") as f:
        return tomllib.load(f)


def job_grain(job: Mapping[str, Any]) -> str:
    """`[target] grain` of a parsed job file (idem's default: day)."""
    grain = job.get("target", {}).get("grain", "day")
    if grain not in _GRAIN_FORMATS:
        raise ValueError(
            f"unknown [target] grain {grain!r}: expected day, hour or month"
        )
    return grain


def _as_partition_start(
    value: str | _dt.date | _dt.datetime | None, fmt: str
) -> str | None:
    """A start/end date in the partition format: accepts that format, an ISO date or
    datetime string, or a date/datetime."""
    if value is None:
        return None
    if isinstance(value, (_dt.date, _dt.datetime)):
        return value.strftime(fmt)
    try:
        return _dt.datetime.strptime(value, fmt).strftime(fmt)
    except ValueError:
        pass
    for parse in (_dt.datetime.fromisoformat, _dt.date.fromisoformat):
        try:
            return parse(value).strftime(fmt)
        except ValueError:
            continue
    if fmt == "%Y-%m-%d" or not re.fullmatch(r"\d{4}-\d{2}", value):
        raise ValueError(f"cannot read {value!r} as a date")
    return _dt.datetime.strptime(value + "-01", "%Y-%m-%d").strftime(fmt)


def partitions_def_for_grain(
    grain: str,
    start_date: str | _dt.date | _dt.datetime,
    end_date: str | _dt.date | _dt.datetime | None = None,
    end_offset: int = 0,
) -> dg.TimeWindowPartitionsDefinition:
    """Partitions whose keys are idem `--date` values of `grain`, in UTC."""
    fmt = _GRAIN_FORMATS[grain]
    cls = {
        "day": dg.DailyPartitionsDefinition,
        "hour": dg.HourlyPartitionsDefinition,
        "month": dg.MonthlyPartitionsDefinition,
    }[grain]
    return cls(
        start_date=_as_partition_start(start_date, fmt),
        end_date=_as_partition_start(end_date, fmt),
        timezone="UTC",
        fmt=fmt,
        end_offset=end_offset,
    )


# ---------------------------------------------------------------------------- failures


def _explain(code: int) -> str:
    if code in FINAL_EXIT_CODES:
        meaning = FINAL_EXIT_CODES[code]
    elif code in RETRYABLE_EXIT_CODES:
        meaning = RETRYABLE_EXIT_CODES[code]
    elif code < 0:
        meaning = f"killed by signal {-code}"
    elif code > 128:
        meaning = f"killed by signal {code - 128}"
    else:
        meaning = "unexpected exit code"
    return f"exit {code}: {meaning}"


def _failure(
    error: IdemError, summary: str, extra: Mapping[str, Any] | None = None
) -> dg.Failure:
    """A Dagster failure for idem's `error`: final exit codes are not retried."""
    final = error.exit_code in FINAL_EXIT_CODES
    stderr_tail = error.stderr.strip()[-4000:]
    md: dict[str, Any] = {
        "exit_code": error.exit_code,
        "idem_command": " ".join(error.command),
        "retryable": not final,
    }
    if error.partition:
        md["partition"] = error.partition
    if stderr_tail:
        md["stderr"] = dg.MetadataValue.md(f"```\n{stderr_tail}\n```")
    md.update(extra or {})
    description = f"{summary}: idem {_explain(error.exit_code)}\n{error.message}"
    return dg.Failure(description=description, metadata=md, allow_retries=not final)


# ---------------------------------------------------------------------------- metadata


def partition_metadata(run_report: RunReport) -> dict[str, Any]:
    """Materialization metadata of one logical date from idem's report of it."""
    report = run_report.raw
    parts = list(report.get("partitions") or [])
    actions = sorted({p.get("action", "?") for p in parts})
    if not actions:
        action = "none"
    elif len(actions) == 1:
        action = actions[0]
    else:
        action = "mixed"
    rows = int(report.get("rows") or 0)
    if len(parts) == 1:
        digest = parts[0].get("digest", "")
    else:
        digest = ",".join(f"{p.get('partition')}:{p.get('digest', '')}" for p in parts)
    md: dict[str, Any] = {
        "action": action,
        "rows": rows,
        "dagster/row_count": rows,
        "bytes": int(report.get("bytes") or 0),
        "digest": digest,
        "idem_partitions": dg.MetadataValue.json(
            {p.get("partition", "?"): p for p in parts}
        ),
        "idem_run_id": report.get("run_id") or "",
        "idem_command": " ".join(run_report.command),
        "idem_job": report.get("job", ""),
        "idem_elapsed_ms": int(report.get("elapsed_ms") or 0),
    }
    if report.get("table"):
        md["table"] = dg.MetadataValue.path(str(report["table"]))
    if report.get("warnings"):
        md["idem_warnings"] = dg.MetadataValue.json(list(report["warnings"]))
    if isinstance(report.get("merge"), Mapping):
        md["idem_merge"] = dg.MetadataValue.json(dict(report["merge"]))
    return md


# ---------------------------------------------------------------------------- the factory


def _asset_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return cleaned if re.match(r"[A-Za-z_]", cleaned) else f"_{cleaned}"


def idem_job_asset(
    job_file: str | os.PathLike[str],
    *,
    start_date: str | _dt.date | _dt.datetime,
    end_date: str | _dt.date | _dt.datetime | None = None,
    end_offset: int = 0,
    name: str | None = None,
    key_prefix: str | Sequence[str] | None = None,
    group_name: str | None = None,
    deps: Sequence[Any] | None = None,
    workdir: str | os.PathLike[str] | None = None,
    idem_bin: str | None = None,
    vars: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    skip_fresh: bool = False,
    concurrency: int | None = None,
    retry_policy: dg.RetryPolicy | None = None,
    description: str | None = None,
) -> dg.AssetsDefinition:
    """A partitioned asset that materializes the idem job `job_file`.

    `job_file` is read now (its `name` and `[target] grain`); a relative `job_file` is
    taken relative to `workdir` when given. `vars` are passed as `--var N=V`. With
    `skip_fresh`, every run passes `--skip-fresh` (ranges also do on a retry).
    `retry_policy` defaults to 3 retries with exponential backoff from 30 s; final exit
    codes bypass it.
    """
    job_path = Path(job_file)
    if workdir is not None and not job_path.is_absolute():
        job_path = Path(workdir) / job_path
    job = read_job(job_path)
    grain = job_grain(job)
    job_name = str(job.get("name") or job_path.stem)
    partitions_def = partitions_def_for_grain(grain, start_date, end_date, end_offset)
    cwd = str(workdir) if workdir is not None else None
    job_arg = str(job_path)
    common: dict[str, Any] = {
        "vars": vars,
        "cwd": cwd,
        "env": env,
        "idem_bin": idem_bin,
    }
    policy = retry_policy or dg.RetryPolicy(
        max_retries=3,
        delay=30,
        backoff=dg.Backoff.EXPONENTIAL,
        jitter=dg.Jitter.PLUS_MINUS,
    )
    target = job.get("target", {}).get("path", "?")

    @dg.asset(
        name=_asset_name(name or job_name),
        key_prefix=key_prefix,
        group_name=group_name,
        deps=deps,
        partitions_def=partitions_def,
        backfill_policy=dg.BackfillPolicy.single_run(),
        retry_policy=policy,
        description=description
        or f"idem job `{job_name}` ({job_path}) writing `{target}`",
        metadata={
            "idem_job_file": str(job_path),
            "idem_grain": grain,
            "idem_target": str(target),
        },
        kinds={"idem", "parquet"},
    )
    def _idem_asset(context) -> Iterator[Any]:  # AssetExecutionContext
        if context.has_partition_key_range:
            yield from _materialize_range(context)
        else:
            yield from _materialize_one(context)

    def _materialize_one(context: dg.AssetExecutionContext) -> Iterator[Any]:
        key = context.partition_key
        try:
            if skip_fresh:
                # `run` has no --skip-fresh: a fresh single date goes through a
                # backfill, which reports it `fresh` without planning.
                events = backfill(job_arg, key, key, skip_fresh=True, **common).wait()
                reports = [e.report for e in events if isinstance(e, Done)]
                if not reports:
                    raise IdemError(f"idem reported no run of {key}", exit_code=1)
                report = reports[-1]
            else:
                report = run(job_arg, key, **common)
        except IdemError as e:
            raise _failure(e, f"{job_name} {key}") from e
        context.log.info(
            "%s: %s",
            key,
            ", ".join(f"{p.partition} {p.action}" for p in report.partitions),
        )
        yield dg.MaterializeResult(metadata=partition_metadata(report))

    def _materialize_range(context: dg.AssetExecutionContext) -> Iterator[Any]:
        keys = list(context.partition_keys)
        first, last = context.partition_key_range.start, context.partition_key_range.end
        running = backfill(
            job_arg,
            first,
            last,
            skip_fresh=skip_fresh or context.retry_number > 0,
            concurrency=concurrency,
            check=False,
            **common,
        )
        done: dict[str, RunReport] = {}
        failed: dict[str, str] = {}
        summary: dict[str, Any] = {}
        for event in running:
            if isinstance(event, Done):
                done[event.logical_date] = event.report
            elif isinstance(event, Failed):
                failed[event.logical_date] = event.error
            elif isinstance(event, Skipped):
                failed[event.logical_date] = event.reason
            elif isinstance(event, Summary):
                summary = dict(event.__dict__)
        missing = [k for k in keys if k not in done]
        if running.exit_code != 0 or missing:
            # What was published is materialized even though the step fails.
            for k in keys:
                if k in done:
                    yield dg.AssetMaterialization(
                        asset_key=context.asset_key,
                        partition=k,
                        metadata=partition_metadata(done[k]),
                    )
            errors = {k: failed[k] for k in keys if k in failed}
            extra: dict[str, Any] = (
                {"failed_dates": dg.MetadataValue.json(errors)} if errors else {}
            )
            if summary:
                extra["idem_summary"] = dg.MetadataValue.json(summary)
            head = f"{job_name} {first}..{last}: {len(done)} of {len(keys)} dates done"
            # Exit 0 yet a date unreported: do not trust it.
            code = running.exit_code or 1
            error = IdemError(
                "; ".join(f"{k}: {v}" for k, v in errors.items())
                or running.stderr.strip(),
                exit_code=code,
                command=["idem", *running.args],
                stderr=running.stderr,
            )
            raise _failure(error, head, extra)
        for k in keys:
            context.add_asset_metadata(partition_metadata(done[k]), partition_key=k)
        yield dg.MaterializeResult(
            metadata={"idem_summary": dg.MetadataValue.json(summary)}
        )

    return _idem_asset


def idem_project_assets(
    project_dir: str | os.PathLike[str],
    *,
    start_date: str | _dt.date | _dt.datetime,
    workdir: str | os.PathLike[str] | None = None,
    idem_bin: str | None = None,
    **kwargs: Any,
) -> list[dg.AssetsDefinition]:
    """One asset per job of a project folder, with `deps` from `idem plan --json` (a job
    reading another job's table depends on it). Runs idem now, to read the plan.
    Every keyword of `idem_job_asset` but `deps` and `name` applies to each asset."""
    planned = plan(project_dir, cwd=workdir, idem_bin=idem_bin)
    key_prefix = kwargs.get("key_prefix")
    prefix = [key_prefix] if isinstance(key_prefix, str) else list(key_prefix or [])
    assets = []
    for job in planned:
        job_file = Path(job.job_file)
        if workdir is not None and not job_file.is_absolute():
            job_file = Path(workdir) / job_file
        deps = [dg.AssetKey([*prefix, _asset_name(up)]) for up in job.upstream]
        assets.append(
            idem_job_asset(
                job_file,
                start_date=start_date,
                workdir=workdir,
                idem_bin=idem_bin,
                deps=deps,
                **kwargs,
            )
        )
    return assets
