//! make bench (hack/bench.sh): SingletonJob against Kubernetes CronJob, one workload after the
//! other on the same cluster in the same run, so their ratios hold even on a noisy machine.
//!
//! The instant each Job was allowed to run comes from the API server's audit log (microseconds;
//! a Job's `creationTimestamp` has whole seconds only): a CronJob's Job from its create, a
//! SingletonJob's from its resume (created suspended, it runs once its claim is confirmed), and
//! so does every request count. Skew is that instant minus the scheduled instant, read from the
//! Job's name (`<name>-<unix seconds>` for a SingletonJob, `<name>-<unix minutes>` for a CronJob).
//!
//! The SingletonJob side runs with runs prepared ahead of their instant ([`PREPARE_LEAD`], issue
//! 33) and, beside it in the same run, as before them (lead 0): its Jobs are then created up to
//! the lead before the instant, and still count from their resume.
mod audit;
mod burst;
mod plot;
mod procs;
mod report;
mod stats;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use futures::{StreamExt, TryStreamExt};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::{Value, json};
use singleton::api::SingletonJob;
use singleton::naming::{ANNOTATION_RELEASED, NOT_RELEASED};

use audit::{Audit, CRONJOB_USER, SINGLETON_USER};

/// Workload sizes: `BENCH=quick` to iterate, the default `full` for the committed results.
struct Sizes {
    raw_jobs: usize,
    idle_minutes: i64,
    seconds_window: u64,
    bursts: Vec<usize>,
    /// A burst with the lead only (SingletonJob; CronJob's client needs over 8 min for it).
    big_burst: Option<usize>,
    failover_rounds: usize,
    footprint: usize,
    rest_window: u64,
}

impl Sizes {
    fn new(quick: bool) -> Self {
        if quick {
            Sizes {
                raw_jobs: 300,
                idle_minutes: 2,
                seconds_window: 20,
                bursts: vec![100, 300],
                big_burst: None,
                failover_rounds: 1,
                footprint: 2_000,
                rest_window: 30,
            }
        } else {
            Sizes {
                raw_jobs: 1_000,
                idle_minutes: 6,
                seconds_window: 60,
                bursts: vec![100, 1_000],
                big_burst: Some(10_000),
                failover_rounds: 2,
                footprint: 10_000,
                rest_window: 60,
            }
        }
    }
}

struct Bench {
    client: Client,
    audit: Audit,
    controller_bin: PathBuf,
    controller_kubeconfig: PathBuf,
    kcm_pid: u32,
    work: PathBuf,
    run: String,
    sizes: Sizes,
    /// BENCH_REPEAT: how many times the bursts run, for the spread of their figures.
    repeat: usize,
    res: serde_json::Map<String, Value>,
    /// Skew samples for the plot: (workload, controller, ms).
    series: Vec<(String, &'static str, Vec<f64>)>,
}

const SJ: &str = "SingletonJob";
const CJ: &str = "CronJob";
/// The SingletonJob side without preparation, beside the one with it.
const SJ0: &str = "SingletonJob lead 0";

/// `--prepare-lead-seconds` of the controller under test (docs/design/prepared-runs.md's default
/// once preparation is on); [`SJ0`] runs with 0.
const PREPARE_LEAD: i64 = 30;

fn env_path(name: &str) -> anyhow::Result<PathBuf> {
    std::env::var_os(name)
        .map(PathBuf::from)
        .with_context(|| format!("{name} is not set (run through hack/bench.sh or make bench)"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let quick = std::env::var("BENCH").is_ok_and(|m| m == "quick");
    let out = env_path("BENCH_OUT")?;
    let mut b = Bench::new(quick).await?;
    let started = Timestamp::now();
    b.record_start(quick, started);
    b.workloads().await?;
    b.write_results(&out, started)
}

impl Bench {
    /// The bench as hack/bench.sh set it up (its environment), with nothing measured yet.
    async fn new(quick: bool) -> anyhow::Result<Self> {
        let kcm_pidfile = env_path("BENCH_KCM_PIDFILE")?;
        let kcm_pid: u32 = std::fs::read_to_string(&kcm_pidfile)?
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .context("no kube-controller-manager pid")?;
        Ok(Bench {
            client: Client::try_default().await?,
            audit: Audit::new(env_path("BENCH_AUDIT_LOG")?),
            controller_bin: env_path("BENCH_CONTROLLER_BIN")?,
            controller_kubeconfig: env_path("BENCH_CONTROLLER_KUBECONFIG")?,
            kcm_pid,
            work: env_path("BENCH_WORK")?,
            run: format!("b{}", Timestamp::now().as_second() % 100_000),
            sizes: Sizes::new(quick),
            repeat: repeat()?,
            res: serde_json::Map::new(),
            series: Vec::new(),
        })
    }

    /// The run's mode, machine and start, and the KCM's memory before any workload.
    fn record_start(&mut self, quick: bool, started: Timestamp) {
        self.res
            .insert("mode".into(), json!(if quick { "quick" } else { "full" }));
        self.res.insert(
            "machine".into(),
            json!(std::env::var("BENCH_MACHINE").unwrap_or_default()),
        );
        self.res
            .insert("started".into(), json!(started.to_string()));
        self.res.insert(
            "kcm_rss_start_kib".into(),
            json!(procs::rss_kib(self.kcm_pid)),
        );
        self.res
            .insert("prepare_lead_seconds".into(), json!(PREPARE_LEAD));
        self.res.insert("repeat".into(), json!(self.repeat));
    }

    /// Every workload, or those BENCH_ONLY names, one after the other.
    async fn workloads(&mut self) -> anyhow::Result<()> {
        // BENCH_ONLY=raw,idle,seconds,burst,failover,scale[-sj|-cj] runs some workloads
        // (iterating).
        let only = std::env::var("BENCH_ONLY").unwrap_or_default();
        let on = |w: &str| only.is_empty() || only.split(',').any(|o| o.trim() == w);
        if on("raw") {
            step("raw Job-create throughput");
            self.raw_throughput().await?;
        }
        if on("idle") {
            step("idle latency");
            self.idle().await?;
        }
        if on("seconds") {
            step("seconds schedule (SingletonJob only)");
            self.seconds().await?;
        }
        if on("burst") {
            self.bursts().await?;
        }
        if on("failover") {
            step("failover");
            self.failover().await?;
        }
        if on("scale") || on("scale-sj") {
            step("footprint at scale");
            self.footprint(SJ).await?;
        }
        if on("scale") || on("scale-cj") {
            self.footprint(CJ).await?;
        }
        Ok(())
    }

    /// results.json, results.md and skew.png in `out`; the report on stdout too.
    fn write_results(&mut self, out: &std::path::Path, started: Timestamp) -> anyhow::Result<()> {
        let wall = Timestamp::now().duration_since(started);
        self.res
            .insert("wall_seconds".into(), json!(wall.as_secs_f64().round()));
        std::fs::create_dir_all(out)?;
        let results = Value::Object(self.res.clone());
        std::fs::write(
            out.join("results.json"),
            serde_json::to_string_pretty(&results)? + "\n",
        )?;
        std::fs::write(out.join("results.md"), report::markdown(&results))?;
        plot::skew(&out.join("skew.png"), &self.series)?;
        println!("{}", report::markdown(&results));
        eprintln!(
            "bench: wrote {}/results.{{md,json}} and skew.png",
            out.display()
        );
        Ok(())
    }
}

/// BENCH_REPEAT (default 1): runs of each burst.
fn repeat() -> anyhow::Result<usize> {
    match std::env::var("BENCH_REPEAT") {
        Err(_) => Ok(1),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(k) if k >= 1 => Ok(k),
            _ => bail!("BENCH_REPEAT={v:?}: a whole number of runs, 1 or more"),
        },
    }
}

fn step(what: &str) {
    eprintln!("bench: [{}] {what}", Timestamp::now().strftime("%H:%M:%S"));
}

/// The scheduled instant a Job's name encodes.
fn scheduled(name: &str, kind: &str) -> Option<Timestamp> {
    let n: i64 = name.rsplit('-').next()?.parse().ok()?;
    let secs = if kind == CJ { n * 60 } else { n };
    Timestamp::from_second(secs).ok()
}

fn ms(d: SignedDuration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn job_template() -> Value {
    json!({"spec": {
        "backoffLimit": 0,
        "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox", "command": ["true"]}],
        }},
    }})
}

fn singleton_job(name: &str, schedule: &str, policy: &str) -> anyhow::Result<SingletonJob> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "singleton.dev/v1alpha1",
        "kind": "SingletonJob",
        "metadata": {"name": name},
        "spec": {
            "schedule": schedule,
            "concurrencyPolicy": policy,
            "successfulJobsHistoryLimit": 1,
            "failedJobsHistoryLimit": 1,
            "jobTemplate": job_template(),
        },
    }))?)
}

fn cron_job(name: &str, schedule: &str, policy: &str) -> anyhow::Result<CronJob> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name},
        "spec": {
            "schedule": schedule,
            "timeZone": "Etc/UTC",
            "concurrencyPolicy": policy,
            "successfulJobsHistoryLimit": 1,
            "failedJobsHistoryLimit": 1,
            "jobTemplate": job_template(),
        },
    }))?)
}

/// "M H * * *": once a day, at `at` (UTC, whole minute).
fn daily_at(at: Timestamp) -> String {
    let z = at.to_zoned(jiff::tz::TimeZone::UTC);
    format!("{} {} * * *", z.minute(), z.hour())
}

/// The first whole minute at least `lead` from now.
fn minute_after(lead: SignedDuration) -> anyhow::Result<Timestamp> {
    let t = Timestamp::now() + lead;
    let s = t.as_second();
    Ok(Timestamp::from_second(s + (60 - s.rem_euclid(60)) % 60)?)
}

async fn sleep_until(t: Timestamp) {
    let d = t.duration_since(Timestamp::now());
    if d.is_positive() {
        tokio::time::sleep(d.unsigned_abs()).await;
    }
}

async fn create_all<K>(api: &Api<K>, objs: Vec<K>, concurrency: usize) -> anyhow::Result<()>
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    futures::stream::iter(objs)
        .map(|o| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &o).await }
        })
        .buffer_unordered(concurrency)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    Ok(())
}

/// What the controller's claim and create send for one run, without the controller: a status write
/// carrying the read resourceVersion (a pending claim and its token), then a suspended Job.
async fn claim_then_create(
    sjs: &Api<SingletonJob>,
    jobs: &Api<Job>,
    mut sj: SingletonJob,
) -> anyhow::Result<()> {
    let name = sj
        .metadata
        .name
        .clone()
        .context("listed object without a name")?;
    let now = Timestamp::now();
    let job_name = format!("{name}-{}", now.as_second());
    sj.status = Some(serde_json::from_value(json!({
        "fencingToken": 1,
        "decidedThrough": now.to_string(),
        "lastScheduleTime": now.to_string(),
        "pendingClaim": {"period": now.to_string(), "token": 1, "jobName": job_name,
                         "claimedAt": now.to_string()},
    }))?);
    sjs.replace_status(&name, &PostParams::default(), &sj)
        .await?;
    let mut t = job_template();
    t["metadata"] = json!({"name": job_name});
    t["spec"]["suspend"] = json!(true);
    jobs.create(&PostParams::default(), &serde_json::from_value(t)?)
        .await?;
    Ok(())
}

/// The patch bound `P`: the Jobs `raw-<i>` (suspended, not released) patched as a prepared
/// run's resume patches its Job, 64 in flight, but with `suspend` left true so that no pod starts:
/// at the instant that patch is a prepared run's one request. Then a patch's round trip at rest:
/// 50 of them one after the other.
async fn raw_patches(api: &Api<Job>) -> anyhow::Result<Value> {
    let jobs: Vec<(String, String)> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|j| Some((j.metadata.name?, j.metadata.uid?)))
        .filter(|(name, _)| name.starts_with("raw-"))
        .collect();
    let t0 = std::time::Instant::now();
    futures::stream::iter(&jobs)
        .map(|(name, uid)| resume_like(api, name, uid, NOT_RELEASED, "1"))
        .buffer_unordered(64)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    let secs = t0.elapsed().as_secs_f64();
    let rate = jobs.len() as f64 / secs;
    eprintln!(
        "bench:   {} patches in {secs:.2} s: {rate:.0} patches/s",
        jobs.len()
    );
    // At rest: the Job controller has noted the patches.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut round_trips = Vec::new();
    for (name, uid) in jobs.iter().take(50) {
        let t = std::time::Instant::now();
        resume_like(api, name, uid, "1", "2").await?;
        round_trips.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let rt = stats::summary(&round_trips);
    eprintln!(
        "bench:   a patch's round trip at rest: p50 {} ms",
        rt["p50_ms"]
    );
    Ok(
        json!({"patches": jobs.len(), "patch_seconds": secs, "patches_per_second": rate,
              "patch_round_trip": rt}),
    )
}

/// The controller's resume of a prepared run (kube_io::resume_job: tests of the uid, of
/// `suspend` and of the released mark, then the mark set), with `suspend` replaced by true.
async fn resume_like(
    api: &Api<Job>,
    name: &str,
    uid: &str,
    was: &str,
    token: &str,
) -> anyhow::Result<()> {
    let released = format!(
        "/metadata/annotations/{}",
        ANNOTATION_RELEASED.replace('~', "~0").replace('/', "~1")
    );
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": "/spec/suspend", "value": true},
        {"op": "test", "path": released, "value": was},
        {"op": "replace", "path": released, "value": token},
        {"op": "replace", "path": "/spec/suspend", "value": true},
    ]))?;
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(ops))
        .await?;
    Ok(())
}

/// A controller process under test.
struct Controller {
    child: tokio::process::Child,
    pid: u32,
}

impl Controller {
    async fn signal(&mut self, sig: &str) -> anyhow::Result<()> {
        let st = tokio::process::Command::new("kill")
            .args(["-s", sig, &self.pid.to_string()])
            .status()
            .await?;
        if !st.success() {
            bail!("kill -s {sig} {} failed", self.pid);
        }
        Ok(())
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        self.signal("TERM").await?;
        if tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .is_err()
        {
            self.child.kill().await?;
        }
        Ok(())
    }
}

impl Bench {
    fn spawn_controller(&self, tag: &str, args: &[String]) -> anyhow::Result<Controller> {
        let log = std::fs::File::create(self.work.join(format!("controller-{tag}.log")))?;
        let child = tokio::process::Command::new(&self.controller_bin)
            .args(args)
            .env("KUBECONFIG", &self.controller_kubeconfig)
            .env("RUST_LOG", "info")
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.controller_bin.display()))?;
        let pid = child.id().context("controller exited at once")?;
        Ok(Controller { child, pid })
    }

    /// One replica that always acts, like the cluster's kube-controller-manager
    /// (--leader-elect=false): neither side pays for leader election outside the failover test.
    /// It prepares runs `lead` seconds ahead (0: never).
    async fn single_controller(&self, tag: &str, lead: i64) -> anyhow::Result<Controller> {
        let c = self.spawn_controller(
            tag,
            &[
                "--leader-elect=false".into(),
                // Always said, so that a change of the flag's default changes no row.
                format!("--prepare-lead-seconds={lead}"),
                "--health-addr=127.0.0.1:62081".into(),
                // The bench reads no metrics: a free loopback port, no TLS to set up.
                "--metrics-addr=127.0.0.1:0".into(),
                "--metrics-auth=none".into(),
            ],
        )?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(c)
    }

    /// What acts for `kind`, with its pid and API user: for SingletonJob a fresh single
    /// controller preparing runs `lead` seconds ahead (returned, for the caller to stop), for
    /// CronJob the cluster's running KCM.
    async fn actor(
        &self,
        kind: &str,
        tag: &str,
        lead: i64,
    ) -> anyhow::Result<(Option<Controller>, u32, &'static str)> {
        if kind == SJ {
            let c = self.single_controller(tag, lead).await?;
            let pid = c.pid;
            Ok((Some(c), pid, SINGLETON_USER))
        } else {
            Ok((None, self.kcm_pid, CRONJOB_USER))
        }
    }

    /// A fresh namespace with the `default` ServiceAccount (the restricted KCM runs no
    /// ServiceAccount controller, and pods need it).
    async fn namespace(&self, what: &str) -> anyhow::Result<String> {
        let name = format!("{}-{what}", self.run);
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}}))?;
        Api::<ServiceAccount>::namespaced(self.client.clone(), &name)
            .create(&PostParams::default(), &sa)
            .await?;
        Ok(name)
    }

    /// Deletes what a workload made. No namespace controller and no garbage collector run in
    /// the restricted KCM, so each kind goes by its own delete-collection.
    async fn cleanup(&self, ns: &str) -> anyhow::Result<()> {
        let lp = ListParams::default();
        // Background: a Job's default is to orphan its pods, through an `orphan` finalizer that
        // only the garbage collector removes, and the bench's kube-controller-manager runs the
        // cronjob and job controllers alone: such Jobs stayed, deleting, for the rest of the
        // run (the controllers at rest cached them). The bench deletes the pods itself.
        let dp = DeleteParams::background();
        let c = self.client.clone();
        Api::<SingletonJob>::namespaced(c.clone(), ns)
            .delete_collection(&dp, &lp)
            .await?;
        Api::<CronJob>::namespaced(c.clone(), ns)
            .delete_collection(&dp, &lp)
            .await?;
        Api::<Job>::namespaced(c.clone(), ns)
            .delete_collection(&dp, &lp)
            .await?;
        // The next workload starts on a quiet cluster, its controller caching none of these.
        // The pods are deleted again until none is left: the job controller may still create a
        // pod for a Job being deleted, and nothing here collects orphans.
        let pods = Api::<Pod>::namespaced(c.clone(), ns);
        let jobs = Api::<Job>::namespaced(c, ns);
        let one = ListParams::default().limit(1);
        let deadline = Timestamp::now() + SignedDuration::from_mins(15);
        loop {
            pods.delete_collection(&DeleteParams::default().grace_period(0), &lp)
                .await?;
            if jobs.list_metadata(&one).await?.items.is_empty()
                && pods.list_metadata(&one).await?.items.is_empty()
            {
                return Ok(());
            }
            if Timestamp::now() > deadline {
                bail!("cleanup: the Jobs and pods of {ns} were not gone within 15 minutes");
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    /// Polls the audit log from `mark` until `n` Jobs `user` made in `ns` were allowed to run
    /// ([`audit::job_starts`]), or `deadline`. Returns (name, instant), the first per name.
    async fn wait_creates(
        &self,
        mark: u64,
        user: &str,
        ns: &str,
        n: usize,
        deadline: Timestamp,
    ) -> anyhow::Result<Vec<(String, Timestamp)>> {
        self.wait_starts(mark, user, ns, deadline, |seen| seen.len() >= n)
            .await
    }

    /// [`Bench::wait_creates`] until `enough` says so of the starts seen.
    async fn wait_starts(
        &self,
        mark: u64,
        user: &str,
        ns: &str,
        deadline: Timestamp,
        enough: impl Fn(&std::collections::BTreeMap<String, Timestamp>) -> bool,
    ) -> anyhow::Result<Vec<(String, Timestamp)>> {
        let mut offset = mark;
        let mut seen = std::collections::BTreeMap::new();
        loop {
            let reqs = self.audit.read_on(&mut offset)?;
            for (name, at) in audit::job_starts(&reqs, user, ns) {
                seen.entry(name.to_string()).or_insert(at);
            }
            if enough(&seen) || Timestamp::now() > deadline {
                return Ok(std::mem::take(&mut seen).into_iter().collect());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn raw_throughput(&mut self) -> anyhow::Result<()> {
        let ns = self.namespace("raw").await?;
        let api: Api<Job> = Api::namespaced(self.client.clone(), &ns);
        let n = self.sizes.raw_jobs;
        let jobs = (0..n)
            .map(|i| {
                let mut t = job_template();
                // Marked not released, as the controller creates them: the patch bound's tests.
                t["metadata"] = json!({"name": format!("raw-{i}"),
                                       "annotations": {ANNOTATION_RELEASED: NOT_RELEASED}});
                // Suspended: the Job controller creates no pods, so only the create is measured.
                t["spec"]["suspend"] = json!(true);
                serde_json::from_value::<Job>(t)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let t0 = std::time::Instant::now();
        create_all(&api, jobs, 64).await?;
        let secs = t0.elapsed().as_secs_f64();
        let rate = n as f64 / secs;
        eprintln!("bench:   {n} Jobs in {secs:.2} s: {rate:.0} Jobs/s");

        // The floor of any claim-then-create protocol: per run one resourceVersion-guarded
        // status write of a SingletonJob (what the controller's claim writes) and then the create.
        let sjs: Api<SingletonJob> = Api::namespaced(self.client.clone(), &ns);
        let yearly = (0..n)
            .map(|i| singleton_job(&format!("floor-{i}"), "0 0 1 1 *", "Forbid"))
            .collect::<anyhow::Result<Vec<_>>>()?;
        create_all(&sjs, yearly, 64).await?;
        let objs = sjs.list(&Default::default()).await?.items;
        let t0 = std::time::Instant::now();
        futures::stream::iter(objs)
            .map(|sj| {
                let (sjs, api) = (sjs.clone(), api.clone());
                async move { claim_then_create(&sjs, &api, sj).await }
            })
            .buffer_unordered(64)
            .try_for_each(|_| async { Ok(()) })
            .await?;
        let floor_secs = t0.elapsed().as_secs_f64();
        let floor_rate = n as f64 / floor_secs;
        eprintln!("bench:   {n} claims + creates in {floor_secs:.2} s: {floor_rate:.0} runs/s");
        let mut raw = json!({"jobs": n, "concurrency": 64, "seconds": secs, "jobs_per_second": rate,
                   "claim_create_seconds": floor_secs, "claim_create_per_second": floor_rate});
        if let (Some(raw), Value::Object(p)) = (raw.as_object_mut(), raw_patches(&api).await?) {
            raw.extend(p);
        }
        self.res.insert("raw".into(), raw);
        self.cleanup(&ns).await
    }

    /// Two SingletonJobs and one CronJob, each every other minute: the SingletonJobs on even
    /// minutes (one at :00, prepared [`PREPARE_LEAD`] ahead; one at :30 with
    /// `prepareLeadSeconds: 0`, as before preparation), the CronJob on odd ones, so that no two
    /// share an instant or a preparation.
    async fn idle(&mut self) -> anyhow::Result<()> {
        let ns = self.namespace("idle").await?;
        let ctl = self.single_controller("idle", PREPARE_LEAD).await?;
        let mark = self.audit.mark();
        let from = Timestamp::now();
        let sjs = Api::<SingletonJob>::namespaced(self.client.clone(), &ns);
        let pp = PostParams::default();
        sjs.create(&pp, &singleton_job("idle", "*/2 * * * *", "Forbid")?)
            .await?;
        let mut lead0 = singleton_job("idle0", "30 */2 * * * *", "Forbid")?;
        lead0.spec.prepare_lead_seconds = Some(0);
        sjs.create(&pp, &lead0).await?;
        Api::<CronJob>::namespaced(self.client.clone(), &ns)
            .create(&pp, &cron_job("idle", "1-59/2 * * * *", "Forbid")?)
            .await?;
        let each = (self.sizes.idle_minutes / 2) as usize;
        let deadline = minute_after(SignedDuration::from_secs(5))?
            + SignedDuration::from_mins(self.sizes.idle_minutes + 1);
        let sj = self
            .wait_starts(mark, SINGLETON_USER, &ns, deadline, |seen| {
                let lead0 = seen.keys().filter(|n| is_idle0(n)).count();
                lead0 >= each && seen.len() - lead0 >= each
            })
            .await?;
        let (sj0, sj): (Vec<_>, Vec<_>) = sj.into_iter().partition(|(n, _)| is_idle0(n));
        let cj = self
            .wait_creates(mark, CRONJOB_USER, &ns, each, deadline)
            .await?;
        // Time for the last runs' completions to be recorded.
        tokio::time::sleep(Duration::from_secs(20)).await;
        let to = Timestamp::now();
        let reqs = self.audit.since(mark)?;
        let minutes = to.duration_since(from).as_secs_f64() / 60.0;
        let mut out = serde_json::Map::new();
        // The controller's requests are those of both SingletonJobs: per run of either, and per
        // minute per object, as CronJob's for its one object.
        let sides = [
            (
                SJ,
                SJ,
                SINGLETON_USER,
                &sj,
                PREPARE_LEAD,
                sj.len() + sj0.len(),
                2.0,
            ),
            (SJ0, SJ, SINGLETON_USER, &sj0, 0, 0, 0.0),
            (CJ, CJ, CRONJOB_USER, &cj, 0, cj.len(), 1.0),
        ];
        for (key, kind, user, jobs, lead, runs, objects) in sides {
            let skews = skews(jobs, kind);
            let mut side = json!({"skew": stats::summary(&skews)});
            if kind == SJ {
                side["prepare_lead_seconds"] = json!(lead);
            }
            if runs > 0 {
                let count = audit::count(&reqs, user, from, to) as f64;
                side["objects"] = json!(objects);
                side["requests_per_minute"] = json!(count / minutes / objects);
                side["requests_per_run"] = json!(count / runs as f64);
                side["requests"] = json!(audit::breakdown(&reqs, user, from, to));
            }
            out.insert(key.into(), side);
            self.series.push(("idle".into(), key, skews));
        }
        self.res.insert("idle".into(), Value::Object(out));
        ctl.stop().await?;
        self.cleanup(&ns).await
    }

    /// A SingletonJob every second (CronJob has no seconds field).
    async fn seconds(&mut self) -> anyhow::Result<()> {
        let ns = self.namespace("secs").await?;
        // A window under a second is never prepared: the lead changes nothing here.
        let ctl = self.single_controller("seconds", PREPARE_LEAD).await?;
        let mark = self.audit.mark();
        Api::<SingletonJob>::namespaced(self.client.clone(), &ns)
            .create(
                &PostParams::default(),
                &singleton_job("secs", "* * * * * *", "Allow")?,
            )
            .await?;
        tokio::time::sleep(Duration::from_secs(self.sizes.seconds_window + 2)).await;
        ctl.stop().await?;
        let jobs = self
            .wait_creates(mark, SINGLETON_USER, &ns, usize::MAX, Timestamp::now())
            .await?;
        // The first run comes at the first whole second after the object exists.
        let skews = skews(&jobs, SJ);
        self.res
            .insert("seconds".into(), json!({"skew": stats::summary(&skews)}));
        self.series.push(("every second".into(), SJ, skews));
        self.cleanup(&ns).await
    }

    /// Three replicas with client-go's default lease timings (15 s lease, 10 s renew deadline,
    /// 2 s retry); the leader is killed (SIGKILL) or stopped (SIGTERM), and the time from the
    /// signal to the next Job of an every-second SingletonJob is measured.
    async fn failover(&mut self) -> anyhow::Result<()> {
        let ns = self.namespace("failover").await?;
        let mut replicas = self.failover_replicas(&ns).await?;
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &ns);
        let mut out = serde_json::Map::new();
        for sig in ["KILL", "TERM"] {
            let mut gaps = Vec::new();
            let mut lates = Vec::new();
            for _ in 0..self.sizes.failover_rounds {
                let (i, gap) = self
                    .failover_round(&ns, &leases, &mut replicas, sig)
                    .await?;
                gaps.push(gap.map(|g| g.0));
                lates.push(gap.map(|g| g.1));
                replicas[i] =
                    self.spawn_controller(&format!("failover-r{i}-again"), &failover_args(&ns, i))?;
            }
            out.insert(
                format!("SIG{sig}"),
                json!({"seconds_to_next_run": gaps, "first_period_late_by_seconds": lates}),
            );
        }
        out.insert(
            "lease".into(),
            json!({"duration_s": 15, "renew_deadline_s": 10, "retry_period_s": 2}),
        );
        self.res.insert("failover".into(), Value::Object(out));
        for r in replicas {
            r.stop().await?;
        }
        self.cleanup(&ns).await
    }

    /// The three replicas in `ns`, once they run an every-second SingletonJob (at most 60 s).
    async fn failover_replicas(&self, ns: &str) -> anyhow::Result<Vec<Controller>> {
        let mut replicas = Vec::new();
        for i in 0..3 {
            replicas.push(self.spawn_controller(&format!("failover-r{i}"), &failover_args(ns, i))?);
        }
        let mark = self.audit.mark();
        Api::<SingletonJob>::namespaced(self.client.clone(), ns)
            .create(
                &PostParams::default(),
                &singleton_job("fo", "* * * * * *", "Allow")?,
            )
            .await?;
        let first = self
            .wait_creates(
                mark,
                SINGLETON_USER,
                ns,
                1,
                Timestamp::now() + SignedDuration::from_secs(60),
            )
            .await?;
        if first.is_empty() {
            bail!("failover: no run within 60 s of three replicas starting");
        }
        Ok(replicas)
    }

    /// One failover: the leader sent SIG`sig`, and waited for. Returns its slot (to restart it)
    /// and (signal → next run, late by) in seconds, None if no run came within 60 s.
    async fn failover_round(
        &self,
        ns: &str,
        leases: &Api<Lease>,
        replicas: &mut [Controller],
        sig: &str,
    ) -> anyhow::Result<(usize, Option<(f64, f64)>)> {
        // Runs going on for a few seconds; then find the leader.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let holder = leases
            .get("bench")
            .await?
            .spec
            .and_then(|s| s.holder_identity)
            .unwrap_or_default();
        let Some(i) = (0..3).find(|i| holder.starts_with(&format!("r{i}-"))) else {
            bail!("failover: lease holder {holder:?} is none of the replicas");
        };
        let mark = self.audit.mark();
        let t0 = Timestamp::now();
        replicas[i].signal(sig).await?;
        let gap = self.next_run_after(ns, mark, t0).await?;
        let _ = replicas[i].child.wait().await;
        eprintln!("bench:   SIG{sig} of r{i}: (signal → next run, late by) {gap:?} s");
        Ok((i, gap))
    }

    /// Polls the audit log from `mark` for the first run after the signal at `t0`: (signal →
    /// that run, how late it was), in seconds; None if it did not come within 60 s.
    async fn next_run_after(
        &self,
        ns: &str,
        mark: u64,
        t0: Timestamp,
    ) -> anyhow::Result<Option<(f64, f64)>> {
        // The first run of a period after the signal: the old leader's gate closed at
        // the signal, so it is the new leader's (a create already in flight at the signal
        // is for an earlier period).
        let deadline = t0 + SignedDuration::from_secs(60);
        // Without a failover, the first period after the signal would have started at
        // its instant: how late it (or, if it was skipped, the next) started instead.
        let first_due = Timestamp::from_second(t0.as_second() + 1)?;
        loop {
            let reqs = self.audit.since(mark)?;
            let first = audit::job_starts(&reqs, SINGLETON_USER, ns)
                .filter(|(name, _)| scheduled(name, SJ).is_some_and(|s| s > t0))
                .map(|(_, at)| at)
                .min();
            if let Some(at) = first {
                return Ok(Some((
                    at.duration_since(t0).as_secs_f64(),
                    at.duration_since(first_due).as_secs_f64(),
                )));
            }
            if Timestamp::now() > deadline {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `footprint` objects none of which falls due (a yearly schedule): resident memory once
    /// settled, and requests per minute at rest.
    async fn footprint(&mut self, kind: &'static str) -> anyhow::Result<()> {
        let n = self.sizes.footprint;
        let tag = format!("scale-{}", if kind == SJ { "sj" } else { "cj" });
        let ns = self.namespace(&tag).await?;
        let names: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
        let yearly = "0 0 1 1 *";
        if kind == SJ {
            let objs = names
                .iter()
                .map(|nm| singleton_job(nm, yearly, "Forbid"))
                .collect::<anyhow::Result<Vec<_>>>()?;
            create_all(&Api::namespaced(self.client.clone(), &ns), objs, 32).await?;
        } else {
            let objs = names
                .iter()
                .map(|nm| cron_job(nm, yearly, "Forbid"))
                .collect::<anyhow::Result<Vec<_>>>()?;
            create_all(&Api::namespaced(self.client.clone(), &ns), objs, 32).await?;
        }
        // The controller starts with the objects in place (a restart at scale); the KCM has
        // watched them arrive.
        let (ctl, pid, user) = self.actor(kind, &tag, PREPARE_LEAD).await?;
        let t0 = std::time::Instant::now();
        procs::settle(pid, Duration::from_secs(300)).await;
        let settle_s = t0.elapsed().as_secs_f64();
        let mark = self.audit.mark();
        let from = Timestamp::now();
        let cpu0 = procs::cpu_secs(pid);
        tokio::time::sleep(Duration::from_secs(self.sizes.rest_window)).await;
        let to = Timestamp::now();
        let cpu = procs::cpu_secs(pid) - cpu0;
        let rss = procs::rss_kib(pid);
        let reqs = self.audit.since(mark)?;
        let minutes = to.duration_since(from).as_secs_f64() / 60.0;
        self.res
            .entry("footprint".to_string())
            .or_insert_with(|| json!({"n": n}))
            .as_object_mut()
            .context("footprint entry")?
            .insert(
                kind.into(),
                json!({
                    "rss_kib": rss,
                    "settle_seconds": settle_s,
                    "cpu_percent_at_rest": cpu / to.duration_since(from).as_secs_f64() * 100.0,
                    "requests_per_minute_at_rest": audit::count(&reqs, user, from, to) as f64 / minutes,
                    "requests_at_rest": audit::breakdown(&reqs, user, from, to),
                }),
            );
        eprintln!("bench:   {kind}: {n} objects, RSS {} MiB", rss / 1024);
        if let Some(c) = ctl {
            c.stop().await?;
        }
        self.cleanup(&ns).await
    }
}

/// The arguments of failover replica `i`: all three elect a leader with the Lease `bench` in
/// `ns`.
fn failover_args(ns: &str, i: usize) -> Vec<String> {
    vec![
        format!("--lease-namespace={ns}"),
        "--lease-name=bench".into(),
        format!("--instance=r{i}"),
        format!("--health-addr=127.0.0.1:{}", 62090 + i),
        "--metrics-addr=127.0.0.1:0".into(),
        "--metrics-auth=none".into(),
    ]
}

/// A Job of the idle workload's SingletonJob without preparation (`idle0-<unix seconds>`).
fn is_idle0(job: &str) -> bool {
    job.starts_with("idle0-")
}

fn skews(jobs: &[(String, Timestamp)], kind: &str) -> Vec<f64> {
    jobs.iter()
        .filter_map(|(name, at)| scheduled(name, kind).map(|s| ms(at.duration_since(s))))
        .collect()
}
