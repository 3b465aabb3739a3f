#!/usr/bin/env bash
# cargo-deny over the workspace (deny.toml): licenses, bans (duplicate versions, wildcards) and
# sources always, offline; the RustSec advisories where the database can be fetched. Run by
# `make lint`. SINGLETON_ADVISORIES=require makes an unreachable database an error (for CI
# runners with network access), =skip skips the attempt.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=deny
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"
cd "$REPO"
deny=$(tool_path cargo-deny)

# cargo-deny reads the metadata of every target's dependencies (windows-sys and the like), whose
# sources a Linux build never downloads, and --offline refuses to fetch them: fetch them first,
# checked against Cargo.lock (a no-op once they are in cargo's cache).
cargo fetch --locked -q
"$deny" --offline check licenses bans sources

mode=${SINGLETON_ADVISORIES:-try}
[ "$mode" != skip ] || { echo "advisories: skipped (SINGLETON_ADVISORIES=skip)"; exit 0; }
out=$(mktemp); trap 'rm -f "$out"' EXIT
rc=0
timeout 120 "$deny" check advisories >"$out" 2>&1 || rc=$?
if [ "$rc" -ne 0 ] && grep -q "failed to fetch advisory database" "$out" && [ "$mode" != require ]; then
  echo "advisories: not checked, the RustSec database is unreachable from here ($(grep -o 'Could not resolve host: [^ ]*' "$out" | head -n1 || true))"
  exit 0
fi
cat "$out"
exit "$rc"
