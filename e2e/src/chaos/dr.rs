//! Two-cluster chaos scenarios (issue 22, docs/multi-cluster.md): the same SingletonJob `dr`
//! (every 2 s, one `jobKey`, `purpose: Correctness`, history limits 0) in two control planes
//! sharing one PostgreSQL, a controller per cluster (`--cluster-id east` in the default cluster,
//! `west` in the second, each electing itself leader through a Lease as the chart's Deployment
//! does, restarted a second after they exit), an outside watch of the Jobs in
//! BOTH API servers, and a workload doing a fenced write with the job key and each run's token.
//! West is the primary; east a standby (`standbyDelaySeconds`) except in dr-both-active-kill.
//! The checker ([`super::dr_check`]) counts Jobs per period across both API servers.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Event;
use kube::api::ListParams;
use singleton::api::{Outcome as RunOutcome, SingletonJob, SingletonJobStatus};
use tokio::sync::mpsc;

use super::check::{
    Expect, FaultWindow, JobSeen, Proof, Recorded, Write, WriteResult, recorded_note,
};
use super::dr_check::{
    CLAIMED_ELSEWHERE, ClusterClaim, ClusterJob, ClusterRecord, DrObservations, evaluate_dr,
    first_run_in,
};
use super::evidence::{self, PortProbe, Restart};
use super::world::{
    Check, Polled, attempt_id, committed_attempts, create_writes_table, has_attempts, poll_until,
    register_with_retry, write_with_retry,
};
use super::{CATCH_UP, Mode, Outcome};
use crate::multicluster::SecondCluster;
use crate::observer::{Observer, Seen, job_controller_runs, parse_job_name};
use crate::{Env, backstop_secret, backstop_spec, database_url, sj_yaml, table_prefix};

/// The SingletonJob's name in both clusters.
const SJ: &str = "dr";
const SCHEDULE: &str = "*/2 * * * * *";
const INTERVAL: Duration = Duration::from_secs(2);
/// The default cluster's identity (the standby, except in dr-both-active-kill).
const EAST: &str = "east";
/// The second cluster's identity (the primary).
const WEST: &str = "west";

/// A fault of the two-cluster setup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrFault {
    /// The primary's kube-apiserver stopped for the window, then started.
    PrimaryApiserverStop,
    /// The primary's controller frozen (failpoint `backstop-claimed`) right after its database
    /// claim, held past `takeoverAfterSeconds`, then SIGCONT.
    PrimaryControllerPause,
    /// Both clusters active; their controllers SIGKILLed alternately, each just after an instant.
    BothActiveKill,
    /// The standby's controller 40 s ahead (libfaketime) for the window.
    ClockSkew,
}

pub const SCENARIOS: &[DrFault] = &[
    DrFault::PrimaryApiserverStop,
    DrFault::PrimaryControllerPause,
    DrFault::BothActiveKill,
    DrFault::ClockSkew,
];

/// The backstop settings of a scenario.
struct Layout {
    takeover_after: u64,
    /// East's `standbyDelaySeconds`; None: both active.
    standby_delay: Option<u64>,
}

impl DrFault {
    pub fn name(self) -> &'static str {
        match self {
            DrFault::PrimaryApiserverStop => "dr-primary-apiserver-stop",
            DrFault::PrimaryControllerPause => "dr-primary-controller-pause",
            DrFault::BothActiveKill => "dr-both-active-kill",
            DrFault::ClockSkew => "dr-clock-skew-40s",
        }
    }

    /// What the row must show: periods due while the fault is on (what its planned duration
    /// guarantees for a 2 s schedule), the takeover (dr-primary-*) or a run after each kill
    /// (dr-both-active-kill), a refused stale write for the frozen claimer.
    pub fn expect(self, mode: Mode) -> Expect {
        let planned = match self {
            DrFault::PrimaryApiserverStop => mode.window().max(STOP_WINDOW),
            DrFault::BothActiveKill => kill_gap(mode) * kills(mode) as u32,
            _ => mode.window(),
        };
        Expect {
            // The frozen claimer's token must be refused by the fence.
            pause: self == DrFault::PrimaryControllerPause,
            reasons: CATCH_UP,
            min_due_in_fault: (planned.as_millis() / INTERVAL.as_millis()) as u64,
            min_failovers: match self {
                DrFault::PrimaryApiserverStop | DrFault::PrimaryControllerPause => 1,
                DrFault::BothActiveKill => kills(mode),
                DrFault::ClockSkew => 0,
            },
            ..Expect::default()
        }
    }

    fn layout(self) -> Layout {
        match self {
            DrFault::PrimaryApiserverStop => Layout {
                takeover_after: 6,
                standby_delay: Some(3),
            },
            DrFault::PrimaryControllerPause => Layout {
                takeover_after: 5,
                standby_delay: Some(2),
            },
            DrFault::BothActiveKill => Layout {
                takeover_after: 5,
                standby_delay: None,
            },
            DrFault::ClockSkew => Layout {
                takeover_after: 10,
                standby_delay: Some(3),
            },
        }
    }

    /// A cluster's flags: its identity and leader election (as the chart runs it: a controller
    /// that loses the API server loses its Lease and exits, and is restarted with fresh
    /// caches). The skewed standby acts on its own clock (as a cluster whose clocks all run
    /// ahead would) rather than refusing to.
    fn args(self, cluster: &str) -> Vec<String> {
        let mut args: Vec<String> = [crate::FAST_ELECTION, &["--lease-name", "chaos-dr"]]
            .concat()
            .iter()
            .map(|a| a.to_string())
            .collect();
        args.extend(["--cluster-id".to_string(), cluster.to_string()]);
        if self == DrFault::ClockSkew && cluster == EAST {
            args.extend(["--max-clock-skew-seconds".to_string(), "60".to_string()]);
        }
        args
    }
}

/// dr-both-active-kill's kills.
fn kills(mode: Mode) -> usize {
    match mode {
        Mode::Short => 2,
        Mode::Full => 6,
    }
}

/// dr-both-active-kill's time from one kill to the next: the window's share, but never less
/// than a run after a kill may take. A kill between a claim's commit and its confirm leaves the
/// period's row unconfirmed, and the other cluster takes it over only after the takeover bound
/// (docs/multi-cluster.md); then the next instant, and 2 s of round trips on a loaded machine.
/// (CI, 2026-12-05: a kill 60 ms after such a commit, 3.5 s before the next kill, while the
/// bound was 5 s: no run could follow it in time.)
fn kill_gap(mode: Mode) -> Duration {
    let bound = Duration::from_secs(DrFault::BothActiveKill.layout().takeover_after);
    (mode.window() / kills(mode) as u32).max(bound + INTERVAL + Duration::from_secs(2))
}

/// dr-primary-apiserver-stop's least outage: long enough for a takeover of a claim in flight at
/// the stop (bound 6 s, standby 3 s).
const STOP_WINDOW: Duration = Duration::from_secs(12);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One cluster: its namespace, its watch of the Jobs, its controller (supervised).
struct Side {
    id: &'static str,
    env: Env,
    observer: Observer,
    idx: Option<usize>,
    envs: Vec<(String, String)>,
    args: Vec<String>,
    restart_at: Option<Instant>,
    /// When its controller was last started (real time).
    started: Timestamp,
}

impl Side {
    async fn start(&mut self) -> Result<()> {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.started = Timestamp::now();
        self.idx = Some(
            self.env
                .start_controller_with_env(&self.envs, &args)
                .await?,
        );
        self.restart_at = None;
        Ok(())
    }

    /// Restarts the controller a second after it exited, as a kubelet would.
    async fn tick(&mut self) -> Result<()> {
        let Some(idx) = self.idx else { return Ok(()) };
        if self.env.controller_exit(idx)?.is_none() {
            return Ok(());
        }
        match self.restart_at {
            None => self.restart_at = Some(Instant::now() + Duration::from_secs(1)),
            Some(at) if Instant::now() >= at => self.start().await?,
            Some(_) => {}
        }
        Ok(())
    }

    async fn signal(&self, signal: &str) -> Result<()> {
        let idx = self.idx.context("no controller started")?;
        self.env.signal_controller(idx, signal).await
    }

    /// Running, and not waiting to be restarted.
    fn running(&self) -> bool {
        self.restart_at.is_none() && self.idx.is_some_and(|i| !self.env.controller_exited(i))
    }

    fn stopped(&self) -> bool {
        self.idx.is_some_and(|i| self.env.controller_stopped(i))
    }
}

/// The workload's writes (one fenced write per run seen, keyed by the job key; each run's pod an
/// attempt of its own when the backstop registers attempts).
#[derive(Default)]
struct Workload {
    writes: Mutex<Vec<Write>>,
    in_flight: AtomicUsize,
    stopped: AtomicBool,
    attempts: AtomicBool,
}

/// The two clusters of a scenario.
pub struct DrWorld {
    east: Side,
    west: Side,
    /// Held for the whole scenario; dropping it starts its API server again.
    second: SecondCluster,
    prefix: String,
    key: String,
    workload: Arc<Workload>,
    dispatcher: tokio::task::JoinHandle<()>,
}

impl Drop for DrWorld {
    fn drop(&mut self) {
        self.workload.stopped.store(true, Ordering::SeqCst);
        self.dispatcher.abort();
    }
}

impl Polled for DrWorld {
    fn tick(&mut self) -> impl std::future::Future<Output = Result<()>> {
        DrWorld::tick(self)
    }
    fn dump(&self) -> impl std::future::Future<Output = String> {
        DrWorld::dump(self)
    }
}

impl DrWorld {
    /// Both namespaces and backstop Secrets, the watches (synced before any Job can exist), the
    /// controllers, the SingletonJobs (BackstopReady in both), then the workload.
    async fn start(fault: DrFault) -> Result<DrWorld> {
        let second = SecondCluster::hold().await?;
        let name = format!("chaos-{}", fault.name());
        let east_env = Env::new(&name).await?;
        // The same namespace as east's: one owner of the shared job key (issue 34).
        let west_env = Env::new_in_namespace(&east_env.ns, &second.kubeconfig).await?;
        let url = database_url()?;
        backstop_secret(&east_env, "db", &url, true).await?;
        backstop_secret(&west_env, "db", &url, true).await?;
        let prefix = table_prefix(&east_env);
        let key = format!("dr/{}", east_env.ns);
        let (tx, rx) = mpsc::unbounded_channel();
        let side = |id, env: Env, args| Side {
            id,
            observer: Observer::start(env.client.clone(), &env.ns, tx.clone()),
            env,
            idx: None,
            envs: Vec::new(),
            args,
            restart_at: None,
            started: Timestamp::now(),
        };
        let east = side(EAST, east_env, fault.args(EAST));
        let west = side(WEST, west_env, fault.args(WEST));
        let mut w = DrWorld {
            east,
            west,
            second,
            prefix,
            key,
            workload: Arc::new(Workload::default()),
            // Replaced once the workload's table exists.
            dispatcher: tokio::spawn(async {}),
        };
        w.start_controllers(fault).await?;
        w.start_workload(rx).await?;
        Ok(w)
    }

    /// The controllers once both watches have listed (so they see every Job), then the
    /// SingletonJobs, until BackstopReady in both clusters.
    async fn start_controllers(&mut self, fault: DrFault) -> Result<()> {
        self.wait(
            "both Job watches' first lists",
            Duration::from_secs(30),
            |w| {
                Box::pin(async move {
                    Ok((w.east.observer.synced() && w.west.observer.synced()).then_some(()))
                })
            },
        )
        .await?;
        self.east.start().await?;
        self.west.start().await?;
        self.create_sjs(fault).await?;
        self.wait_backstop_ready().await
    }

    /// Both SingletonJobs, the primary's first.
    async fn create_sjs(&self, fault: DrFault) -> Result<()> {
        let layout = fault.layout();
        let east_yaml = self.yaml(&layout, layout.standby_delay);
        let west_yaml = self.yaml(&layout, None);
        // The primary's first: a standby created first owns the periods before the primary's
        // SingletonJob exists, and claims them after its delay, when the primary may have
        // claimed a later one already.
        self.west.env.create_sj(&west_yaml).await?;
        self.east.env.create_sj(&east_yaml).await?;
        Ok(())
    }

    /// Waits (at most 90 s) for BackstopReady in both clusters.
    async fn wait_backstop_ready(&mut self) -> Result<()> {
        self.wait(
            "BackstopReady in both clusters",
            Duration::from_secs(90),
            |w| {
                Box::pin(async move {
                    let mut ready = true;
                    for s in [&w.east, &w.west] {
                        let sj = s.env.get_sj(SJ).await?;
                        ready &= sj.status.is_some_and(|st| {
                            singleton::record::conditions::is_true(&st.conditions, "BackstopReady")
                        });
                    }
                    Ok(ready.then_some(()))
                })
            },
        )
        .await
    }

    /// The workload's table and its dispatcher of the runs the watches see (`rx`), in place of
    /// the placeholder.
    async fn start_workload(&mut self, rx: mpsc::UnboundedReceiver<Seen>) -> Result<()> {
        // The schema exists once a backstop is ready; then the workload's table.
        let db = crate::pg().await?;
        create_writes_table(&db, &self.prefix).await?;
        self.workload
            .attempts
            .store(has_attempts(&db, &self.prefix).await?, Ordering::SeqCst);
        self.dispatcher = tokio::spawn(dispatch(
            rx,
            self.workload.clone(),
            self.prefix.clone(),
            self.key.clone(),
        ));
        Ok(())
    }

    /// The SingletonJob: the shared key, the takeover bound, `standby` delay if any.
    fn yaml(&self, layout: &Layout, standby: Option<u64>) -> String {
        let mut lines = format!(
            "    jobKey: {}\n    takeoverAfterSeconds: {}\n",
            self.key, layout.takeover_after
        );
        if let Some(d) = standby {
            lines += &format!("    standbyDelaySeconds: {d}\n");
        }
        lines += "  successfulJobsHistoryLimit: 0\n  failedJobsHistoryLimit: 0\n";
        sj_yaml(SJ, SCHEDULE, &backstop_spec("db", &self.prefix, &lines))
    }

    async fn tick(&mut self) -> Result<()> {
        self.east.tick().await?;
        self.west.tick().await
    }

    /// Keeps the controllers supervised for `d`.
    async fn run_for(&mut self, d: Duration) -> Result<()> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.tick().await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Polls `check` (supervising meanwhile) until it returns Some; fails after `timeout` with
    /// what both clusters showed.
    async fn wait<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        check: impl for<'a> Fn(&'a DrWorld) -> Check<'a, T>,
    ) -> Result<T> {
        poll_until(self, what, timeout, check).await
    }

    /// Period -> clusters in which a Job of it ran, from the two watches.
    fn ran(&self) -> BTreeMap<Timestamp, Vec<&'static str>> {
        let mut by: BTreeMap<Timestamp, Vec<&'static str>> = BTreeMap::new();
        for s in [&self.east, &self.west] {
            for j in s.observer.jobs() {
                if let (true, Some(p)) = (j.ran, j.period) {
                    by.entry(p).or_default().push(s.id);
                }
            }
        }
        by
    }

    /// Waits (at most `timeout`) for a period after `since` run in `cluster` (any when None).
    async fn wait_run_after(
        &mut self,
        since: Timestamp,
        cluster: Option<&'static str>,
        timeout: Duration,
    ) -> Result<bool> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            let found = self
                .ran()
                .range(since..)
                .any(|(_, cs)| cluster.is_none_or(|c| cs.contains(&c)));
            if found {
                return Ok(true);
            }
            self.run_for(Duration::from_millis(200)).await?;
        }
        Ok(false)
    }

    /// The claim row of `period`: (cluster, token, confirmed).
    async fn claim_row(&self, period: Timestamp) -> Result<Option<(String, i64, bool)>> {
        let db = crate::pg().await?;
        let row = db
            .query_opt(
                &format!(
                    "SELECT cluster, token, confirmed_at IS NOT NULL FROM {}claims WHERE job = $1 AND period = $2",
                    self.prefix
                ),
                &[&self.key, &period],
            )
            .await?;
        Ok(row.map(|r| (r.get(0), r.get(1), r.get(2))))
    }

    /// The workload's fenced write with `token`, recorded as deliberately late (`held`): a pod
    /// of that run starting now (registering as an attempt first, when attempts are registered).
    async fn stale_write(&self, period: Timestamp, token: u64) -> WriteResult {
        let attempt = self
            .workload
            .attempts
            .load(Ordering::SeqCst)
            .then(|| format!("sim-stale-{token}"));
        let registered = match &attempt {
            Some(a) => register_with_retry(&self.prefix, &self.key, token, a).await,
            None => Ok(()),
        };
        let result = match registered {
            Ok(()) => {
                write_with_retry(
                    &self.prefix,
                    &self.key,
                    period,
                    token,
                    true,
                    attempt.as_deref(),
                )
                .await
            }
            Err(r) => r,
        };
        lock(&self.workload.writes).push(Write {
            job: self.key.clone(),
            period,
            token,
            held: true,
            result,
        });
        result
    }

    /// Stops the workload (after its in-flight writes, at most 60 s) and reads the external
    /// truth for periods due in (`from`, `to`], with the time of the check.
    async fn observe(&mut self, from: Timestamp, to: Timestamp) -> Result<DrObservations> {
        let end = Instant::now() + Duration::from_secs(60);
        while self.workload.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < end {
            self.run_for(Duration::from_millis(200)).await?;
        }
        self.workload.stopped.store(true, Ordering::SeqCst);
        let db = crate::pg().await?;
        let attempts = match self.workload.attempts.load(Ordering::SeqCst) {
            true => Some(committed_attempts(&db, &self.prefix).await?),
            false => None,
        };
        let schedule = singleton::schedule::Schedule::parse(SCHEDULE, None, Default::default())?;
        let mut obs = DrObservations {
            key: self.key.clone(),
            due: schedule.iter_after(from).take_while(|p| *p <= to).collect(),
            writes: lock(&self.workload.writes).clone(),
            attempts,
            interval: INTERVAL,
            checked_at: Some(Timestamp::now()),
            ..DrObservations::default()
        };
        for side in [&self.east, &self.west] {
            observe_side(side, &mut obs).await?;
        }
        // The claims last, after both clusters' Jobs: every Job seen had its claim committed
        // before it was created (read first, a run started in between would have none).
        obs.claims = db
            .query(
                &format!(
                    "SELECT period, token, cluster, confirmed_at IS NOT NULL FROM {}claims WHERE job = $1",
                    self.prefix
                ),
                &[&self.key],
            )
            .await?
            .iter()
            .map(|r| ClusterClaim {
                period: r.get(0),
                token: r.get::<_, i64>(1) as u64,
                cluster: r.get(2),
                confirmed: r.get(3),
            })
            .collect();
        Ok(obs)
    }

    /// What a human would look at when a scenario fails: both clusters and both watches.
    async fn dump(&self) -> String {
        let mut out = String::new();
        for s in [&self.east, &self.west] {
            out += &format!(
                "==== cluster {} ====\n{}{}",
                s.id,
                s.env.dump().await,
                s.observer.summary()
            );
        }
        out
    }
}

/// One cluster's Jobs (the watch, corrected by the job controller's Events), status and
/// decisions, added to `obs`.
async fn observe_side(side: &Side, obs: &mut DrObservations) -> Result<()> {
    let sj: SingletonJob = side.env.get_sj(SJ).await?;
    let status = sj.status.unwrap_or_default();
    let events = side.env.events().list(&ListParams::default()).await?.items;
    let recorded = recorded_without_job(&events, &status);
    obs.clusters.push(ClusterRecord {
        cluster: side.id.to_string(),
        decided_through: status.decided_through.map(|t| t.0),
        recorded,
    });
    let mut jobs = watched_jobs(side);
    // A Job the watch never saw (a relist gap across the API server's stop) is known from the
    // job controller's Events.
    add_jobs_from_events(side, &events, &mut jobs, obs);
    obs.jobs.extend(jobs.into_values());
    obs.watch_relists += side.observer.relists();
    obs.watch_errors += side.observer.errors();
    Ok(())
}

/// The periods a cluster decided without a Job: from its Events (missed, skipped,
/// deduplicated) and its status's history.
fn recorded_without_job(events: &[Event], status: &SingletonJobStatus) -> Vec<Recorded> {
    let mut recorded: Vec<Recorded> = events
        .iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("SingletonJob"))
        .filter(|e| {
            matches!(
                e.reason.as_deref(),
                Some("RunMissed" | "RunSkipped" | "RunDeduplicated")
            )
        })
        .filter_map(|e| recorded_note(e.message.as_deref()?))
        .collect();
    recorded.extend(
        status
            .history
            .iter()
            .filter(|h| {
                // Every outcome recorded without a Job; the checker accepts only some.
                h.job_name.is_none() && !matches!(h.outcome, RunOutcome::Running)
            })
            .map(|h| Recorded {
                first: h.period.0,
                last: h.last_period.as_ref().map_or(h.period.0, |l| l.0),
                outcome: format!("{:?}", h.outcome),
                reason: h.reason.clone().unwrap_or_default(),
            }),
    );
    recorded
}

/// The cluster's Jobs of the SingletonJob as its watch saw them, by uid.
fn watched_jobs(side: &Side) -> BTreeMap<String, ClusterJob> {
    let mut jobs: BTreeMap<String, ClusterJob> = BTreeMap::new();
    for r in side.observer.jobs() {
        let (Some(SJ), Some(period)) = (r.sj.as_deref(), r.period) else {
            continue;
        };
        let job = JobSeen::watched(&r, period);
        jobs.insert(
            r.uid.clone(),
            ClusterJob {
                cluster: side.id.to_string(),
                job,
            },
        );
    }
    jobs
}

/// The job controller's Events added to `jobs`: a run for a Job the watch saw, and a Job of its
/// own (noted in `obs.events_only`) for one it never saw.
fn add_jobs_from_events(
    side: &Side,
    events: &[Event],
    jobs: &mut BTreeMap<String, ClusterJob>,
    obs: &mut DrObservations,
) {
    for (uid, ej) in job_controller_runs(events) {
        if let Some(j) = jobs.get_mut(&uid) {
            j.job.ran |= ej.ran;
            continue;
        }
        let Some((SJ, period)) = parse_job_name(&ej.name) else {
            continue;
        };
        obs.events_only
            .push(format!("{} in {} (uid {uid})", ej.name, side.id));
        let job = JobSeen::from_events(&uid, &ej.name, period, ej.ran);
        jobs.insert(
            uid,
            ClusterJob {
                cluster: side.id.to_string(),
                job,
            },
        );
    }
}

/// The workload: each run seen allowed to run, in either cluster, does its fenced write with
/// the job key (the fence is one across clusters) and its token.
async fn dispatch(
    mut seen: mpsc::UnboundedReceiver<Seen>,
    w: Arc<Workload>,
    prefix: String,
    key: String,
) {
    while let Some(s) = seen.recv().await {
        if w.stopped.load(Ordering::SeqCst) {
            continue;
        }
        let Seen::Ran {
            uid, period, token, ..
        } = s
        else {
            continue;
        };
        let attempt = w.attempts.load(Ordering::SeqCst).then(|| attempt_id(&uid));
        let (w, prefix, key) = (w.clone(), prefix.clone(), key.clone());
        w.in_flight.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            let registered = match &attempt {
                Some(a) => register_with_retry(&prefix, &key, token, a).await,
                None => Ok(()),
            };
            let result = match registered {
                Ok(()) => {
                    write_with_retry(&prefix, &key, period, token, false, attempt.as_deref()).await
                }
                Err(r) => r,
            };
            lock(&w.writes).push(Write {
                job: key,
                period,
                token,
                held: false,
                result,
            });
            w.in_flight.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// What a fault's injection measured and found.
#[derive(Default)]
struct Injected {
    /// From the fault to the other cluster having the period (failover column).
    takeovers: Vec<Duration>,
    /// Instants after which the next run's delay is measured (dr-both-active-kill's kills).
    kills: Vec<Timestamp>,
    /// When the primary's API server was stopped (dr-primary-apiserver-stop).
    stopped_at: Option<Timestamp>,
    /// The window in which the skewed standby ran (dr-clock-skew-40s).
    skewed: Option<(Timestamp, Timestamp)>,
    /// When the fault itself began.
    from: Option<Timestamp>,
    proofs: Vec<Proof>,
    details: Vec<String>,
    notes: Vec<String>,
}

/// Runs one two-cluster scenario end to end.
pub async fn run(fault: DrFault, mode: Mode) -> Result<Outcome> {
    let began = Instant::now();
    let mut w = DrWorld::start(fault).await?;
    w.wait("a first run of the job", Duration::from_secs(60), |w| {
        Box::pin(async move { Ok((!w.ran().is_empty()).then_some(())) })
    })
    .await?;
    let from = Timestamp::now();
    w.run_for(mode.steady()).await?;

    let injecting = Timestamp::now();
    let mut inj = match inject(&mut w, fault, mode).await {
        Ok(i) => i,
        Err(e) => {
            heal(&w).await;
            return Err(e.context(format!("injecting {}", fault.name())));
        }
    };
    let healed = Timestamp::now();
    let fault_from = inj.from.unwrap_or(injecting);
    let fault_window = healed.duration_since(fault_from).unsigned_abs();
    // Back to normal: for a stopped primary, the primary running periods again.
    let who = (fault == DrFault::PrimaryApiserverStop).then_some(WEST);
    let recovered = if w
        .wait_run_after(healed, who, Duration::from_secs(120))
        .await?
    {
        Some(Timestamp::now())
    } else {
        inj.details.push(format!(
            "no period ran{} within 120 s of the fault's end",
            who.map_or(String::new(), |c| format!(" in {c}"))
        ));
        None
    };
    w.run_for(mode.settle()).await?;
    let to = Timestamp::now() - SignedDuration::from_secs(4);
    let mut obs = w.observe(from, to).await?;
    obs.fault = Some(FaultWindow {
        from: fault_from,
        to: healed,
        recovered,
    });
    obs.settle = mode.settle();
    after_the_fact(fault, &mut obs, &mut inj);
    let expect = fault.expect(mode);
    let mut row = evaluate_dr(fault.name(), fault_window, &expect, &obs);
    row.details.extend(inj.details);
    row.notes.extend(inj.notes);
    Ok(Outcome::judge(row, expect, began, w.dump()).await)
}

/// Best effort after a failed injection: every controller running, the API server up.
async fn heal(w: &DrWorld) {
    for s in [&w.east, &w.west] {
        let _ = s.signal("CONT").await;
    }
    if let Err(e) = w.second.apiserver("start").await {
        eprintln!("chaos: healing the second API server: {e:#}");
    }
}

/// The scenario's own checks on the final observations, and the failovers and proofs they add
/// to `obs`: the standby's takeover within its bound, a run after each kill (before the next),
/// the skewed standby deciding periods of its window.
fn after_the_fact(fault: DrFault, obs: &mut DrObservations, inj: &mut Injected) {
    let layout = fault.layout();
    obs.takeovers = inj.takeovers.clone();
    obs.proofs = std::mem::take(&mut inj.proofs);
    if let Some(stopped) = inj.stopped_at {
        standby_took_over(&layout, stopped, obs, inj);
    }
    // Each kill is followed by a run (a Job created in either cluster) before the next kill.
    runs_after_kills(obs, inj);
    if let Some((a, b)) = inj.skewed {
        skewed_standby_decided(a, b, obs);
    }
}

/// dr-primary-apiserver-stop: the standby's first run after the primary's API server stopped
/// (at `stopped`), within the bound.
fn standby_took_over(
    layout: &Layout,
    stopped: Timestamp,
    obs: &mut DrObservations,
    inj: &mut Injected,
) {
    // The next instant, the standby's delay, a claim the primary may have had in flight
    // (the takeover bound), and 4 s for two API round trips on a loaded machine.
    let bound = INTERVAL
        + Duration::from_secs(layout.standby_delay.unwrap_or(0) + layout.takeover_after + 4);
    match first_run_in(obs, EAST, stopped) {
        Some((period, Some(created))) => {
            let took = created.duration_since(stopped).unsigned_abs();
            obs.takeovers.push(took);
            inj.notes.push(format!(
                "the standby's first period after the stop: {period}, its Job {:.1} s after the stop (bound {} s)",
                took.as_secs_f64(),
                bound.as_secs()
            ));
            if took > bound {
                inj.details.push(format!(
                    "the standby took over after {:.1} s, beyond the bound of {} s",
                    took.as_secs_f64(),
                    bound.as_secs()
                ));
            }
        }
        Some((period, None)) => inj.notes.push(format!(
            "the standby's first period after the stop: {period} (known from Events only)"
        )),
        None => inj
            .details
            .push("the standby ran no period after the primary's API server stopped".into()),
    }
}

/// dr-both-active-kill: a run (a Job created in either cluster) after each kill, before the
/// next; its delay a failover.
fn runs_after_kills(obs: &mut DrObservations, inj: &mut Injected) {
    let mut after_kill = 0;
    for (i, k) in inj.kills.iter().enumerate() {
        let until = inj.kills.get(i + 1).copied().unwrap_or(Timestamp::MAX);
        let next = obs
            .jobs
            .iter()
            .filter(|j| j.job.ran)
            .filter_map(|j| j.job.created)
            .filter(|c| c > k && *c < until)
            .min();
        match next {
            Some(c) => {
                after_kill += 1;
                obs.takeovers.push(c.duration_since(*k).unsigned_abs());
            }
            None => inj.details.push(format!(
                "no run was created after the kill at {k} before the next kill or the check"
            )),
        }
    }
    if !inj.kills.is_empty() {
        obs.proofs.push(Proof::new(
            after_kill == inj.kills.len(),
            format!(
                "a run followed {after_kill} of the {} kills (each before the next kill)",
                inj.kills.len()
            ),
        ));
    }
}

/// dr-clock-skew-40s: the skewed standby decided periods of its window (`a` to `b`).
fn skewed_standby_decided(a: Timestamp, b: Timestamp, obs: &mut DrObservations) {
    let mine = obs
        .jobs
        .iter()
        .filter(|j| j.cluster == EAST && j.job.ran && a <= j.job.period && j.job.period <= b)
        .count();
    // The standby was up and deciding: it recorded periods of its window as the primary's.
    let decided = obs
        .due
        .iter()
        .filter(|p| a <= **p && **p <= b)
        .filter(|p| {
            obs.clusters.iter().any(|c| {
                c.cluster == EAST
                    && c.recorded
                        .iter()
                        .any(|r| r.reason == CLAIMED_ELSEWHERE && r.first <= **p && **p <= r.last)
            })
        })
        .count();
    obs.proofs.push(Proof::new(
        decided > 0,
        format!(
            "the skewed standby decided {decided} period(s) of its window ClaimedElsewhere and ran {mine} (the primary was up throughout)"
        ),
    ));
}

/// Injects `fault` and heals it.
async fn inject(w: &mut DrWorld, fault: DrFault, mode: Mode) -> Result<Injected> {
    let window = mode.window();
    let mut inj = Injected::default();
    match fault {
        DrFault::PrimaryApiserverStop => stop_primary_apiserver(w, window, &mut inj).await?,
        DrFault::PrimaryControllerPause => pause_primary(w, window, &mut inj).await?,
        DrFault::BothActiveKill => kill_alternately(w, mode, &mut inj).await?,
        DrFault::ClockSkew => skew_standby(w, window, &mut inj).await?,
    }
    Ok(inj)
}

/// dr-primary-apiserver-stop: the primary's kube-apiserver stopped for the window (at least
/// [`STOP_WINDOW`]), then started; probed on its port meanwhile, its pid compared.
async fn stop_primary_apiserver(
    w: &mut DrWorld,
    window: Duration,
    inj: &mut Injected,
) -> Result<()> {
    let window = window.max(STOP_WINDOW);
    let port = evidence::kubeconfig_server(&w.second.kubeconfig)
        .as_deref()
        .and_then(evidence::url_port)
        .context("no API server port in the second cluster's kubeconfig")?;
    let before = evidence::cluster_pid(Some(crate::multicluster::SECOND), "kube-apiserver");
    let probe = PortProbe::start(port);
    inj.stopped_at = Some(Timestamp::now());
    inj.from = inj.stopped_at;
    w.second.apiserver("stop").await?;
    w.run_for(window).await?;
    w.second.apiserver("start").await?;
    let (probes, refused) = probe.finish().await;
    let after = evidence::cluster_pid(Some(crate::multicluster::SECOND), "kube-apiserver");
    inj.proofs.extend(evidence::restart_proofs(&Restart {
        component: "the primary's kube-apiserver".to_string(),
        before: before.map(|p| format!("pid {p}")),
        after: after.map(|p| format!("pid {p}")),
        old_alive_after: before.is_some_and(|p| Some(p) != after && evidence::process_alive(p)),
        port,
        probes,
        refused,
    }));
    Ok(())
}

/// dr-both-active-kill: east's and west's controllers SIGKILLed in turn, each just after an
/// instant, [`kill_gap`] apart; proof that each kill ended its controller.
async fn kill_alternately(w: &mut DrWorld, mode: Mode, inj: &mut Injected) -> Result<()> {
    let kills = kills(mode);
    let mut killed = 0;
    for i in 0..kills {
        let side = if i % 2 == 0 { EAST } else { WEST };
        w.wait("both controllers running", Duration::from_secs(60), |w| {
            Box::pin(async move { Ok((w.east.running() && w.west.running()).then_some(())) })
        })
        .await?;
        // Just after an instant: the controller is in the middle of its claim.
        let now = Timestamp::now();
        let next =
            Timestamp::from_second(now.as_second() / 2 * 2 + 2)? + SignedDuration::from_millis(150);
        w.run_for(next.duration_since(now).unsigned_abs()).await?;
        inj.kills.push(Timestamp::now());
        inj.from.get_or_insert_with(Timestamp::now);
        let s = if side == EAST {
            &mut w.east
        } else {
            &mut w.west
        };
        killed += kill_and_reap(s).await? as usize;
        w.run_for(kill_gap(mode)).await?;
    }
    inj.proofs.push(Proof::new(
        killed == kills,
        format!("{killed} of the {kills} controllers killed ended by SIGKILL"),
    ));
    Ok(())
}

/// SIGKILLs the side's controller; whether it ended by that signal.
async fn kill_and_reap(s: &mut Side) -> Result<bool> {
    let idx = s.idx.context("no controller started")?;
    s.signal("KILL").await?;
    // Reaped within a few seconds; its status says how it ended.
    let end = Instant::now() + Duration::from_secs(5);
    let by_kill = loop {
        use std::os::unix::process::ExitStatusExt as _;
        match s.env.controller_exit(idx)? {
            Some(st) => break st.signal() == Some(9),
            None if Instant::now() < end => tokio::time::sleep(Duration::from_millis(50)).await,
            None => break false,
        }
    };
    Ok(by_kill)
}

/// dr-clock-skew-40s: the standby restarted 40 s ahead for the window (its log showing the
/// offset), then restarted on the true clock.
async fn skew_standby(w: &mut DrWorld, window: Duration, inj: &mut Injected) -> Result<()> {
    w.east.envs = crate::skewed_clock("+40s")?;
    let before = w.east.idx;
    w.east.signal("TERM").await?;
    w.wait("the skewed standby running", Duration::from_secs(60), |w| {
        Box::pin(async move { Ok((w.east.idx != before && w.east.running()).then_some(())) })
    })
    .await?;
    let a = Timestamp::now();
    inj.from = Some(a);
    w.run_for(window).await?;
    inj.skewed = Some((a, Timestamp::now()));
    let log = w
        .east
        .idx
        .map(|i| w.east.env.controller_log(i))
        .unwrap_or_default();
    inj.proofs.push(evidence::skew_proof(
        "east's controller",
        40,
        evidence::log_clock_offset(&log, w.east.started),
    ));
    w.east.envs.clear();
    w.east.signal("TERM").await?;
    Ok(())
}

/// dr-primary-controller-pause: the primary restarted with failpoint `backstop-claimed=stop`
/// freezes right after its next database claim; held until the standby has taken the period
/// over (at least the window), then SIGCONT. Its Job must never be created, its history must
/// say `ClaimedElsewhere` (east), and a write with its token must be refused by the fence.
async fn pause_primary(w: &mut DrWorld, window: Duration, inj: &mut Injected) -> Result<()> {
    let t0 = freeze_primary(w, inj).await?;
    let (period, token) = frozen_claim(w, inj).await?;
    wait_takeover(w, period, t0, inj).await;
    w.run_for(window.saturating_sub(t0.elapsed())).await?;
    check_claim_row(w, period, token, inj).await?;
    w.west.signal("CONT").await?;
    wait_claimed_elsewhere(w, period, inj).await;
    stale_write_refused(w, period, token, inj).await;
    Ok(())
}

/// The primary restarted with the failpoint, until it is stopped right after its database
/// claim; when that was (the fault's start).
async fn freeze_primary(w: &mut DrWorld, inj: &mut Injected) -> Result<Instant> {
    // Not while a claim is on its way: the old process may confirm it in the database (step 4b)
    // before the TERM takes effect, and a confirmed claim is never taken over, so the row would
    // wait for a takeover that must not come (CI 2026-12-06: TERM 0.2 s after a claim).
    w.wait(
        "the primary between two claims",
        Duration::from_secs(20),
        |w| {
            Box::pin(async move {
                let sj = w.west.env.get_sj(SJ).await?;
                Ok(sj
                    .status
                    .is_some_and(|s| s.pending_claim.is_none())
                    .then_some(()))
            })
        },
    )
    .await?;
    // Armed only now, for the restart the TERM causes: a primary restarted during the wait
    // above (it lost its Lease on a loaded machine) would otherwise have frozen at its first
    // claim already, with that claim pending, and the TERM sent to a stopped process would never
    // be delivered (CI 2026-12-07: the wait for the freeze timed out).
    w.west.envs = vec![(
        "SINGLETON_FAILPOINTS".to_string(),
        "backstop-claimed=stop".to_string(),
    )];
    let before = w.west.idx;
    w.west.signal("TERM").await?;
    w.wait(
        "the primary frozen after its database claim",
        Duration::from_secs(60),
        |w| Box::pin(async move { Ok((w.west.idx != before && w.west.stopped()).then_some(())) }),
    )
    .await?;
    let t0 = Instant::now();
    inj.from = Some(Timestamp::now());
    inj.proofs.push(Proof::new(
        w.west.stopped(),
        "the primary's controller stopped (state T) at its failpoint right after its database claim",
    ));
    // Restarts from now on run without the failpoint.
    w.west.envs.clear();
    Ok(t0)
}

/// The frozen primary's pending claim: (period, token).
async fn frozen_claim(w: &DrWorld, inj: &mut Injected) -> Result<(Timestamp, u64)> {
    let pending = w
        .west
        .env
        .get_sj(SJ)
        .await?
        .status
        .and_then(|s| s.pending_claim)
        .context("the frozen primary has no pending claim")?;
    let (period, token) = (pending.period.0, pending.token);
    inj.notes.push(format!(
        "the primary froze after claiming period {period} with token {token}"
    ));
    Ok((period, token))
}

/// Waits for east's claim of `period`; the time since the freeze (`t0`) a failover.
async fn wait_takeover(w: &mut DrWorld, period: Timestamp, t0: Instant, inj: &mut Injected) {
    let took_over = w
        .wait("the standby's takeover", Duration::from_secs(60), |w| {
            Box::pin(async move {
                Ok(w.claim_row(period)
                    .await?
                    .filter(|(c, _, _)| c == EAST)
                    .map(|_| ()))
            })
        })
        .await;
    match took_over {
        Ok(()) => {
            inj.takeovers.push(t0.elapsed());
            inj.proofs.push(Proof::new(
                true,
                format!("the standby took period {period} over from the frozen primary"),
            ));
        }
        Err(e) => inj
            .details
            .push(format!("no takeover of period {period}: {e:#}")),
    }
}

/// Before the primary resumes, `period`'s claim row is east's, with a token above `token`.
async fn check_claim_row(
    w: &DrWorld,
    period: Timestamp,
    token: u64,
    inj: &mut Injected,
) -> Result<()> {
    let row = w.claim_row(period).await?;
    if !row
        .as_ref()
        .is_some_and(|(c, t, _)| c == EAST && *t as u64 > token)
    {
        inj.details.push(format!(
            "period {period}'s claim row before the primary resumed: {row:?}, expected east's with a token above {token}"
        ));
    }
    Ok(())
}

/// Waits for the resumed primary to record `period` ClaimedElsewhere, naming east.
async fn wait_claimed_elsewhere(w: &mut DrWorld, period: Timestamp, inj: &mut Injected) {
    let recorded = w
        .wait(
            "the resumed primary to record ClaimedElsewhere",
            Duration::from_secs(30),
            |w| {
                Box::pin(async move {
                    let s = w.west.env.get_sj(SJ).await?.status.unwrap_or_default();
                    Ok(s.history
                        .into_iter()
                        .find(|h| {
                            h.period.0 == period && h.reason.as_deref() == Some("ClaimedElsewhere")
                        })
                        .map(|h| h.cluster))
                })
            },
        )
        .await;
    match recorded {
        Ok(Some(c)) if c == EAST => {}
        Ok(other) => inj.details.push(format!(
            "the resumed primary recorded period {period} ClaimedElsewhere naming {other:?}, not east"
        )),
        Err(e) => inj.details.push(format!(
            "the resumed primary never recorded period {period} ClaimedElsewhere: {e:#}"
        )),
    }
}

/// The frozen primary's write with its `token`, which the fence must refuse.
async fn stale_write_refused(w: &DrWorld, period: Timestamp, token: u64, inj: &mut Injected) {
    match w.stale_write(period, token).await {
        WriteResult::Refused => inj.notes.push(format!(
            "a write with the frozen primary's token {token} was refused by the fence"
        )),
        // Counted as a stale write accepted, or rejected.
        WriteResult::Accepted { .. } | WriteResult::Rejected { .. } => {}
        WriteResult::Unavailable => inj
            .details
            .push("the database never answered the frozen primary's write".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn ran(cluster: &str, period: i64, created_ms: i64) -> ClusterJob {
        ClusterJob {
            cluster: cluster.into(),
            job: JobSeen {
                uid: format!("u-{period}"),
                name: format!("dr-{period}"),
                period: t(period),
                token: Some(period as u64),
                ran: true,
                removed: true,
                events_only: false,
                created: Some(t(0) + SignedDuration::from_millis(created_ms)),
                ended: None,
                unreleased: false,
                released: None,
                resume_at: None,
                withdrawn: None,
                command: None,
            },
        }
    }

    #[test]
    fn each_kill_must_be_followed_by_a_run_before_the_next() {
        let mut obs = DrObservations {
            jobs: vec![ran(EAST, 2, 2_300), ran(WEST, 4, 4_200)],
            ..DrObservations::default()
        };
        // Kills at 1.15 s and 5.15 s: a run after the first (at 2.3 s), none after the second.
        let mut inj = Injected {
            kills: vec![
                t(1) + SignedDuration::from_millis(150),
                t(5) + SignedDuration::from_millis(150),
            ],
            ..Injected::default()
        };
        after_the_fact(DrFault::BothActiveKill, &mut obs, &mut inj);
        assert_eq!(obs.takeovers.len(), 1);
        assert!(
            obs.proofs
                .iter()
                .any(|p| !p.held && p.what.contains("1 of the 2 kills"))
        );
        assert!(
            inj.details
                .iter()
                .any(|d| d.contains("no run was created after the kill"))
        );
        // One run after both kills counts once only: for the second.
        let mut obs = DrObservations {
            jobs: vec![ran(EAST, 6, 6_200)],
            ..DrObservations::default()
        };
        let mut inj = Injected {
            kills: vec![t(1), t(5)],
            ..Injected::default()
        };
        after_the_fact(DrFault::BothActiveKill, &mut obs, &mut inj);
        assert!(
            obs.proofs
                .iter()
                .any(|p| !p.held && p.what.contains("1 of the 2 kills"))
        );
    }

    #[test]
    fn the_skewed_standby_must_have_decided_periods_of_its_window() {
        let mut obs = DrObservations {
            due: vec![t(2), t(4)],
            clusters: vec![ClusterRecord {
                cluster: EAST.into(),
                decided_through: Some(t(4)),
                recorded: vec![],
            }],
            ..DrObservations::default()
        };
        let skewed = || Injected {
            skewed: Some((t(1), t(5))),
            ..Injected::default()
        };
        // Standing by but deciding nothing of its window: not shown to be active.
        let mut idle = obs.clone();
        after_the_fact(DrFault::ClockSkew, &mut idle, &mut skewed());
        assert!(
            idle.proofs
                .iter()
                .any(|p| !p.held && p.what.contains("decided 0 period(s)"))
        );
        obs.clusters[0].recorded.push(Recorded {
            first: t(2),
            last: t(4),
            outcome: "Deduplicated".into(),
            reason: CLAIMED_ELSEWHERE.into(),
        });
        after_the_fact(DrFault::ClockSkew, &mut obs, &mut skewed());
        assert!(obs.proofs.iter().all(|p| p.held), "{:?}", obs.proofs);
    }
}
