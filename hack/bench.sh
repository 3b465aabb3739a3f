#!/usr/bin/env bash
# make bench: SingletonJob against Kubernetes CronJob on the local control plane (issue #9).
#
# Starts the cluster with an audit log (bench/audit-policy.yaml) and the kube-controller-manager
# restricted to its cronjob and job controllers, runs the `bench` binary (crate bench/), which
# writes bench/results/{results.md,results.json,skew.png}, and tears down the cluster it started.
# A cluster already running on these ports is used only if it was started by this script's flags;
# otherwise the bench refuses (stop it with `make down`, or move the bench with SINGLETON_*_PORT).
#
# Env: BENCH=full|quick (default full, ~45 min with its burst of 10,000; quick ~11 min, for iterating), BENCH_ONLY (some of
#      raw,idle,seconds,burst,failover,scale,scale-sj,scale-cj), BENCH_OUT (default
#      bench/results; give a quick run another directory, so the committed full run stays),
#      BENCH_REPEAT=k runs every burst row k times in one run (SingletonJob with and without
#      prepared runs, and CronJob; the 10,000 burst of a full run once) and reports the median
#      run with the min and max of the k p99s, the spread against which "no figure worse than
#      the committed run" is judged (default 1; each repeat adds ~13 min to a full run, ~9 to
#      a quick one), BENCH_KEEP_CLUSTER=1 leaves a cluster this script started running,
#      BENCH_CONTROLLER_BIN runs another controller command (a profiler's wrapper, which must pass
#      signals on; the default is the release build), and the SINGLETON_*_PORT variables of
#      hack/cluster.sh.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=bench
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"

STATE=$REPO/.cache/cluster
WORK=$REPO/.cache/bench
AUDIT_LOG=$WORK/audit.log
mkdir -p "$WORK"
need_tool openssl kubectl free

export SINGLETON_APISERVER_EXTRA_ARGS="--audit-policy-file=$REPO/bench/audit-policy.yaml --audit-log-path=$AUDIT_LOG --audit-log-format=json --audit-log-maxsize=0 --audit-log-maxbackup=0"
export SINGLETON_KCM_EXTRA_ARGS="--controllers=cronjob,job"
# Go's own GC defaults, as in the committed results (the tests' clusters collect less often).
export SINGLETON_CONTROL_PLANE_GOGC=100 SINGLETON_CONTROL_PLANE_GOMEMLIMIT=off
want=$(printf 'apiserver: %s\nkcm: %s\ngo: GOGC=%s GOMEMLIMIT=%s\n' "$SINGLETON_APISERVER_EXTRA_ARGS" \
  "$SINGLETON_KCM_EXTRA_ARGS" "$SINGLETON_CONTROL_PLANE_GOGC" "$SINGLETON_CONTROL_PLANE_GOMEMLIMIT")

started=
if "$REPO/hack/cluster.sh" status >/dev/null 2>&1; then
  if [ "$(cat "$STATE/extra-args" 2>/dev/null)" != "$want" ]; then
    die "a cluster is already running on these ports, but not with the bench's flags (an audit log" \
      "and a kube-controller-manager restricted to --controllers=cronjob,job), so its figures would" \
      "be wrong. Stop it with 'make down' (or set SINGLETON_*_PORT to run the bench beside it)."
  fi
  log "using the running cluster (started with the bench's flags)"
else
  started=1
  rm -f "$AUDIT_LOG"
fi
trap 'if [ -n "$started" ] && [ -z "${BENCH_KEEP_CLUSTER:-}" ]; then "$REPO/hack/cluster.sh" down; fi' EXIT
trap 'exit 130' INT TERM
if [ -n "$started" ]; then "$REPO/hack/cluster.sh" up; fi

# The controller under test gets its own identity, so the audit log tells its requests from the
# bench's: a client certificate for CN=singleton-bench-controller (system:masters, like the admin).
PKI=$STATE/pki
CTL_KUBECONFIG=$WORK/controller.kubeconfig
(
  cd "$WORK"
  openssl genrsa -out ctl.key 2048 2>/dev/null
  openssl req -new -key ctl.key -subj "/O=system:masters/CN=singleton-bench-controller" -out ctl.csr
  openssl x509 -req -in ctl.csr -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial -days 2 -sha256 \
    -extfile <(printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n') \
    -out ctl.crt 2>/dev/null
  rm -f ctl.csr "$PKI/ca.srl"
  server=$(sed -n 's/^ *server: //p' "$STATE/kubeconfig" | head -1)
  umask 077
  cat > "$CTL_KUBECONFIG" <<KC
apiVersion: v1
kind: Config
clusters:
- name: singleton
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: controller
  user:
    client-certificate-data: $(base64 -w0 ctl.crt)
    client-key-data: $(base64 -w0 ctl.key)
contexts:
- name: singleton
  context: {cluster: singleton, user: controller}
current-context: singleton
KC
)

# The controller is measured as it ships: a release build.
controller=$(tool_path --release singleton-controller)
bench=$(tool_path --release bench)
env=$("$REPO/hack/cluster.sh" env)
eval "$env"
kubectl apply --server-side -f "$REPO/crds/" >/dev/null
kubectl wait --for=condition=Established --timeout=60s -f "$REPO/crds/" >/dev/null

machine="$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, $(free -g | awk '/^Mem:/{print $2}') GiB RAM, $(uname -sr); Kubernetes $K8S_VERSION, etcd $ETCD_VERSION (--unsafe-no-fsync), kwok $KWOK_VERSION"
BENCH_MACHINE=$machine \
BENCH_CONTROLLER_BIN=${BENCH_CONTROLLER_BIN:-$controller} \
BENCH_CONTROLLER_KUBECONFIG=$CTL_KUBECONFIG \
BENCH_AUDIT_LOG=$AUDIT_LOG \
BENCH_KCM_PIDFILE=$STATE/pids/kube-controller-manager.pid \
BENCH_WORK=$WORK \
BENCH_OUT=${BENCH_OUT:-$REPO/bench/results} \
  "$bench"
