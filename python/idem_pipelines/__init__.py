"""idem from Python: run, backfill, verify and inspect idempotent pipelines.

Each function runs the `idem` binary this package installed (see `find_idem`) with
`--json` and returns dataclasses; a failure raises the exception of its exit code.

    import idem_pipelines as idem

    report = idem.run("jobs/fct_orders.toml", "2026-06-02")
    for p in report.partitions:
        print(p.partition, p.action, p.rows, p.digest)

    for event in idem.backfill("jobs/fct_orders.toml", "2026-06-01", "2026-06-07"):
        if isinstance(event, idem.Done):
            print(event.logical_date, [p.action for p in event.report.partitions])

The Dagster integration is `idem_pipelines.dagster` (`pip install
"idem-pipelines[dagster]"`).
"""

from ._api import (
    Abandoned,
    Backfill,
    Committed,
    Done,
    Event,
    Failed,
    Partition,
    PartitionStatus,
    PlannedJob,
    RunReport,
    Skipped,
    Started,
    Summary,
    TableStatus,
    Unit,
    VerifiedPartition,
    VerifyReport,
    backfill,
    dates,
    job_files,
    plan,
    run,
    status,
    verify,
)
from ._binary import find_idem
from .errors import (
    BadInput,
    CheckFailed,
    DataError,
    IdemError,
    Interrupted,
    NotDeterministic,
    RunFailed,
)

try:
    from importlib.metadata import PackageNotFoundError, version

    try:
        __version__ = version("idem-pipelines")
    except PackageNotFoundError:
        __version__ = "0.0.0"
except ImportError:  # pragma: no cover
    __version__ = "0.0.0"

__all__ = [
    "Abandoned",
    "Backfill",
    "BadInput",
    "CheckFailed",
    "Committed",
    "DataError",
    "Done",
    "Event",
    "Failed",
    "IdemError",
    "Interrupted",
    "NotDeterministic",
    "Partition",
    "PartitionStatus",
    "PlannedJob",
    "RunFailed",
    "RunReport",
    "Skipped",
    "Started",
    "Summary",
    "TableStatus",
    "Unit",
    "VerifiedPartition",
    "VerifyReport",
    "backfill",
    "dates",
    "find_idem",
    "job_files",
    "plan",
    "run",
    "status",
    "verify",
]
