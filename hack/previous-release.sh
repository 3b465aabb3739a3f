#!/usr/bin/env bash
# The previous release (hack/previous-release), built from the repository's own history for the
# upgrade tests (e2e/tests/upgrade.rs) and cached like the other tools, so it builds once per
# machine: its controller binary (debug profile, as the e2e tests' own), its chart and its CRDs,
# in $SINGLETON_CACHE/tools/previous-release-<tag>-<commit>/. The sources come from `git
# archive` of the commit (never the work tree); cargo builds them with the release's own
# Cargo.lock (--locked), in a target dir kept beside the cache entry so that the next release's
# build reuses the compiled dependencies.
#
# A cache entry records the binary's SHA-256 when it is built and is checked against it on every
# use, as the Go tools are (hack/build-tools.sh): a corrupted or replaced entry is refused and
# rebuilt. Unlike the Go tools the hash is not committed: a Rust build depends on the toolchain
# and the build path, so it is only reproducible on one machine.
#
# Usage: hack/previous-release.sh build [NAME]   print the entry's directory, building it first
#                                               if needed (NAME: a line of hack/previous-release;
#                                               default the first, the previous release)
#        hack/previous-release.sh env            both builds the tests use, built if needed, as
#                                               exports for eval (SINGLETON_PREVIOUS_RELEASE,
#                                               SINGLETON_OLDER_SCHEMA)
#        hack/previous-release.sh tag            print the previous release's tag
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=previous-release
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"

read -r TAG COMMIT < <(grep -v '^#' "$REPO/hack/previous-release" |
  awk -v n="${2:-}" 'NF && (n == "" || $1 == n) { print; exit }')
[ -n "${TAG:-}" ] && [ -n "${COMMIT:-}" ] || die "hack/previous-release names no ${2:-tag} and commit"

# The commit must be in this clone; a tag of that name must name it (a moved tag is not the
# release the file says).
check_commit() {
  git -C "$REPO" cat-file -e "$COMMIT^{commit}" 2>/dev/null ||
    die "commit $COMMIT ($TAG) is not in this clone (a shallow clone? git fetch --unshallow)"
  local tagged
  if tagged=$(git -C "$REPO" rev-parse -q --verify "refs/tags/$TAG^{commit}" 2>/dev/null); then
    [ "$tagged" = "$COMMIT" ] ||
      die "tag $TAG names $tagged, hack/previous-release says $COMMIT: fix one of them"
  fi
}

DIR=$TOOLS_DIR/previous-release-$TAG-${COMMIT:0:12}
# Its dependencies, compiled once and reused by later releases' builds.
TARGET_DIR=$TOOLS_DIR/.previous-release-target
SRC=$TOOLS_DIR/.previous-release-src

verified() {
  [ -f "$DIR/.complete" ] && (cd "$DIR" && sha256sum --quiet -c SHA256SUMS >/dev/null 2>&1)
}

build() {
  check_commit
  if verified; then
    echo "$DIR"
    return
  fi
  [ ! -e "$DIR" ] || {
    log "cache entry $DIR failed its check: rebuilding it"
    rm -rf "$DIR"
  }
  local t0=$SECONDS work
  log "building the previous release $TAG ($COMMIT) from this repository's history: usually $(cargo_usual debug) on 2 cores the first time, about 1 min with its dependencies compiled; cargo's progress follows"
  mkdir -p "$TOOLS_DIR"
  work=$(mktemp -d "$TOOLS_DIR/.previous-release-work.XXXX")
  trap 'rm -rf "$work"' EXIT
  # One source path for every release: cargo's fingerprints of the dependencies then hold.
  rm -rf "$SRC"
  mkdir -p "$SRC"
  # -m: the files dated now, not at their commit: cargo judges the sources by mtime, and an
  # older commit's files would look older than the last entry's build, which it would reuse.
  git -C "$REPO" archive --format=tar "$COMMIT" | tar -x -m -C "$SRC"
  (cd "$SRC" && CARGO_TARGET_DIR=$TARGET_DIR cargo build --locked -p singleton-controller \
    --bin singleton-controller) || die "the build of $TAG failed"
  cp "$TARGET_DIR/debug/singleton-controller" "$work/singleton-controller"
  cp -r "$SRC/charts/singleton-controller" "$work/chart"
  cp -r "$SRC/crds" "$work/crds"
  printf '%s %s\n' "$TAG" "$COMMIT" >"$work/RELEASE"
  (cd "$work" && sha256sum singleton-controller RELEASE >SHA256SUMS)
  touch "$work/.complete"
  rm -rf "$DIR"
  mv "$work" "$DIR"
  trap - EXIT
  log "built $TAG in $((SECONDS - t0))s: $DIR"
  echo "$DIR"
}

case ${1:-} in
  build) build ;;
  env)
    # What the tests read: the previous release, and the last build with the previous backstop
    # schema (e2e/tests/upgrade.rs, the mixed-versions chaos row).
    echo "export SINGLETON_PREVIOUS_RELEASE=$("$0" build)"
    echo "export SINGLETON_OLDER_SCHEMA=$("$0" build schema-6)"
    ;;
  tag) echo "$TAG" ;;
  *)
    sed -n '2,/^set -euo/{/^#/p}' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
