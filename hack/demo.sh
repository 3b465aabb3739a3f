#!/usr/bin/env bash
# `make demo`: the local cluster, the CRD, the controller running in the background, and the example
# SingletonJob; then about a minute of `kubectl get singletonjobs,jobs` so one sees runs appear.
# The controller keeps running afterwards; `make down` stops it with the cluster.
# Env: DEMO_MANIFEST (examples/hello.yaml), DEMO_SECONDS (60), DEMO_INTERVAL (10)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=demo
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"
cd "$REPO"

MANIFEST=${DEMO_MANIFEST:-examples/hello.yaml}
DEMO_DIR=$REPO/.cache/demo
PIDFILE=$DEMO_DIR/controller.pid
LOGFILE=$DEMO_DIR/controller.log
BIN=${CARGO_TARGET_DIR:-$REPO/target}/debug/singleton-controller
KUBECTL_BIN=$TOOLS_DIR/kubernetes-$K8S_VERSION/kubectl

hack/cluster.sh up
eval "$(hack/cluster.sh env)"
export KUBECONFIG DATABASE_URL
kubectl() { "$KUBECTL_BIN" "$@"; }

log "installing the CRD"
kubectl apply --server-side -f crds/ >/dev/null
kubectl wait --for=condition=Established --timeout=60s -f crds/ >/dev/null

log "building the controller"
cargo build -q -p singleton-controller --bins

# A second `make demo` replaces the controller rather than starting a rival one.
stop_pidfile "$PIDFILE" 15
mkdir -p "$DEMO_DIR"; : > "$LOGFILE"
# NO_COLOR: the log is a file, not a terminal (tracing-subscriber honours it).
NO_COLOR=1 start_daemon "$PIDFILE" "$LOGFILE" "$BIN"
log "controller running (pid $(cut -d' ' -f1 "$PIDFILE")), log: ${LOGFILE#"$REPO"/}"

kubectl apply -f "$MANIFEST"

# A paced display for a person to watch, not a readiness wait.
seconds=${DEMO_SECONDS:-60} interval=${DEMO_INTERVAL:-10}
end=$((SECONDS + seconds))
while :; do
  echo; echo "--- $(date +%T)  kubectl get singletonjobs,jobs"
  kubectl get singletonjobs,jobs || true
  # The controller has no readiness endpoint to wait for; a crash shows up here instead.
  pid_alive "$PIDFILE" || { log "the controller exited; last log lines:"; tail -n 20 "$LOGFILE" >&2; exit 1; }
  [ $SECONDS -lt $end ] || break
  sleep "$interval"
done

# The plugin as the README's quickstart runs it: kubectl finds kubectl-singleton on PATH.
if [ "$MANIFEST" = examples/hello.yaml ]; then
  echo; echo "--- $(date +%T)  kubectl singleton status hello"
  PATH="$(dirname "$BIN"):$PATH" "$KUBECTL_BIN" singleton status hello
fi

k=kubectl
command -v kubectl >/dev/null 2>&1 || k=$KUBECTL_BIN
cat <<EOF

The controller keeps running in the background (log: ${LOGFILE#"$REPO"/}). To keep exploring:

  eval "\$(make -s env)"
  $k get sj
  $k describe sj hello
  PATH="$(dirname "$BIN"):\$PATH" $k singleton status hello
  $k get jobs -w

To stop the controller, the cluster and PostgreSQL:

  make down
EOF
