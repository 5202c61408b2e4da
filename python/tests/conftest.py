"""Fixtures: a copy of the repository's sample lake and jobs in a temporary directory,
where the tests run idem (the binary the installed wheel carries, or `IDEM_BIN`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def lake(tmp_path: Path) -> Path:
    """A directory holding `testdata/` (the sample raw orders and the example jobs);
    the example jobs write under `lake/analytics/`."""
    shutil.copytree(REPO / "testdata" / "lake", tmp_path / "testdata" / "lake")
    shutil.copytree(REPO / "testdata" / "jobs", tmp_path / "testdata" / "jobs")
    return tmp_path


def write_job(lake: Path, name: str, text: str) -> Path:
    path = lake / "jobs" / f"{name}.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


#: A daily job over the sample orders; `{select}` and `{extra}` are filled in.
DAILY = """
name = "{name}"
{top}
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = ["created_date"]
[transform]
sql = "select {select}, cast(created_at as date) as dt from orders where created_date = $run_date"
[target]
path = "out/{name}"
partition_by = ["dt"]
{extra}
"""


def daily_job(
    lake: Path,
    name: str,
    select: str = "order_id, status",
    extra: str = "",
    top: str = "",
) -> Path:
    return write_job(
        lake, name, DAILY.format(name=name, select=select, extra=extra, top=top)
    )
