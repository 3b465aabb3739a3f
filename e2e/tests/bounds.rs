//! Bounds and timed pauses end to end (issue 37): `startAt`, `endAt` and `maxRuns` keep every
//! period outside them from running and say so on the object; `kubectl singleton suspend --until
//! --reason` skips the periods before its end, records why, and resumes by itself. Seconds-level
//! schedules keep these fast; the checks read the Jobs (their period annotations) from outside.

use std::time::Duration;

use anyhow::Result;
use e2e::{
    Env, backstop_secret, backstop_spec, database_url, ensure, events_with_reason, periods, plugin,
    sj_yaml, stderr, stdout, table_prefix,
};
use jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use singleton::api::{OperationPhase, OperationStatus, Outcome, SingletonJob};

/// A whole second at least `secs` seconds from now, as RFC 3339.
fn whole_second_in(secs: i64) -> Timestamp {
    let t = Timestamp::now() + SignedDuration::from_secs(secs);
    Timestamp::from_second(t.as_second() + 1).unwrap()
}

fn condition(sj: &SingletonJob, type_: &str) -> Option<(String, String, String)> {
    sj.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn reason_is(sj: &SingletonJob, type_: &str, status: &str, reason: &str) -> bool {
    condition(sj, type_).is_some_and(|(s, r, _)| s == status && r == reason)
}

/// The Events of the test namespace with `reason`, once there is one (Events are sent in the
/// background, after the write they follow).
async fn wait_event(env: &Env, reason: &str) -> Result<Vec<k8s_openapi::api::core::v1::Event>> {
    let what = format!("the {reason} Event");
    env.wait_for(&what, Duration::from_secs(30), || async {
        let evs = events_with_reason(env, reason).await?;
        Ok((!evs.is_empty()).then_some(evs))
    })
    .await
}

#[tokio::test]
async fn start_at_and_end_at_bound_the_periods() -> Result<()> {
    let mut env = Env::new("bounds-window").await?;
    env.start_controller(&[]).await?;
    let start = whole_second_in(6);
    let end = start + SignedDuration::from_secs(5);
    let extra = format!(
        "  concurrencyPolicy: Allow\n  successfulJobsHistoryLimit: 100\n  failedJobsHistoryLimit: 100\n  startAt: \"{start}\"\n  endAt: \"{end}\"\n"
    );
    env.create_sj(&sj_yaml("w", "* * * * * *", &extra)).await?;
    env.wait_for(
        "Ended=False NotStarted before startAt",
        Duration::from_secs(30),
        || async {
            let sj = env.get_sj("w").await?;
            Ok(reason_is(&sj, "Ended", "False", "NotStarted").then_some(()))
        },
    )
    .await?;
    let sj = env
        .wait_for(
            "Ended=True EndAtPassed",
            Duration::from_secs(60),
            || async {
                let sj = env.get_sj("w").await?;
                Ok(reason_is(&sj, "Ended", "True", "EndAtPassed").then_some(sj))
            },
        )
        .await?;
    // Every period of the window ran (the six seconds startAt..=endAt), none outside it, and
    // nothing before startAt or after endAt was recorded either.
    let ran = periods(&env.job_list().await?);
    let status = sj.status.clone().unwrap_or_default();
    let outside = |t: Timestamp| t < start || t > end;
    let recorded_outside = status.history.iter().any(|h| {
        let last = h.last_period.as_ref().map_or(h.period.0, |l| l.0);
        outside(h.period.0) || outside(last)
    });
    let decided: u64 = status
        .history
        .iter()
        .filter(|h| matches!(h.outcome, Outcome::Missed | Outcome::Skipped))
        .map(|h| h.count)
        .sum();
    ensure(
        &env,
        ran.iter().all(|t| !outside(*t))
            && !recorded_outside
            && ran.len() as u64 + decided == 6
            && status.next_schedule_time.is_none(),
        (
            "runs and records within startAt..=endAt",
            start,
            end,
            &ran,
            &status.history,
        ),
    )
    .await?;
    // Nothing more comes after endAt.
    env.holds_for("no Job after endAt", Duration::from_secs(3), || async {
        Ok(periods(&env.job_list().await?).iter().all(|t| *t <= end))
    })
    .await?;
    let ended = wait_event(&env, "Ended").await?;
    ensure(&env, ended.len() == 1, ("one Ended Event", ended.len())).await?;
    Ok(())
}

#[tokio::test]
async fn max_runs_stops_the_schedule_until_raised() -> Result<()> {
    let mut env = Env::new("bounds-max").await?;
    env.start_controller(&[]).await?;
    let extra = "  concurrencyPolicy: Allow\n  successfulJobsHistoryLimit: 100\n  failedJobsHistoryLimit: 100\n  maxRuns: 3\n";
    env.create_sj(&sj_yaml("m", "*/2 * * * * *", extra)).await?;
    env.wait_for(
        "Ended=True MaxRunsReached",
        Duration::from_secs(60),
        || async {
            let sj = env.get_sj("m").await?;
            Ok(reason_is(&sj, "Ended", "True", "MaxRunsReached").then_some(()))
        },
    )
    .await?;
    // The third run's Job is created after the claim that counted it (and so after `Ended`):
    // under load it can take a moment to appear (CI, 2026-12-06: two Jobs 0.7 s after Ended).
    env.wait_for("the third Job", Duration::from_secs(30), || async {
        Ok((env.job_list().await?.len() >= 3).then_some(()))
    })
    .await?;
    env.holds_for("three Jobs, no more", Duration::from_secs(5), || async {
        Ok(env.job_list().await?.len() == 3)
    })
    .await?;
    let sj = env.get_sj("m").await?;
    let status = sj.status.clone().unwrap_or_default();
    ensure(
        &env,
        status.run_count == 3 && status.next_schedule_time.is_none(),
        (
            "runCount 3, nothing next",
            status.run_count,
            &status.next_schedule_time,
        ),
    )
    .await?;
    // Raised by one: one more run (the newest due period), then it ends again.
    let patch = serde_json::json!({"spec": {"maxRuns": 4}});
    env.sjs()
        .patch("m", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    env.wait_for("a fourth Job", Duration::from_secs(30), || async {
        Ok((env.job_list().await?.len() == 4).then_some(()))
    })
    .await?;
    env.holds_for("four Jobs, no more", Duration::from_secs(5), || async {
        Ok(env.job_list().await?.len() == 4)
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_backfill_stops_at_max_runs() -> Result<()> {
    let mut env = Env::new("bounds-backfill").await?;
    let ns = env.ns.clone();
    let prefix = table_prefix(&env);
    backstop_secret(&env, "db", &database_url()?, true).await?;
    env.start_controller(&[]).await?;
    // Yearly: no scheduled period falls due during the test; the backfill's four are in the past.
    let keep = "  successfulJobsHistoryLimit: 100\n  maxRuns: 2\n";
    env.create_sj(&sj_yaml(
        "b",
        "0 3 1 1 *",
        &backstop_spec("db", &prefix, keep),
    ))
    .await?;
    env.wait_for(
        "the controller to decide b",
        Duration::from_secs(30),
        || async {
            let sj = env.get_sj("b").await?;
            Ok(sj.status.and_then(|s| s.decided_through).map(|_| ()))
        },
    )
    .await?;
    let now = Timestamp::now();
    let from = (now - SignedDuration::from_hours(4 * 366 * 24)).to_string();
    let to = now.to_string();
    let args = [
        "backfill",
        "b",
        "-n",
        &ns,
        "--from",
        &from,
        "--to",
        &to,
        "--before-creation",
        "--wait",
        "--timeout",
        "90s",
    ];
    // The plugin says the backfill was rejected, and why; the status keeps what it did.
    let out = plugin(&args, &[])?;
    let sj = env.get_sj("b").await?;
    let status = sj.status.clone().unwrap_or_default();
    let op: OperationStatus = status.operations.backfill.clone().unwrap_or_default();
    let jobs = env.job_list().await?;
    ensure(
        &env,
        !out.status.success()
            && stderr(&out).contains("maxRuns (2) reached")
            && op.phase == OperationPhase::Rejected
            && op.started == 2
            && jobs.len() == 2
            && status.run_count == 2,
        (
            "the backfill stopped at maxRuns",
            stderr(&out),
            &op,
            jobs.len(),
            status.run_count,
        ),
    )
    .await?;
    env.wait_for(
        "Ended=True MaxRunsReached",
        Duration::from_secs(30),
        || async {
            let sj = env.get_sj("b").await?;
            Ok(reason_is(&sj, "Ended", "True", "MaxRunsReached").then_some(()))
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn bounds_that_hold_nothing_are_refused_or_said() -> Result<()> {
    let mut env = Env::new("bounds-bad").await?;
    env.start_controller(&[]).await?;
    // startAt after endAt: the API server refuses it, with the rule's message.
    let extra = "  startAt: \"2027-03-01T00:00:00Z\"\n  endAt: \"2027-02-01T00:00:00Z\"\n";
    let sj: SingletonJob = serde_yaml::from_str(&sj_yaml("backwards", "0 * * * *", extra))?;
    let refused = env.sjs().create(&PostParams::default(), &sj).await;
    let msg = format!("{refused:?}");
    ensure(
        &env,
        refused.is_err() && msg.contains("startAt must not be after endAt"),
        ("startAt after endAt refused", &msg),
    )
    .await?;
    // A yearly schedule whose one instant lies outside the bounds: accepted, but the object says
    // nothing will run, and nothing does.
    let extra = "  startAt: \"2030-02-01T00:00:00Z\"\n  endAt: \"2030-11-01T00:00:00Z\"\n";
    env.create_sj(&sj_yaml("never", "0 0 1 1 *", extra)).await?;
    let sj = env
        .wait_for("NoPeriodInBounds", Duration::from_secs(30), || async {
            let sj = env.get_sj("never").await?;
            let said = reason_is(&sj, "ScheduleValid", "False", "NoPeriodInBounds")
                && reason_is(&sj, "Ended", "True", "NoPeriodInBounds");
            Ok(said.then_some(sj))
        })
        .await?;
    let warned = wait_event(&env, "NoPeriodInBounds").await?;
    let (_, _, message) = condition(&sj, "ScheduleValid").unwrap_or_default();
    ensure(
        &env,
        warned.len() == 1
            && message.contains("nothing will run")
            && env.job_list().await?.is_empty(),
        (
            "a clear condition and Event, no Job",
            &message,
            warned.len(),
        ),
    )
    .await?;
    // A suspension without suspend: refused.
    let extra = "  suspension:\n    reason: freeze\n";
    let sj: SingletonJob = serde_yaml::from_str(&sj_yaml("half", "0 * * * *", extra))?;
    let refused = format!("{:?}", env.sjs().create(&PostParams::default(), &sj).await);
    ensure(
        &env,
        refused.contains("set suspend: true with it"),
        ("suspension without suspend refused", &refused),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn suspend_until_skips_its_periods_and_resumes_by_itself() -> Result<()> {
    let mut env = Env::new("pause-until").await?;
    env.start_controller(&[]).await?;
    let ns = env.ns.clone();
    env.create_sj(&sj_yaml("p", "* * * * * *", "  concurrencyPolicy: Allow\n  successfulJobsHistoryLimit: 100\n  failedJobsHistoryLimit: 100\n"))
        .await?;
    env.wait_for("a first run", Duration::from_secs(30), || async {
        Ok((!env.job_list().await?.is_empty()).then_some(()))
    })
    .await?;

    // --until in the past: refused by the plugin, nothing written.
    let past = Timestamp::now() - SignedDuration::from_secs(60);
    let out = plugin(
        &["suspend", "p", "-n", &ns, "--until", &past.to_string()],
        &[],
    )?;
    let sj = env.get_sj("p").await?;
    ensure(
        &env,
        !out.status.success()
            && stderr(&out).contains("is not in the future")
            && sj.spec.suspend != Some(true),
        ("--until in the past refused", stderr(&out)),
    )
    .await?;

    let asked = Timestamp::now();
    let until = whole_second_in(8);
    let until_arg = until.to_string();
    let args = [
        "suspend",
        "p",
        "-n",
        &ns,
        "--until",
        &until_arg,
        "--reason",
        "finance freeze",
    ];
    let out = plugin(&args, &[])?;
    let sj = env.get_sj("p").await?;
    let suspension = sj.spec.suspension.clone().unwrap_or_default();
    ensure(
        &env,
        out.status.success()
            && sj.spec.suspend == Some(true)
            && suspension.until.as_ref().map(|t| t.0) == Some(until)
            && suspension.reason.as_deref() == Some("finance freeze")
            && suspension.by.is_some(),
        (
            "suspended until, with who and why",
            stdout(&out),
            stderr(&out),
            &suspension,
        ),
    )
    .await?;

    // It resumes by itself at `until` and says so; the spec no longer holds the suspension.
    env.wait_for("the automatic resume", Duration::from_secs(40), || async {
        let sj = env.get_sj("p").await?;
        let resumed = sj.spec.suspend == Some(false) && sj.spec.suspension.is_none();
        Ok(resumed.then_some(()))
    })
    .await?;
    env.wait_for("a run after the end", Duration::from_secs(30), || async {
        let ran = periods(&env.job_list().await?);
        Ok(ran.iter().any(|t| *t >= until).then_some(()))
    })
    .await?;
    let resumed = wait_event(&env, "SuspensionEnded").await?;
    // No Job for a period in the freeze (a second of slack before it: the suspend's own write
    // may land just after a period started), and those periods are Skipped with the reason.
    let ran = periods(&env.job_list().await?);
    let frozen: Vec<&Timestamp> = ran
        .iter()
        .filter(|t| **t > asked + SignedDuration::from_secs(1) && **t < until)
        .collect();
    let sj = env.get_sj("p").await?;
    let history = sj.status.clone().unwrap_or_default().history;
    let skipped: u64 = history
        .iter()
        .filter(|h| h.outcome == Outcome::Skipped && h.reason.as_deref() == Some("Suspended"))
        .filter(|h| {
            h.message
                .as_deref()
                .is_some_and(|m| m.contains("finance freeze"))
        })
        .map(|h| h.count)
        .sum();
    ensure(
        &env,
        frozen.is_empty() && skipped >= 5 && resumed.len() == 1,
        (
            "nothing ran in the freeze, its periods Skipped with the reason",
            &frozen,
            skipped,
            resumed
                .iter()
                .map(|e| (e.message.clone(), e.count, e.metadata.name.clone()))
                .collect::<Vec<_>>(),
            &history,
        ),
    )
    .await?;
    Ok(())
}
