# shellcheck shell=bash disable=SC2034  # sourced: the variables are used by the caller
# Pinned versions of everything the local control plane is built from.
# Bumping one of these rebuilds that tool on the next `make up` (the cache key includes the version);
# for the Go-built tools run `hack/build-tools.sh pin <tool>` after the bump and commit hack/tools/
# (the tool's go.mod and go.sum, and the new hashes in hack/tools/SHA256SUMS).
K8S_VERSION=v1.37.2          # kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
K8S_STAGING_VERSION=v0.37.2  # k8s.io/* staging modules matching K8S_VERSION
ETCD_VERSION=v3.6.16         # go.etcd.io/etcd/server/v3
HELM_VERSION=v4.3.2          # helm.sh/helm/v4
CONTAINERD_VERSION=v2.4.2   # github.com/containerd/containerd/v2 (real node runtime, with its runc shim and ctr)
CRICTL_VERSION=v1.37.0       # sigs.k8s.io/cri-tools (crictl: the chaos suite's container kill on the real node)
KWOK_VERSION=v0.8.0          # sigs.k8s.io/kwok (fake node)
PROMTOOL_VERSION=v0.316.0    # github.com/prometheus/prometheus/cmd/promtool (Prometheus 3.16.0): alert rule tests
CARGO_DENY_VERSION=0.20.2    # crates.io cargo-deny: license, ban, source and advisory checks (make lint)
CARGO_CYCLONEDX_VERSION=0.5.9  # crates.io cargo-cyclonedx: the CycloneDX SBOMs of make image
SHFMT_VERSION=v3.14.1        # mvdan.cc/sh/v3 (shfmt): parses hack/*.sh for the tool-use check (make lint)
CYCLONEDX_GOMOD_VERSION=v1.10.0  # github.com/CycloneDX/cyclonedx-gomod: the Go image's SBOM (make image)
CYCLONEDX_BOM_VERSION=7.5.0  # PyPI cyclonedx-bom (cyclonedx-py): the Python image's SBOM (make image)

# Where built tools, cluster state and logs live: outside the repo, reused across clones.
SINGLETON_CACHE=${SINGLETON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/singleton-controller}
TOOLS_DIR=$SINGLETON_CACHE/tools

# tool_dir <tool>: the cache directory of a tool hack/build-tools.sh builds (its binaries inside).
# The version is part of the name, so a bump never reuses the old build.
tool_dir() {
  case $1 in
    kubernetes) echo "$TOOLS_DIR/kubernetes-$K8S_VERSION" ;;
    kubelet) echo "$TOOLS_DIR/kubelet-$K8S_VERSION" ;;
    etcd) echo "$TOOLS_DIR/etcd-$ETCD_VERSION" ;;
    containerd) echo "$TOOLS_DIR/containerd-$CONTAINERD_VERSION" ;;
    crictl) echo "$TOOLS_DIR/crictl-$CRICTL_VERSION" ;;
    kwok) echo "$TOOLS_DIR/kwok-$KWOK_VERSION" ;;
    helm) echo "$TOOLS_DIR/helm-$HELM_VERSION" ;;
    promtool) echo "$TOOLS_DIR/promtool-$PROMTOOL_VERSION" ;;
    cargo-deny) echo "$TOOLS_DIR/cargo-deny-$CARGO_DENY_VERSION" ;;
    cargo-cyclonedx) echo "$TOOLS_DIR/cargo-cyclonedx-$CARGO_CYCLONEDX_VERSION" ;;
    shfmt) echo "$TOOLS_DIR/shfmt-$SHFMT_VERSION" ;;
    cyclonedx-gomod) echo "$TOOLS_DIR/cyclonedx-gomod-$CYCLONEDX_GOMOD_VERSION" ;;
    cyclonedx-bom) echo "$TOOLS_DIR/cyclonedx-bom-$CYCLONEDX_BOM_VERSION" ;;
    *) echo "tool_dir: unknown tool $1" >&2; return 1 ;;
  esac
}
