#!/usr/bin/env bash
# A control plane and a PostgreSQL of their own (hack/cluster.sh with SINGLETON_CLUSTER_NAME set
# to the instance's name and SINGLETON_CLUSTER_OWN_PG=1), for tests that stop or flood what they
# run on, beside every other test instead of after them all (hack/e2e.sh). Two instances may run
# at once:
#   own   the chaos suite's CHAOS_SCOPE=cluster rows (the API server, etcd and PostgreSQL
#         stopped, kwok flooded);
#   own2  the hostile-tenant suite (e2e/tests/hostile.rs): its tenant floods the API server,
#         etcd and PostgreSQL on purpose, and its quiet baseline wants a cluster nobody else
#         loads;
#   own3  the version-skew tests (e2e/tests/version_skew.rs): they give the SingletonJob CRD a
#         newer release's fields, which would restart every other test's watches;
#   own4  the upgrade suite (e2e/tests/upgrade.rs): it replaces the CRDs with the previous
#         release's chart and upgrades and rolls them back.
#
# Usage: hack/own-cluster.sh run CMD...  start it fresh, apply the CRDs, run CMD in its
#            environment (KUBECONFIG, DATABASE_URL, and the SINGLETON_* variables with which
#            `hack/cluster.sh stop|start COMPONENT` acts on it, as the chaos suite calls it),
#            then remove it; exits with CMD's status
#        hack/own-cluster.sh down   remove it (what a killed run left behind); every instance
#            when SINGLETON_OWN_INSTANCE is unset
# Env: SINGLETON_OWN_INSTANCE (own, own2, own3 or own4; own); per instance, the ports below,
#      which are the first cluster's plus 4000 (own), 5000 (own2) or 6000 (own3), and 21xxx for
#      own4 (a higher offset would reach the kernel's ephemeral range; e2e/src/multicluster.rs
#      checks that no two clusters share a port).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=own-cluster
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"

# instance NAME: the variables with which hack/cluster.sh acts on instance NAME.
instance() {
  case $1 in
    own)
      export SINGLETON_ETCD_PORT=${SINGLETON_OWN_ETCD_PORT:-26379}
      export SINGLETON_ETCD_PEER_PORT=${SINGLETON_OWN_ETCD_PEER_PORT:-26380}
      export SINGLETON_APISERVER_PORT=${SINGLETON_OWN_APISERVER_PORT:-30443}
      export SINGLETON_KCM_PORT=${SINGLETON_OWN_KCM_PORT:-30257}
      export SINGLETON_SCHEDULER_PORT=${SINGLETON_OWN_SCHEDULER_PORT:-30259}
      export SINGLETON_PG_PORT=${SINGLETON_OWN_PG_PORT:-29432} ;;
    own2)
      export SINGLETON_ETCD_PORT=${SINGLETON_OWN2_ETCD_PORT:-27379}
      export SINGLETON_ETCD_PEER_PORT=${SINGLETON_OWN2_ETCD_PEER_PORT:-27380}
      export SINGLETON_APISERVER_PORT=${SINGLETON_OWN2_APISERVER_PORT:-31443}
      export SINGLETON_KCM_PORT=${SINGLETON_OWN2_KCM_PORT:-31257}
      export SINGLETON_SCHEDULER_PORT=${SINGLETON_OWN2_SCHEDULER_PORT:-31259}
      export SINGLETON_PG_PORT=${SINGLETON_OWN2_PG_PORT:-30432} ;;
    own3)
      export SINGLETON_ETCD_PORT=${SINGLETON_OWN3_ETCD_PORT:-28379}
      export SINGLETON_ETCD_PEER_PORT=${SINGLETON_OWN3_ETCD_PEER_PORT:-28380}
      export SINGLETON_APISERVER_PORT=${SINGLETON_OWN3_APISERVER_PORT:-32443}
      export SINGLETON_KCM_PORT=${SINGLETON_OWN3_KCM_PORT:-32257}
      export SINGLETON_SCHEDULER_PORT=${SINGLETON_OWN3_SCHEDULER_PORT:-32259}
      export SINGLETON_PG_PORT=${SINGLETON_OWN3_PG_PORT:-31432} ;;
    own4)
      export SINGLETON_ETCD_PORT=${SINGLETON_OWN4_ETCD_PORT:-21379}
      export SINGLETON_ETCD_PEER_PORT=${SINGLETON_OWN4_ETCD_PEER_PORT:-21380}
      export SINGLETON_APISERVER_PORT=${SINGLETON_OWN4_APISERVER_PORT:-21443}
      export SINGLETON_KCM_PORT=${SINGLETON_OWN4_KCM_PORT:-21257}
      export SINGLETON_SCHEDULER_PORT=${SINGLETON_OWN4_SCHEDULER_PORT:-21259}
      export SINGLETON_PG_PORT=${SINGLETON_OWN4_PG_PORT:-21432} ;;
    *) die "SINGLETON_OWN_INSTANCE: $1 is not own, own2, own3 or own4" ;;
  esac
  export SINGLETON_CLUSTER_NAME=$1 SINGLETON_CLUSTER_OWN_PG=1 SINGLETON_PG_NAME=$1
}
# Flags meant for the first cluster (make bench's audit log) are not this one's.
unset SINGLETON_APISERVER_EXTRA_ARGS SINGLETON_KCM_EXTRA_ARGS

down() { "$REPO/hack/cluster.sh" down >/dev/null 2>&1; }

case ${1:-} in
  down)
    for name in ${SINGLETON_OWN_INSTANCE:-own own2 own3 own4}; do
      (instance "$name" && down) || die "could not remove the cluster and PostgreSQL of hack/own-cluster.sh ($name)"
    done
    exit 0 ;;
  run) shift; [ $# -gt 0 ] || die "usage: $0 run CMD..." ;;
  *) die "usage: $0 run CMD... | down" ;;
esac
instance "${SINGLETON_OWN_INSTANCE:-own}"
LOG_TAG=$SINGLETON_CLUSTER_NAME-cluster

need_tool kubectl || exit 1
log "starting a control plane and a PostgreSQL of their own (API server 127.0.0.1:$SINGLETON_APISERVER_PORT, PostgreSQL :$SINGLETON_PG_PORT)"
# Fresh every time: what a killed run left is removed first.
down || true
trap 'down || log "could not remove the own cluster: hack/own-cluster.sh down"' EXIT
trap 'exit 130' INT TERM
"$REPO/hack/cluster.sh" up >&2
eval "$("$REPO/hack/cluster.sh" env)"
kubectl apply --server-side -f "$REPO/crds/" >/dev/null
kubectl wait --for=condition=Established --timeout=60s -f "$REPO/crds/" >/dev/null
log "running $1 on it"
rc=0
"$@" || rc=$?
exit "$rc"
