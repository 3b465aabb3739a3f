# shellcheck shell=bash
# Shared helpers for hack/*.sh: process supervision by pidfile and readiness polling.
# Sourced, not executed; callers set -euo pipefail themselves.

REPO=${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
# shellcheck source=SCRIPTDIR/versions.sh
. "$REPO/hack/versions.sh"

log() { printf '[%s] %s\n' "${LOG_TAG:-hack}" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ensure_cmd <command> <debian package>: a fresh machine may lack it; install non-interactively.
ensure_cmd() {
  command -v "$1" >/dev/null 2>&1 && return 0
  log "$1 missing: installing Debian package $2"
  [ "$(id -u)" = 0 ] || die "$1 is missing and installing $2 needs root"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
  command -v "$1" >/dev/null 2>&1 || die "$1 still missing after installing $2"
}

# pid_alive <pidfile>: the recorded process exists and still runs the binary we started
# (a bare `kill -0` would trust a recycled PID after a reboot or a long-dead daemon). A binary
# rebuilt since (cargo build while the demo runs) shows as "<path> (deleted)" and still counts.
pid_alive() {
  local f=$1 pid exe now
  [ -s "$f" ] || return 1
  read -r pid exe < "$f" || true
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  [ -n "$exe" ] || return 0
  now=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [ "$now" = "$exe" ] || [ "$now" = "$exe (deleted)" ]
}

# close_inherited_fds: closes fds above 2 in the current (sub)shell, so a daemon forked from it
# does not hold open a pipe that make or CI waits on.
close_inherited_fds() {
  local fd
  for fd in "/proc/$BASHPID/fd"/*; do
    fd=${fd##*/}
    if [ "$fd" -gt 2 ] && [ "$fd" -lt 255 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
  done
}

# start_daemon <pidfile> <logfile> <binary> [args...]: runs the binary detached in its own session
# (so its process group is its PID and a terminal's Ctrl-C or hang-up does not reach it) and records
# "PID EXE" in the pidfile. stdin/stdout/stderr and every other inherited fd are detached, so a
# caller that pipes our output (make, CI) is not kept waiting by the daemon.
start_daemon() {
  local pidfile=$1 logfile=$2 bin=$3; shift 3
  mkdir -p "$(dirname "$pidfile")" "$(dirname "$logfile")"
  (
    close_inherited_fds
    # bash's own background child is never a group leader, so setsid(1) execs in place
    # and $! below is the daemon itself, not a short-lived wrapper.
    exec setsid "$bin" "$@" </dev/null >>"$logfile" 2>&1
  ) &
  local pid=$!
  echo "$pid $(readlink -f "$bin")" > "$pidfile"
}

# group_alive <pgid>: some member of the process group still runs. Zombies do not count: our daemons
# are orphans whose reaper (PID 1) may take seconds to collect them, and `kill -0` sees zombies.
group_alive() {
  ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}

# stop_pidfiles <deadline seconds> <pidfile>...: TERM the recorded process groups together, KILL
# whatever is left after the deadline, then remove the pidfiles. Only ever signals groups we
# started (a pidfile whose PID now runs another program is just removed).
stop_pidfiles() {
  local deadline=$1 f pid exe groups=() g left end; shift
  for f in "$@"; do
    [ -e "$f" ] || continue
    read -r pid exe < "$f" || true
    if [ -n "$pid" ] && pid_alive "$f"; then
      log "stopping $(basename "$f" .pid) (pgid $pid)"
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      groups+=("$pid")
    fi
  done
  alive_groups() { left=(); for g in "${groups[@]}"; do group_alive "$g" && left+=("$g"); done; }
  end=$((SECONDS + deadline))
  while alive_groups && [ ${#left[@]} -gt 0 ] && [ $SECONDS -lt $end ]; do sleep 0.1; done
  if [ ${#groups[@]} -gt 0 ] && alive_groups && [ ${#left[@]} -gt 0 ]; then
    log "process groups ${left[*]} ignored TERM for ${deadline}s: sending KILL"
    for g in "${left[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
    end=$((SECONDS + 5))
    while alive_groups && [ ${#left[@]} -gt 0 ] && [ $SECONDS -lt $end ]; do sleep 0.1; done
  fi
  rm -f "$@"
}
stop_pidfile() { stop_pidfiles "${2:-15}" "$1"; }

# wait_for <description> <timeout s> <logfile|-> <command...>: polls the command until it succeeds.
# On timeout prints what the command last said and the tail of the component's log, then fails.
# The optional WAIT_PIDFILE makes it fail fast when the process it waits for has died.
wait_for() {
  local what=$1 timeout=$2 logfile=$3; shift 3
  local end=$((SECONDS + timeout)) out=""
  while :; do
    if out=$("$@" 2>&1); then return 0; fi
    if [ -n "${WAIT_PIDFILE:-}" ] && ! pid_alive "$WAIT_PIDFILE"; then
      log "$what: the process exited"; break
    fi
    [ $SECONDS -lt $end ] || { log "$what: not ready after ${timeout}s"; break; }
    sleep 0.25
  done
  log "last check said: ${out:-<nothing>}"
  if [ "$logfile" != - ] && [ -f "$logfile" ]; then
    log "last lines of $logfile:"; tail -n 30 "$logfile" >&2
  fi
  return 1
}
