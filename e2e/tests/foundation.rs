//! The first slice end to end: a SingletonJob applied through the real API server gets a Job for a
//! due period, with the deterministic name, labels, token and environment; the fake node completes
//! it; status and `kubectl get sj` show the outcome.

use std::time::Duration;

use anyhow::Result;
use e2e::observer::released_at;
use e2e::{Env, ensure, sj_yaml};
use kube::ResourceExt;
use singleton::api::Outcome;

#[tokio::test]
async fn a_due_period_gets_one_job_that_completes() -> Result<()> {
    let mut env = Env::new("foundation").await?;
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml("hello", "*/3 * * * * *", ""))
        .await?;

    // A Job appears for a period, carrying the run's identity.
    let job = env
        .wait_for("a Job for hello", Duration::from_secs(30), || async {
            Ok(env.job_list().await?.into_iter().next())
        })
        .await?;
    let labels = job.labels();
    ensure(
        &env,
        labels.get("singleton.dev/job").map(String::as_str) == Some("hello"),
        ("job label", labels),
    )
    .await?;
    let token = job
        .annotations()
        .get("singleton.dev/fencing-token")
        .cloned()
        .unwrap_or_default();
    ensure(&env, token == "1", ("first token", &token)).await?;
    let period = job
        .annotations()
        .get("singleton.dev/period")
        .cloned()
        .unwrap_or_default();
    let epoch = period.parse::<jiff::Timestamp>()?.as_second();
    ensure(
        &env,
        job.name_any() == format!("hello-{epoch}"),
        ("deterministic name", job.name_any()),
    )
    .await?;
    let container = &job
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    let env_names: Vec<String> = container
        .env
        .iter()
        .flatten()
        .map(|e| e.name.clone())
        .collect();
    for want in [
        "SINGLETON_JOB",
        "SINGLETON_PERIOD",
        "SINGLETON_FENCING_TOKEN",
        "SINGLETON_IDEMPOTENCY_KEY",
    ] {
        ensure(
            &env,
            env_names.iter().any(|n| n == want),
            ("env", want, &env_names),
        )
        .await?;
    }
    // Never let run before its scheduled instant by the API server's clock (the time of the
    // update that cleared spec.suspend): a prepared run's Job is created suspended ahead of it
    // (issue 33).
    let name = job.name_any();
    let started = env
        .wait_for(
            "hello's first Job let run",
            Duration::from_secs(60),
            || async {
                Ok(env
                    .jobs()
                    .get_opt(&name)
                    .await?
                    .as_ref()
                    .and_then(released_at))
            },
        )
        .await?;
    ensure(
        &env,
        started.as_second() >= epoch,
        ("released before period", started, &period),
    )
    .await?;

    // The fake node completes it and the controller records the outcome.
    let sj = env
        .wait_for(
            "hello's first run recorded as Succeeded",
            Duration::from_secs(60),
            || async {
                let sj = env.get_sj("hello").await?;
                let done = sj.status.as_ref().is_some_and(|s| {
                    s.history.iter().any(|h| {
                        h.job_name.as_deref() == Some(&name) && h.outcome == Outcome::Succeeded
                    })
                });
                Ok(done.then_some(sj))
            },
        )
        .await?;
    let status = sj.status.clone().unwrap_or_default();
    ensure(
        &env,
        status.observed_generation == sj.metadata.generation,
        ("observedGeneration", status.observed_generation),
    )
    .await?;
    ensure(
        &env,
        singleton::record::conditions::is_true(&status.conditions, "Ready"),
        ("Ready", &status.conditions),
    )
    .await?;
    ensure(
        &env,
        status.fencing_token >= 1 && status.last_successful_time.is_some(),
        ("status", &status),
    )
    .await?;
    ensure(
        &env,
        status.next_schedule_times.len() == 3,
        ("next times", &status.next_schedule_times),
    )
    .await?;

    // `kubectl get sj` shows the printer columns.
    let out = e2e::kubectl().args(["get", "sj", "-n", &env.ns]).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure(
        &env,
        out.status.success()
            && text.contains("SCHEDULE")
            && text.contains("TOKEN")
            && text.contains("hello"),
        ("kubectl get sj", &text),
    )
    .await?;

    // The control plane signs service-account tokens (the TokenRequest API works).
    let token = env
        .wait_for(
            "kubectl create token default",
            Duration::from_secs(30),
            || async {
                let out = e2e::kubectl()
                    .args(["create", "token", "default", "-n", &env.ns])
                    .output()?;
                Ok(out
                    .status
                    .success()
                    .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()))
            },
        )
        .await?;
    ensure(&env, token.split('.').count() == 3, "a JWT").await?;

    // Each Job is for a distinct period: never two for one period.
    let jobs = env.job_list().await?;
    let mut periods: Vec<String> = jobs
        .iter()
        .map(|j| {
            j.annotations()
                .get("singleton.dev/period")
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    let n = periods.len();
    periods.dedup();
    ensure(&env, periods.len() == n, ("one Job per period", &periods)).await?;
    Ok(())
}

/// Issue 23: a controller this test did not start (here one started by hand, as `make demo`
/// or a forgotten `make run` would be) acting on the test's namespace makes a failing wait say
/// so, naming that controller, instead of failing on a timing assertion.
#[tokio::test]
async fn a_foreign_controller_in_the_test_namespace_is_named_when_a_wait_fails() -> Result<()> {
    let env = Env::new("foreign").await?;
    env.create_sj(&sj_yaml("hello", "*/2 * * * * *", ""))
        .await?;
    env.no_foreign_controller().await?;

    let log = std::fs::File::create(env.log_dir().join("foreign.log"))?;
    let _foreign = tokio::process::Command::new(e2e::controller_bin())
        .args(["--namespace", &env.ns, "--instance", "not-this-test"])
        .env("SINGLETON_HEALTH_ADDR", "127.0.0.1:0")
        .env("SINGLETON_METRICS_ADDR", "127.0.0.1:0")
        .env("SINGLETON_METRICS_AUTH", "none")
        .env("SINGLETON_LEADER_ELECT", "false")
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()?;
    // The foreign controller has acted once it has published an Event.
    env.wait_for(
        "the foreign controller's RunStarted",
        Duration::from_secs(30),
        || async {
            let started = e2e::events_with_reason(&env, "RunStarted").await?;
            Ok(started.into_iter().next())
        },
    )
    .await?;

    let direct = env.no_foreign_controller().await;
    let waited = env
        .wait_for(
            "something that never comes",
            Duration::from_millis(300),
            || async { Ok(None::<()>) },
        )
        .await;
    // Plain asserts: `ensure` would itself report the foreign controller.
    for (what, result) in [("no_foreign_controller", direct), ("wait_for", waited)] {
        let message = result.err().map(|e| e.to_string()).unwrap_or_default();
        anyhow::ensure!(
            message.contains("another singleton-controller")
                && message.contains("\"not-this-test\"")
                && message.contains("RunStarted on hello"),
            "{what} did not name the foreign controller: {message:?}"
        );
    }
    Ok(())
}
