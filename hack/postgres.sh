#!/usr/bin/env bash
# A throwaway PostgreSQL for tests and the demo: data under .cache/postgres/, TCP on 127.0.0.1 only,
# trust auth for loopback, database `singleton`. Idempotent.
# Usage: hack/postgres.sh up|down|url|status
# Env: SINGLETON_PG_PORT (default 35432)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=postgres
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"

ROOT=$REPO/.cache/postgres
PORT_FILE=$ROOT/port
DB=singleton
# The port of a running server wins over the environment, so `url` keeps pointing at what runs.
if [ -s "$PORT_FILE" ]; then PORT=$(cat "$PORT_FILE"); else PORT=${SINGLETON_PG_PORT:-35432}; fi

newest_bin() { printf '%s\n' /usr/lib/postgresql/*/bin | { grep -v '\*' || true; } | sort -V | tail -n 1; }
pg_bin() {
  local d
  d=$(newest_bin)
  if [ -z "$d" ] || [ ! -x "$d/initdb" ]; then
    ensure_cmd runuser util-linux
    log "initdb missing: installing Debian package postgresql"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    d=$(newest_bin)
  fi
  echo "$d"
}

# initdb refuses to run as root, so the server runs as the `postgres` system user, which must reach
# its directory (data dir and log). A checkout under a private home (/root is 0700) is not
# reachable; then that directory is a fresh mktemp dir, linked from .cache/postgres/server.
server_dir() {
  mkdir -p "$ROOT"
  local d
  if [ -L "$ROOT/server" ]; then
    d=$(readlink "$ROOT/server")
  elif runuser -u postgres -- test -x "$ROOT"; then
    d=$ROOT/server
  else
    d=$(mktemp -d /tmp/singleton-postgres.XXXXXX)
    ln -sfn "$d" "$ROOT/server"
  fi
  mkdir -p "$d"; chown postgres: "$d"
  echo "$d"
}

as_pg() { (cd / && runuser -u postgres -- "$@"); }
psql_q() { "$BIN/psql" -X -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -tA "$@"; }
running() { [ -n "${DATA:-}" ] && [ -f "$DATA/postmaster.pid" ] && as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; }

url() { echo "postgres://postgres@127.0.0.1:$PORT/$DB"; }

up() {
  BIN=$(pg_bin); SERVER=$(server_dir); DATA=$SERVER/data; LOGFILE=$SERVER/postgres.log
  if ! running; then
    PORT=${SINGLETON_PG_PORT:-35432}
    if [ ! -s "$DATA/PG_VERSION" ]; then
      log "initdb in $DATA"
      rm -rf "$DATA"
      as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 --no-sync \
        >"$ROOT/initdb.log" 2>&1 || { tail -n 30 "$ROOT/initdb.log" >&2; die "initdb failed"; }
      # Loopback TCP only (no unix socket: its path length and directory would depend on the
      # checkout); durability is traded for speed because the data is disposable.
      cat >>"$DATA/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
      echo "host all all 127.0.0.1/32 trust" > "$DATA/pg_hba.conf"
    fi
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null \
      && die "127.0.0.1:$PORT is already taken by another process; set SINGLETON_PG_PORT"
    log "starting on 127.0.0.1:$PORT"
    # pg_ctl -w polls until the server accepts connections; setsid keeps a terminal's Ctrl-C away.
    if ! (close_inherited_fds; cd / && exec setsid --wait runuser -u postgres -- \
          "$BIN/pg_ctl" -D "$DATA" -l "$LOGFILE" -o "-p $PORT" -w -t 60 start >/dev/null); then
      tail -n 30 "$LOGFILE" >&2; die "postgres did not start"
    fi
    echo "$PORT" > "$PORT_FILE"
  fi
  wait_for "postgres accepting connections" 30 "$LOGFILE" psql_q -c 'select 1'
  if [ "$(psql_q -c "select 1 from pg_database where datname = '$DB'")" != 1 ]; then
    psql_q -c "create database $DB" >/dev/null
  fi
  log "ready: $(url)"
}

down() {
  [ -d "$ROOT" ] || return 0
  BIN=$(pg_bin); SERVER=$(server_dir); DATA=$SERVER/data; LOGFILE=$SERVER/postgres.log
  if running; then
    log "stopping"
    as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w -t 30 stop >/dev/null \
      || as_pg "$BIN/pg_ctl" -D "$DATA" -m immediate -w -t 10 stop >/dev/null
  fi
  rm -rf "$SERVER" "$ROOT"
}

status() {
  [ -d "$ROOT" ] || { printf '%-24s stopped\n' postgres; return 1; }
  BIN=$(pg_bin); SERVER=$(server_dir); DATA=$SERVER/data; LOGFILE=$SERVER/postgres.log
  if running && psql_q -c 'select 1' >/dev/null 2>&1; then
    printf '%-24s running  %s\n' postgres "$(url)"
  else
    printf '%-24s stopped\n' postgres; return 1
  fi
}

case ${1:-} in
  up) up ;;
  down) down ;;
  url) url ;;
  status) status ;;
  *) echo "usage: $0 up|down|url|status" >&2; exit 2 ;;
esac
