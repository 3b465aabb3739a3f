#!/usr/bin/env bash
# A throwaway MariaDB for tests (the MySQL/MariaDB backstop engine and the client libraries): data
# under .cache/mariadb/, TCP on 127.0.0.1 only, database `singleton`, an administrator `singleton`
# (password `singleton`, every privilege with GRANT OPTION: the tests create users of their own).
# TLS is on (a throwaway CA, server certificate for 127.0.0.1 and localhost, at `hack/mariadb.sh
# ca`) while plain connections keep working. Idempotent.
# Usage: hack/mariadb.sh up|down|stop|url|status|ca   (stop keeps the data; `up` starts it again)
# Env: SINGLETON_MARIADB_PORT (default 23306)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
LOG_TAG=mariadb
# shellcheck source=SCRIPTDIR/lib.sh
. "$REPO/hack/lib.sh"

ROOT=$REPO/.cache/mariadb
TLS_DIR=$ROOT/tls
PORT_FILE=$ROOT/port
PIDFILE=$ROOT/mariadbd.pid
DB=singleton
USER_PW=singleton
if [ -s "$PORT_FILE" ]; then PORT=$(cat "$PORT_FILE"); else PORT=${SINGLETON_MARIADB_PORT:-23306}; fi

# The server and its client from Debian's packages (mariadb-server brings both).
ensure_server() { need_tool mariadbd mariadb-install-db mariadb; }

# The server runs as the `mysql` system user (the package creates it), which must reach its
# directory: a checkout under a private home (/root is 0700) is not reachable, so then the data
# lives in a fresh mktemp dir linked from .cache/mariadb/server (as hack/postgres.sh does).
server_dir() {
  mkdir -p "$ROOT"
  local d
  if [ -L "$ROOT/server" ]; then
    d=$(readlink "$ROOT/server")
  elif runuser -u mysql -- test -x "$ROOT"; then
    d=$ROOT/server
  else
    d=$(mktemp -d /tmp/singleton-mariadb.XXXXXX)
    ln -sfn "$d" "$ROOT/server"
  fi
  mkdir -p "$d"; chown mysql: "$d"
  echo "$d"
}

admin_q() { need_tool mariadb || return 1; mariadb --protocol=tcp -h 127.0.0.1 -P "$PORT" -u root -N -B "$@"; }
running() { pid_alive "$PIDFILE" 2>/dev/null; }
url() { echo "mysql://singleton:$USER_PW@127.0.0.1:$PORT/$DB?ssl-mode=DISABLED"; }

# ensure_tls: a throwaway CA and a server certificate (SAN localhost and 127.0.0.1), the CA key
# thrown away at once; the server reads them at start.
ensure_tls() {
  [ -s "$SERVER/server.crt" ] && [ -s "$TLS_DIR/ca.crt" ] && return 0
  need_tool openssl
  log "creating a TLS CA and server certificate"
  local tmp
  tmp=$(mktemp -d)
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -subj "/CN=singleton-controller dev CA (mariadb)" -keyout "$tmp/ca.key" -out "$tmp/ca.crt" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=localhost" \
    -keyout "$tmp/server.key" -out "$tmp/server.csr" 2>/dev/null
  printf '%s\n' basicConstraints=CA:FALSE keyUsage=critical,digitalSignature \
    extendedKeyUsage=serverAuth subjectAltName=DNS:localhost,IP:127.0.0.1 > "$tmp/ext"
  openssl x509 -req -in "$tmp/server.csr" -CA "$tmp/ca.crt" -CAkey "$tmp/ca.key" -CAcreateserial \
    -days 3650 -extfile "$tmp/ext" -out "$tmp/server.crt" 2>/dev/null
  install -o mysql -g mysql -m 0600 "$tmp/server.key" "$SERVER/server.key"
  install -o mysql -g mysql -m 0644 "$tmp/server.crt" "$SERVER/server.crt"
  install -o mysql -g mysql -m 0644 "$tmp/ca.crt" "$SERVER/ca.crt"
  mkdir -p "$TLS_DIR"
  install -m 0644 "$tmp/ca.crt" "$TLS_DIR/ca.crt"
  rm -rf "$tmp"
}

# Durability is traded for speed (the data is disposable); the controller keeps a connection per
# SingletonJob with a backstop, hence the connection limit (as hack/postgres.sh's).
serve() {
  start_daemon "$PIDFILE" "$SERVER/mariadb.log" "$(tool_path mariadbd)" --no-defaults \
    --user=mysql --datadir="$DATA" --bind-address=127.0.0.1 --port="$PORT" \
    --socket="$SERVER/mariadbd.sock" --pid-file="$SERVER/mariadbd.pidfile" \
    --max-connections=500 --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 \
    --skip-name-resolve --character-set-server=utf8mb4 --collation-server=utf8mb4_bin \
    --ssl-ca="$SERVER/ca.crt" --ssl-cert="$SERVER/server.crt" --ssl-key="$SERVER/server.key"
}

up() {
  ensure_server
  SERVER=$(server_dir); DATA=$SERVER/data
  if ! running; then
    if [ -s "$PORT_FILE" ]; then PORT=$(cat "$PORT_FILE"); else PORT=${SINGLETON_MARIADB_PORT:-23306}; fi
    if [ ! -d "$DATA/mysql" ]; then
      log "mariadb-install-db in $DATA"
      rm -rf "$DATA"
      # root from loopback TCP with no password: the admin of this throwaway server only.
      (cd / && mariadb-install-db --no-defaults --user=mysql --datadir="$DATA" \
        --auth-root-authentication-method=normal --skip-test-db) >"$ROOT/install.log" 2>&1 \
        || { tail -n 30 "$ROOT/install.log" >&2; die "mariadb-install-db failed"; }
    fi
    ensure_tls
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null \
      && die "127.0.0.1:$PORT is already taken by another process; set SINGLETON_MARIADB_PORT"
    log "starting on 127.0.0.1:$PORT"
    serve
    echo "$PORT" > "$PORT_FILE"
  fi
  wait_for "mariadb accepting connections" 60 "$SERVER/mariadb.log" admin_q -e 'select 1'
  admin_q -e "CREATE DATABASE IF NOT EXISTS $DB;
    CREATE USER IF NOT EXISTS 'singleton'@'%' IDENTIFIED BY '$USER_PW';
    GRANT ALL PRIVILEGES ON *.* TO 'singleton'@'%' WITH GRANT OPTION;"
  log "ready: $(url)"
}

halt() {
  [ -e "$PIDFILE" ] || return 0
  log "$1"
  stop_pidfile "$PIDFILE" 30
}

down() {
  [ -d "$ROOT" ] || return 0
  SERVER=$(server_dir)
  halt "stopping"
  rm -rf "$SERVER" "$ROOT"
}

# Stops the server and keeps its data and port (an outage).
stop() {
  [ -d "$ROOT" ] || return 0
  halt "stopping (data kept)"
}

status() {
  if [ -d "$ROOT" ] && running && admin_q -e 'select 1' >/dev/null 2>&1; then
    printf '%-24s running  %s\n' mariadb "$(url)"
  else
    printf '%-24s stopped\n' mariadb; return 1
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
