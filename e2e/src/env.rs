//! [`Env`], one test's world: its namespace and client, the controller processes it starts,
//! waiting with a deadline, and the dump of what it last saw when a test fails.

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Namespace};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use singleton::api::SingletonJob;
use tokio::process::{Child, Command};

use crate::commands::{kubectl, repo_root};
use crate::http::{health_addr_in, http_get, metrics_addr_in};
use crate::service_account;

/// The Events' reportingComponent of every singleton-controller (the binary's reporter name).
const REPORTER: &str = "singleton-controller";

/// One test's world: a namespace, a client, and controller processes.
pub struct Env {
    pub client: Client,
    pub ns: String,
    controllers: Vec<Controller>,
    log_dir: PathBuf,
    /// The cluster's kubeconfig when not the default one (a second control plane,
    /// [`crate::multicluster`]); its controllers get it as `KUBECONFIG`.
    kubeconfig: Option<PathBuf>,
}

/// A controller process started by a test.
pub struct Controller {
    pub child: Child,
    pub log: PathBuf,
}

/// Leader-election flags for tests: lease 4 s, renew deadline 3 s, retry 0.5 s, so failovers
/// resolve in seconds. Callers add `--lease-name` (and any other flags).
pub const FAST_ELECTION: &[&str] = &[
    "--leader-elect",
    "--lease-duration-seconds",
    "4",
    "--renew-deadline-seconds",
    "3",
    "--retry-period-seconds",
    "0.5",
];

/// Leader-election flags for tests whose subject is what a leader does, not how fast a failover
/// is, and that need the leader they chose to keep its Lease while the whole suite loads the 2
/// cores: lease 10 s, renew deadline 8 s, retry 0.5 s. With [`FAST_ELECTION`]'s 3 s deadline a
/// leader lost its Lease 4 s after taking it in 3 of tests/prepared.rs's rows and in
/// tests/upgrade.rs (CI, 2026-12-07). A killed leader's successor takes over about 10 s later.
pub const STEADY_ELECTION: &[&str] = &[
    "--leader-elect",
    "--lease-duration-seconds",
    "10",
    "--renew-deadline-seconds",
    "8",
    "--retry-period-seconds",
    "0.5",
];

/// Environment that makes a process's wall clock run `offset` (e.g. "+40s") off, by preloading
/// Debian's libfaketime (installed by `make up`). Monotonic time stays real, as with a skewed
/// NTP-less clock.
pub fn skewed_clock(offset: &str) -> Result<Vec<(String, String)>> {
    let lib = std::fs::read_dir("/usr/lib")?
        .filter_map(|d| d.ok())
        .map(|d| d.path().join("faketime/libfaketime.so.1"))
        .find(|p| p.exists())
        .context("libfaketime not found: install Debian's faketime package (make up does)")?;
    Ok(vec![
        ("LD_PRELOAD".into(), lib.display().to_string()),
        ("FAKETIME".into(), offset.into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ])
}

/// How far off the wall clock of a process started with `vars` runs, in seconds: `date`'s time
/// under them minus this process's (the midpoint of the call). Evidence that a skew applies
/// (libfaketime preloaded and honoured), for a skew too small to see in a log's timestamps.
pub fn clock_offset_under(vars: &[(String, String)]) -> Result<f64> {
    let before = jiff::Timestamp::now();
    let out = std::process::Command::new("date")
        .arg("+%s.%N")
        .envs(vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()?;
    let after = jiff::Timestamp::now();
    let seen: f64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .with_context(|| format!("date under {vars:?} printed {:?}", out.stdout))?;
    let mid = (before.as_nanosecond() + after.as_nanosecond()) as f64 / 2e9;
    Ok(seen - mid)
}

/// The controller binary: `SINGLETON_CONTROLLER_BIN`, or the workspace's debug build.
pub fn controller_bin() -> PathBuf {
    std::env::var_os("SINGLETON_CONTROLLER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/debug/singleton-controller"))
}

impl Env {
    /// Creates a fresh namespace `e2e-<name>-<random>` labelled for cleanup.
    pub async fn new(name: &str) -> Result<Env> {
        let client = Client::try_default().await.context(
            "no cluster: run `make up` and `eval \"$(make -s env)\"`, or use `make test`",
        )?;
        Self::with_client(name, client, None).await
    }

    /// Like [`Env::new`], in the cluster of `kubeconfig` (a second control plane) and in a
    /// namespace named `ns` (the first cluster's Env's): the same namespace in two clusters is
    /// one owner of a backstop job key (issue 34, N4), as in docs/multi-cluster.md's set-up. The
    /// namespace, the client and the controllers this Env starts are all in that cluster.
    pub async fn new_in_namespace(ns: &str, kubeconfig: &std::path::Path) -> Result<Env> {
        let client = service_account::client_from_kubeconfig(kubeconfig).await?;
        // The other Env's logs are under the namespace's name: these under the cluster's too.
        let cluster = kubeconfig
            .parent()
            .and_then(|d| d.file_name())
            .map(|d| d.to_string_lossy().into_owned())
            .unwrap_or_else(|| "second".into());
        let logs = format!("{ns}@{cluster}");
        Self::in_namespace(
            ns.to_string(),
            &logs,
            client,
            Some(kubeconfig.to_path_buf()),
        )
        .await
    }

    async fn with_client(name: &str, client: Client, kubeconfig: Option<PathBuf>) -> Result<Env> {
        let suffix = format!("{:06x}", rand_u32() & 0xffffff);
        let ns = format!("e2e-{name}-{suffix}");
        Self::in_namespace(ns.clone(), &ns, client, kubeconfig).await
    }

    /// Creates namespace `ns`; the Env's logs go to `.cache/e2e-logs/<logs>`.
    async fn in_namespace(
        ns: String,
        logs: &str,
        client: Client,
        kubeconfig: Option<PathBuf>,
    ) -> Result<Env> {
        let nss: Api<Namespace> = Api::all(client.clone());
        let obj = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.clone()),
                labels: Some([("singleton.dev/e2e".to_string(), "true".to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        nss.create(&PostParams::default(), &obj).await?;
        let log_dir = repo_root().join(".cache/e2e-logs").join(logs);
        std::fs::create_dir_all(&log_dir)?;
        Ok(Env {
            client,
            ns,
            controllers: Vec::new(),
            log_dir,
            kubeconfig,
        })
    }

    /// Where this test's controller logs (and other files) go: `.cache/e2e-logs/<namespace>`.
    pub fn log_dir(&self) -> &std::path::Path {
        &self.log_dir
    }

    // ---- The test's objects ----

    /// The SingletonJobs of this namespace.
    pub fn sjs(&self) -> Api<SingletonJob> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// The Jobs of this namespace.
    pub fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// The Events of this namespace.
    pub fn events(&self) -> Api<Event> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// The SingletonJob as the API server has it now.
    pub async fn get_sj(&self, name: &str) -> Result<SingletonJob> {
        Ok(self.sjs().get(name).await?)
    }

    /// Applies a SingletonJob from YAML text (`metadata.namespace` is set to this test's).
    pub async fn create_sj(&self, yaml: &str) -> Result<SingletonJob> {
        let mut sj: SingletonJob = serde_yaml::from_str(yaml)?;
        sj.metadata.namespace = Some(self.ns.clone());
        Ok(self.sjs().create(&PostParams::default(), &sj).await?)
    }

    /// [`Env::create_sj`] with the label [`RUN_LABEL`]`=run`, which puts it in the view of a
    /// controller started with `--label-selector` [`RUN_LABEL`]`=run` (one that watches all
    /// namespaces but must not act on other tests' objects).
    pub async fn create_sj_labelled(&self, run: &str, yaml: &str) -> Result<SingletonJob> {
        let mut sj: SingletonJob = serde_yaml::from_str(yaml)?;
        sj.metadata.namespace = Some(self.ns.clone());
        sj.metadata.labels = Some([(RUN_LABEL.to_string(), run.to_string())].into());
        Ok(self.sjs().create(&PostParams::default(), &sj).await?)
    }

    /// Jobs of this namespace, sorted by name.
    pub async fn job_list(&self) -> Result<Vec<Job>> {
        let mut jobs = self.jobs().list(&ListParams::default()).await?.items;
        jobs.sort_by_key(|j| j.name_any());
        Ok(jobs)
    }

    // ---- Controller processes: start, stop, signal, observe ----

    /// Starts a controller process watching only this namespace; returns its index.
    pub async fn start_controller(&mut self, extra: &[&str]) -> Result<usize> {
        self.start_controller_with_env(&[], extra).await
    }

    /// Like [`Env::start_controller`], with extra environment (e.g. [`skewed_clock`]). The
    /// controller is always the direct child, so signals reach it and not a wrapper.
    pub async fn start_controller_with_env(
        &mut self,
        envs: &[(String, String)],
        extra: &[&str],
    ) -> Result<usize> {
        self.start_controller_bin(&controller_bin(), envs, extra)
            .await
    }

    /// Like [`Env::start_controller_with_env`], with another build of the controller (a
    /// previous release's, tests/upgrade.rs), which must take the same flags.
    pub async fn start_controller_bin(
        &mut self,
        bin: &Path,
        envs: &[(String, String)],
        extra: &[&str],
    ) -> Result<usize> {
        let idx = self.controllers.len();
        let log = self.log_dir.join(format!("controller-{idx}.log"));
        let file = std::fs::File::create(&log)?;
        let mut cmd = Command::new(bin);
        if let Some(kc) = &self.kubeconfig {
            cmd.env("KUBECONFIG", kc);
        }
        cmd.envs(envs.iter().map(|(k, v)| (k, v)));
        let child = cmd
            .arg("--namespace")
            .arg(&self.ns)
            .arg("--instance")
            .arg(format!("e2e-{idx}"))
            // Defaults for every test; flags in `extra` win. Probes and metrics on free ports, so
            // parallel tests never collide; metrics in plain HTTP on loopback unless a test passes
            // `--metrics-auth=kubernetes` (tests/chart.rs). Single-replica mode unless a test
            // passes `--leader-elect` (tests/election.rs); then a short lease, so failover takes
            // seconds.
            .env("SINGLETON_HEALTH_ADDR", "127.0.0.1:0")
            .env("SINGLETON_METRICS_ADDR", "127.0.0.1:0")
            .env("SINGLETON_METRICS_AUTH", "none")
            .env("SINGLETON_LEADER_ELECT", "false")
            .env("SINGLETON_LEASE_DURATION_SECONDS", "4")
            .env("SINGLETON_RENEW_DEADLINE_SECONDS", "3")
            .env("SINGLETON_RETRY_PERIOD_SECONDS", "0.5")
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info,singleton=debug".into()),
            )
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "starting {} (build it with `cargo build -p singleton-controller`)",
                    bin.display()
                )
            })?;
        self.controllers.push(Controller { child, log });
        Ok(idx)
    }

    /// The controller (`--instance e2e-<idx>`) that holds the Lease `lease` of the namespace.
    pub async fn lease_holder(&self, lease: &str) -> Result<Option<usize>> {
        let api: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.client.clone(), &self.ns);
        Ok(api
            .get_opt(lease)
            .await?
            .and_then(|l| l.spec?.holder_identity)
            .and_then(|h| h.strip_prefix("e2e-")?.split('-').next()?.parse().ok()))
    }

    /// Stops a controller: SIGKILL (a crash) when `kill`, else SIGTERM and wait.
    pub async fn stop_controller(&mut self, idx: usize, kill: bool) -> Result<()> {
        let c = &mut self.controllers[idx];
        if kill {
            c.child.kill().await?;
        } else if let Some(pid) = c.child.id() {
            Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .await?;
            tokio::time::timeout(Duration::from_secs(20), c.child.wait()).await??;
        }
        Ok(())
    }

    /// The OS process id of controller `idx`, while it runs.
    pub fn controller_pid(&self, idx: usize) -> Option<u32> {
        self.controllers[idx].child.id()
    }

    /// Sends a signal (`"STOP"`, `"CONT"`, `"TERM"`, `"KILL"`) to controller `idx`.
    pub async fn signal_controller(&self, idx: usize, signal: &str) -> Result<()> {
        let pid = self
            .controller_pid(idx)
            .with_context(|| format!("controller {idx} is not running"))?;
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .await?;
        if !status.success() {
            bail!("kill -{signal} {pid} failed: {status}");
        }
        Ok(())
    }

    /// The exit status of controller `idx` if it has exited (never blocks).
    pub fn controller_exit(&mut self, idx: usize) -> Result<Option<std::process::ExitStatus>> {
        Ok(self.controllers[idx].child.try_wait()?)
    }

    /// The state letter of controller `idx` in /proc (`T`: stopped, e.g. at a failpoint; `Z`:
    /// exited, not yet reaped), None when no such process exists.
    pub fn controller_state(&self, idx: usize) -> Option<char> {
        let pid = self.controller_pid(idx)?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The state follows the command name, which is in parentheses.
        stat.rsplit_once(')')?.1.trim_start().chars().next()
    }

    /// Whether controller `idx` is stopped (SIGSTOP).
    pub fn controller_stopped(&self, idx: usize) -> bool {
        self.controller_state(idx) == Some('T')
    }

    /// Whether controller `idx` has exited (crashed or ended).
    pub fn controller_exited(&self, idx: usize) -> bool {
        matches!(self.controller_state(idx), None | Some('Z') | Some('X'))
    }

    /// Everything controller `idx` has logged so far.
    pub fn controller_log(&self, idx: usize) -> String {
        std::fs::read_to_string(&self.controllers[idx].log).unwrap_or_default()
    }

    /// Where controller `idx` serves `/healthz` and `/readyz`: the address it logs ("health
    /// server listening", field `addr`), in the human or the JSON format. Waits up to 20 s for the
    /// line.
    pub async fn health_addr(&self, idx: usize) -> Result<std::net::SocketAddr> {
        self.wait_for(
            "the health server address in the controller log",
            Duration::from_secs(20),
            || async { Ok(health_addr_in(&self.controller_log(idx))) },
        )
        .await
    }

    /// Where controller `idx` serves `/metrics` ("metrics server listening"). Waits up to 20 s.
    pub async fn metrics_addr(&self, idx: usize) -> Result<std::net::SocketAddr> {
        self.wait_for(
            "the metrics server address in the controller log",
            Duration::from_secs(20),
            || async { Ok(metrics_addr_in(&self.controller_log(idx))) },
        )
        .await
    }

    /// The OpenMetrics text of controller `idx`'s `/metrics` in the harness's default mode (plain
    /// HTTP, `--metrics-auth=none`); fails on a status other than 200.
    pub async fn metrics(&self, idx: usize) -> Result<String> {
        let addr = self.metrics_addr(idx).await?;
        let resp = http_get(addr, "/metrics").await?;
        if resp.status != 200 {
            bail!("GET /metrics on {addr}: {} {}", resp.status, resp.body);
        }
        Ok(resp.body)
    }

    // ---- Waiting with a deadline, and what a failure shows ----

    /// Polls `check` every 200 ms until it returns Some, or fails after `timeout` with a dump of
    /// what the cluster and the controllers last showed.
    pub async fn wait_for<T, F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>>>,
    {
        let start = Instant::now();
        let mut last_err = None;
        loop {
            match check().await {
                Ok(Some(v)) => return Ok(v),
                Ok(None) => {}
                Err(e) => last_err = Some(e),
            }
            if start.elapsed() > timeout {
                self.no_foreign_controller().await?;
                let dump = self.dump().await;
                // The reason again after the dump: a CI log keeps only its last lines.
                bail!(
                    "timed out after {timeout:?} waiting for {what} (last error: {last_err:?})\n{dump}\n(that was: timed out after {timeout:?} waiting for {what})"
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Polls `check` every 200 ms through `window`, failing at its first `false` with a dump of
    /// what the cluster and the controllers showed: for what must not happen, observed over a
    /// bounded window rather than looked at once after a sleep.
    pub async fn holds_for<F, Fut>(&self, what: &str, window: Duration, mut check: F) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool>>,
    {
        let start = Instant::now();
        loop {
            if !check().await? {
                self.no_foreign_controller().await?;
                let dump = self.dump().await;
                bail!("{what}: no longer true after {:?}\n{dump}", start.elapsed());
            }
            if start.elapsed() >= window {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The Job `name`, once it exists (up to 30 s): an operation (trigger, rerun) is recorded
    /// Done with its claim, in one status write, and its Job follows on the claim's steps
    /// (after an active run's foreground deletion under `rerun --replace`), which on a loaded
    /// machine is not at once.
    pub async fn wait_job(&self, name: &str) -> Result<Job> {
        let what = format!("the Job {name}");
        self.wait_for(&what, Duration::from_secs(30), || async {
            Ok(self.jobs().get_opt(name).await?)
        })
        .await
    }

    /// Waits up to 30 s until the Job `name` no longer exists (`what` says which Job, for the
    /// failure's message).
    pub async fn wait_job_gone(&self, what: &str, name: &str) -> Result<()> {
        let what = format!("{what} ({name}) to be gone");
        self.wait_for(&what, Duration::from_secs(30), || async {
            Ok(self.jobs().get_opt(name).await?.is_none().then_some(()))
        })
        .await
    }

    /// Fails, naming it, when a singleton-controller that this test did not start has published
    /// Events in its namespace, e.g. a `make demo` controller or a `make run` left watching every
    /// namespace. Such a controller serves the test's "controller down" or "wrong clock" scenarios
    /// behind its back, and the test would otherwise fail on a timing assertion that says nothing
    /// about why. Called before a failure is reported ([`Env::wait_for`], [`ensure`]).
    pub async fn no_foreign_controller(&self) -> Result<()> {
        let mine: Vec<String> = (0..self.controllers.len())
            .map(|i| format!("e2e-{i}"))
            .collect();
        let Ok(events) = self.events().list(&ListParams::default()).await else {
            return Ok(());
        };
        // Each foreign instance once, with the first thing it did.
        let mut foreign = std::collections::BTreeMap::new();
        for e in &events.items {
            let instance = e.reporting_instance.as_deref().unwrap_or("");
            if e.reporting_component.as_deref() == Some(REPORTER)
                && !mine.iter().any(|m| m == instance)
            {
                foreign.entry(instance.to_string()).or_insert_with(|| {
                    format!(
                        "{} on {}",
                        e.reason.as_deref().unwrap_or(""),
                        e.involved_object.name.as_deref().unwrap_or("")
                    )
                });
            }
        }
        let foreign: Vec<String> = foreign
            .into_iter()
            .map(|(instance, first)| format!("instance {instance:?} ({first})"))
            .collect();
        if foreign.is_empty() {
            return Ok(());
        }
        bail!(
            "another singleton-controller is acting on this test's namespace {}: {}. This test \
             needs its own controllers only (instances e2e-0..). Stop the other one (`make \
             demo-stop` for the demo's, or a `make run` left running), or have it watch only \
             its own namespace (--namespace).",
            self.ns,
            foreign.join(", ")
        )
    }

    /// What a human would look at when a test fails.
    pub async fn dump(&self) -> String {
        let mut out = format!("==== namespace {} ====\n", self.ns);
        if let Ok(list) = self.sjs().list(&ListParams::default()).await {
            for sj in list {
                out += &format!(
                    "---- SingletonJob {}\n{}\n",
                    sj.name_any(),
                    serde_yaml::to_string(&sj.status).unwrap_or_default()
                );
            }
        }
        if let Ok(jobs) = self.job_list().await {
            out += "---- Jobs\n";
            for j in jobs {
                let st = j.status.as_ref();
                out += &format!(
                    "{} token={:?} active={:?} succeeded={:?} failed={:?}\n",
                    j.name_any(),
                    j.annotations().get("singleton.dev/fencing-token"),
                    st.and_then(|s| s.active),
                    st.and_then(|s| s.succeeded),
                    st.and_then(|s| s.failed)
                );
            }
        }
        if let Ok(evs) = self.events().list(&ListParams::default()).await {
            out += "---- Events\n";
            for e in evs.items.iter().rev().take(30) {
                out += &format!(
                    "{} {} {}: {}\n",
                    e.type_.clone().unwrap_or_default(),
                    e.involved_object.name.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                    e.message.clone().unwrap_or_default()
                );
            }
        }
        for c in &self.controllers {
            let text = std::fs::read_to_string(&c.log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            out += &format!("---- {} (last 40 lines)\n", c.log.display());
            for l in tail.into_iter().rev() {
                out += l;
                out.push('\n');
            }
        }
        out
    }

    // ---- Acting as a ServiceAccount ----

    /// Writes a kubeconfig that authenticates as the ServiceAccount `namespace/name` with a
    /// token from the TokenRequest API (`kubectl create token`, one hour), against the server
    /// and CA of the current kubeconfig; returns its path (mode 0600, in [`Env::log_dir`]).
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> Result<PathBuf> {
        service_account::write_kubeconfig(&self.log_dir, namespace, name)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Controllers die with their handles (kill_on_drop); the namespace is deleted in the
        // background so a failed test still cleans up.
        for c in &mut self.controllers {
            let _ = c.child.start_kill();
        }
        let client = self.client.clone();
        let ns = self.ns.clone();
        let handle = tokio::runtime::Handle::try_current();
        if let Ok(h) = handle {
            h.spawn(async move {
                let nss: Api<Namespace> = Api::all(client);
                let _ = nss.delete(&ns, &DeleteParams::background()).await;
            });
        }
        // The spawned task may not finish if the runtime is shutting down: `make e2e` also deletes
        // every namespace labelled singleton.dev/e2e=true at the end.
        let mut delete = kubectl();
        if let Some(kc) = &self.kubeconfig {
            delete.arg("--kubeconfig").arg(kc);
        }
        let _ = delete
            .args([
                "delete",
                "namespace",
                &self.ns,
                "--wait=false",
                "--ignore-not-found",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Enough randomness for a namespace suffix that parallel tests do not share (the clock's
/// nanoseconds and the process id, mixed), without a crate for it.
fn rand_u32() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (t.subsec_nanos() ^ std::process::id().rotate_left(16)).wrapping_mul(2_654_435_761)
}

/// The label that puts a SingletonJob in the view of one test's all-namespace controller
/// ([`Env::create_sj_labelled`]).
pub const RUN_LABEL: &str = "singleton.dev/e2e-run";

/// Asserts with the cluster dump on failure.
pub async fn ensure(env: &Env, ok: bool, what: impl Debug) -> Result<()> {
    if !ok {
        env.no_foreign_controller().await?;
        bail!("assertion failed: {what:?}\n{}", env.dump().await);
    }
    Ok(())
}

/// The Events of the test namespace with `reason`, oldest first.
pub async fn events_with_reason(env: &Env, reason: &str) -> Result<Vec<Event>> {
    let mut evs: Vec<Event> = env
        .events()
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect();
    evs.sort_by_key(|e| e.metadata.creation_timestamp.clone());
    Ok(evs)
}
