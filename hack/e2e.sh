#!/usr/bin/env bash
# make e2e's tests, once its recipe has the cluster up, the controller built and the environment
# exported (Makefile: CLUSTER_FOR_TESTS). Everything runs side by side, in three kinds of lane,
# because on 2 cores the suite is mostly waiting (vmstat in a warm `make test`, 2026-12-05: 50-75 %
# idle with three processes at a time) and its length was set by what had to run alone:
#
#   - the chaos scenarios on the real nodes (CHAOS_SCOPE=real-nodes: the chart's pods, node 2
#     drained and partitioned; the e2e tests' pods run on node 1), one after the other;
#   - the two-cluster tests, then the two-cluster chaos scenarios (CHAOS_SCOPE=second-cluster):
#     both use the second control plane of e2e/src/multicluster.rs;
#   - in a queue that E2E_LANES lanes take from (and the two lanes above once their own jobs
#     are done), and E2E_TAIL_LANES lanes from its other end (the shortest first), longest first (by their times in the last run, kept in target/e2e-times.tsv,
#     or else e2e/lane-times.tsv; unknown ones first): the other e2e test binaries, each with
#     E2E_THREADS threads; the chaos scenarios that touch only their own namespace
#     (CHAOS_SCOPE=namespace, split into CHAOS_LANES processes); demo_dr (two control planes and a
#     PostgreSQL of its own); and the scenarios that stop or flood the API server, etcd,
#     PostgreSQL or kwok (CHAOS_SCOPE=cluster), on a control plane and a PostgreSQL of their own
#     (hack/own-cluster.sh) so that they stop nothing another test uses; and the hostile-tenant
#     suite (e2e/tests/hostile.rs) on another (SINGLETON_OWN_INSTANCE=own2), so that its flood
#     slows no other test and its quiet baseline is quiet; and the version-skew tests
#     (e2e/tests/version_skew.rs) on a third (own3), since they change the SingletonJob CRD;
#     and the upgrade suite (e2e/tests/upgrade.rs) on a fourth (own4), which installs the
#     previous release's CRD (the recipe exports SINGLETON_PREVIOUS_RELEASE and
#     SINGLETON_OLDER_SCHEMA: hack/previous-release.sh builds them, once per machine).
#
# Every test makes its own namespace, so tests on one cluster do not meet.
# Until 2026-12-05 the cluster-wide rows stopped the shared cluster, so they ran alone, last, and
# the namespace rows in a phase of their own: 12-13 min of e2e against 7 now.
#
# Each binary's and each chaos process's output is printed whole when it ends (not interleaved),
# with its row in `make test`'s table (hack/timed.sh). The chaos tables go to $CHAOS_REPORT, one
# per process. Exits non-zero when anything failed, after everything ran.
#
# The tail lane (2026-12-07) adds a fifth process at a time that is always one of the short
# binaries (mostly waiting on instants), so the suite's throughput grows without a fifth heavy
# process (the chaos rows, the own control planes, the real nodes) beside the four.
#
# Env: E2E_LANES (2), E2E_TAIL_LANES (1), E2E_THREADS (4), CHAOS_LANES (3), CHAOS_REPORT
#      (target/chaos/short.md), CARGO_TARGET_DIR.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=e2e
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"

LANES=${E2E_LANES:-2}
TAIL_LANES=${E2E_TAIL_LANES:-1}
THREADS=${E2E_THREADS:-4}
CHAOS_LANES=${CHAOS_LANES:-3}
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
REPORT=${CHAOS_REPORT:-$TARGET/chaos/short.md}
TIMES=$TARGET/e2e-times.tsv
# A fresh clone (CI) has no last run: the times committed in e2e/lane-times.tsv (a warm `make
# test` on this machine kind, copied from target/e2e-times.tsv) order it instead of the names,
# which left the longest binaries to the end.
ORDER=$TIMES
[ -s "$ORDER" ] || ORDER=$REPO/e2e/lane-times.tsv
LOGS=$TARGET/e2e-logs
TIMED=$REPO/hack/timed.sh
rm -rf "$LOGS"
mkdir -p "$LOGS" "$(dirname "$REPORT")"
rm -f "$REPORT"
failed=()
# A test that fails returns anyhow's error: its message, not a backtrace of the test harness after
# it, is what the last lines of a failed run (all CI shows of it) must hold.
export RUST_LIB_BACKTRACE=0

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

# take <queue> [tail]: prints the queue's first job (name<TAB>command...), or its last with
# `tail`, and removes it, under a lock (several lanes take from one queue); fails when the queue is
# empty.
take() {
  if [ "${2:-}" = tail ]; then
    flock "$1.lock" bash -c 'line=$(tail -n 1 "$1") && [ -n "$line" ] && sed -i "\$d" "$1" && printf "%s\n" "$line"' \
      take "$1"
  else
    flock "$1.lock" bash -c 'IFS= read -r line < "$1" && [ -n "$line" ] && sed -i 1d "$1" && printf "%s\n" "$line"' \
      take "$1"
  fi
}

# lane [job file] [tail]: runs its own jobs (a line each: name<TAB>command...) one after the
# other, then takes jobs from the shared queue ($jobs) until it is empty: from its head (the
# longest), or from its tail (the shortest) with `tail`. So a lane whose own jobs end early (the
# two-cluster tests' at about 5 min, the real nodes' at about 7) takes from the others' work
# instead of idling, and no more processes run at once than at the start.
lane() {
  local name cmd line
  if [ -n "${1:-}" ]; then
    while IFS=$'\t' read -r name cmd; do
      # shellcheck disable=SC2086 # cmd is words written by this script
      run "$name" "$LOGS/$name.log" $cmd
    done < "$1"
  fi
  while line=$(take "$jobs" "${2:-}"); do
    IFS=$'\t' read -r name cmd <<< "$line"
    # shellcheck disable=SC2086 # cmd is words written by this script
    run "$name" "$LOGS/$name.log" $cmd
  done
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

# The lanes: the real nodes' chaos scenarios; the two-cluster tests, then their chaos scenarios;
# and the rest, longest first by the last run's times (unknown ones first: the slowest guess), in
# a queue LANES lanes take from, and the first two lanes too once their own jobs are done.
chaos chaos-real-nodes CHAOS_SCOPE=real-nodes > "$LOGS/real.jobs"
{
  awk -F'\t' -v th="$THREADS" '$1 == "multicluster" { printf "%s\t%s --test-threads=%s\n", $1, $2, th }' <<< "$list"
  chaos chaos-second-cluster CHAOS_SCOPE=second-cluster
} > "$LOGS/second.jobs"
jobs=$LOGS/e2e.jobs
# The two noisy-neighbour suites (tests/noisy.rs, tests/hostile.rs) compare a namespace's skew
# beside a flood with its skew alone: one at a time, so that neither measures the other's flood
# (warm `make test`, 2026-12-07: noisy's healthy namespace at 3x its control's p50 with hostile's
# flood, the upgrade suite and prepared's 16 controllers beside it).
FLOOD_LOCK=$LOGS/flood.lock
{
  awk -F'\t' -v th="$THREADS" -v flood="$FLOOD_LOCK" '
    $1 != "chaos" && $1 != "demo_dr" && $1 != "multicluster" && $1 != "hostile" && $1 != "version_skew" && $1 != "upgrade" && $1 != "prepared" && $1 != "preparing" && $1 != "noisy" {
      printf "%s\t%s --test-threads=%s\n", $1, $2, th
    }
    $1 == "noisy" { printf "%s\tflock %s %s --test-threads=%s\n", $1, flood, $2, th }
    $1 == "demo_dr" { printf "%s\t%s --nocapture\n", $1, $2 }
    # Their tests wait for instants (minute boundaries, every 20 s), not for the CPU: all at once.
    $1 == "prepared" || $1 == "preparing" { printf "%s\t%s --test-threads=8\n", $1, $2 }' <<< "$list"
  for i in $(seq 1 "$CHAOS_LANES"); do
    chaos "chaos-namespace-$i" CHAOS_SCOPE=namespace "CHAOS_SHARD=$i/$CHAOS_LANES"
  done
  printf 'chaos-cluster\t%s/hack/own-cluster.sh run env CHAOS_REPORT=%s CHAOS_SCOPE=cluster %s --nocapture\n' \
    "$REPO" "$REPORT.chaos-cluster" "$chaos_bin"
  awk -F'\t' -v repo="$REPO" -v th="$THREADS" -v flood="$FLOOD_LOCK" '
    $1 == "hostile" { own = "own2"; args = "--nocapture" }
    $1 == "version_skew" { own = "own3"; args = "--test-threads=" th }
    $1 == "upgrade" { own = "own4"; args = "--nocapture" }
    own != "" {
      lock = ($1 == "hostile") ? "flock " flood " " : ""
      printf "%s\t%senv SINGLETON_OWN_INSTANCE=%s %s/hack/own-cluster.sh run %s %s\n", $1, lock, own, repo, $2, args
      own = ""
    }' <<< "$list"
} | awk -F'\t' -v times="$ORDER" '
  BEGIN { while ((getline l < times) > 0) { split(l, f, "\t"); t[f[1]] = f[2] } }
  { printf "%s\t%s\n", ($1 in t ? t[$1] : 1e9), $0 }
' | sort -t$'\t' -k1,1gr | cut -f2- > "$jobs"
log "side by side: the real nodes' chaos scenarios; the two-cluster tests, then their chaos scenarios; and $(wc -l < "$jobs") test binaries and chaos processes, $LANES lanes (and the first two once done) taking from the queue's head and $TAIL_LANES from its tail, $THREADS threads each"
lane "$LOGS/real.jobs" &
lane "$LOGS/second.jobs" &
for _ in $(seq 1 "$LANES"); do lane & done
for _ in $(seq 1 "$TAIL_LANES"); do lane "" tail & done
wait
collect
# Keep each binary's and chaos process's own time for the next run's order.
for f in "$LOGS"/*.log; do
  name=${f##*/}; name=${name%.log}
  secs=$(sed -n 's/^test result: .* finished in \([0-9.]*\)s$/\1/p' "$f" | tail -n 1)
  [ -n "$secs" ] && printf '%s\t%s\n' "$name" "$secs"
done > "$TIMES.new" || true
mv "$TIMES.new" "$TIMES"

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
