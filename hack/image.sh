#!/usr/bin/env bash
# Builds the container images without a Docker engine or registry (`make image`): the controller
# image from the release binary, and the billing example's workload image. Each is `from scratch`
# with the binary and exactly the shared libraries it links (glibc, libgcc_s; read with ldd), made
# with buildah (hack/node.sh build-image) and written to .cache/images/<name>.tar (docker-archive),
# then imported into the real node's containerd when it runs (hack/node.sh).
# With each image, its SBOM (CycloneDX 1.5 JSON, .cache/images/<name>.cdx.json): the crates
# linked into its binary (cargo-cyclonedx, no build-only dependencies) and the Debian packages
# its libraries come from (dpkg); and once, the workspace's SBOMs, one per package
# (.cache/images/sbom/<package>.cdx.json, build dependencies included).
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

# cyclonedx <manifest dir> <args...>: cargo-cyclonedx there, dated by the last commit (so the same
# tree gives the same SBOM); it writes its files beside each package's Cargo.toml.
cyclonedx() {
  local dir=$1; shift
  need_tool cargo-cyclonedx || return 1
  SOURCE_DATE_EPOCH=$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || echo 0) \
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
  log "$ref: $OUT/$name.tar ($(du -h "$OUT/$name.tar" | cut -f1), $((SECONDS - t0))s)"
  if "$REPO/hack/node.sh" status >/dev/null 2>&1; then
    "$REPO/hack/node.sh" import "$OUT/$name.tar"
    log "$ref imported into the node's containerd"
  else
    log "the real node is not running: import later with hack/node.sh import $OUT/$name.tar"
  fi
}

mkdir -p "$OUT"
workspace_sbom
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
