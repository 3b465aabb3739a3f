#!/usr/bin/env bash
# Checks the tool cache's supply-chain guard (hack/build-tools.sh): every cached binary matches
# hack/tools/SHA256SUMS, and a binary changed after its build is refused, not run. The second
# part works on a copy of kwok in a scratch cache, so the real cache is never touched. Run by
# `make lint`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=SCRIPTDIR/versions.sh
. hack/versions.sh
hack/build-tools.sh verify etcd kubernetes kwok helm promtool

scratch=$(mktemp -d); trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/tools"
cp -a "$TOOLS_DIR/kwok-$KWOK_VERSION" "$scratch/tools/"
printf 'tampered' >> "$scratch/tools/kwok-$KWOK_VERSION/kwok"
if SINGLETON_CACHE=$scratch hack/build-tools.sh verify kwok 2>"$scratch/err"; then
  echo "hack/build-tools.sh accepted a cached kwok that does not match hack/tools/SHA256SUMS" >&2
  exit 1
fi
grep -q 'expected' "$scratch/err" || { cat "$scratch/err" >&2; exit 1; }
echo "cached tools match hack/tools/SHA256SUMS; a changed binary is refused"
