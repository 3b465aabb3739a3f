#!/usr/bin/env bash
# Real nodes beside kwok: a kubelet (built like the control plane, hack/build-tools.sh) running pods
# through containerd and runc, on a CNI bridge. Called by hack/cluster.sh up/down/status once the
# API server runs (node 1 only); usable alone too.
#
# Usage: hack/node.sh up|up-second|down|down-second|status|import <archive>|build-image ...
#        hack/node.sh freeze-kubelet|thaw-kubelet <1|2>
#        hack/node.sh ctr|crictl [--node <1|2>] <args...>
#   up      record the host settings a kubelet changes (once), set up the pod bridge, start
#           containerd and the kubelet of node 1, build and import the pause image, wait for the
#           node Ready. A no-op when the node is already Ready.
#   up-second  node 2 beside node 1 (node 1 first, as `up`): its own containerd and kubelet on the
#           same bridge and pod CIDR; imports the pause image and .cache/images/*.tar; waits until
#           Ready and says how long it took. A no-op when node 2 is already Ready. On demand only:
#           `make up` (cluster.sh up) starts node 1 alone.
#   down    stop every pod sandbox, the kubelet and containerd of both nodes, unmount what they
#           mounted, delete the bridge, our iptables chain, all state and the Node objects, and
#           restore the host settings recorded by up.
#   down-second  the same for node 2 alone (its pods, kubelet, containerd, mounts, cgroups, state
#           and Node object); node 1, the bridge and the host settings stay.
#   status  say what runs on both nodes; exit 0 only if node 1 is Ready and node 2 is Ready or
#           was never started.
#   import <docker-archive>  import an image into the containerd (k8s.io namespace) of every
#            running node.
#   build-image <ref> <rootfs dir> <entrypoint json> <user> <out.tar> [NAME=VALUE...]: a `from
#            scratch` image of the dir's contents, with buildah (storage under our state dir), as a
#            docker-archive; each NAME=VALUE is set in the image's environment.
#   freeze-kubelet <1|2>     SIGSTOP that node's kubelet process only: containerd, the shims and the
#            containers keep running, the node stops renewing its Lease and turns NotReady after
#            the controller manager's --node-monitor-grace-period (a partition between the node and
#            the API server). thaw-kubelet <1|2> sends SIGCONT. Both idempotent. `up`, `up-second`
#            and `down` thaw a kubelet left frozen.
#   ctr [--node N] <args...>     containerd's ctr against node N's containerd (default 1).
#   crictl [--node N] <args...>  crictl against node N's containerd (CRI), e.g. `crictl stop -t 0 <id>`.
# Env: SINGLETON_NODE=1|2 picks the node of ctr and crictl when --node is not given.
#
# Node 1 is named singleton-node and labelled singleton.dev/node=real; node 2 is singleton-node-2,
# labelled singleton.dev/node=real-2. Both are tainted singleton.dev/node=real:NoSchedule: only pods
# that tolerate the taint (the real-node tests) land there, everything else stays on kwok's fake
# node; a pod selecting singleton.dev/node=real lands on node 1 only, one that tolerates the key and
# has no selector (or an affinity to both) on either.
# Both nodes share the host: the bridge, its host-local IPAM data (so pod IPs never collide), the
# node IP (the bridge's gateway; the kubelets listen on ports 10250 and 10251, healthz on 10248
# and 10249), and the kubelet's fixed device-plugin socket /var/lib/kubelet/device-plugins/kubelet.sock
# (the last kubelet started owns it; no device plugin is used here). Each has its own containerd
# (state .cache/node or .cache/node-2, /run/singleton-containerd or /run/singleton-containerd-2),
# kubelet root dir, pod logs dir and cgroup root (/singleton-node, /singleton-node-2).
#
# What it changes on the host, all undone by `down` (recorded in .cache/node/host-before):
#   sysctls vm.overcommit_memory, kernel.panic, kernel.panic_on_oops (set by the kubelet),
#   net.ipv4.ip_forward (set by the CNI bridge plugin);
#   iptables chains the kubelet creates (KUBE-*) and ours (SINGLETON-NODE in nat, jumped to from
#   PREROUTING for packets from the pod bridge only); never a global flush;
#   directories the kubelet, containerd and CNI insist on (/var/lib/kubelet, /var/log/containers,
#   /var/log/pods, /run/containerd, /var/lib/cni) when they did not exist before;
#   cgroups under /sys/fs/cgroup/*/singleton-node and /sys/fs/cgroup/*/singleton-node-2; the bridge
#   singleton0; mounts under our dirs.
# Pods reach the API server at the `kubernetes` Service IP (10.96.0.1:443), PostgreSQL at the
# bridge's gateway (10.244.0.1:$SINGLETON_PG_PORT) and MariaDB there too
# (10.244.0.1:$SINGLETON_MARIADB_PORT): all are DNAT-ed to the 127.0.0.1 listeners
# (route_localnet on our bridge only), so nothing listens beyond loopback.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=node
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"

APISERVER_PORT=${SINGLETON_APISERVER_PORT:-26443}
PG_PORT=${SINGLETON_PG_PORT:-25432}
MARIADB_PORT=${SINGLETON_MARIADB_PORT:-23306}
POD_CIDR=10.244.0.0/24
GATEWAY=10.244.0.1
BRIDGE=singleton0
CHAIN=SINGLETON-NODE
KUBERNETES_SERVICE_IP=10.96.0.1
PAUSE_IMAGE=localhost/singleton/pause:3.10

CLUSTER=$REPO/.cache/cluster
PKI=$CLUSTER/pki
# What both nodes share lives with node 1: the host record, the CNI config and IPAM data, the
# pause image's archive and buildah's storage.
SHARED=$REPO/.cache/node
HOST_BEFORE=$SHARED/host-before
CNI_DIR=$SHARED/cni
PAUSE_TAR=$SHARED/pause.tar
SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward)
HOST_DIRS=(/var/lib/kubelet /var/log/containers /var/log/pods /run/containerd /var/lib/cni)

# use_node <1|2>: the per-node names, ports and paths the functions below act on. Node 1's are
# what they were when there was one node.
use_node() {
  case $1 in
    1) NODE_NAME=singleton-node; NODE_LABEL=real; NODE_STATE=$REPO/.cache/node
       RUN=/run/singleton-containerd; CGROUP_ROOT=/singleton-node; KUBELET_PORT=10250; HEALTHZ_PORT=10248 ;;
    2) NODE_NAME=singleton-node-2; NODE_LABEL=real-2; NODE_STATE=$REPO/.cache/node-2
       RUN=/run/singleton-containerd-2; CGROUP_ROOT=/singleton-node-2; KUBELET_PORT=10251; HEALTHZ_PORT=10249 ;;
    *) die "a node is 1 or 2 (got '${1}')" ;;
  esac
  NODE_N=$1
  SOCK=$RUN/containerd.sock
  PIDS=$NODE_STATE/pids
  LOGS=$NODE_STATE/logs
  KUBELET_ROOT=$NODE_STATE/kubelet
}
use_node 1

# Each wrapper obtains its tool (hack/lib.sh need_tool: built and hash-checked on first use in a
# process, a string match after that). ctr and crictl talk to the current node's containerd ($SOCK).
kubectl() { need_tool kubectl || return 1; command kubectl --kubeconfig "$CLUSTER/kubeconfig" "$@"; }
# ctr, without the deprecation warning containerd prints on every call on a cgroup v1 host.
ctr() {
  need_tool ctr || return 1
  command ctr --address "$SOCK" --namespace k8s.io "$@" 2> >(grep -v "DEPRECATION: The support for cgroup v1" >&2)
}
# crictl, the CRI client an operator uses on a node (the chaos suite kills containers with it);
# no /etc/crictl.yaml: the endpoint is given here.
crictl() {
  need_tool crictl || return 1
  command crictl --runtime-endpoint "unix://$SOCK" \
    --image-endpoint "unix://$SOCK" --timeout 10s "$@" 2> >(grep -v 'msg="Config .* does not exist' >&2)
}
pidfile() { echo "$PIDS/$1.pid"; }
logfile() { echo "$LOGS/$1.log"; }

ensure_host_tools() {
  need_tool runc buildah iptables ip6tables gcc ip sysctl pgrep openssl cni-bridge \
    kubelet containerd containerd-shim-runc-v2 ctr crictl kubectl
  # The pause binary is linked statically: glibc's static archive comes with libc6-dev.
  ensure_deb libc6-dev have_static_libc
}
have_static_libc() { [ "$(gcc -print-file-name=libc.a)" != libc.a ]; }

# --- the host, before and after ----------------------------------------------------------------------
chains() { # chains <iptables|ip6tables>: "table chain" for every chain there is
  local t
  for t in filter nat mangle; do "$1" -t "$t" -S 2>/dev/null | awk -v t="$t" '$1 == "-N" { print t, $2 }'; done
}

record_host() {
  [ -s "$HOST_BEFORE" ] && return 0   # the first up records; an up after a crash keeps that record
  mkdir -p "$SHARED"
  local s d
  {
    for s in "${SYSCTLS[@]}"; do echo "sysctl $s $(sysctl -n "$s")"; done
    for d in "${HOST_DIRS[@]}"; do [ -e "$d" ] && echo "dir $d"; done
    chains iptables | sed 's/^/iptables /'
    chains ip6tables | sed 's/^/ip6tables /'
  } > "$HOST_BEFORE.tmp"
  mv "$HOST_BEFORE.tmp" "$HOST_BEFORE"
  log "recorded host settings in $HOST_BEFORE"
}

restore_host() {
  [ -s "$HOST_BEFORE" ] || return 0
  local kind a b cur d ipt t c
  while read -r kind a b; do
    [ "$kind" = sysctl ] || continue
    cur=$(sysctl -n "$a")
    [ "$cur" = "$b" ] || { sysctl -qw "$a=$b"; log "restored $a=$b (was $cur)"; }
  done < "$HOST_BEFORE"
  for d in "${HOST_DIRS[@]}"; do
    grep -qxF "dir $d" "$HOST_BEFORE" && continue
    [ -e "$d" ] || continue
    unmount_under "$d"; rm -rf "$d"; log "removed $d (made by the node)"
  done
  # Chains that exist now but did not before: made by the kubelet (KUBE-*) or by us. Flush then
  # delete each, after removing the jumps to it from the built-in chains.
  for ipt in iptables ip6tables; do
    chains "$ipt" | while read -r t c; do
      grep -qxF "$ipt $t $c" "$HOST_BEFORE" && continue
      "$ipt" -t "$t" -S | awk -v c="$c" '$1 == "-A" && $0 ~ ("-j " c "( |$)") { $1 = "-D"; print }' \
        | while read -r rule; do eval "$ipt -t $t $rule" || true; done
      "$ipt" -t "$t" -F "$c" 2>/dev/null || true
    done
    chains "$ipt" | while read -r t c; do
      grep -qxF "$ipt $t $c" "$HOST_BEFORE" && continue
      "$ipt" -t "$t" -X "$c" 2>/dev/null && log "removed $ipt chain $t/$c"
    done
  done
  rm -f "$HOST_BEFORE"
}

# unmount_under <dir>: every mount at or below dir, deepest first.
unmount_under() {
  local m
  awk -v d="$1" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r \
    | while read -r m; do umount -l "$m" 2>/dev/null || true; done
}

# cgroups: one subtree per v1 hierarchy (and the unified one), removed deepest first.
cgroup_dirs() { local h; for h in /sys/fs/cgroup/*/; do echo "${h%/}$CGROUP_ROOT"; done; }
make_cgroups() { local d; for d in $(cgroup_dirs); do mkdir -p "$d"; done; }
remove_cgroups() {
  local d
  for d in $(cgroup_dirs); do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

# --- network ---------------------------------------------------------------------------------------
setup_network() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$GATEWAY/24" dev "$BRIDGE"
  fi
  ip link set "$BRIDGE" up
  # Packets from pods to 127.0.0.1 (after DNAT) are accepted on this interface only.
  sysctl -qw "net.ipv4.conf.$BRIDGE.route_localnet=1"
  iptables -t nat -N "$CHAIN" 2>/dev/null || iptables -t nat -F "$CHAIN"
  iptables -t nat -C PREROUTING -i "$BRIDGE" -j "$CHAIN" 2>/dev/null \
    || iptables -t nat -A PREROUTING -i "$BRIDGE" -j "$CHAIN"
  iptables -t nat -A "$CHAIN" -d "$KUBERNETES_SERVICE_IP/32" -p tcp --dport 443 \
    -j DNAT --to-destination "127.0.0.1:$APISERVER_PORT"
  iptables -t nat -A "$CHAIN" -d "$GATEWAY/32" -p tcp --dport "$PG_PORT" \
    -j DNAT --to-destination "127.0.0.1:$PG_PORT"
  iptables -t nat -A "$CHAIN" -d "$GATEWAY/32" -p tcp --dport "$MARIADB_PORT" \
    -j DNAT --to-destination "127.0.0.1:$MARIADB_PORT"
  # One network for both nodes: the same bridge, and one host-local IPAM data dir, whose lock
  # serialises the two containerds' allocations (a pod IP is never handed out twice).
  mkdir -p "$CNI_DIR/net.d"
  cat > "$CNI_DIR/net.d/10-singleton.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "singleton",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "isDefaultGateway": true,
      "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$CNI_DIR/ipam",
        "ranges": [[{ "subnet": "$POD_CIDR", "gateway": "$GATEWAY" }]]
      }
    }
  ]
}
EOF
}

teardown_network() {
  if iptables -t nat -S "$CHAIN" >/dev/null 2>&1; then
    iptables -t nat -D PREROUTING -i "$BRIDGE" -j "$CHAIN" 2>/dev/null || true
    iptables -t nat -F "$CHAIN"; iptables -t nat -X "$CHAIN"
  fi
  ip link del "$BRIDGE" 2>/dev/null || true
}

# --- PKI: pre-made certificates signed by the cluster CA (no TLS bootstrap) -------------------------
node_cert() { # node_cert <name> <subject> <extensions>
  (cd "$NODE_STATE/pki"
   openssl genrsa -out "$1.key" 2048 2>/dev/null
   openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
   openssl x509 -req -in "$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
     -CAserial "$NODE_STATE/pki/ca.srl" -days 30 -sha256 -extfile <(printf '%s\n' "$3") -out "$1.crt" 2>/dev/null
   rm -f "$1.csr")
}

ensure_node_pki() {
  mkdir -p "$NODE_STATE/pki"
  # Remade whenever the cluster CA is newer than them (cluster.sh remakes the CA when it expires).
  if [ -s "$NODE_STATE/pki/kubelet.crt" ] && [ "$NODE_STATE/pki/kubelet.crt" -nt "$PKI/ca.crt" ] \
     && openssl x509 -checkend 86400 -noout -in "$NODE_STATE/pki/kubelet.crt" >/dev/null; then
    return 0
  fi
  local leaf="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment"
  # The Node authorizer grants a kubelet what its node's pods need, by this identity.
  node_cert kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME" "$leaf
extendedKeyUsage=clientAuth"
  # The kubelet's serving cert, for the API server's logs/exec/port-forward connections.
  node_cert kubelet "/CN=$NODE_NAME" "$leaf
extendedKeyUsage=serverAuth
subjectAltName=IP:$GATEWAY,IP:127.0.0.1,DNS:$NODE_NAME,DNS:localhost"
  local f=$NODE_STATE/kubelet.kubeconfig
  (umask 077; cat > "$f" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: singleton
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: kubelet
  user:
    client-certificate-data: $(base64 -w0 "$NODE_STATE/pki/kubelet-client.crt")
    client-key-data: $(base64 -w0 "$NODE_STATE/pki/kubelet-client.key")
contexts:
- name: singleton
  context: {cluster: singleton, user: kubelet}
current-context: singleton
EOF
  )
}

# --- containerd ------------------------------------------------------------------------------------
write_containerd_config() {
  mkdir -p "$NODE_STATE/containerd" "$RUN"
  cat > "$NODE_STATE/containerd.toml" <<EOF
version = 3
root = "$NODE_STATE/containerd"
state = "$RUN"
# NRI would open /var/run/nri; nothing here uses it.
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$NODE_STATE/opt"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"

[plugins."io.containerd.cri.v1.runtime"]
  # Root here cannot lower oom_score_adj below its own (nor raise rlimits): clamp instead of fail.
  restrict_oom_score_adj = true
  enable_selinux = false
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        # Debian's runc: crun fails on this host's hybrid cgroups.
        BinaryName = "$(command -v runc)"
        Root = "$RUN/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$CNI_DIR/net.d"
    max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
}

containerd_ready() { ctr version >/dev/null 2>&1; }

start_containerd() {
  pid_alive "$(pidfile containerd)" && containerd_ready && return 0
  write_containerd_config
  log "starting containerd $CONTAINERD_VERSION ($SOCK)"
  : > "$(logfile containerd)"
  # The shim is looked up on PATH (need_tool put it there).
  need_tool containerd-shim-runc-v2
  local bin; bin=$(tool_path containerd)
  # With the test clusters' GC settings (hack/lib.sh CONTROL_PLANE_GOGC), as the kubelet.
  GOGC=$CONTROL_PLANE_GOGC GOMEMLIMIT=$CONTROL_PLANE_GOMEMLIMIT \
    start_daemon "$(pidfile containerd)" "$(logfile containerd)" "$bin" --config "$NODE_STATE/containerd.toml"
  WAIT_PIDFILE=$(pidfile containerd) wait_for "containerd" 60 "$(logfile containerd)" containerd_ready
}

# --- images ----------------------------------------------------------------------------------------
# buildah keeps its storage under our state dir (not /var/lib/containers); node 1's, whichever node
# is being set up.
buildah_() {
  need_tool buildah || return 1
  buildah --root "$SHARED/buildah/storage" --runroot /run/singleton-containerd/buildah \
    --storage-driver vfs "$@"
}

# build_image <ref> <rootfs dir> <entrypoint json> <user> <docker-archive> [NAME=VALUE...]: a
# `from scratch` image holding exactly the rootfs dir, with those variables in its environment,
# written as a docker-archive (`ctr images import` names the image from its RepoTags).
build_image() {
  local ref=$1 rootfs=$2 entry=$3 user=$4 out=$5 c var envs=()
  shift 5
  for var in "$@"; do envs+=(--env "$var"); done
  c=$(buildah_ from scratch)
  buildah_ copy --quiet "$c" "$rootfs/" / >/dev/null
  buildah_ config --entrypoint "$entry" --user "$user" ${envs[@]+"${envs[@]}"} "$c"
  rm -f "$out"
  buildah_ commit --quiet --rm "$c" "docker-archive:$out:$ref" >/dev/null
}

import_image() { # import_image <docker-archive>: unpacked for the CRI's snapshotter (the current node)
  ctr images import --snapshotter overlayfs "$1" >/dev/null
}

# The pause image is built once (kept in $PAUSE_TAR until down) and imported into each node.
ensure_pause_image() {
  ctr images check "name==$PAUSE_IMAGE" 2>/dev/null | grep -q complete && return 0
  if [ ! -s "$PAUSE_TAR" ]; then
    log "building the pause image $PAUSE_IMAGE"
    local work; work=$(mktemp -d "$SHARED/.pause.XXXX")
    mkdir -p "$work/rootfs"
    gcc -static -Os -s -o "$work/rootfs/pause" "$REPO/hack/node/pause.c"
    build_image "$PAUSE_IMAGE" "$work/rootfs" '["/pause"]' 65535:65535 "$work/pause.tar"
    mv "$work/pause.tar" "$PAUSE_TAR"
    rm -rf "$work"
  fi
  import_image "$PAUSE_TAR"
}

# Images built earlier by hack/image.sh (`make image`) come back with a node (down wipes
# containerd's store, and there is no registry to pull them from).
import_cached_images() {
  local tar
  for tar in "$REPO"/.cache/images/*.tar; do
    [ -s "$tar" ] || continue
    import_image "$tar" && log "imported $(basename "$tar") from .cache/images into node $NODE_N"
  done
}

# --- kubelet ---------------------------------------------------------------------------------------
write_kubelet_config() {
  cat > "$NODE_STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This host has hybrid cgroups (v1 controllers): allowed explicitly since 1.35.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
containerRuntimeEndpoint: unix://$SOCK
imageServiceEndpoint: unix://$SOCK
# The node's address is the pod bridge's (a kubelet refuses a loopback node IP): the API server
# reaches the kubelet there for logs and exec, and nothing listens beyond this host.
address: $GATEWAY
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $HEALTHZ_PORT
tlsCertFile: $NODE_STATE/pki/kubelet.crt
tlsPrivateKeyFile: $NODE_STATE/pki/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
registerWithTaints:
- {key: singleton.dev/node, value: real, effect: NoSchedule}
failSwapOn: false
podLogsDir: $NODE_STATE/pod-logs
resolvConf: ""
clusterDomain: cluster.local
maxPods: 30
serializeImagePulls: false
# A shared disk: never evict or garbage-collect images we cannot pull back (no registry).
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
protectKernelDefaults: false
# The Lease is renewed every 5 s (a quarter of its duration; 10 s by default), like kwok's node
# (hack/cluster.sh): a frozen kubelet's node turns NotReady --node-monitor-grace-period after
# its last renewal, give or take the KCM's 5 s monitor period.
nodeLeaseDurationSeconds: 20
EOF
}

node_ready() {
  local s
  # have_tool: `status` on a machine that never built kubectl says "not Ready", building nothing.
  have_tool kubectl || { echo "kubectl not built yet"; return 1; }
  s=$(kubectl get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' \
    --request-timeout=10s 2>/dev/null)
  [ "$s" = True ] || { echo "node $NODE_NAME Ready=${s:-<unset>}"; return 1; }
}

# kubelet_frozen: the current node's kubelet is stopped by a signal (state T in /proc).
kubelet_frozen() {
  local pid
  pid_alive "$(pidfile kubelet)" || return 1
  need_tool ps || return 2
  read -r pid _ < "$(pidfile kubelet)"
  [[ $(ps -o stat= -p "$pid" 2>/dev/null) == T* ]]
}
kubelet_thawed() { ! kubelet_frozen; }

# freeze_kubelet|thaw_kubelet: SIGSTOP/SIGCONT to the kubelet's own PID (not its group: nothing else
# is touched), then wait until /proc says it took effect.
freeze_kubelet() {
  pid_alive "$(pidfile kubelet)" || die "the kubelet of node $NODE_N ($NODE_NAME) is not running"
  local pid; read -r pid _ < "$(pidfile kubelet)"
  if kubelet_frozen; then log "kubelet of $NODE_NAME (pid $pid) already frozen"; return 0; fi
  kill -STOP "$pid"
  wait_for "kubelet pid $pid stopped" 10 - kubelet_frozen
  log "froze the kubelet of $NODE_NAME (pid $pid) at $(date -u +%H:%M:%S.%3N)"
}
thaw_kubelet() {
  pid_alive "$(pidfile kubelet)" || { log "the kubelet of $NODE_NAME is not running: nothing to thaw"; return 0; }
  local pid; read -r pid _ < "$(pidfile kubelet)"
  if ! kubelet_frozen; then log "kubelet of $NODE_NAME (pid $pid) not frozen"; return 0; fi
  kill -CONT "$pid"
  wait_for "kubelet pid $pid running" 10 - kubelet_thawed
  log "thawed the kubelet of $NODE_NAME (pid $pid) at $(date -u +%H:%M:%S.%3N)"
}

start_kubelet() {
  if pid_alive "$(pidfile kubelet)"; then
    kubelet_frozen && thaw_kubelet   # left frozen by a test that could not clean up
    return 0
  fi
  write_kubelet_config
  make_cgroups
  mkdir -p "$KUBELET_ROOT" "$NODE_STATE/pod-logs"
  log "starting kubelet $K8S_VERSION as node $NODE_NAME"
  : > "$(logfile kubelet)"
  local bin; bin=$(tool_path kubelet)
  GOGC=$CONTROL_PLANE_GOGC GOMEMLIMIT=$CONTROL_PLANE_GOMEMLIMIT \
    start_daemon "$(pidfile kubelet)" "$(logfile kubelet)" "$bin" \
    --config="$NODE_STATE/kubelet.yaml" --kubeconfig="$NODE_STATE/kubelet.kubeconfig" \
    --root-dir="$KUBELET_ROOT" --hostname-override="$NODE_NAME" --node-ip="$GATEWAY" \
    --node-labels="singleton.dev/node=$NODE_LABEL" --v=1
}

# --- commands --------------------------------------------------------------------------------------
# One set of real nodes per machine: their ports (10248-10251), bridge, iptables chain and /run
# paths are fixed. Node 1's /run/singleton-containerd/owner names the checkout whose nodes they are;
# another checkout's up (or up-second) refuses, and its down leaves them alone. An owner whose
# containerd no longer runs (its checkout deleted, the machine restored from a snapshot that kept
# /run) is stale: the nodes are taken over, not refused.
OWNER=/run/singleton-containerd/owner
foreign_owner() {
  [ -s "$OWNER" ] || return 1
  local owner
  owner=$(cat "$OWNER")
  [ "$owner" != "$REPO" ] || return 1
  if pid_alive "$owner/.cache/node/pids/containerd.pid"; then return 0; fi
  log "the real node's owner $owner no longer runs it: taking over"
  rm -f "$OWNER"
  return 1
}

cmd_up() {
  use_node 1
  if foreign_owner; then
    die "the real node of $(cat "$OWNER") runs on this machine (one per machine): stop it there" \
      "(hack/cluster.sh down), or set SINGLETON_REAL_NODE=0 for a kwok-only cluster"
  fi
  [ -s "$CLUSTER/kubeconfig" ] || die "no cluster: run hack/cluster.sh up first"
  [ "$(id -u)" = 0 ] || die "the real node needs root (kubelet, containerd, bridge, iptables)"
  mkdir -p "$RUN"; echo "$REPO" > "$OWNER"
  if pid_alive "$(pidfile kubelet)" && pid_alive "$(pidfile containerd)" && ! kubelet_frozen \
     && node_ready >/dev/null; then
    log "node $NODE_NAME already Ready"; return 0
  fi
  ensure_host_tools
  mkdir -p "$PIDS" "$LOGS"
  local t0=$SECONDS
  record_host
  ensure_node_pki
  setup_network
  start_containerd
  ensure_pause_image
  import_cached_images
  start_kubelet
  WAIT_PIDFILE=$(pidfile kubelet) wait_for "node $NODE_NAME Ready" 120 "$(logfile kubelet)" node_ready
  log "node $NODE_NAME ready in $((SECONDS - t0))s"
}

# Node 2 needs node 1's host record, bridge and CNI config: node 1 comes up first (a no-op when Ready).
cmd_up_second() {
  local t0=$SECONDS
  cmd_up
  use_node 2
  if pid_alive "$(pidfile kubelet)" && pid_alive "$(pidfile containerd)" && ! kubelet_frozen \
     && node_ready >/dev/null; then
    log "node $NODE_NAME already Ready"; return 0
  fi
  # cmd_up skips this when node 1 is Ready already; node 2 needs the same tools (a string match
  # when cmd_up obtained them in this process).
  ensure_host_tools
  mkdir -p "$PIDS" "$LOGS" "$RUN"
  ensure_node_pki
  start_containerd
  ensure_pause_image
  import_cached_images
  start_kubelet
  WAIT_PIDFILE=$(pidfile kubelet) wait_for "node $NODE_NAME Ready" 120 "$(logfile kubelet)" node_ready
  log "node $NODE_NAME ready in $((SECONDS - t0))s"
}

# stop_node: the current node's pods, kubelet and containerd, its mounts, cgroups, runtime state
# and Node object. Its logs, certificates and config files stay for reading.
stop_node() {
  [ -d "$NODE_STATE" ] || [ -d "$RUN" ] || return 0
  # A frozen kubelet cannot act on TERM.
  kubelet_frozen && thaw_kubelet
  # Pods first (through the kubelet's runtime, while it still runs), so no shim outlives containerd.
  if pid_alive "$(pidfile containerd)"; then
    stop_pidfile "$(pidfile kubelet)" 20
    # Through the CRI first, so the CNI plugin releases each pod's IP (the IPAM data is shared
    # with the other node), then whatever is left through containerd itself.
    # have_tool: crictl when it is built (ensure_host_tools builds it), never a build during down.
    if have_tool crictl; then crictl rmp --all --force >/dev/null 2>&1 || true; fi
    local t
    for t in $(ctr tasks list -q 2>/dev/null); do ctr tasks kill -s KILL "$t" >/dev/null 2>&1 || true; done
    sleep 1
    for t in $(ctr tasks list -q 2>/dev/null); do ctr tasks delete -f "$t" >/dev/null 2>&1 || true; done
    for t in $(ctr containers list -q 2>/dev/null); do ctr containers delete "$t" >/dev/null 2>&1 || true; done
  fi
  stop_pidfile "$(pidfile kubelet)" 20
  stop_pidfile "$(pidfile containerd)" 20
  # Shims whose containerd is gone: ours are the ones started with our socket.
  local pid
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $SOCK( |$)" || true); do kill -KILL "$pid" 2>/dev/null || true; done
  unmount_under "$RUN"
  unmount_under "$NODE_STATE"
  remove_cgroups
  rm -rf "$RUN" "$KUBELET_ROOT" "$NODE_STATE/containerd" "$NODE_STATE/pod-logs" "$NODE_STATE/opt" "$PIDS"
  # The API object goes with the cluster (cluster.sh down wipes etcd); delete it when the API lives on.
  [ -s "$CLUSTER/kubeconfig" ] && have_tool kubectl && kubectl delete node "$NODE_NAME" --ignore-not-found --request-timeout=5s >/dev/null 2>&1 || true
  log "node $NODE_NAME down"
}

cmd_down() {
  if foreign_owner; then
    log "the real node here belongs to $(cat "$OWNER"): left alone"; return 0
  fi
  use_node 2; stop_node
  use_node 1; stop_node
  teardown_network
  restore_host
  rm -rf "$CNI_DIR" "$SHARED/buildah" "$PAUSE_TAR"
  log "nodes down, host restored"
}

status_node() { # the current node's lines; fails if it is not healthy
  local rc=0 c f pid state
  for c in containerd kubelet; do
    f=$(pidfile "$c")
    if pid_alive "$f"; then
      read -r pid _ < "$f"; state=running
      [ "$c" = kubelet ] && kubelet_frozen && { state=frozen; rc=1; }
      printf '%-24s %-8s pid %s\n' "$c${1:+ (node $NODE_N)}" "$state" "$pid"
    else printf '%-24s stopped\n' "$c${1:+ (node $NODE_N)}"; rc=1; fi
  done
  if node_ready >/dev/null 2>&1; then printf '%-24s Ready\n' "node $NODE_NAME"
  else printf '%-24s not Ready\n' "node $NODE_NAME"; rc=1; fi
  return $rc
}

cmd_status() {
  local rc=0
  use_node 1; status_node || rc=1
  use_node 2
  if [ -s "$(pidfile containerd)" ] || [ -s "$(pidfile kubelet)" ]; then status_node 2 || rc=1
  else printf '%-24s not started (hack/node.sh up-second)\n' "node $NODE_NAME"; fi
  return $rc
}

# import into every node whose containerd runs.
cmd_import() {
  local n done=0
  for n in 1 2; do
    use_node "$n"
    pid_alive "$(pidfile containerd)" && containerd_ready || continue
    import_image "$1"; done=$((done + 1))
  done
  [ $done -gt 0 ] || die "no node's containerd runs (hack/node.sh up)"
}

# node_arg <args...>: `--node N` in front of a ctr/crictl command line picks the node (else
# $SINGLETON_NODE, else 1); sets ARGS to the rest.
node_arg() {
  local n=${SINGLETON_NODE:-1}
  if [ "${1:-}" = --node ]; then n=${2:-}; shift 2 || true
  elif [[ ${1:-} == --node=* ]]; then n=${1#--node=}; shift; fi
  use_node "$n"
  ARGS=("$@")
}

case ${1:-} in
  up) cmd_up ;;
  up-second) cmd_up_second ;;
  down) cmd_down ;;
  down-second)
    if foreign_owner; then log "the real nodes here belong to $(cat "$OWNER"): left alone"; exit 0; fi
    use_node 2; stop_node ;;
  status) cmd_status ;;
  import) [ -s "${2:-}" ] || die "usage: $0 import <docker-archive>"; cmd_import "$2" ;;
  build-image) [ $# -ge 6 ] || die "usage: $0 build-image <ref> <rootfs> <entrypoint json> <user> <out> [NAME=VALUE...]"
    mkdir -p "$SHARED" /run/singleton-containerd; shift; build_image "$@" ;;
  freeze-kubelet|thaw-kubelet) [ $# = 2 ] || die "usage: $0 $1 <1|2>"
    use_node "$2"; if [ "$1" = freeze-kubelet ]; then freeze_kubelet; else thaw_kubelet; fi ;;
  ctr) shift; node_arg "$@"; ctr ${ARGS[@]+"${ARGS[@]}"} ;;
  crictl) shift; node_arg "$@"; crictl ${ARGS[@]+"${ARGS[@]}"} ;;
  *) sed -n '2,/^set -euo/{/^#/p}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
