#!/usr/bin/env bash
# Checks the tool cache's supply-chain guard (hack/build-tools.sh): every cached binary matches
# hack/tools/SHA256SUMS, and a binary changed after its build is refused, not run. The second
# part works on a copy of shfmt (small; make lint builds it first for hack/tool-uses-test.sh) in
# a scratch cache, so the real cache is never touched. Run by `make lint`.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=tools-test
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"
cd "$REPO"
shfmt=$(tool_path shfmt)
# The tools in the cache now (a fresh machine has built only those it used so far: promtool comes
# with the rules test, after this one).
cached=()
for t in etcd kubernetes kwok helm promtool kubelet containerd crictl shfmt cyclonedx-gomod; do
  if [ -d "$(tool_dir "$t")" ]; then cached+=("$t"); fi
done
hack/build-tools.sh verify "${cached[@]}"

scratch=$(mktemp -d); trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/tools"
dir=$(dirname "$shfmt")
cp -a "$dir" "$scratch/tools/"
printf 'tampered' >> "$scratch/tools/$(basename "$dir")/shfmt"
if SINGLETON_CACHE=$scratch hack/build-tools.sh verify shfmt 2>"$scratch/err"; then
  echo "hack/build-tools.sh accepted a cached shfmt that does not match hack/tools/SHA256SUMS" >&2
  exit 1
fi
grep -q 'expected' "$scratch/err" || { cat "$scratch/err" >&2; exit 1; }
echo "cached tools (${cached[*]}) match hack/tools/SHA256SUMS; a changed binary is refused"
