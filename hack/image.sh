#!/usr/bin/env bash
# Builds the container images without a Docker engine or registry (`make image`): the controller
# image from the release binary, and the billing example's workload image. Each is `from scratch`
# with the binary and exactly the shared libraries it links (glibc, libgcc_s; read with ldd), made
# with buildah (hack/node.sh build-image) and written to .cache/images/<name>.tar (docker-archive),
# then imported into the real node's containerd when it runs (hack/node.sh).
# The Dockerfile stays for users with Docker (docs/install.md); hack/image-context.sh proves its
# build context compiles.
#
# Usage: hack/image.sh [controller|workload]...   (default: both)
# Env:   SINGLETON_IMAGE_PROFILE  cargo profile of the binaries (release; `dev` for a quick try)
#        CARGO_TARGET_DIR         where cargo builds (default: target/)
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

# stage <rootfs> <binary> <path in image>: the binary and every library ldd resolves for it, at
# the same paths (the dynamic loader's included), so the image needs no base.
stage() {
  local root=$1 bin=$2 dest=$3 lib
  install -D -m 0755 "$bin" "$root$dest"
  ldd "$bin" | awk '/=> \// { print $3 } /^\t\// { print $1 }' | while read -r lib; do
    install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
  done
  # Fails here, not in a pod, if something is missing: run it inside the staged root (the loader
  # exits 127 on a missing library; the binary's own usage errors are below 126).
  local rc=0
  chroot "$root" "$dest" --help >/dev/null 2>&1 || rc=$?
  [ "$rc" -lt 126 ] || die "$dest does not run inside its image root (exit $rc)"
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
  rm -rf "$root"
  log "$ref: $OUT/$name.tar ($(du -h "$OUT/$name.tar" | cut -f1), $((SECONDS - t0))s)"
  if "$REPO/hack/node.sh" status >/dev/null 2>&1; then
    "$REPO/hack/node.sh" import "$OUT/$name.tar"
    log "$ref imported into the node's containerd"
  else
    log "the real node is not running: import later with hack/node.sh import $OUT/$name.tar"
  fi
}

mkdir -p "$OUT"
targets=("$@"); [ ${#targets[@]} -gt 0 ] || targets=(controller workload)
for t in "${targets[@]}"; do
  case $t in
    controller) build singleton-controller singleton-controller "$CONTROLLER_IMAGE" \
      /usr/local/bin/singleton-controller controller ;;
    workload) build billing-workload billing-workload "$WORKLOAD_IMAGE" \
      /usr/local/bin/billing-workload billing-workload ;;
    *) die "unknown image $t (controller, workload)" ;;
  esac
done
