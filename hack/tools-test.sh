#!/usr/bin/env bash
# Checks the tool cache's supply-chain guard (hack/build-tools.sh): every cached binary matches
# hack/tools/SHA256SUMS, and a binary changed after its build is refused, not run. The second
# part works on a copy of kwok in a scratch cache, so the real cache is never touched. Run by
# `make lint`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=SCRIPTDIR/versions.sh
. hack/versions.sh
# The tools in the cache now (a fresh machine has built only those it used so far: promtool comes
# with the rules test, after this one).
cached=()
for t in etcd:$ETCD_VERSION kubernetes:$K8S_VERSION kwok:$KWOK_VERSION helm:$HELM_VERSION \
  promtool:$PROMTOOL_VERSION kubelet:$K8S_VERSION containerd:$CONTAINERD_VERSION crictl:$CRICTL_VERSION; do
  [ -d "$TOOLS_DIR/${t%%:*}-${t#*:}" ] && cached+=("${t%%:*}")
done
[ "${#cached[@]}" -gt 0 ] || { echo "no Go-built tool cached yet: run make tools" >&2; exit 1; }
hack/build-tools.sh verify "${cached[@]}"

scratch=$(mktemp -d); trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/tools"
cp -a "$TOOLS_DIR/kwok-$KWOK_VERSION" "$scratch/tools/"
printf 'tampered' >> "$scratch/tools/kwok-$KWOK_VERSION/kwok"
if SINGLETON_CACHE=$scratch hack/build-tools.sh verify kwok 2>"$scratch/err"; then
  echo "hack/build-tools.sh accepted a cached kwok that does not match hack/tools/SHA256SUMS" >&2
  exit 1
fi
grep -q 'expected' "$scratch/err" || { cat "$scratch/err" >&2; exit 1; }
echo "cached tools (${cached[*]}) match hack/tools/SHA256SUMS; a changed binary is refused"
