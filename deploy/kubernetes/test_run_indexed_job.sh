#!/usr/bin/env bash
# Tests of run-indexed-job.sh with a stand-in worker (and, when IDEM_BIN is set, with
# idem itself on the README's example job):
#
#   bash deploy/kubernetes/test_run_indexed_job.sh
#   IDEM_BIN=target/release/idem bash deploy/kubernetes/test_run_indexed_job.sh
#
# Prints "N passed, N failed" last; exits 1 if any test failed.

set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
runner="$here/run-indexed-job.sh"
work=$(mktemp -d "${TMPDIR:-/tmp}/test-run-indexed-job.XXXXXX")
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
current=''

fail() {
  printf 'FAIL %s: %s\n' "$current" "$*"
  failed=$((failed + 1))
  current=''
}

ok() {
  if [ -n "$current" ]; then
    printf 'ok   %s\n' "$current"
    passed=$((passed + 1))
  fi
}

# The stand-in worker: records what it was given, then exits as its index's plan says.
# Plans (index -> exit code of each attempt; the last one repeats):
#   0: 0        1: 1 0      2: 2        3: 1 1 1 1
#   4: killed by SIGKILL, then 0        5: 5
cat >"$work/worker.sh" <<'EOF'
#!/usr/bin/env bash
set -euo pipefail
rec=$RECORD_DIR
i=$JOB_COMPLETION_INDEX
a=${IDEM_HOST##*-attempt-}
[ -d "$IDEM_STAGING" ] || { echo "no staging dir" >&2; exit 99; }
[ -z "$(ls -A "$IDEM_STAGING")" ] || { echo "staging not empty" >&2; exit 99; }
touch "$IDEM_STAGING/file"
printf '%s %s %s\n' "$i" "$IDEM_HOST" "$IDEM_STAGING" >>"$rec/attempts"
touch "$rec/running.$i.$a"
ls "$rec" | grep -c '^running\.' >>"$rec/concurrency" || true
sleep "${WORKER_SLEEP:-0.3}"
rm -f "$rec/running.$i.$a"
echo "{\"event\":\"summary\",\"index\":$i}"
case "$i:$a" in
  0:*) exit 0 ;;
  1:0) exit 1 ;;
  1:*) exit 0 ;;
  2:*) exit 2 ;;
  3:*) exit 1 ;;
  4:0) kill -KILL $$ ;;
  4:*) exit 0 ;;
  5:*) exit 5 ;;
  *) exit 0 ;;
esac
EOF
chmod +x "$work/worker.sh"

attempts_of() { # index -> how many attempts the record shows
  awk -v i="$1" '$1 == i' "$RECORD_DIR/attempts" | wc -l | tr -d ' '
}

# ---------------------------------------------------------------------------------------
current='retries follow the exit codes and the per-index limit'
export RECORD_DIR="$work/rec1"
mkdir -p "$RECORD_DIR"
rc=0
"$runner" --completions 6 --parallelism 2 --backoff-limit-per-index 2 --backoff-base 0 \
  --log-dir "$work/logs1" -- "$work/worker.sh" >"$work/out1" 2>"$work/err1" || rc=$?
[ "$rc" -eq 1 ] || fail "exit $rc, expected 1: $(cat "$work/out1" "$work/err1")"
[ -n "$current" ] && {
  want='1 2 1 3 2 1'
  got="$(attempts_of 0) $(attempts_of 1) $(attempts_of 2) $(attempts_of 3) $(attempts_of 4) $(attempts_of 5)"
  [ "$got" = "$want" ] || fail "attempts per index: $got, expected $want"
}
[ -n "$current" ] && {
  grep -q 'failed indices: 2,3,5;' "$work/out1" || fail "failed indices not named: $(tail -1 "$work/out1")"
}
[ -n "$current" ] && {
  lines=$(grep -c ' index [0-9]* attempt [0-9]* ' "$work/out1")
  [ "$lines" -eq 10 ] || fail "$lines attempt lines, expected 10"
}
[ -n "$current" ] && {
  grep -q 'index 2 attempt 0 (worker-2-attempt-0): exit 2 .*FailIndex' "$work/out1" ||
    fail "exit 2 not reported as FailIndex"
  grep -q 'index 4 attempt 0 (worker-4-attempt-0): exit 137 .*retry 1 of 2' "$work/out1" ||
    fail "a SIGKILL not retried"
  grep -q 'index 3 attempt 2 .*backoffLimitPerIndex 2 reached' "$work/out1" ||
    fail "index 3 not failed at its limit"
}
[ -n "$current" ] && {
  # IDEM_HOST names the index and the attempt; every attempt has its own staging dir,
  # created empty (checked by the worker) and removed afterwards.
  awk '{ split($2, h, "-"); if (h[1] != "worker" || h[2] != $1 || h[3] != "attempt") exit 1 }' \
    "$RECORD_DIR/attempts" || fail "bad IDEM_HOST: $(cat "$RECORD_DIR/attempts")"
  dirs=$(awk '{ print $3 }' "$RECORD_DIR/attempts" | sort -u | wc -l | tr -d ' ')
  [ "$dirs" -eq 10 ] || fail "$dirs staging dirs for 10 attempts"
  while read -r _ _ dir; do
    [ ! -e "$dir" ] || fail "staging dir $dir left behind"
  done <"$RECORD_DIR/attempts"
}
[ -n "$current" ] && {
  max=$(sort -n "$RECORD_DIR/concurrency" | tail -1)
  [ "$max" -le 2 ] || fail "$max workers at once with --parallelism 2"
  [ "$max" -eq 2 ] || fail "never 2 workers at once"
}
[ -n "$current" ] && {
  [ -s "$work/logs1/index-0.attempt-0.out" ] || fail "no stdout log of index 0"
  grep -q '"index":3' "$work/logs1/index-3.attempt-2.out" || fail "stdout log of index 3 attempt 2"
}
ok

# ---------------------------------------------------------------------------------------
current='the exit code says whether every index succeeded'
export RECORD_DIR="$work/rec2"
mkdir -p "$RECORD_DIR"
rc=0
"$runner" --completions 4 --parallelism 8 --backoff-limit-per-index 0 \
  -- "$work/worker.sh" >"$work/out2" 2>&1 || rc=$?
# indices 0..3 with the plans above: 1 and 3 fail on attempt 0 with no retries left.
[ "$rc" -eq 1 ] || fail "exit $rc, expected 1"
[ -n "$current" ] && { grep -q 'failed indices: 1,2,3;' "$work/out2" || fail "$(tail -1 "$work/out2")"; }
rc=0
"$runner" --completions 1 --parallelism 1 --backoff-limit-per-index 0 \
  -- "$work/worker.sh" >"$work/out3" 2>&1 || rc=$?
[ -n "$current" ] && { [ "$rc" -eq 0 ] || fail "exit $rc for one good index"; }
[ -n "$current" ] && { grep -q 'all 1 indices succeeded' "$work/out3" || fail "$(cat "$work/out3")"; }
rc=0
"$runner" --completions 0 --parallelism 1 --backoff-limit-per-index 0 -- false >"$work/out4" 2>&1 || rc=$?
[ -n "$current" ] && { [ "$rc" -eq 0 ] || fail "exit $rc for no index"; }
ok

# ---------------------------------------------------------------------------------------
current='a retry waits for its backoff'
export RECORD_DIR="$work/rec5"
mkdir -p "$RECORD_DIR"
start=$(date +%s)
rc=0
# index 1 fails once; --backoff-base 2: its retry starts 2 s later.
WORKER_SLEEP=0 "$runner" --completions 2 --parallelism 2 --backoff-limit-per-index 1 \
  --backoff-base 2 -- "$work/worker.sh" >"$work/out5" 2>&1 || rc=$?
elapsed=$(($(date +%s) - start))
[ "$rc" -eq 0 ] || fail "exit $rc: $(cat "$work/out5")"
[ -n "$current" ] && { grep -q 'retry 1 of 1 in 2s' "$work/out5" || fail "$(cat "$work/out5")"; }
[ -n "$current" ] && { [ "$elapsed" -ge 2 ] || fail "took ${elapsed}s, the retry did not wait"; }
ok

# ---------------------------------------------------------------------------------------
current='bad arguments exit 2'
for args in "--parallelism 1 --backoff-limit-per-index 0 -- true" \
  "--completions 1 --parallelism 0 --backoff-limit-per-index 0 -- true" \
  "--completions x --parallelism 1 --backoff-limit-per-index 0 -- true" \
  "--completions 1 --parallelism 1 --backoff-limit-per-index 0"; do
  rc=0
  # shellcheck disable=SC2086  # the words are the arguments
  "$runner" $args >/dev/null 2>&1 || rc=$?
  [ "$rc" -eq 2 ] || { fail "exit $rc for: $args"; break; }
done
ok

# ---------------------------------------------------------------------------------------
current='SIGTERM stops the workers and exits 130'
export RECORD_DIR="$work/rec6"
mkdir -p "$RECORD_DIR"
WORKER_SLEEP=30 "$runner" --completions 4 --parallelism 2 --backoff-limit-per-index 3 \
  --backoff-base 0 -- "$work/worker.sh" >"$work/out6" 2>&1 &
runner_pid=$!
for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
  set -- "$RECORD_DIR"/running.*
  [ -e "$1" ] && [ $# -ge 2 ] && break
  sleep 0.2
done
kill -TERM "$runner_pid"
rc=0
wait "$runner_pid" || rc=$?
[ "$rc" -eq 130 ] || fail "exit $rc, expected 130: $(cat "$work/out6")"
[ -n "$current" ] && {
  sleep 0.5
  if pgrep -f "$work/worker.sh" >/dev/null 2>&1; then fail "workers still running"; fi
  [ "$(attempts_of 2)" -eq 0 ] || fail "index 2 started after the signal"
}
ok

# ---------------------------------------------------------------------------------------
if [ -n "${IDEM_BIN:-}" ]; then
  current='idem workers: one unit per index of the example project, twice'
  idem=$(cd "$(dirname "$IDEM_BIN")" && pwd)/$(basename "$IDEM_BIN")
  lake="$work/lake"
  mkdir -p "$lake/testdata"
  cp -R "$repo/testdata/jobs" "$lake/testdata/jobs"
  cp -R "$repo/testdata/lake" "$lake/testdata/lake"
  range=(--from 2026-06-01 --to 2026-06-07)
  n=$(cd "$lake" && "$idem" dates testdata/jobs "${range[@]}" --json | tr -cd '{' | wc -c | tr -d ' ')
  [ "$n" -eq 21 ] || fail "idem dates listed $n units, expected 21"
  # The tables are on local disk, which is single-host: the workers keep this
  # machine's host name instead of the per-attempt one the runner gives them.
  cat >"$work/idem-unit.sh" <<EOF
#!/usr/bin/env bash
set -euo pipefail
cd "$lake"
exec env -u IDEM_HOST "$idem" backfill testdata/jobs ${range[*]} --index --skip-fresh --json
EOF
  chmod +x "$work/idem-unit.sh"
  for round in written fresh; do
    rc=0
    "$runner" --completions "$n" --parallelism 3 --backoff-limit-per-index 2 --backoff-base 0 \
      --log-dir "$work/idem-logs-$round" -- "$work/idem-unit.sh" >"$work/out7" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || { fail "exit $rc: $(cat "$work/out7")"; break; }
    got=$(cat "$work/idem-logs-$round"/index-*.attempt-0.out | grep '"event":"done"' |
      grep -c "\"action\":\"$round\"" || true)
    [ "$got" -ge 1 ] || { fail "no partition $round"; break; }
  done
  [ -n "$current" ] && {
    for t in fct_orders daily_sales orders_by_country; do
      parts=$(find "$lake/lake/analytics/$t" -name '*.parquet' | wc -l | tr -d ' ')
      [ "$parts" -eq 7 ] || fail "$t: $parts data files, expected 7"
    done
    # The second round found every unit fresh: nothing was written.
    if grep -h '"event":"done"' "$work/idem-logs-fresh"/index-*.out | grep -q '"action":"written"'; then
      fail "the second round wrote a partition"
    fi
  }
  ok
else
  echo "skip idem workers (set IDEM_BIN to run them)"
fi

printf '%d passed, %d failed\n' "$passed" "$failed"
[ "$failed" -eq 0 ]
