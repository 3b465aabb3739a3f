#!/usr/bin/env bash
# `make demo-dr`: disaster recovery across two clusters (docs/multi-cluster.md), with nothing but
# this repo. Two local control planes, `west` (the primary) and `east` (the standby), share one
# PostgreSQL as their backstop; each runs a controller (a local process, `--cluster-id west|east`)
# and the same SingletonJob (same spec.backstop.jobKey; east with standbyDelaySeconds). Then:
#   1. both run: west runs every period, east records each one ClaimedElsewhere (west);
#   2. west's API server is stopped: east takes over within the bound and runs the periods;
#   3. west's API server is back: west runs the periods again, as primary.
# It ends with a verdict computed from the claims table and the Jobs of both clusters: every
# period of the demo claimed once, confirmed, by the cluster expected in its phase, and run by
# exactly one Job, in that cluster. Exit status 0 only on success.
#
# Everything it starts is its own: the clusters in .cache/cluster-west and .cache/cluster-east,
# PostgreSQL in .cache/postgres-demo-dr, on ports of their own (below), so it runs beside
# `make up`. It stops them all at the end (DEMO_DR_KEEP=1 leaves them running for exploring;
# then `make demo-dr-stop`). A second run starts from scratch.
#
# Usage: hack/demo-dr.sh [run|stop]
# Env: DEMO_DR_PERIOD (5): seconds between periods (a divisor of 60),
#      DEMO_DR_PHASE_SECONDS (25): length of each phase,
#      DEMO_DR_STANDBY_DELAY (2): east's standbyDelaySeconds,
#      DEMO_DR_TAKEOVER_AFTER (6): takeoverAfterSeconds (both),
#      DEMO_DR_RESUME (1): phase 3, west back (0: end with west down),
#      DEMO_DR_RESUME_GRACE (15): seconds west may take to claim again once its API server is ready,
#      DEMO_DR_KEEP (0): 1 leaves everything running at the end,
#      DEMO_DR_WEST_PORTS ("22411 22412 26411 26412 26413"), DEMO_DR_EAST_PORTS ("22421 22422
#      26421 26422 26423"): etcd, etcd peer, kube-apiserver, kube-controller-manager and
#      kube-scheduler ports; DEMO_DR_PG_PORT (25411): PostgreSQL's.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=demo-dr
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"
cd "$REPO"

PERIOD=${DEMO_DR_PERIOD:-5}
PHASE=${DEMO_DR_PHASE_SECONDS:-25}
DELAY=${DEMO_DR_STANDBY_DELAY:-2}
TAKEOVER=${DEMO_DR_TAKEOVER_AFTER:-6}
RESUME=${DEMO_DR_RESUME:-1}
RESUME_GRACE=${DEMO_DR_RESUME_GRACE:-15}
KEEP=${DEMO_DR_KEEP:-0}
WEST_PORTS=${DEMO_DR_WEST_PORTS:-22411 22412 26411 26412 26413}
EAST_PORTS=${DEMO_DR_EAST_PORTS:-22421 22422 26421 26422 26423}
# The demo's own PostgreSQL (hack/postgres.sh), whatever the caller's environment says.
export SINGLETON_PG_NAME=demo-dr SINGLETON_PG_PORT=${DEMO_DR_PG_PORT:-25411}
unset SINGLETON_APISERVER_EXTRA_ARGS SINGLETON_KCM_EXTRA_ARGS

NS=singleton-demo
SJ=invoices
KEY=demo/invoices
PREFIX=demodr_
DEMO_DIR=$REPO/.cache/demo-dr
# SINGLETON_CONTROLLER_BIN (set by make e2e): that controller, and kubectl-singleton beside it,
# unbuilt; otherwise both are built here.
if [ -n "${SINGLETON_CONTROLLER_BIN:-}" ]; then BIN=$(dirname "$SINGLETON_CONTROLLER_BIN"); else BIN=; fi

for n in "$PERIOD" "$PHASE" "$DELAY" "$TAKEOVER" "$RESUME_GRACE"; do
  [[ $n =~ ^[0-9]+$ ]] || die "the DEMO_DR_* durations are whole seconds (got '$n')"
done
if [ "$PERIOD" = 0 ] || [ $((60 % PERIOD)) != 0 ]; then die "DEMO_DR_PERIOD must divide 60 (got $PERIOD)"; fi
[ "$TAKEOVER" -gt 0 ] || die "DEMO_DR_TAKEOVER_AFTER must be at least 1"

# cluster <west|east> ARGS: hack/cluster.sh for that cluster, on its ports.
cluster() {
  local name=$1 ports; shift
  if [ "$name" = west ]; then ports=$WEST_PORTS; else ports=$EAST_PORTS; fi
  local p; read -ra p <<< "$ports"
  [ ${#p[@]} = 5 ] || die "DEMO_DR_${name^^}_PORTS needs five ports (got '$ports')"
  SINGLETON_CLUSTER_NAME=$name SINGLETON_ETCD_PORT=${p[0]} SINGLETON_ETCD_PEER_PORT=${p[1]} \
    SINGLETON_APISERVER_PORT=${p[2]} SINGLETON_KCM_PORT=${p[3]} SINGLETON_SCHEDULER_PORT=${p[4]} \
    hack/cluster.sh "$@"
}
kc() { local name=$1; shift; need_tool kubectl || return 1; command kubectl --kubeconfig "$REPO/.cache/cluster-$name/kubeconfig" "$@"; }
# The controller's pidfile where `hack/cluster.sh down` looks for a demo's controller, so a
# cluster stopped by hand never leaves it running against a dead API server.
pidfile() { echo "$REPO/.cache/demo-$1/controller.pid"; }
logfile() { echo "$REPO/.cache/demo-$1/controller.log"; }

stop_everything() {
  local c
  for c in west east; do cluster "$c" down >/dev/null 2>&1 || die "could not stop cluster $c"; done
  hack/postgres.sh down >/dev/null 2>&1 || die "could not stop the demo's PostgreSQL"
}

if [ "${1:-run}" = stop ]; then
  stop_everything
  log "the demo's clusters, controllers and PostgreSQL are stopped"
  exit 0
fi
[ "${1:-run}" = run ] || die "usage: $0 [run|stop]"

# --- set-up ----------------------------------------------------------------------------------------
db_url() { hack/postgres.sh url; }
# sql [psql options] <<< QUERY: from stdin, where psql interpolates :'key' and other -v variables.
sql() { need_tool psql || return 1; psql "$(db_url)" -XAtq -v ON_ERROR_STOP=1 -v key="$KEY" "$@"; }
now() { date +%s; }
hms() { date -u -d "@$1" +%T; }
phase() { echo; echo "=== $(date -u +%T) UTC  $*"; }

started=$(now)
log "stopping what an earlier demo left running (a fresh start every time)"
stop_everything
if [ "$KEEP" != 1 ]; then trap 'log "stopping the demo'"'"'s clusters, controllers and PostgreSQL"; stop_everything' EXIT; fi
trap 'exit 130' INT TERM

# Obtained once here (what hack/cluster.sh up needs, and psql), so the two clusters starting side
# by side never build or install them both: need_tool tells them (SINGLETON_TOOLS_HAVE).
need_tool openssl curl ps faketime etcd kube-apiserver kube-controller-manager kube-scheduler \
  kubectl kwok psql
mkdir -p "$DEMO_DIR"
log "starting PostgreSQL (127.0.0.1:$SINGLETON_PG_PORT) and two control planes, west and east"
hack/postgres.sh up
pids=()
for c in west east; do
  cluster "$c" up >"$DEMO_DIR/up-$c.log" 2>&1 & pids+=($!)
done
# Both waited for before judging either, so a failed one never leaves the other starting.
failed=
for i in 0 1; do
  c=$([ "$i" = 0 ] && echo west || echo east)
  wait "${pids[$i]}" || { tail -n 30 "$DEMO_DIR/up-$c.log" >&2; failed+=" $c"; }
done
[ -z "$failed" ] || die "cluster(s)$failed did not start (ports: DEMO_DR_WEST_PORTS, DEMO_DR_EAST_PORTS)"
log "clusters up after $(($(now) - started))s"
if [ -z "$BIN" ]; then
  need_tool singleton-controller kubectl-singleton
  ctl=$(tool_path singleton-controller)
  BIN=$(dirname "$ctl")
fi

sj_yaml() { # sj_yaml <extra backstop lines>
  cat <<EOF
apiVersion: singleton.dev/v1alpha1
kind: SingletonJob
metadata:
  name: $SJ
spec:
  schedule: "*/$PERIOD * * * * *"
  # Allow, not Forbid: when west's API server returns, its fake kubelet (kwok, whose watches
  # back off during the outage like any client's) may take a minute to finish the Job west
  # started meanwhile; under Forbid west would rightly skip periods until then (east runs them),
  # which would hide what phase 3 shows: how soon west's controller claims again.
  concurrencyPolicy: Allow
  successfulJobsHistoryLimit: 100
  lock:
    purpose: Correctness
  backstop:
    postgres:
      secretRef: {name: billing-db}
      tablePrefix: $PREFIX
    jobKey: $KEY
    takeoverAfterSeconds: $TAKEOVER
$1
  jobTemplate:
    spec:
      backoffLimit: 0
      template:
        spec:
          restartPolicy: Never
          containers:
          - name: invoices
            image: busybox
            command: ["sh", "-c", "echo period=\$SINGLETON_PERIOD token=\$SINGLETON_FENCING_TOKEN"]
EOF
}

for c in west east; do
  kc "$c" apply --server-side -f crds/ >/dev/null
  kc "$c" wait --for=condition=Established --timeout=60s -f crds/ >/dev/null
  kc "$c" create namespace "$NS" >/dev/null
  kc "$c" create secret generic billing-db -n "$NS" --from-literal=url="$(db_url)" \
    --dry-run=client -o yaml | kc "$c" label --local -f - singleton.dev/backstop=true -o yaml \
    | kc "$c" apply -f - >/dev/null
  if [ "$c" = west ]; then extra=''; else extra="    standbyDelaySeconds: $DELAY"; fi
  sj_yaml "$extra" | kc "$c" apply -n "$NS" -f - >/dev/null
done
# One replica per cluster (no election: the Lease would be lost while west's API server is
# down, and a controller that loses it exits); probes and metrics on free loopback ports.
for c in west east; do
  mkdir -p "$REPO/.cache/demo-$c"; : > "$(logfile "$c")"
  (
    export KUBECONFIG=$REPO/.cache/cluster-$c/kubeconfig NO_COLOR=1 SINGLETON_LEADER_ELECT=false \
      SINGLETON_HEALTH_ADDR=127.0.0.1:0 SINGLETON_METRICS_ADDR=127.0.0.1:0 SINGLETON_METRICS_AUTH=none
    start_daemon "$(pidfile "$c")" "$(logfile "$c")" "$BIN/singleton-controller" \
      --namespace "$NS" --instance "demo-dr-$c" --cluster-id "$c"
  )
done
log "controllers running (logs: .cache/demo-west/controller.log, .cache/demo-east/controller.log)"

# --- what is shown ---------------------------------------------------------------------------------
# The claim rows of periods since $1: who has each, its token, when it was confirmed.
show_claims() {
  echo "--- $(date -u +%T)  claims table ${PREFIX}claims, job $KEY (the shared database)"
  psql "$(db_url)" -Xq -P footer=off -v key="$KEY" -v since="$1" <<SQL
SELECT to_char(period AT TIME ZONE 'UTC', 'HH24:MI:SS') AS "period (UTC)", cluster, token,
       CASE WHEN confirmed_at IS NULL THEN 'not yet'
            ELSE '+' || to_char(extract(epoch FROM confirmed_at - period), 'FM990.0') || ' s' END
         AS "confirmed (after the period)"
  FROM ${PREFIX}claims WHERE job = :'key' AND period >= to_timestamp(:since)
  ORDER BY period DESC LIMIT 4
SQL
}
controllers_alive() {
  local c
  for c in west east; do
    pid_alive "$(pidfile "$c")" || { log "the $c controller exited; its last lines:"; tail -n 20 "$(logfile "$c")" >&2; return 1; }
  done
}
# watch_for <seconds> <since>: the claims, a period at a time.
watch_for() {
  local end=$(($(now) + $1))
  while [ "$(now)" -lt "$end" ]; do
    sleep "$PERIOD"
    controllers_alive
    show_claims "$2"
  done
}
# first_claim <cluster> <after epoch> <timeout>: epoch of the first period after the instant that
# the cluster confirmed, waiting up to the timeout; fails with the rows seen.
first_claim() {
  local who=$1 after=$2 end=$(($(now) + $3)) p
  while :; do
    p=$(sql -v who="$who" -v after="$after" <<< "SELECT extract(epoch FROM min(period))::bigint FROM ${PREFIX}claims
          WHERE job = :'key' AND cluster = :'who' AND confirmed_at IS NOT NULL AND period > to_timestamp(:after)") \
      || { log "cannot read the claims table"; return 1; }
    [ -n "$p" ] && { echo "$p"; return 0; }
    [ "$(now)" -lt "$end" ] || { log "no period after $(hms "$after") confirmed by $who within $3 s"; show_claims "$after" >&2; return 1; }
    controllers_alive
    sleep 0.5
  done
}
history_in() { # history_in <cluster>: `kubectl singleton history` there, its latest periods
  local out
  out=$(KUBECONFIG=$REPO/.cache/cluster-$1/kubeconfig "$BIN/kubectl-singleton" history "$SJ" -n "$NS")
  head -n 6 <<< "$out"   # the header and the 5 newest periods
}
lag() { # lag <period epoch>: seconds from the period's instant to its claim's confirmation
  sql -v p="$1" <<< "SELECT to_char(extract(epoch FROM confirmed_at - period), 'FM990.0')
    FROM ${PREFIX}claims WHERE job = :'key' AND period = to_timestamp(:p)"
}
west_jobs() { # "<period label> west" per Job west has
  kc west get jobs -n "$NS" -l singleton.dev/period \
    -o go-template='{{range .items}}{{index .metadata.labels "singleton.dev/period"}} west{{"\n"}}{{end}}'
}

# --- the phases ------------------------------------------------------------------------------------
# The controllers create the backstop's tables on their first claim.
claims_table() { [ "$(sql <<< "SELECT to_regclass('${PREFIX}claims') IS NOT NULL")" = t ]; }
WAIT_PIDFILE=$(pidfile west) wait_for "the claims table" 60 "$(logfile west)" claims_table
t0=$(now)
phase "1. both clusters up: west is primary, east a standby (standbyDelaySeconds $DELAY, takeoverAfterSeconds $TAKEOVER)"
first=$(first_claim west "$((t0 - 1))" 60)
echo "west ran its first period $(hms "$first"); $(($(now) - started))s since the start"
watch_for "$PHASE" "$first"
echo; echo "--- kubectl singleton history $SJ -n $NS   (in east: each period ClaimedElsewhere, by west)"
history_in east

# West's Jobs now, while its API server answers: it can create none while stopped.
jobs_seen=$(west_jobs)
stop_begin=$(now)
phase "2. west's API server stopped (hack/cluster.sh stop kube-apiserver, SINGLETON_CLUSTER_NAME=west)"
cluster west stop kube-apiserver
stop_end=$(now)
took=$(first_claim east "$stop_end" $((DELAY + TAKEOVER + 3 * PERIOD + 10)))
echo "east ran period $(hms "$took"): confirmed $(lag "$took") s after its instant (its standbyDelaySeconds" \
  "$DELAY, or takeoverAfterSeconds $TAKEOVER after a claim west could not confirm)"
watch_for "$PHASE" "$stop_begin"
echo; echo "--- kubectl singleton history $SJ -n $NS   (in east: its own runs since west stopped)"
history_in east

start_begin=$(now) start_end=
if [ "$RESUME" = 1 ]; then
  phase "3. west's API server back (hack/cluster.sh start kube-apiserver): west resumes as primary"
  cluster west start kube-apiserver
  start_end=$(now)
  if back=$(first_claim west "$start_end" $((RESUME_GRACE + PERIOD))); then
    echo "west ran period $(hms "$back"), its first since its API server was ready at $(hms "$start_end") ($((back - start_end))s)"
  fi
  watch_for "$PHASE" "$start_begin"
  echo; echo "--- kubectl singleton history $SJ -n $NS   (in west: its runs again, and east's while it was away)"
  history_in west
  jobs_seen+=$'\n'$(west_jobs)
fi

# --- the verdict -----------------------------------------------------------------------------------
# Periods whose claims are settled by now: a standby's period is claimed after the standby delay
# and, when west claimed it first, after takeoverAfterSeconds.
last=$(( ($(now) - DELAY - TAKEOVER - 3) / PERIOD * PERIOD ))
jobs_seen+=$'\n'$(kc east get jobs -n "$NS" -l singleton.dev/period \
  -o go-template='{{range .items}}{{index .metadata.labels "singleton.dev/period"}} east{{"\n"}}{{end}}')
# expected <epoch>: the cluster that must have the period, or "either" around a change.
expected() {
  local p=$1
  if [ "$p" -le $((stop_begin - 2)) ]; then echo west
  elif [ "$p" -le "$stop_end" ]; then echo either
  elif [ -z "$start_end" ] || [ "$p" -lt "$start_begin" ]; then echo east
  elif [ "$p" -le $((start_end + RESUME_GRACE)) ]; then echo either
  else echo west; fi
}
phase "verdict: periods $(hms "$first") to $(hms "$last"), from the claims table and both clusters' Jobs"
declare -A row ran
while IFS='|' read -r p who lag; do row[$p]="$who $lag"; done < <(sql -F '|' -v first="$first" -v last="$last" <<< "
  SELECT extract(epoch FROM period)::bigint, cluster,
         coalesce(ceil(extract(epoch FROM confirmed_at - period))::int, -1) FROM ${PREFIX}claims
   WHERE job = :'key' AND period BETWEEN to_timestamp(:first) AND to_timestamp(:last)")
while read -r label who; do
  [ -n "$label" ] || continue
  p=$(date -u -d "${label:0:4}-${label:4:2}-${label:6:2} ${label:9:2}:${label:11:2}:${label:13:2}" +%s)
  ran[$p]="${ran[$p]:-}${ran[$p]:+ }$who"
done < <(printf '%s\n' "$jobs_seen" | sort -u)
failures=0 count=0
# Every period is confirmed within the standby's turn plus the takeover bound, and a few seconds
# of slack for a busy machine.
bound=$((DELAY + TAKEOVER + 3))
declare -A by=([west]=0 [east]=0)
for ((p = first; p <= last; p += PERIOD)); do
  count=$((count + 1))
  want=$(expected "$p")
  read -r who lag <<< "${row[$p]:-none -1}"
  jobs=${ran[$p]:-none}
  if [ "$who" = none ]; then problem="no claim"
  elif [ "$lag" = -1 ]; then problem="claimed by $who, never confirmed"
  elif [ "$want" != either ] && [ "$who" != "$want" ]; then problem="claimed by $who, expected $want"
  elif [ "$jobs" != "$who" ]; then problem="claimed by $who, but Jobs ran in: $jobs"
  elif [ "$lag" -gt "$bound" ]; then problem="claimed by $who, confirmed ${lag}s after its instant (bound ${bound}s)"
  else problem=; fi
  if [ -n "$problem" ]; then
    failures=$((failures + 1))
    echo "  $(hms "$p")  FAIL  $problem"
  else
    by[$who]=$((by[$who] + 1))
    if [ "$want" = either ]; then note=" (either was fine: a phase changed)"; else note=; fi
    echo "  $(hms "$p")  ok    $who, confirmed within ${lag}s, one Job there$note"
  fi
done
echo
if [ "$count" -gt 0 ] && [ "$failures" = 0 ]; then
  echo "VERDICT: PASS  $count periods, each claimed once and run once, by the cluster expected" \
    "(west ${by[west]}, east ${by[east]}); $(($(now) - started))s in all"
else
  echo "VERDICT: FAIL  $failures of $count periods wrong (logs: .cache/demo-west/controller.log," \
    ".cache/demo-east/controller.log)"
  exit 1
fi
if [ "$KEEP" = 1 ]; then
  cat <<EOF

Everything keeps running (DEMO_DR_KEEP=1). To explore:
  export KUBECONFIG=$REPO/.cache/cluster-east/kubeconfig   # or cluster-west
  $(tool_path kubectl) get sj,jobs -n $NS
  $BIN/kubectl-singleton history $SJ -n $NS
  psql '$(db_url)' -c 'TABLE ${PREFIX}claims'
To stop it all: make demo-dr-stop
EOF
fi
