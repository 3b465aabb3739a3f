#!/usr/bin/env bash
# Tests of the billing example's Python workload against the real PostgreSQL (DATABASE_URL; from
# ../../../hack/postgres.sh url when unset; this script starts no server). Works from any
# directory. python3 is a prerequisite (PYTHON picks another); its venv, built by venv.sh from the
# pinned requirements, and pip's cache live under the cache dir, as clients/python/test.sh's do.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
CACHE=${SINGLETON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/singleton-controller}/examples/python
PYTHON=${PYTHON:-python3}
export PIP_CACHE_DIR=$CACHE/pip PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
start=$(date +%s)

mkdir -p "$CACHE"
"$HERE/venv.sh" "$PYTHON" "$CACHE/venv-test" "$HERE/requirements-test.txt"
export DATABASE_URL=${DATABASE_URL:-$("$REPO/hack/postgres.sh" url)}

cd "$HERE"
status=0
"$CACHE/venv-test/bin/python" -m pytest -q -p no:cacheprovider tests "$@" || status=$?
echo "billing (python): pytest exit $status in $(( $(date +%s) - start ))s (PostgreSQL)"
exit "$status"
