#!/usr/bin/env bash
# Run CMD as the workers of a Kubernetes Indexed Job would run, on this machine.
#
#   run-indexed-job.sh --completions N --parallelism P --backoff-limit-per-index B \
#       [--backoff-base S] [--log-dir DIR] -- CMD [ARG...]
#
# e.g. the workers of backfill-indexed-job.yaml:
#
#   N=$(idem dates jobs/sales --from 2026-06-01 --to 2026-06-30 --json | jq length)
#   deploy/kubernetes/run-indexed-job.sh --completions "$N" --parallelism 4 \
#       --backoff-limit-per-index 3 -- \
#       idem backfill jobs/sales --from 2026-06-01 --to 2026-06-30 --skip-fresh --json
#
# What it does, as the Job's controller does with completionMode: Indexed,
# backoffLimitPerIndex and backfill-indexed-job.yaml's podFailurePolicy:
#
# * each index 0..N-1 runs CMD with JOB_COMPLETION_INDEX=i in its environment, lowest
#   pending index first, at most P attempts at once;
# * every attempt gets IDEM_HOST=worker-<i>-attempt-<a> (a in 0..B) and IDEM_STAGING,
#   a fresh empty directory, removed when the attempt ends (a pod's emptyDir);
# * exit 0: the index succeeded. Exit 2, 3, 4 or 5 (bad input, check failed, not
#   deterministic, the transform failed on the data): FailIndex, no retry. Any other
#   exit (1, 130, 101, a signal): retried, at most B times, after a delay of S, 2S,
#   4S ... seconds (at most 360; S defaults to 10 like the Job controller; 0 for none);
# * one line per attempt on stdout; each attempt's stdout and stderr go to
#   DIR/index-<i>.attempt-<a>.{out,err} (DIR: --log-dir, else a new temp dir);
# * exit 0 if every index succeeded, else 1, naming the failed indices; 2 on bad
#   arguments. Ctrl-C or SIGTERM stops the running attempts (SIGTERM) and exits 130.
#
# Local-disk tables are single-host: several workers of one machine may share them;
# workers on several machines need tables on an object store.
#
# Portable bash (3.2 and later, macOS included); no GNU parallel.

set -euo pipefail

prog=${0##*/}

usage() {
  cat >&2 <<EOF
usage: $prog --completions N --parallelism P --backoff-limit-per-index B
       [--backoff-base SECONDS] [--log-dir DIR] -- CMD [ARG...]
EOF
  exit 2
}

die() {
  printf '%s: %s\n' "$prog" "$*" >&2
  exit 2
}

is_count() {
  case $1 in
    '' | *[!0-9]*) return 1 ;;
    *) return 0 ;;
  esac
}

completions=''
parallelism=''
backoff_limit=''
backoff_base=10
log_dir=''

while [ $# -gt 0 ]; do
  case $1 in
    --completions) [ $# -ge 2 ] || usage; completions=$2; shift 2 ;;
    --completions=*) completions=${1#*=}; shift ;;
    --parallelism) [ $# -ge 2 ] || usage; parallelism=$2; shift 2 ;;
    --parallelism=*) parallelism=${1#*=}; shift ;;
    --backoff-limit-per-index) [ $# -ge 2 ] || usage; backoff_limit=$2; shift 2 ;;
    --backoff-limit-per-index=*) backoff_limit=${1#*=}; shift ;;
    --backoff-base) [ $# -ge 2 ] || usage; backoff_base=$2; shift 2 ;;
    --backoff-base=*) backoff_base=${1#*=}; shift ;;
    --log-dir) [ $# -ge 2 ] || usage; log_dir=$2; shift 2 ;;
    --log-dir=*) log_dir=${1#*=}; shift ;;
    --) shift; break ;;
    -h | --help) usage ;;
    *) die "unknown argument: $1 (the command goes after --)" ;;
  esac
done

[ $# -gt 0 ] || die "no command after --"
is_count "$completions" || die "--completions must be a number, got '$completions'"
if ! is_count "$parallelism" || [ "$parallelism" -lt 1 ]; then
  die "--parallelism must be a number >= 1, got '$parallelism'"
fi
is_count "$backoff_limit" || die "--backoff-limit-per-index must be a number, got '$backoff_limit'"
is_count "$backoff_base" || die "--backoff-base must be a whole number of seconds, got '$backoff_base'"

if [ -z "$log_dir" ]; then
  log_dir=$(mktemp -d "${TMPDIR:-/tmp}/indexed-job-logs.XXXXXX")
else
  mkdir -p "$log_dir"
fi

n=$completions
p=$parallelism

# Per index: state (pending, running, succeeded, failed), attempts started, and the
# earliest time (epoch seconds) its next attempt may start.
state=()
attempts=()
not_before=()
i=0
while [ "$i" -lt "$n" ]; do
  state[i]=pending
  attempts[i]=0
  not_before[i]=0
  i=$((i + 1))
done

# Per slot (at most P attempts at once): pid, index, attempt, staging dir, start time.
slot_pid=()
slot_index=()
slot_attempt=()
slot_staging=()
slot_start=()
s=0
while [ "$s" -lt "$p" ]; do
  slot_pid[s]=''
  slot_index[s]=''
  slot_attempt[s]=''
  slot_staging[s]=''
  slot_start[s]=''
  s=$((s + 1))
done

running=0
unfinished=$n
next_fresh=0 # indices below this have started at least once

now() { date +%s; }
stamp() { date '+%H:%M:%S'; }

# The delay before retry number r (1-based): base * 2^(r-1), at most 360 s.
backoff_delay() {
  local d=$backoff_base r=$1
  while [ "$r" -gt 1 ] && [ "$d" -lt 360 ]; do
    d=$((d * 2))
    r=$((r - 1))
  done
  [ "$d" -gt 360 ] && d=360
  printf '%s\n' "$d"
}

start_attempt() { # slot index CMD...
  local s=$1 i=$2 a staging
  shift 2
  a=${attempts[i]}
  staging=$(mktemp -d "${TMPDIR:-/tmp}/idem-staging.worker-$i-attempt-$a.XXXXXX")
  (
    export JOB_COMPLETION_INDEX="$i"
    export IDEM_HOST="worker-$i-attempt-$a"
    export IDEM_STAGING="$staging"
    exec "$@" </dev/null >"$log_dir/index-$i.attempt-$a.out" 2>"$log_dir/index-$i.attempt-$a.err"
  ) &
  slot_pid[s]=$!
  slot_index[s]=$i
  slot_attempt[s]=$a
  slot_staging[s]=$staging
  slot_start[s]=$(now)
  state[i]=running
  attempts[i]=$((a + 1))
  running=$((running + 1))
}

finish_attempt() { # slot exit-code
  local s=$1 rc=$2 i a secs verdict delay
  i=${slot_index[s]}
  a=${slot_attempt[s]}
  secs=$(($(now) - slot_start[s]))
  rm -rf "${slot_staging[s]}"
  slot_pid[s]=''
  running=$((running - 1))
  if [ "$rc" -eq 0 ]; then
    state[i]=succeeded
    unfinished=$((unfinished - 1))
    verdict='succeeded'
  else
    case $rc in
      2 | 3 | 4 | 5)
        state[i]=failed
        unfinished=$((unfinished - 1))
        verdict='FailIndex (final exit code, not retried)'
        ;;
      *)
        if [ "$a" -lt "$backoff_limit" ]; then
          delay=$(backoff_delay $((a + 1)))
          state[i]=pending
          not_before[i]=$(($(now) + delay))
          verdict="retry $((a + 1)) of $backoff_limit in ${delay}s"
        else
          state[i]=failed
          unfinished=$((unfinished - 1))
          verdict="failed (backoffLimitPerIndex $backoff_limit reached)"
        fi
        ;;
    esac
  fi
  printf '%s index %d attempt %d (%s): exit %d after %ds: %s; log %s\n' \
    "$(stamp)" "$i" "$a" "worker-$i-attempt-$a" "$rc" "$secs" "$verdict" \
    "$log_dir/index-$i.attempt-$a.err"
}

interrupted=0
# shellcheck disable=SC2317  # reached through the trap
on_signal() {
  interrupted=1
  local s=0
  while [ "$s" -lt "$p" ]; do
    if [ -n "${slot_pid[s]}" ]; then
      kill -TERM "${slot_pid[s]}" 2>/dev/null || true
    fi
    s=$((s + 1))
  done
}
trap on_signal INT TERM

# The lowest pending index whose backoff has passed, or nothing.
next_index() {
  local t i=0
  t=$(now)
  # Like the Job controller: the lowest pending index, a retry or a first attempt.
  while [ "$i" -lt "$next_fresh" ]; do
    if [ "${state[i]}" = pending ] && [ "${not_before[i]}" -le "$t" ]; then
      printf '%s\n' "$i"
      return
    fi
    i=$((i + 1))
  done
  if [ "$next_fresh" -lt "$n" ]; then
    printf '%s\n' "$next_fresh"
  fi
}

printf '%s %d indices, parallelism %d, backoffLimitPerIndex %d; logs in %s\n' \
  "$(stamp)" "$n" "$p" "$backoff_limit" "$log_dir"

while [ "$unfinished" -gt 0 ] && [ "$interrupted" -eq 0 ]; do
  # Fill free slots.
  s=0
  while [ "$s" -lt "$p" ] && [ "$running" -lt "$p" ] && [ "$interrupted" -eq 0 ]; do
    if [ -z "${slot_pid[s]}" ]; then
      i=$(next_index)
      [ -n "$i" ] || break
      [ "$i" -eq "$next_fresh" ] && next_fresh=$((next_fresh + 1))
      start_attempt "$s" "$i" "$@"
    fi
    s=$((s + 1))
  done
  # Reap the attempts that ended (bash reaps its children itself and keeps their
  # status for `wait`, so `kill -0` fails once a child has exited).
  s=0
  while [ "$s" -lt "$p" ]; do
    pid=${slot_pid[s]}
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      if wait "$pid"; then rc=0; else rc=$?; fi
      finish_attempt "$s" "$rc"
    fi
    s=$((s + 1))
  done
  sleep 0.2
done

if [ "$interrupted" -ne 0 ]; then
  s=0
  while [ "$s" -lt "$p" ]; do
    pid=${slot_pid[s]}
    if [ -n "$pid" ]; then
      if wait "$pid"; then rc=0; else rc=$?; fi
      finish_attempt "$s" "$rc"
    fi
    s=$((s + 1))
  done
  printf '%s interrupted; logs in %s\n' "$(stamp)" "$log_dir"
  exit 130
fi

succeeded=0
failed_list=''
i=0
while [ "$i" -lt "$n" ]; do
  if [ "${state[i]}" = succeeded ]; then
    succeeded=$((succeeded + 1))
  else
    failed_list="$failed_list${failed_list:+,}$i"
  fi
  i=$((i + 1))
done

if [ -z "$failed_list" ]; then
  printf '%s all %d indices succeeded; logs in %s\n' "$(stamp)" "$n" "$log_dir"
  exit 0
fi
printf '%s %d of %d indices succeeded; failed indices: %s; logs in %s\n' \
  "$(stamp)" "$succeeded" "$n" "$failed_list" "$log_dir"
exit 1
