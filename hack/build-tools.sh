#!/usr/bin/env bash
# Builds the control-plane binaries from the Go module proxy (no Docker, no release downloads) and
# caches them outside the repo. Idempotent: a tool whose versioned directory is complete is reused.
# Usage: hack/build-tools.sh [tool ...]   (default: all)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=SCRIPTDIR/versions.sh
. "$here/versions.sh"

export GOFLAGS=-buildvcs=false CGO_ENABLED=0
log() { printf '[build-tools] %s\n' "$*" >&2; }

# quiet <cmd...>: hides the chatter of a successful step, shows it all when the step fails.
quiet() {
  local out
  out=$("$@" 2>&1) || { printf '%s\n' "$out" >&2; log "failed: $*"; return 1; }
}

# Work dirs of builds in flight; removed on any exit, so a failed build leaves no litter behind.
WORKDIRS=()
trap 'rm -rf "${WORKDIRS[@]}"' EXIT
newwork() { mktemp -d "$TOOLS_DIR/.$1-work.XXXX"; }

# Runs a build into a temporary dir and moves it into place only when complete, so an interrupted
# build never leaves a half-filled cache entry that later runs would trust.
finish() { # finish <tmpdir> <destdir>
  rm -rf "$2"; mkdir -p "$(dirname "$2")"; mv "$1" "$2"
}

build_k8s() {
  local dest=$TOOLS_DIR/kubernetes-$K8S_VERSION
  [ -x "$dest/kube-apiserver" ] && [ -x "$dest/kubectl" ] && [ -x "$dest/kube-controller-manager" ] \
    && [ -x "$dest/kube-scheduler" ] && return 0
  log "building kubernetes $K8S_VERSION (cold: tens of minutes on 2 cores)"
  local work; work=$(newwork k8s); WORKDIRS+=("$work")
  mkdir -p "$work/mod" "$work/bin"
  # k8s.io/kubernetes replaces its staging modules with local paths; a consumer must replace each
  # with the published v0.X.Y. The list is read from the pinned go.mod so it never goes stale.
  (cd "$work/mod" && go mod init singleton.dev/k8s-tools >/dev/null 2>&1
   go mod download -json "k8s.io/kubernetes@$K8S_VERSION" > dl.json
   gomod=$(python3 -c 'import json,sys;print(json.load(open("dl.json"))["GoMod"])')
   {
     echo "require k8s.io/kubernetes $K8S_VERSION"
     grep -E '^\s*k8s\.io/[^ ]+ => \./staging/' "$gomod" | awk -v v="$K8S_STAGING_VERSION" '{print "replace " $1 " => " $1 " " v}'
   } >> go.mod
   cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubectl/pkg/cmd"
)
GO
   go mod tidy -e >/dev/null 2>&1 || true
   go get "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
   local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
   local ld="-s -w"
   for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
     ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
   done
   go build -trimpath -ldflags "$ld" -o "$work/bin/" \
     k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
     k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
  finish "$work/bin" "$dest"; rm -rf "$work"
}

build_etcd() {
  local dest=$TOOLS_DIR/etcd-$ETCD_VERSION
  [ -x "$dest/etcd" ] && return 0
  log "building etcd $ETCD_VERSION"
  local work; work=$(newwork etcd); WORKDIRS+=("$work")
  mkdir -p "$work/mod" "$work/bin"
  # etcd's own main package lives in a module that is awkward to consume; a three-line wrapper
  # around server/v3's etcdmain builds the same server.
  (cd "$work/mod" && go mod init singleton.dev/etcd >/dev/null 2>&1
   cat > main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
   quiet go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
   go mod tidy >/dev/null
   go build -trimpath -ldflags "-s -w" -o "$work/bin/etcd" .)
  finish "$work/bin" "$dest"; rm -rf "$work"
}

build_simple() { # build_simple <name> <module> <version> <package> [extra ldflags]
  local name=$1 module=$2 version=$3 pkg=$4 ldextra=${5:-}
  local dest=$TOOLS_DIR/$name-$version
  [ -x "$dest/$name" ] && return 0
  log "building $name $version"
  local work; work=$(newwork "$name"); WORKDIRS+=("$work")
  mkdir -p "$work/mod" "$work/bin"
  (cd "$work/mod" && go mod init "singleton.dev/$name-tool" >/dev/null 2>&1
   printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$pkg" > tools.go
   quiet go get "$module@$version"
   go mod tidy -e >/dev/null 2>&1 || true
   go build -trimpath -ldflags "-s -w $ldextra" -o "$work/bin/$name" "$pkg")
  finish "$work/bin" "$dest"; rm -rf "$work"
}

# The kwok binary embeds no stages unless run through kwokctl, so the fake node needs a stage config.
# Take kwokctl's defaults from the same module version (node "fast" init + heartbeat-with-lease, pod
# "fast" ready/complete/delete) so they can never drift from the binary that interprets them.
kwok_stages() {
  local dest=$TOOLS_DIR/kwok-$KWOK_VERSION/stages.yaml
  [ -s "$dest" ] && return 0
  local dir f
  dir=$(cd "$TOOLS_DIR" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" \
    | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
  for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
           pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    echo "---"; cat "$dir/kustomize/stage/$f.yaml"
  done > "$dest.tmp"
  mv "$dest.tmp" "$dest"
}

mkdir -p "$TOOLS_DIR"
tools=("$@"); [ ${#tools[@]} -gt 0 ] || tools=(etcd kubernetes kwok helm promtool)
for t in "${tools[@]}"; do
  case $t in
    kubernetes) build_k8s ;;
    etcd) build_etcd ;;
    kwok) build_simple kwok sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok; kwok_stages ;;
    # Helm's own Makefile stamps the full version; without it `helm version` says only "v4.3".
    helm) build_simple helm helm.sh/helm/v4 "$HELM_VERSION" helm.sh/helm/v4/cmd/helm \
      "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" ;;
    # Prometheus' Go module v0.MNN.P is release M.NN.P (v0.316.0 is 3.16.0, its VERSION file);
    # promu stamps that into `promtool --version`, so do the same.
    promtool) m=${PROMTOOL_VERSION#v0.}; m=${m%%.*}
      build_simple promtool github.com/prometheus/prometheus "$PROMTOOL_VERSION" \
      github.com/prometheus/prometheus/cmd/promtool \
      "-X github.com/prometheus/common/version.Version=$((m / 100)).$((m % 100)).${PROMTOOL_VERSION##*.}" ;;
    *) log "unknown tool $t"; exit 2 ;;
  esac
done
