//! The real node's side of the e2e tests (hack/node.sh: kubelet, containerd, runc):
//! the chart installed with the locally built images (`make image`) on the real node, the billing
//! workload's SingletonJob, and what the tests and the chaos suite's real-pod scenarios do to the
//! pods there (the cgroup freezer, the Lease, the Jobs' containers).

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};

use crate::{Env, database_port, helm, kubectl, pg, run_ok, token_of};

/// The real node `make up` starts (hack/node.sh up): labelled `singleton.dev/node=real`, tainted
/// `singleton.dev/node=real:NoSchedule`.
pub const NODE: &str = "singleton-node";
/// The second real node, started on demand by [`second_node_up`] (hack/node.sh up-second):
/// labelled `singleton.dev/node=real-2`, tainted like [`NODE`]. A pod that tolerates the key
/// `singleton.dev/node` and selects neither label (or has an affinity to both) lands on either.
pub const NODE_2: &str = "singleton-node-2";
/// The pod bridge's gateway (hack/node.sh): PostgreSQL is reached there from pods.
pub const GATEWAY: &str = "10.244.0.1";
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The real node is there and Ready, or a clear failure.
pub async fn real_node_ready(env: &Env) -> Result<()> {
    let node = Api::<Node>::all(env.client.clone())
        .get_opt(NODE)
        .await?
        .with_context(|| {
            format!(
                "node {NODE} does not exist: this test needs the real node (make up without \
                 SINGLETON_REAL_NODE=0; hack/node.sh up)"
            )
        })?;
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    anyhow::ensure!(ready, "node {NODE} is not Ready (hack/node.sh status)");
    Ok(())
}

pub fn restricted(ns: &str) -> Result<()> {
    run_ok(
        kubectl()
            .args(["label", "namespace", ns, "--overwrite"])
            .args([
                "pod-security.kubernetes.io/enforce=restricted",
                "pod-security.kubernetes.io/enforce-version=latest",
            ]),
    )?;
    Ok(())
}

/// A database of this test's own, with the billing example's tables.
pub async fn billing_database(name: &str) -> Result<String> {
    let admin = pg().await?;
    // Two statements: CREATE DATABASE refuses to run in the implicit transaction of a batch.
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name}"))
        .await?;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await?;
    let host_url = format!(
        "postgres://postgres@127.0.0.1:{}/{name}?sslmode=disable",
        database_port()?
    );
    let (client, conn) = tokio_postgres::connect(&host_url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    client
        .batch_execute(&std::fs::read_to_string(crate::repo_file(
            "examples/billing/schema.sql",
        ))?)
        .await?;
    Ok(host_url)
}

/// The SingletonJob `invoices` on `schedule`: the billing workload's image on the real node, as a
/// pod the restricted standard admits.
pub fn billing_sj(schedule: &str, policy: &str, work_seconds: u32) -> String {
    billing_sj_on(schedule, policy, work_seconds, Placement::FirstNode)
}

/// Where the billing workload's pods go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The first real node only; a run is not retried (`backoffLimit: 0`).
    FirstNode,
    /// Either real node; a run whose pod failed (or was declared gone with its node) is
    /// retried twice, and a pod on a node that stops answering is evicted after 2 s: the
    /// attempts rows of the chaos suite (issue 31).
    EitherNode,
}

/// [`billing_sj`] with its pods placed as `placement` says.
pub fn billing_sj_on(
    schedule: &str,
    policy: &str,
    work_seconds: u32,
    placement: Placement,
) -> String {
    let (backoff, placement) = match placement {
        Placement::FirstNode => (
            0,
            "          nodeSelector: {singleton.dev/node: real}
          tolerations: [{key: singleton.dev/node, operator: Exists, effect: NoSchedule}]
",
        ),
        Placement::EitherNode => (
            2,
            "          affinity:
            nodeAffinity:
              requiredDuringSchedulingIgnoredDuringExecution:
                nodeSelectorTerms:
                - matchExpressions: [{key: singleton.dev/node, operator: In, values: [real, real-2]}]
          tolerations:
          - {key: singleton.dev/node, operator: Exists, effect: NoSchedule}
          - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
          - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
",
        ),
    };
    format!(
        r#"apiVersion: singleton.dev/v1alpha1
kind: SingletonJob
metadata:
  name: invoices
spec:
  schedule: "{schedule}"
  concurrencyPolicy: {policy}
  lock:
    purpose: Correctness
  backstop:
    postgres:
      secretRef: {{name: billing-db}}
      tablePrefix: singleton_
  jobTemplate:
    spec:
      backoffLimit: {backoff}
      template:
        spec:
          restartPolicy: Never
          terminationGracePeriodSeconds: 120
{placement}          securityContext:
            runAsNonRoot: true
            runAsUser: 65532
            seccompProfile: {{type: RuntimeDefault}}
          containers:
          - name: invoice-run
            image: localhost/singleton/billing-workload:{VERSION}
            imagePullPolicy: Never
            env:
            - name: DATABASE_URL
              valueFrom: {{secretKeyRef: {{name: billing-db, key: url}}}}
            - {{name: BILLING_WORK_SECONDS, value: "{work_seconds}"}}
            securityContext:
              allowPrivilegeEscalation: false
              readOnlyRootFilesystem: true
              capabilities: {{drop: [ALL]}}
"#
    )
}

/// Polls `check` every 500 ms until it returns Some, or fails after `timeout` with what the
/// cluster showed. (Not `Env::wait_for`: that one refuses a controller it did not start, and here
/// the chart's pods are the controllers.)
pub async fn wait<T, F, Fut>(
    what: &str,
    timeout: Duration,
    namespaces: &[&str],
    mut check: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let start = std::time::Instant::now();
    let mut last = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = Some(format!("{e:#}")),
        }
        if start.elapsed() > timeout {
            let mut dump = String::new();
            for ns in namespaces {
                for args in [
                    vec!["get", "all,leases,events", "-o", "wide", "-n", ns],
                    vec![
                        "logs",
                        "-n",
                        ns,
                        "--all-containers",
                        "--prefix",
                        "--tail=40",
                        "-l",
                        "app.kubernetes.io/name=singleton-controller",
                    ],
                ] {
                    let out = kubectl().args(&args).output();
                    if let Ok(o) = out {
                        dump.push_str(&String::from_utf8_lossy(&o.stdout));
                        dump.push_str(&String::from_utf8_lossy(&o.stderr));
                    }
                }
            }
            bail!("timed out after {timeout:?} waiting for {what} (last error: {last:?})\n{dump}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The (period, token) rows the workload committed.
pub async fn runs_written(host_url: &str) -> Result<Vec<(String, i64)>> {
    let (client, conn) = tokio_postgres::connect(host_url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let rows = client
        .query(
            "SELECT to_char(period AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), token \
             FROM invoice_runs ORDER BY period",
            &[],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// A completed Job of the SingletonJob other than `seen`, with its period and token.
pub async fn next_completed_job(work: &Env, seen: &[String]) -> Result<(String, String, u64)> {
    wait(
        "a run's Job to complete on the real node",
        Duration::from_secs(150),
        &[&work.ns],
        || async {
            for job in work.jobs().list(&ListParams::default()).await? {
                let name = job.name_any();
                if seen.contains(&name) {
                    continue;
                }
                let st = job.status.clone().unwrap_or_default();
                if st.failed.unwrap_or(0) > 0 {
                    bail!("Job {name} failed: {:?}", st.conditions);
                }
                if st.succeeded.unwrap_or(0) > 0 {
                    let period = period_of(&job).context("Job without a period annotation")?;
                    return Ok(Some((name, period, token_of(&job))));
                }
            }
            Ok(None)
        },
    )
    .await
}

pub fn period_of(job: &Job) -> Option<String> {
    let p: jiff::Timestamp = job
        .annotations()
        .get("singleton.dev/period")?
        .parse()
        .ok()?;
    Some(p.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// The controller pods of the release that are Ready, by name, with their IPs.
pub async fn ready_pods(env: &Env, release: &str) -> Result<Vec<(String, IpAddr)>> {
    let pods = Api::<Pod>::namespaced(env.client.clone(), &env.ns)
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={release}")))
        .await?;
    let mut out = Vec::new();
    for p in pods {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let st = p.status.clone().unwrap_or_default();
        let ready = st
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if let (true, Some(ip)) = (ready, st.pod_ip) {
            out.push((p.name_any(), ip.parse()?));
        }
    }
    Ok(out)
}

/// Waits until a pod other than `leader` holds the release's Lease; returns its identity.
pub async fn another_holder(
    env: &Env,
    release: &str,
    leader: &str,
    what: &str,
    timeout: Duration,
) -> Result<String> {
    wait(what, timeout, &[&env.ns], || async {
        Ok(lease_holder(env, release)
            .await?
            .filter(|h| !h.starts_with(&format!("{leader}-"))))
    })
    .await
}

pub async fn lease_holder(env: &Env, lease: &str) -> Result<Option<String>> {
    Ok(Api::<Lease>::namespaced(env.client.clone(), &env.ns)
        .get_opt(lease)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// What both tests start from: the release namespace and the namespace it serves (both enforcing
/// the restricted Pod Security Standard), a billing database of the test's own with its Secret,
/// and the chart installed with the local image on the real node.
pub struct Setup {
    pub env: Env,
    pub work: Env,
    pub release: String,
    pub full: String,
    pub host_url: String,
    pub _uninstall: Uninstall,
}

pub async fn setup(name: &str) -> Result<Setup> {
    let env = Env::new(name).await?;
    real_node_ready(&env).await?;
    let work = Env::new(&format!("{name}-w")).await?;
    restricted(&env.ns)?;
    restricted(&work.ns)?;
    let suffix = env.ns.rsplit('-').next().unwrap_or("x").to_string();
    let db = format!("e2e_real_{suffix}");
    let host_url = billing_database(&db).await?;
    create_billing_secret(&work, &db).await?;

    let release = format!("sc-{suffix}");
    let full = format!("{release}-singleton-controller");
    install_chart(&env, &work, &release)?;
    let _uninstall = scopeguard(release.clone(), env.ns.clone());

    Ok(Setup {
        env,
        work,
        release,
        full,
        host_url,
        _uninstall,
    })
}

/// The Secret `billing-db` in `work`'s namespace, labelled for the backstop, with the URL of
/// database `db` as pods reach it.
async fn create_billing_secret(work: &Env, db: &str) -> Result<()> {
    // The backstop and the workload reach PostgreSQL at the bridge's gateway.
    let pod_url = format!(
        "postgres://postgres@{GATEWAY}:{}/{db}?sslmode=disable",
        database_port()?
    );
    let mut secret = Secret::default();
    secret.metadata.name = Some("billing-db".into());
    secret.metadata.labels = Some([("singleton.dev/backstop".into(), "true".into())].into());
    secret.string_data = Some(
        [
            ("url".to_string(), pod_url.clone()),
            ("sslmode".to_string(), "disable".to_string()),
        ]
        .into(),
    );
    Api::<Secret>::namespaced(work.client.clone(), &work.ns)
        .create(&PostParams::default(), &secret)
        .await?;
    Ok(())
}

/// The chart, with the locally built image, on the real node only: `helm install --wait` of
/// `release` into `env`'s namespace, serving `work`'s.
fn install_chart(env: &Env, work: &Env, release: &str) -> Result<()> {
    let install = helm()
        .args(["install", release])
        .arg(crate::chart_dir())
        .args(["--namespace", &env.ns, "--wait", "--timeout", "180s"])
        .args(["--set", "crds.install=false"])
        .args([
            "--set",
            "image.repository=localhost/singleton/singleton-controller",
        ])
        .args(["--set", &format!("image.tag={VERSION}")])
        .args(["--set", "image.pullPolicy=Never"])
        .args(["--set", &format!("watchNamespaces={{{}}}", work.ns)])
        .args([
            "--set",
            &format!("controller.backstopAllowedHosts={{{GATEWAY}/32}}"),
        ])
        .args(["--set", "nodeSelector.singleton\\.dev/node=real"])
        .args(["--set", "tolerations[0].key=singleton.dev/node"])
        .args(["--set", "tolerations[0].operator=Exists"])
        .args(["--set", "tolerations[0].effect=NoSchedule"])
        .args(["--set", &format!("rbac.backstopNamespaces={{{}}}", work.ns)])
        .output()?;
    if !install.status.success() {
        let dump = release_pods_dump(env, release)?;
        bail!(
            "helm install on the real node failed (images missing? run `make image`):\n{}\n{}\n{dump}",
            String::from_utf8_lossy(&install.stdout),
            String::from_utf8_lossy(&install.stderr)
        );
    }
    Ok(())
}

/// What the pods of `release` in `env`'s namespace say, for a failed install: `kubectl describe`
/// and the tail of their logs.
fn release_pods_dump(env: &Env, release: &str) -> Result<String> {
    let mut dump = run_ok(kubectl().args(["describe", "pods", "-n", &env.ns]))
        .unwrap_or_else(|e| e.to_string());
    // A crash at start-up says why only in the log of the container that ended.
    let selector = format!("app.kubernetes.io/instance={release}");
    for previous in ["--previous=true", "--previous=false"] {
        let logs = kubectl()
            .args([
                "logs",
                "-n",
                &env.ns,
                "-l",
                &selector,
                "--tail=20",
                previous,
            ])
            .output()?;
        dump.push_str(&String::from_utf8_lossy(&logs.stdout));
    }
    Ok(dump)
}

/// `helm uninstall` when the test ends, passed or not (the namespaces go with their [`Env`]s).
pub struct Uninstall(pub String, pub String);
impl Drop for Uninstall {
    fn drop(&mut self) {
        let _ = helm()
            .args([
                "uninstall",
                &self.0,
                "--namespace",
                &self.1,
                "--ignore-not-found",
            ])
            .output();
    }
}
pub fn scopeguard(release: String, ns: String) -> Uninstall {
    Uninstall(release, ns)
}

/// The freezer cgroup (v1, this host's hierarchy) of a container on either real node.
pub fn freezer_of(container_id: &str) -> Result<std::path::PathBuf> {
    fn find(dir: &std::path::Path, name: &str) -> Option<std::path::PathBuf> {
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            let path = entry.path();
            if !path.is_dir() {
                continue;
            }
            if entry.file_name() == name {
                return Some(path);
            }
            if let Some(p) = find(&path, name) {
                return Some(p);
            }
        }
        None
    }
    // Each node's kubelet has its own cgroup root (hack/node.sh): /singleton-node, /singleton-node-2.
    let roots = [NODE, NODE_2].map(|n| std::path::Path::new("/sys/fs/cgroup/freezer").join(n));
    roots
        .iter()
        .find_map(|root| find(root, container_id))
        .with_context(|| format!("no freezer cgroup for container {container_id} under {roots:?}"))
}

/// Sets a freezer cgroup's state and waits until the kernel reports it.
pub async fn set_freezer(cgroup: &std::path::Path, state: &str) -> Result<()> {
    let file = cgroup.join("freezer.state");
    std::fs::write(&file, state).with_context(|| format!("writing {state} to {file:?}"))?;
    wait(
        &format!("{file:?} to be {state}"),
        Duration::from_secs(20),
        &[],
        || async {
            match std::fs::read_to_string(&file) {
                Ok(now) => Ok((now.trim() == state).then_some(())),
                // Thawed, its process may exit at once (a controller that finds its Lease lost
                // does), and the container's cgroup goes with it: thawed, then gone.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && state == "THAWED" => {
                    Ok(Some(()))
                }
                Err(e) => Err(e.into()),
            }
        },
    )
    .await
}

/// The Running pod of a Job, with its container's id.
pub async fn running_pod_of(work: &Env, job: &str) -> Result<(String, String)> {
    wait(
        &format!("Job {job}'s pod to run"),
        Duration::from_secs(90),
        &[&work.ns],
        || async {
            let pods = Api::<Pod>::namespaced(work.client.clone(), &work.ns)
                .list(&ListParams::default().labels(&format!("job-name={job}")))
                .await?;
            for p in pods {
                let st = p.status.clone().unwrap_or_default();
                let id = st
                    .container_statuses
                    .unwrap_or_default()
                    .iter()
                    .find(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                    .and_then(|c| c.container_id.clone());
                if let Some(id) = id {
                    let id = id.rsplit("://").next().unwrap_or_default().to_string();
                    return Ok(Some((p.name_any(), id)));
                }
            }
            Ok(None)
        },
    )
    .await
}

/// The leader pod of the release (the holder of its Lease) and its container's id.
pub async fn leader_container(env: &Env, release: &str) -> Result<(String, String)> {
    let holder = lease_holder(env, release)
        .await?
        .context("the Lease is not held")?;
    let pods = ready_pods(env, release).await?;
    let (leader, _) = pods
        .iter()
        .find(|(n, _)| holder.starts_with(&format!("{n}-")))
        .cloned()
        .with_context(|| format!("Lease holder {holder} is none of the pods {pods:?}"))?;
    let pod = Api::<Pod>::namespaced(env.client.clone(), &env.ns)
        .get(&leader)
        .await?;
    let id = pod
        .status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default()
        .first()
        .and_then(|c| c.container_id.clone())
        .context("leader pod without a container id")?;
    Ok((
        leader,
        id.rsplit("://").next().unwrap_or_default().to_string(),
    ))
}

// --- two real nodes, and faults on a node --------------------------------------------------------

/// `hack/node.sh ARGS`, awaited; its stdout, or an error with what it said.
async fn node_sh(args: &[&str]) -> Result<String> {
    let out = tokio::process::Command::new(crate::commands::repo_root().join("hack/node.sh"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("running hack/node.sh")?;
    if !out.status.success() {
        bail!(
            "hack/node.sh {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// hack/node.sh's number of a real node: "1" for [`NODE`], "2" for [`NODE_2`].
pub fn node_number(node: &str) -> Result<&'static str> {
    match node {
        NODE => Ok("1"),
        NODE_2 => Ok("2"),
        other => bail!("{other} is not a real node ({NODE} or {NODE_2})"),
    }
}

/// Starts the second real node ([`NODE_2`]) beside the first and waits until it is Ready
/// (`hack/node.sh up-second`: a few seconds; a no-op when it is Ready already). Needs root, like
/// the first. It stays up for the tests that follow; `make down` stops it.
pub async fn second_node_up() -> Result<()> {
    node_sh(&["up-second"]).await.map(drop)
}

/// The node's Ready condition is True (false when it is False, Unknown or absent).
pub async fn node_ready(env: &Env, node: &str) -> Result<bool> {
    let node = Api::<Node>::all(env.client.clone())
        .get_opt(node)
        .await?
        .with_context(|| format!("node {node} does not exist"))?;
    Ok(node
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until the node's readiness is `ready`; returns how long that took.
pub async fn wait_node_ready(
    env: &Env,
    node: &str,
    ready: bool,
    timeout: Duration,
) -> Result<Duration> {
    let start = std::time::Instant::now();
    let what = format!("node {node} Ready={ready}");
    wait(&what, timeout, &[], || async {
        Ok((node_ready(env, node).await? == ready).then_some(()))
    })
    .await?;
    Ok(start.elapsed())
}

/// Freezes the node's kubelet (SIGSTOP to that process only, `hack/node.sh freeze-kubelet`): the
/// node stops renewing its Lease and turns NotReady after the controller manager's
/// `--node-monitor-grace-period`, while containerd and the containers keep running (the API
/// server is partitioned from the node, the database is not). Idempotent. The guard thaws the
/// kubelet when dropped, so a failing test never leaves it frozen; [`KubeletFreeze::thaw`] thaws
/// it at a chosen moment.
#[must_use = "dropping the guard thaws the kubelet at once"]
pub async fn freeze_kubelet(node: &str) -> Result<KubeletFreeze> {
    let n = node_number(node)?;
    node_sh(&["freeze-kubelet", n]).await?;
    Ok(KubeletFreeze {
        node: node.to_string(),
        thawed: false,
    })
}

/// Thaws the node's kubelet (SIGCONT, `hack/node.sh thaw-kubelet`); a no-op when it is not frozen.
pub async fn thaw_kubelet(node: &str) -> Result<()> {
    node_sh(&["thaw-kubelet", node_number(node)?])
        .await
        .map(drop)
}

/// A frozen kubelet, thawed when this is dropped (see [`freeze_kubelet`]).
#[derive(Debug)]
pub struct KubeletFreeze {
    node: String,
    thawed: bool,
}

impl KubeletFreeze {
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Thaws the kubelet now (the guard then has nothing left to do).
    pub async fn thaw(mut self) -> Result<()> {
        self.thawed = true;
        thaw_kubelet(&self.node).await
    }
}

impl Drop for KubeletFreeze {
    fn drop(&mut self) {
        if self.thawed {
            return;
        }
        // Synchronous: a Drop cannot await. SIGCONT takes milliseconds.
        let n = node_number(&self.node).unwrap_or("1");
        match std::process::Command::new(crate::commands::repo_root().join("hack/node.sh"))
            .args(["thaw-kubelet", n])
            .stdin(std::process::Stdio::null())
            .output()
        {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "thawing the kubelet of {} failed: {}; run hack/node.sh thaw-kubelet {n}",
                self.node,
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!(
                "thawing the kubelet of {} failed: {e}; run hack/node.sh thaw-kubelet {n}",
                self.node
            ),
        }
    }
}

/// The taint of Kubernetes' non-graceful node shutdown: on a NotReady node it has PodGC
/// force-delete the node's terminating pods (marking them Failed), so their controllers replace
/// them elsewhere, within PodGC's 20 s period. The operator asserts the node is down; here it is
/// not, which is the point of the partition scenario.
pub const OUT_OF_SERVICE: (&str, &str, &str) = (
    "node.kubernetes.io/out-of-service",
    "nodeshutdown",
    "NoExecute",
);

/// Adds [`OUT_OF_SERVICE`] to the node (a no-op when it is there).
pub async fn taint_out_of_service(env: &Env, node: &str) -> Result<()> {
    set_out_of_service(env, node, true).await
}

/// Removes [`OUT_OF_SERVICE`] from the node (a no-op when it is not there).
pub async fn untaint_out_of_service(env: &Env, node: &str) -> Result<()> {
    set_out_of_service(env, node, false).await
}

/// Read, change, replace: the node lifecycle controller edits the same taint list (unreachable,
/// not-ready), so a write based on a stale list is refused (409) and retried, never clobbers.
async fn set_out_of_service(env: &Env, node: &str, on: bool) -> Result<()> {
    use k8s_openapi::api::core::v1::Taint;
    let (key, value, effect) = OUT_OF_SERVICE;
    let nodes = Api::<Node>::all(env.client.clone());
    for _ in 0..10 {
        let mut n = nodes.get(node).await?;
        let spec = n.spec.get_or_insert_with(Default::default);
        let taints = spec.taints.get_or_insert_with(Vec::new);
        let has = taints.iter().any(|t| t.key == key && t.effect == effect);
        if has == on {
            return Ok(());
        }
        if on {
            taints.push(Taint {
                key: key.into(),
                value: Some(value.into()),
                effect: effect.into(),
                time_added: None,
            });
        } else {
            taints.retain(|t| !(t.key == key && t.effect == effect));
        }
        match nodes.replace(node, &PostParams::default(), &n).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    bail!("could not update the taints of node {node}: 10 conflicts in a row")
}

/// The container runs on that real node, as its containerd says (`hack/node.sh crictl --node N`),
/// whatever the API server says of its pod (a frozen kubelet reports nothing).
pub async fn container_running(node: &str, container_id: &str) -> Result<bool> {
    let n = node_number(node)?;
    let out = node_sh(&[
        "crictl",
        "--node",
        n,
        "ps",
        "-q",
        "--state",
        "running",
        "--id",
        container_id,
    ])
    .await?;
    Ok(!out.trim().is_empty())
}
