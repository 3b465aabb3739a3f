#!/usr/bin/env bash
# The one way a make target (or a person) gets a tool: prints the path of a verified copy, building
# or installing it first when it is missing (need_tool in hack/lib.sh; the names are its TOOLS).
# What is built and how long it usually takes goes to stderr, the path alone to stdout, so a
# recipe says `helm=$$(hack/tool.sh helm)` and then runs "$$helm".
#
# Usage: hack/tool.sh [--release] <name>   its path (--release: a workspace binary's release build)
#        hack/tool.sh --list               every name, and where a fresh machine gets it from
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=tool
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"

case ${1:-} in
  --list) awk 'NF { printf "%-24s %s\n", $1, substr($0, index($0, $2)) }' <<< "$TOOLS" ;;
  '' | -h | --help) sed -n '2,/^set -euo/{/^#/p}' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  *) tool_path "$@" ;;
esac
