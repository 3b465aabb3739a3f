#!/usr/bin/env bash
# Runs the Go client's tests against real PostgreSQL and MariaDB (DATABASE_URL, MARIADB_URL; from
# ../../hack/*.sh url when unset; this script starts no server). Works from any directory.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${SINGLETON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/singleton-controller}/clients/go
export GOMODCACHE=$cache/mod GOCACHE=$cache/build
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly # the machine's Go; go.sum is committed

if [ -z "${DATABASE_URL:-}" ]; then DATABASE_URL=$("$here/../../hack/postgres.sh" url); fi
if [ -z "${MARIADB_URL:-}" ]; then MARIADB_URL=$("$here/../../hack/mariadb.sh" url); fi
export DATABASE_URL MARIADB_URL

cd "$here"
start=$SECONDS
go mod download
go vet ./...
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
go test -count=1 -timeout 120s -v ./... >"$log" 2>&1 || status=$?
# The failures in full, else go test's closing line; then the counts (subtests included).
if [ "$status" -ne 0 ]; then
  grep -vE '^(=== (RUN|PAUSE|CONT)|\s*--- PASS)' "$log" || true
else
  grep -E '^(ok|FAIL)\s' "$log" || true
fi
passed=$(grep -cE '^\s*--- PASS' "$log" || true)
failed=$(grep -cE '^\s*--- FAIL' "$log" || true)
echo "go: $passed passed, $failed failed ($((SECONDS - start)) s; PostgreSQL and MariaDB)"
exit "$status"
