//! `kubectl singleton convert cronjob/NAME` against the real API server and the real CronJob
//! controller (kube-controller-manager): every CronJob feature carried over into a SingletonJob
//! the API server accepts, and `--apply`, after which the next period runs exactly once, from
//! the SingletonJob, and which is safe to repeat.

use std::time::Duration;

use anyhow::{Context as _, Result};
use e2e::{Env, ensure, kubectl, plugin, run_ok, stderr, stdout};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{CronJob, Job};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use singleton::api::{CatchUp, ConcurrencyPolicy, SingletonJob};

fn cronjob(name: &str, spec: serde_json::Value) -> Result<CronJob> {
    let mut spec = spec;
    spec["jobTemplate"] = serde_json::json!({"spec": {"backoffLimit": 0, "template": {"spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "work", "image": "busybox", "command": ["true"]}]
    }}}});
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name, "labels": {"team": "payments"}},
        "spec": spec,
    }))?)
}

/// The period a SingletonJob's Job runs (annotation `singleton.dev/period`).
fn period(job: &Job) -> Option<Timestamp> {
    job.annotations().get("singleton.dev/period")?.parse().ok()
}

/// Which kind owns a Job: "CronJob" or "SingletonJob".
fn owner_kind(job: &Job) -> String {
    job.owner_references()
        .first()
        .map(|o| o.kind.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn convert_prints_every_cronjob_feature_as_a_singletonjob_the_api_server_accepts()
-> Result<()> {
    let env = Env::new("convert-print").await?;
    let cronjobs: Api<CronJob> = Api::namespaced(env.client.clone(), &env.ns);
    let cj = cronjob(
        "nightly",
        serde_json::json!({
            "schedule": "30 2 * * 1-5",
            "timeZone": "Europe/Berlin",
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 120,
            "suspend": true,
            "successfulJobsHistoryLimit": 4,
            "failedJobsHistoryLimit": 2,
        }),
    )?;
    cronjobs.create(&PostParams::default(), &cj).await?;
    let out = plugin(&["convert", "cronjob/nightly", "-n", &env.ns], &[])?;
    ensure(&env, out.status.success(), ("convert failed", stderr(&out))).await?;
    let text = stdout(&out);
    let sj: SingletonJob = serde_yaml::from_str(&text).context("convert's output as YAML")?;
    let s = &sj.spec;
    let carried = s.schedule == "30 2 * * 1-5"
        && s.time_zone.as_deref() == Some("Europe/Berlin")
        && s.concurrency_policy == ConcurrencyPolicy::Forbid
        && s.catch_up == CatchUp::Latest
        && s.starting_deadline_seconds == Some(120)
        && s.suspend == Some(true)
        && s.successful_jobs_history_limit == Some(4)
        && s.failed_jobs_history_limit == Some(2)
        && sj.labels().get("team").map(String::as_str) == Some("payments");
    ensure(&env, carried, ("every field carried over", &text)).await?;
    ensure(
        &env,
        text.contains("# What behaves differently:") && text.contains("Daylight-saving"),
        ("the differences named", &text),
    )
    .await?;
    // The API server takes it as printed.
    let file = env.log_dir().join("converted.yaml");
    std::fs::write(&file, &text)?;
    run_ok(
        kubectl()
            .args(["apply", "--dry-run=server", "-f"])
            .arg(&file),
    )?;

    // Anything but a CronJob, or a missing one, is a clear error.
    let out = plugin(&["convert", "cronjob/absent", "-n", &env.ns], &[])?;
    ensure(
        &env,
        !out.status.success() && stderr(&out).contains("not found"),
        ("a missing CronJob", stderr(&out)),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn convert_apply_switches_between_two_periods_so_the_next_runs_once() -> Result<()> {
    let mut env = Env::new("convert-apply").await?;
    env.start_controller(&[]).await?;
    let cronjobs: Api<CronJob> = Api::namespaced(env.client.clone(), &env.ns);
    let cj = cronjob(
        "minutely",
        serde_json::json!({"schedule": "* * * * *", "timeZone": "UTC"}),
    )?;
    cronjobs.create(&PostParams::default(), &cj).await?;

    let out = plugin(
        &["convert", "cronjob/minutely", "-n", &env.ns, "--apply"],
        &[],
    )?;
    ensure(
        &env,
        out.status.success(),
        ("convert --apply failed", stderr(&out)),
    )
    .await?;
    let said = stdout(&out);
    let first: Timestamp = said
        .rsplit("its first period ")
        .next()
        .and_then(|t| t.trim().parse().ok())
        .with_context(|| format!("the first period in {said:?}"))?;
    let suspended = cronjobs.get("minutely").await?.spec.and_then(|s| s.suspend);
    ensure(
        &env,
        suspended == Some(true),
        ("the CronJob suspended", suspended),
    )
    .await?;

    // The first period falls due and its run finishes; give the CronJob controller time to
    // (wrongly) start it too.
    env.wait_for(
        "the first period's run from the SingletonJob, and 10 s more",
        Duration::from_secs(100),
        || async {
            let later = Timestamp::now() > first + jiff::SignedDuration::from_secs(10);
            let sj_ran = env
                .job_list()
                .await?
                .iter()
                .any(|j| owner_kind(j) == "SingletonJob" && period(j) == Some(first));
            Ok((later && sj_ran).then_some(()))
        },
    )
    .await?;
    let jobs = env.job_list().await?;
    let of_first_period = |j: &&Job| match owner_kind(j).as_str() {
        "SingletonJob" => period(j) == Some(first),
        // CronJob names its Jobs <name>-<minutes since the epoch of the period>.
        _ => j
            .name_any()
            .ends_with(&format!("-{}", first.as_second() / 60)),
    };
    let runs: Vec<String> = jobs
        .iter()
        .filter(of_first_period)
        .map(|j| format!("{} ({})", j.name_any(), owner_kind(j)))
        .collect();
    ensure(
        &env,
        runs.len() == 1 && runs[0].ends_with("(SingletonJob)"),
        ("one Job for the first period, the SingletonJob's", &runs),
    )
    .await?;

    // Again: nothing new, and it says so.
    let out = plugin(
        &["convert", "cronjob/minutely", "-n", &env.ns, "--apply"],
        &[],
    )?;
    ensure(
        &env,
        out.status.success() && stdout(&out).starts_with("already converted"),
        ("a repeated --apply", stdout(&out), stderr(&out)),
    )
    .await?;
    Ok(())
}
