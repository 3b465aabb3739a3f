#!/usr/bin/env bash
# A throwaway PostgreSQL for tests and the demo: data under .cache/postgres/, TCP on 127.0.0.1 only,
# trust auth for loopback, database `singleton`. Idempotent.
# TLS is on too (ssl=on with a throwaway CA, server certificate for 127.0.0.1 and localhost), while
# plain connections keep working; the CA certificate is at `hack/postgres.sh ca` for sslmode tests.
# Usage: hack/postgres.sh up|down|stop|url|status|ca   (stop keeps the data; `up` starts it again)
# Env: SINGLETON_PG_PORT (default 25432)
#      SINGLETON_PG_NAME: a server of its own beside the default one (state in .cache/postgres-NAME,
#      on its own SINGLETON_PG_PORT), e.g. make demo-dr's, so `make up`/`make down` never touch it.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=postgres
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"

case ${SINGLETON_PG_NAME:-} in
  *[!a-z0-9-]*) echo "SINGLETON_PG_NAME must be lower-case letters, digits and '-'" >&2; exit 2 ;;
esac
ROOT=$REPO/.cache/postgres${SINGLETON_PG_NAME:+-$SINGLETON_PG_NAME}
TLS_DIR=$ROOT/tls
PORT_FILE=$ROOT/port
DB=singleton
# The port of a running server wins over the environment, so `url` keeps pointing at what runs.
if [ -s "$PORT_FILE" ]; then PORT=$(cat "$PORT_FILE"); else PORT=${SINGLETON_PG_PORT:-25432}; fi

have_initdb() { local d; d=$(newest_bin); [ -n "$d" ] && [ -x "$d/initdb" ]; }
newest_bin() { printf '%s\n' /usr/lib/postgresql/*/bin | { grep -v '\*' || true; } | sort -V | tail -n 1; }
pg_bin() {
  local d
  d=$(newest_bin)
  # Called as $(pg_bin), where errexit is off: each step says when it fails.
  if [ -z "$d" ] || [ ! -x "$d/initdb" ]; then
    ensure_deb postgresql have_initdb || return 1
    d=$(newest_bin)
  fi
  # The client beside the server (the package brings it): psql_q runs it.
  need_tool psql || return 1
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

# sslmode=disable, said explicitly: the controller verifies the server by default (verify-full),
# and this loopback database trusts every local connection anyway.
# The controller keeps a connection per SingletonJob with a backstop, and the hostile-tenant
# suite has 130 of them in one namespace beside the other tests (the default, 100, refused the
# others' connections).
MAX_CONNECTIONS=500
url() { echo "postgres://postgres@127.0.0.1:$PORT/$DB?sslmode=disable"; }

# ensure_tls: a throwaway CA and a server certificate (SAN localhost and 127.0.0.1) in the data
# dir, and ssl = on. The server still accepts plain TCP (the pg_hba `host` line matches both), so
# the URL without sslmode keeps working. Sets TLS_CHANGED=1 when it wrote anything (then a running
# server needs a reload; SSL settings are reloadable). The CA key is thrown away at once.
ensure_tls() {
  TLS_CHANGED=
  if [ -s "$DATA/server.crt" ] && [ -s "$TLS_DIR/ca.crt" ] && grep -q '^ssl = on' "$DATA/postgresql.conf"; then
    return 0
  fi
  need_tool openssl
  log "creating a TLS CA and server certificate"
  local tmp
  tmp=$(mktemp -d)
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -subj "/CN=singleton-controller dev CA" -keyout "$tmp/ca.key" -out "$tmp/ca.crt" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=localhost" \
    -keyout "$tmp/server.key" -out "$tmp/server.csr" 2>/dev/null
  printf '%s\n' basicConstraints=CA:FALSE keyUsage=critical,digitalSignature \
    extendedKeyUsage=serverAuth subjectAltName=DNS:localhost,IP:127.0.0.1 > "$tmp/ext"
  openssl x509 -req -in "$tmp/server.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" -CAcreateserial \
    -days 3650 -extfile "$tmp/ext" -out "$tmp/server.crt" 2>/dev/null
  install -o postgres -g postgres -m 0600 "$tmp/server.key" "$DATA/server.key"
  install -o postgres -g postgres -m 0644 "$tmp/server.crt" "$DATA/server.crt"
  mkdir -p "$TLS_DIR"
  install -m 0644 "$tmp/ca.crt" "$TLS_DIR/ca.crt"
  rm -rf "$tmp"
  if ! grep -q '^ssl = on' "$DATA/postgresql.conf"; then
    printf '%s\n' "ssl = on" "ssl_cert_file = 'server.crt'" "ssl_key_file = 'server.key'" >> "$DATA/postgresql.conf"
  fi
  TLS_CHANGED=1
}

# ensure_hba: two roles that must log in with a password (cleartext, MD5), for the tests that
# check the controller never sends a password to a server it did not verify. The roles themselves
# are created by those tests. Sets HBA_CHANGED=1 when it wrote (a running server needs a reload).
HBA_MARK="# singleton-controller tests: password roles"
ensure_hba() {
  HBA_CHANGED=
  if grep -qF "$HBA_MARK" "$DATA/pg_hba.conf"; then return 0; fi
  local tmp
  tmp=$(mktemp)
  { echo "$HBA_MARK"
    echo "host all singleton_pw_cleartext 127.0.0.1/32 password"
    echo "host all singleton_pw_md5 127.0.0.1/32 md5"
    cat "$DATA/pg_hba.conf"; } > "$tmp"
  install -o postgres -g postgres -m 0600 "$tmp" "$DATA/pg_hba.conf"
  rm -f "$tmp"
  HBA_CHANGED=1
}

# ensure_pod_hba: the real node's pods (hack/node.sh) reach this server through a DNAT from their
# bridge to 127.0.0.1, so it still listens on loopback only; their source is the pod network.
POD_HBA_MARK="# singleton-controller tests: the real node's pod network"
ensure_pod_hba() {
  if grep -qF "$POD_HBA_MARK" "$DATA/pg_hba.conf"; then return 0; fi
  printf '%s\nhost all all 10.244.0.0/24 trust\n' "$POD_HBA_MARK" >> "$DATA/pg_hba.conf"
  HBA_CHANGED=1
}

# serve <pg_ctl args...>: starts or restarts the server on $PORT with its options. pg_ctl -w polls
# until the server accepts connections; setsid keeps a terminal's Ctrl-C away.
serve() {
  (close_inherited_fds; cd / && exec setsid --wait runuser -u postgres -- \
    "$BIN/pg_ctl" -D "$DATA" -l "$LOGFILE" -o "-p $PORT -c max_connections=$MAX_CONNECTIONS" \
    -w -t 60 "$@" >/dev/null)
}

up() {
  BIN=$(pg_bin); SERVER=$(server_dir); DATA=$SERVER/data; LOGFILE=$SERVER/postgres.log
  if ! running; then
    # A server stopped by `stop` comes back on its port (clients hold URLs with it).
    if [ -s "$PORT_FILE" ]; then PORT=$(cat "$PORT_FILE"); else PORT=${SINGLETON_PG_PORT:-25432}; fi
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
    ensure_tls
    ensure_hba
    ensure_pod_hba
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null \
      && die "127.0.0.1:$PORT is already taken by another process; set SINGLETON_PG_PORT"
    log "starting on 127.0.0.1:$PORT"
    if ! serve start; then
      tail -n 30 "$LOGFILE" >&2; die "postgres did not start"
    fi
    echo "$PORT" > "$PORT_FILE"
  fi
  wait_for "postgres accepting connections" 30 "$LOGFILE" psql_q -c 'select 1'
  # A server started before the connection limit was raised: restarted once with it.
  if [ "$(psql_q -c 'show max_connections')" -lt "$MAX_CONNECTIONS" ]; then
    log "restarting with max_connections=$MAX_CONNECTIONS"
    serve -m fast restart || { tail -n 30 "$LOGFILE" >&2; die "postgres did not restart"; }
    wait_for "postgres accepting connections" 30 "$LOGFILE" psql_q -c 'select 1'
  fi
  # A server started before TLS support: add it in place, without a restart.
  ensure_tls
  ensure_hba
  ensure_pod_hba
  if [ -n "$TLS_CHANGED$HBA_CHANGED" ]; then psql_q -c 'select pg_reload_conf()' >/dev/null; fi
  if [ "$(psql_q -c "select 1 from pg_database where datname = '$DB'")" != 1 ]; then
    psql_q -c "create database $DB" >/dev/null
  fi
  log "ready: $(url)"
}

# Stops a running server (fast, then immediate); $1 is what to log.
halt() {
  BIN=$(pg_bin); SERVER=$(server_dir); DATA=$SERVER/data; LOGFILE=$SERVER/postgres.log
  if running; then
    log "$1"
    as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w -t 30 stop >/dev/null \
      || as_pg "$BIN/pg_ctl" -D "$DATA" -m immediate -w -t 10 stop >/dev/null
  fi
}

down() {
  [ -d "$ROOT" ] || return 0
  halt "stopping"
  rm -rf "$SERVER" "$ROOT"
}

# Stops the server and keeps its data and port (the chaos suite's database outage).
stop() {
  [ -d "$ROOT" ] || return 0
  halt "stopping (data kept)"
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
  stop) stop ;;
  url) url ;;
  status) status ;;
  ca) echo "$TLS_DIR/ca.crt" ;;
  *) echo "usage: $0 up|down|stop|url|status|ca" >&2; exit 2 ;;
esac
