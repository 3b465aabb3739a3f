//! The world a chaos scenario runs in: a namespace, three controller replicas with leader election
//! (restarted when they exit, as a Deployment's pods would be), SingletonJobs with seconds-level
//! schedules and the PostgreSQL backstop, and a workload that performs a fenced write with each
//! run's token. Afterwards [`World::observe`] reads the external truth for the checker.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use singleton::api::Outcome;

use super::check::{Claim, Observations, RunJob, SjObservation, Write, WriteResult};
use crate::{
    Env, FAST_ELECTION, Proxy, backstop_secret, backstop_spec, database_url, sj_yaml, table_prefix,
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
    pub name: &'static str,
    pub schedule: &'static str,
    /// Extra spec lines (policy, catch-up, deadline).
    pub extra: &'static str,
    /// Its Jobs never get a node, so each run stays active (for Replace).
    pub never_scheduled: bool,
}

impl SjDef {
    /// `concurrencyPolicy: Forbid` (the default): a new period waits for the active run.
    pub fn forbid(&self) -> bool {
        !self.extra.contains("concurrencyPolicy")
    }
}

/// The SingletonJobs of most scenarios: one Forbid every 2 s (catchUp Latest) and one Allow every
/// 3 s (catchUp All within a 20 s deadline).
pub fn default_sjs() -> Vec<SjDef> {
    vec![
        SjDef {
            name: "tick",
            schedule: "*/2 * * * * *",
            extra: "",
            never_scheduled: false,
        },
        SjDef {
            name: "tock",
            schedule: "*/3 * * * * *",
            extra: "  concurrencyPolicy: Allow\n  catchUp: All\n  startingDeadlineSeconds: 20\n",
            never_scheduled: false,
        },
    ]
}

/// A replica slot: the controller process currently filling it, and how to start it.
struct Slot {
    idx: usize,
    envs: Vec<(String, String)>,
    restart_at: Option<Instant>,
}

/// The workload's shared state.
#[derive(Default)]
struct Workload {
    writes: Mutex<Vec<Write>>,
    /// Per SingletonJob key: the run whose write is held back (period, token).
    held: Mutex<BTreeMap<String, (Timestamp, u64)>>,
    /// SingletonJob names whose workload pauses (holds each token until a newer run started).
    pausing: Mutex<HashSet<String>>,
    in_flight: std::sync::atomic::AtomicUsize,
}

pub struct World {
    pub env: Env,
    slots: Vec<Slot>,
    pub prefix: String,
    pub sjs: Vec<SjDef>,
    workload: Arc<Workload>,
    stop: Arc<AtomicBool>,
    poller: Option<tokio::task::JoinHandle<()>>,
    /// Replica slot routed to the API server through [`World::proxy`].
    pub proxy: Option<Proxy>,
    proxy_slot: Option<usize>,
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
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
    /// Namespace, backstop Secret, three replicas (slot `proxied`, if any, reaches the API server
    /// through a test-owned proxy), the SingletonJobs, and the workload.
    pub async fn start(name: &str, sjs: Vec<SjDef>, proxied: Option<usize>) -> Result<World> {
        let env = Env::new(name).await?;
        let prefix = table_prefix(&env);
        backstop_secret(&env, "db", &database_url()?, true).await?;
        let proxy = match proxied {
            Some(_) => Some(apiserver_proxy().await?),
            None => None,
        };
        let mut world = World {
            env,
            slots: Vec::new(),
            prefix,
            sjs,
            workload: Arc::default(),
            stop: Arc::default(),
            poller: None,
            proxy,
            proxy_slot: proxied,
        };
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
        for sj in world.sjs.clone() {
            let extra = format!(
                "{}  successfulJobsHistoryLimit: 100\n  failedJobsHistoryLimit: 100\n",
                sj.extra
            );
            let mut yaml = sj_yaml(
                sj.name,
                sj.schedule,
                &backstop_spec("db", &world.prefix, &extra),
            );
            if sj.never_scheduled {
                yaml = crate::never_scheduled(yaml);
            }
            world.env.create_sj(&yaml).await?;
        }
        // The schema (and singleton_fence) exists once a backstop is ready; then the workload's
        // table.
        world
            .wait(
                "BackstopReady on every SingletonJob",
                Duration::from_secs(60),
                |w| {
                    Box::pin(async move {
                        for sj in &w.sjs {
                            let s = w.env.get_sj(sj.name).await?.status.unwrap_or_default();
                            if !singleton::conditions::is_true(&s.conditions, "BackstopReady") {
                                return Ok(None);
                            }
                        }
                        Ok(Some(()))
                    })
                },
            )
            .await?;
        let db = crate::pg().await?;
        db.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {p}chaos_writes (id bigserial PRIMARY KEY, job text NOT NULL, \
             period timestamptz NOT NULL, token bigint NOT NULL, held boolean NOT NULL, \
             at timestamptz NOT NULL DEFAULT clock_timestamp())",
            p = world.prefix
        ))
        .await?;
        world.poller = Some(tokio::spawn(poll_jobs(
            world.env.client.clone(),
            world.env.ns.clone(),
            world.prefix.clone(),
            world.workload.clone(),
            world.stop.clone(),
        )));
        Ok(world)
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
        check: impl for<'a> Fn(
            &'a World,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<Option<T>>> + 'a>,
        >,
    ) -> Result<T> {
        let end = Instant::now() + timeout;
        let mut last_err = None;
        loop {
            self.tick().await?;
            match tokio::time::timeout(Duration::from_secs(5), check(self)).await {
                Ok(Ok(Some(v))) => return Ok(v),
                Ok(Ok(None)) => {}
                Ok(Err(e)) => last_err = Some(e),
                Err(_) => last_err = Some(anyhow::anyhow!("check timed out")),
            }
            if Instant::now() > end {
                bail!(
                    "timed out after {timeout:?} waiting for {what} (last error: {last_err:?})\n{}",
                    self.env.dump().await
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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
                    self.env.dump().await
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
        let mut p = self
            .workload
            .pausing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if on {
            p.insert(sj.to_string());
        } else {
            p.remove(sj);
        }
    }

    /// Has every SingletonJob started a run (a Job with a period) after `t`, or (Forbid) does it
    /// have an active run it waits for (kwok may leave a pod unfinished)?
    pub async fn recovered_since(&self, t: Timestamp) -> Result<bool> {
        let jobs = self.env.job_list().await?;
        for sj in &self.sjs {
            let mine: Vec<_> = jobs
                .iter()
                .filter(|j| {
                    j.annotations().get("singleton.dev/job").map(String::as_str) == Some(sj.name)
                })
                .collect();
            let ran_since = mine.iter().any(|j| {
                j.annotations()
                    .get("singleton.dev/period")
                    .and_then(|p| p.parse::<Timestamp>().ok())
                    .is_some_and(|p| p > t)
            });
            let waiting = !ran_since && {
                let s = self.env.get_sj(sj.name).await?.status.unwrap_or_default();
                !s.active.is_empty() && sj.forbid()
            };
            if !ran_since && !waiting {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Stops the workload (after its in-flight writes, at most 60 s) and reads the external
    /// truth for periods due in (`from`, `to`].
    pub async fn observe(
        &mut self,
        from: Timestamp,
        to: Timestamp,
        failovers: Vec<Duration>,
    ) -> Result<Observations> {
        let end = Instant::now() + Duration::from_secs(60);
        while self.workload.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < end {
            self.run_for(Duration::from_millis(200)).await?;
        }
        self.stop.store(true, Ordering::SeqCst);
        if let Some(p) = self.poller.take() {
            let _ = p.await;
        }
        let db = crate::pg().await?;
        let mut sjs = Vec::new();
        let jobs = self.env.job_list().await?;
        let events: Api<Event> = Api::namespaced(self.env.client.clone(), &self.env.ns);
        let events = events.list(&ListParams::default()).await?.items;
        for def in &self.sjs {
            let sj = self.env.get_sj(def.name).await?;
            let key = sj.key();
            let status = sj.status.clone().unwrap_or_default();
            let schedule =
                singleton::schedule::Schedule::parse(def.schedule, None, Default::default())?;
            let due: Vec<Timestamp> = schedule.iter_after(from).take_while(|p| *p <= to).collect();
            let claims = db
                .query(
                    &format!(
                        "SELECT period, token FROM {}claims WHERE job = $1",
                        self.prefix
                    ),
                    &[&key],
                )
                .await?
                .iter()
                .map(|r| Claim {
                    period: r.get(0),
                    token: r.get::<_, i64>(1) as u64,
                })
                .collect();
            let runs = jobs
                .iter()
                .filter(|j| {
                    j.annotations().get("singleton.dev/job").map(String::as_str) == Some(def.name)
                })
                .filter_map(|j| {
                    Some(RunJob {
                        name: j.name_any(),
                        period: j.annotations().get("singleton.dev/period")?.parse().ok()?,
                        token: j
                            .annotations()
                            .get("singleton.dev/fencing-token")?
                            .parse()
                            .ok()?,
                    })
                })
                .collect();
            let mut recorded: Vec<(Timestamp, Timestamp)> = events
                .iter()
                .filter(|e| e.involved_object.name.as_deref() == Some(def.name))
                .filter(|e| {
                    matches!(
                        e.reason.as_deref(),
                        Some("RunMissed" | "RunSkipped" | "RunDeduplicated")
                    )
                })
                .filter_map(|e| super::check::recorded_range(e.message.as_deref()?))
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
                    .map(|h| {
                        (
                            h.period.0,
                            h.last_period.as_ref().map_or(h.period.0, |l| l.0),
                        )
                    }),
            );
            sjs.push(SjObservation {
                key,
                due,
                decided_through: status.decided_through.map(|t| t.0),
                claims,
                jobs: runs,
                recorded,
            });
        }
        let writes = self
            .workload
            .writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Ok(Observations {
            sjs,
            writes,
            failovers,
        })
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
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

/// The workload's eyes: lists the namespace's Jobs every 300 ms (a list survives API server and
/// etcd outages without a watch's back-off; Jobs are kept by the history limits far longer than
/// that) and starts a fenced write for every new run.
async fn poll_jobs(
    client: kube::Client,
    ns: String,
    prefix: String,
    w: Arc<Workload>,
    stop: Arc<AtomicBool>,
) {
    let api: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client, &ns);
    let mut seen: HashSet<String> = HashSet::new();
    while !stop.load(Ordering::SeqCst) {
        let listed = tokio::time::timeout(
            Duration::from_secs(3),
            api.list(&ListParams::default().labels("singleton.dev/job")),
        )
        .await;
        if let Ok(Ok(list)) = listed {
            let mut new: Vec<(String, Timestamp, u64)> = list
                .items
                .iter()
                .filter(|j| !seen.contains(&j.name_any()))
                .filter_map(|j| {
                    let a = j.annotations();
                    Some((
                        a.get("singleton.dev/job")?.clone(),
                        a.get("singleton.dev/period")?.parse().ok()?,
                        a.get("singleton.dev/fencing-token")?.parse().ok()?,
                    ))
                })
                .collect();
            for j in &list.items {
                seen.insert(j.name_any());
            }
            new.sort_by_key(|(_, _, token)| *token);
            for (sj, period, token) in new {
                on_new_run(&w, &prefix, &ns, &sj, period, token);
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A new run of `sj` was seen: write with its token now, or hold it (pausing workload). A run
/// held before is written now, late: a newer run has started, so its write must be refused.
fn on_new_run(w: &Arc<Workload>, prefix: &str, ns: &str, sj: &str, period: Timestamp, token: u64) {
    let key = format!("{ns}/{sj}");
    let pausing = w
        .pausing
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(sj);
    let earlier = {
        let mut held = w.held.lock().unwrap_or_else(PoisonError::into_inner);
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
        let result = write_with_retry(&prefix, &key, period, token, held).await;
        w.writes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Write {
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
async fn write_with_retry(
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
    let (mut client, conn) =
        tokio_postgres::connect(&database_url()?, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
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
