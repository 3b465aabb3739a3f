#!/usr/bin/env bash
# Tests of the billing example's Go workload against the real PostgreSQL (DATABASE_URL; from
# ../../../hack/postgres.sh url when unset; this script starts no server). Works from any
# directory. Go is a prerequisite (the machine's, GOTOOLCHAIN=local); the modules and the build
# cache live under the cache dir, as clients/go/test.sh's do.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${SINGLETON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/singleton-controller}/examples/go
export GOMODCACHE=$cache/mod GOCACHE=$cache/build
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly # the machine's Go; go.sum is committed

if [ -z "${DATABASE_URL:-}" ]; then DATABASE_URL=$("$here/../../../hack/postgres.sh" url); fi
export DATABASE_URL

cd "$here"
start=$SECONDS
go mod download
go vet ./...
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
go test -count=1 -timeout 120s -v ./... >"$log" 2>&1 || status=$?
# The failures in full, else go test's closing line; then the counts.
if [ "$status" -ne 0 ]; then
  grep -vE '^(=== (RUN|PAUSE|CONT)|\s*--- PASS)' "$log" || true
else
  grep -E '^(ok|FAIL)\s' "$log" || true
fi
passed=$(grep -cE '^\s*--- PASS' "$log" || true)
failed=$(grep -cE '^\s*--- FAIL' "$log" || true)
echo "billing (go): $passed passed, $failed failed ($((SECONDS - start)) s; PostgreSQL)"
exit "$status"
