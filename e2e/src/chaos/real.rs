//! Faults on real pods (issue #18): the chart's two controller pods on the real node (hack/node.sh),
//! the billing workload's real containers writing with their tokens, and faults an operator meets
//! on a node: the leader's processes frozen with the cgroup freezer past its Lease (a VM or GC
//! pause), its container killed through the CRI (`crictl stop -t 0`), its pod deleted, and a running
//! workload frozen past the Replace of its run. The same checker as the other rows counts Jobs per
//! period from a watch, claims from the backstop's table and writes from the workload's own table.
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

use super::check::{self, Claim, Observations, Write, WriteResult};
use super::world::observe_sjs;
use super::{Fault, Mode, Outcome};
use crate::commands::repo_root;
use crate::observer::{JobRecord, Observer};
use crate::real_node::{
    Setup, billing_sj, freezer_of, leader_container, lease_holder, ready_pods, running_pod_of,
    set_freezer, setup, wait,
};
use crate::{Env, kubectl};

/// The SingletonJob of [`billing_sj`].
const SJ: &str = "invoices";
/// The chart's Lease duration is 15 s: a takeover comes within this after the leader stops.
const LEASE_WAIT: Duration = Duration::from_secs(60);

/// One real-pod scenario's world: the chart, the work namespace and a watch of its Jobs.
struct RealWorld {
    s: Setup,
    observer: Observer,
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
        let (schedule, policy, work) = match fault {
            Fault::RealWorkloadFreeze => ("*/10 * * * * *", "Replace", 5),
            _ => ("*/5 * * * * *", "Forbid", 0),
        };
        s.work
            .create_sj(&billing_sj(schedule, policy, work))
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
    /// restarted container): how long that took from `t0`.
    async fn takeover(&self, holder: &str, t0: Instant) -> Result<Duration> {
        wait(
            &format!("a takeover of the Lease from {holder}"),
            LEASE_WAIT,
            &[&self.s.env.ns],
            || async {
                let now = lease_holder(&self.s.env, &self.s.release).await?;
                Ok(now.filter(|h| h != holder).map(|_| ()))
            },
        )
        .await?;
        Ok(t0.elapsed())
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

    /// The workload's committed runs as writes in commit order, and the backstop's claims.
    async fn database(&self) -> Result<(Vec<Write>, HashMap<String, Vec<Claim>>)> {
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
        let claims = crate::chaos::world::claims_in(&db, "singleton_").await?;
        Ok((writes, claims))
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

    let fault_began = Instant::now();
    let mut stale = Vec::new();
    let failovers = inject(&w, fault, mode, &mut stale)
        .await
        .with_context(|| format!("injecting {}\n{}", fault.name(), "(see the dump below)"));
    let failovers = match failovers {
        Ok(f) => f,
        Err(e) => bail!("{e:#}\n{}", w.dump().await),
    };
    let fault_window = fault_began.elapsed();
    let healed = Timestamp::now();
    let mut unrecovered = None;
    let after = match w
        .wait_ran_since("a run after the fault", healed, Duration::from_secs(120))
        .await
    {
        Ok(period) => Some(period),
        Err(e) => {
            eprintln!("chaos: {}: {e:#}", fault.name());
            unrecovered = Some("no run started within 120 s of the fault".to_string());
            None
        }
    };
    tokio::time::sleep(mode.settle()).await;
    // The window ends 4 s back (periods that recent may not have their Job yet), but never
    // before the run seen after the fault: with a 5 s schedule and the short form's settle, it
    // would otherwise hold no period at all.
    let to = (Timestamp::now() - SignedDuration::from_secs(4)).max(after.unwrap_or(Timestamp::MIN));

    let (mut writes, claims) = w.database().await?;
    mark_held(&mut writes, &stale);
    let defs = [(SJ.to_string(), w.schedule.to_string())];
    let (sjs, events_only) = observe_sjs(&w.s.work, &w.observer, &defs, claims, from, to).await?;
    let obs = Observations {
        sjs,
        writes,
        failovers,
        watch_relists: w.observer.relists(),
        watch_errors: w.observer.errors(),
        events_only,
        ..Observations::default()
    };
    let mut row = check::evaluate(fault.name(), fault_window, &obs);
    row.details.extend(unrecovered);
    Ok(Outcome::judge(row, fault.expect(), began, w.dump()).await)
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

async fn inject(
    w: &RealWorld,
    fault: Fault,
    mode: Mode,
    stale: &mut Vec<Stale>,
) -> Result<Vec<Duration>> {
    let rounds = match mode {
        Mode::Short => 1,
        Mode::Full => 3,
    };
    let mut failovers = Vec::new();
    for round in 0..rounds {
        if round > 0 {
            w.wait_two_ready().await?;
            w.wait_ran_since(
                "a run before the next round",
                Timestamp::now(),
                Duration::from_secs(60),
            )
            .await?;
        }
        match fault {
            Fault::RealLeaderFreeze => failovers.push(freeze_leader(w, mode).await?),
            Fault::RealContainerKill => {
                let (holder, _, container) = w.leader().await?;
                let t0 = Instant::now();
                crictl(&["stop", "-t", "0", &container]).await?;
                failovers.push(w.takeover(&holder, t0).await?);
            }
            Fault::RealPodDelete => {
                let (holder, pod, _) = w.leader().await?;
                let t0 = Instant::now();
                Api::<Pod>::namespaced(w.s.env.client.clone(), &w.s.env.ns)
                    .delete(&pod, &DeleteParams::default())
                    .await?;
                failovers.push(w.takeover(&holder, t0).await?);
            }
            Fault::RealWorkloadFreeze => stale.push(freeze_workload(w).await?),
            other => bail!("{} is not a real-pod scenario", other.name()),
        }
    }
    w.wait_two_ready().await?;
    Ok(failovers)
}

/// The leader's container frozen until another pod holds the Lease, then a little longer (the
/// old leader's writes wait in its frozen process), thawed before the liveness probe's third
/// failure would have the kubelet restart it.
async fn freeze_leader(w: &RealWorld, mode: Mode) -> Result<Duration> {
    let (holder, _, container) = w.leader().await?;
    let cgroup = freezer_of(&container)?;
    set_freezer(&cgroup, "FROZEN").await?;
    let t0 = Instant::now();
    let taken = w.takeover(&holder, t0).await;
    if taken.is_ok() {
        let hold = match mode {
            Mode::Short => Duration::from_secs(3),
            Mode::Full => Duration::from_secs(8),
        };
        tokio::time::sleep(hold).await;
    }
    set_freezer(&cgroup, "THAWED").await?;
    taken
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
