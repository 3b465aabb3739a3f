//! Faults on the pods of a run (issue 31): a run is one process at a time. Three things that
//! happen to a run's pod on a real node, each while the billing workload works (it has
//! registered as its run's attempt and not yet committed):
//!
//! - `real-pod-delete-working`: the pod is deleted (a person, an eviction) with a grace period
//!   longer than the work. Kubernetes starts no replacement while it terminates
//!   (`podReplacementPolicy: Failed`); the pod finishes its run, once.
//! - `real-node-drain`: the pod's node (the second real node) is drained. The same, through the
//!   eviction API; later runs land on the other node.
//! - `real-kubelet-partition`: the pod's node stops answering (its kubelet frozen) while the
//!   pod's process keeps running, held just before its commit (its container frozen: a pause on
//!   the far side of a partition). The node turns NotReady, the pod is evicted, the operator
//!   applies Kubernetes' non-graceful-shutdown taint, PodGC marks the pod Failed and the Job
//!   starts a replacement on the other node, which registers as the run's newer attempt and
//!   commits. Then the old process resumes and tries to commit: the attempt fence refuses it.
//!
//! The checker counts, from the databases, the attempts that committed per period and whether
//! two overlapped; each row here also proves its fault happened ([`Proof`]).

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};

use super::check::Proof;
use super::real::RealWorld;
use crate::kubectl;
use crate::real_node::{
    NODE, NODE_2, freeze_kubelet, freezer_of, set_freezer, taint_out_of_service,
    untaint_out_of_service, wait, wait_node_ready,
};

/// The work of these rows' runs, seconds: long enough to be hit while working.
pub(super) const WORK: u32 = 6;

/// One attempt of a run as the backstop registered it.
#[derive(Clone, Debug)]
struct Registered {
    attempt: String,
    seq: i32,
}

/// A run's pod that runs and has registered as its run's attempt: the Job, its token, its
/// period, the pod's name and node, and its container's id.
struct Working {
    job: String,
    token: u64,
    period: Timestamp,
    pod: String,
    /// The pod's uid: its attempt's id.
    uid: String,
    node: String,
    container: String,
}

impl RealWorld {
    /// The attempts the backstop registered for the run with `token`, in order.
    async fn registered(&self, token: u64) -> Result<Vec<Registered>> {
        let (db, conn) = tokio_postgres::connect(&self.s.host_url, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        let job = format!("{}/invoices", self.s.work.ns);
        let rows = db
            .query(
                "SELECT attempt, seq FROM singleton_attempts WHERE job = $1 AND token = $2 ORDER BY seq",
                &[&job, &(token as i64)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| Registered {
                attempt: r.get(0),
                seq: r.get(1),
            })
            .collect())
    }

    /// The next run whose pod runs (on `node`, if given) and has registered its attempt.
    async fn working(&self, node: Option<&str>) -> Result<Working> {
        let after = Timestamp::now();
        let pods = Api::<Pod>::namespaced(self.s.work.client.clone(), &self.s.work.ns);
        wait(
            "a run's pod working (running, its attempt registered)",
            Duration::from_secs(90),
            &[&self.s.work.ns],
            || async {
                let Some(job) = self.observer.jobs().into_iter().find(|j| {
                    j.ran
                        && !j.finished
                        && j.deleted.is_none()
                        && j.period.is_some_and(|p| p > after)
                }) else {
                    return Ok(None);
                };
                let token = job.token.context("a run's Job without a token")?;
                let list = pods
                    .list(&ListParams::default().labels(&format!("job-name={}", job.name)))
                    .await?;
                for p in list {
                    let on = p
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_default();
                    if node.is_some_and(|n| n != on) || p.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    let Some(container) = running_container(&p) else {
                        continue;
                    };
                    let uid = p.uid().unwrap_or_default();
                    if !self
                        .registered(token)
                        .await?
                        .iter()
                        .any(|r| r.attempt == uid)
                    {
                        continue;
                    }
                    return Ok(Some(Working {
                        job: job.name.clone(),
                        token,
                        period: job.period.unwrap_or(after),
                        pod: p.name_any(),
                        uid,
                        node: on,
                        container,
                    }));
                }
                Ok(None)
            },
        )
        .await
    }

    /// Waits until `pod` is gone from the API server; whether another pod of its Job existed
    /// meanwhile (a replacement started while it still terminated).
    async fn gone_alone(&self, w: &Working) -> Result<bool> {
        let pods = Api::<Pod>::namespaced(self.s.work.client.clone(), &self.s.work.ns);
        let others = std::sync::atomic::AtomicBool::new(false);
        wait(
            &format!("pod {} to be gone", w.pod),
            Duration::from_secs(150),
            &[&self.s.work.ns],
            || async {
                let list = pods
                    .list(&ListParams::default().labels(&format!("job-name={}", w.job)))
                    .await?;
                let here = list.iter().any(|p| p.name_any() == w.pod);
                if list.iter().any(|p| p.name_any() != w.pod) {
                    others.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                Ok((!here).then_some(()))
            },
        )
        .await?;
        Ok(others.into_inner())
    }
}

/// The id of the pod's running container, if it runs.
fn running_container(p: &Pod) -> Option<String> {
    let st = p.status.as_ref()?;
    let c = st
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))?;
    Some(c.container_id.as_ref()?.rsplit("://").next()?.to_string())
}

/// `kubectl` with its arguments; its output, or an error with what it printed.
fn kubectl_ok(args: &[&str]) -> Result<String> {
    let out = kubectl().args(args).output()?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `real-pod-delete-working`: the working pod deleted with its grace period (longer than the
/// work). Proves: the pod was deleted while it worked; no other pod of its run existed until it
/// was gone; the run had one attempt.
pub(super) async fn delete_working(w: &RealWorld) -> Result<Proof> {
    let run = w.working(None).await?;
    Api::<Pod>::namespaced(w.s.work.client.clone(), &w.s.work.ns)
        .delete(&run.pod, &DeleteParams::default())
        .await?;
    let others = w.gone_alone(&run).await?;
    let attempts = w.registered(run.token).await?;
    Ok(Proof::new(
        !others && attempts.len() == 1,
        format!(
            "pod {} of {} (period {}, token {}) deleted while it worked on {}; another pod of the run while it terminated: {others}; attempts registered: {}",
            run.pod,
            run.job,
            run.period,
            run.token,
            run.node,
            attempts.len()
        ),
    ))
}

/// `real-node-drain`: the working pod's node (the second real node, where the row makes it run
/// by cordoning the first) drained. Proves: the drain evicted the working pod; no other pod of its
/// run existed until it was gone; the run had one attempt.
pub(super) async fn drain_working(w: &RealWorld) -> Result<Proof> {
    kubectl_ok(&["cordon", NODE])?;
    let run = w.working(Some(NODE_2)).await;
    kubectl_ok(&["uncordon", NODE])?;
    let run = run?;
    let drained = kubectl_ok(&[
        "drain",
        NODE_2,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=150s",
        "--pod-selector",
        &format!("job-name={}", run.job),
    ]);
    kubectl_ok(&["uncordon", NODE_2])?;
    let drained = drained?;
    let others = w.gone_alone(&run).await?;
    let attempts = w.registered(run.token).await?;
    let evicted = drained.contains(&format!("pod/{} evicted", run.pod));
    Ok(Proof::new(
        evicted && !others && attempts.len() == 1,
        format!(
            "node {NODE_2} drained while pod {} of {} (period {}, token {}) worked there (evicted: {evicted}); another pod of the run while it terminated: {others}; attempts registered: {}",
            run.pod,
            run.job,
            run.period,
            run.token,
            attempts.len()
        ),
    ))
}

/// `real-kubelet-partition`; see the module doc. Proves: the working pod's node went NotReady
/// with its container still there; the pod was evicted and replaced on the other node; the
/// replacement registered as the run's second attempt; the old process, resumed after that,
/// was refused by the fence (its commit is not among the run's ledger rows, and the fence counted
/// a refusal).
pub(super) async fn partition_working(w: &RealWorld) -> Result<Proof> {
    kubectl_ok(&["cordon", NODE])?;
    let run = w.working(Some(NODE_2)).await;
    kubectl_ok(&["uncordon", NODE])?;
    let run = run?;
    // The old process, held just before its commit (a pause on the far side of the partition),
    // and its node cut off from the API server.
    let cgroup = freezer_of(&run.container)?;
    set_freezer(&cgroup, "FROZEN").await?;
    let refusals_before = refusals(w).await?;
    let kubelet = freeze_kubelet(NODE_2).await?;
    let result = partition_steps(w, &run).await;
    // Whatever happened, the old process resumes (it then commits or is refused) and the node
    // comes back.
    set_freezer(&cgroup, "THAWED").await?;
    let refused = match &result {
        Ok(_) => old_refused(w, &run, refusals_before).await,
        Err(_) => Ok(false),
    };
    kubelet.thaw().await?;
    untaint_out_of_service(&w.s.env, NODE_2).await?;
    wait_node_ready(&w.s.env, NODE_2, true, Duration::from_secs(90)).await?;
    let (not_ready_after, replacement) = result?;
    let refused = refused?;
    Ok(Proof::new(
        refused,
        format!(
            "node {NODE_2}'s kubelet frozen while pod {} of {} (period {}, token {}) worked there: NotReady after {not_ready_after:.1?}; replaced by attempt #{} ({}) on {NODE}; the old process, resumed after that, refused by the fence: {refused}",
            run.pod, run.job, run.period, run.token, replacement.seq, replacement.attempt
        ),
    ))
}

/// The partition's steps up to the replacement's registration: how long the node took to turn
/// NotReady, and the replacement's attempt.
async fn partition_steps(w: &RealWorld, run: &Working) -> Result<(Duration, Registered)> {
    let not_ready = wait_node_ready(&w.s.env, NODE_2, false, Duration::from_secs(120)).await?;
    let pods = Api::<Pod>::namespaced(w.s.work.client.clone(), &w.s.work.ns);
    wait(
        &format!("pod {} evicted from the unreachable node", run.pod),
        Duration::from_secs(60),
        &[&w.s.work.ns],
        || async {
            let p = pods.get_opt(&run.pod).await?;
            Ok(p.is_none_or(|p| p.metadata.deletion_timestamp.is_some())
                .then_some(()))
        },
    )
    .await?;
    // The operator's answer to a node that does not come back (Kubernetes' non-graceful node
    // shutdown): PodGC then force-deletes its pods, and the Job replaces them.
    taint_out_of_service(&w.s.env, NODE_2).await?;
    let replacement = wait(
        "the replacement pod to register as the run's newer attempt",
        Duration::from_secs(120),
        &[&w.s.work.ns],
        || async {
            let attempts = w.registered(run.token).await?;
            Ok(attempts.into_iter().find(|a| a.seq > 1))
        },
    )
    .await?;
    Ok((not_ready, replacement))
}

/// The fence's refusal count (the backstop's sequence), for the old process's refusal.
async fn refusals(w: &RealWorld) -> Result<i64> {
    let (db, conn) = tokio_postgres::connect(&w.s.host_url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    Ok(db
        .query_one(
            "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM singleton_fence_rejections",
            &[],
        )
        .await?
        .get(0))
}

/// After the old process resumed: the fence counted a refusal, and no ledger row of the old
/// attempt exists. (A commit of it would show as a ledger row, which the checker's attempt
/// columns count as well.)
async fn old_refused(w: &RealWorld, run: &Working, before: i64) -> Result<bool> {
    wait(
        "the resumed old process to end its transaction",
        Duration::from_secs(60),
        &[&w.s.work.ns],
        || async {
            let (db, conn) = tokio_postgres::connect(&w.s.host_url, tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            let committed: i64 = db
                .query_one(
                    "SELECT count(*) FROM run_attempts WHERE token = $1 AND attempt = $2",
                    &[&(run.token as i64), &run.uid],
                )
                .await?
                .get(0);
            if committed > 0 {
                return Ok(Some(false));
            }
            Ok((refusals(w).await? > before).then_some(true))
        },
    )
    .await
}
