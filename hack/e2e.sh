#!/usr/bin/env bash
# make e2e's tests, once its recipe has the cluster up, the controller built and the environment
# exported (Makefile: CLUSTER_FOR_TESTS). What shares nothing runs side by side, on 2 cores:
#
#   1. the chaos scenarios on the real nodes (CHAOS_SCOPE=real-nodes: the chart's pods, node 2
#      drained and partitioned; the e2e tests' pods run on node 1) beside the e2e test binaries
#      (all but chaos and demo_dr), E2E_LANES at a time, longest first (by their times in the
#      last run, kept in target/e2e-times.tsv), each with E2E_THREADS threads; every test makes
#      its own namespace, so binaries do not meet;
#   2. E2E_LANES + 1 at a time, longest first: the two-cluster scenarios (the second control
#      plane of e2e/src/multicluster.rs, which only the multicluster tests of step 1 also use)
#      and the chaos scenarios that touch only their own namespace (CHAOS_SCOPE=namespace, split
#      into CHAOS_LANES processes);
#   3. the scenarios that stop or flood what every test uses (the API server, etcd, PostgreSQL,
#      kwok: CHAOS_SCOPE=cluster), beside only make demo-dr's short form, which has two control
#      planes and a PostgreSQL of its own.
#
# More side by side was tried (2026-12-05: phase 2's processes in phase 1, three lanes beside the
# real-node and two-cluster rows). vmstat still showed the machine 20-40 % idle, and a warm `make
# test` took 11 min instead of 14, but each of three runs in a row failed a different test that
# passes on a quieter machine (a two-cluster takeover missed its window, a Replace run replaced
# before it ran, a ResourceQuota not yet enforced): the margin was gone, so it is not the layout.
#
# Each binary's and each chaos process's output is printed whole when it ends (not interleaved),
# with its row in `make test`'s table (hack/timed.sh). The chaos tables go to $CHAOS_REPORT, one
# per process. Exits non-zero when anything failed, after everything ran.
#
# Env: E2E_LANES (2), E2E_THREADS (4), CHAOS_LANES (3), CHAOS_REPORT (target/chaos/short.md),
#      CARGO_TARGET_DIR.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=e2e
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"

LANES=${E2E_LANES:-2}
THREADS=${E2E_THREADS:-4}
CHAOS_LANES=${CHAOS_LANES:-3}
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
REPORT=${CHAOS_REPORT:-$TARGET/chaos/short.md}
TIMES=$TARGET/e2e-times.tsv
LOGS=$TARGET/e2e-logs
TIMED=$REPO/hack/timed.sh
rm -rf "$LOGS"
mkdir -p "$LOGS" "$(dirname "$REPORT")"
rm -f "$REPORT"
failed=()

# The test binaries, built once: "name<TAB>path" for each of the e2e package's tests.
binaries() {
  cd "$REPO"
  cargo test -p e2e --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in m["target"]["kind"]:
        print(m["target"]["name"] + "\t" + m["executable"])
'
}

# run <name> <log> <command...>: one timed stage, its output kept in <log> and printed when it
# ends; its name added to `failed` (through the file <log>.failed) when it fails.
run() {
  local name=$1 log=$2
  shift 2
  # In the package's directory, as cargo test runs them.
  if ! (cd "$REPO/e2e" && "$TIMED" --suites --chaos "$name" "$@") > "$log" 2>&1; then
    touch "$log.failed"
  fi
  cat "$log"
}

# lanes <n> <job file>: runs the jobs (a line each: name<TAB>command...) n at a time, in order.
lanes() {
  local n=$1 file=$2 name cmd running=0
  while IFS=$'\t' read -r name cmd; do
    if [ "$running" -ge "$n" ]; then
      wait -n || true
      running=$((running - 1))
    fi
    # shellcheck disable=SC2086 # cmd is words written by this script
    run "$name" "$LOGS/$name.log" $cmd &
    running=$((running + 1))
  done < "$file"
  wait
}

collect() { # the names of the stages that failed, from their marks
  local f
  for f in "$LOGS"/*.failed; do
    [ -e "$f" ] || continue
    f=${f##*/}
    failed+=("${f%.log.failed}")
    rm -f "$LOGS/$f"
  done
}

log "building the e2e tests"
list=$(binaries)
[ -n "$list" ] || die "cargo built no e2e test binary"
chaos_bin=$(awk -F'\t' '$1 == "chaos" { print $2 }' <<< "$list")
[ -n "$chaos_bin" ] || die "no chaos test binary among the e2e tests"

chaos() { # chaos <name> <env...>: the chaos binary for some scenarios, its table in its own file
  local name=$1
  shift
  printf '%s\tenv CHAOS_REPORT=%s %s %s --nocapture\n' "$name" "$REPORT.$name" "$*" "$chaos_bin"
}

# 1. The real nodes' chaos scenarios, and the e2e binaries longest first by the last run's
# times (unknown ones first: the slowest guess), E2E_LANES at a time beside them.
jobs=$LOGS/e2e.jobs
chaos chaos-real-nodes CHAOS_SCOPE=real-nodes > "$jobs"
awk -F'\t' -v times="$TIMES" '
  BEGIN { while ((getline l < times) > 0) { split(l, f, "\t"); t[f[1]] = f[2] } }
  $1 != "chaos" && $1 != "demo_dr" { printf "%s\t%s\t%s\n", ($1 in t ? t[$1] : 1e9), $1, $2 }
' <<< "$list" | sort -t$'\t' -k1,1gr | awk -F'\t' -v th="$THREADS" '{ printf "%s\t%s --test-threads=%s\n", $2, $3, th }' >> "$jobs"
log "phase 1: the real nodes' chaos scenarios beside $(($(wc -l < "$jobs") - 1)) test binaries, $LANES at a time, $THREADS threads each"
lanes $((LANES + 1)) "$jobs"
collect
# Keep each binary's own time for the next run's order.
for f in "$LOGS"/*.log; do
  name=${f##*/}; name=${name%.log}
  secs=$(sed -n 's/^test result: .* finished in \([0-9.]*\)s$/\1/p' "$f" | tail -n 1)
  [ -n "$secs" ] && printf '%s\t%s\n' "$name" "$secs"
done > "$TIMES.new" || true
mv "$TIMES.new" "$TIMES"

# 2. The two-cluster scenarios and the chaos scenarios that share nothing, longest first (about
# 1 m 50 s, then a minute or two per namespace process).
jobs=$LOGS/side.jobs
{
  chaos chaos-second-cluster CHAOS_SCOPE=second-cluster
  for i in $(seq 1 "$CHAOS_LANES"); do
    chaos "chaos-namespace-$i" CHAOS_SCOPE=namespace "CHAOS_SHARD=$i/$CHAOS_LANES"
  done
} > "$jobs"
log "phase 2: the two-cluster scenarios and the chaos scenarios of a namespace ($CHAOS_LANES processes), $((LANES + 1)) at a time"
lanes "$((LANES + 1))" "$jobs"
collect

# 3. What stops or floods the API server, etcd, PostgreSQL or kwok, beside only demo-dr's short
# form (its own two control planes and PostgreSQL; about 1 m 30 s of the phase's 3 min).
demo_bin=$(awk -F'\t' '$1 == "demo_dr" { print $2 }' <<< "$list")
jobs=$LOGS/alone.jobs
{
  chaos chaos-cluster CHAOS_SCOPE=cluster
  [ -z "$demo_bin" ] || printf 'demo_dr\t%s --nocapture\n' "$demo_bin"
} > "$jobs"
log "phase 3: the chaos scenarios that stop or flood shared components, beside demo_dr"
lanes 2 "$jobs"
collect

for f in "$REPORT".*; do
  [ -e "$f" ] || continue
  { cat "$f"; echo; } >> "$REPORT"
  rm -f "$f"
done
[ ! -s "$REPORT" ] || log "chaos tables kept in ${REPORT#"$REPO"/}"
if [ "${#failed[@]}" -gt 0 ]; then
  log "failed: ${failed[*]}"
  exit 1
fi
log "every e2e test binary and chaos scenario passed"
