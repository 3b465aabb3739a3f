#!/usr/bin/env bash
# Where the time of `make test` (and of CI) goes: each stage is run through this script, which
# notes how long it took, and the table of them all is printed at the end, also after a failure.
#
# Usage: hack/timed.sh [--suites] [--chaos] <stage> <command...>
#            runs the command and exits with its status. When SINGLETON_STAGES names a file (make
#            test and .ci/run set it), appends a row "<start> <seconds> <result> <stage>" to it
#            and says how long the stage took; otherwise it only runs the command. A stage run
#            inside another (a make target inside `make test`) is named under it ("e2e/chaos").
#            --suites: also a row per test binary of cargo test's output ("Running tests/x.rs" ..
#            "test result: ... finished in 12.34s"; binaries that ran no test are left out).
#            --chaos: also a row per chaos scenario ("chaos: <name> done in 42 s", printed by the
#            suite with --nocapture). Stage "." adds no row of its own, only those.
#            With either, the command's stderr is merged into its stdout (both are read).
#        hack/timed.sh reset    empties $SINGLETON_STAGES
#        hack/timed.sh report   prints the table of $SINGLETON_STAGES, in the order stages began,
#                               then the last lines the first failed stage wrote (CI keeps only
#                               the end of its output: a compiler's error above would be cut)
# Rows of stages run side by side (parallel test groups) are all kept; the total is wall time.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=timed
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"

FILE=${SINGLETON_STAGES:-}

fmt() { # fmt <seconds, maybe fractional>: 1h02m03s, 4m05s, 6s, 0.4s
  awk -v s="$1" 'BEGIN {
    if (s < 10 && s != int(s)) { printf "%.1fs", s; exit }
    s = int(s + 0.5); h = int(s / 3600); m = int((s % 3600) / 60); r = s % 60
    if (h) printf "%dh%02dm%02ds", h, m, r; else if (m) printf "%dm%02ds", m, r; else printf "%ds", r
  }'
}

row() { # row <start> <seconds> <result> <name>
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$FILE"
}

report() {
  [ -n "$FILE" ] && [ -s "$FILE" ] || { log "no stage timings recorded${FILE:+ in $FILE}"; return 0; }
  local first last
  first=$(cut -f1 "$FILE" | sort -n | head -n 1)
  last=$(awk -F'\t' '{ e = $1 + $2; if (e > m) m = e } END { printf "%.3f", m }' "$FILE")
  echo
  echo "Stage durations (hack/timed.sh; rows in the order they began, nested rows indented; kept in ${FILE#"$REPO"/}):"
  printf '  %-52s %10s  %s\n' stage time result
  # Sorted by start time; a stage's rows below it are its parts (cargo test binaries, chaos
  # scenarios, make targets), timed on their own.
  sort -t$'\t' -k1,1n -s "$FILE" | while IFS=$'\t' read -r _ secs result name; do
    local depth=${name//[^\/]/} label=${name##*/}
    printf '  %-52s %10s  %s\n' "$(printf '%*s%s' $((${#depth} * 2)) '' "$label")" "$(fmt "$secs")" "$result"
  done
  printf '  %-52s %10s\n' "wall time, first stage's start to last one's end" "$(fmt "$(awk -v a="$first" -v b="$last" 'BEGIN { print b - a }')")"
  if [ -s "$FILE.failed" ]; then
    echo
    echo "The first stage to fail, and the last lines of its stderr (its whole output for test binaries):"
    sed 's/^/  | /' "$FILE.failed"
  fi
}

# parse <stage> <suites 0|1> <chaos 0|1>: passes stdin through unchanged, writing the suite and
# scenario rows under the stage.
parse() {
  local stage=$1 suites=$2 chaos=$3 line suite="" t0=0 now m
  local -a f
  close() { # close <seconds> <result>: the open binary's row
    [ -n "$suite" ] || return 0
    row "$t0" "$1" "$2" "$stage${stage:+/}$suite"
    suite=""
  }
  while IFS= read -r line || [ -n "$line" ]; do
    printf '%s\n' "$line"
    now=$EPOCHREALTIME
    if [ "$suites" = 1 ]; then
      if [[ $line =~ ^[[:space:]]+Running\ (unittests\ )?([^ ]+)\ \(.*/deps/([^/]+)-[0-9a-f]+\)$ ]]; then
        [ -z "$suite" ] || close "$(awk -v a="$t0" -v b="$now" 'BEGIN { print b - a }')" "no result"
        if [ -n "${BASH_REMATCH[1]}" ]; then suite="${BASH_REMATCH[3]} (unit tests)"
        else m=${BASH_REMATCH[2]##*/}; suite=${m%.rs}; fi
        t0=$now
      elif [[ $line =~ ^[[:space:]]+Doc-tests\ (.+)$ ]]; then
        [ -z "$suite" ] || close "$(awk -v a="$t0" -v b="$now" 'BEGIN { print b - a }')" "no result"
        suite="${BASH_REMATCH[1]} (doc tests)"; t0=$now
      elif [[ $line =~ ^test\ result:\ ([A-Za-z]+)\.\ ([0-9]+)\ passed\;\ ([0-9]+)\ failed\;.*finished\ in\ ([0-9.]+)s ]]; then
        if [ $((BASH_REMATCH[2] + BASH_REMATCH[3])) -gt 0 ]; then
          close "${BASH_REMATCH[4]}" "${BASH_REMATCH[1],,} (${BASH_REMATCH[2]} passed, ${BASH_REMATCH[3]} failed)"
        fi
        suite=""
      fi
    fi
    if [ "$chaos" = 1 ] && [[ $line =~ ^chaos:\ ([a-z0-9-]+)\ done\ in\ ([0-9.]+)\ s(:.*)?$ ]]; then
      f=("${BASH_REMATCH[@]}")
      row "$(awk -v a="$now" -v b="${f[2]}" 'BEGIN { printf "%.6f", a - b }')" "${f[2]}" \
        "$([ -z "${f[3]}" ] && echo ok || echo "violations")" "$stage${stage:+/}${f[1]}"
    fi
  done
  [ -z "$suite" ] || close "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')" "no result"
}

case ${1:-} in
  reset) [ -n "$FILE" ] || die "SINGLETON_STAGES is not set"; mkdir -p "$(dirname "$FILE")"; : > "$FILE"; rm -f "$FILE.failed"; exit 0 ;;
  report) report; exit 0 ;;
esac

suites=0 chaos=0
while :; do
  case ${1:-} in
    --suites) suites=1; shift ;;
    --chaos) chaos=1; shift ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || { sed -n '2,/^set -euo/{/^#/p}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
stage=$1; shift
[ -n "$FILE" ] || exec "$@"

parent=${SINGLETON_STAGE_PARENT:-}
if [ "$stage" = . ]; then name=$parent; else name=$parent${parent:+/}$stage; fi
export SINGLETON_STAGE_PARENT=$name
mkdir -p "$(dirname "$FILE")"
t0=$EPOCHREALTIME rc=0
# What the command writes to stderr (its whole output with --suites/--chaos) is also kept, so
# that the report can repeat the end of the first failure's.
out=$(mktemp)
# Interrupted (Ctrl-C, CI's timeout): the row says so, and the signal goes on.
trap 'row "$t0" "$(awk -v a="$t0" -v b="$EPOCHREALTIME" "BEGIN { print b - a }")" interrupted "$name"; trap - INT TERM; kill -INT $$' INT TERM
if [ "$suites$chaos" = 00 ]; then
  # stdout goes straight on (fd 3), stderr through tee; pipefail: the command's status.
  { "$@" 2>&1 1>&3 3>&- | tee "$out" >&2; } 3>&1 || rc=$?
else
  "$@" 2>&1 | tee "$out" | parse "$name" "$suites" "$chaos" || rc=$?   # pipefail: the command's status
fi
trap - INT TERM
secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }')
if [ "$stage" != . ]; then
  if [ "$rc" = 0 ]; then result=ok; else result="failed ($rc)"; fi
  # The innermost stage fails first; stages around it find the file written.
  if [ "$rc" != 0 ] && [ ! -s "$FILE.failed" ]; then
    if [ "$suites$chaos" = 00 ]; then
      { echo "$name: $result"; tail -n 30 "$out"; } > "$FILE.failed"
    else
      # A test binary's output ends with the failed tests' logs: its verdicts are the lines
      # that say what failed (a test's anyhow error with the lines under it, such as the chaos
      # suite's violations; a panic; the failed tests' names).
      { echo "$name: $result"
        awk '/^Error: / { n = 12 } n > 0 { print; n-- ; next }
             /^thread .* panicked|^test .* FAILED|^error(\[E[0-9]+\])?: / { print }' "$out" |
          cut -c1-400 | tail -n 30
      } > "$FILE.failed"
    fi
  fi
  row "$t0" "$secs" "$result" "$name"
  log "$name: $(fmt "$secs") ($result)"
fi
rm -f "$out"
exit "$rc"
