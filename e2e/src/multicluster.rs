//! A second control plane for the multi-cluster tests (tests/multicluster.rs,
//! docs/multi-cluster.md): `hack/cluster.sh` with `SINGLETON_CLUSTER_NAME=second`, on the first
//! cluster's ports plus 1000 (unless `SINGLETON_SECOND_*_PORT` say otherwise), sharing the first
//! cluster's PostgreSQL. Started on first use (a no-op when it runs); `make e2e` stops it after.
//! One test at a time holds it ([`SecondCluster`]): the tests stop its API server.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context as _, Result, bail};
use tokio::sync::{Mutex, MutexGuard};

use crate::commands::{kubectl, repo_root};

/// The second cluster's name for `hack/cluster.sh` (state in `.cache/cluster-second`).
pub const SECOND: &str = "second";

/// What the second cluster adds to each of the first cluster's ports.
pub const SECOND_PORT_OFFSET: u16 = 1000;
/// What `tests/demo_dr.rs` adds to the first cluster's ports for west and east (and to
/// PostgreSQL's, west's, for their database), so that demo-dr runs beside both clusters.
pub const DEMO_DR_PORT_OFFSETS: [u16; 2] = [2000, 3000];

static HELD: Mutex<bool> = Mutex::const_new(false);

/// The second control plane, held by one test at a time.
pub struct SecondCluster {
    pub kubeconfig: PathBuf,
    _held: MutexGuard<'static, bool>,
}

fn port(var: &str, default: u16) -> String {
    let first = std::env::var(format!("SINGLETON_{var}"))
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or(default);
    std::env::var(format!("SINGLETON_SECOND_{var}"))
        .unwrap_or_else(|_| (first + SECOND_PORT_OFFSET).to_string())
}

/// `hack/cluster.sh ARGS` for the second cluster.
pub fn script(args: &[&str]) -> Command {
    let mut cmd = Command::new(repo_root().join("hack/cluster.sh"));
    cmd.args(args).env("SINGLETON_CLUSTER_NAME", SECOND);
    for (var, default) in [
        ("ETCD_PORT", 22379),
        ("ETCD_PEER_PORT", 22380),
        ("APISERVER_PORT", 26443),
        ("KCM_PORT", 26257),
        ("SCHEDULER_PORT", 26259),
    ] {
        cmd.env(format!("SINGLETON_{var}"), port(var, default));
    }
    cmd
}

fn run(mut cmd: Command, what: &str) -> Result<()> {
    let out = cmd.output().with_context(|| what.to_string())?;
    if !out.status.success() {
        bail!(
            "{what} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

impl SecondCluster {
    /// Waits for the other tests to let go of it, then makes sure it runs (with the CRDs).
    pub async fn hold() -> Result<SecondCluster> {
        let mut held = HELD.lock().await;
        let kubeconfig = repo_root().join(format!(".cache/cluster-{SECOND}/kubeconfig"));
        let up = tokio::task::spawn_blocking(move || -> Result<()> {
            // A previous test may have left its API server stopped (its holder's drop starts it
            // again, best effort). Started first: `up` takes a cluster with a component down for
            // one that crashed and starts it all afresh, and a fresh API server once met the old
            // one still shutting down (2026-12-05 18:41: "/readyz: the process exited"). Only
            // while its etcd runs (hack/cluster.sh's pidfile): else `up` starts it all.
            let etcd = repo_root().join(format!(".cache/cluster-{SECOND}/pids/etcd.pid"));
            if etcd.exists() {
                let _ = script(&["start", "kube-apiserver"]).output();
            }
            run(script(&["up"]), "hack/cluster.sh up (second cluster)")?;
            let mut apply = kubectl();
            apply
                .arg("--kubeconfig")
                .arg(repo_root().join(format!(".cache/cluster-{SECOND}/kubeconfig")))
                .args(["apply", "--server-side", "--force-conflicts", "-f"])
                .arg(repo_root().join("crds"));
            run(apply, "apply the CRDs to the second cluster")?;
            let mut wait = kubectl();
            wait.arg("--kubeconfig")
                .arg(repo_root().join(format!(".cache/cluster-{SECOND}/kubeconfig")))
                .args(["wait", "--for=condition=Established", "--timeout=60s", "-f"])
                .arg(repo_root().join("crds"));
            run(wait, "wait for the CRDs in the second cluster")
        });
        up.await??;
        *held = true;
        Ok(SecondCluster {
            kubeconfig,
            _held: held,
        })
    }

    /// Stops (`stop`) or starts (`start`) its kube-apiserver.
    pub async fn apiserver(&self, action: &'static str) -> Result<()> {
        tokio::task::spawn_blocking(move || {
            run(
                script(&[action, "kube-apiserver"]),
                "second cluster's API server",
            )
        })
        .await?
    }
}

impl Drop for SecondCluster {
    fn drop(&mut self) {
        // Leave it serving for the next test, whatever this one did.
        let _ = script(&["start", "kube-apiserver"]).output();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The `NAME:-PORT` defaults a script gives its port variables, and demo-dr's port lists.
    fn defaults(script: &str) -> Vec<(String, u16)> {
        let text = std::fs::read_to_string(repo_root().join(script)).unwrap();
        let mut found = Vec::new();
        for part in text.split("${").skip(1) {
            let Some((name, rest)) = part.split_once(":-") else {
                continue;
            };
            if !name.ends_with("PORT") && !name.ends_with("PORTS") {
                continue;
            }
            let value = rest.split('}').next().unwrap_or_default();
            for p in value.split_whitespace() {
                found.push((name.to_string(), p.parse().unwrap()));
            }
        }
        found
    }

    /// Every port the local clusters listen on (the first, the second, demo_dr's west and east,
    /// hack/own-cluster.sh's, `make demo-dr`'s) lies below the kernel's ephemeral range, where an
    /// outgoing connection can take it first (CI lost the second cluster's etcd to "address
    /// already in use" so), and no two of the clusters that run at once share one.
    #[test]
    fn the_clusters_ports_are_distinct_and_below_the_ephemeral_range() {
        let cluster = defaults("hack/cluster.sh");
        let pg = defaults("hack/postgres.sh");
        assert_eq!(cluster.len(), 5, "{cluster:?}");
        assert!(!pg.is_empty());
        let pg = pg[0].1;
        let mut all = BTreeSet::new();
        let mut add = |p: u16, what: &str| {
            assert!(p < 32768, "{what}: {p} is in the ephemeral range");
            assert!(all.insert(p), "{what}: {p} is used twice");
        };
        add(pg, "PostgreSQL");
        for offset in [0, SECOND_PORT_OFFSET]
            .into_iter()
            .chain(DEMO_DR_PORT_OFFSETS)
        {
            for (name, p) in &cluster {
                add(p + offset, &format!("{name} + {offset}"));
            }
        }
        add(pg + DEMO_DR_PORT_OFFSETS[0], "demo_dr's PostgreSQL");
        // hack/own-cluster.sh's four instances (the cluster-wide chaos rows', the
        // hostile-tenant suite's, the version-skew tests', the upgrade suite's): a control
        // plane and a PostgreSQL each, beside all of those.
        let own_cluster = defaults("hack/own-cluster.sh");
        assert_eq!(own_cluster.len(), 24, "{own_cluster:?}");
        for (name, p) in own_cluster {
            add(p, &format!("hack/own-cluster.sh's {name}"));
        }
        // `make demo-dr` runs alone (the e2e test moves it), but beside the first cluster.
        let mut own = BTreeSet::new();
        for (name, p) in defaults("hack/demo-dr.sh") {
            assert!(p < 32768, "{name}: {p} is in the ephemeral range");
            assert!(own.insert(p), "{name}: {p} is used twice");
            assert!(
                cluster.iter().all(|(_, c)| *c != p) && p != pg,
                "{name}: {p} is the first cluster's"
            );
        }
        assert_eq!(own.len(), 11);
    }
}
