#!/usr/bin/env bash
# Tests of the Python client against real PostgreSQL (DATABASE_URL) and MariaDB (MARIADB_URL).
# Builds a venv from the pinned requirements under the cache dir; starts no server.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${SINGLETON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/singleton-controller}/clients/python
VENV=$CACHE/venv
PYTHON=${PYTHON:-python3}
export PIP_CACHE_DIR=$CACHE/pip PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
start=$(date +%s)

# mysqlclient is a C extension: only where its headers are (else its tests are skipped).
mysqlclient=no
if command -v pkg-config >/dev/null && command -v cc >/dev/null &&
   { pkg-config --exists mysqlclient || pkg-config --exists libmariadb; }; then
  mysqlclient=yes
fi

stamp=$({ "$PYTHON" --version; echo "mysqlclient=$mysqlclient"
          cat "$HERE/requirements-test.txt" "$HERE/requirements-mysqlclient.txt" "$HERE/pyproject.toml"; } |
        sha256sum | cut -d' ' -f1)
if [ "$(cat "$VENV/.stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "python: building $VENV"
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q -r "$HERE/requirements-test.txt"
  if [ "$mysqlclient" = yes ]; then
    "$VENV/bin/pip" install -q -r "$HERE/requirements-mysqlclient.txt" ||
      echo "python: mysqlclient did not build; its tests will be skipped" >&2
  fi
  # Editable: the tests run the sources, and the build backend checks pyproject.toml.
  "$VENV/bin/pip" install -q --no-deps --no-build-isolation -e "$HERE"
  echo "$stamp" > "$VENV/.stamp"
fi

export DATABASE_URL=${DATABASE_URL:-$("$REPO/hack/postgres.sh" url)}
export MARIADB_URL=${MARIADB_URL:-$("$REPO/hack/mariadb.sh" url)}

cd "$HERE"
status=0
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@" || status=$?
echo "python: pytest exit $status in $(( $(date +%s) - start ))s (mysqlclient: $mysqlclient)"
exit "$status"
