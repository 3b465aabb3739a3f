#!/usr/bin/env bash
# Runs the Java client's tests (JUnit 5 via Maven Surefire) against real PostgreSQL and MariaDB.
# Env: DATABASE_URL, MARIADB_URL: the servers (default: the URLs of ../../hack/postgres.sh and
# ../../hack/mariadb.sh; this script does not start them). SINGLETON_CACHE: where Maven's
# repository goes (default ~/.cache/singleton-controller), under clients/java/m2.
set -euo pipefail
DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$DIR/../.." && pwd)
CACHE=${SINGLETON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/singleton-controller}/clients/java
mkdir -p "$CACHE"

# The machines come with Maven and JDK 17; a fresh one without them gets Debian's.
if ! command -v mvn >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "java: needs mvn and a JDK 17 or newer (apt-get install maven openjdk-17-jdk-headless)" >&2
    exit 1
  fi
  echo "java: installing Debian's maven and openjdk-17-jdk-headless" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven openjdk-17-jdk-headless >/dev/null
fi

if [ -z "${DATABASE_URL:-}" ]; then DATABASE_URL=$("$REPO/hack/postgres.sh" url); fi
if [ -z "${MARIADB_URL:-}" ]; then MARIADB_URL=$("$REPO/hack/mariadb.sh" url); fi
export DATABASE_URL MARIADB_URL

# Maven's JVM is short-lived: the quick compiler alone starts it faster.
export MAVEN_OPTS=${MAVEN_OPTS:--XX:TieredStopAtLevel=1}
REPORTS=$DIR/target/surefire-reports
rm -rf "$REPORTS" # a report of an earlier run must not count
start=$(date +%s)
rc=0
# Debian's Maven 3.8 writes colour resets even with -B: drop them.
mvn -q -B -f "$DIR/pom.xml" -Dmaven.repo.local="$CACHE/m2" test 2>&1 | sed -u $'s/\e\\[[0-9;]*m//g' || rc=$?
secs=$(($(date +%s) - start))

# -q hides Surefire's totals: add them up from its reports.
tests=0 bad=0 skipped=0
for f in "$REPORTS"/TEST-*.xml; do
  [ -e "$f" ] || continue
  head=$(grep -m1 -o '<testsuite [^>]*>' "$f")
  attr() { printf '%s' "$head" | sed -n "s/.* $1=\"\\([0-9]*\\)\".*/\\1/p"; }
  tests=$((tests + $(attr tests))) skipped=$((skipped + $(attr skipped)))
  bad=$((bad + $(attr failures) + $(attr errors)))
done
if [ "$tests" = 0 ]; then
  echo "java: no test ran (mvn exit $rc, ${secs}s)"
  exit $((rc == 0 ? 1 : rc))
fi
echo "java: ${secs}s against PostgreSQL $DATABASE_URL and MariaDB $MARIADB_URL"
echo "java: $((tests - bad - skipped)) passed, $bad failed, $skipped skipped"
exit "$rc"
