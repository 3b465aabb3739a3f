#!/usr/bin/env bash
# A local Kubernetes control plane from source-built binaries, no containers: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and a kwok fake node that "runs" pods (Job pods complete
# within about a second), plus PostgreSQL (hack/postgres.sh). Everything listens on 127.0.0.1 only.
#
# Usage: hack/cluster.sh up|down|status|env
#        hack/cluster.sh stop|start|restart|pause|resume COMPONENT
#   up      start what is missing; a no-op when all is healthy. If only part of it runs (a crash),
#           it is torn down and started fresh, so `up` always yields a known state.
#   down    stop exactly the processes `up` started and delete the cluster and database state.
#   status  say what runs; exit 0 only if everything is healthy.
#   env     print `export KUBECONFIG=...`, `export DATABASE_URL=...` and `export PATH=...` (the
#           project's kubectl and helm, built if missing, and target/debug then target/release,
#           with kubectl-singleton) for eval.
#   stop|start|restart|pause|resume COMPONENT: fault injection (the chaos suite, `make chaos`) on a
#           running cluster, keeping its state. COMPONENT: etcd, kube-apiserver or postgres (stop,
#           start, restart only). pause is SIGSTOP, resume SIGCONT. Idempotent: stopping what is
#           stopped, starting what runs, resuming what runs are no-ops. start and restart wait
#           until the component is healthy.
# Env: SINGLETON_ETCD_PORT (22379), SINGLETON_ETCD_PEER_PORT (22380), SINGLETON_APISERVER_PORT
#      (26443), SINGLETON_KCM_PORT (26257), SINGLETON_SCHEDULER_PORT (26259), SINGLETON_PG_PORT (25432)
#      SINGLETON_APISERVER_EXTRA_ARGS, SINGLETON_KCM_EXTRA_ARGS: extra flags for kube-apiserver and
#      kube-controller-manager, split on whitespace (so no spaces inside one flag), read by `up`
#      only. make bench passes an audit policy and log to the API server and
#      `--controllers=cronjob,job` to the KCM; with `--controllers=` no ServiceAccount or node
#      lifecycle controller may run: `up` then creates default/default and lifts the node's
#      not-ready taint itself. `up` records them in .cache/cluster/extra-args, so
#      a caller can tell how a running cluster was started, with the two below.
#      SINGLETON_CONTROL_PLANE_GOGC (400), SINGLETON_CONTROL_PLANE_GOMEMLIMIT (1GiB): Go's GC for
#      etcd, kube-apiserver, the KCM, the scheduler and kwok (hack/lib.sh).
#      `--node-monitor-grace-period=20s` makes a node whose kubelet is frozen (hack/node.sh
#      freeze-kubelet) NotReady after 21-24 s instead of 45-55 s, and was stable under CPU load;
#      but a control-plane outage longer than about 20 s (the chaos suite's full form pauses etcd
#      for 30 s) then turns every node NotReady for about 5 s, so it is not the default.
#      SINGLETON_CLUSTER_NAME: a second (third, ...) control plane beside the default one, for
#      multi-cluster tests (docs/multi-cluster.md): its state lives in .cache/cluster-NAME, it
#      needs its own ports (the SINGLETON_*_PORT above), and it has no PostgreSQL of its own: it
#      shares the one of SINGLETON_PG_PORT, which only the unnamed cluster starts and stops,
#      unless SINGLETON_CLUSTER_OWN_PG=1: then the PostgreSQL of SINGLETON_PG_NAME and
#      SINGLETON_PG_PORT (hack/postgres.sh) is the cluster's own, started by `up`, removed by
#      `down` and stopped and started as COMPONENT postgres (hack/own-cluster.sh).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=cluster
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"

# The default ports (and the second cluster's, demo-dr's: +1000 to +3000) are below Linux's
# ephemeral range (ip_local_port_range, 32768-60999 by default), from which the kernel picks the
# local port of every outgoing connection: a listener inside it can find its port taken by, say,
# an API server's connection to etcd (CI once lost the second cluster's etcd to "bind: address
# already in use" on 33380 that way). check_ports_free warns about a port moved into it.
ETCD_PORT=${SINGLETON_ETCD_PORT:-22379}
ETCD_PEER_PORT=${SINGLETON_ETCD_PEER_PORT:-22380}
APISERVER_PORT=${SINGLETON_APISERVER_PORT:-26443}
KCM_PORT=${SINGLETON_KCM_PORT:-26257}
SCHEDULER_PORT=${SINGLETON_SCHEDULER_PORT:-26259}
SERVICE_CIDR=10.96.0.0/16
NODE=kwok-node-0

CLUSTER_NAME=${SINGLETON_CLUSTER_NAME:-}
case $CLUSTER_NAME in
  '') STATE=$REPO/.cache/cluster ;;
  *[!a-z0-9-]*) echo "SINGLETON_CLUSTER_NAME must be lower-case letters, digits and '-'" >&2; exit 2 ;;
  *) STATE=$REPO/.cache/cluster-$CLUSTER_NAME ;;
esac
PKI=$STATE/pki
PIDS=$STATE/pids
LOGS=$STATE/logs
KUBECONFIG_FILE=$STATE/kubeconfig
DEMO_PIDS=$REPO/.cache/demo${CLUSTER_NAME:+-$CLUSTER_NAME}   # the demo's controller; `down` stops it before the API goes away

COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)  # start order
read -ra APISERVER_EXTRA_ARGS <<< "${SINGLETON_APISERVER_EXTRA_ARGS:-}"
read -ra KCM_EXTRA_ARGS <<< "${SINGLETON_KCM_EXTRA_ARGS:-}"
EXTRA_ARGS_FILE=$STATE/extra-args

# PostgreSQL is the unnamed cluster's: a named one shares it and never starts or stops it, unless
# it has one of its own (SINGLETON_CLUSTER_OWN_PG=1, a SINGLETON_PG_NAME server).
OWN_PG=${SINGLETON_CLUSTER_OWN_PG:-0}
case $OWN_PG in
  0) ;;
  1) [ -n "$CLUSTER_NAME" ] && [ -n "${SINGLETON_PG_NAME:-}" ] ||
       die "SINGLETON_CLUSTER_OWN_PG=1 needs SINGLETON_CLUSTER_NAME and SINGLETON_PG_NAME (a server of the cluster's own)" ;;
  *) die "SINGLETON_CLUSTER_OWN_PG is 0 or 1 (got '$OWN_PG')" ;;
esac
pg() {
  if [ -n "$CLUSTER_NAME" ] && [ "$OWN_PG" = 0 ]; then
    case $1 in url|status) "$REPO/hack/postgres.sh" "$1" ;; *) : ;; esac
  else
    "$REPO/hack/postgres.sh" "$@"
  fi
}

# MariaDB (hack/mariadb.sh), for the MySQL backstop's tests, follows the same rule, without a
# server of a named cluster's own.
maria() {
  if [ -n "$CLUSTER_NAME" ]; then
    case $1 in url|status) "$REPO/hack/mariadb.sh" "$1" ;; *) : ;; esac
  else
    "$REPO/hack/mariadb.sh" "$@"
  fi
}

kubectl() { need_tool kubectl || return 1; command kubectl --kubeconfig "$KUBECONFIG_FILE" "$@"; }
port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

ensure_tools() {
  # e2e and chaos tests run a controller under a skewed clock (faketime). The control plane's
  # binaries are built when missing and checked against hack/tools/SHA256SUMS before they are
  # started (a few seconds of hashing).
  need_tool openssl curl ps faketime etcd kube-apiserver kube-controller-manager kube-scheduler \
    kubectl kwok
}

# --- PKI -------------------------------------------------------------------------------------------
# One CA signs the serving cert and every client cert. Kept across `down` (only state is wiped), and
# remade when missing or within a day of expiry.
cert() { # cert <name> <subject> <extensions>
  openssl genrsa -out "$1.key" 2048 2>/dev/null
  openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 -sha256 \
    -extfile <(printf '%s\n' "$3") -out "$1.crt" 2>/dev/null
  rm -f "$1.csr"
}

ensure_pki() {
  local ok=1 c
  for c in ca apiserver admin kube-controller-manager kube-scheduler front-proxy-client apiserver-kubelet-client; do
    [ -s "$PKI/$c.crt" ] && openssl x509 -checkend 86400 -noout -in "$PKI/$c.crt" >/dev/null || ok=0
  done
  [ -s "$PKI/sa.key" ] || ok=0
  [ $ok = 1 ] && return 0
  log "creating PKI in $PKI"
  local tmp; tmp=$(mktemp -d "$STATE/.pki.XXXX")
  (
    cd "$tmp"
    openssl genrsa -out ca.key 2048 2>/dev/null
    # rustls (used by the kube crate) insists on proper v3 extensions: CA:TRUE on the CA, CA:FALSE
    # plus an EKU on leaves, and IP SANs for an https://127.0.0.1 server.
    openssl req -x509 -new -key ca.key -subj "/CN=singleton-local-ca" -days 3650 -sha256 -out ca.crt \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
    local leaf="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment"
    cert apiserver "/CN=kube-apiserver" "$leaf
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    cert admin "/O=system:masters/CN=singleton-admin" "$leaf
extendedKeyUsage=clientAuth"
    # The control-plane components get the identities the bootstrap RBAC policy grants to them.
    cert kube-controller-manager "/CN=system:kube-controller-manager" "$leaf
extendedKeyUsage=clientAuth"
    cert kube-scheduler "/CN=system:kube-scheduler" "$leaf
extendedKeyUsage=clientAuth"
    # The aggregation layer's client identity; its CA must also be published as the request-header
    # CA, or every delegated-auth client (KCM, scheduler) logs "missing content for CA bundle".
    cert front-proxy-client "/CN=front-proxy-client" "$leaf
extendedKeyUsage=clientAuth"
    # The API server's identity towards kubelets (logs, exec, port-forward on the real node).
    cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$leaf
extendedKeyUsage=clientAuth"
    # Service-account token signing key (TokenRequest API, `kubectl create token`).
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ca.srl
  )
  rm -rf "$PKI"; mv "$tmp" "$PKI"
}

# Self-contained (certs embedded), so it keeps working if copied elsewhere.
write_kubeconfig() { # write_kubeconfig <file> <cert name>
  local f=$1
  (umask 077; cat > "$f.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: singleton
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$2.crt")
    client-key-data: $(base64 -w0 "$PKI/$2.key")
contexts:
- name: singleton
  context:
    cluster: singleton
    user: $2
    namespace: default
current-context: singleton
EOF
  )
  mv "$f.tmp" "$f"
}

# --- processes -------------------------------------------------------------------------------------
pidfile() { echo "$PIDS/$1.pid"; }
logfile() { echo "$LOGS/$1.log"; }

# Each with the test clusters' GC settings (hack/lib.sh CONTROL_PLANE_GOGC).
start() { # start <name> <binary> [args...]
  local name=$1; shift
  : > "$(logfile "$name")"   # a fresh start gets a fresh log; `down` leaves the last one for reading
  GOGC=$CONTROL_PLANE_GOGC GOMEMLIMIT=$CONTROL_PLANE_GOMEMLIMIT \
    start_daemon "$(pidfile "$name")" "$(logfile "$name")" "$@"
}

check_ports_free() {
  local p lo=32768 hi=60999
  [ -r /proc/sys/net/ipv4/ip_local_port_range ] && read -r lo hi </proc/sys/net/ipv4/ip_local_port_range
  for p in "$ETCD_PORT" "$ETCD_PEER_PORT" "$APISERVER_PORT" "$KCM_PORT" "$SCHEDULER_PORT"; do
    port_taken "$p" && die "127.0.0.1:$p is already taken by another process (not one of ours);" \
      "set SINGLETON_*_PORT to move the cluster (see hack/cluster.sh header)"
    if [ "$p" -ge "$lo" ] && [ "$p" -le "$hi" ]; then
      log "warning: port $p is in the kernel's ephemeral range ($lo-$hi): an outgoing connection" \
        "may take it before the listener starts; prefer a port below $lo"
    fi
  done
  return 0
}

etcd_healthy() { curl -fsS --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" | grep -q '"health":"true"'; }
readyz() { kubectl get --raw /readyz --request-timeout=5s; }
healthz() { curl -ksfS --max-time 2 "https://127.0.0.1:$1/healthz"; }
node_ready() {
  local s
  s=$(kubectl get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')
  [ "$s" = True ] || { echo "node $NODE Ready=${s:-<unset>}"; return 1; }
}

all_alive() {
  local c
  for c in "${COMPONENTS[@]}"; do pid_alive "$(pidfile "$c")" || return 1; done
}

healthy() { all_alive && readyz >/dev/null 2>&1 && node_ready >/dev/null 2>&1; }

start_etcd() {
  log "starting etcd on 127.0.0.1:$ETCD_PORT"
  local bin; bin=$(tool_path etcd)
  start etcd "$bin" --name=singleton --data-dir="$STATE/etcd" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="singleton=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync --log-level=warn   # throwaway data: fsync only costs time
  WAIT_PIDFILE=$(pidfile etcd) wait_for "etcd health" 30 "$(logfile etcd)" etcd_healthy
}

start_apiserver() {
  # --endpoint-reconciler-type=none: the `kubernetes` Service's Endpoints may not hold a loopback
  # address, and with the default reconciler the apiserver refuses to start on 127.0.0.1.
  log "starting kube-apiserver on https://127.0.0.1:$APISERVER_PORT"
  local bin; bin=$(tool_path kube-apiserver)
  start kube-apiserver "$bin" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$APISERVER_PORT" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --authorization-mode=Node,RBAC \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --requestheader-client-ca-file="$PKI/ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$PKI/front-proxy-client.crt" --proxy-client-key-file="$PKI/front-proxy-client.key" \
    --endpoint-reconciler-type=none \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --allow-privileged=true \
    --cert-dir="$STATE/run/kube-apiserver" \
    ${APISERVER_EXTRA_ARGS[@]+"${APISERVER_EXTRA_ARGS[@]}"}
  WAIT_PIDFILE=$(pidfile kube-apiserver) wait_for "kube-apiserver /readyz" 120 "$(logfile kube-apiserver)" readyz
}

start_all() {
  mkdir -p "$PIDS" "$LOGS" "$STATE/run"
  check_ports_free
  ensure_pki
  write_kubeconfig "$KUBECONFIG_FILE" admin
  write_kubeconfig "$STATE/kube-controller-manager.kubeconfig" kube-controller-manager
  write_kubeconfig "$STATE/kube-scheduler.kubeconfig" kube-scheduler

  start_etcd
  start_apiserver

  # Both serve /healthz on loopback (not their default 0.0.0.0) with an in-memory self-signed cert.
  log "starting kube-controller-manager, kube-scheduler and kwok"
  local kcm scheduler
  kcm=$(tool_path kube-controller-manager)
  scheduler=$(tool_path kube-scheduler)
  # The KCM's controllers for what nothing here uses (volumes, StatefulSets, DaemonSets, HPAs,
  # CSRs: the real nodes' certificates are pre-made, hack/node.sh) are off: each would watch and
  # resync on every control plane `make test` starts. A --controllers= in
  # SINGLETON_KCM_EXTRA_ARGS (make bench) replaces this list.
  local controllers=()
  if [[ " ${KCM_EXTRA_ARGS[*]-} " != *" --controllers="* ]]; then
    controllers=("--controllers=*,$(printf -- '-%s-controller,' daemonset statefulset \
      horizontal-pod-autoscaler replicationcontroller persistentvolume-attach-detach \
      persistentvolume-binder persistentvolume-expander persistentvolume-protection \
      persistentvolumeclaim-protection ephemeral-volume resourceclaim \
      volumeattributesclass-protection storage-version-migrator \
      storageversion-garbage-collector device-taint-eviction podgroup-protection \
      resourcepoolstatusrequest validatingadmissionpolicy-status endpointslice-mirroring \
      certificatesigningrequest-approving certificatesigningrequest-cleaner \
      certificatesigningrequest-signing kube-apiserver-serving-clustertrustbundle-publisher \
      podcertificaterequest-cleaner legacy-serviceaccount-token-cleaner | sed 's/,$//')")
  fi
  start kube-controller-manager "$kcm" \
    --kubeconfig="$STATE/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$STATE/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$STATE/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$KCM_PORT" --cert-dir="$STATE/run/kube-controller-manager" \
    --leader-elect=false --use-service-account-credentials=true \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    ${controllers[@]+"${controllers[@]}"} ${KCM_EXTRA_ARGS[@]+"${KCM_EXTRA_ARGS[@]}"}
  start kube-scheduler "$scheduler" \
    --kubeconfig="$STATE/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig="$STATE/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig="$STATE/kube-scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$SCHEDULER_PORT" --cert-dir="$STATE/run/kube-scheduler" \
    --leader-elect=false
  # kwok plays kubelet for nodes annotated kwok.x-k8s.io/node=fake only (a real node, should one
  # join, is left alone). The stages are kwokctl's defaults: pods become Running at once, pods owned
  # by a Job then Succeeded at once; the node keeps Ready through a Lease renewed by kwok, every
  # 5 s (a quarter of its 20 s duration), like the real nodes' kubelets (hack/node.sh). The KCM
  # marks a node NotReady --node-monitor-grace-period (50 s) after the last renewal it saw.
  # KWOK_WORKDIR keeps it from reading a user's ~/.kwok/kwok.yaml. It opens no port: no --node-port
  # or --server-address, so no kubelet API (logs/exec) is served.
  mkdir -p "$STATE/kwok"
  local kwok; kwok=$(tool_path kwok)
  KWOK_WORKDIR=$STATE/kwok start kwok "$kwok" \
    --kubeconfig="$KUBECONFIG_FILE" --config="$(dirname "$kwok")/stages.yaml" \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds=20 --node-ip=127.0.0.1

  kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $NODE
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/arch: amd64
    kubernetes.io/hostname: $NODE
    kubernetes.io/os: linux
    type: kwok
EOF

  WAIT_PIDFILE=$(pidfile kube-controller-manager) \
    wait_for "kube-controller-manager /healthz" 60 "$(logfile kube-controller-manager)" healthz "$KCM_PORT"
  WAIT_PIDFILE=$(pidfile kube-scheduler) \
    wait_for "kube-scheduler /healthz" 60 "$(logfile kube-scheduler)" healthz "$SCHEDULER_PORT"
  WAIT_PIDFILE=$(pidfile kwok) wait_for "node $NODE Ready" 60 "$(logfile kwok)" node_ready
  # Pods are rejected until the ServiceAccount admission finds `default`, made by the KCM, unless
  # its controllers are restricted (make bench): then no ServiceAccount controller runs.
  # Nor does a node lifecycle controller then lift the not-ready taint the API server puts on a
  # new node: lift it here (kwok keeps the node Ready).
  if [[ " ${KCM_EXTRA_ARGS[*]-} " == *" --controllers="* ]]; then
    kubectl create serviceaccount default -n default >/dev/null 2>&1 || true
    kubectl taint node "$NODE" node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
  fi
  WAIT_PIDFILE=$(pidfile kube-controller-manager) wait_for "ServiceAccount default/default" 60 \
    "$(logfile kube-controller-manager)" kubectl get serviceaccount default -n default -o name
  printf 'apiserver: %s\nkcm: %s\ngo: GOGC=%s GOMEMLIMIT=%s\n' "${SINGLETON_APISERVER_EXTRA_ARGS:-}" \
    "${SINGLETON_KCM_EXTRA_ARGS:-}" "$CONTROL_PLANE_GOGC" "$CONTROL_PLANE_GOMEMLIMIT" > "$EXTRA_ARGS_FILE"
}

# Clients first, then the apiserver, then etcd, so nothing spends its shutdown retrying a dead peer;
# each tier is stopped in parallel.
stop_all() {
  stop_pidfiles 20 "$DEMO_PIDS"/*.pid "$(pidfile kwok)" "$(pidfile kube-scheduler)" \
    "$(pidfile kube-controller-manager)"
  stop_pidfile "$(pidfile kube-apiserver)" 20
  stop_pidfile "$(pidfile etcd)" 20
}

# --- commands --------------------------------------------------------------------------------------
# The real node (hack/node.sh): on unless SINGLETON_REAL_NODE=0 (kwok-only, no root needed).
real_node() { [ -z "$CLUSTER_NAME" ] && [ "${SINGLETON_REAL_NODE:-1}" != 0 ]; }

cmd_up() {
  ensure_tools
  if healthy; then
    log "already up"
    pg up
    maria up
    if real_node; then "$REPO/hack/node.sh" up; fi
  else
    if [ -d "$PIDS" ] && ls "$PIDS"/*.pid >/dev/null 2>&1; then
      local dead=() c
      for c in "${COMPONENTS[@]}"; do pid_alive "$(pidfile "$c")" || dead+=("$c"); done
      log "cluster is unhealthy (not running: ${dead[*]:-none}); restarting from a fresh state"
      if [ -z "$CLUSTER_NAME" ]; then "$REPO/hack/node.sh" down; fi
      stop_all
    fi
    # A fresh cluster gets a fresh database too: tokens recorded there belong to the old cluster.
    pg down
    maria down
    rm -rf "$STATE/etcd" "$STATE/run"
    local t0=$SECONDS
    # initdb (~2 s) and MariaDB's (~1 s) overlap the control plane's start.
    { pg up; maria up; } &
    PG_JOB=$!
    # A trap, not `if ! start_all`: errexit is suspended inside a function tested by `if`.
    trap 'if [ $? != 0 ]; then
            log "start failed; stopping what was started (logs stay in $LOGS)"
            if [ -z "$CLUSTER_NAME" ]; then "$REPO/hack/node.sh" down || true; fi
            stop_all; wait "$PG_JOB" || true; pg down; maria down
          fi' EXIT
    start_all
    wait "$PG_JOB"
    if real_node; then "$REPO/hack/node.sh" up; fi
    trap - EXIT
    log "cluster ready in $((SECONDS - t0))s"
  fi
  log "KUBECONFIG=$KUBECONFIG_FILE"
}

cmd_down() {
  # Always (not only with SINGLETON_REAL_NODE on): whatever a node left on the host is undone.
  # The node belongs to the unnamed cluster: a named one (SINGLETON_CLUSTER_NAME) never has one.
  if [ -z "$CLUSTER_NAME" ]; then "$REPO/hack/node.sh" down; fi
  stop_all
  pg down
  maria down
  rm -rf "$STATE/etcd" "$STATE/run" "$PIDS" "$STATE"/*.kubeconfig "$EXTRA_ARGS_FILE"
  log "down"
}

cmd_status() {
  local rc=0 c f pid
  for c in "${COMPONENTS[@]}"; do
    f=$(pidfile "$c")
    if pid_alive "$f"; then read -r pid _ < "$f"; printf '%-24s running  pid %s\n' "$c" "$pid"
    else printf '%-24s stopped\n' "$c"; rc=1; fi
  done
  for f in "$DEMO_PIDS"/*.pid; do
    [ -e "$f" ] || continue
    if pid_alive "$f"; then read -r pid _ < "$f"; printf '%-24s running  pid %s\n' "demo $(basename "$f" .pid)" "$pid"; fi
  done
  # have_tool: a machine that never built kubectl runs no cluster (and status builds nothing).
  if [ -s "$KUBECONFIG_FILE" ] && have_tool kubectl && readyz >/dev/null 2>&1; then
    printf '%-24s ready    https://127.0.0.1:%s\n' apiserver "$APISERVER_PORT"
    if node_ready >/dev/null 2>&1; then printf '%-24s Ready\n' "node $NODE"
    else printf '%-24s not Ready\n' "node $NODE"; rc=1; fi
  else
    printf '%-24s not ready\n' apiserver; rc=1
  fi
  pg status || rc=1
  maria status || rc=1
  if real_node; then "$REPO/hack/node.sh" status || rc=1; fi
  [ $rc = 0 ] && echo "KUBECONFIG=$KUBECONFIG_FILE"
  return $rc
}

cmd_env() {
  # The project's kubectl and helm (built for this cluster, cached outside the repo: built here
  # when missing, so what PATH names exists) and the controller's binaries, kubectl-singleton
  # among them (so `kubectl singleton ...` works).
  local kubectl helm
  kubectl=$(tool_path kubectl)
  helm=$(tool_path helm)
  echo "export KUBECONFIG=$KUBECONFIG_FILE"
  echo "export DATABASE_URL=$(pg url)"
  echo "export MARIADB_URL=$(maria url)"
  echo "export PATH=\"$(dirname "$kubectl"):$(dirname "$helm"):$CARGO_TARGET/debug:$CARGO_TARGET/release:\$PATH\""
}

# stop|start|restart|pause|resume COMPONENT, reusing the pid files of `up`.
cmd_component() {
  local action=$1 comp=${2:-} f pid
  case $comp in
    postgres)
      [ -z "$CLUSTER_NAME" ] || [ "$OWN_PG" = 1 ] ||
        die "postgres belongs to the unnamed cluster (unset SINGLETON_CLUSTER_NAME, or give the named one its own: SINGLETON_CLUSTER_OWN_PG=1)"
      case $action in
        stop) pg stop ;;
        start) pg up ;;
        restart) pg stop; pg up ;;
        *) die "postgres supports stop, start and restart" ;;
      esac
      return ;;
    etcd|kube-apiserver) ;;
    *) die "COMPONENT must be etcd, kube-apiserver or postgres (got '${comp}')" ;;
  esac
  f=$(pidfile "$comp")
  case $action in
    stop)
      if pid_alive "$f"; then
        read -r pid _ < "$f"
        kill -CONT -- "-$pid" 2>/dev/null || true   # a paused process cannot act on TERM
        # kube-apiserver drains its watches for up to a minute on TERM; a restart should not
        # wait for that (KILL after 8 s is then a crash, which a restart may well be).
        stop_pidfile "$f" 8
      fi ;;
    start)
      pid_alive "$f" && { log "$comp already runs"; return 0; }
      [ -s "$KUBECONFIG_FILE" ] || die "no cluster state: run '$0 up' first"
      if [ "$comp" = etcd ]; then start_etcd; else start_apiserver; fi ;;
    restart)
      cmd_component stop "$comp"
      cmd_component start "$comp" ;;
    pause|resume)
      pid_alive "$f" || die "$comp is not running"
      read -r pid _ < "$f"
      if [ "$action" = pause ]; then kill -STOP -- "-$pid"; else kill -CONT -- "-$pid"; fi
      log "$action $comp (pgid $pid)" ;;
    *) die "unknown action $action" ;;
  esac
}

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  stop|start|restart|pause|resume) cmd_component "$1" "${2:-}" ;;
  *) sed -n '2,/^set -euo/{/^#/p}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
