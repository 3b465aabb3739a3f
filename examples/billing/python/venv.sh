#!/usr/bin/env bash
# venv.sh <python> <venv dir> [requirements file...]: a venv of <python> holding the workload's
# pinned dependencies (requirements.txt), the fence library (../../../clients/python, installed as
# a wheel built in isolation with the pinned backend of requirements-build.txt) and the further
# requirements files given (the tests'). test.sh and hack/image.sh build theirs with it. Rebuilt
# only when an input changed (the interpreter, a requirements file, the library's sources).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
lib=$(cd "$here/../../../clients/python" && pwd)
[ $# -ge 2 ] || { echo "usage: $0 <python> <venv dir> [requirements file...]" >&2; exit 2; }
python=$1 venv=$2
shift 2
export PIP_DISABLE_PIP_VERSION_CHECK=1

stamp=$({ "$python" -c 'import sys; print(sys.executable, sys.version)'
          cat "$here/requirements.txt" "$here/requirements-build.txt" "$@"
          (cd "$lib" && find pyproject.toml README.md src -type f ! -name '*.pyc' | sort | xargs sha256sum)
        } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$venv/.stamp" 2>/dev/null)" = "$stamp" ]; then exit 0; fi

echo "billing (python): building $venv with $python" >&2
rm -rf "$venv"
"$python" -m venv "$venv"
reqs=(-r "$here/requirements.txt")
for f in "$@"; do reqs+=(-r "$f"); done
"$venv/bin/pip" install -q "${reqs[@]}"
# The library has no dependencies; its build backend stays in pip's isolated build environment.
PIP_CONSTRAINT=$here/requirements-build.txt "$venv/bin/pip" install -q --no-deps "$lib"
"$venv/bin/pip" check >/dev/null
echo "$stamp" > "$venv/.stamp"
