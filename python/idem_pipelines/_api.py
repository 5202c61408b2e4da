"""The Python API: each function runs the `idem` binary with `--json` and returns what
it printed as dataclasses, or raises the exception of its exit code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from ._binary import find_idem
from .errors import IdemError, error_for

PathLike = Union[str, "os.PathLike[str]"]


# --- reports --------------------------------------------------------------------------


@dataclass(frozen=True)
class Partition:
    """One partition of a run's report."""

    #: The partition, as `col=value/...` (`(table)` for an unpartitioned table).
    partition: str
    #: `written`, `unchanged`, `emptied` or `fresh`.
    action: str
    rows: int
    bytes: int
    files: int
    #: The digest of its rows (the same rows give the same digest on every run).
    digest: str | None
    #: How it was published (`created`, `replaced`, ...); absent when nothing was.
    publish: str | None = None
    ms: int = 0

    @classmethod
    def _from(cls, d: Mapping[str, Any]) -> Partition:
        return cls(
            partition=d["partition"],
            action=d["action"],
            rows=int(d.get("rows", 0)),
            bytes=int(d.get("bytes", 0)),
            files=int(d.get("files", 0)),
            digest=d.get("digest"),
            publish=d.get("publish"),
            ms=int(d.get("ms", 0)),
        )


@dataclass(frozen=True)
class RunReport:
    """What `idem run` did for one date of one job."""

    job: str
    job_file: str
    table: str
    logical_date: str
    run_id: str
    partitions: list[Partition]
    rows: int
    bytes: int
    inputs: int
    elapsed_ms: int
    warnings: list[str] = field(default_factory=list)
    #: The report as printed, for fields this class does not name (`merge`, `cluster`).
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: The command that produced it (`idem run ...` or the backfill's).
    command: list[str] = field(default_factory=list, repr=False, compare=False)

    @property
    def written(self) -> list[Partition]:
        """The partitions this run published (written or emptied)."""
        return [p for p in self.partitions if p.action in ("written", "emptied")]

    @property
    def unchanged(self) -> list[Partition]:
        """The partitions whose rows equalled the live ones (or were fresh): untouched."""
        return [p for p in self.partitions if p.action in ("unchanged", "fresh")]

    @classmethod
    def _from(cls, d: Mapping[str, Any], command: Sequence[str] = ()) -> RunReport:
        return cls(
            job=d["job"],
            job_file=d.get("job_file", ""),
            table=d.get("table", ""),
            logical_date=d["logical_date"],
            run_id=d.get("run_id", ""),
            partitions=[Partition._from(p) for p in d.get("partitions", [])],
            rows=int(d.get("rows", 0)),
            bytes=int(d.get("bytes", 0)),
            inputs=int(d.get("inputs", 0)),
            elapsed_ms=int(d.get("elapsed_ms", 0)),
            warnings=list(d.get("warnings", [])),
            raw=dict(d),
            command=list(command),
        )


# --- backfill events ------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    """A date of the backfill started."""

    logical_date: str
    running: int
    job: str | None = None


@dataclass(frozen=True)
class Done:
    """A date finished; its report."""

    logical_date: str
    report: RunReport
    ms: int = 0

    @property
    def job(self) -> str:
        return self.report.job


@dataclass(frozen=True)
class Failed:
    """A date failed; the backfill goes on with the others unless `fail_fast`."""

    logical_date: str
    error: str
    exit_code: int
    bad_input: bool
    #: The partition the error names, when it names one.
    partition: str | None = None
    job: str | None = None
    ms: int = 0

    def exception(self) -> IdemError:
        """The exception a run of this date alone would have raised."""
        return error_for(self.exit_code, self.error, partition=self.partition)


@dataclass(frozen=True)
class Skipped:
    """A date of a downstream job not run because an upstream date failed."""

    job: str
    logical_date: str
    upstream_job: str
    upstream_date: str
    exit_code: int
    reason: str


@dataclass(frozen=True)
class Summary:
    """The end of one job's backfill."""

    job: str
    dates: int
    succeeded: int
    failed: int
    not_run: int
    skipped: int
    written: int
    unchanged: int
    emptied: int
    fresh: int
    rows: int
    elapsed_ms: int
    interrupted: bool
    abandoned: int = 0


@dataclass(frozen=True)
class Committed:
    """`atomic=True`: the whole range became visible in one Delta commit."""

    version: int | None
    ms: int = 0


@dataclass(frozen=True)
class Abandoned:
    """`atomic=True`: a date failed (or did not run), so nothing of the range was
    committed."""

    failed: int
    ms: int = 0
    not_run: int = 0


Event = Started | Done | Failed | Skipped | Summary | Committed | Abandoned


def _event(d: Mapping[str, Any], command: Sequence[str]) -> Event | None:
    kind = d.get("event")
    if kind == "start":
        return Started(d["logical_date"], int(d.get("running", 0)), d.get("job"))
    if kind == "done":
        report = RunReport._from(d["report"], command)
        return Done(d["logical_date"], report, int(d.get("ms", 0)))
    if kind == "failed":
        return Failed(
            logical_date=d["logical_date"],
            error=d["error"],
            exit_code=int(d["exit_code"]),
            bad_input=bool(d.get("bad_input", False)),
            partition=d.get("partition"),
            job=d.get("job"),
            ms=int(d.get("ms", 0)),
        )
    if kind == "skipped":
        return Skipped(
            job=d["job"],
            logical_date=d["logical_date"],
            upstream_job=d["upstream_job"],
            upstream_date=d["upstream_date"],
            exit_code=int(d["exit_code"]),
            reason=d["reason"],
        )
    if kind == "summary":
        names = Summary.__dataclass_fields__
        return Summary(**{k: d[k] for k in names if k in d})
    if kind == "committed":
        return Committed(d.get("version"), int(d.get("ms", 0)))
    if kind == "abandoned":
        return Abandoned(
            int(d.get("failed", 0)), int(d.get("ms", 0)), int(d.get("not_run", 0))
        )
    return None


# --- status, verify, dates ------------------------------------------------------------


@dataclass(frozen=True)
class PartitionStatus:
    """A live partition as `idem status` sees it."""

    partition: str
    #: `managed` (idem's), `pending` or `foreign` (another writer's).
    state: str
    rows: int | None
    files: int
    bytes: int
    digest: str | None
    job: str | None
    logical_date: str | None
    run_id: str | None
    #: `current` when the inputs the partition was computed from are unchanged.
    input_state: str | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class TableStatus:
    """`idem status TABLE`."""

    table: str
    partitions: list[PartitionStatus]
    rows: int
    bytes: int
    #: Runs whose staging is still there (live or dead).
    staging: list[Any]

    def partition(self, name: str) -> PartitionStatus | None:
        """The partition called `name` (`dt=2026-06-01`), if live."""
        return next((p for p in self.partitions if p.partition == name), None)


@dataclass(frozen=True)
class VerifiedPartition:
    partition: str
    rows: list[int]
    digests: list[str]
    same: bool


@dataclass(frozen=True)
class VerifyReport:
    """`idem verify`: the date run twice into scratch space, digests compared."""

    job: str
    logical_date: str
    deterministic: bool
    partitions: list[VerifiedPartition]
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Unit:
    """One (job, date) of a backfill, as `idem dates` lists it."""

    index: int
    job: str
    job_file: str
    date: str
    #: The indices of the upstream units it reads.
    after: list[int]


# --- running the binary ---------------------------------------------------------------


def _common(
    args: list[str],
    vars: Mapping[str, Any] | None,
    cluster: str | None,
    rewrite: bool,
) -> list[str]:
    for name, value in (vars or {}).items():
        args += ["--var", f"{name}={value}"]
    if cluster:
        args += ["--cluster", cluster]
    if rewrite:
        args.append("--rewrite")
    return args


def _env(env: Mapping[str, str] | None) -> dict[str, str] | None:
    if env is None:
        return None
    merged = dict(os.environ)
    merged.update(env)
    return merged


def _invoke(
    args: Sequence[str],
    cwd: PathLike | None,
    env: Mapping[str, str] | None,
    idem_bin: str | None,
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [find_idem(idem_bin), *args],
        cwd=cwd,
        env=_env(env),
        capture_output=True,
        text=True,
        check=False,
    )


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [
        json.loads(line) for line in text.splitlines() if line.strip().startswith("{")
    ]


def _raise_for(
    args: Sequence[str], code: int, stdout: str, stderr: str, report: Any = None
) -> None:
    """Raises the exception of exit `code`, with the error the binary printed."""
    failure: Mapping[str, Any] = {}
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if "error" in d and "event" not in d:
                failure = d
            break
    message = failure.get("error")
    if not message:
        errors = [
            ln[len("error: ") :]
            for ln in stderr.splitlines()
            if ln.startswith("error: ")
        ]
        message = (
            errors[-1] if errors else (stderr.strip() or f"idem exited with {code}")
        )
    raise error_for(
        code,
        message,
        partition=failure.get("partition"),
        command=["idem", *args],
        stderr=stderr,
        report=report,
    )


def run(
    job: PathLike,
    date: str,
    *,
    vars: Mapping[str, Any] | None = None,
    rewrite: bool = False,
    cluster: str | None = None,
    cwd: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    idem_bin: str | None = None,
) -> RunReport:
    """Runs one date of a job: `idem run JOB --date DATE`.

    Args:
        job: the job file.
        date: the logical date: `YYYY-MM-DD`, `YYYY-MM-DDTHH` (hourly jobs) or
            `YYYY-MM` (monthly jobs).
        vars: values for the job's parameters (`--var name=value`).
        rewrite: publish partitions even when their rows equal the live ones.
        cluster: a Ballista cluster (`df://HOST:PORT` or `standalone`).
        cwd: the directory relative paths in the job file are read from.
        env: variables added to this process's environment (object-store
            credentials, say).
        idem_bin: the binary to run (default: see `find_idem`).

    Returns:
        The run's report: each partition with its action, rows, bytes and digest.

    Raises:
        BadInput, CheckFailed, DataError, RunFailed: by the run's exit code.
    """
    args = _common(
        ["run", os.fspath(job), "--date", date, "--json"], vars, cluster, rewrite
    )
    done = _invoke(args, cwd, env, idem_bin)
    if done.returncode != 0:
        _raise_for(args, done.returncode, done.stdout, done.stderr)
    reports = [d for d in _json_lines(done.stdout) if "partitions" in d]
    if not reports:
        raise IdemError(f"idem printed no report: {done.stdout!r}", exit_code=0)
    return RunReport._from(reports[-1], ["idem", *args])


class Backfill(Iterator[Event]):
    """A running backfill: iterate to get its events as they arrive. When the stream
    ends and the backfill failed, the iteration raises the exception of its exit code
    (unless it was started with `check=False`; then see `exit_code`)."""

    def __init__(
        self,
        args: list[str],
        cwd: PathLike | None,
        env: Mapping[str, str] | None,
        check: bool,
        idem_bin: str | None = None,
    ) -> None:
        self.args = args
        self.check = check
        #: The process's exit code, once the stream has ended.
        self.exit_code: int | None = None
        #: Every event so far.
        self.events: list[Event] = []
        self._proc = subprocess.Popen(
            [find_idem(idem_bin), *args],
            cwd=cwd,
            env=_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._interrupted = False
        self._stderr: list[str] = []
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        self._stdout: list[str] = []

    def _drain(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line)

    @property
    def stderr(self) -> str:
        """What the binary printed on stderr (warnings, the error)."""
        return "".join(self._stderr)

    def __iter__(self) -> Backfill:
        return self

    def __next__(self) -> Event:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._stdout.append(line)
            line = line.strip()
            if not line.startswith("{"):
                continue
            event = _event(json.loads(line), ["idem", *self.args])
            if event is not None:
                self.events.append(event)
                return event
        self._finish()
        raise StopIteration

    def _finish(self) -> None:
        if self.exit_code is not None:
            return
        self.exit_code = self._proc.wait()
        self._reader.join()
        if self.exit_code != 0 and self.check:
            failed = [e for e in self.events if isinstance(e, Failed)]
            partition = failed[0].partition if len(failed) == 1 else None
            message = (
                "; ".join(f"{e.logical_date}: {e.error}" for e in failed)
                if failed
                else None
            )
            if message:
                raise error_for(
                    self.exit_code,
                    message,
                    partition=partition,
                    command=["idem", *self.args],
                    stderr=self.stderr,
                    report=self.events,
                )
            _raise_for(
                self.args,
                self.exit_code,
                "".join(self._stdout),
                self.stderr,
                self.events,
            )

    def wait(self) -> list[Event]:
        """Runs the backfill to its end; returns every event."""
        for _ in self:
            pass
        return self.events

    @property
    def reports(self) -> list[RunReport]:
        """The reports of the dates done so far."""
        return [e.report for e in self.events if isinstance(e, Done)]

    def interrupt(self) -> None:
        """Asks a backfill still running to stop as a Ctrl-C does: the running dates
        finish, no more start. Returns at once; iterate on (or `close`) to see the end.
        (A killed backfill is safe too: every partition is old or new.) Only the first
        call signals: a second Ctrl-C would abandon the running dates."""
        if not self._interrupted and self._proc.poll() is None:
            self._interrupted = True
            self._proc.send_signal(signal.SIGINT)

    def close(self) -> None:
        """Interrupts the backfill if it still runs (unless `interrupt` already did, so
        the running dates still finish), and waits for it to end; raises nothing (see
        `exit_code` and `events`)."""
        self.interrupt()
        self.check = False
        for _ in self:
            pass

    def __enter__(self) -> Backfill:  # noqa: PYI034 (typing.Self is 3.11+)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()


def backfill(
    job_or_project: PathLike,
    start: str,
    end: str,
    *,
    vars: Mapping[str, Any] | None = None,
    concurrency: int | None = None,
    skip_fresh: bool = False,
    cascade: bool = False,
    fail_fast: bool = False,
    oldest_first: bool = False,
    atomic: bool = False,
    rewrite: bool = False,
    cluster: str | None = None,
    cwd: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    idem_bin: str | None = None,
) -> Backfill:
    """Runs a range of dates of a job, or of every job of a project (a folder of job
    files) in dependency order: `idem backfill ... --from START --to END`.

    Returns a `Backfill` at once; iterate it for the events as they arrive
    (`Started`, `Done` with each date's report, `Failed`, `Skipped`, `Summary`, and
    with `atomic`, `Committed` or `Abandoned`), or call `.wait()`.

    Args:
        start, end: the first and last dates, inclusive.
        concurrency: dates at once (default: twice the CPUs, at most 4).
        skip_fresh: skip dates whose partitions are fresh.
        cascade: in a project, run downstream jobs only for dates made stale.
        fail_fast: stop at the first failed date.
        oldest_first: run the oldest date first.
        atomic: (a Delta target) commit the whole range in one commit, or nothing.
        check: raise the exit code's exception when the stream ends and the backfill
            failed (after every event was yielded).
        The others as for `run`.
    """
    args = [
        "backfill",
        os.fspath(job_or_project),
        "--from",
        start,
        "--to",
        end,
        "--json",
    ]
    if concurrency is not None:
        args += ["--concurrency", str(concurrency)]
    for flag, on in (
        ("--skip-fresh", skip_fresh),
        ("--cascade", cascade),
        ("--fail-fast", fail_fast),
        ("--oldest-first", oldest_first),
        ("--atomic", atomic),
    ):
        if on:
            args.append(flag)
    return Backfill(_common(args, vars, cluster, rewrite), cwd, env, check, idem_bin)


def status(
    table: PathLike,
    *,
    cwd: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    idem_bin: str | None = None,
) -> TableStatus:
    """The live partitions of a table (a path or an object-store URL): `idem status`."""
    args = ["status", os.fspath(table), "--json"]
    done = _invoke(args, cwd, env, idem_bin)
    if done.returncode != 0:
        _raise_for(args, done.returncode, done.stdout, done.stderr)
    d = json.loads(done.stdout)
    return TableStatus(
        table=d["table"],
        partitions=[
            PartitionStatus(
                partition=p["partition"],
                state=p["state"],
                rows=p.get("rows"),
                files=int(p.get("files", 0)),
                bytes=int(p.get("bytes", 0)),
                digest=p.get("digest"),
                job=p.get("job"),
                logical_date=p.get("logical_date"),
                run_id=p.get("run_id"),
                input_state=p.get("input_state"),
                raw=dict(p),
            )
            for p in d.get("partitions", [])
        ],
        rows=int(d.get("rows", 0)),
        bytes=int(d.get("bytes", 0)),
        staging=list(d.get("staging", [])),
    )


def verify(
    job: PathLike,
    date: str,
    *,
    vars: Mapping[str, Any] | None = None,
    cwd: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    idem_bin: str | None = None,
) -> VerifyReport:
    """Runs a date twice into scratch space and compares the digests: `idem verify`.
    The real table is not touched.

    Raises:
        NotDeterministic: the two runs differ (its `report` is the `VerifyReport`).
    """
    args = _common(
        ["verify", os.fspath(job), "--date", date, "--json"], vars, None, False
    )
    done = _invoke(args, cwd, env, idem_bin)
    reports = [d for d in _json_lines(done.stdout) if "deterministic" in d]
    report = None
    if reports:
        d = reports[-1]
        report = VerifyReport(
            job=d["job"],
            logical_date=d["logical_date"],
            deterministic=bool(d["deterministic"]),
            partitions=[
                VerifiedPartition(
                    p["partition"], list(p["rows"]), list(p["digests"]), bool(p["same"])
                )
                for p in d.get("partitions", [])
            ],
            raw=dict(d),
        )
    if done.returncode != 0:
        _raise_for(args, done.returncode, done.stdout, done.stderr, report)
    if report is None:
        raise IdemError(f"idem printed no report: {done.stdout!r}", exit_code=0)
    return report


def dates(
    job_or_project: PathLike,
    start: str,
    end: str,
    *,
    stale: bool = False,
    cwd: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    idem_bin: str | None = None,
) -> list[Unit]:
    """The units a backfill of the range runs, in its order: `idem dates`. With
    `stale`, only those not fresh and every unit reading one of them."""
    args = ["dates", os.fspath(job_or_project), "--from", start, "--to", end, "--json"]
    if stale:
        args.append("--stale")
    done = _invoke(args, cwd, env, idem_bin)
    if done.returncode != 0:
        _raise_for(args, done.returncode, done.stdout, done.stderr)
    return [
        Unit(
            int(u["index"]),
            u["job"],
            u["job_file"],
            u["date"],
            list(u.get("after", [])),
        )
        for u in json.loads(done.stdout)
    ]


@dataclass(frozen=True)
class PlannedJob:
    """A job of a project, with the jobs whose tables it reads and that read its own."""

    job: str
    job_file: str
    target: str
    upstream: list[str]
    downstream: list[str]


def plan(
    project: PathLike,
    *,
    cwd: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    idem_bin: str | None = None,
) -> list[PlannedJob]:
    """The jobs of a project (a folder of job files) in dependency order: `idem plan`."""
    args = ["plan", os.fspath(project), "--json"]
    done = _invoke(args, cwd, env, idem_bin)
    if done.returncode != 0:
        _raise_for(args, done.returncode, done.stdout, done.stderr)
    return [
        PlannedJob(
            j["job"],
            j["job_file"],
            j["target"],
            list(j["upstream"]),
            list(j["downstream"]),
        )
        for j in json.loads(done.stdout)
    ]


def job_files(job_or_project: PathLike) -> list[Path]:
    """The job files a path names: itself, or the `*.toml` files of a project folder."""
    path = Path(job_or_project)
    if path.is_dir():
        return sorted(path.glob("*.toml"))
    return [path]
