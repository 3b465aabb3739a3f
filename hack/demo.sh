#!/usr/bin/env bash
# `make demo`: the local cluster and the controller running the billing example for about a minute
# of `kubectl get`, then a check that a run succeeded and the log of one run.
#
# With the real node (the default, hack/node.sh): the images are built (`make image`), the Helm
# chart is installed with them into namespace `singleton-system`, serving `singleton-demo` (two
# controller pods electing a leader; both namespaces enforce the restricted Pod Security
# Standard), and examples/billing/demo.yaml runs the
# billing workload every 10 seconds in a real container that writes its invoices to PostgreSQL
# with its fencing token; `kubectl logs` of a run shows its period and token.
# Without it (SINGLETON_REAL_NODE=0): the controller runs as a local process and
# examples/hello.yaml's Jobs are "run" by the kwok fake node.
#
# The controller watches only the demo's namespace: `make test` run beside it (same cluster) never
# sees it act on a test's namespace. It keeps running afterwards; `make down` stops it with the
# cluster, `make demo-stop` alone.
# Env: DEMO_MANIFEST (examples/billing/demo.yaml, or examples/hello.yaml without the real node),
#      DEMO_SECONDS (60), DEMO_INTERVAL (10), DEMO_NAMESPACE (singleton-demo),
#      DEMO_CONTROLLER_NAMESPACE (singleton-system: the chart's, with the real node)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=demo
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"
cd "$REPO"

NS=${DEMO_NAMESPACE:-singleton-demo}
RELEASE=singleton-demo
# The chart's own namespace: the controller never creates Jobs in its release namespace.
CONTROLLER_NS=${DEMO_CONTROLLER_NAMESPACE:-singleton-system}
VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$REPO/Cargo.toml")
DEMO_DIR=$REPO/.cache/demo
PIDFILE=$DEMO_DIR/controller.pid
LOGFILE=$DEMO_DIR/controller.log

if [ "${1:-}" = stop ]; then
  stop_pidfile "$PIDFILE" 15
  if hack/cluster.sh status >/dev/null 2>&1; then
    need_tool helm
    env=$(hack/cluster.sh env)
    eval "$env"; export KUBECONFIG PATH
    helm uninstall "$RELEASE" -n "$CONTROLLER_NS" --wait >/dev/null 2>&1 || true
  fi
  log "the demo's controller is stopped (the cluster keeps running: make down stops it)"
  exit 0
fi

# Every tool is obtained before its first use (need_tool, hack/lib.sh: built or installed when
# missing, hash-checked, on PATH); a fresh machine builds them here, each saying how long it
# usually takes. The cluster (make up) obtains its own.
need_tool kubectl helm psql
hack/cluster.sh up
# The same environment a newcomer gets from `eval "$(make -s env)"`: kubectl, helm and
# kubectl-singleton on PATH. (Through a variable: `eval "$(...)"` would hide a failure.)
env=$(hack/cluster.sh env)
eval "$env"
export KUBECONFIG DATABASE_URL PATH

log "installing the CRD"
kubectl apply --server-side -f crds/ >/dev/null
kubectl wait --for=condition=Established --timeout=60s -f crds/ >/dev/null

# A second `make demo` replaces the controller rather than starting a rival one.
stop_pidfile "$PIDFILE" 15
mkdir -p "$DEMO_DIR"; : > "$LOGFILE"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null

if hack/node.sh status >/dev/null 2>&1; then
  REAL=1
  MANIFEST=${DEMO_MANIFEST:-examples/billing/demo.yaml}
  # Only the two images the demo runs: the Go and Python workloads' (make image builds all four)
  # are e2e's, built by `make test` when it needs them.
  log "building the controller's and the billing workload's images (release binaries, buildah, no Docker)"
  hack/image.sh controller workload
  kubectl create namespace "$CONTROLLER_NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  for ns in "$NS" "$CONTROLLER_NS"; do
    kubectl label namespace "$ns" --overwrite pod-security.kubernetes.io/enforce=restricted \
      pod-security.kubernetes.io/enforce-version=latest >/dev/null
  done
  # The billing database: its tables (examples/billing/schema.sql) in a database of the demo's
  # own; pods reach PostgreSQL at the pod bridge's gateway (hack/node.sh).
  db=singleton_demo
  psql "$DATABASE_URL" -XAtq -c "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1 \
    || psql "$DATABASE_URL" -Xq -c "CREATE DATABASE $db"
  PGOPTIONS='--client-min-messages=warning' psql "${DATABASE_URL/\/singleton\?//$db?}" -Xq -v ON_ERROR_STOP=1 -f examples/billing/schema.sql
  port=${DATABASE_URL##*:}; port=${port%%/*}
  kubectl create secret generic billing-db -n "$NS" \
    --from-literal=url="postgres://postgres@10.244.0.1:$port/$db?sslmode=disable" \
    --from-literal=sslmode=disable --dry-run=client -o yaml \
    | kubectl label --local -f - singleton.dev/backstop=true -o yaml | kubectl apply -f - >/dev/null
  log "installing the chart (release $RELEASE in $CONTROLLER_NS, the local images, on the real node)"
  helm upgrade --install "$RELEASE" charts/singleton-controller --namespace "$CONTROLLER_NS" \
    --wait --timeout 180s --set crds.install=false \
    --set image.repository=localhost/singleton/singleton-controller \
    --set image.tag="$VERSION" --set image.pullPolicy=Never \
    --set "watchNamespaces={$NS}" --set "rbac.backstopNamespaces={$NS}" \
    --set "controller.backstopAllowedHosts={10.244.0.1/32}" \
    --set 'nodeSelector.singleton\.dev/node=real' \
    --set tolerations[0].key=singleton.dev/node --set tolerations[0].operator=Exists \
    --set tolerations[0].effect=NoSchedule >/dev/null
  kubectl get pods -n "$CONTROLLER_NS" -o wide
  sed "s#billing-workload:[0-9][0-9.]*#billing-workload:$VERSION#" "$MANIFEST" | kubectl apply -n "$NS" -f -
else
  REAL=
  MANIFEST=${DEMO_MANIFEST:-examples/hello.yaml}
  log "no real node (SINGLETON_REAL_NODE=0?): the controller runs as a local process, kwok runs the pods"
  BIN=$(tool_path singleton-controller)
  # NO_COLOR: the log is a file, not a terminal (tracing-subscriber honours it). Only the demo's
  # namespace, with its Lease there too.
  NO_COLOR=1 start_daemon "$PIDFILE" "$LOGFILE" "$BIN" --namespace "$NS" --instance demo
  log "controller running for namespace $NS (pid $(cut -d' ' -f1 "$PIDFILE")), log: ${LOGFILE#"$REPO"/}"
  kubectl apply -n "$NS" -f "$MANIFEST"
fi
# The plugin `kubectl singleton`. With the real node, from the release build the images just
# made: a debug build would compile every dependency again (minutes on a fresh machine). Either
# is on PATH for `eval "$(make -s env)"` (target/debug, then target/release).
if [ -n "$REAL" ]; then need_tool --release kubectl-singleton; else need_tool kubectl-singleton; fi

# A paced display for a person to watch, not a readiness wait.
seconds=${DEMO_SECONDS:-60} interval=${DEMO_INTERVAL:-10}
end=$((SECONDS + seconds))
while :; do
  echo; echo "--- $(date +%T)  kubectl get singletonjobs,jobs -n $NS"
  kubectl get singletonjobs,jobs -n "$NS" || true
  # A crash shows up here: the local process gone, or the chart's pods not ready.
  if [ -z "$REAL" ]; then
    pid_alive "$PIDFILE" || { log "the controller exited; last log lines:"; tail -n 20 "$LOGFILE" >&2; exit 1; }
  fi
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
    if [ -n "$REAL" ]; then
      kubectl get pods -n "$CONTROLLER_NS" -o wide >&2 || true
      kubectl logs -n "$CONTROLLER_NS" "deploy/$RELEASE-singleton-controller" --tail 20 >&2 || true
    else
      tail -n 20 "$LOGFILE" >&2
    fi
    kubectl get sj "$name" -n "$NS" -o yaml >&2 || true
    exit 1
  fi
  sleep 1
done
log "a run of $name succeeded"
if [ -n "$REAL" ]; then
  # What the run's own container printed: its period and fencing token, and what it committed.
  job=$(kubectl get jobs -n "$NS" -o jsonpath='{range .items[?(@.status.succeeded==1)]}{.metadata.name}{"\n"}{end}' | tail -n 1)
  echo; echo "--- $(date +%T)  kubectl logs job/$job -n $NS"
  kubectl logs "job/$job" -n "$NS"
fi

# The plugin as the README's quickstart runs it: kubectl finds kubectl-singleton on PATH.
echo; echo "--- $(date +%T)  kubectl singleton status $name -n $NS"
kubectl singleton status "$name" -n "$NS"

if [ -n "$REAL" ]; then
  where="the chart's pods in $CONTROLLER_NS; log: kubectl logs -n $CONTROLLER_NS deploy/$RELEASE-singleton-controller"
else
  where="log: ${LOGFILE#"$REPO"/}"
fi
cat <<EOF

The controller keeps running in the background, for namespace $NS only ($where).
To keep exploring, in any shell:

  eval "\$(make -s env)"
  kubectl get sj -n $NS
  kubectl describe sj $name -n $NS
  kubectl singleton status $name -n $NS
  kubectl get jobs -n $NS -w${REAL:+
  kubectl logs -n $NS job/<a Job above>}

To stop the demo's controller: make demo-stop. To stop it, the cluster and PostgreSQL: make down.
EOF
