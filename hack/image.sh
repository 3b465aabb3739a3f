#!/usr/bin/env bash
# Builds the container images without a Docker engine or registry (`make image`): the controller
# image from the release binary, and the billing example's workload images, in Rust
# (examples/billing/workload), Go (examples/billing/go) and Python (examples/billing/python). Each
# is `from scratch` with the binary and exactly the shared libraries it links (glibc, libgcc_s;
# read with ldd; none for Go's static binary), made with buildah (hack/node.sh build-image) and
# written to .cache/images/<name>.tar (docker-archive), then imported into the real node's
# containerd when it runs (hack/node.sh). The Python image holds the machine's interpreter
# (Debian's /usr/bin/python3), its standard library and the site-packages of a venv built for it
# (examples/billing/python/venv.sh: psycopg[binary] and the fence library), with the libraries
# ldd finds for the interpreter and every extension module.
# With each image, its SBOM (CycloneDX 1.5 JSON, .cache/images/<name>.cdx.json; the image is the
# described component): for a Rust image the crates linked into its binary (cargo-cyclonedx, no
# build-only dependencies) and the Debian packages its libraries come from (dpkg); for the Go
# image the modules linked into its static binary and Go's standard library (cyclonedx-gomod),
# no Debian package; for the Python image the distributions of its site-packages (cyclonedx-py:
# psycopg, psycopg-binary, the fence library, their dependencies) and the Debian package of every
# file outside /app (the interpreter, its standard library, the libraries). hack/sbom-image.py
# merges each. And once, when a Rust image is built, the workspace's SBOMs, one per package
# (.cache/images/sbom/<package>.cdx.json, build dependencies included). The Go binary and the
# Python venv stay under SINGLETON_CACHE (below): e2e/tests/sbom.rs checks the SBOMs against them.
# The Dockerfile stays for users with Docker (docs/install.md); hack/image-context.sh proves its
# build context compiles.
#
# Usage: hack/image.sh [controller|workload|workload-go|workload-python]...   (default: all)
# Env:   SINGLETON_IMAGE_PROFILE  cargo profile of the Rust binaries (release; `dev` for a quick try)
#        CARGO_TARGET_DIR         where cargo builds (default: target/)
#        SINGLETON_CACHE          the Go modules, build cache and binary, and the Python venv and
#                                 pip cache, under $SINGLETON_CACHE/examples/<go|python> (default
#                                 ~/.cache/singleton-controller), as examples/billing/*/test.sh
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=image
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"

PROFILE=${SINGLETON_IMAGE_PROFILE:-release}
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
OUT=$REPO/.cache/images
VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$REPO/Cargo.toml")
# The names the chart and the e2e tests use (imagePullPolicy Never: there is no registry).
CONTROLLER_IMAGE=localhost/singleton/singleton-controller:$VERSION
WORKLOAD_IMAGE=localhost/singleton/billing-workload:$VERSION
GO_WORKLOAD_IMAGE=localhost/singleton/billing-workload-go:$VERSION
PYTHON_WORKLOAD_IMAGE=localhost/singleton/billing-workload-python:$VERSION
EXAMPLES_CACHE=${SINGLETON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/singleton-controller}/examples

# stage_libs <rootfs> <file>...: every library ldd resolves for the files, at the same paths in
# the root (the dynamic loader's included), so the image needs no base. A static binary has none
# (ldd fails on it); a library found inside the root itself (one a wheel bundles) stays where it is.
stage_libs() {
  local root=$1 file lib; shift
  for file in "$@"; do
    ldd "$file" >/dev/null 2>&1 || continue
    ldd "$file" | awk '/=> \// { print $3 } /^\t\// { print $1 }'
  done | sort -u | while read -r lib; do
    case $lib in "$root"/*) continue ;; esac
    install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
  done
}

# stage <rootfs> <binary> <path in image>: the binary and the libraries it links (stage_libs).
stage() {
  local root=$1 bin=$2 dest=$3
  install -D -m 0755 "$bin" "$root$dest"
  stage_libs "$root" "$bin"
  # Fails here, not in a pod, if something is missing: run it inside the staged root (the loader
  # exits 127 on a missing library; the binary's own usage errors are below 126).
  local rc=0
  chroot "$root" "$dest" --help >/dev/null 2>&1 || rc=$?
  [ "$rc" -lt 126 ] || die "$dest does not run inside its image root (exit $rc)"
}

# sbom_epoch: the date of the SBOMs, the last commit's (so the same tree gives the same SBOM).
sbom_epoch() { git -C "$REPO" log -1 --format=%ct 2>/dev/null || echo 0; }

# cyclonedx <manifest dir> <args...>: cargo-cyclonedx there, dated by the last commit; it writes
# its files beside each package's Cargo.toml.
cyclonedx() {
  local dir=$1; shift
  need_tool cargo-cyclonedx || return 1
  SOURCE_DATE_EPOCH=$(sbom_epoch) \
    cargo-cyclonedx cyclonedx --manifest-path "$dir/Cargo.toml" --format json --spec-version 1.5 -q "$@"
}

# workspace_sbom: every workspace package's SBOM, moved out of the source tree into $OUT/sbom.
workspace_sbom() {
  cyclonedx "$REPO"
  mkdir -p "$OUT/sbom"
  local f
  for f in $(cd "$REPO" && git ls-files -co --exclude-standard '*Cargo.toml' | sed 's|Cargo.toml$||'); do
    for j in "$REPO/$f"*.cdx.json; do
      [ -e "$j" ] && mv "$j" "$OUT/sbom/"
    done
  done
  log "workspace SBOMs: $OUT/sbom/ ($(ls "$OUT/sbom" | wc -l) packages)"
}

# image_sbom <package> <binary> <ref> <rootfs> <path in image> <out>: the image's SBOM: its
# binary's crates, and a component per Debian package of the libraries staged beside it.
image_sbom() {
  local pkg=$1 bin=$2 ref=$3 root=$4 dest=$5 out=$6 dir lib file owner debs=()
  dir=$(cd "$REPO" && cargo metadata --no-deps --format-version 1 --locked | python3 -c '
import json, sys
m = json.load(sys.stdin)
print(next(p["manifest_path"] for p in m["packages"] if p["name"] == sys.argv[1]).rsplit("/", 1)[0])' "$pkg")
  cyclonedx "$dir" --describe binaries --no-build-deps
  file="$dir/${bin}_bin.cdx.json"
  [ -s "$file" ] || die "cargo-cyclonedx wrote no $file"
  while read -r lib; do
    # Debian knows a library by the path it installed (/lib or /usr/lib after the /usr merge).
    owner=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null) \
      || die "no Debian package owns $lib, which the image of $bin holds"
    debs+=("$owner")
  done < <(cd "$root" && find . -type f ! -path ".$dest" | sed 's|^\.||' | sort)
  printf '%s\n' "${debs[@]}" | cut -d: -f1,2 | sort -u | while IFS=: read -r name arch; do
    printf '%s\t%s\t%s\n' "$name" "${arch%% *}" "$(dpkg-query -W -f '${Version}' "$name:${arch%% *}")"
  done | python3 "$REPO/hack/sbom-image.py" "$file" "$ref" > "$out"
  find "$(dirname "$file")" -maxdepth 1 -name '*_bin.cdx.json' -delete
  log "$ref: SBOM $out ($(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["components"]))' "$out") components)"
}

build() { # build <package> <binary> <ref> <path in image> <archive name>
  local pkg=$1 bin=$2 ref=$3 dest=$4 name=$5 dir=release
  [ "$PROFILE" = dev ] && dir=debug
  local t0=$SECONDS
  # The first build compiles the dependencies too (cargo's progress follows); later ones take seconds.
  if [ -x "$TARGET/$dir/$bin" ]; then
    log "cargo build --profile $PROFILE -p $pkg --bin $bin"
  else
    log "building $bin (Rust, $PROFILE profile, for its image): usually $(cargo_usual "$dir") on 2 cores from nothing (cargo build --profile $PROFILE -p $pkg)"
  fi
  (cd "$REPO" && cargo build --locked --profile "$PROFILE" -p "$pkg" --bin "$bin")
  local root; root=$(mktemp -d "$OUT/.rootfs.XXXX")
  stage "$root" "$TARGET/$dir/$bin" "$dest"
  # 65532: the distroless "nonroot" user the chart's securityContext and the Dockerfile use.
  "$REPO/hack/node.sh" build-image "$ref" "$root" "[\"$dest\"]" 65532:65532 "$OUT/$name.tar"
  image_sbom "$pkg" "$bin" "$ref" "$root" "$dest" "$OUT/$name.cdx.json"
  rm -rf "$root"
  publish "$ref" "$name" "$t0"
}

# publish <ref> <archive name> <start>: says what was built, and imports it into the real node.
publish() {
  local ref=$1 name=$2 t0=$3
  log "$ref: $OUT/$name.tar ($(du -h "$OUT/$name.tar" | cut -f1), $((SECONDS - t0))s)"
  if "$REPO/hack/node.sh" status >/dev/null 2>&1; then
    "$REPO/hack/node.sh" import "$OUT/$name.tar"
    log "$ref imported into the node's containerd"
  else
    log "the real node is not running: import later with hack/node.sh import $OUT/$name.tar"
  fi
}

# build_go <ref> <path in image> <archive name>: examples/billing/go, a static binary
# (CGO_ENABLED=0), alone in its image. Go is a prerequisite: the machine's (GOTOOLCHAIN=local),
# the modules as go.sum pins them. The binary stays at $EXAMPLES_CACHE/go/bin/billing-workload.
build_go() {
  local ref=$1 dest=$2 name=$3 t0=$SECONDS cache=$EXAMPLES_CACHE/go root
  log "go build of examples/billing/go (static, CGO_ENABLED=0)"
  (cd "$REPO/examples/billing/go" &&
    GOMODCACHE=$cache/mod GOCACHE=$cache/build GOTOOLCHAIN=local GOFLAGS=-mod=readonly \
      CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$cache/bin/billing-workload" .)
  root=$(mktemp -d "$OUT/.rootfs.XXXX")
  # shellcheck disable=SC2064 # the path now: a failed check in stage exits the script
  trap "rm -rf '$root'" EXIT
  stage "$root" "$cache/bin/billing-workload" "$dest"
  "$REPO/hack/node.sh" build-image "$ref" "$root" "[\"$dest\"]" 65532:65532 "$OUT/$name.tar"
  rm -rf "$root"
  go_sbom "$ref" "$OUT/$name.cdx.json"
  publish "$ref" "$name" "$t0"
}

# go_sbom <ref> <out>: the Go image's SBOM: the modules the binary links, each at the version
# go.sum pins (the fence library, a directory of this repository, at the pseudo-version of the last
# commit), and Go's standard library (std@<go version>), from cyclonedx-gomod's `app` mode, which
# lists the main package's dependencies under build_go's environment as `go build` selects them;
# the binary is static, so no Debian package. Not dated by the tool: by the last commit, like the
# Rust ones.
go_sbom() {
  local ref=$1 out=$2 cache=$EXAMPLES_CACHE/go tmp
  need_tool cyclonedx-gomod || return 1
  tmp=$(mktemp "$OUT/.go-sbom.XXXX")
  (cd "$REPO/examples/billing/go" &&
    GOMODCACHE=$cache/mod GOCACHE=$cache/build GOTOOLCHAIN=local GOFLAGS=-mod=readonly \
      CGO_ENABLED=0 cyclonedx-gomod app -json -output-version 1.5 -std -noserial -notimestamp \
      -output "$tmp" .) || { rm -f "$tmp"; die "cyclonedx-gomod failed on examples/billing/go"; }
  SOURCE_DATE_EPOCH=$(sbom_epoch) python3 "$REPO/hack/sbom-image.py" --static "$tmp" "$ref" > "$out" ||
    { rm -f "$tmp" "$out"; die "hack/sbom-image.py failed for $ref"; }
  rm -f "$tmp"
  log "$ref: SBOM $out ($(sbom_count "$out"))"
}

# sbom_count <SBOM>: how many components it lists, by purl type.
sbom_count() {
  python3 -c 'import collections, json, sys
c = json.load(open(sys.argv[1]))["components"]
n = collections.Counter(x["purl"].split("/")[0][4:] if "purl" in x else "without purl" for x in c)
print(len(c), "components:", ", ".join(f"{v} {k}" for k, v in sorted(n.items())))' "$1"
}

# The Python image's interpreter: Debian's, whose libraries dpkg and ldd account for (a pyenv or
# python.org build elsewhere on PATH would bring libraries from wherever it was built).
PYTHON=/usr/bin/python3
# Its environment: the interpreter's prefix, and the workload's package and site-packages.
PYTHON_ENV=(PYTHONHOME=/usr PYTHONPATH=/app:/app/site-packages PYTHONDONTWRITEBYTECODE=1
  PYTHONUNBUFFERED=1 PSYCOPG_IMPL=binary)

# stage_python <rootfs>: the interpreter at /usr/bin/python3, its standard library (without
# config-*, libpython's static archive for embedding, and the regression tests), the site-packages
# of a venv built for it (without pip and setuptools, which the run never imports) at
# /app/site-packages, the workload's package at /app/billing_workload, and the libraries ldd
# resolves for the interpreter and every extension module.
stage_python() {
  local root=$1 venv=$EXAMPLES_CACHE/python/venv-image stdlib site files
  chmod 0755 "$root" # mktemp's 0700 would keep the image's user out of the check below
  ensure_deb python3-venv "$PYTHON" -m ensurepip --version
  [ -x "$PYTHON" ] && dpkg -S "$(readlink -f "$PYTHON")" >/dev/null 2>&1 ||
    die "$PYTHON is missing or not Debian's (package python3-minimal): the Python image stages it"
  PIP_CACHE_DIR=$EXAMPLES_CACHE/python/pip "$REPO/examples/billing/python/venv.sh" "$PYTHON" "$venv"
  stdlib=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  install -D -m 0755 "$(readlink -f "$PYTHON")" "$root/usr/bin/python3"
  mkdir -p "$root$stdlib" "$root/app/site-packages"
  tar -C "$stdlib" --exclude='./config-*' --exclude=./test -cf - . | tar -C "$root$stdlib" -xf -
  tar -C "$site" --exclude='./pip' --exclude='./pip-*' --exclude='./setuptools' \
    --exclude='./setuptools-*' --exclude=./_distutils_hack --exclude=./pkg_resources \
    --exclude=./distutils-precedence.pth -cf - . | tar -C "$root/app/site-packages" -xf -
  cp -R "$REPO/examples/billing/python/billing_workload" "$root/app/"
  find "$root/app/billing_workload" -name __pycache__ -prune -exec rm -rf {} +
  "$PYTHON" -m compileall -q -d /app/billing_workload "$root/app/billing_workload" >/dev/null
  mapfile -t files < <(find "$root" -type f \( -name '*.so' -o -name '*.so.*' \))
  stage_libs "$root" "$root/usr/bin/python3" "${files[@]}"
  # Fails here, not in a pod: the workload and every module it needs load inside the root, as the
  # image's user; psycopg uses its binary libpq.
  local check=(env -i "${PYTHON_ENV[@]}" "$(command -v chroot)" --userspec=65532:65532 "$root"
    /usr/bin/python3)
  "${check[@]}" -P -m billing_workload --help >/dev/null ||
    die "the Python workload does not run inside its image root"
  "${check[@]}" -c 'import psycopg, singleton_fence, billing_workload, ssl, decimal, zoneinfo
assert psycopg.pq.__impl__ == "binary", psycopg.pq.__impl__' ||
    die "the Python workload's modules do not load inside its image root"
}

build_python() { # build_python <ref> <archive name>
  local ref=$1 name=$2 t0=$SECONDS root
  log "staging Debian's $PYTHON, its stdlib and a venv for it (examples/billing/python/venv.sh)"
  root=$(mktemp -d "$OUT/.rootfs.XXXX")
  # shellcheck disable=SC2064 # the path now: a failed check below exits the script
  trap "rm -rf '$root'" EXIT
  stage_python "$root"
  "$REPO/hack/node.sh" build-image "$ref" "$root" '["/usr/bin/python3", "-P", "-m", "billing_workload"]' \
    65532:65532 "$OUT/$name.tar" "${PYTHON_ENV[@]}"
  python_sbom "$ref" "$root" "$OUT/$name.cdx.json"
  rm -rf "$root"
  publish "$ref" "$name" "$t0"
}

# python_sbom <ref> <rootfs> <out>: the Python image's SBOM, from its staged root: the
# distributions its interpreter finds (cyclonedx-py `environment`, run on the root's interpreter
# with the image's PYTHONHOME and PYTHONPATH moved into the root, -S: the image has no site
# directory, and the machine's user site is not the image's), so the venv's pip and setuptools,
# which are not staged, are not listed; and the Debian package of every file outside /app (the
# interpreter, its standard library, the libraries staged), read from dpkg by hack/sbom-image.py.
# The workload itself (/app/billing_workload) is the application, at the image's version.
python_sbom() {
  local ref=$1 root=$2 out=$3 tmp
  need_tool cyclonedx-py || return 1
  tmp=$(mktemp "$OUT/.python-sbom.XXXX")
  PYTHONHOME=$root/usr PYTHONPATH=$root/app:$root/app/site-packages PYTHONDONTWRITEBYTECODE=1 \
    cyclonedx-py environment -S --sv 1.5 --of JSON --output-reproducible -o "$tmp" "$root/usr/bin/python3" ||
    { rm -f "$tmp"; die "cyclonedx-py failed on the Python image's root"; }
  SOURCE_DATE_EPOCH=$(sbom_epoch) python3 "$REPO/hack/sbom-image.py" "$tmp" "$ref" \
    --app billing_workload "$VERSION" --pypi-local --root "$root" --skip /app > "$out" ||
    { rm -f "$tmp" "$out"; die "hack/sbom-image.py failed for $ref"; }
  rm -f "$tmp"
  log "$ref: SBOM $out ($(sbom_count "$out"))"
}

mkdir -p "$OUT"
targets=("$@"); [ ${#targets[@]} -gt 0 ] || targets=(controller workload workload-go workload-python)
case " ${targets[*]} " in *" controller "* | *" workload "*) workspace_sbom ;; esac
for t in "${targets[@]}"; do
  case $t in
    controller) build singleton-controller singleton-controller "$CONTROLLER_IMAGE" \
      /usr/local/bin/singleton-controller controller ;;
    workload) build billing-workload billing-workload "$WORKLOAD_IMAGE" \
      /usr/local/bin/billing-workload billing-workload ;;
    workload-go) build_go "$GO_WORKLOAD_IMAGE" /usr/local/bin/billing-workload billing-workload-go ;;
    workload-python) build_python "$PYTHON_WORKLOAD_IMAGE" billing-workload-python ;;
    *) die "unknown image $t (controller, workload, workload-go, workload-python)" ;;
  esac
done
