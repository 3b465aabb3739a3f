//! The chart on the real node (hack/node.sh: kubelet, containerd, runc): the controller image
//! built by `make image` runs as the chart's two pods in a namespace enforcing the `restricted`
//! Pod Security Standard; they elect a leader; a SingletonJob's Job runs the billing workload's
//! real container, which writes its period and fencing token to PostgreSQL in a transaction that
//! calls `singleton_fence`; the probes and `/metrics` answer on the pod IP; deleting the leader
//! pod hands the Lease over and the next period runs under the new leader with a newer token.
//!
//! Needs the real node (`make up`, unless SINGLETON_REAL_NODE=0) and the images (`make image`,
//! which `make e2e` runs): without them this test fails and says so; it never passes vacuously.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use e2e::{Env, database_port, helm, https_get, kubectl, pg, run_ok, token_of};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

const NODE: &str = "singleton-node";
/// The pod bridge's gateway (hack/node.sh): PostgreSQL is reached there from pods.
const GATEWAY: &str = "10.244.0.1";
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The real node is there and Ready, or a clear failure.
async fn real_node_ready(env: &Env) -> Result<()> {
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

fn restricted(ns: &str) -> Result<()> {
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
async fn billing_database(name: &str) -> Result<String> {
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
        .batch_execute(&std::fs::read_to_string(e2e::repo_file(
            "examples/billing/schema.sql",
        ))?)
        .await?;
    Ok(host_url)
}

/// The SingletonJob: every minute, the billing workload's image on the real node, as a pod the
/// restricted standard admits.
fn billing_sj(policy: &str, work_seconds: u32) -> String {
    format!(
        r#"apiVersion: singleton.dev/v1alpha1
kind: SingletonJob
metadata:
  name: invoices
spec:
  schedule: "* * * * *"
  concurrencyPolicy: {policy}
  lock:
    purpose: Correctness
  backstop:
    postgres:
      secretRef: {{name: billing-db}}
      tablePrefix: singleton_
  jobTemplate:
    spec:
      backoffLimit: 0
      template:
        spec:
          restartPolicy: Never
          terminationGracePeriodSeconds: 120
          nodeSelector: {{singleton.dev/node: real}}
          tolerations: [{{key: singleton.dev/node, operator: Exists, effect: NoSchedule}}]
          securityContext:
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
async fn wait<T, F, Fut>(
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

/// An assertion on what the test saw (not `e2e::ensure`: it refuses the chart's controllers).
async fn check(_env: &Env, ok: bool, what: impl std::fmt::Debug) -> Result<()> {
    anyhow::ensure!(ok, "assertion failed: {what:?}");
    Ok(())
}

/// The (period, token) rows the workload committed.
async fn runs_written(host_url: &str) -> Result<Vec<(String, i64)>> {
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
async fn next_completed_job(work: &Env, seen: &[String]) -> Result<(String, String, u64)> {
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

fn period_of(job: &Job) -> Option<String> {
    let p: jiff::Timestamp = job
        .annotations()
        .get("singleton.dev/period")?
        .parse()
        .ok()?;
    Some(p.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// The controller pods of the release that are Ready, by name, with their IPs.
async fn ready_pods(env: &Env, release: &str) -> Result<Vec<(String, IpAddr)>> {
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
async fn another_holder(
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

async fn lease_holder(env: &Env, lease: &str) -> Result<Option<String>> {
    Ok(Api::<Lease>::namespaced(env.client.clone(), &env.ns)
        .get_opt(lease)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// Removes the test's ClusterRoleBinding (cluster-scoped: its namespace's deletion does not).
struct Binding(String);
impl Drop for Binding {
    fn drop(&mut self) {
        let _ = kubectl()
            .args([
                "delete",
                "clusterrolebinding",
                &self.0,
                "--ignore-not-found",
            ])
            .output();
    }
}

/// What both tests start from: the release namespace and the namespace it serves (both enforcing
/// the restricted Pod Security Standard), a billing database of the test's own with its Secret,
/// and the chart installed with the local image on the real node.
struct Setup {
    env: Env,
    work: Env,
    release: String,
    full: String,
    host_url: String,
    _uninstall: Uninstall,
}

async fn setup(name: &str) -> Result<Setup> {
    let env = Env::new(name).await?;
    real_node_ready(&env).await?;
    let work = Env::new(&format!("{name}-w")).await?;
    restricted(&env.ns)?;
    restricted(&work.ns)?;
    let suffix = env.ns.rsplit('-').next().unwrap_or("x").to_string();
    let db = format!("e2e_real_{suffix}");
    let host_url = billing_database(&db).await?;

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

    // The chart, with the locally built image, on the real node only.
    let release = format!("sc-{suffix}");
    let full = format!("{release}-singleton-controller");
    let install = helm()
        .args(["install", &release])
        .arg(e2e::chart_dir())
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
        let dump = run_ok(kubectl().args(["describe", "pods", "-n", &env.ns]))
            .unwrap_or_else(|e| e.to_string());
        bail!(
            "helm install on the real node failed (images missing? run `make image`):\n{}\n{}\n{dump}",
            String::from_utf8_lossy(&install.stdout),
            String::from_utf8_lossy(&install.stderr)
        );
    }
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

#[tokio::test]
async fn chart_runs_real_pods_and_a_fenced_workload() -> Result<()> {
    let Setup {
        env,
        work,
        release,
        full,
        host_url,
        _uninstall,
    } = setup("real-node").await?;
    // Two real pods on the real node, and one of them leads.
    let pods = wait(
        "two Ready controller pods",
        Duration::from_secs(120),
        &[&env.ns],
        || async {
            let p = ready_pods(&env, &release).await?;
            Ok((p.len() == 2).then_some(p))
        },
    )
    .await?;
    for (name, _) in &pods {
        let pod = Api::<Pod>::namespaced(env.client.clone(), &env.ns)
            .get(name)
            .await?;
        let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
        check(&env, node == NODE, ("pod", name, "on node", &node)).await?;
    }
    // The Lease is named after the release; its holder is "<pod name>-<random>" (--instance).
    let holder = wait(
        "the Lease to be held",
        Duration::from_secs(60),
        &[&env.ns],
        || async { lease_holder(&env, &release).await },
    )
    .await?;
    let (leader, leader_ip) = pods
        .iter()
        .find(|(n, _)| holder.starts_with(&format!("{n}-")))
        .cloned()
        .with_context(|| format!("Lease holder {holder} is none of the pods {pods:?}"))?;

    // The probes answer on each pod's IP (plain HTTP, no token) ...
    for (name, ip) in &pods {
        for path in ["/healthz", "/readyz"] {
            let r = e2e::http_get(SocketAddr::new(*ip, 8080), path).await?;
            check(&env, r.status == 200, (name, path, r.status, &r.body)).await?;
        }
    }
    // ... and /metrics over HTTPS: refused without a token, served to a metrics reader.
    let metrics = SocketAddr::new(leader_ip, 8443);
    let none = https_get(metrics, "/metrics", None).await?;
    check(
        &env,
        none.status == 401,
        ("/metrics without a token", none.status),
    )
    .await?;
    run_ok(kubectl().args(["create", "serviceaccount", "scraper", "-n", &env.ns]))?;
    let binding = Binding(format!("{}-scraper", env.ns));
    run_ok(kubectl().args([
        "create",
        "clusterrolebinding",
        &binding.0,
        &format!("--clusterrole={full}-metrics-reader"),
        &format!("--serviceaccount={}:scraper", env.ns),
    ]))?;
    let token = run_ok(kubectl().args(["create", "token", "scraper", "-n", &env.ns]))?;
    let body = wait(
        "/metrics for the reader",
        Duration::from_secs(40),
        &[&env.ns],
        || async {
            let r = https_get(metrics, "/metrics", Some(token.trim())).await?;
            Ok((r.status == 200).then_some(r.body))
        },
    )
    .await?;
    check(
        &env,
        body.contains("singleton_leader"),
        ("metrics text", &body),
    )
    .await?;

    // A run: the Job's real container writes its period and token, fenced.
    work.create_sj(&billing_sj("Forbid", 0)).await?;
    let (job1, period1, token1) = next_completed_job(&work, &[]).await?;
    let written = runs_written(&host_url).await?;
    check(
        &work,
        written.contains(&(period1.clone(), token1 as i64)),
        ("invoice_runs", &written, "Job", &job1, &period1, token1),
    )
    .await?;
    let logs = run_ok(kubectl().args(["logs", &format!("job/{job1}"), "-n", &work.ns]))?;
    check(
        &work,
        logs.contains(&format!("fencing token {token1}")) && logs.contains("committed"),
        ("kubectl logs of the run", &logs),
    )
    .await?;

    // Deleting the leader pod hands over: another pod takes the Lease and runs the next period
    // with a newer token.
    Api::<Pod>::namespaced(env.client.clone(), &env.ns)
        .delete(&leader, &DeleteParams::default())
        .await?;
    let new_leader = another_holder(
        &env,
        &release,
        &leader,
        "another pod to take the Lease",
        Duration::from_secs(90),
    )
    .await?;
    let (job2, period2, token2) = next_completed_job(&work, std::slice::from_ref(&job1)).await?;
    check(
        &work,
        token2 > token1 && period2 > period1,
        (
            "after handover",
            &new_leader,
            &job2,
            &period2,
            token2,
            "before",
            &period1,
            token1,
        ),
    )
    .await?;
    let written = runs_written(&host_url).await?;
    check(
        &work,
        written.contains(&(period2.clone(), token2 as i64)),
        ("invoice_runs after handover", &written),
    )
    .await?;
    drop(binding);
    Ok(())
}

/// `helm uninstall` when the test ends, passed or not (the namespaces go with their [`Env`]s).
struct Uninstall(String, String);
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
fn scopeguard(release: String, ns: String) -> Uninstall {
    Uninstall(release, ns)
}

/// The freezer cgroup (v1, this host's hierarchy) of a container on the real node.
fn freezer_of(container_id: &str) -> Result<std::path::PathBuf> {
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
    let root = std::path::Path::new("/sys/fs/cgroup/freezer/singleton-node");
    find(root, container_id)
        .with_context(|| format!("no freezer cgroup for container {container_id} under {root:?}"))
}

/// Sets a freezer cgroup's state and waits until the kernel reports it.
async fn set_freezer(cgroup: &std::path::Path, state: &str) -> Result<()> {
    let file = cgroup.join("freezer.state");
    std::fs::write(&file, state).with_context(|| format!("writing {state} to {file:?}"))?;
    wait(
        &format!("{file:?} to be {state}"),
        Duration::from_secs(20),
        &[],
        || async { Ok((std::fs::read_to_string(&file)?.trim() == state).then_some(())) },
    )
    .await
}

/// The Running pod of a Job, with its container's id.
async fn running_pod_of(work: &Env, job: &str) -> Result<(String, String)> {
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

/// The stale-run case on real containers: a run's container is frozen with the cgroup freezer
/// (a VM or GC pause) before its write; the next period Replaces it, which advances the fence to
/// a newer token before the old Job is deleted; thawed, the old run goes on to its transaction
/// (it finishes a run on SIGTERM) and `singleton_fence` refuses it with SQLSTATE SF001, so
/// nothing of it commits; the newer run's write commits.
#[tokio::test]
async fn frozen_workload_is_refused_by_the_fence_after_a_replace() -> Result<()> {
    let Setup {
        env: _env,
        work,
        host_url,
        _uninstall,
        ..
    } = setup("real-freeze").await?;
    // 50 s of "work": the first run is still before its write when the next minute's period
    // replaces it.
    work.create_sj(&billing_sj("Replace", 50)).await?;
    let job1 = wait(
        "the first run's Job",
        Duration::from_secs(90),
        &[&work.ns],
        || async {
            Ok(work
                .jobs()
                .list(&ListParams::default())
                .await?
                .into_iter()
                .next())
        },
    )
    .await?;
    let (job1_name, token1) = (job1.name_any(), token_of(&job1));
    let (pod1, container1) = running_pod_of(&work, &job1_name).await?;
    // Its log, streamed from now until its container ends (the pod is deleted right after).
    let log_path = work.log_dir().join("frozen-run.log");
    let mut follow = kubectl()
        .args(["logs", "-f", &pod1, "-n", &work.ns])
        .stdout(std::fs::File::create(&log_path)?)
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let cgroup = freezer_of(&container1)?;
    set_freezer(&cgroup, "FROZEN").await?;

    // The next period replaces it: the fence moves past its token while it is frozen.
    let host = host_url.clone();
    let fence = wait(
        "the fence to move past the frozen run's token",
        Duration::from_secs(120),
        &[&work.ns],
        || async {
            let (client, conn) = tokio_postgres::connect(&host, tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            let row = client
                .query_opt("SELECT max(token) FROM singleton_fences", &[])
                .await
                .ok()
                .flatten();
            let t: Option<i64> = row.and_then(|r| r.get(0));
            Ok(t.filter(|t| *t > token1 as i64))
        },
    )
    .await;
    // Thawed whatever happened, so a failure leaves no frozen process behind.
    set_freezer(&cgroup, "THAWED").await?;
    let fence = fence?;

    // Thawed, it goes on to its transaction and is refused by the fence.
    let refused = wait(
        "the thawed run's write to be refused",
        Duration::from_secs(60),
        &[&work.ns],
        || async {
            let log = std::fs::read_to_string(&log_path)?;
            Ok(log.contains("SQLSTATE SF001").then_some(log))
        },
    )
    .await?;
    let _ = follow.kill();
    let written = runs_written(&host_url).await?;
    check(
        &work,
        !written.iter().any(|(_, t)| *t == token1 as i64),
        ("the stale run wrote", &written, "its log", &refused),
    )
    .await?;
    // The newer run, created once the old pod is gone, commits with the newer token.
    let (job2, period2, token2) =
        next_completed_job(&work, std::slice::from_ref(&job1_name)).await?;
    check(
        &work,
        token2 as i64 == fence,
        ("newer run", &job2, token2, "fence", fence),
    )
    .await?;
    let written = runs_written(&host_url).await?;
    check(
        &work,
        written.contains(&(period2.clone(), token2 as i64)),
        ("invoice_runs", &written),
    )
    .await?;
    Ok(())
}

/// The leader's container frozen with the cgroup freezer past its Lease (the realistic VM or GC
/// pause): the standby takes the Lease while it is frozen; thawed, the old leader stays out (the
/// Lease stays with the new one) and the runs go on with rising tokens, one Job per period.
#[tokio::test]
async fn frozen_leader_loses_the_lease_and_stays_out() -> Result<()> {
    let Setup {
        env,
        work,
        release,
        _uninstall,
        ..
    } = setup("real-lfreeze").await?;
    work.create_sj(&billing_sj("Forbid", 0)).await?;
    let (job1, _, token1) = next_completed_job(&work, &[]).await?;

    let holder = lease_holder(&env, &release)
        .await?
        .context("the Lease is not held")?;
    let pods = ready_pods(&env, &release).await?;
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
    let cgroup = freezer_of(id.rsplit("://").next().unwrap_or_default())?;
    set_freezer(&cgroup, "FROZEN").await?;
    // The Lease (15 s) runs out while it is frozen; thawed right after the takeover, before the
    // liveness probe (3 failures 10 s apart) would restart it.
    let taken = another_holder(
        &env,
        &release,
        &leader,
        "the standby to take the Lease from the frozen leader",
        Duration::from_secs(40),
    )
    .await;
    set_freezer(&cgroup, "THAWED").await?;
    let new_holder = taken?;

    // Thawed, the old leader does not take the Lease back, and the next run comes from the new
    // leader with a higher token.
    let (job2, _, token2) = next_completed_job(&work, std::slice::from_ref(&job1)).await?;
    let now = lease_holder(&env, &release).await?;
    check(
        &env,
        now.as_deref() == Some(new_holder.as_str()) && token2 > token1,
        (
            "holder",
            &now,
            "new",
            &new_holder,
            "tokens",
            token1,
            &job2,
            token2,
        ),
    )
    .await?;
    // One Job per period, tokens rising with the periods.
    let mut jobs: Vec<(String, u64)> = work
        .jobs()
        .list(&ListParams::default())
        .await?
        .iter()
        .filter_map(|j| Some((period_of(j)?, token_of(j))))
        .collect();
    jobs.sort();
    let unique = jobs.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1);
    check(&work, unique, ("Jobs (period, token)", &jobs)).await?;
    Ok(())
}

/// The README's commands after `make demo`, run as written in a shell that has nothing but what
/// `make env` gives it (`env -i`, `PATH=/usr/bin:/bin`): kubectl, its plugin and the cluster come
/// from `eval "$(make -s env)"`. What `make demo` sets up with the real node is set up here (the
/// chart with the local images, the billing database and Secret), the demo's SingletonJob
/// (examples/billing/demo.yaml) runs, and the demo's namespace becomes this test's.
#[tokio::test]
async fn the_readmes_commands_after_make_demo_run_in_a_clean_shell() -> Result<()> {
    // `_uninstall` kept: dropping it uninstalls the chart.
    let Setup {
        env,
        work,
        _uninstall,
        ..
    } = setup("readme").await?;
    let demo = std::fs::read_to_string(e2e::repo_file("examples/billing/demo.yaml"))?;
    // The image tag the demo applies: this build's version (hack/demo.sh does the same).
    let demo: String = demo
        .lines()
        .map(|l| match l.split_once("billing-workload:") {
            Some((head, _)) => format!("{head}billing-workload:{VERSION}\n"),
            None => format!("{l}\n"),
        })
        .collect();
    work.create_sj(&demo).await?;
    let (job, _, token) = next_completed_job(&work, &[]).await?;

    let readme = std::fs::read_to_string(e2e::repo_file("README.md"))?;
    let after = readme
        .split_once("After `make demo`")
        .map(|(_, rest)| rest)
        .context("the README has its \"After `make demo`\" paragraph")?;
    let block = e2e::sh_blocks(after)
        .into_iter()
        .next()
        .context("a ```sh block after it")?;
    let script = block.script.replace("singleton-demo", &work.ns);
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let out = std::process::Command::new("env")
        .args(["-i", &format!("HOME={home}"), "PATH=/usr/bin:/bin"])
        .args(["bash", "-euo", "pipefail", "-c", &script])
        .current_dir(e2e::repo_file(""))
        .output()?;
    let (text, err) = (e2e::stdout(&out), e2e::stderr(&out));
    check(
        &env,
        out.status.success()
            && text.contains("invoices")
            && text.contains("Succeeded")
            && text.contains("Fencing Token")
            && text.contains("committed 3 invoice(s)"),
        (
            "README block at its line",
            block.line,
            &script,
            "first run",
            &job,
            token,
            &text,
            &err,
        ),
    )
    .await?;
    Ok(())
}
