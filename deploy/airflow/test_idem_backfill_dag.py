"""Smoke test of idem_backfill_dag.py WITHOUT Airflow (plain python3, no packages):

    python3 deploy/airflow/test_idem_backfill_dag.py

A stub `airflow` package (dag/task/Param/get_current_context and the two exceptions)
and a stand-in idem that speaks the `idem dates --json` / `idem backfill --index`
contract let it check the DAG's shape (params, one .expand over list_units), the
command lines it runs, and how each exit code is raised: 2-5 AirflowFailException (no
retry), anything else AirflowException (retried). It does not test Airflow itself.
Prints "N passed, N failed" last.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import textwrap
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent

STUB_SDK = '''
REGISTRY = {}
CONTEXT = {}
LIVE = False
class Param:
    def __init__(self, default=None, **kw):
        self.default = default
def get_current_context():
    return CONTEXT
class _Task:
    def __init__(self, fn, kw):
        self.fn, self.kw = fn, kw
        REGISTRY[fn.__name__] = self
    def __call__(self, *a, **k):
        return self.fn(*a, **k) if LIVE else "XComArg"
    def expand(self, **kw):
        REGISTRY["_expanded"] = (self.fn.__name__, kw)
def task(fn=None, **kw):
    if fn is not None:
        return _Task(fn, {})
    return lambda f: _Task(f, kw)
def dag(**kw):
    REGISTRY["_dag"] = kw
    return lambda fn: fn
'''

STUB_EXCEPTIONS = '''
class AirflowException(Exception):
    pass
class AirflowFailException(AirflowException):
    pass
'''

# Speaks the new contract: `dates --json` prints one array; `backfill --index I --json`
# prints JSON lines and exits with $FAKE_RC. Records its arguments in $FAKE_ARGS.
FAKE_IDEM = '''#!/bin/sh
echo "$*" >> "$FAKE_ARGS"
case $1 in
  dates)
    echo '[{"index":0,"job":"fct_orders","job_file":"jobs/fct_orders.toml","date":"2026-06-02","after":[]},'
    echo ' {"index":1,"job":"fct_orders","job_file":"jobs/fct_orders.toml","date":"2026-06-01","after":[]},'
    echo ' {"index":2,"job":"daily_sales","job_file":"jobs/daily_sales.toml","date":"2026-06-02","after":[0]}]'
    echo "warning: a warning on stderr" >&2
    exit "${FAKE_DATES_RC:-0}" ;;
  backfill)
    echo '{"event":"start","job":"daily_sales","logical_date":"2026-06-02","running":1,"ms":0}'
    if [ "${FAKE_RC:-0}" = 0 ]; then
      echo '{"event":"done","job":"daily_sales","logical_date":"2026-06-02","report":{"partitions":[]}}'
      echo '{"event":"summary","job":"fct_orders","dates":1,"succeeded":1,"failed":0,"fresh":1}'
      echo '{"event":"summary","job":"daily_sales","dates":1,"succeeded":1,"failed":0,"written":1}'
    else
      echo '{"event":"failed","job":"daily_sales","logical_date":"2026-06-02","error":"boom on the data","exit_code":'"$FAKE_RC"'}'
      echo '{"event":"summary","dates":1,"succeeded":0,"failed":1}'
      echo "error: boom on the data" >&2
      exit "$FAKE_RC"
    fi ;;
esac
'''


def load_dag(tmp: Path):
    pkg = tmp / "stub" / "airflow"
    (pkg / "sdk").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sdk" / "__init__.py").write_text(textwrap.dedent(STUB_SDK))
    (pkg / "sdk" / "exceptions.py").write_text(textwrap.dedent(STUB_EXCEPTIONS))
    sys.path.insert(0, str(tmp / "stub"))
    import airflow.sdk as sdk  # the stub
    import airflow.sdk.exceptions as exc

    spec = importlib.util.spec_from_file_location("idem_backfill_dag", HERE / "idem_backfill_dag.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sdk.LIVE = True
    return sdk, exc


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="idem-airflow-test-"))
    fake = tmp / "idem"
    fake.write_text(FAKE_IDEM)
    fake.chmod(0o755)
    args_file = tmp / "args"
    os.environ.update(IDEM_BIN=str(fake), FAKE_ARGS=str(args_file))
    sdk, exc = load_dag(tmp)
    tasks = sdk.REGISTRY
    params = {"project": "jobs", "from": "2026-06-01", "to": "2026-06-02",
              "only_stale": False, "vars": ["region=eu"], "workdir": str(tmp)}
    sdk.CONTEXT.update(params=params)

    def last_args() -> str:
        return args_file.read_text().splitlines()[-1]

    def test_shape():
        assert tasks["_expanded"][0] == "run_unit" and list(tasks["_expanded"][1]) == ["unit"]
        assert set(tasks["_dag"]["params"]) >= {"project", "from", "to"}
        assert tasks["_dag"]["default_args"]["retry_exponential_backoff"] is True

    def test_list_units():
        units = tasks["list_units"]()
        assert [u["index"] for u in units] == [0, 1, 2], units
        assert last_args() == "dates jobs --from 2026-06-01 --to 2026-06-02 --var region=eu --json"
        params["only_stale"] = True
        tasks["list_units"]()
        params["only_stale"] = False
        assert "--stale --json" in last_args(), last_args()

    def test_a_unit_returns_its_summary():
        os.environ["FAKE_RC"] = "0"
        unit = {"index": 2, "job": "daily_sales", "date": "2026-06-02", "after": [0]}
        summary = tasks["run_unit"](unit)
        assert summary["event"] == "summary" and summary["job"] == "daily_sales", summary
        assert summary["written"] == 1 and summary["succeeded"] == 1, summary
        assert [u["job"] for u in summary["upstream_summaries"]] == ["fct_orders"], summary
        assert summary["unit"] == unit
        assert last_args() == ("backfill jobs --from 2026-06-01 --to 2026-06-02 --index 2 "
                               "--var region=eu --skip-fresh --json"), last_args()
        assert sdk.CONTEXT["idem_unit"] == "2: daily_sales 2026-06-02"

    def test_exit_codes():
        unit = {"index": 2, "job": "daily_sales", "date": "2026-06-02", "after": [0]}
        expected = {1: exc.AirflowException, 2: exc.AirflowFailException,
                    3: exc.AirflowFailException, 4: exc.AirflowFailException,
                    5: exc.AirflowFailException, 101: exc.AirflowException,
                    130: exc.AirflowException, 137: exc.AirflowException}
        for code, cls in expected.items():
            os.environ["FAKE_RC"] = str(code)
            try:
                tasks["run_unit"](unit)
            except exc.AirflowException as e:
                assert type(e) is cls, (code, type(e))
                assert f"exit {code}" in str(e) and "boom on the data" in str(e), str(e)
            else:
                raise AssertionError(f"exit {code} did not raise")
        os.environ["FAKE_DATES_RC"] = "2"
        try:
            tasks["list_units"]()
        except exc.AirflowFailException:
            pass
        else:
            raise AssertionError("idem dates exit 2 did not fail the task")
        finally:
            os.environ.pop("FAKE_DATES_RC")

    passed = failed = 0
    for name, fn in list(locals().items()):
        if not name.startswith("test_"):
            continue
        try:
            fn()
        except Exception:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
        else:
            passed += 1
            print(f"ok   {name}")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
