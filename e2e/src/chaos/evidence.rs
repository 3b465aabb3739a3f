//! Evidence that a row's fault fired, measured by the harness while it injects the fault, and
//! judged by pure functions ([`restart_proofs`], [`pause_proof`], [`skew_proof`],
//! [`lease_kept_proof`]) into [`Proof`]s that the checker requires.
//!
//! Why measure: `hack/cluster.sh stop|start|restart|pause|resume` are idempotent, so on a stale
//! pidfile (a component started by someone else, or restarted outside the script) `stop` does
//! nothing and `start` finds it running, and both exit 0: the row would pass without its fault.
//! So the harness reads the component's pid before and after, probes its port during the window
//! (a stopped component refuses connections), and samples a paused process's state; a skewed
//! replica's clock is read from its own log, and whether it kept the Lease from the Lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use jiff::Timestamp;

use super::check::Proof;
use crate::commands::repo_root;

/// A component stopped and started again, as the harness saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restart {
    pub component: String,
    /// Its identity before and after: a pid from its pidfile (still running the binary it
    /// records), or PostgreSQL's `pg_postmaster_start_time()`. None: not running.
    pub before: Option<String>,
    pub after: Option<String>,
    /// The process of `before` still ran after the fault (a pid identity only).
    pub old_alive_after: bool,
    pub port: u16,
    /// Connection attempts to `port` while the component was meant to be down, and how many
    /// were refused.
    pub probes: u64,
    pub refused: u64,
}

/// A stop/start (or restart) fired: the component ran before, runs as another process (or
/// another postmaster) after, the old one is gone, and its port refused connections meanwhile.
pub fn restart_proofs(r: &Restart) -> Vec<Proof> {
    let replaced = match (&r.before, &r.after) {
        (None, _) => Proof::new(
            false,
            format!(
                "{} was not running before the fault (no live pid): stopping it was a no-op",
                r.component
            ),
        ),
        (Some(b), None) => Proof::new(
            false,
            format!("{} ({b}) was not running after the fault", r.component),
        ),
        (Some(b), Some(a)) if a == b => Proof::new(
            false,
            format!(
                "{} is still {b} after the fault: it was never stopped (a stale pidfile makes stop and start no-ops)",
                r.component
            ),
        ),
        (Some(b), Some(_)) if r.old_alive_after => Proof::new(
            false,
            format!(
                "{}'s old process {b} still runs after the fault",
                r.component
            ),
        ),
        (Some(b), Some(a)) => Proof::new(true, format!("{} {b} replaced by {a}", r.component)),
    };
    let down = Proof::new(
        r.refused > 0,
        format!(
            "{}'s port {} refused {} of {} connection attempts during the fault",
            r.component, r.port, r.refused, r.probes
        ),
    );
    vec![replaced, down]
}

/// A SIGSTOP fired: the process was seen stopped (state `T`) in every sample of the window.
pub fn pause_proof(what: &str, samples: u64, stopped: u64) -> Proof {
    Proof::new(
        samples > 0 && stopped == samples,
        format!("{what} seen stopped (state T) in {stopped} of {samples} samples during the fault"),
    )
}

/// How far a process's clock is off: the first timestamp in its log (a tracing line starts with
/// one, RFC 3339, possibly inside ANSI colour codes) minus the real time it was `started`.
pub fn log_clock_offset(log: &str, started: Timestamp) -> Option<f64> {
    log.lines().find_map(|line| {
        let plain = strip_ansi(line);
        let first = plain.split_whitespace().next()?;
        let ts: Timestamp = first.parse().ok()?;
        Some(ts.duration_since(started).as_secs_f64())
    })
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params final-byte (@ to ~).
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A clock skew fired: the replica's log runs `want` seconds off real time (within 10 s: the
/// first line comes within a few seconds of its start on a loaded machine; an unskewed replica
/// shows about 0).
pub fn skew_proof(replica: &str, want: i64, seen: Option<f64>) -> Proof {
    match seen {
        Some(s) => Proof::new(
            (s - want as f64).abs() <= 10.0,
            format!("{replica}'s log clock is {s:+.1} s off real time (libfaketime {want:+} s)"),
        ),
        None => Proof::new(
            false,
            format!("{replica}'s log has no timestamp to show its clock is {want:+} s off"),
        ),
    }
}

/// The faulted replica kept the Lease through the window (it led in every sample), so the fault
/// was on the leader for as long as the row says.
pub fn lease_kept_proof(replica: &str, samples: u64, held: u64) -> Proof {
    Proof::new(
        samples > 0 && held == samples,
        format!("{replica} held the Lease in {held} of {samples} samples during the fault"),
    )
}

/// The pid in a `hack/cluster.sh` pidfile (`PID EXE`) of the cluster named `cluster`, or else of
/// the one `hack/cluster.sh` acts on in this environment (`SINGLETON_CLUSTER_NAME`, as
/// hack/own-cluster.sh sets it; unset: the default cluster), if that process still runs the
/// binary it records (what `pid_alive` in hack/lib.sh checks).
pub fn cluster_pid(cluster: Option<&str>, component: &str) -> Option<u32> {
    let named = std::env::var("SINGLETON_CLUSTER_NAME").ok();
    let dir = match cluster.or(named.as_deref().filter(|n| !n.is_empty())) {
        None => ".cache/cluster".to_string(),
        Some(n) => format!(".cache/cluster-{n}"),
    };
    let text = std::fs::read_to_string(
        repo_root()
            .join(dir)
            .join("pids")
            .join(format!("{component}.pid")),
    )
    .ok()?;
    let mut words = text.split_whitespace();
    let pid: u32 = words.next()?.parse().ok()?;
    let exe = words.next();
    if !process_alive(pid) {
        return None;
    }
    if let Some(exe) = exe {
        let now = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        let now = now.display().to_string();
        if now != exe && now != format!("{exe} (deleted)") {
            return None;
        }
    }
    Some(pid)
}

/// The state letter of process `pid` in /proc (`T`: stopped), None when it does not exist.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Waits until process `pid` is seen stopped (state `T`), at most `within`: `kill -STOP` returns
/// before the kernel stops the process, which on a busy machine can take a scheduling round, so
/// the window whose every sample must show it stopped starts once it is (a sample taken before
/// failed a CI run's etcd-pause, 69 of 70). Whether it stopped in time.
pub async fn wait_stopped(pid: u32, within: Duration) -> bool {
    let end = tokio::time::Instant::now() + within;
    loop {
        if process_state(pid) == Some('T') {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Process `pid` exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    !matches!(process_state(pid), None | Some('Z') | Some('X'))
}

/// Connection attempts to 127.0.0.1:`port` every 50 ms until [`PortProbe::finish`]: how many
/// were refused (nothing listening), measured while a component is meant to be down.
pub struct PortProbe {
    stop: Arc<AtomicBool>,
    probes: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl PortProbe {
    pub fn start(port: u16) -> PortProbe {
        let (stop, probes, refused) = (Arc::default(), Arc::default(), Arc::default());
        let task = tokio::spawn({
            let (stop, probes, refused): (Arc<AtomicBool>, Arc<AtomicU64>, Arc<AtomicU64>) =
                (Arc::clone(&stop), Arc::clone(&probes), Arc::clone(&refused));
            async move {
                while !stop.load(Ordering::SeqCst) {
                    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                    let r = tokio::time::timeout(
                        Duration::from_millis(500),
                        tokio::net::TcpStream::connect(addr),
                    )
                    .await;
                    probes.fetch_add(1, Ordering::SeqCst);
                    if matches!(r, Ok(Err(_))) {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
        PortProbe {
            stop,
            probes,
            refused,
            task,
        }
    }

    /// Stops probing: (attempts, refused).
    pub async fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.task.await;
        (
            self.probes.load(Ordering::SeqCst),
            self.refused.load(Ordering::SeqCst),
        )
    }
}

/// Samples process `pid`'s state every 100 ms until [`StateSampler::finish`]: (samples,
/// samples in state `T`).
pub struct StateSampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(u64, u64)>,
}

impl StateSampler {
    pub fn start(pid: u32) -> StateSampler {
        let stop: Arc<AtomicBool> = Arc::default();
        let task = tokio::spawn({
            let stop = Arc::clone(&stop);
            async move {
                let (mut samples, mut stopped) = (0, 0);
                while !stop.load(Ordering::SeqCst) {
                    samples += 1;
                    if process_state(pid) == Some('T') {
                        stopped += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                (samples, stopped)
            }
        });
        StateSampler { stop, task }
    }

    pub async fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap_or((0, 0))
    }
}

/// The port of an `https://host:port` URL (a kubeconfig's server).
pub fn url_port(url: &str) -> Option<u16> {
    url.trim_end_matches('/').rsplit(':').next()?.parse().ok()
}

/// The server URL in a kubeconfig file.
pub fn kubeconfig_server(path: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(path).ok()?.lines().find_map(|l| {
        l.trim()
            .strip_prefix("server: ")
            .map(|s| s.trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restart() -> Restart {
        Restart {
            component: "kube-apiserver".into(),
            before: Some("pid 100".into()),
            after: Some("pid 200".into()),
            old_alive_after: false,
            port: 6443,
            probes: 40,
            refused: 31,
        }
    }

    fn held(proofs: &[Proof]) -> bool {
        proofs.iter().all(|p| p.held)
    }

    #[test]
    fn a_restart_that_happened_is_shown() {
        let p = restart_proofs(&restart());
        assert!(held(&p), "{p:?}");
        assert!(p[0].what.contains("pid 100 replaced by pid 200"));
        assert!(p[1].what.contains("refused 31 of 40"));
    }

    #[test]
    fn a_restart_that_was_a_no_op_is_not() {
        // A stale pidfile: stop found nothing to stop, start found the port answering.
        let same = Restart {
            after: Some("pid 100".into()),
            refused: 0,
            ..restart()
        };
        let p = restart_proofs(&same);
        assert!(!p[0].held && !p[1].held, "{p:?}");
        assert!(p[0].what.contains("never stopped"));
        let not_running = Restart {
            before: None,
            ..restart()
        };
        assert!(!restart_proofs(&not_running)[0].held);
        let still_alive = Restart {
            old_alive_after: true,
            ..restart()
        };
        assert!(!restart_proofs(&still_alive)[0].held);
        let never_down = Restart {
            refused: 0,
            ..restart()
        };
        let p = restart_proofs(&never_down);
        assert!(p[0].held && !p[1].held);
    }

    #[test]
    fn a_pause_must_be_seen_throughout() {
        assert!(pause_proof("etcd", 50, 50).held);
        assert!(!pause_proof("etcd", 50, 49).held);
        assert!(!pause_proof("etcd", 0, 0).held);
    }

    #[test]
    fn the_clock_offset_is_read_from_the_first_log_line() {
        let started: Timestamp = "2027-01-01T00:00:00Z".parse().unwrap();
        let log = "\u{1b}[2m2027-01-01T00:00:40.512Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m singleton: starting\n\
                   2027-01-01T00:00:41Z INFO later\n";
        let off = log_clock_offset(log, started).unwrap();
        assert!((off - 40.512).abs() < 1e-6, "{off}");
        assert_eq!(log_clock_offset("no timestamp here\n", started), None);
        assert!(skew_proof("replica 1", 40, Some(off)).held);
        assert!(skew_proof("replica 1", -40, Some(-39.0)).held);
        // libfaketime did not apply: the log runs on real time.
        assert!(!skew_proof("replica 1", 40, Some(0.3)).held);
        assert!(!skew_proof("replica 1", 40, None).held);
    }

    #[test]
    fn the_lease_must_be_kept_throughout() {
        assert!(lease_kept_proof("replica 1", 60, 60).held);
        assert!(!lease_kept_proof("replica 1", 60, 58).held);
        assert!(!lease_kept_proof("replica 1", 0, 0).held);
    }

    #[test]
    fn ports_come_from_server_urls() {
        assert_eq!(url_port("https://127.0.0.1:46443"), Some(46443));
        assert_eq!(url_port("https://127.0.0.1:46443/"), Some(46443));
        assert_eq!(url_port("https://localhost"), None);
    }
}
