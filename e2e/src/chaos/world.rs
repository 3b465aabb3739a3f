//! The world a chaos scenario runs in: a namespace, three controller replicas with leader election
//! (restarted when they exit, as a Deployment's pods would be), SingletonJobs with seconds-level
//! schedules and (most of them) the backstop (PostgreSQL, or MariaDB in the `*-mariadb` rows:
//! [`Db`]), an outside observer of the Jobs
//! ([`crate::observer`]), and a workload that performs a fenced write with each run's token (as
//! an attempt of its own when the backstop registers attempts). Afterwards [`World::observe`]
//! reads the external truth for the checker.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
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
    Claim, CommittedAttempt, HungEnd, HungTx, JobSeen, Observations, Recorded, SjObservation,
    Write, WriteResult,
};
use super::mariadb::Db;
use crate::commands::repo_root;
use crate::observer::{EventJob, JobRecord, Observer, Seen, job_controller_runs, parse_job_name};
use crate::{
    Env, FAST_ELECTION, Proxy, backstop_secret, controller_bin, database_url, kubectl, sj_yaml,
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
    /// With the backstop (`lock.purpose: Correctness`), in the world's database ([`Db`]).
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

    /// The time between two instants of its schedule.
    pub fn interval(&self) -> Duration {
        singleton::schedule::Schedule::parse(&self.schedule, None, Default::default())
            .map(|s| schedule_interval(&s, Timestamp::now()))
            .unwrap_or(Duration::ZERO)
    }

    /// `concurrencyPolicy: Forbid` (the default): a new period waits for the active run.
    pub fn forbid(&self) -> bool {
        !self.extra.contains("concurrencyPolicy")
    }

    fn yaml(&self, prefix: &str, db: Db) -> String {
        let mut extra = self.extra.clone();
        if !self.keep_history {
            extra += "  successfulJobsHistoryLimit: 0\n  failedJobsHistoryLimit: 0\n";
        }
        let spec = if self.backstop {
            db.backstop_spec("db", prefix, &extra)
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

/// What [`World::empty_armed`] starts its replicas with.
#[derive(Clone, Debug, Default)]
pub struct Armed {
    /// Per replica slot: environment of its processes (a missing slot: none).
    pub envs: Vec<Vec<(String, String)>>,
    /// Replica 0 reaches the API server through a shaping proxy ([`World::proxy`],
    /// [`Proxy::start_shaping`]): its watches can be delayed, its requests held.
    pub shaped: bool,
}

/// A replica slot: the controller process currently filling it, and how to start it.
struct Slot {
    idx: usize,
    /// The controller build it runs (another release's in mixed-versions).
    bin: PathBuf,
    envs: Vec<(String, String)>,
    restart_at: Option<Instant>,
    /// Not restarted while set ([`World::make_leader`] holds the old leader back).
    held: bool,
    /// When its process was started (real time).
    started: Timestamp,
}

/// A run whose write the pausing workload holds back: its pod started (and registered its
/// attempt) when the run started, and writes once a newer run has started.
struct HeldRun {
    period: Timestamp,
    token: u64,
    attempt: Option<String>,
    registered: Option<tokio::task::JoinHandle<Result<(), WriteResult>>>,
}

/// The workload's shared state.
struct Workload {
    writes: Mutex<Vec<Write>>,
    /// Per SingletonJob key: the run whose write is held back.
    held: Mutex<BTreeMap<String, HeldRun>>,
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
    /// SingletonJob names with a backstop: only their runs have a fence (a job without one gets
    /// SF003, never issued), so only they write.
    fenced: Mutex<HashSet<String>>,
    /// The backstop registers attempts (`<p>attempt`, schema 5): each simulated pod registers
    /// as attempt `sim-<Job uid>` and writes with the 3-argument fence, recording its attempt.
    /// Otherwise the 2-argument fence and no attempts (the columns show n/a).
    attempts: AtomicBool,
    /// Where the runs register and write: the world's backstop database.
    db: Db,
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
            fenced: Mutex::default(),
            attempts: AtomicBool::new(false),
            db: Db::Postgres,
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
    /// The backstop's database, which the workload writes to and the checker reads.
    pub db: Db,
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
    /// The replicas' link to PostgreSQL (the backstop Secret points through it), when the row
    /// cuts it ([`World::start_with_db_link`]); the workload connects directly.
    pub db_link: Option<Proxy>,
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
        let mut world = World::empty(name, proxied, false).await?;
        world.add_sjs(sjs).await?;
        Ok(world)
    }

    /// [`World::start`], the replicas reaching PostgreSQL through [`World::db_link`].
    pub async fn start_with_db_link(name: &str, sjs: Vec<SjDef>) -> Result<World> {
        let mut world = World::empty(name, None, true).await?;
        world.add_sjs(sjs).await?;
        Ok(world)
    }

    /// [`World::start`] with the backstop (and so the workload's fence and writes) in `db`.
    pub async fn start_on(name: &str, sjs: Vec<SjDef>, db: Db) -> Result<World> {
        let bins = vec![controller_bin(); REPLICAS];
        let mut world = World::with_builds(name, None, false, bins, db, Armed::default()).await?;
        world.add_sjs(sjs).await?;
        Ok(world)
    }

    /// [`World::start`] with the replicas of `slots` running `older` (another release's build)
    /// and the rest this tree's.
    pub async fn start_mixed(
        name: &str,
        sjs: Vec<SjDef>,
        older: &Path,
        slots: &[usize],
    ) -> Result<World> {
        let bins: Vec<PathBuf> = (0..REPLICAS)
            .map(|s| match slots.contains(&s) {
                true => older.to_path_buf(),
                false => controller_bin(),
            })
            .collect();
        let setup = Armed::default();
        let mut world = World::with_builds(name, None, false, bins, Db::Postgres, setup).await?;
        world.add_sjs(sjs).await?;
        Ok(world)
    }

    /// The build `slot` runs.
    pub fn build_of(&self, slot: usize) -> &Path {
        &self.slots[slot].bin
    }

    /// A world without SingletonJobs yet ([`World::add_sjs`]); with `db_link`, the backstop
    /// Secret points through a proxy of the test's.
    pub async fn empty(name: &str, proxied: Option<usize>, db_link: bool) -> Result<World> {
        let bins = vec![controller_bin(); REPLICAS];
        World::with_builds(name, proxied, db_link, bins, Db::Postgres, Armed::default()).await
    }

    /// [`World::empty`], replica `s` started (and restarted) with the environment `armed.envs[s]`
    /// (a test build's failpoints, `SINGLETON_FAILPOINTS`); with `armed.shaped`, replica 0
    /// reaches the API server through a proxy that can delay what the server pushes to it (its
    /// watches: [`Proxy::delay_pushed`]) and hold what it sends ([`Proxy::hold_requests`]).
    pub async fn empty_armed(name: &str, armed: Armed) -> Result<World> {
        let bins = vec![controller_bin(); REPLICAS];
        let proxied = armed.shaped.then_some(0);
        World::with_builds(name, proxied, false, bins, Db::Postgres, armed).await
    }

    /// [`World::empty`], replica `s` running the controller build `bins[s]`, the backstop in
    /// `db` (a link to cut only to PostgreSQL), and `armed` ([`World::empty_armed`]).
    async fn with_builds(
        name: &str,
        proxied: Option<usize>,
        db_link: bool,
        bins: Vec<PathBuf>,
        db: Db,
        armed: Armed,
    ) -> Result<World> {
        let env = Env::new(name).await?;
        let prefix = table_prefix(&env);
        let db_link = match db_link {
            true if db == Db::Postgres => Some(crate::proxied_backstop_secret(&env, "db").await?),
            true => bail!("a link to cut is made to PostgreSQL only"),
            false => {
                backstop_secret(&env, "db", &db.url()?, true).await?;
                None
            }
        };
        let proxy = match proxied {
            Some(_) => Some(apiserver_proxy(armed.shaped).await?),
            None => None,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let observer = Observer::start(env.client.clone(), &env.ns, tx);
        let mut world = World {
            env,
            slots: Vec::new(),
            prefix,
            db,
            sjs: Vec::new(),
            workload: Arc::new(Workload {
                db,
                ..Workload::default()
            }),
            observer,
            seen: Some(rx),
            dispatcher: None,
            proxy,
            proxy_slot: proxied,
            db_link,
        };
        // Before any Job can exist: the observer must see the first one.
        world
            .wait("the Job watch's first list", Duration::from_secs(30), |w| {
                Box::pin(async move { Ok(w.observer.synced().then_some(())) })
            })
            .await?;
        for (slot, bin) in bins.into_iter().enumerate() {
            let mut envs = armed.envs.get(slot).cloned().unwrap_or_default();
            if Some(slot) == world.proxy_slot
                && let Some(p) = &world.proxy
            {
                let kc = proxied_kubeconfig(&world.env, p.port)?;
                envs.push(("KUBECONFIG".to_string(), kc.display().to_string()));
            }
            let started = Timestamp::now();
            let idx = world
                .env
                .start_controller_bin(&bin, &envs, &elect())
                .await?;
            world.slots.push(Slot {
                idx,
                bin,
                envs,
                restart_at: None,
                held: false,
                started,
            });
        }
        Ok(world)
    }

    /// Creates `sjs` (16 at a time), waits for their backstops, and starts the workload once its
    /// table exists.
    pub async fn add_sjs(&mut self, sjs: Vec<SjDef>) -> Result<()> {
        let api = self.env.sjs();
        let ns = self.env.ns.clone();
        let yamls: Vec<String> = sjs
            .iter()
            .map(|sj| sj.yaml(&self.prefix, self.db))
            .collect();
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
        lock(&self.workload.fenced)
            .extend(sjs.iter().filter(|s| s.backstop).map(|s| s.name.clone()));
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
            let attempts = self.db.prepare_workload(&self.prefix).await?;
            self.workload.attempts.store(attempts, Ordering::SeqCst);
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
            if self.slots[s].held || self.env.controller_exit(idx)?.is_none() {
                continue;
            }
            match self.slots[s].restart_at {
                None => self.slots[s].restart_at = Some(Instant::now() + Duration::from_secs(1)),
                Some(at) if Instant::now() >= at => {
                    let (bin, envs) = (self.slots[s].bin.clone(), self.slots[s].envs.clone());
                    self.slots[s].started = Timestamp::now();
                    self.slots[s].idx =
                        self.env.start_controller_bin(&bin, &envs, &elect()).await?;
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

    /// [`World::run_for`], sampling the Lease every 250 ms: (samples, samples in which `slot`
    /// held it). A sample whose read failed counts as not held.
    pub async fn run_for_leading(&mut self, slot: usize, d: Duration) -> Result<(u64, u64)> {
        let end = Instant::now() + d;
        let (mut samples, mut held) = (0, 0);
        while Instant::now() < end {
            self.tick().await?;
            samples += 1;
            if matches!(self.leader().await, Ok(Some(l)) if l == slot) {
                held += 1;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok((samples, held))
    }

    /// When the process now filling `slot` was started (real time), and its log so far.
    pub fn started_log(&self, slot: usize) -> (Timestamp, String) {
        (
            self.slots[slot].started,
            self.env.controller_log(self.slots[slot].idx),
        )
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

    /// Hands the Lease to `slot`: a graceful handover (SIGTERM: the leader releases the Lease
    /// and is restarted) that only `slot` can win. The other standbys are paused meanwhile
    /// (SIGSTOP; a standby holds nothing, so the pause changes only who can race) and the old
    /// leader is restarted only after. Left to a race, a replica behind a proxy lost 8
    /// handovers in a row (a CI run, 2026-12-05). Tried at most `tries` times; returns whether
    /// `slot` leads.
    pub async fn make_leader(&mut self, slot: usize, tries: usize) -> Result<bool> {
        self.make_leader_by(slot, tries, "TERM").await
    }

    /// [`World::make_leader`], the leader sent `signal` (`KILL`: a crash, the Lease left to
    /// expire) instead of SIGTERM.
    pub async fn make_leader_by(
        &mut self,
        slot: usize,
        tries: usize,
        signal: &str,
    ) -> Result<bool> {
        for _ in 0..tries {
            let (l, _) = self
                .wait_leader(None, Instant::now(), Duration::from_secs(60))
                .await?;
            if l == slot {
                return Ok(true);
            }
            // The target must be running and a warm standby before the handover.
            self.wait_running(Duration::from_secs(30)).await?;
            let others: Vec<usize> = (0..self.slots.len())
                .filter(|s| *s != slot && *s != l)
                .collect();
            let mut paused = Vec::new();
            let mut handed = Ok(());
            for s in &others {
                match self.signal(*s, "STOP").await {
                    Ok(()) => paused.push(*s),
                    Err(e) => handed = Err(e),
                }
            }
            if handed.is_ok() {
                self.slots[l].held = true;
                handed = self.hand_over(l, signal).await;
                self.slots[l].held = false;
            }
            // Every paused standby resumes, whatever failed.
            for s in paused {
                let resumed = self.signal(s, "CONT").await;
                handed = handed.and(resumed);
            }
            handed?;
        }
        Ok(self.leader().await? == Some(slot))
    }

    /// `signal` (SIGTERM, SIGKILL) to the leader in `slot`, and a wait for anyone else to lead.
    async fn hand_over(&mut self, slot: usize, signal: &str) -> Result<()> {
        self.signal(slot, signal).await?;
        self.wait_leader(Some(slot), Instant::now(), Duration::from_secs(30))
            .await?;
        Ok(())
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
    /// PostgreSQL only: on MariaDB the runs write normally.
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

    /// Later processes of `slot` start without failpoints (`SINGLETON_FAILPOINTS`): its
    /// restarts after a fault are plain replicas.
    pub fn disarm(&mut self, slot: usize) {
        self.slots[slot]
            .envs
            .retain(|(k, _)| k != "SINGLETON_FAILPOINTS");
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
    /// controller wrote meanwhile. Whether it wiped anything: the object kubectl printed (the
    /// API server's answer to the patch) has a status with nothing the controller remembers
    /// (`wiped`), and kubectl did not say "Edit cancelled" (nothing to change: the status was
    /// empty already, so nothing was wiped).
    pub async fn wipe_status(&self, sj: &str) -> Result<bool> {
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
        if stderr.contains("Edit cancelled") {
            return Ok(false);
        }
        let printed: serde_json::Value = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("kubectl edit printed no object for {sj}"))?;
        Ok(wiped(printed.get("status")))
    }

    /// Has every SingletonJob started a run (a Job with a period, seen running) after `t`, or
    /// (Forbid) does it wait for an active run (kwok may leave a pod unfinished)? The active run
    /// counts only if the watch saw its Job allowed to run and still there, not on the word of
    /// `status.active` alone.
    pub async fn recovered_since(&self, t: Timestamp) -> Result<bool> {
        let jobs = self.observer.jobs();
        for sj in &self.sjs {
            let ran_since = jobs.iter().any(|j| {
                j.ran
                    && j.sj.as_deref() == Some(sj.name.as_str())
                    && j.period.is_some_and(|p| p > t)
            });
            let waiting = !ran_since && sj.forbid() && {
                let s = self.env.get_sj(&sj.name).await?.status.unwrap_or_default();
                s.active.iter().any(|a| {
                    jobs.iter().any(|j| {
                        j.name == a.job_name && j.ran && !j.finished && j.deleted.is_none()
                    })
                })
            };
            if !ran_since && !waiting {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Has every SingletonJob decided each of its periods due by `to` (the next instant after its
    /// `decidedThrough` is later), or (Forbid) does it wait for a run still active? Read from
    /// the statuses: after a fault the controller may still be catching up (catchUp All runs each
    /// missed period), and a period it has not reached yet is neither lost nor run.
    pub async fn caught_up(&self, to: Timestamp) -> Result<bool> {
        for sj in self.sjs.iter().filter(|sj| !sj.never_scheduled) {
            let status = self.env.get_sj(&sj.name).await?.status.unwrap_or_default();
            let schedule =
                singleton::schedule::Schedule::parse(&sj.schedule, None, Default::default())?;
            let next = status
                .decided_through
                .and_then(|d| schedule.next_after(d.0));
            let decided = next.is_some_and(|n| n > to);
            let waits_for_active_run = sj.forbid() && !status.active.is_empty();
            if !decided && !waits_for_active_run {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Ends the fault's hung transactions, stops the workload (after its in-flight writes, at most
    /// 60 s) and reads the external truth for periods due in (`from`, `to`], with the time of the
    /// check. What the harness knows itself (failovers, fault window, proofs, settle time) the
    /// caller adds.
    pub async fn observe(&mut self, from: Timestamp, to: Timestamp) -> Result<Observations> {
        self.release_hung();
        let end = Instant::now() + Duration::from_secs(60);
        while self.workload.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < end {
            self.run_for(Duration::from_millis(200)).await?;
        }
        self.workload.stopped.store(true, Ordering::SeqCst);
        let attempts = match self.workload.attempts.load(Ordering::SeqCst) {
            true => Some(self.db.committed_attempts(&self.prefix).await?),
            false => None,
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
        let checked_at = Timestamp::now();
        let backstopped = self.sjs.iter().any(|s| s.backstop);
        let read_claims = async {
            match backstopped {
                true => self.db.claims(&self.prefix).await,
                false => Ok(HashMap::new()),
            }
        };
        let seen = observe_sjs(&self.env, &self.observer, &defs, read_claims, from, to).await?;
        Ok(Observations {
            sjs: seen.sjs,
            writes: lock(&self.workload.writes).clone(),
            attempts,
            hung: lock(&self.workload.hung).clone(),
            watch_relists: self.observer.relists(),
            watch_errors: self.observer.errors(),
            events_only: seen.events_only,
            unattributed: seen.unattributed,
            checked_at: Some(checked_at),
            ..Observations::default()
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

/// What [`observe_sjs`] found.
pub struct SjsSeen {
    pub sjs: Vec<SjObservation>,
    /// Jobs known from the job controller's Events only.
    pub events_only: Vec<String>,
    /// Jobs labelled as runs without their SingletonJob or period annotation.
    pub unattributed: Vec<String>,
}

/// The external truth about the SingletonJobs `defs` (name, schedule) for periods due in
/// (`from`, `to`]: the Jobs as `observer` saw them, corrected by the job controller's Events (a
/// Job the watch never saw, in a relist gap, is added; one it never saw resumed but that acted on
/// pods ran), the outcomes recorded in Events and `status.history`, and the claims `read_claims`
/// gives (the backstop's rows, by job key; each SingletonJob's are those under the key the
/// controller files them under, `spec.backstop.jobKey` or `namespace/name`). Also the Jobs known
/// from Events only, and those the checker cannot attribute.
///
/// The claims are read last, after the Jobs and Events: every Job seen then had its claim
/// committed before it was created, so the claims read after include it. Read first, a run that
/// started in between would look like a run without a claim.
pub async fn observe_sjs(
    env: &Env,
    observer: &Observer,
    defs: &[(String, String)],
    read_claims: impl Future<Output = Result<HashMap<String, Vec<Claim>>>>,
    from: Timestamp,
    to: Timestamp,
) -> Result<SjsSeen> {
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
    let mut claims = read_claims.await?;

    let (mut jobs, unattributed) = watched_jobs(&records);
    let events_only = add_event_jobs(&mut jobs, reported, defs);
    let mut by_sj: HashMap<String, Vec<JobSeen>> = HashMap::new();
    for (_, (sj, seen)) in jobs {
        by_sj.entry(sj).or_default().push(seen);
    }

    let mut out = Vec::new();
    for (name, schedule) in defs {
        let sj = sjs
            .get(name)
            .with_context(|| format!("SingletonJob {name} is gone"))?;
        let key = sj.backstop_key();
        let status = sj.status.clone().unwrap_or_default();
        let schedule = singleton::schedule::Schedule::parse(schedule, None, Default::default())?;
        let due: Vec<Timestamp> = schedule.iter_after(from).take_while(|p| *p <= to).collect();
        let interval = schedule_interval(&schedule, from);
        let recorded = recorded_outcomes(&events, name, &status);
        out.push(SjObservation {
            claims: claims.remove(&key).unwrap_or_default(),
            jobs: by_sj.remove(name).unwrap_or_default(),
            key,
            backstop: sj.spec.backstop.is_some(),
            interval,
            due,
            decided_through: status.decided_through.map(|t| t.0),
            recorded,
        });
    }
    Ok(SjsSeen {
        sjs: out,
        events_only,
        unattributed,
    })
}

/// The Jobs the watch saw, by uid, with the name of their SingletonJob; and those without
/// their SingletonJob or period annotation (unattributed).
fn watched_jobs(records: &[JobRecord]) -> (BTreeMap<String, (String, JobSeen)>, Vec<String>) {
    let mut jobs: BTreeMap<String, (String, JobSeen)> = BTreeMap::new();
    let mut unattributed = Vec::new();
    for r in records {
        let (Some(sj), Some(period)) = (r.sj.clone(), r.period) else {
            unattributed.push(format!("{} (uid {})", r.name, r.uid));
            continue;
        };
        let seen = JobSeen::watched(r, period);
        jobs.insert(r.uid.clone(), (sj, seen));
    }
    (jobs, unattributed)
}

/// Corrects the watch's `jobs` by the job controller's Events (`reported`): a Job the watch
/// never saw (a relist gap) is added, one it never saw resumed but that acted on pods ran.
/// Returns the Jobs of `defs` known from Events only.
fn add_event_jobs(
    jobs: &mut BTreeMap<String, (String, JobSeen)>,
    reported: BTreeMap<String, EventJob>,
    defs: &[(String, String)],
) -> Vec<String> {
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
                // The Events outlive it; the list of the watch did not have it.
                let seen = JobSeen::from_events(&uid, &ej.name, period, ej.ran);
                jobs.insert(uid, (sj.to_string(), seen));
            }
        }
    }
    events_only
}

/// The outcomes the controller recorded without a run for the SingletonJob `name`: in its
/// Events, then in `status.history`.
fn recorded_outcomes(
    events: &[k8s_openapi::api::core::v1::Event],
    name: &str,
    status: &singleton::api::SingletonJobStatus,
) -> Vec<Recorded> {
    let mut recorded: Vec<Recorded> = events
        .iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some("SingletonJob"))
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
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
                // Every outcome recorded without a Job; the checker accepts only some.
                h.job_name.is_none() && !matches!(h.outcome, Outcome::Running)
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

/// The time between the first two instants of `schedule` after `t` (the chaos schedules are
/// regular).
pub fn schedule_interval(schedule: &singleton::schedule::Schedule, t: Timestamp) -> Duration {
    let mut it = schedule.iter_after(t);
    match (it.next(), it.next()) {
        (Some(a), Some(b)) => b.duration_since(a).unsigned_abs(),
        _ => Duration::ZERO,
    }
}

/// The simulated workload's table of committed writes (one row per accepted fenced write, with
/// the attempt that wrote it when attempts are registered).
pub async fn create_writes_table(db: &tokio_postgres::Client, prefix: &str) -> Result<()> {
    db.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {prefix}chaos_writes (id bigserial PRIMARY KEY, job text NOT NULL, \
         period timestamptz NOT NULL, token bigint NOT NULL, held boolean NOT NULL, attempt text, \
         at timestamptz NOT NULL DEFAULT clock_timestamp())"
    ))
    .await?;
    Ok(())
}

/// Whether the backstop under `prefix` registers attempts: `<p>attempt(text, bigint, text)`
/// exists (schema 5). Before it, workloads use the 2-argument fence and attempts are n/a.
pub async fn has_attempts(db: &tokio_postgres::Client, prefix: &str) -> Result<bool> {
    Ok(db
        .query_one(
            "SELECT to_regprocedure($1) IS NOT NULL",
            &[&format!("{prefix}attempt(text,bigint,text)")],
        )
        .await?
        .get(0))
}

/// The simulated workload's committed attempts: its committed writes that name an attempt,
/// with the attempt's registration (`<p>attempts`: order and time) when there is one.
pub async fn committed_attempts(
    db: &tokio_postgres::Client,
    prefix: &str,
) -> Result<Vec<CommittedAttempt>> {
    let rows = db
        .query(
            &format!(
                "SELECT w.job, w.period, w.token, w.attempt, a.seq::bigint, a.registered_at, w.at \
                 FROM {prefix}chaos_writes w LEFT JOIN {prefix}attempts a \
                   ON a.job = w.job AND a.token = w.token AND a.attempt = w.attempt \
                 WHERE w.attempt IS NOT NULL"
            ),
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| CommittedAttempt {
            job: r.get(0),
            period: r.get(1),
            token: r.get::<_, i64>(2) as u64,
            attempt: r.get(3),
            seq: r.get(4),
            registered_at: r.get(5),
            committed_at: r.get(6),
        })
        .collect())
}

/// Whether a SingletonJob's status holds nothing of the controller's memory: no token (the
/// CRD's default `fencingToken: 0` and `activeCount: 0` come back at once), no cursor, no history,
/// no active run.
fn wiped(status: Option<&serde_json::Value>) -> bool {
    let Some(st) = status else { return true };
    let zero = |k: &str| st.get(k).is_none_or(|v| v.as_u64() == Some(0));
    let empty = |k: &str| {
        st.get(k)
            .is_none_or(|v| v.is_null() || v.as_array().is_some_and(|a| a.is_empty()))
    };
    zero("fencingToken")
        && zero("activeCount")
        && st.get("decidedThrough").is_none_or(|v| v.is_null())
        && empty("history")
        && empty("active")
}

/// A proxy on loopback to the API server of the current kubeconfig (`shaped`:
/// [`Proxy::start_shaping`]).
async fn apiserver_proxy(shaped: bool) -> Result<Proxy> {
    let server = api_server()?;
    let port: u16 = server
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .with_context(|| format!("no port in API server URL {server}"))?;
    let target = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    match shaped {
        true => Proxy::start_shaping(target).await,
        false => Proxy::start(target).await,
    }
}

fn kubeconfig_path() -> Result<PathBuf> {
    std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .context("KUBECONFIG is unset: run `eval \"$(make -s env)\"`")
}

pub(super) fn api_server() -> Result<String> {
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

/// The workload: what the observer sees of runs becomes pods' work. A run (of a SingletonJob
/// with a backstop: only those have a fence) seen allowed to run performs its fenced write (or
/// holds it, or hangs in it); a Job seen gone kills its hung transaction, as a deleted Job's pod
/// dies with its connection.
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
                if !lock(&w.fenced).contains(&sj) {
                    continue;
                }
                let attempt = w.attempts.load(Ordering::SeqCst).then(|| attempt_id(&uid));
                if w.db == Db::Postgres && lock(&w.hanging).contains(&sj) {
                    spawn_hang(&w, &prefix, &format!("{ns}/{sj}"), uid, token, attempt);
                } else {
                    on_new_run(&w, &prefix, &ns, &sj, period, token, attempt);
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

/// The attempt id of the simulated pod of the Job with `uid` (one pod per Job).
pub(super) fn attempt_id(uid: &str) -> String {
    format!("sim-{uid}")
}

/// A new run of `sj` was seen: its pod starts (registering its attempt) and writes with its token
/// now, or holds the write (pausing workload). A run held before is written now, late: a newer run
/// has started, so its write must be refused.
fn on_new_run(
    w: &Arc<Workload>,
    prefix: &str,
    ns: &str,
    sj: &str,
    period: Timestamp,
    token: u64,
    attempt: Option<String>,
) {
    let key = format!("{ns}/{sj}");
    let pausing = lock(&w.pausing).contains(sj);
    let earlier = if pausing {
        let registered = attempt
            .clone()
            .map(|a| spawn_register(w, prefix, &key, token, a));
        lock(&w.held).insert(
            key.clone(),
            HeldRun {
                period,
                token,
                attempt: attempt.clone(),
                registered,
            },
        )
    } else {
        lock(&w.held).remove(&key)
    };
    if let Some(h) = earlier
        && h.token < token
    {
        spawn_write(
            w,
            prefix,
            &key,
            h.period,
            h.token,
            true,
            h.attempt,
            h.registered,
        );
    }
    if !pausing {
        spawn_write(w, prefix, &key, period, token, false, attempt, None);
    }
}

/// The pod of a held run registers its attempt at its start.
fn spawn_register(
    w: &Arc<Workload>,
    prefix: &str,
    key: &str,
    token: u64,
    attempt: String,
) -> tokio::task::JoinHandle<Result<(), WriteResult>> {
    let (w, prefix, key) = (w.clone(), prefix.to_string(), key.to_string());
    tokio::spawn(async move {
        let _permit = w.connections.acquire().await;
        w.db.register_with_retry(&prefix, &key, token, &attempt)
            .await
    })
}

/// The run with `token` hangs in its transaction holding the fence row until its Job (`uid`) is
/// seen gone or the fault is healed.
fn spawn_hang(
    w: &Arc<Workload>,
    prefix: &str,
    key: &str,
    uid: String,
    token: u64,
    attempt: Option<String>,
) {
    let (kill, killed) = oneshot::channel();
    lock(&w.hung_open).insert(uid, kill);
    let (w, prefix, key) = (w.clone(), prefix.to_string(), key.to_string());
    tokio::spawn(async move {
        let end = hang(&prefix, &key, token, attempt.as_deref(), killed).await;
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
    attempt: Option<&str>,
    mut killed: oneshot::Receiver<HungEnd>,
) -> HungEnd {
    if let Some(a) = attempt {
        let registered = tokio::select! {
            r = register_with_retry(prefix, key, token, a) => r,
            end = &mut killed => return end.unwrap_or(HungEnd::Healed),
        };
        match registered {
            Ok(()) => {}
            Err(WriteResult::Refused) => return HungEnd::Refused,
            Err(other) => return HungEnd::Failed(format!("registering attempt {a}: {other:?}")),
        }
    }
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
    let token_i = token as i64;
    let fenced = match attempt {
        Some(a) => {
            let fence = format!("SELECT {prefix}fence($1, $2, $3)");
            let params: &[&(dyn tokio_postgres::types::ToSql + Sync)] = &[&key, &token_i, &a];
            tokio::select! {
                r = tx.query(&fence, params) => r,
                end = &mut killed => return end.unwrap_or(HungEnd::Healed),
            }
        }
        None => {
            let fence = format!("SELECT {prefix}fence($1, $2)");
            let params: &[&(dyn tokio_postgres::types::ToSql + Sync)] = &[&key, &token_i];
            tokio::select! {
                r = tx.query(&fence, params) => r,
                end = &mut killed => return end.unwrap_or(HungEnd::Healed),
            }
        }
    };
    if let Err(e) = fenced {
        return match classify(&e) {
            Some(WriteResult::Refused) => HungEnd::Refused,
            _ => HungEnd::Failed(e.to_string()),
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

#[allow(clippy::too_many_arguments)]
fn spawn_write(
    w: &Arc<Workload>,
    prefix: &str,
    key: &str,
    period: Timestamp,
    token: u64,
    held: bool,
    attempt: Option<String>,
    registered: Option<tokio::task::JoinHandle<Result<(), WriteResult>>>,
) {
    let (w, prefix, key) = (w.clone(), prefix.to_string(), key.to_string());
    w.in_flight.fetch_add(1, Ordering::SeqCst);
    tokio::spawn(async move {
        // A held run registered when its pod started; a fresh one registers now.
        let registered = match (registered, &attempt) {
            (Some(h), _) => h.await.unwrap_or(Err(WriteResult::Unavailable)),
            (None, Some(a)) => {
                let _permit = w.connections.acquire().await;
                w.db.register_with_retry(&prefix, &key, token, a).await
            }
            (None, None) => Ok(()),
        };
        let result = match registered {
            Ok(()) => {
                // Never closed: acquiring cannot fail.
                let _permit = w.connections.acquire().await;
                w.db.write_with_retry(&prefix, &key, period, token, held, attempt.as_deref())
                    .await
            }
            Err(r) => r,
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

/// What a fence error says: a stale token or superseded attempt (SF001, SF004: refused), another
/// refusal of the fence (SF002 not permitted, SF003 never issued: rejected), or None for anything
/// else (the database unreachable, a serialization failure): retried.
pub(super) fn classify(e: &tokio_postgres::Error) -> Option<WriteResult> {
    classify_sqlstate(e.code()?.code())
}

pub(super) fn classify_sqlstate(code: &str) -> Option<WriteResult> {
    match code {
        "SF001" | "SF004" => Some(WriteResult::Refused),
        c if c.starts_with("SF") => Some(WriteResult::Rejected {
            sqlstate: c.as_bytes().try_into().unwrap_or(*b"SF???"),
        }),
        _ => None,
    }
}

/// Runs `op` until it gives a result, retrying while the database is unreachable (each try
/// bounded by 10 s, at most 90 s in all): then [`WriteResult::Unavailable`].
pub(super) async fn with_retry<T, F, Fut>(mut op: F) -> std::result::Result<T, WriteResult>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<std::result::Result<T, WriteResult>>>,
{
    let end = Instant::now() + Duration::from_secs(90);
    loop {
        match tokio::time::timeout(Duration::from_secs(10), op()).await {
            Ok(Ok(r)) => return r,
            Ok(Err(_)) | Err(_) if Instant::now() < end => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            _ => return Err(WriteResult::Unavailable),
        }
    }
}

/// A pod's registration of its attempt (`<p>attempt(job, token, attempt)`, autocommit), retried
/// while the database is unreachable; a refusal is final.
pub async fn register_with_retry(
    prefix: &str,
    key: &str,
    token: u64,
    attempt: &str,
) -> std::result::Result<(), WriteResult> {
    with_retry(|| async move {
        let client = crate::pg().await?;
        match client
            .query(
                &format!("SELECT {prefix}attempt($1, $2, $3)"),
                &[&key, &(token as i64), &attempt],
            )
            .await
        {
            Ok(_) => Ok(Ok(())),
            Err(e) => match classify(&e) {
                Some(r) => Ok(Err(r)),
                None => Err(e.into()),
            },
        }
    })
    .await
}

/// The workload's transaction: the fence first (with the attempt when there is one), then its
/// write. Retried while the database is unreachable (at most 90 s); a refusal is final.
pub async fn write_with_retry(
    prefix: &str,
    key: &str,
    period: Timestamp,
    token: u64,
    held: bool,
    attempt: Option<&str>,
) -> WriteResult {
    with_retry(|| fenced_write(prefix, key, period, token, held, attempt))
        .await
        .unwrap_or_else(|r| r)
}

async fn fenced_write(
    prefix: &str,
    key: &str,
    period: Timestamp,
    token: u64,
    held: bool,
    attempt: Option<&str>,
) -> Result<std::result::Result<WriteResult, WriteResult>> {
    let mut client = crate::pg().await?;
    let tx = client.transaction().await?;
    let token_i = token as i64;
    let fenced = match attempt {
        Some(a) => {
            tx.query(
                &format!("SELECT {prefix}fence($1, $2, $3)"),
                &[&key, &token_i, &a],
            )
            .await
        }
        None => {
            tx.query(&format!("SELECT {prefix}fence($1, $2)"), &[&key, &token_i])
                .await
        }
    };
    if let Err(e) = fenced {
        return match classify(&e) {
            Some(r) => Ok(Ok(r)),
            None => Err(e.into()),
        };
    }
    let seq: i64 = tx
        .query_one(
            &format!(
                "INSERT INTO {prefix}chaos_writes (job, period, token, held, attempt) VALUES ($1, $2, $3, $4, $5) RETURNING id"
            ),
            &[&key, &period, &token_i, &held, &attempt],
        )
        .await?
        .get(0);
    tx.commit().await?;
    Ok(Ok(WriteResult::Accepted { seq }))
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
            // The reason again after the dump: a CI log keeps only its last lines.
            bail!(
                "timed out after {timeout:?} waiting for {what} (last error: {last_err:?})\n{}\n(that was: timed out after {timeout:?} waiting for {what})",
                world.dump().await
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wiped_status_keeps_only_the_defaults() {
        let v = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        assert!(wiped(None));
        assert!(wiped(Some(&v(r#"{"activeCount":0,"fencingToken":0}"#))));
        assert!(!wiped(Some(&v(r#"{"activeCount":0,"fencingToken":5}"#))));
        assert!(!wiped(Some(&v(
            r#"{"fencingToken":0,"decidedThrough":"2026-12-05T02:26:28Z"}"#
        ))));
        assert!(!wiped(Some(&v(r#"{"history":[{"period":"x"}]}"#))));
    }

    #[test]
    fn fence_errors_are_told_apart() {
        assert_eq!(classify_sqlstate("SF001"), Some(WriteResult::Refused));
        assert_eq!(classify_sqlstate("SF004"), Some(WriteResult::Refused));
        assert_eq!(
            classify_sqlstate("SF003"),
            Some(WriteResult::Rejected {
                sqlstate: *b"SF003"
            })
        );
        // A serialization failure or a connection error is retried, never counted as a refusal.
        assert_eq!(classify_sqlstate("40001"), None);
        assert_eq!(classify_sqlstate("08006"), None);
    }
}
