//! The billing workload's Go and Python ports (examples/billing/go, examples/billing/python) on
//! the real node: their images (hack/image.sh workload-go workload-python), a billing database
//! and SingletonJob for each, a run of theirs started again by hand, and what they committed.
//! The SingletonJobs are served by a controller the test runs on this host ([`Env`]), which
//! reaches PostgreSQL on 127.0.0.1; the pods reach it at the bridge's gateway.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::real_node::{GATEWAY, VERSION, billing_database, period_of};
use crate::{Env, backstop_secret, database_port, kubectl, token_of};

/// One port: its SingletonJob's name, its image, and its database.
pub struct Port {
    pub lang: &'static str,
    pub sj: String,
    pub image: String,
    pub db: String,
    /// The database as this process (and the test's controller) reaches it.
    pub host_url: String,
    /// The same database as pods reach it.
    pub pod_url: String,
}

/// Port `lang` ("go" or "python") in `env`'s namespace: a billing database of its own (the
/// example's tables; the controller adds its own on first use) and the opted-in Secret
/// `billing-<lang>` pointing the backstop at it.
pub async fn port(env: &Env, lang: &'static str) -> Result<Port> {
    let suffix = env.ns.rsplit('-').next().unwrap_or("x");
    let db = format!("e2e_{lang}_{suffix}");
    let host_url = billing_database(&db).await?;
    let port = database_port()?;
    let pod_url = format!("postgres://postgres@{GATEWAY}:{port}/{db}?sslmode=disable");
    backstop_secret(env, &format!("billing-{lang}"), &host_url, true).await?;
    Ok(Port {
        lang,
        sj: format!("invoices-{lang}"),
        image: format!("localhost/singleton/billing-workload-{lang}:{VERSION}"),
        db,
        host_url,
        pod_url,
    })
}

impl Port {
    /// Drops its database (a test that passed; a failed one leaves it to be looked at).
    pub async fn drop_database(&self) -> Result<()> {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.db);
        crate::pg().await?.batch_execute(&sql).await?;
        Ok(())
    }

    /// Its SingletonJob on `schedule` (Forbid; history kept for every run of a short test), the
    /// pods on the first real node as the restricted standard admits them, failed at once on
    /// exit codes 2 and 3. JSON, which [`Env::create_sj`] reads as YAML.
    pub fn singleton_job(&self, schedule: &str) -> String {
        let env = json!([{"name": "DATABASE_URL", "value": self.pod_url}]);
        json!({
            "apiVersion": "singleton.dev/v1alpha1",
            "kind": "SingletonJob",
            "metadata": {"name": self.sj},
            "spec": {
                "schedule": schedule,
                "concurrencyPolicy": "Forbid",
                "successfulJobsHistoryLimit": 20,
                "failedJobsHistoryLimit": 5,
                "lock": {"purpose": "Correctness"},
                "backstop": {"postgres": {
                    "secretRef": {"name": format!("billing-{}", self.lang)},
                    "tablePrefix": "singleton_",
                }},
                "jobTemplate": {"spec": {
                    "backoffLimit": 0,
                    "podFailurePolicy": {"rules": [{
                        "action": "FailJob",
                        "onExitCodes": {"operator": "In", "values": [2, 3]},
                    }]},
                    "template": {"spec": pod_spec(&self.image, env)},
                }},
            },
        })
        .to_string()
    }
}

/// A run's pod: `image` with `env` on the first real node, under the restricted standard.
fn pod_spec(image: &str, env: Value) -> Value {
    json!({
        "restartPolicy": "Never",
        "nodeSelector": {"singleton.dev/node": "real"},
        "tolerations": [{"key": "singleton.dev/node", "operator": "Exists", "effect": "NoSchedule"}],
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{
            "name": "invoice-run",
            "image": image,
            "imagePullPolicy": "Never",
            "env": env,
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": {"drop": ["ALL"]},
            },
        }],
    })
}

/// The runs of SingletonJob `sj` whose Job succeeded, as (Job, period, token), oldest first; an
/// error with the Job's log when one failed.
pub async fn succeeded_runs(env: &Env, sj: &str) -> Result<Vec<(String, String, u64)>> {
    let jobs = env
        .jobs()
        .list(&ListParams::default().labels(&format!("singleton.dev/job={sj}")))
        .await?;
    let mut runs = Vec::new();
    for job in jobs {
        let name = job.name_any();
        let st = job.status.clone().unwrap_or_default();
        if st.failed.unwrap_or(0) > 0 {
            bail!(
                "Job {name} of {sj} failed: {:?}\n{}",
                st.conditions,
                logs(env, &name)
            );
        }
        if st.succeeded.unwrap_or(0) > 0 {
            let period = period_of(&job).context("Job without a period annotation")?;
            runs.push((name, period, token_of(&job)));
        }
    }
    runs.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(runs)
}

/// Suspends SingletonJob `sj`: no run starts after this; one already started goes on.
pub async fn suspend(env: &Env, sj: &str) -> Result<()> {
    env.sjs()
        .patch(
            sj,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": true}})),
        )
        .await?;
    Ok(())
}

/// Every Job of the namespace has finished (succeeded or failed).
pub async fn all_finished(env: &Env) -> Result<bool> {
    Ok(env.job_list().await?.iter().all(|j| {
        let st = j.status.clone().unwrap_or_default();
        st.succeeded.unwrap_or(0) + st.failed.unwrap_or(0) > 0
    }))
}

/// What the workload committed in its database, by (period, token): rows of `run_attempts` (its
/// ledger, one per committed transaction) and of `invoices`.
pub async fn committed(host_url: &str) -> Result<BTreeMap<(String, i64), (i64, i64)>> {
    let (client, conn) = tokio_postgres::connect(host_url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let mut out: BTreeMap<(String, i64), (i64, i64)> = BTreeMap::new();
    for (i, (token, table)) in [("token", "run_attempts"), ("fencing_token", "invoices")]
        .iter()
        .enumerate()
    {
        let sql = format!(
            "SELECT to_char(period AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), {token}, \
             count(*) FROM {table} GROUP BY 1, 2"
        );
        for row in client.query(&sql, &[]).await? {
            let entry = out.entry((row.get(0), row.get(1))).or_default();
            *(if i == 0 { &mut entry.0 } else { &mut entry.1 }) = row.get(2);
        }
    }
    Ok(out)
}

/// Refusals the database's fence functions counted (`singleton_fence_rejections`).
pub async fn rejections(host_url: &str) -> Result<i64> {
    let (client, conn) = tokio_postgres::connect(host_url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let sql =
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM singleton_fence_rejections";
    Ok(client.query_one(sql, &[]).await?.get(0))
}

/// A copy of the run's Job `job` started by hand as `name`, as someone re-running an old run
/// would: its pod template as the controller made it (the image, and the run's environment: its
/// period, its now stale token, its idempotency key, the attempt from the pod's uid), without the
/// labels the Job controller and ours put on it, and no retry.
pub async fn rerun_by_hand(env: &Env, job: &str, name: &str) -> Result<()> {
    let old = env.jobs().get(job).await?;
    let mut template = old.spec.context("Job without a spec")?.template;
    template.metadata = None;
    let copy = Job {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            template,
            ..Default::default()
        }),
        ..Default::default()
    };
    env.jobs().create(&PostParams::default(), &copy).await?;
    Ok(())
}

/// The exit code of Job `job`'s container once it ended (60 s at most), with its log.
pub async fn exit_of(env: &Env, job: &str) -> Result<(i32, String)> {
    let pods = Api::<Pod>::namespaced(env.client.clone(), &env.ns);
    let selector = format!("job-name={job}");
    let what = format!("the container of Job {job} to end");
    let code = env
        .wait_for(&what, Duration::from_secs(60), || async {
            for p in pods.list(&ListParams::default().labels(&selector)).await? {
                let statuses = p.status.and_then(|s| s.container_statuses);
                let ended = statuses
                    .unwrap_or_default()
                    .into_iter()
                    .find_map(|c| c.state?.terminated);
                if let Some(t) = ended {
                    return Ok(Some(t.exit_code));
                }
            }
            Ok(None)
        })
        .await?;
    Ok((code, logs(env, job)))
}

/// `kubectl logs job/<job>` (stdout and stderr of its container), or why not.
pub fn logs(env: &Env, job: &str) -> String {
    match kubectl()
        .args(["logs", &format!("job/{job}"), "-n", &env.ns])
        .output()
    {
        Ok(o) => format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => format!("(kubectl logs: {e})"),
    }
}
