//! Outcome deadlines and repeated failures against the real API server and job controller:
//! `completionDeadlineSeconds` (a run not succeeded by then is late: status, Event, metric; with
//! `Stop` Kubernetes ends it) and `suspendAfterConsecutiveFailures`.
//!
//! Runs that must stay active get a nodeSelector no node matches; runs that must fail get that
//! and `activeDeadlineSeconds: 1`, so the job controller fails them a second after they start.

use std::time::Duration;

use anyhow::Result;
use e2e::{Env, ensure, events_with_reason, metric, never_scheduled, sj_yaml};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use singleton::api::{Outcome, SingletonJob};

fn failing_yaml(name: &str, schedule: &str, extra_spec: &str) -> String {
    never_scheduled(sj_yaml(name, schedule, extra_spec)).replace(
        "      backoffLimit: 0\n",
        "      backoffLimit: 0\n      activeDeadlineSeconds: 1\n",
    )
}

fn condition(sj: &SingletonJob, type_: &str) -> Option<(String, String)> {
    sj.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn failed(sj: &SingletonJob) -> usize {
    sj.status.as_ref().map_or(0, |s| {
        s.history
            .iter()
            .filter(|h| h.outcome == Outcome::Failed)
            .count()
    })
}

#[tokio::test]
async fn a_run_past_its_completion_deadline_is_late_and_stop_ends_it() -> Result<()> {
    let mut env = Env::new("late").await?;
    let ctl = env.start_controller(&[]).await?;
    let deadline = "  completionDeadlineSeconds: 3\n";
    env.create_sj(&never_scheduled(sj_yaml("cont", "*/5 * * * * *", deadline)))
        .await?;
    env.create_sj(&never_scheduled(sj_yaml(
        "stop",
        "*/5 * * * * *",
        &format!("{deadline}  completionDeadlinePolicy: Stop\n"),
    )))
    .await?;

    // Continue: the run is marked late and goes on.
    let sj = env
        .wait_for("the run marked late", Duration::from_secs(30), || async {
            let sj = env.get_sj("cont").await?;
            let late = sj
                .status
                .as_ref()
                .is_some_and(|s| s.active.iter().any(|r| r.late));
            Ok(late.then_some(sj))
        })
        .await?;
    let run = sj.status.clone().unwrap_or_default().active[0].clone();
    let job = env.jobs().get(&run.job_name).await?;
    ensure(
        &env,
        job.status.as_ref().and_then(|s| s.failed).unwrap_or(0) == 0
            && job
                .spec
                .as_ref()
                .and_then(|s| s.active_deadline_seconds)
                .is_none(),
        (
            "Continue leaves the Job running, without a deadline",
            &job.status,
        ),
    )
    .await?;
    let events = env
        .wait_for("a RunLate Event", Duration::from_secs(10), || async {
            let evs = events_with_reason(&env, "RunLate").await?;
            Ok((!evs.is_empty()).then_some(evs))
        })
        .await?;
    let note = events[0].message.clone().unwrap_or_default();
    ensure(
        &env,
        note.contains("completionDeadlineSeconds") && note.contains(&run.job_name),
        ("the Event names the run and the setting", &note),
    )
    .await?;
    let text = env.metrics(ctl).await?;
    let labels = [("namespace", env.ns.as_str()), ("name", "cont")];
    ensure(
        &env,
        metric(&text, "singleton_runs_late_total", &labels) >= 1.0,
        "singleton_runs_late_total counts it",
    )
    .await?;

    // Stop: Kubernetes ends the Job at the deadline; the period is Failed and late.
    let entry = env
        .wait_for(
            "the stopped run recorded",
            Duration::from_secs(40),
            || async {
                let sj = env.get_sj("stop").await?;
                let st = sj.status.unwrap_or_default();
                Ok(st
                    .history
                    .into_iter()
                    .find(|h| h.outcome == Outcome::Failed && h.job_name.is_some()))
            },
        )
        .await?;
    ensure(
        &env,
        entry.late,
        ("the failed run is recorded late", &entry),
    )
    .await?;
    let stopped = env
        .jobs()
        .get(entry.job_name.as_deref().unwrap_or_default())
        .await?;
    let limit = stopped
        .spec
        .as_ref()
        .and_then(|s| s.active_deadline_seconds);
    ensure(
        &env,
        limit.is_some_and(|l| (1..=3).contains(&l)),
        ("activeDeadlineSeconds ends it by the deadline", limit),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn repeated_failures_suspend_it_with_a_condition_and_an_event_and_resuming_counts_again()
-> Result<()> {
    let mut env = Env::new("failures").await?;
    let ctl = env.start_controller(&[]).await?;
    env.create_sj(&failing_yaml(
        "f",
        "*/3 * * * * *",
        "  suspendAfterConsecutiveFailures: 2\n",
    ))
    .await?;
    let sj = env
        .wait_for(
            "suspended after two failures",
            Duration::from_secs(60),
            || async {
                let sj = env.get_sj("f").await?;
                let suspended = sj.spec.suspend == Some(true)
                    && condition(&sj, "Suspended")
                        == Some(("True".into(), "SuspendedAfterFailures".into()));
                Ok(suspended.then_some(sj))
            },
        )
        .await?;
    let st = sj.status.clone().unwrap_or_default();
    ensure(
        &env,
        failed(&sj) == 2 && st.consecutive_failures == 0 && st.suspended_after_failures.is_some(),
        (
            "two failures, the count started again",
            &st.history,
            st.consecutive_failures,
        ),
    )
    .await?;
    let events = events_with_reason(&env, "SuspendedAfterFailures").await?;
    ensure(&env, events.len() == 1, ("one Event", events.len())).await?;
    let text = env.metrics(ctl).await?;
    let labels = [("namespace", env.ns.as_str()), ("name", "f")];
    ensure(
        &env,
        metric(&text, "singleton_suspended_after_failures_total", &labels) == 1.0,
        "the metric counts the suspension",
    )
    .await?;
    // Suspended: the next periods are recorded as such and no Job is created.
    let jobs_before = env.job_list().await?.len();
    env.wait_for(
        "a period skipped while suspended",
        Duration::from_secs(20),
        || async {
            let sj = env.get_sj("f").await?;
            let skipped = sj.status.as_ref().is_some_and(|s| {
                s.history.iter().any(|h| {
                    h.outcome == Outcome::Skipped && h.reason.as_deref() == Some("Suspended")
                })
            });
            Ok(skipped.then_some(()))
        },
    )
    .await?;
    ensure(
        &env,
        env.job_list().await?.len() == jobs_before,
        "no Job while suspended",
    )
    .await?;

    // Resume: the count starts from zero, so it takes two more failures to suspend again.
    let resume = serde_json::json!({"spec": {"suspend": false}});
    env.sjs()
        .patch("f", &PatchParams::default(), &Patch::Merge(&resume))
        .await?;
    let sj = env
        .wait_for("suspended again", Duration::from_secs(60), || async {
            let sj = env.get_sj("f").await?;
            Ok((sj.spec.suspend == Some(true) && failed(&sj) >= 4).then_some(sj))
        })
        .await?;
    ensure(
        &env,
        failed(&sj) == 4,
        ("two more failures, not one", failed(&sj), sj.name_any()),
    )
    .await?;
    Ok(())
}
