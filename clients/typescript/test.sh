#!/usr/bin/env bash
# Builds @singleton-dev/fence and runs its tests against real PostgreSQL and MariaDB servers
# (DATABASE_URL, MARIADB_URL; default: the ones hack/postgres.sh and hack/mariadb.sh run).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${SINGLETON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/singleton-controller}/clients/typescript
export npm_config_cache=$CACHE/npm npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
cd "$HERE"
start=$(date +%s)

: "${DATABASE_URL:=$("$REPO/hack/postgres.sh" url)}"
: "${MARIADB_URL:=$("$REPO/hack/mariadb.sh" url)}"
export DATABASE_URL MARIADB_URL

npm ci --prefer-offline --loglevel=error
rm -rf dist build
npx --no-install tsc -p tsconfig.json
npx --no-install tsc -p tsconfig.test.json
status=0
node --test --test-reporter=spec build/*.test.js > build/test.log 2>&1 || status=$?
cat build/test.log
count() { sed -n "s/^ℹ $1 \([0-9]*\)$/\1/p" build/test.log; }
echo "typescript: $(count tests) tests in $(($(date +%s) - start))s (build included)"
echo "typescript: $(count pass) passed, $(($(count fail) + $(count cancelled))) failed"
exit "$status"
