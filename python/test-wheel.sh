#!/usr/bin/env bash
# Builds the idem-pipelines wheel (a debug build that reuses target/), installs it into
# a fresh virtual environment with Dagster and pytest, and runs python/tests/ against
# it. From the repository root: `python/test-wheel.sh`. Needs Python 3.10+ with venv
# and one-time access to PyPI; set IDEM_WHEEL_PROFILE=release for a release wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${IDEM_PYTHON_BASE:-python3}
tools=target/wheel-tools
if [ ! -x "$tools/bin/maturin" ]; then
    "$py" -m venv "$tools"
    "$tools/bin/pip" install --quiet "maturin==1.16.0"
fi
rm -rf target/wheels
"$tools/bin/maturin" build --profile "${IDEM_WHEEL_PROFILE:-dev}" --out target/wheels
wheel=$(ls target/wheels/idem_pipelines-*.whl)
echo "built $wheel ($(du -h "$wheel" | cut -f1))"
venv=target/wheel-venv
rm -rf "$venv"
"$py" -m venv "$venv"
"$venv/bin/pip" install --quiet "${wheel}[dagster]" "dagster==1.13.29" "pytest==9.2.0"
# The installed binary, not a build from source: the tests run what users install.
unset IDEM_BIN
"$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests
# The Dagster end-to-end scenarios of deploy/, against the installed package and binary.
PATH="$PWD/$venv/bin:$PATH" "$venv/bin/python" deploy/dagster/test_idem_dagster.py
