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
    std::env::var(format!("SINGLETON_SECOND_{var}")).unwrap_or_else(|_| (first + 1000).to_string())
}

/// `hack/cluster.sh ARGS` for the second cluster.
pub fn script(args: &[&str]) -> Command {
    let mut cmd = Command::new(repo_root().join("hack/cluster.sh"));
    cmd.args(args).env("SINGLETON_CLUSTER_NAME", SECOND);
    for (var, default) in [
        ("ETCD_PORT", 32379),
        ("ETCD_PEER_PORT", 32380),
        ("APISERVER_PORT", 36443),
        ("KCM_PORT", 36257),
        ("SCHEDULER_PORT", 36259),
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
            run(script(&["up"]), "hack/cluster.sh up (second cluster)")?;
            // A previous test may have left its API server stopped.
            run(script(&["start", "kube-apiserver"]), "start its API server")?;
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
