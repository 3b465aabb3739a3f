#!/usr/bin/env bash
# Checks the chart's alert rules with promtool and runs their unit tests: `promtool check rules`
# on files/alerts.yaml wrapped as the chart's PrometheusRule wraps it (one group,
# "singleton-controller"), then `promtool test rules` on charts/singleton-controller/tests/*_test.yaml,
# which say with input series when each alert fires and when it does not. Run by `make lint`.
# promtool is built from the Go module pinned in hack/versions.sh on first use (cached).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=rules-test
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"
cd "$REPO"
promtool=$(tool_path promtool)
chart=charts/singleton-controller

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# files/alerts.yaml is a bare list of rules; templates/prometheusrule.yaml puts it under
# spec.groups[0].rules, indented by eight. Do the same under a rule file's `groups:`.
{
  printf 'groups:\n  - name: singleton-controller\n    rules:\n'
  sed -e 's/^/      /' "$chart/files/alerts.yaml"
} > "$tmp/alerts.rules.yaml"
# The tests name the rule file relative to themselves.
cp "$chart"/tests/*_test.yaml "$tmp/"

"$promtool" check rules "$tmp/alerts.rules.yaml"
(cd "$tmp" && "$promtool" test rules ./*_test.yaml)
