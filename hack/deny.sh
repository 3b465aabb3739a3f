#!/usr/bin/env bash
# cargo-deny over the workspace (deny.toml): licenses, bans (duplicate versions, wildcards) and
# sources, offline; then the RustSec advisories, whose database cargo-deny fetches from
# github.com. A database that cannot be read fails the check with a message that says so (a
# supply-chain check that passes without checking would hide exactly what it is for), unless
# SINGLETON_ADVISORIES=skip says to skip it (a machine without access to github.com, like CI's:
# .ci/run sets it). Run by `make lint`.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=deny
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"
cd "$REPO"
deny=$(tool_path cargo-deny)
mode=${SINGLETON_ADVISORIES:-require}
case $mode in
  require | skip) ;;
  *) die "SINGLETON_ADVISORIES is require (the default) or skip (got '$mode')" ;;
esac

# cargo-deny reads the metadata of every target's dependencies (windows-sys and the like), whose
# sources a Linux build never downloads, and --offline refuses to fetch them: fetch them first,
# checked against Cargo.lock (a no-op once they are in cargo's cache).
cargo fetch --locked -q
"$deny" --offline check licenses bans sources
if [ "$mode" = skip ]; then
  echo "advisories: NOT CHECKED, skipped on request (SINGLETON_ADVISORIES=skip): no RustSec advisory was looked up" >&2
  exit 0
fi

out=$(mktemp); trap 'rm -f "$out"' EXIT
rc=0
timeout 120 "$deny" check advisories >"$out" 2>&1 || rc=$?
cat "$out"
if [ "$rc" -ne 0 ] && grep -q "failed to fetch advisory database" "$out"; then
  why=$(grep -o 'Could not resolve host: [^ ]*' "$out" | head -n1 || true)
  cat >&2 <<MSG
advisories: NOT CHECKED: the RustSec advisory database (github.com/rustsec/advisory-db) cannot be
fetched from here${why:+ ($why)}. Fix the network, or skip the check knowingly on a machine
without access to github.com:
  SINGLETON_ADVISORIES=skip make lint
MSG
fi
exit "$rc"
