"""Airflow DAG: a backfill of an idem project (or one job), one mapped task per unit.

Trigger it with params, e.g. from the CLI:

    airflow dags trigger idem_backfill \
        --conf '{"project": "jobs/sales", "from": "2026-06-01", "to": "2026-06-30"}'

1. `list_units` runs `idem dates PROJECT --from --to --json` and returns its units
   (`[{"index": 0, "job": ..., "date": ..., "after": [...]}, ...]`).
2. `run_unit` is mapped over them (`.expand`): one task instance per unit, each
   running `idem backfill PROJECT --from --to --index I --skip-fresh --json`. A unit of
   a downstream job brings the upstream units it reads up to date itself (cheap when
   they are done), so the mapped tasks need no dependencies between them; at most
   `max_active_tis_per_dag` run at once.
3. Exit codes: 0 returns the unit's job's `summary` event (an XCom, with the unit and
   the summaries of the upstream jobs it brought up to date); 2 (bad input),
   3 (check failed), 4 (not deterministic), 5 (transform failed on the data) raise
   AirflowFailException, which fails the task with no retry; anything else (1 I/O or
   store error, contention, a lost lease; 130 interrupted; a signal; a panic) raises
   AirflowException, retried `retries` times with exponential backoff.

Tables on local disk are single-host: run this DAG's workers on that host. Tables on
an object store (s3://, az://, gs://) may be written from any number of workers.

The binary is $IDEM_BIN, else `idem` on PATH. Relative paths in job files resolve
against idem's current directory: the `workdir` param, else $IDEM_WORKDIR, else the
worker's. Airflow 3.x (airflow.sdk) or 2.x (TaskFlow, 2.9+ for the map index labels).
With more than `[core] max_map_length` units (1024 by default) the mapping fails:
raise that setting or split the range.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections import deque
from datetime import datetime, timedelta
from typing import Any

try:  # Airflow 3
    from airflow.sdk import Param, dag, get_current_context, task
except ImportError:  # Airflow 2
    from airflow.decorators import dag, task
    from airflow.models.param import Param
    from airflow.operators.python import get_current_context

try:  # Airflow 3.1+ (the Task SDK's own exceptions)
    from airflow.sdk.exceptions import AirflowException, AirflowFailException
except ImportError:
    from airflow.exceptions import AirflowException, AirflowFailException

# idem's exit codes that no retry can change.
FINAL_EXIT_CODES = {
    2: "bad input (job file, arguments or SQL)",
    3: "a check on the staged output failed",
    4: "not deterministic: two runs differ",
    5: "the transform failed on this date's data",
}


def _idem() -> str:
    binary = os.environ.get("IDEM_BIN") or "idem"
    found = shutil.which(binary)
    if not found:
        raise AirflowFailException(f"idem binary {binary!r} not found: set IDEM_BIN or PATH")
    return found


def _workdir(params: dict[str, Any]) -> str | None:
    return params.get("workdir") or os.environ.get("IDEM_WORKDIR") or None


def _var_args(params: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for assignment in params.get("vars") or []:
        out += ["--var", str(assignment)]
    return out


def _explain(code: int) -> str:
    if code in FINAL_EXIT_CODES:
        return FINAL_EXIT_CODES[code]
    if code == 1:
        return "failed while reading, writing or committing; a retry may succeed"
    if code == 130:
        return "interrupted"
    if code < 0:
        return f"killed by signal {-code}"
    if code > 128:
        return f"killed by signal {code - 128}"
    return "unexpected exit code; a retry may succeed"


def _run(argv: list[str], cwd: str | None) -> tuple[int, list[Any], list[str]]:
    """Run idem, echo its output into the task log, and return its exit code, the JSON
    documents it printed on stdout (one per line, or one pretty-printed document) and
    the last lines of its stderr (the error, when it failed)."""
    print("running:", " ".join(argv), f"(in {cwd})" if cwd else "", flush=True)
    proc = subprocess.Popen(
        argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, bufsize=1,
    )
    tail: deque[str] = deque(maxlen=40)

    def pump_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            print("idem:", line, end="", flush=True)
            if line.strip():
                tail.append(line.rstrip("\n"))

    reader = threading.Thread(target=pump_stderr, daemon=True)
    reader.start()
    out: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            out.append(line)
        code = proc.wait()
    except BaseException:
        # Timeout, or the task was marked failed/cleared: stop idem too. A killed run
        # leaves every partition old or new.
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    finally:
        reader.join(timeout=10)
    docs: list[Any] = []
    whole = "".join(out).strip()
    try:
        if whole:
            docs = [json.loads(whole)]
    except json.JSONDecodeError:
        for line in out:
            try:
                docs.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # not JSON: already in the log
    return code, docs, list(tail)


def _raise_for(code: int, what: str, tail: list[str]) -> None:
    message = f"{what}: idem exit {code}: {_explain(code)}"
    if tail:
        message += "\n" + "\n".join(tail[-10:])
    if code in FINAL_EXIT_CODES:
        raise AirflowFailException(message)
    raise AirflowException(message)


@dag(
    dag_id="idem_backfill",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["idem"],
    doc_md=__doc__,
    params={
        "project": Param("jobs", type="string",
                         description="A project folder of job files, or one job file."),
        "from": Param("2026-06-01", type="string",
                      description="First logical date: YYYY-MM-DD, YYYY-MM-DDTHH or YYYY-MM."),
        "to": Param("2026-06-07", type="string", description="Last logical date (inclusive)."),
        "only_stale": Param(False, type="boolean",
                            description="Map only the units that are not fresh, and those reading them "
                                        "(idem dates --stale; indices stay the full list's)."),
        "vars": Param([], type="array", description='SQL parameters, e.g. ["region=eu"].'),
        "workdir": Param("", type="string",
                         description="idem's current directory (relative job paths resolve here)."),
    },
    default_args={
        "retries": 3,
        "retry_delay": timedelta(minutes=1),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(minutes=30),
    },
)
def idem_backfill():
    @task(retries=2)
    def list_units() -> list[dict[str, Any]]:
        params = get_current_context()["params"]
        argv = [_idem(), "dates", params["project"], "--from", params["from"],
                "--to", params["to"], *_var_args(params), "--json"]
        if params.get("only_stale"):
            argv.insert(-1, "--stale")
        code, docs, tail = _run(argv, _workdir(params))
        if code != 0:
            _raise_for(code, "idem dates", tail)
        units = docs[0] if len(docs) == 1 and isinstance(docs[0], list) else docs
        units = [u for u in units if isinstance(u, dict) and "index" in u]
        print(f"{len(units)} units", flush=True)
        return units

    @task(
        max_active_tis_per_dag=8,
        map_index_template="{{ idem_unit }}",
        execution_timeout=timedelta(hours=6),
    )
    def run_unit(unit: dict[str, Any]) -> dict[str, Any]:
        context = get_current_context()
        params = context["params"]
        label = f"{unit['index']}: {unit['job']} {unit['date']}"
        context["idem_unit"] = label  # rendered by map_index_template
        argv = [_idem(), "backfill", params["project"], "--from", params["from"],
                "--to", params["to"], "--index", str(unit["index"]), *_var_args(params),
                "--skip-fresh", "--json"]
        code, docs, tail = _run(argv, _workdir(params))
        events = [d for d in docs if isinstance(d, dict)]
        for event in events:
            if event.get("event") in ("failed", "skipped"):
                tail.append(f"{event.get('event')}: {event.get('error') or event.get('reason') or event}")
        if code != 0:
            _raise_for(code, f"unit {label}", tail)
        summaries = [e for e in events if e.get("event") == "summary"]
        if not summaries:
            raise AirflowException(f"unit {label}: idem exited 0 without a summary")
        # One summary per job: the upstream jobs the worker brought up to date first,
        # then the unit's own.
        own = [e for e in summaries if e.get("job") == unit["job"]]
        summary = dict((own or summaries)[-1])
        summary["unit"] = unit
        if len(summaries) > 1:
            summary["upstream_summaries"] = [e for e in summaries if e.get("job") != unit["job"]]
        return summary

    run_unit.expand(unit=list_units())


idem_backfill()
