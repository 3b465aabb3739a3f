//! Faults on real pods (issue #18): the chart's two controller pods on the real node (hack/node.sh),
//! the billing workload's real containers writing with their tokens, and faults an operator meets
//! on a node: the leader's processes frozen with the cgroup freezer past its Lease (a VM or GC
//! pause), its container killed through the CRI (`crictl stop -t 0`), its pod deleted, and a running
//! workload frozen past the Replace of its run. The same checker as the other rows counts Jobs per
//! period from a watch, claims from the backstop's table, writes from the workload's own table and,
//! once the billing workload records them (schema 5: `run_attempts`), its committed attempts.
//!
//! Each fault is timed to come 1.5 s before an instant of the schedule, and its window ends no
//! sooner than half a second after that instant, so that a period always falls due while it is
//! on (the pod deletion's handover takes under a second: without the timing, most windows would
//! hold no period at all).
//!
//! Needs the real node and the images (`make image`, which `make e2e` and `make chaos` run when
//! the node is up): without them these scenarios fail and say so; they never pass vacuously.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};

use super::check::{
    self, Claim, CommittedAttempt, Expect, FaultWindow, Observations, Proof, Write, WriteResult,
};
use super::world::observe_sjs;
use super::{CATCH_UP, Fault, HANDOVER_MAX, Mode, Outcome, real_pods};
use crate::commands::repo_root;
use crate::observer::{JobRecord, Observer};
use crate::real_node::{
    Placement, Setup, billing_sj_on, freezer_of, leader_container, lease_holder, ready_pods,
    running_pod_of, second_node_up, set_freezer, setup, wait,
};
use crate::{Env, kubectl};

/// The SingletonJob of [`crate::real_node::billing_sj`].
const SJ: &str = "invoices";
/// How long to wait for a takeover at most.
const LEASE_WAIT: Duration = Duration::from_secs(60);
/// The chart's leader election (charts/singleton-controller/values.yaml): lease duration and
/// retry period. A takeover after a crash takes at most a lease plus a retry period
/// (docs/observability.md); plus 2 s for API round trips and polling on two loaded cores.
const CHART_LEASE: Duration = Duration::from_secs(15);
const CHART_RETRY: Duration = Duration::from_secs(2);
const TAKEOVER_SLACK: Duration = Duration::from_secs(2);
/// How long before an instant each fault is injected.
const BEFORE_INSTANT: SignedDuration = SignedDuration::from_millis(1500);

/// Rounds of the fault: once in the short form, three times in the full one.
fn rounds(mode: Mode) -> usize {
    match mode {
        Mode::Short => 1,
        Mode::Full => 3,
    }
}

/// What a real-pod row must show: a period due in the window of each round; the takeover
/// bounds the documentation states (lease + retry after a freeze or a kill; under a second
/// when the leader's pod is deleted, docs/reliability.md); a refused stale write when a workload
/// is frozen.
pub(super) fn expect(fault: Fault, mode: Mode) -> Expect {
    let n = rounds(mode);
    let (failover_max, min_failovers) = match fault {
        Fault::RealLeaderFreeze | Fault::RealContainerKill => {
            (Some(CHART_LEASE + CHART_RETRY + TAKEOVER_SLACK), n)
        }
        Fault::RealPodDelete => (Some(HANDOVER_MAX), n),
        _ => (None, 0),
    };
    Expect {
        pause: fault == Fault::RealWorkloadFreeze,
        reasons: CATCH_UP,
        min_due_in_fault: n as u64,
        failover_max,
        min_failovers,
        ..Expect::default()
    }
}

/// One real-pod scenario's world: the chart, the work namespace and a watch of its Jobs.
pub(super) struct RealWorld {
    pub(super) s: Setup,
    pub(super) observer: Observer,
    schedule: &'static str,
}

impl RealWorld {
    async fn start(fault: Fault) -> Result<RealWorld> {
        let s = setup(&format!("chaos-{}", fault.name())).await?;
        let observer = Observer::watch(s.work.client.clone(), &s.work.ns).await?;
        wait(
            "two Ready controller pods, one of them leading",
            Duration::from_secs(120),
            &[&s.env.ns],
            || async {
                let pods = ready_pods(&s.env, &s.release).await?;
                let led = lease_holder(&s.env, &s.release).await?.is_some();
                Ok((pods.len() == 2 && led).then_some(()))
            },
        )
        .await?;
        // The workload's runs take a real pod's start (about a second here) plus their work:
        // Forbid every 5 s leaves room; the Replace case works 5 s of a 10 s period, so that a
        // run frozen before its write is still active when the next period replaces it.
        // The rows on a run's pods (real_pods) work long enough to be hit while working, on
        // either real node, retried when a pod fails.
        let (schedule, policy, work, placement) = match fault {
            Fault::RealWorkloadFreeze => ("*/10 * * * * *", "Replace", 5, Placement::FirstNode),
            Fault::RealPodDeleteWorking | Fault::RealNodeDrain | Fault::RealKubeletPartition => (
                "*/10 * * * * *",
                "Forbid",
                real_pods::WORK,
                Placement::EitherNode,
            ),
            _ => ("*/5 * * * * *", "Forbid", 0, Placement::FirstNode),
        };
        if placement == Placement::EitherNode {
            second_node_up().await?;
        }
        s.work
            .create_sj(&billing_sj_on(schedule, policy, work, placement))
            .await?;
        Ok(RealWorld {
            s,
            observer,
            schedule,
        })
    }

    /// The first period after `t` whose run was allowed to run pods, if any.
    fn ran_since(&self, t: Timestamp) -> Option<Timestamp> {
        self.observer
            .jobs()
            .iter()
            .filter(|j| j.ran)
            .filter_map(|j| j.period.filter(|p| *p > t))
            .min()
    }

    /// Waits for a run of a period after `t`; that period.
    async fn wait_ran_since(
        &self,
        what: &str,
        t: Timestamp,
        timeout: Duration,
    ) -> Result<Timestamp> {
        wait(
            what,
            timeout,
            &[&self.s.work.ns, &self.s.env.ns],
            || async { Ok(self.ran_since(t)) },
        )
        .await
    }

    /// The Lease's holder now (a process: `<pod>-<random>`), and its pod and container.
    async fn leader(&self) -> Result<(String, String, String)> {
        let holder = lease_holder(&self.s.env, &self.s.release)
            .await?
            .context("the Lease is not held")?;
        let (pod, container) = leader_container(&self.s.env, &self.s.release).await?;
        Ok((holder, pod, container))
    }

    /// Waits until a process other than `holder` holds the Lease (another pod, or the same pod's
    /// restarted container): the new holder, and how long that took from `t0` (polled every
    /// 50 ms, so that a sub-second handover is measured as one).
    async fn takeover(&self, holder: &str, t0: Instant) -> Result<(String, Duration)> {
        loop {
            if let Ok(Ok(Some(h))) = tokio::time::timeout(
                Duration::from_secs(2),
                lease_holder(&self.s.env, &self.s.release),
            )
            .await
                && h != holder
            {
                return Ok((h, t0.elapsed()));
            }
            if t0.elapsed() > LEASE_WAIT {
                bail!(
                    "no takeover of the Lease from {holder} within {LEASE_WAIT:?}\n{}",
                    self.dump().await
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The schedule's next instant after now.
    fn next_instant(&self) -> Result<Timestamp> {
        let schedule =
            singleton::schedule::Schedule::parse(self.schedule, None, Default::default())?;
        schedule
            .next_after(Timestamp::now())
            .context("the schedule has no next instant")
    }

    /// Sleeps until [`BEFORE_INSTANT`] before the schedule's next instant (at least 1 s away).
    async fn before_next_instant(&self) -> Result<Timestamp> {
        let schedule =
            singleton::schedule::Schedule::parse(self.schedule, None, Default::default())?;
        let next = schedule
            .iter_after(Timestamp::now() + BEFORE_INSTANT + SignedDuration::from_secs(1))
            .next()
            .context("the schedule has no next instant")?;
        let at = next - BEFORE_INSTANT;
        tokio::time::sleep(at.duration_since(Timestamp::now()).unsigned_abs()).await;
        Ok(next)
    }

    /// Two Ready controller pods again (the Deployment replaced or restarted the one hit).
    async fn wait_two_ready(&self) -> Result<()> {
        wait(
            "two Ready controller pods again",
            Duration::from_secs(120),
            &[&self.s.env.ns],
            || async {
                let n = ready_pods(&self.s.env, &self.s.release).await?.len();
                Ok((n == 2).then_some(()))
            },
        )
        .await
    }

    /// The newest Job of a period after `t`, once it exists.
    async fn next_job(&self, t: Timestamp) -> Result<JobRecord> {
        wait(
            "the next period's Job",
            Duration::from_secs(60),
            &[&self.s.work.ns],
            || async {
                Ok(self
                    .observer
                    .jobs()
                    .into_iter()
                    .filter(|j| j.period.is_some_and(|p| p > t))
                    .max_by_key(|j| j.period))
            },
        )
        .await
    }

    /// The backstop's claims (read after the Jobs: see [`observe_sjs`]).
    async fn claims(&self) -> Result<HashMap<String, Vec<Claim>>> {
        let (db, conn) = tokio_postgres::connect(&self.s.host_url, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        crate::chaos::world::claims_in(&db, "singleton_").await
    }

    /// The workload's committed runs as writes in commit order, and the committed attempts (the
    /// workload's `run_attempts` with their registrations in `singleton_attempts`) once the
    /// billing workload records them (None before schema 5).
    async fn database(&self) -> Result<(Vec<Write>, Option<Vec<CommittedAttempt>>)> {
        let (db, conn) = tokio_postgres::connect(&self.s.host_url, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        let job = format!("{}/{SJ}", self.s.work.ns);
        let rows = db
            .query(
                "SELECT period, token FROM invoice_runs ORDER BY finished_at, token",
                &[],
            )
            .await?;
        let writes = rows
            .iter()
            .enumerate()
            .map(|(seq, r)| Write {
                job: job.clone(),
                period: r.get(0),
                token: r.get::<_, i64>(1) as u64,
                held: false,
                result: WriteResult::Accepted { seq: seq as i64 },
            })
            .collect();
        let recorded: bool = db
            .query_one(
                "SELECT to_regclass('run_attempts') IS NOT NULL AND to_regclass('singleton_attempts') IS NOT NULL",
                &[],
            )
            .await?
            .get(0);
        let attempts = match recorded {
            false => None,
            true => Some(
                db.query(
                    "SELECT r.period, r.token, r.attempt, a.seq::bigint, a.registered_at, r.committed_at \
                     FROM run_attempts r LEFT JOIN singleton_attempts a \
                       ON a.job = $1 AND a.token = r.token AND a.attempt = r.attempt",
                    &[&job],
                )
                .await?
                .iter()
                .map(|r| CommittedAttempt {
                    job: job.clone(),
                    period: r.get(0),
                    token: r.get::<_, i64>(1) as u64,
                    // A run without SINGLETON_ATTEMPT commits with no attempt: it then has no
                    // registration either, which the checker reports.
                    attempt: r
                        .get::<_, Option<String>>(2)
                        .unwrap_or_else(|| "(none)".to_string()),
                    seq: r.get(3),
                    registered_at: r.get(4),
                    committed_at: r.get(5),
                })
                .collect(),
            ),
        };
        Ok((writes, attempts))
    }

    async fn dump(&self) -> String {
        let mut out = self.s.work.dump().await;
        let pods = kubectl()
            .args([
                "get",
                "pods,leases,events",
                "-o",
                "wide",
                "-n",
                &self.s.env.ns,
            ])
            .output();
        if let Ok(o) = pods {
            out.push_str(&String::from_utf8_lossy(&o.stdout));
        }
        out.push_str(&self.observer.summary());
        out
    }
}

/// Runs one real-pod scenario end to end.
pub async fn run(fault: Fault, mode: Mode) -> Result<Outcome> {
    let began = Instant::now();
    let w = RealWorld::start(fault).await?;
    w.wait_ran_since("a first run", Timestamp::MIN, Duration::from_secs(120))
        .await?;
    let from = Timestamp::now();
    tokio::time::sleep(mode.steady()).await;

    let mut stale = Vec::new();
    let injected = inject(&w, fault, mode, &mut stale)
        .await
        .with_context(|| format!("injecting {}\n{}", fault.name(), "(see the dump below)"));
    let inj = match injected {
        Ok(i) => i,
        Err(e) => bail!("{e:#}\n{}", w.dump().await),
    };
    let fault_from = inj.from.context("the fault never began")?;
    let healed = Timestamp::now();
    let fault_window = healed.duration_since(fault_from).unsigned_abs();
    let mut unrecovered = None;
    let after = match w
        .wait_ran_since("a run after the fault", healed, Duration::from_secs(120))
        .await
    {
        Ok(period) => Some((period, Timestamp::now())),
        Err(e) => {
            eprintln!("chaos: {}: {e:#}", fault.name());
            unrecovered = Some("no run started within 120 s of the fault".to_string());
            None
        }
    };
    let recovered = after.map(|(_, at)| at);
    let after = after.map(|(period, _)| period);
    tokio::time::sleep(mode.settle()).await;
    // The window ends 4 s back (periods that recent may not have their Job yet), but never
    // before the run seen after the fault: with a 5 s schedule and the short form's settle, it
    // would otherwise hold no period at all.
    let to = (Timestamp::now() - SignedDuration::from_secs(4)).max(after.unwrap_or(Timestamp::MIN));

    let (mut writes, attempts) = w.database().await?;
    mark_held(&mut writes, &stale);
    let defs = [(SJ.to_string(), w.schedule.to_string())];
    let checked_at = Timestamp::now();
    let seen = observe_sjs(&w.s.work, &w.observer, &defs, w.claims(), from, to).await?;
    let obs = Observations {
        sjs: seen.sjs,
        writes,
        attempts,
        failovers: inj.failovers,
        watch_relists: w.observer.relists(),
        watch_errors: w.observer.errors(),
        events_only: seen.events_only,
        unattributed: seen.unattributed,
        fault: Some(FaultWindow {
            from: fault_from,
            to: healed,
            recovered,
        }),
        checked_at: Some(checked_at),
        settle: mode.settle(),
        proofs: inj.proofs,
        ..Observations::default()
    };
    let expect = fault.expect(mode);
    let mut row = check::evaluate(fault.name(), fault_window, &expect, &obs);
    row.details.extend(unrecovered);
    Ok(Outcome::judge(row, expect, began, w.dump()).await)
}

/// What a real-pod fault's injection measured.
#[derive(Default)]
struct Injected {
    failovers: Vec<Duration>,
    proofs: Vec<Proof>,
    /// When the first round's fault began.
    from: Option<Timestamp>,
}

/// A run frozen past its Replace: its token, and whether the fence refused its write after thaw.
struct Stale {
    token: u64,
    period: Timestamp,
    refused: bool,
}

/// The frozen runs' writes, as the checker counts them: refused ones are added (the database
/// kept nothing of them), accepted ones are found among the committed rows and marked held.
fn mark_held(writes: &mut Vec<Write>, stale: &[Stale]) {
    for s in stale {
        let mut found = false;
        for w in writes.iter_mut().filter(|w| w.token == s.token) {
            w.held = true;
            found = true;
        }
        if s.refused && !found {
            writes.push(Write {
                job: writes.first().map(|w| w.job.clone()).unwrap_or_default(),
                period: s.period,
                token: s.token,
                held: true,
                result: WriteResult::Refused,
            });
        }
    }
}

/// Injects `fault` in each round (the next round once both pods are Ready and a run came
/// after the last), timed against the schedule's instants, and heals it.
async fn inject(
    w: &RealWorld,
    fault: Fault,
    mode: Mode,
    stale: &mut Vec<Stale>,
) -> Result<Injected> {
    let mut inj = Injected::default();
    let mut instants = Vec::new();
    for round in 0..rounds(mode) {
        if round > 0 {
            w.wait_two_ready().await?;
            w.wait_ran_since(
                "a run before the next round",
                Timestamp::now(),
                Duration::from_secs(60),
            )
            .await?;
        }
        // The rows on a run's pods are timed by their own run; the others come just before an
        // instant.
        let on_a_run = matches!(
            fault,
            Fault::RealWorkloadFreeze
                | Fault::RealPodDeleteWorking
                | Fault::RealNodeDrain
                | Fault::RealKubeletPartition
        );
        if !on_a_run {
            instants.push(w.before_next_instant().await?);
        }
        inj.from.get_or_insert_with(Timestamp::now);
        inject_once(w, fault, mode, &mut inj, stale).await?;
        // A run's fault ends no sooner than the next instant of the schedule: a period falls due
        // while it is on.
        if on_a_run && fault != Fault::RealWorkloadFreeze {
            instants.push(w.next_instant()?);
        }
    }
    w.wait_two_ready().await?;
    // The window ends no sooner than half a second after the last instant it was timed before.
    if let Some(last) = instants.last() {
        let end = *last + SignedDuration::from_millis(500);
        let now = Timestamp::now();
        if end > now {
            tokio::time::sleep(end.duration_since(now).unsigned_abs()).await;
        }
    }
    Ok(inj)
}

/// One round of `fault`: what it measured and proved added to `inj`, a frozen run to `stale`.
async fn inject_once(
    w: &RealWorld,
    fault: Fault,
    mode: Mode,
    inj: &mut Injected,
    stale: &mut Vec<Stale>,
) -> Result<()> {
    match fault {
        Fault::RealLeaderFreeze => {
            let (took, proof) = freeze_leader(w, mode).await?;
            inj.failovers.push(took);
            inj.proofs.push(proof);
        }
        Fault::RealContainerKill => {
            let (took, proof) = kill_leader_container(w).await?;
            inj.failovers.push(took);
            inj.proofs.push(proof);
        }
        Fault::RealPodDelete => {
            let (took, proof) = delete_leader_pod(w).await?;
            inj.failovers.push(took);
            inj.proofs.push(proof);
        }
        Fault::RealWorkloadFreeze => {
            let s = freeze_workload(w).await?;
            inj.proofs.push(Proof::new(
                true,
                format!(
                    "the run of period {} (token {}) was frozen until the fence moved past its token",
                    s.period, s.token
                ),
            ));
            stale.push(s);
        }
        Fault::RealPodDeleteWorking => inj.proofs.push(real_pods::delete_working(w).await?),
        Fault::RealNodeDrain => inj.proofs.push(real_pods::drain_working(w).await?),
        Fault::RealKubeletPartition => {
            inj.proofs.push(real_pods::partition_working(w).await?);
        }
        other => bail!("{} is not a real-pod scenario", other.name()),
    }
    Ok(())
}

/// The leader's container stopped through the CRI; the time until another pod held the Lease.
async fn kill_leader_container(w: &RealWorld) -> Result<(Duration, Proof)> {
    let (holder, _, container) = w.leader().await?;
    let t0 = Instant::now();
    crictl(&["stop", "-t", "0", &container]).await?;
    let (new, took) = w.takeover(&holder, t0).await?;
    let proof = Proof::new(
        true,
        format!(
            "the leader's container {container} stopped by the CRI; the Lease passed from {holder} to {new}"
        ),
    );
    Ok((took, proof))
}

/// The leader's pod deleted; the time until another pod held the Lease.
async fn delete_leader_pod(w: &RealWorld) -> Result<(Duration, Proof)> {
    let (holder, pod, _) = w.leader().await?;
    let t0 = Instant::now();
    Api::<Pod>::namespaced(w.s.env.client.clone(), &w.s.env.ns)
        .delete(&pod, &DeleteParams::default())
        .await?;
    let (new, took) = w.takeover(&holder, t0).await?;
    let proof = Proof::new(
        true,
        format!("the leader's pod {pod} deleted; the Lease passed from {holder} to {new}"),
    );
    Ok((took, proof))
}

/// The leader's container frozen until another pod holds the Lease, then a little longer (the
/// old leader's writes wait in its frozen process), thawed before the liveness probe's third
/// failure would have the kubelet restart it.
async fn freeze_leader(w: &RealWorld, mode: Mode) -> Result<(Duration, Proof)> {
    let (holder, _, container) = w.leader().await?;
    let cgroup = freezer_of(&container)?;
    // Returns once the kernel reports the cgroup FROZEN.
    set_freezer(&cgroup, "FROZEN").await?;
    let t0 = Instant::now();
    let taken = w.takeover(&holder, t0).await;
    let mut still = false;
    if taken.is_ok() {
        let hold = match mode {
            Mode::Short => Duration::from_secs(3),
            Mode::Full => Duration::from_secs(8),
        };
        tokio::time::sleep(hold).await;
        still = std::fs::read_to_string(cgroup.join("freezer.state"))
            .is_ok_and(|s| s.trim() == "FROZEN");
    }
    set_freezer(&cgroup, "THAWED").await?;
    let (new, took) = taken?;
    let proof = Proof::new(
        still,
        format!(
            "the leader's container {container} frozen (freezer.state FROZEN until the thaw: {still}); the Lease passed from {holder} to {new}"
        ),
    );
    Ok((took, proof))
}

/// A run's container frozen before its write; the next period Replaces it (the fence advances
/// past its token before its Job is deleted); thawed, it finishes its run (SIGTERM does not stop
/// a run half-way) and the database refuses its write.
async fn freeze_workload(w: &RealWorld) -> Result<Stale> {
    let job = w.next_job(Timestamp::now()).await?;
    let token = job.token.context("the run's Job has no token")?;
    let period = job.period.context("the run's Job has no period")?;
    let (pod, container) = running_pod_of(&w.s.work, &job.name).await?;
    let log = w.s.work.log_dir().join(format!("frozen-{}.log", job.name));
    let follow = follow_log(&w.s.work, &pod, &log)?;
    let cgroup = freezer_of(&container)?;
    set_freezer(&cgroup, "FROZEN").await?;
    let moved = wait(
        "the Replace to advance the fence past the frozen run's token",
        Duration::from_secs(60),
        &[&w.s.work.ns],
        || async {
            let (db, conn) = tokio_postgres::connect(&w.s.host_url, tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            let fence: Option<i64> = db
                .query_one("SELECT max(token) FROM singleton_fences", &[])
                .await?
                .get(0);
            Ok(fence.filter(|f| *f > token as i64).map(|_| ()))
        },
    )
    .await;
    set_freezer(&cgroup, "THAWED").await?;
    moved?;
    // Thawed, its run ends: refused by the fence (its log says so; stderr goes to the same
    // log), or, were the fence broken, committed with its token.
    let refused = wait(
        "the thawed run to end its transaction",
        Duration::from_secs(60),
        &[&w.s.work.ns],
        || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("SQLSTATE SF001") {
                return Ok(Some(true));
            }
            let (db, conn) = tokio_postgres::connect(&w.s.host_url, tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            let committed = db
                .query_opt(
                    "SELECT 1 FROM invoice_runs WHERE token = $1",
                    &[&(token as i64)],
                )
                .await?
                .is_some();
            Ok(committed.then_some(false))
        },
    )
    .await?;
    let _ = { follow }.kill();
    Ok(Stale {
        token,
        period,
        refused,
    })
}

/// `kubectl logs -f` of `pod` into `path`, from now until its container ends.
fn follow_log(env: &Env, pod: &str, path: &PathBuf) -> Result<std::process::Child> {
    Ok(kubectl()
        .args(["logs", "-f", pod, "-n", &env.ns])
        .stdout(std::fs::File::create(path)?)
        .stderr(std::process::Stdio::null())
        .spawn()?)
}

/// `hack/node.sh crictl ARGS`: the CRI client against the real node's containerd.
async fn crictl(args: &[&str]) -> Result<()> {
    let out = tokio::process::Command::new(repo_root().join("hack/node.sh"))
        .arg("crictl")
        .args(args)
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "hack/node.sh crictl {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn row(failovers: &[f64]) -> check::Row {
        check::Row {
            scenario: "real".into(),
            due: 3,
            due_in_fault: 1,
            started: 3,
            writes_accepted: 3,
            jobs_per_period_max: 1,
            failovers: failovers
                .iter()
                .map(|s| Duration::from_secs_f64(*s))
                .collect(),
            proofs: vec![Proof::new(true, "the Lease passed")],
            ..check::Row::default()
        }
    }

    #[test]
    fn a_deleted_leader_pod_hands_over_in_under_a_second() {
        let e = expect(Fault::RealPodDelete, Mode::Short);
        assert!(row(&[0.52]).violations(e).is_empty());
        let v = row(&[1.3]).violations(e);
        assert!(
            v.iter().any(|d| d.contains("beyond the bound of 1.0 s")),
            "{v:?}"
        );
        // The full form deletes three times: three handovers, each measured.
        let e = expect(Fault::RealPodDelete, Mode::Full);
        let v = row(&[0.4]).violations(e);
        assert!(
            v.iter().any(|d| d.contains("the fault must cause 3")),
            "{v:?}"
        );
    }

    #[test]
    fn a_frozen_or_killed_leader_is_taken_over_within_lease_and_retry() {
        for f in [Fault::RealLeaderFreeze, Fault::RealContainerKill] {
            let e = expect(f, Mode::Short);
            assert!(row(&[12.7]).violations(e).is_empty());
            let v = row(&[19.5]).violations(e);
            assert!(
                v.iter().any(|d| d.contains("beyond the bound of 19.0 s")),
                "{v:?}"
            );
            // A row whose window held no due period fails.
            let mut r = row(&[12.7]);
            r.due_in_fault = 0;
            assert!(!r.violations(e).is_empty());
        }
    }

    #[test]
    fn a_frozen_workload_must_be_refused() {
        let e = expect(Fault::RealWorkloadFreeze, Mode::Short);
        let v = row(&[]).violations(e);
        assert!(
            v.iter().any(|d| d.contains("refused no stale write")),
            "{v:?}"
        );
        // Its refusal, added as a held write the database kept nothing of, counts.
        let mut writes = vec![Write {
            job: "w/invoices".into(),
            period: t(0),
            token: 1,
            held: false,
            result: WriteResult::Accepted { seq: 0 },
        }];
        mark_held(
            &mut writes,
            &[Stale {
                token: 2,
                period: t(10),
                refused: true,
            }],
        );
        assert_eq!(writes.len(), 2);
        assert!(writes[1].held && writes[1].result == WriteResult::Refused);
        // Were its write committed, the committed row is marked held (a stale write accepted).
        let mut writes = vec![Write {
            job: "w/invoices".into(),
            period: t(10),
            token: 2,
            held: false,
            result: WriteResult::Accepted { seq: 1 },
        }];
        mark_held(
            &mut writes,
            &[Stale {
                token: 2,
                period: t(10),
                refused: false,
            }],
        );
        assert!(writes[0].held);
    }
}
