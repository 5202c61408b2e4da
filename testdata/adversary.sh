#!/usr/bin/env bash
# Runs idem's adversarial searches longer than CI does (see docs/adversary.md).
#
#   testdata/adversary.sh schedules N [SEED]   N random schedules of concurrent writers
#   testdata/adversary.sh s3-schedules N [SEED]   the same on S3 (moto)
#   testdata/adversary.sh delta-schedules N [SEED]   with another Delta writer (CI: 32)
#   testdata/adversary.sh faults               the fault search alone, at every call (moto, Delta)
#   testdata/adversary.sh kills N              N random SIGKILLs per backend
#   testdata/adversary.sh corrupt N [SEED]     N random damages to a raw file on disk, N/10
#                                              to an object on S3 (CI: 40 and 4)
#   testdata/adversary.sh wire N [SEED]        N runs through a faulty network to moto (CI: 6)
#   testdata/adversary.sh answers W [SEED] [Q] [M]
#                                              W generated worlds of Q queries and M merges
#                                              each, through idem and DuckDB
#
# Needs what `cargo test --workspace` needs (Python readers, moto, Azurite: installed
# on first use). A failure names what reproduces it.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-}
case "$what" in
  schedules)
    export IDEM_SCHEDULES="${2:-1000}" IDEM_SCHEDULE_SEED="${3:-1}"
    exec cargo test --workspace --test it schedules::random_schedules_of_concurrent -- --nocapture
    ;;
  s3-schedules)
    export IDEM_S3_SCHEDULES="${2:-200}" IDEM_SCHEDULE_SEED="${3:-1}"
    exec cargo test --workspace --test it schedules::random_schedules_on_an_object_store -- --nocapture
    ;;
  delta-schedules)
    export IDEM_DELTA_SCHEDULES="${2:-400}" IDEM_SCHEDULE_SEED="${3:-1}"
    exec cargo test --workspace --test it delta_schedules::random_schedules -- --nocapture
    ;;
  faults)
    export IDEM_FAULTS_S3_STRIDE=1 IDEM_FAULTS_DELTA_STRIDE=1
    exec cargo test --workspace --test it faults:: -- --nocapture --test-threads=1
    ;;
  kills)
    export IDEM_CONFORMANCE_KILLS="${2:-100}"
    exec cargo test --workspace --test it sigkill_at_random_moments -- --nocapture
    ;;
  corrupt)
    export IDEM_CORRUPT_CASES="${2:-2000}" IDEM_CORRUPT_SEED="${3:-1}"
    export IDEM_CORRUPT_S3_CASES=$(( ${2:-2000} / 10 ))
    exec cargo test --workspace --test it corrupt:: -- --nocapture
    ;;
  wire)
    export IDEM_WIRE_RUNS="${2:-50}" IDEM_WIRE_SEED="${3:-1}"
    exec cargo test --workspace --test it wire::a_faulty_network -- --nocapture
    ;;
  answers)
    export IDEM_ANSWERS_WORLDS="${2:-100}" IDEM_ANSWERS_SEED="${3:-1}"
    export IDEM_ANSWERS_QUERIES="${4:-24}" IDEM_ANSWERS_MERGES="${5:-2}"
    exec cargo test --workspace --test it answers::generated_queries_give -- --nocapture
    ;;
  *)
    sed -n '2,17p' "$0" >&2
    exit 2
    ;;
esac
