#!/usr/bin/env bash
# `make demo`: the local cluster, the CRD, the controller running in the background, and the example
# SingletonJob in a namespace of its own; then about a minute of `kubectl get singletonjobs,jobs`
# so one sees runs appear, and a check that a run succeeded.
#
# The controller watches only the demo's namespace (`singleton-demo`): `make test` run beside it
# (same cluster) never sees it act on a test's namespace. It keeps running afterwards; `make down`
# stops it with the cluster, `make demo-stop` alone.
# Env: DEMO_MANIFEST (examples/hello.yaml), DEMO_SECONDS (60), DEMO_INTERVAL (10),
#      DEMO_NAMESPACE (singleton-demo)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=demo
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"
cd "$REPO"

MANIFEST=${DEMO_MANIFEST:-examples/hello.yaml}
NS=${DEMO_NAMESPACE:-singleton-demo}
DEMO_DIR=$REPO/.cache/demo
PIDFILE=$DEMO_DIR/controller.pid
LOGFILE=$DEMO_DIR/controller.log
BIN=${CARGO_TARGET_DIR:-$REPO/target}/debug/singleton-controller

if [ "${1:-}" = stop ]; then
  stop_pidfile "$PIDFILE" 15
  log "the demo's controller is stopped (the cluster keeps running: make down stops it)"
  exit 0
fi

hack/cluster.sh up
# The same environment a newcomer gets from `eval "$(make -s env)"`: kubectl, helm and
# kubectl-singleton on PATH.
eval "$(hack/cluster.sh env)"
export KUBECONFIG DATABASE_URL PATH

log "installing the CRD"
kubectl apply --server-side -f crds/ >/dev/null
kubectl wait --for=condition=Established --timeout=60s -f crds/ >/dev/null

log "building the controller"
cargo build -q -p singleton-controller --bins

# A second `make demo` replaces the controller rather than starting a rival one.
stop_pidfile "$PIDFILE" 15
mkdir -p "$DEMO_DIR"; : > "$LOGFILE"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
# NO_COLOR: the log is a file, not a terminal (tracing-subscriber honours it). Only the demo's
# namespace, with its Lease there too.
NO_COLOR=1 start_daemon "$PIDFILE" "$LOGFILE" "$BIN" --namespace "$NS" --instance demo
log "controller running for namespace $NS (pid $(cut -d' ' -f1 "$PIDFILE")), log: ${LOGFILE#"$REPO"/}"

kubectl apply -n "$NS" -f "$MANIFEST"

# A paced display for a person to watch, not a readiness wait.
seconds=${DEMO_SECONDS:-60} interval=${DEMO_INTERVAL:-10}
end=$((SECONDS + seconds))
while :; do
  echo; echo "--- $(date +%T)  kubectl get singletonjobs,jobs -n $NS"
  kubectl get singletonjobs,jobs -n "$NS" || true
  # The controller has no readiness endpoint to wait for; a crash shows up here instead.
  pid_alive "$PIDFILE" || { log "the controller exited; last log lines:"; tail -n 20 "$LOGFILE" >&2; exit 1; }
  [ $SECONDS -lt $end ] || break
  sleep "$interval"
done

# The demo worked if a run succeeded: its SingletonJob says so (a run every 10 s of a Job the
# fake node completes within a second or two).
name=$(kubectl get -n "$NS" -f "$MANIFEST" -o jsonpath='{.metadata.name}')
deadline=$((SECONDS + 60))
until [ "$(kubectl get sj "$name" -n "$NS" -o jsonpath='{.status.lastSuccessfulTime}')" != "" ]; do
  if [ $SECONDS -ge $deadline ]; then
    log "no run of $name succeeded within a minute; the controller's last log lines:"
    tail -n 20 "$LOGFILE" >&2
    kubectl get sj "$name" -n "$NS" -o yaml >&2 || true
    exit 1
  fi
  sleep 1
done
log "a run of $name succeeded"

# The plugin as the README's quickstart runs it: kubectl finds kubectl-singleton on PATH.
echo; echo "--- $(date +%T)  kubectl singleton status $name -n $NS"
kubectl singleton status "$name" -n "$NS"

cat <<EOF

The controller keeps running in the background, for namespace $NS only (log:
${LOGFILE#"$REPO"/}). To keep exploring, in any shell:

  eval "\$(make -s env)"
  kubectl get sj -n $NS
  kubectl describe sj $name -n $NS
  kubectl singleton status $name -n $NS
  kubectl get jobs -n $NS -w

To stop the demo's controller: make demo-stop. To stop it, the cluster and PostgreSQL: make down.
EOF
