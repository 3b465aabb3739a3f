#!/usr/bin/env bash
# Builds the control-plane binaries from the Go module proxy (no Docker, no release downloads) and
# caches them outside the repo. Idempotent: a tool whose versioned directory is complete is reused.
#
# Supply chain: each tool is built from a module committed under hack/tools/<tool>/ (go.mod and
# go.sum), with -mod=readonly, so every dependency is the version and the bytes (go.sum) that were
# reviewed. Builds are reproducible (-trimpath, no VCS stamp, CGO off, fixed ldflags), so
# hack/tools/SHA256SUMS records the hash of each binary for the Go version named in its first
# line: a fresh build must match it before it enters the cache, and a cached binary is checked
# against it every time it is about to be used (a corrupted or replaced cache entry is refused).
#
# Usage: hack/build-tools.sh [tool ...]        build (or verify) these tools (default: all); a
#                                              tool:bin,... hashes only those binaries of the tool
#                                              (hack/lib.sh need_tool: what the caller will run)
#        hack/build-tools.sh pin tool ...      after bumping a version in hack/versions.sh:
#                                              regenerate hack/tools/<tool>/, build, record hashes
#        hack/build-tools.sh verify [tool ...] check cached binaries only (no build)
#
# Scripts do not call this directly for a tool they run: they call need_tool (hack/lib.sh) or
# hack/tool.sh, which call this and put the tool on PATH. A build says what it builds and how long
# it usually takes, then every minute how far it got; nothing is printed when the tool is cached.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=SCRIPTDIR/lib.sh
. "$here/lib.sh"   # versions.sh, and ensure_deb (log and die are this script's own, below)

export GOFLAGS=-buildvcs=false CGO_ENABLED=0
log() { printf '[build-tools] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
command -v go >/dev/null 2>&1 \
  || die "go is missing: Go >= 1.26 is a prerequisite (README.md, Prerequisites)"

# quiet <cmd...>: hides the chatter of a successful step, shows it all when the step fails.
quiet() {
  local out
  out=$("$@" 2>&1) || { printf '%s\n' "$out" >&2; log "failed: $*"; return 1; }
}

# Work dirs of builds in flight; removed on any exit, so a failed build leaves no litter behind.
WORKDIRS=()
trap 'rm -rf "${WORKDIRS[@]}"' EXIT
newwork() { mktemp -d "$TOOLS_DIR/.$1-work.XXXX"; }

# --- progress ---------------------------------------------------------------------------------------
# usual <tool>: how long its build usually takes on this project's 2-core machine with Go's build
# and module caches empty, in the order `make demo` builds them (each reusing what the earlier ones
# compiled). Measured there while other builds shared the cores (README.md, "Measured"), so an idle
# machine is faster.
usual() {
  case $1 in
    etcd) echo "~1 min" ;;
    kubernetes) echo "~17 min" ;;
    kwok) echo "~5 min" ;;
    kubelet) echo "~4 min" ;;
    containerd) echo "~2 min" ;;
    crictl) echo "~2 min" ;;
    helm) echo "~5 min" ;;
    promtool) echo "~6 min" ;;
    cargo-deny) echo "~5 min" ;;
    cargo-cyclonedx) echo "~2 min" ;;
    shfmt) echo "~1 min" ;;
    cyclonedx-gomod) echo "~3 min" ;;
    cyclonedx-bom) echo "~1 min" ;;
    *) echo "a few minutes" ;;
  esac
}
fmt_secs() { if [ "$1" -ge 60 ]; then printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); else printf '%ds' "$1"; fi; }

# building <tool> <version>: announces a build and starts its clock; built <tool>: its time.
building() {
  BUILD_T0=$SECONDS BUILD_UNITS=
  log "building $1 $2: usually $(usual "$1") on 2 cores from nothing, less with Go's build cache warm; progress every minute"
}
built() { log "built $1 in $(fmt_secs $((SECONDS - BUILD_T0)))${BUILD_UNITS:+ ($BUILD_UNITS)}"; }

# units <packages|crates> <output file>: how many a build compiled so far: `go build -v` names each
# package it compiles (those in Go's build cache are not), cargo says "Compiling" per crate.
units() {
  case $1 in
    packages) grep -cvE '^#|[[:space:]]' "$2" || true ;;
    crates) grep -cE '^[[:space:]]*Compiling ' "$2" || true ;;
  esac
}

# watch_build <tool> <packages|crates> <total or ''> <cmd...>: runs a build in the background, its
# output in a file, saying every minute how long it has run and how much it compiled; the output
# is shown only when the build fails.
watch_build() {
  local tool=$1 unit=$2 total=$3 out pid rc=0 next=$((SECONDS + 60)); shift 3
  out=$(mktemp "$TOOLS_DIR/.$tool-out.XXXX"); WORKDIRS+=("$out")
  "$@" >"$out" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    [ $SECONDS -ge $next ] || continue
    next=$((SECONDS + 60))
    log "  $tool: $(fmt_secs $((SECONDS - BUILD_T0))) so far (usually $(usual "$tool")), $(units "$unit" "$out")${total:+ of $total} $unit compiled"
  done
  wait "$pid" || rc=$?
  if [ "$rc" != 0 ]; then cat "$out" >&2; log "failed: $tool ($*)"; return "$rc"; fi
  BUILD_UNITS="$(units "$unit" "$out")${total:+ of $total} $unit compiled, the rest from Go's build cache"
  [ "$unit" = packages ] || BUILD_UNITS="$(units "$unit" "$out") $unit compiled"
}

# gobuild <tool> <module dir> <output> <ldflags> <tags> <package...>: `go build -v -mod=readonly
# -trimpath` in the module dir, watched. The packages it needs are listed first (on a fresh machine
# that is when their modules are downloaded), which gives the progress its total.
gobuild() {
  local tool=$1 dir=$2 out=$3 ld=$4 tags=$5 total t0=$SECONDS; shift 5
  # Quiet (a fresh machine's "go: downloading" lines); a failure shows again in the build below.
  total=$(cd "$dir" && go list -mod=readonly -tags "$tags" -deps "$@" 2>/dev/null | wc -l) || total=
  [ "${total:-0}" -gt 0 ] || total=
  [ $((SECONDS - t0)) -lt 10 ] || log "  $tool: modules fetched and ${total:-its} packages listed in $(fmt_secs $((SECONDS - t0)))"
  watch_build "$tool" packages "$total" \
    gocmd "$dir" build -v -mod=readonly -trimpath -tags "$tags" -ldflags "$ld" -o "$out" "$@"
}
gocmd() { local dir=$1; shift; cd "$dir" && exec go "$@"; }

# Runs a build into a temporary dir and moves it into place only when complete, so an interrupted
# build never leaves a half-filled cache entry that later runs would trust.
finish() { # finish <tmpdir> <destdir>
  rm -rf "$2"; mkdir -p "$(dirname "$2")"; mv "$1" "$2"
}

MODS=$here/tools
SUMS=$MODS/SHA256SUMS
TOOLCHAIN="$(go env GOVERSION) $(go env GOOS)/$(go env GOARCH)"
# The toolchain the committed hashes were made with ("# go1.26.8 linux/amd64").
pinned_toolchain() { sed -n '1s/^# //p' "$SUMS" 2>/dev/null; }
MODE=build

# expected <path relative to TOOLS_DIR>: the committed hash, if it applies to this toolchain.
expected() {
  [ "$(pinned_toolchain)" = "$TOOLCHAIN" ] || return 0
  awk -v f="$1" '$2 == f { print $1 }' "$SUMS"
}

# check <dir> <name...>: every binary matches its committed hash (or, with another toolchain than
# the one the hashes were made with, the hash recorded when it was built). Returns 1 on mismatch.
# With ONLY set (tool:bin,... on the command line) only those binaries are hashed: the ones the
# caller is about to run (kubectl alone need not cost the hashing of kube-apiserver).
ONLY=
check() {
  local dir=$1 rel f want got; shift
  for f in "$@"; do
    rel=$(basename "$dir")/$f
    [ -x "$dir/$f" ] || return 1
    [ -z "$ONLY" ] || [[ ",$ONLY," == *",$f,"* ]] || continue
    got=$(sha256sum "$dir/$f" | cut -d' ' -f1)
    want=$(expected "$rel")
    [ -n "$want" ] || want=$(awk -v f="$f" '$2 == f { print $1 }' "$dir/.sha256" 2>/dev/null)
    if [ -z "$want" ]; then
      log "$rel: no recorded hash (built by an older build-tools.sh?); rebuilding"; return 1
    fi
    if [ "$got" != "$want" ]; then
      log "$rel: sha256 $got, expected $want"; return 1
    fi
  done
}

# ready <dest> <name...>: the cached tool is complete and verified. A mismatch is never used: in
# verify mode it fails, otherwise the entry is rebuilt (and the rebuild must match).
ready() {
  local dest=$1; shift
  [ "$MODE" != pin ] || return 1   # pinning always rebuilds from the new module
  local f; for f in "$@"; do [ -e "$dest/$f" ] || { [ "$MODE" != verify ] || die "$dest/$f missing"; return 1; }; done
  check "$dest" "$@" && return 0
  [ "$MODE" != verify ] || die "$dest does not match hack/tools/SHA256SUMS: delete it and run make tools"
  log "$dest does not match its recorded hashes: rebuilding it"; return 1
}

# seal <bin dir> <cache dir name> <name...>: records the build's hashes, and (pin mode) commits
# them to SHA256SUMS, else requires them to equal the committed ones.
seal() {
  local bin=$1 name=$2 f got want; shift 2
  : > "$bin/.sha256"
  for f in "$@"; do
    got=$(sha256sum "$bin/$f" | cut -d' ' -f1)
    printf '%s  %s\n' "$got" "$f" >> "$bin/.sha256"
    if [ "$MODE" = pin ]; then
      record "$name/$f" "$got"
    else
      want=$(expected "$name/$f")
      if [ -n "$want" ] && [ "$got" != "$want" ]; then
        die "$name/$f built with sha256 $got, but hack/tools/SHA256SUMS says $want: the build is not the reviewed one"
      fi
    fi
  done
  [ "$(pinned_toolchain)" = "$TOOLCHAIN" ] || [ "$MODE" = pin ] \
    || log "$name: hashes in hack/tools/SHA256SUMS are for $(pinned_toolchain), this is $TOOLCHAIN: checked against this build's own record only"
}

record() { # record <path> <hash>: replaces the path's line in SHA256SUMS
  local tmp; tmp=$(mktemp)
  touch "$SUMS"
  { echo "# $TOOLCHAIN"; sed '1{/^#/d}' "$SUMS" | awk -v f="$1" '$2 != f'; printf '%s  %s\n' "$2" "$1"; } \
    | { read -r head; echo "$head"; sort -k2; } > "$tmp"
  mv "$tmp" "$SUMS"
}

# module <tool> <module> <version>: the committed module directory, checked to pin this version.
module() {
  local dir=$MODS/$1
  [ -s "$dir/go.mod" ] && [ -s "$dir/go.sum" ] \
    || die "hack/tools/$1 is missing: run hack/build-tools.sh pin $1"
  grep -qE "^[[:space:]]*(require )?$2 $3\$" "$dir/go.mod" \
    || die "hack/tools/$1/go.mod does not require $2 $3 (hack/versions.sh): run hack/build-tools.sh pin $1"
  echo "$dir"
}

# Pin mode: (re)generate hack/tools/<tool>/ from scratch: a module that depends on the tool at the
# version of hack/versions.sh, resolved by the go command and written down in go.mod and go.sum.
fresh_module() { # fresh_module <tool> <module path>
  [ "$MODE" = pin ] || return 0
  rm -rf "${MODS:?}/$1"; mkdir -p "$MODS/$1"
  (cd "$MODS/$1" && go mod init "$2" >/dev/null 2>&1)
}

build_k8s() {
  local dest bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  dest=$(tool_dir kubernetes)
  ready "$dest" "${bins[@]}" && return 0
  building kubernetes "$K8S_VERSION"
  local work; work=$(newwork k8s); WORKDIRS+=("$work")
  mkdir -p "$work/bin"
  if [ "$MODE" = pin ]; then
    fresh_module k8s singleton.dev/k8s-tools
    # k8s.io/kubernetes replaces its staging modules with local paths; a consumer must replace
    # each with the published v0.X.Y. The list is read from the pinned go.mod so it never goes stale.
    (cd "$MODS/k8s"
     go mod download -json "k8s.io/kubernetes@$K8S_VERSION" > "$work/dl.json"
     gomod=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["GoMod"])' "$work/dl.json")
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
     go get "k8s.io/kubernetes@$K8S_VERSION" >/dev/null)
  fi
  local mod; mod=$(module k8s k8s.io/kubernetes "$K8S_VERSION")
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local ld="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  gobuild kubernetes "$mod" "$work/bin/" "$ld" "" \
     k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
     k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
  seal "$work/bin" "kubernetes-$K8S_VERSION" "${bins[@]}"
  finish "$work/bin" "$dest"; rm -rf "$work"
  built kubernetes
}

# The real node's kubelet: same k8s.io/kubernetes version, the same staging replaces and version
# ldflags as the control plane, but its own module (hack/tools/kubelet) so its extra dependencies
# (cadvisor, CRI streaming, ...) never move the control plane's pinned build.
build_kubelet() {
  local dest; dest=$(tool_dir kubelet)
  ready "$dest" kubelet && return 0
  building kubelet "$K8S_VERSION"
  local work; work=$(newwork kubelet); WORKDIRS+=("$work")
  mkdir -p "$work/bin"
  if [ "$MODE" = pin ]; then
    fresh_module kubelet singleton.dev/kubelet-tool
    (cd "$MODS/kubelet"
     go mod download -json "k8s.io/kubernetes@$K8S_VERSION" > "$work/dl.json"
     gomod=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["GoMod"])' "$work/dl.json")
     {
       echo "require k8s.io/kubernetes $K8S_VERSION"
       grep -E '^\s*k8s\.io/[^ ]+ => \./staging/' "$gomod" | awk -v v="$K8S_STAGING_VERSION" '{print "replace " $1 " => " $1 " " v}'
     } >> go.mod
     printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kubelet"\n' > tools.go
     go mod tidy -e >/dev/null 2>&1 || true
     go get "k8s.io/kubernetes@$K8S_VERSION" >/dev/null)
  fi
  local mod; mod=$(module kubelet k8s.io/kubernetes "$K8S_VERSION")
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local ld="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  gobuild kubelet "$mod" "$work/bin/kubelet" "$ld" "" k8s.io/kubernetes/cmd/kubelet
  seal "$work/bin" "kubelet-$K8S_VERSION" kubelet
  finish "$work/bin" "$dest"; rm -rf "$work"
  built kubelet
}

# The real node's container runtime: containerd, its runc shim and ctr (image import), from the
# containerd/v2 module. btrfs (cgo) is left out: the node uses the overlayfs snapshotter.
build_containerd() {
  local dest bins=(containerd containerd-shim-runc-v2 ctr)
  dest=$(tool_dir containerd)
  ready "$dest" "${bins[@]}" && return 0
  building containerd "$CONTAINERD_VERSION"
  local work; work=$(newwork containerd); WORKDIRS+=("$work")
  mkdir -p "$work/bin"
  if [ "$MODE" = pin ]; then
    fresh_module containerd singleton.dev/containerd-tool
    (cd "$MODS/containerd"
     printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "github.com/containerd/containerd/v2/cmd/containerd"\n\t_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"\n\t_ "github.com/containerd/containerd/v2/cmd/ctr"\n)\n' > tools.go
     quiet go get "github.com/containerd/containerd/v2@$CONTAINERD_VERSION"
     go mod tidy -e >/dev/null 2>&1 || true)
  fi
  local mod; mod=$(module containerd github.com/containerd/containerd/v2 "$CONTAINERD_VERSION")
  local v=github.com/containerd/containerd/v2/version
  gobuild containerd "$mod" "$work/bin/" \
     "-s -w -X $v.Version=$CONTAINERD_VERSION -X $v.Package=github.com/containerd/containerd/v2" no_btrfs \
     github.com/containerd/containerd/v2/cmd/containerd \
     github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr
  seal "$work/bin" "containerd-$CONTAINERD_VERSION" "${bins[@]}"
  finish "$work/bin" "$dest"; rm -rf "$work"
  built containerd
}

build_etcd() {
  local dest; dest=$(tool_dir etcd)
  ready "$dest" etcd && return 0
  building etcd "$ETCD_VERSION"
  local work; work=$(newwork etcd); WORKDIRS+=("$work")
  mkdir -p "$work/bin"
  if [ "$MODE" = pin ]; then
    fresh_module etcd singleton.dev/etcd
    # etcd's own main package lives in a module that is awkward to consume; a three-line
    # wrapper around server/v3's etcdmain builds the same server.
    (cd "$MODS/etcd"
     cat > main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
     quiet go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
     go mod tidy >/dev/null)
  fi
  local mod; mod=$(module etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION")
  gobuild etcd "$mod" "$work/bin/etcd" "-s -w" "" .
  seal "$work/bin" "etcd-$ETCD_VERSION" etcd
  finish "$work/bin" "$dest"; rm -rf "$work"
  built etcd
}

build_simple() { # build_simple <name> <module> <version> <package> [extra ldflags]
  local name=$1 module=$2 version=$3 pkg=$4 ldextra=${5:-}
  local dest; dest=$(tool_dir "$name")
  ready "$dest" "$name" && return 0
  building "$name" "$version"
  local work; work=$(newwork "$name"); WORKDIRS+=("$work")
  mkdir -p "$work/bin"
  if [ "$MODE" = pin ]; then
    fresh_module "$name" "singleton.dev/$name-tool"
    (cd "$MODS/$name"
     printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$pkg" > tools.go
     quiet go get "$module@$version"
     go mod tidy -e >/dev/null 2>&1 || true)
  fi
  local mod; mod=$(module "$name" "$module" "$version")
  gobuild "$name" "$mod" "$work/bin/$name" "-s -w $ldextra" "" "$pkg"
  seal "$work/bin" "$name-$version" "$name"
  finish "$work/bin" "$dest"; rm -rf "$work"
  built "$name"
}

# build_crate <crate> <version>: a cargo tool from crates.io (cargo-deny, cargo-cyclonedx).
# `--locked` builds the dependency versions of its own Cargo.lock, each checked against the
# registry's checksum. Not reproducible across machines like the Go tools, so it is checked
# against the hash recorded when it was built, not a committed one.
build_crate() {
  local name=$1 version=$2 dest; dest=$(tool_dir "$name")
  ready "$dest" "$name" && return 0
  [ "$MODE" != pin ] || die "$name is pinned by its version and Cargo.lock; nothing to pin"
  building "$name" "$version"
  local work; work=$(newwork "$name"); WORKDIRS+=("$work")
  watch_build "$name" crates "" cargo install --locked "$name" --version "=$version" \
    --root "$work/root" --target-dir "$work/target"
  mkdir -p "$work/bin"; mv "$work/root/bin/$name" "$work/bin/"
  seal "$work/bin" "$name-$version" "$name"
  finish "$work/bin" "$dest"; rm -rf "$work"
  built "$name"
}

# build_pip <package> <version> <program> <module>: a Python tool from PyPI (cyclonedx-bom), in a
# venv of Debian's /usr/bin/python3 (the interpreter of the Python image it describes). Installed
# from hack/tools/<package>/requirements.txt, which pins every distribution with the sha256 of its
# wheel for that interpreter (pip --require-hashes: the role go.sum has for a Go tool; `pin`
# regenerates it from pip's resolution). <program> is a launcher running `python -I -m <module>` of
# the venv: isolated from the caller's PYTHON* variables, which are for the interpreter the tool
# inspects. The launcher is hashed when built, like the crates (the venv's files are checked by
# pip when it installs them, not at each use).
PIP_PYTHON=/usr/bin/python3
build_pip() {
  local name=$1 version=$2 prog=$3 pymod=$4 dest req=$MODS/$1/requirements.txt
  dest=$(tool_dir "$name")
  ready "$dest" "$prog" && return 0
  # Its venv needs venv and ensurepip: Debian's python3-venv, which a fresh machine lacks.
  ensure_deb python3-venv "$PIP_PYTHON" -m ensurepip --version
  building "$name" "$version"
  local work; work=$(newwork "$name"); WORKDIRS+=("$work")
  if [ "$MODE" = pin ]; then
    mkdir -p "$MODS/$name"
    quiet "$PIP_PYTHON" -m venv "$work/pin"
    quiet "$work/pin/bin/python" -m pip install -q --dry-run --ignore-installed --only-binary :all: \
      --report "$work/report.json" "$name==$version"
    "$PIP_PYTHON" - "$work/report.json" "$name" "$version" > "$work/requirements.txt" <<'PY'
import json, platform, sys
report, name, version = sys.argv[1:]
print(f"# {name} {version} and its dependencies as pip resolved them for {sys.executable} "
      f"{platform.python_version()} {platform.machine()}: hack/build-tools.sh pin {name}")
for item in sorted(json.load(open(report))["install"], key=lambda i: i["metadata"]["name"].lower()):
    info = item["download_info"].get("archive_info", {})
    sha = info.get("hashes", {}).get("sha256") or info.get("hash", "").partition("sha256=")[2]
    if not sha:
        sys.exit(f"pip's report has no sha256 for {item['metadata']['name']}")
    print(f"{item['metadata']['name']}=={item['metadata']['version']} --hash=sha256:{sha}")
PY
    mv "$work/requirements.txt" "$req"
  fi
  [ -s "$req" ] || die "hack/tools/$name/requirements.txt is missing: run hack/build-tools.sh pin $name"
  awk -v want="$name==$version" 'tolower($1) == tolower(want) { found = 1 } END { exit !found }' "$req" \
    || die "hack/tools/$name/requirements.txt does not pin $name $version (hack/versions.sh): run hack/build-tools.sh pin $name"
  mkdir -p "$work/bin"
  quiet "$PIP_PYTHON" -m venv "$work/bin/venv"
  quiet "$work/bin/venv/bin/python" -m pip install -q --require-hashes --only-binary :all: -r "$req"
  quiet "$work/bin/venv/bin/python" -m pip check
  cat > "$work/bin/$prog" <<SH
#!/bin/sh
# $name $version (hack/build-tools.sh): its venv, beside this launcher.
exec "\$(dirname "\$0")/venv/bin/python" -I -m $pymod "\$@"
SH
  chmod 0755 "$work/bin/$prog"
  # The venv's own scripts name the work dir it is built in, not where it moves: only the
  # launcher runs it.
  "$work/bin/$prog" --version >/dev/null || die "$name: $prog does not run"
  # Recorded beside it, never in SHA256SUMS (not a Go build), also when pinning.
  MODE=build seal "$work/bin" "$name-$version" "$prog"
  finish "$work/bin" "$dest"; rm -rf "$work"
  "$dest/$prog" --version >/dev/null || die "$name: $prog does not run from $dest"
  built "$name"
}

# The kwok binary embeds no stages unless run through kwokctl, so the fake node needs a stage config.
# Take kwokctl's defaults from the same module version (node "fast" init + heartbeat-with-lease, pod
# "fast" ready/complete/delete) so they can never drift from the binary that interprets them.
kwok_stages() {
  local dest; dest=$(tool_dir kwok)/stages.yaml
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
case ${1:-} in
  pin) MODE=pin; shift; [ $# -gt 0 ] || die "pin which tool? (etcd kubernetes kubelet containerd crictl kwok helm promtool shfmt cyclonedx-gomod cyclonedx-bom)" ;;
  verify) MODE=verify; shift ;;
esac
tools=("$@"); [ ${#tools[@]} -gt 0 ] || tools=(etcd kubernetes kubelet containerd crictl kwok helm promtool cargo-deny cargo-cyclonedx shfmt cyclonedx-gomod cyclonedx-bom)
for t in "${tools[@]}"; do
  ONLY=
  if [[ $t == *:* ]]; then ONLY=${t#*:}; t=${t%%:*}; fi
  case $t in
    kubernetes) build_k8s ;;
    kubelet) build_kubelet ;;
    containerd) build_containerd ;;
    # The CRI client the chaos suite kills the real node's containers with, as an operator would.
    crictl) build_simple crictl sigs.k8s.io/cri-tools "$CRICTL_VERSION" sigs.k8s.io/cri-tools/cmd/crictl \
      "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" ;;
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
    cargo-deny) build_crate cargo-deny "$CARGO_DENY_VERSION" ;;
    cargo-cyclonedx) build_crate cargo-cyclonedx "$CARGO_CYCLONEDX_VERSION" ;;
    # The shell parser of the tool-use check (hack/tool-uses-test.sh): its syntax tree as JSON.
    shfmt) build_simple shfmt mvdan.cc/sh/v3 "$SHFMT_VERSION" mvdan.cc/sh/v3/cmd/shfmt ;;
    # The Go image's SBOM (hack/image.sh): the modules its main package links (app mode).
    cyclonedx-gomod) build_simple cyclonedx-gomod github.com/CycloneDX/cyclonedx-gomod \
      "$CYCLONEDX_GOMOD_VERSION" github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod ;;
    # The Python image's SBOM (hack/image.sh): the distributions of the venv it stages.
    cyclonedx-bom) build_pip cyclonedx-bom "$CYCLONEDX_BOM_VERSION" cyclonedx-py cyclonedx_py ;;
    *) log "unknown tool $t"; exit 2 ;;
  esac
done
