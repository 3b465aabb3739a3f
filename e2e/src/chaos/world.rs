//! The world a chaos scenario runs in: a namespace, three controller replicas with leader election
//! (restarted when they exit, as a Deployment's pods would be), SingletonJobs with seconds-level
//! schedules and (most of them) the PostgreSQL backstop, an outside observer of the Jobs
//! ([`crate::observer`]), and a workload that performs a fenced write with each run's token.
//! Afterwards [`World::observe`] reads the external truth for the checker.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures::{StreamExt as _, TryStreamExt as _};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use singleton::api::{Outcome, SingletonJob};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::check::{
    Claim, HungEnd, HungTx, JobSeen, Observations, Recorded, SjObservation, Write, WriteResult,
};
use crate::commands::repo_root;
use crate::observer::{JobRecord, Observer, Seen, job_controller_runs, parse_job_name};
use crate::{
    Env, FAST_ELECTION, Proxy, backstop_secret, backstop_spec, database_url, kubectl, sj_yaml,
    table_prefix,
};

/// The Lease the replicas elect through.
pub const LEASE_NAME: &str = "chaos";
/// The replicas' flags: fast election ([`FAST_ELECTION`]) on [`LEASE_NAME`].
fn elect() -> Vec<&'static str> {
    [FAST_ELECTION, &["--lease-name", LEASE_NAME]].concat()
}
pub const REPLICAS: usize = 3;

/// A SingletonJob of the scenario.
#[derive(Clone, Debug)]
pub struct SjDef {
    pub name: String,
    pub schedule: String,
    /// Extra spec lines (policy, catch-up, deadline).
    pub extra: String,
    /// Its Jobs never get a node, so each run stays active (for Replace).
    pub never_scheduled: bool,
    /// With the PostgreSQL backstop (`lock.purpose: Correctness`).
    pub backstop: bool,
    /// The controller's default history limits; otherwise 0 and 0, so every finished Job is pruned
    /// at once and the checker cannot lean on Jobs left in the API server.
    pub keep_history: bool,
}

impl SjDef {
    /// A SingletonJob with the backstop and history limits 0.
    pub fn new(name: impl Into<String>, schedule: impl Into<String>) -> SjDef {
        SjDef {
            name: name.into(),
            schedule: schedule.into(),
            extra: String::new(),
            never_scheduled: false,
            backstop: true,
            keep_history: false,
        }
    }

    pub fn extra(mut self, lines: &str) -> SjDef {
        self.extra = lines.to_string();
        self
    }

    pub fn never_scheduled(mut self) -> SjDef {
        self.never_scheduled = true;
        self
    }

    pub fn backstop(mut self, on: bool) -> SjDef {
        self.backstop = on;
        self
    }

    pub fn keep_history(mut self) -> SjDef {
        self.keep_history = true;
        self
    }

    /// `concurrencyPolicy: Forbid` (the default): a new period waits for the active run.
    pub fn forbid(&self) -> bool {
        !self.extra.contains("concurrencyPolicy")
    }

    fn yaml(&self, prefix: &str) -> String {
        let mut extra = self.extra.clone();
        if !self.keep_history {
            extra += "  successfulJobsHistoryLimit: 0\n  failedJobsHistoryLimit: 0\n";
        }
        let spec = if self.backstop {
            backstop_spec("db", prefix, &extra)
        } else {
            extra
        };
        let yaml = sj_yaml(&self.name, &self.schedule, &spec);
        if self.never_scheduled {
            crate::never_scheduled(yaml)
        } else {
            yaml
        }
    }
}

/// The SingletonJobs of most scenarios: one Forbid every 2 s (catchUp Latest) and one Allow every
/// 3 s (catchUp All within a 20 s deadline), both with the backstop and history limits 0.
pub fn default_sjs() -> Vec<SjDef> {
    vec![
        SjDef::new("tick", "*/2 * * * * *"),
        SjDef::new("tock", "*/3 * * * * *")
            .extra("  concurrencyPolicy: Allow\n  catchUp: All\n  startingDeadlineSeconds: 20\n"),
    ]
}

/// A replica slot: the controller process currently filling it, and how to start it.
struct Slot {
    idx: usize,
    envs: Vec<(String, String)>,
    restart_at: Option<Instant>,
}

/// The workload's shared state.
struct Workload {
    writes: Mutex<Vec<Write>>,
    /// Per SingletonJob key: the run whose write is held back (period, token).
    held: Mutex<BTreeMap<String, (Timestamp, u64)>>,
    /// SingletonJob names whose workload pauses (holds each token until a newer run started).
    pausing: Mutex<HashSet<String>>,
    /// SingletonJob names whose workload hangs inside its fenced transaction.
    hanging: Mutex<HashSet<String>>,
    /// Hung transactions still open, by Job uid: sending ends one (its pod died).
    hung_open: Mutex<HashMap<String, oneshot::Sender<HungEnd>>>,
    hung: Mutex<Vec<HungTx>>,
    in_flight: std::sync::atomic::AtomicUsize,
    /// Connections the workload may open at once: in a burst of 200 runs, a connection each at the
    /// same moment would exhaust PostgreSQL's 100 and starve the controllers' backstops.
    connections: Semaphore,
    stopped: AtomicBool,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            writes: Mutex::default(),
            held: Mutex::default(),
            pausing: Mutex::default(),
            hanging: Mutex::default(),
            hung_open: Mutex::default(),
            hung: Mutex::default(),
            in_flight: Default::default(),
            connections: Semaphore::new(16),
            stopped: AtomicBool::new(false),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub struct World {
    pub env: Env,
    slots: Vec<Slot>,
    pub prefix: String,
    pub sjs: Vec<SjDef>,
    workload: Arc<Workload>,
    /// Sees every Job of the namespace from before the first run.
    pub observer: Observer,
    /// Until the workload's table exists: what the observer saw waits here.
    seen: Option<mpsc::UnboundedReceiver<Seen>>,
    dispatcher: Option<tokio::task::JoinHandle<()>>,
    /// Replica slot routed to the API server through [`World::proxy`].
    pub proxy: Option<Proxy>,
    proxy_slot: Option<usize>,
}

/// Runs `hack/cluster.sh ACTION COMPONENT` (the ports come from the environment, as for make).
pub async fn cluster(action: &str, component: &str) -> Result<()> {
    let out = tokio::process::Command::new(repo_root().join("hack/cluster.sh"))
        .args([action, component])
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "hack/cluster.sh {action} {component} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

impl World {
    /// Namespace, backstop Secret, the Job observer, three replicas (slot `proxied`, if any,
    /// reaches the API server through a test-owned proxy), the SingletonJobs, and the workload.
    pub async fn start(name: &str, sjs: Vec<SjDef>, proxied: Option<usize>) -> Result<World> {
        let mut world = World::empty(name, proxied).await?;
        world.add_sjs(sjs).await?;
        Ok(world)
    }

    /// A world without SingletonJobs yet ([`World::add_sjs`]).
    pub async fn empty(name: &str, proxied: Option<usize>) -> Result<World> {
        let env = Env::new(name).await?;
        let prefix = table_prefix(&env);
        backstop_secret(&env, "db", &database_url()?, true).await?;
        let proxy = match proxied {
            Some(_) => Some(apiserver_proxy().await?),
            None => None,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let observer = Observer::start(env.client.clone(), &env.ns, tx);
        let mut world = World {
            env,
            slots: Vec::new(),
            prefix,
            sjs: Vec::new(),
            workload: Arc::default(),
            observer,
            seen: Some(rx),
            dispatcher: None,
            proxy,
            proxy_slot: proxied,
        };
        // Before any Job can exist: the observer must see the first one.
        world
            .wait("the Job watch's first list", Duration::from_secs(30), |w| {
                Box::pin(async move { Ok(w.observer.synced().then_some(())) })
            })
            .await?;
        for slot in 0..REPLICAS {
            let mut envs = Vec::new();
            if Some(slot) == world.proxy_slot
                && let Some(p) = &world.proxy
            {
                let kc = proxied_kubeconfig(&world.env, p.port)?;
                envs.push(("KUBECONFIG".to_string(), kc.display().to_string()));
            }
            let idx = world.env.start_controller_with_env(&envs, &elect()).await?;
            world.slots.push(Slot {
                idx,
                envs,
                restart_at: None,
            });
        }
        Ok(world)
    }

    /// Creates `sjs` (16 at a time), waits for their backstops, and starts the workload once its
    /// table exists.
    pub async fn add_sjs(&mut self, sjs: Vec<SjDef>) -> Result<()> {
        let api = self.env.sjs();
        let ns = self.env.ns.clone();
        let yamls: Vec<String> = sjs.iter().map(|sj| sj.yaml(&self.prefix)).collect();
        futures::stream::iter(yamls)
            .map(|yaml| {
                let (api, ns) = (api.clone(), ns.clone());
                async move {
                    let mut sj: SingletonJob = serde_yaml::from_str(&yaml)?;
                    sj.metadata.namespace = Some(ns);
                    api.create(&Default::default(), &sj).await?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(16)
            .try_collect::<Vec<()>>()
            .await?;
        self.sjs.extend(sjs);
        // The schema (and singleton_fence) exists once a backstop is ready; then the workload's
        // table.
        let backstopped: HashSet<String> = self
            .sjs
            .iter()
            .filter(|s| s.backstop)
            .map(|s| s.name.clone())
            .collect();
        self.wait(
            "BackstopReady on every SingletonJob with a backstop",
            Duration::from_secs(90),
            |w| {
                let backstopped = backstopped.clone();
                Box::pin(async move {
                    let list = w.env.sjs().list(&ListParams::default()).await?;
                    let ready = list
                        .items
                        .iter()
                        .filter(|sj| backstopped.contains(&sj.name_any()))
                        .filter(|sj| {
                            sj.status.as_ref().is_some_and(|s| {
                                singleton::record::conditions::is_true(
                                    &s.conditions,
                                    "BackstopReady",
                                )
                            })
                        })
                        .count();
                    Ok((ready == backstopped.len()).then_some(()))
                })
            },
        )
        .await?;
        if let Some(rx) = self.seen.take() {
            let db = crate::pg().await?;
            db.batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {p}chaos_writes (id bigserial PRIMARY KEY, job text NOT NULL, \
                 period timestamptz NOT NULL, token bigint NOT NULL, held boolean NOT NULL, \
                 at timestamptz NOT NULL DEFAULT clock_timestamp())",
                p = self.prefix
            ))
            .await?;
            self.dispatcher = Some(tokio::spawn(dispatch(
                rx,
                self.workload.clone(),
                self.prefix.clone(),
                self.env.ns.clone(),
            )));
        }
        Ok(())
    }

    /// Restarts replicas that exited (after a 1 s back-off, as a kubelet would); call often.
    pub async fn tick(&mut self) -> Result<()> {
        for s in 0..self.slots.len() {
            let idx = self.slots[s].idx;
            if self.env.controller_exit(idx)?.is_none() {
                continue;
            }
            match self.slots[s].restart_at {
                None => self.slots[s].restart_at = Some(Instant::now() + Duration::from_secs(1)),
                Some(at) if Instant::now() >= at => {
                    let envs = self.slots[s].envs.clone();
                    self.slots[s].idx = self.env.start_controller_with_env(&envs, &elect()).await?;
                    self.slots[s].restart_at = None;
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Keeps the replicas supervised for `d`.
    pub async fn run_for(&mut self, d: Duration) -> Result<()> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.tick().await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Polls `check` (supervising the replicas meanwhile) until it returns Some; fails after
    /// `timeout` with the cluster dump.
    pub async fn wait<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        check: impl for<'a> Fn(&'a World) -> Check<'a, T>,
    ) -> Result<T> {
        poll_until(self, what, timeout, check).await
    }

    /// The replica slot holding the Lease, if any.
    pub async fn leader(&self) -> Result<Option<usize>> {
        let api: Api<Lease> = Api::namespaced(self.env.client.clone(), &self.env.ns);
        let lease = tokio::time::timeout(Duration::from_secs(2), api.get_opt(LEASE_NAME))
            .await
            .context("reading the Lease timed out")??;
        let Some(holder) = lease
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty())
        else {
            return Ok(None);
        };
        let idx: Option<usize> = holder
            .strip_prefix("e2e-")
            .and_then(|r| r.split('-').next())
            .and_then(|n| n.parse().ok());
        Ok(idx.and_then(|i| self.slots.iter().position(|s| s.idx == i)))
    }

    /// Waits for a leader other than `not`; how long that took from `since`.
    pub async fn wait_leader(
        &mut self,
        not: Option<usize>,
        since: Instant,
        timeout: Duration,
    ) -> Result<(usize, Duration)> {
        let end = Instant::now() + timeout;
        loop {
            self.tick().await?;
            if let Ok(Some(l)) = self.leader().await
                && Some(l) != not
            {
                return Ok((l, since.elapsed()));
            }
            if Instant::now() > end {
                bail!(
                    "no leader other than {not:?} within {timeout:?}\n{}",
                    self.dump().await
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends `signal` to the replica in `slot`.
    pub async fn signal(&self, slot: usize, signal: &str) -> Result<()> {
        self.env
            .signal_controller(self.slots[slot].idx, signal)
            .await
    }

    /// SIGTERM to `slot`; it is restarted (with `envs`, from then on) once it has exited.
    pub async fn replace_replica(
        &mut self,
        slot: usize,
        envs: Vec<(String, String)>,
    ) -> Result<()> {
        self.slots[slot].envs = envs;
        self.signal(slot, "TERM").await
    }

    /// Hands the Lease to `slot` by SIGTERMing whoever else leads (a graceful handover each;
    /// they are restarted), at most `tries` times. Returns whether `slot` leads.
    pub async fn make_leader(&mut self, slot: usize, tries: usize) -> Result<bool> {
        for _ in 0..tries {
            let (l, _) = self
                .wait_leader(None, Instant::now(), Duration::from_secs(60))
                .await?;
            if l == slot {
                return Ok(true);
            }
            // The target must be running and a warm standby before the handover.
            self.wait_running(Duration::from_secs(30)).await?;
            self.signal(l, "TERM").await?;
            self.wait_leader(Some(l), Instant::now(), Duration::from_secs(30))
                .await?;
        }
        Ok(self.leader().await? == Some(slot))
    }

    /// Waits until every slot has a live process that has been up for a while (1.5 s).
    pub async fn wait_running(&mut self, timeout: Duration) -> Result<()> {
        let end = Instant::now() + timeout;
        loop {
            self.tick().await?;
            let mut all = true;
            for s in 0..self.slots.len() {
                let idx = self.slots[s].idx;
                all &=
                    self.env.controller_exit(idx)?.is_none() && self.slots[s].restart_at.is_none();
            }
            if all {
                self.run_for(Duration::from_millis(1500)).await?;
                return Ok(());
            }
            if Instant::now() > end {
                bail!("replicas not all running after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The workload holds back each run's write of `sj` until a newer run has started (true), or
    /// writes at once (false).
    pub fn pause_workload(&self, sj: &str, on: bool) {
        let mut p = lock(&self.workload.pausing);
        if on {
            p.insert(sj.to_string());
        } else {
            p.remove(sj);
        }
    }

    /// The workload of each new run of `sj` opens its transaction, calls `singleton_fence` and
    /// hangs there holding the fence row (true) until its Job is deleted; or writes normally.
    pub fn hang_workload(&self, sj: &str, on: bool) {
        let mut h = lock(&self.workload.hanging);
        if on {
            h.insert(sj.to_string());
        } else {
            h.remove(sj);
        }
    }

    /// Ends every hung transaction still open (the fault is healed).
    pub fn release_hung(&self) {
        for (_, kill) in lock(&self.workload.hung_open).drain() {
            let _ = kill.send(HungEnd::Healed);
        }
    }

    /// Polls the observer's Jobs every `poll` (supervising the replicas) until `pred` holds;
    /// false after `timeout` (the caller decides whether that is a failure).
    pub async fn wait_jobs(
        &mut self,
        timeout: Duration,
        poll: Duration,
        pred: impl Fn(&[JobRecord]) -> bool,
    ) -> Result<bool> {
        let end = Instant::now() + timeout;
        loop {
            self.tick().await?;
            if pred(&self.observer.jobs()) {
                return Ok(true);
            }
            if Instant::now() > end {
                return Ok(false);
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// The process id (index) now filling `slot`.
    pub fn process(&self, slot: usize) -> usize {
        self.slots[slot].idx
    }

    /// Has the process `idx` that filled `slot` exited (seen by [`World::tick`])?
    pub fn exited(&self, slot: usize, idx: usize) -> bool {
        self.slots[slot].idx != idx || self.slots[slot].restart_at.is_some()
    }

    /// Wipes the status of SingletonJob `sj` as a user would: `kubectl edit --subresource=status`
    /// with an editor that replaces the status by `{}`. kubectl sends the difference as a merge
    /// patch of the status subresource without a resourceVersion, so it lands whatever the
    /// controller wrote meanwhile.
    pub async fn wipe_status(&self, sj: &str) -> Result<()> {
        let editor = self.env.log_dir().join("wipe-status.sh");
        // kubectl prints JSON with 4-space indents and the keys in order, so the status is the
        // last top-level object: from `    "status": {` to the next line `    }`.
        std::fs::write(
            &editor,
            "#!/bin/sh\n# KUBE_EDITOR for the chaos suite: the status becomes {}.\n\
             exec sed -i '/^    \"status\": {$/,/^    }$/c\\    \"status\": {}' \"$1\"\n",
        )?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&editor, std::fs::Permissions::from_mode(0o755))?;
        }
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::process::Command::from(kubectl())
                .args(["edit", "--subresource=status", "-o", "json", "-n"])
                .arg(&self.env.ns)
                .arg(format!("singletonjob/{sj}"))
                .env("KUBE_EDITOR", &editor)
                .output(),
        )
        .await
        .context("kubectl edit timed out")??;
        // With `-o json` kubectl prints the edited object. "Edit cancelled, no changes made"
        // (exit 0) means the status was already as empty as the editor makes it.
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            bail!(
                "kubectl edit --subresource=status of {sj} failed ({}): {stderr}",
                out.status
            );
        }
        Ok(())
    }

    /// Has every SingletonJob started a run (a Job with a period, seen running) after `t`, or
    /// (Forbid) does it have an active run it waits for (kwok may leave a pod unfinished)?
    pub async fn recovered_since(&self, t: Timestamp) -> Result<bool> {
        let jobs = self.observer.jobs();
        for sj in &self.sjs {
            let ran_since = jobs.iter().any(|j| {
                j.ran
                    && j.sj.as_deref() == Some(sj.name.as_str())
                    && j.period.is_some_and(|p| p > t)
            });
            let waiting = !ran_since && {
                let s = self.env.get_sj(&sj.name).await?.status.unwrap_or_default();
                !s.active.is_empty() && sj.forbid()
            };
            if !ran_since && !waiting {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Ends the fault's hung transactions, stops the workload (after its in-flight writes, at most
    /// 60 s) and reads the external truth for periods due in (`from`, `to`].
    pub async fn observe(
        &mut self,
        from: Timestamp,
        to: Timestamp,
        failovers: Vec<Duration>,
    ) -> Result<Observations> {
        self.release_hung();
        let end = Instant::now() + Duration::from_secs(60);
        while self.workload.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < end {
            self.run_for(Duration::from_millis(200)).await?;
        }
        self.workload.stopped.store(true, Ordering::SeqCst);
        let claims = match self.sjs.iter().any(|s| s.backstop) {
            true => claims_in(&crate::pg().await?, &self.prefix).await?,
            false => HashMap::new(),
        };
        // The replicas still run: give the watch a moment to catch up with the Jobs the job
        // controller's Events report (see [`observe_sjs`]).
        let events = self.env.events().list(&ListParams::default()).await?.items;
        let reported = job_controller_runs(&events);
        self.wait_jobs(Duration::from_secs(3), Duration::from_millis(50), |jobs| {
            let known: HashSet<&str> = jobs.iter().map(|j| j.uid.as_str()).collect();
            reported.keys().all(|uid| known.contains(uid.as_str()))
        })
        .await?;
        let defs: Vec<(String, String)> = self
            .sjs
            .iter()
            .map(|d| (d.name.clone(), d.schedule.clone()))
            .collect();
        let (out, events_only) =
            observe_sjs(&self.env, &self.observer, &defs, claims, from, to).await?;
        Ok(Observations {
            sjs: out,
            writes: lock(&self.workload.writes).clone(),
            failovers,
            hung: lock(&self.workload.hung).clone(),
            watch_relists: self.observer.relists(),
            watch_errors: self.observer.errors(),
            events_only,
        })
    }

    /// What a human would look at when a scenario fails: the cluster and the Job watch.
    pub async fn dump(&self) -> String {
        format!("{}{}", self.env.dump().await, self.observer.summary())
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.workload.stopped.store(true, Ordering::SeqCst);
        if let Some(d) = self.dispatcher.take() {
            d.abort();
        }
        // Hung transactions end with their (dropped) senders.
        lock(&self.workload.hung_open).clear();
    }
}

/// The backstop's claim rows under table prefix `prefix`, by job key.
pub async fn claims_in(
    db: &tokio_postgres::Client,
    prefix: &str,
) -> Result<HashMap<String, Vec<Claim>>> {
    let rows = db
        .query(
            &format!("SELECT job, period, token FROM {prefix}claims"),
            &[],
        )
        .await?;
    let mut claims: HashMap<String, Vec<Claim>> = HashMap::new();
    for r in rows {
        claims.entry(r.get(0)).or_default().push(Claim {
            period: r.get(1),
            token: r.get::<_, i64>(2) as u64,
        });
    }
    Ok(claims)
}

/// The external truth about the SingletonJobs `defs` (name, schedule) for periods due in
/// (`from`, `to`]: the Jobs as `observer` saw them, corrected by the job controller's Events (a
/// Job the watch never saw, in a relist gap, is added; one it never saw resumed but that acted on
/// pods ran), the outcomes recorded in Events and `status.history`, and `claims` (the backstop's
/// rows, by job key). Also the Jobs known from Events only.
pub async fn observe_sjs(
    env: &Env,
    observer: &Observer,
    defs: &[(String, String)],
    mut claims: HashMap<String, Vec<Claim>>,
    from: Timestamp,
    to: Timestamp,
) -> Result<(Vec<SjObservation>, Vec<String>)> {
    let sjs: HashMap<String, SingletonJob> = env
        .sjs()
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|sj| (sj.name_any(), sj))
        .collect();
    let events = env.events().list(&ListParams::default()).await?.items;
    let reported = job_controller_runs(&events);
    let records = observer.jobs();

    // The watch's Jobs, corrected by the job controller's Events: a Job the watch never saw
    // (a relist gap) is added, one it never saw resumed but that acted on pods ran.
    let mut jobs: BTreeMap<String, (String, JobSeen)> = BTreeMap::new();
    for r in &records {
        let (Some(sj), Some(period)) = (r.sj.clone(), r.period) else {
            continue;
        };
        let seen = JobSeen {
            uid: r.uid.clone(),
            name: r.name.clone(),
            period,
            token: r.token,
            ran: r.ran,
            removed: r.deleted.is_some(),
            events_only: false,
        };
        jobs.insert(r.uid.clone(), (sj, seen));
    }
    let mut events_only = Vec::new();
    for (uid, ej) in reported {
        match jobs.get_mut(&uid) {
            Some((_, seen)) => seen.ran |= ej.ran,
            None => {
                let Some((sj, period)) = parse_job_name(&ej.name) else {
                    continue;
                };
                if !defs.iter().any(|(name, _)| name == sj) {
                    continue;
                }
                events_only.push(format!("{} (uid {uid})", ej.name));
                let seen = JobSeen {
                    uid: uid.clone(),
                    name: ej.name.clone(),
                    period,
                    token: None,
                    ran: ej.ran,
                    // The Events outlive it; the list of the watch did not have it.
                    removed: true,
                    events_only: true,
                };
                jobs.insert(uid, (sj.to_string(), seen));
            }
        }
    }
    let mut by_sj: HashMap<String, Vec<JobSeen>> = HashMap::new();
    for (_, (sj, seen)) in jobs {
        by_sj.entry(sj).or_default().push(seen);
    }

    let mut out = Vec::new();
    for (name, schedule) in defs {
        let sj = sjs
            .get(name)
            .with_context(|| format!("SingletonJob {name} is gone"))?;
        let key = sj.key();
        let status = sj.status.clone().unwrap_or_default();
        let schedule = singleton::schedule::Schedule::parse(schedule, None, Default::default())?;
        let due: Vec<Timestamp> = schedule.iter_after(from).take_while(|p| *p <= to).collect();
        let mut recorded: Vec<Recorded> = events
            .iter()
            .filter(|e| e.involved_object.kind.as_deref() == Some("SingletonJob"))
            .filter(|e| e.involved_object.name.as_deref() == Some(name.as_str()))
            .filter(|e| {
                matches!(
                    e.reason.as_deref(),
                    Some("RunMissed" | "RunSkipped" | "RunDeduplicated")
                )
            })
            .filter_map(|e| super::check::recorded_note(e.message.as_deref()?))
            .collect();
        recorded.extend(
            status
                .history
                .iter()
                .filter(|h| {
                    h.job_name.is_none()
                        && matches!(
                            h.outcome,
                            Outcome::Missed | Outcome::Skipped | Outcome::Deduplicated
                        )
                })
                .map(|h| Recorded {
                    first: h.period.0,
                    last: h.last_period.as_ref().map_or(h.period.0, |l| l.0),
                    outcome: format!("{:?}", h.outcome),
                    reason: h.reason.clone().unwrap_or_default(),
                }),
        );
        out.push(SjObservation {
            claims: claims.remove(&key).unwrap_or_default(),
            jobs: by_sj.remove(name).unwrap_or_default(),
            key,
            due,
            decided_through: status.decided_through.map(|t| t.0),
            recorded,
        });
    }
    Ok((out, events_only))
}

/// A proxy on loopback to the API server of the current kubeconfig.
async fn apiserver_proxy() -> Result<Proxy> {
    let server = api_server()?;
    let port: u16 = server
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .with_context(|| format!("no port in API server URL {server}"))?;
    Proxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], port))).await
}

fn kubeconfig_path() -> Result<PathBuf> {
    std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .context("KUBECONFIG is unset: run `eval \"$(make -s env)\"`")
}

fn api_server() -> Result<String> {
    let text = std::fs::read_to_string(kubeconfig_path()?)?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("server: ").map(str::to_string))
        .context("no server in the kubeconfig")
}

/// A copy of the kubeconfig whose server is the proxy (the API server's certificate has an IP SAN
/// for 127.0.0.1, so TLS verifies through the proxy).
fn proxied_kubeconfig(env: &Env, port: u16) -> Result<PathBuf> {
    let text = std::fs::read_to_string(kubeconfig_path()?)?;
    let server = api_server()?;
    let proxied = text.replace(&server, &format!("https://127.0.0.1:{port}"));
    let path = env.log_dir().join("proxied.kubeconfig");
    std::fs::write(&path, proxied)?;
    Ok(path)
}

/// The workload: what the observer sees of runs becomes pods' work. A run seen allowed to run
/// performs its fenced write (or holds it, or hangs in it); a Job seen gone kills its hung
/// transaction, as a deleted Job's pod dies with its connection.
async fn dispatch(
    mut seen: mpsc::UnboundedReceiver<Seen>,
    w: Arc<Workload>,
    prefix: String,
    ns: String,
) {
    while let Some(s) = seen.recv().await {
        if w.stopped.load(Ordering::SeqCst) {
            continue;
        }
        match s {
            Seen::Ran {
                uid,
                sj,
                period,
                token,
            } => {
                if lock(&w.hanging).contains(&sj) {
                    spawn_hang(&w, &prefix, &format!("{ns}/{sj}"), uid, token);
                } else {
                    on_new_run(&w, &prefix, &ns, &sj, period, token);
                }
            }
            Seen::Gone { uid } => {
                if let Some(kill) = lock(&w.hung_open).remove(&uid) {
                    let _ = kill.send(HungEnd::JobDeleted);
                }
            }
        }
    }
}

/// A new run of `sj` was seen: write with its token now, or hold it (pausing workload). A run
/// held before is written now, late: a newer run has started, so its write must be refused.
fn on_new_run(w: &Arc<Workload>, prefix: &str, ns: &str, sj: &str, period: Timestamp, token: u64) {
    let key = format!("{ns}/{sj}");
    let pausing = lock(&w.pausing).contains(sj);
    let earlier = {
        let mut held = lock(&w.held);
        if pausing {
            held.insert(key.clone(), (period, token))
        } else {
            held.remove(&key)
        }
    };
    if let Some((p, t)) = earlier
        && t < token
    {
        spawn_write(w, prefix, &key, p, t, true);
    }
    if !pausing {
        spawn_write(w, prefix, &key, period, token, false);
    }
}

/// The run with `token` hangs in its transaction holding the fence row until its Job (`uid`) is
/// seen gone or the fault is healed.
fn spawn_hang(w: &Arc<Workload>, prefix: &str, key: &str, uid: String, token: u64) {
    let (kill, killed) = oneshot::channel();
    lock(&w.hung_open).insert(uid, kill);
    let (w, prefix, key) = (w.clone(), prefix.to_string(), key.to_string());
    tokio::spawn(async move {
        let end = hang(&prefix, &key, token, killed).await;
        lock(&w.hung).push(HungTx {
            job: key,
            token,
            end,
        });
    });
}

async fn hang(
    prefix: &str,
    key: &str,
    token: u64,
    mut killed: oneshot::Receiver<HungEnd>,
) -> HungEnd {
    let connected = match database_url() {
        Ok(url) => tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let (mut client, conn) = match connected {
        Ok(c) => c,
        Err(e) => return HungEnd::Failed(e),
    };
    let conn = tokio::spawn(conn);
    let tx = match client.transaction().await {
        Ok(tx) => tx,
        Err(e) => return HungEnd::Failed(e.to_string()),
    };
    let fence = format!("SELECT {prefix}fence($1, $2)");
    let token_i = token as i64;
    let params: &[&(dyn tokio_postgres::types::ToSql + Sync)] = &[&key, &token_i];
    let fenced = tokio::select! {
        r = tx.query(&fence, params) => r,
        end = &mut killed => return end.unwrap_or(HungEnd::Healed),
    };
    if let Err(e) = fenced {
        let code = e.code().map(|c| c.code().to_string());
        return if matches!(code.as_deref(), Some("SF001" | "40001")) {
            HungEnd::Refused
        } else {
            HungEnd::Failed(e.to_string())
        };
    }
    // Holding the fence row's lock, as a workload stuck mid-transaction does.
    let end = killed.await.unwrap_or(HungEnd::Healed);
    // The pod is dead: its connection goes with it, no ROLLBACK sent; the server ends the
    // transaction when the socket closes.
    conn.abort();
    drop(tx);
    end
}

fn spawn_write(
    w: &Arc<Workload>,
    prefix: &str,
    key: &str,
    period: Timestamp,
    token: u64,
    held: bool,
) {
    let (w, prefix, key) = (w.clone(), prefix.to_string(), key.to_string());
    w.in_flight.fetch_add(1, Ordering::SeqCst);
    tokio::spawn(async move {
        let result = {
            // Never closed: acquiring cannot fail.
            let _permit = w.connections.acquire().await;
            write_with_retry(&prefix, &key, period, token, held).await
        };
        lock(&w.writes).push(Write {
            job: key,
            period,
            token,
            held,
            result,
        });
        w.in_flight.fetch_sub(1, Ordering::SeqCst);
    });
}

/// The workload's transaction: `singleton_fence` first, then its write. Retried while the database
/// is unreachable (at most 90 s); a refusal is final.
pub(super) async fn write_with_retry(
    prefix: &str,
    key: &str,
    period: Timestamp,
    token: u64,
    held: bool,
) -> WriteResult {
    let end = Instant::now() + Duration::from_secs(90);
    loop {
        match tokio::time::timeout(
            Duration::from_secs(10),
            fenced_write(prefix, key, period, token, held),
        )
        .await
        {
            Ok(Ok(r)) => return r,
            Ok(Err(_)) | Err(_) if Instant::now() < end => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            _ => return WriteResult::Unavailable,
        }
    }
}

async fn fenced_write(
    prefix: &str,
    key: &str,
    period: Timestamp,
    token: u64,
    held: bool,
) -> Result<WriteResult> {
    let mut client = crate::pg().await?;
    let tx = client.transaction().await?;
    if let Err(e) = tx
        .query(
            &format!("SELECT {prefix}fence($1, $2)"),
            &[&key, &(token as i64)],
        )
        .await
    {
        let code = e.code().map(|c| c.code().to_string());
        if matches!(code.as_deref(), Some("SF001" | "40001")) {
            return Ok(WriteResult::Refused);
        }
        return Err(e.into());
    }
    let seq: i64 = tx
        .query_one(
            &format!(
                "INSERT INTO {prefix}chaos_writes (job, period, token, held) VALUES ($1, $2, $3, $4) RETURNING id"
            ),
            &[&key, &period, &(token as i64), &held],
        )
        .await?
        .get(0);
    tx.commit().await?;
    Ok(WriteResult::Accepted { seq })
}

/// A check of a world, polled by [`poll_until`]: `Some` once what is waited for holds.
pub type Check<'a, T> = Pin<Box<dyn Future<Output = Result<Option<T>>> + 'a>>;

/// A world the scenarios poll: one step of its supervision between tries, and what it shows
/// when a wait fails.
pub trait Polled {
    fn tick(&mut self) -> impl Future<Output = Result<()>>;
    fn dump(&self) -> impl Future<Output = String>;
}

impl Polled for World {
    fn tick(&mut self) -> impl Future<Output = Result<()>> {
        World::tick(self)
    }
    fn dump(&self) -> impl Future<Output = String> {
        World::dump(self)
    }
}

/// Waits (at most `timeout`) until `check` gives `Some`, ticking `world` before each try (each
/// try bounded by 5 s). On time-out, fails with the last error and the world's dump.
pub async fn poll_until<W: Polled, T>(
    world: &mut W,
    what: &str,
    timeout: Duration,
    check: impl for<'a> Fn(&'a W) -> Check<'a, T>,
) -> Result<T> {
    let end = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        world.tick().await?;
        match tokio::time::timeout(Duration::from_secs(5), check(world)).await {
            Ok(Ok(Some(v))) => return Ok(v),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => last_err = Some(e),
            Err(_) => last_err = Some(anyhow::anyhow!("check timed out")),
        }
        if Instant::now() > end {
            bail!(
                "timed out after {timeout:?} waiting for {what} (last error: {last_err:?})\n{}",
                world.dump().await
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
