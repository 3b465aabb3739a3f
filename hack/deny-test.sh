#!/usr/bin/env bash
# hack/deny.sh's advisory modes (issue 34, N9): a RustSec database that cannot be fetched fails
# `make lint` loudly by default, SINGLETON_ADVISORIES=skip skips the check and says so, and any
# other value is refused. The database is made unreachable on purpose (a proxy on a closed port),
# so the first case holds on a machine with access to github.com too. Run by `make lint`.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=deny-test
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"
out=$(mktemp); trap 'rm -f "$out"' EXIT
unreachable=(env https_proxy=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9)

# expect <rc: 0 or nonzero> <text the output must contain> <env assignments...>
expect() {
  local want=$1 text=$2 rc=0
  shift 2
  "${unreachable[@]}" "$@" "$REPO/hack/deny.sh" >"$out" 2>&1 || rc=$?
  if { [ "$want" = 0 ] && [ "$rc" -ne 0 ]; } || { [ "$want" != 0 ] && [ "$rc" -eq 0 ]; } \
    || ! grep -qF -- "$text" "$out"; then
    cat "$out" >&2
    die "hack/deny.sh with $*: exit $rc (expected ${want/nonzero/non-zero}) and output containing '$text'"
  fi
}

expect nonzero "advisories: NOT CHECKED: the RustSec advisory database" SINGLETON_ADVISORIES=
expect 0 "NOT CHECKED, skipped on request" SINGLETON_ADVISORIES=skip
expect nonzero "SINGLETON_ADVISORIES is require (the default) or skip (got 'try')" SINGLETON_ADVISORIES=try
echo "hack/deny.sh: an unreadable advisory database fails the check unless skipped on request"
