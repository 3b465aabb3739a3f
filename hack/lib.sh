# shellcheck shell=bash
# Shared helpers for hack/*.sh: the one way to get a tool (need_tool), process supervision by
# pidfile and readiness polling. Sourced, not executed; callers set -euo pipefail themselves.

REPO=${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
# shellcheck source=SCRIPTDIR/versions.sh
. "$REPO/hack/versions.sh"

# Go's GC for the test clusters' Go processes (hack/cluster.sh start(), hack/node.sh): collect
# less often than GOGC=100, bounded by a soft memory limit per process. Up to eight control
# planes share `make test`'s 2 cores, where kube-apiserver alone took about 30 % of the CPU
# (2026-12-06); this machine has 24 GiB. make bench sets Go's defaults (hack/bench.sh).
CONTROL_PLANE_GOGC=${SINGLETON_CONTROL_PLANE_GOGC:-400}
CONTROL_PLANE_GOMEMLIMIT=${SINGLETON_CONTROL_PLANE_GOMEMLIMIT:-1GiB}

log() { printf '[%s] %s\n' "${LOG_TAG:-hack}" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ensure_cmd <command> <debian package>: a fresh machine may lack it; install non-interactively.
# Scripts call need_tool, which calls this for the Debian tools of TOOLS.
ensure_cmd() {
  command -v "$1" >/dev/null 2>&1 && return 0
  ensure_deb "$2" command -v "$1"
}

# ensure_deb <debian package> <test command...>: installs the package unless the test passes (for
# what is not a command on PATH: glibc's static archive, PostgreSQL's server binaries).
ensure_deb() {
  local pkg=$1; shift
  "$@" >/dev/null 2>&1 && return 0
  log "installing Debian package $pkg (a fresh machine lacks it: $* failed)"
  [ "$(id -u)" = 0 ] || die "installing the Debian package $pkg needs root"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
  "$@" >/dev/null 2>&1 || die "$* still fails after installing $pkg"
}

# --- tools: the one way a script gets a program it runs -----------------------------------------------
# Every program a script or make target runs that a fresh machine may lack is listed in TOOLS, and
# obtained before its first use with
#   need_tool [--release] <name>...  build it (the Go tools, cargo-deny and cargo-cyclonedx, and
#                       cyclonedx-py in a venv of pinned, hash-checked wheels: hack/build-tools.sh, from
#                       the pinned modules, hash-checked against hack/tools/SHA256SUMS; this workspace's
#                       binaries: cargo) or install it (Debian) when missing, verify it, put it on
#                       PATH. Done once per process (remembered in the environment: the scripts
#                       it starts do not hash it again).
#   tool_path [--release] <name>  the same, printing the path (make: `hack/tool.sh <name>`)
#   have_tool <name>    verified and on PATH if already there, building nothing (for `status`)
# Each returns non-zero on a failure rather than relying on errexit, which bash turns off inside
# `if`, `&&`, `||` and $(...): a binary that fails its hash check is never marked obtained. So a
# wrapper says `need_tool kubectl || return 1`.
# hack/tool-uses-test.sh (make lint) fails when a script, the Makefile or .ci/run runs a program
# before obtaining it this way, builds a tool's path by hand, or runs a program TOOLS does not list
# that is not in every Debian install. So a new tool is added here, then obtained where it is used.
#
# <name> <from>: "build <hack/build-tools.sh tool>", "deb <Debian package> [path when not on PATH]"
# or "cargo <workspace package>".
TOOLS='
etcd                    build etcd
kube-apiserver          build kubernetes
kube-controller-manager build kubernetes
kube-scheduler          build kubernetes
kubectl                 build kubernetes
kwok                    build kwok
helm                    build helm
promtool                build promtool
cargo-deny              build cargo-deny
cargo-cyclonedx         build cargo-cyclonedx
cyclonedx-gomod         build cyclonedx-gomod
cyclonedx-py            build cyclonedx-bom
shfmt                   build shfmt
kubelet                 build kubelet
containerd              build containerd
containerd-shim-runc-v2 build containerd
ctr                     build containerd
crictl                  build crictl
openssl                 deb openssl
curl                    deb curl
faketime                deb faketime
psql                    deb postgresql-client
mariadb                 deb mariadb-client
mariadbd                deb mariadb-server /usr/sbin/mariadbd
mariadb-install-db      deb mariadb-server
runc                    deb runc
buildah                 deb buildah
iptables                deb iptables
ip6tables               deb iptables
gcc                     deb gcc
ip                      deb iproute2
ps                      deb procps
pgrep                   deb procps
sysctl                  deb procps
free                    deb procps
cni-bridge              deb containernetworking-plugins /usr/lib/cni/bridge
singleton-controller    cargo singleton-controller
kubectl-singleton       cargo singleton-controller
billing-workload        cargo billing-workload
bench                   cargo bench
'

# tool_names: every name of TOOLS (hack/tool-uses-test.sh reads them).
tool_names() { awk 'NF { print $1 }' <<< "$TOOLS"; }
# tool_from <name>: its line of TOOLS without the name; fails for a name not there.
tool_from() {
  local from
  from=$(awk -v n="$1" '$1 == n { $1 = ""; sub(/^ +/, ""); print; exit }' <<< "$TOOLS")
  [ -n "$from" ] || die "$1 is not a tool hack/lib.sh knows (TOOLS): add it there, saying how a fresh machine gets it"
  echo "$from"
}

CARGO_TARGET=${CARGO_TARGET_DIR:-$REPO/target}
# What this process (or the script that started it) obtained and verified: " name[@release]=path"
# each, for the tools cache and target dir named in SINGLETON_TOOLS_FOR (another one: forgotten).
if [ "${SINGLETON_TOOLS_FOR:-}" != "$TOOLS_DIR|$CARGO_TARGET" ]; then SINGLETON_TOOLS_HAVE=; fi
export SINGLETON_TOOLS_FOR="$TOOLS_DIR|$CARGO_TARGET" SINGLETON_TOOLS_HAVE=${SINGLETON_TOOLS_HAVE:-}

# known <name> [release]: obtained already (SINGLETON_TOOLS_HAVE): sets TOOL_PATH, puts it on
# PATH. No subshell: wrappers (kubectl() { need_tool kubectl || return 1; ... }) call it at every use.
known() {
  local p=" $SINGLETON_TOOLS_HAVE " key=$1${2:+@$2}
  [[ $p == *" $key="* ]] || return 1
  p=${p#*" $key="}; TOOL_PATH=${p%% *}
  [ -x "$TOOL_PATH" ] || return 1
  on_path "$TOOL_PATH"
}

# on_path <path of a tool>: a built tool's directory first on PATH, so a kubectl or helm the machine
# has elsewhere is never the one run; a Debian tool is where PATH found it already.
on_path() {
  local dir=${1%/*} p
  case $1 in "$TOOLS_DIR"/* | "$CARGO_TARGET"/*) ;; *) return 0 ;; esac
  case ":$PATH:" in ":$dir:"*) return 0 ;; esac
  p=":$PATH:"; p=${p//:$dir:/:}; p=${p#:}; p=${p%:}
  export PATH="$dir${p:+:$p}"
}

# _tool <need|have|verified> <name> [release]: obtains one tool (need), checks that it is there
# (have), or takes it as verified by the caller (verified: need_tool's one build-tools.sh call);
# sets TOOL_PATH and puts its directory on PATH. A Go tool lives in its cache dir (tool_dir), a
# Debian one where the package put it, a workspace binary in cargo's target dir.
_tool() {
  local mode=$1 name=$2 profile=${3:-} kind what extra dir=debug flags=()
  known "$name" "$profile" && return 0
  read -r kind what extra <<< "$(tool_from "$name")"
  if [ "$profile" = release ]; then dir=release flags=(--release); fi
  case $kind in
    build) TOOL_PATH=$(tool_dir "$what")/$name ;;
    deb) TOOL_PATH=${extra:-$(command -v "$name" 2>/dev/null || echo "/nonexistent/$name")} ;;
    cargo) TOOL_PATH=$CARGO_TARGET/$dir/$name ;;
    *) die "TOOLS: $name comes from '$kind', which is none of build, deb, cargo" ;;
  esac
  case $mode:$kind in
    verified:build) ;;
    have:build) [ -x "$TOOL_PATH" ] && "$REPO/hack/build-tools.sh" verify "$what:$name" 2>/dev/null || return 1 ;;
    need:build) "$REPO/hack/build-tools.sh" "$what:$name" || return 1 ;;
    have:deb) [ -x "$TOOL_PATH" ] || return 1 ;;
    need:deb | verified:deb)
      if [ -n "$extra" ]; then ensure_deb "$what" test -x "$extra" || return 1
      else ensure_cmd "$name" "$what" || return 1; fi
      TOOL_PATH=${extra:-$(command -v "$name")} ;;
    have:cargo) [ -x "$TOOL_PATH" ] || return 1 ;;
    need:cargo | verified:cargo)
      if [ -x "$TOOL_PATH" ]; then
        # Up to date, or an incremental rebuild: quiet.
        (cd "$REPO" && cargo build -q --locked "${flags[@]}" -p "$what" --bin "$name") || return 1
      else
        local t0=$SECONDS
        log "building $name (Rust, $dir profile): usually $(cargo_usual "$dir") on 2 cores from nothing, seconds once built; cargo's progress follows"
        (cd "$REPO" && cargo build --locked "${flags[@]}" -p "$what" --bin "$name") || return 1
        log "built $name in $((SECONDS - t0))s"
      fi ;;
  esac
  on_path "$TOOL_PATH"
  SINGLETON_TOOLS_HAVE+=" $name${profile:+@$profile}=$TOOL_PATH"
}

# cargo_usual <debug|release>: how long a first build of a workspace binary usually takes, its
# dependencies included (README.md, "Measured").
cargo_usual() { if [ "$1" = release ]; then echo "~5 min"; else echo "~4 min"; fi; }

need_tool() {
  local profile= t kind what rest batch=()
  [ "${1:-}" != --release ] || { profile=release; shift; }
  # The Go tools not yet obtained, in one call of hack/build-tools.sh.
  for t in "$@"; do
    known "$t" "$profile" && continue
    read -r kind what rest <<< "$(tool_from "$t")"
    [ "$kind" != build ] || batch+=("$what:$t")
  done
  [ ${#batch[@]} -eq 0 ] || "$REPO/hack/build-tools.sh" "${batch[@]}" || return 1
  for t in "$@"; do _tool verified "$t" $profile || return 1; done
}
tool_path() {
  local profile=
  [ "${1:-}" != --release ] || { profile=release; shift; }
  _tool need "$1" $profile || return 1
  echo "$TOOL_PATH"
}
have_tool() { local t; for t in "$@"; do _tool have "$t" 2>/dev/null || return 1; done; }

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

# pid_execing <pidfile>: the recorded PID is still start_daemon's subshell on its way to exec the
# daemon (its program is this shell's): not dead yet. Under load the first health check came
# before the exec, and a starting etcd was taken for one that had exited (2026-12-07).
pid_execing() {
  local pid exe now
  [ -s "$1" ] || return 1
  read -r pid exe < "$1" || true
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  now=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [ "$now" = "$(readlink -f "$BASH")" ]
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
  need_tool ps || return 2
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
    if [ -n "${WAIT_PIDFILE:-}" ] && ! pid_alive "$WAIT_PIDFILE" && ! pid_execing "$WAIT_PIDFILE"; then
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
