//! Several schedules, excluded days, SingletonCalendars and jitter against the real API server:
//! every way to produce a period goes through the same cursor, claim and token, and every period
//! is decided once with an outcome and a reason.
//!
//! Excluded days are whole days, so these tests exclude a range around today (UTC) rather than
//! wait for a weekend: the range covers yesterday to tomorrow, so a test that runs across
//! midnight sees the same exclusions.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Result;
use e2e::observer::released_at;
use e2e::{Env, ensure, periods, sj_yaml};
use jiff::{SignedDuration, Timestamp, ToSpan};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use singleton::api::{Outcome, SingletonCalendar, SingletonJob};

/// `YYYY-MM-DD` of today (UTC) moved by `days`.
fn day(days: i64) -> String {
    let today = Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC).date();
    today
        .checked_add(days.days())
        .map(|d| d.to_string())
        .unwrap_or_default()
}

fn excluded_count(sj: &SingletonJob) -> u64 {
    sj.status.as_ref().map_or(0, |s| {
        s.history
            .iter()
            .filter(|h| h.outcome == Outcome::Skipped && h.reason.as_deref() == Some("Excluded"))
            .map(|h| h.count)
            .sum()
    })
}

fn calendars(env: &Env) -> Api<SingletonCalendar> {
    Api::namespaced(env.client.clone(), &env.ns)
}

async fn create_calendar(env: &Env, yaml: &str) -> Result<()> {
    let cal: SingletonCalendar = serde_yaml::from_str(yaml)?;
    calendars(env).create(&PostParams::default(), &cal).await?;
    Ok(())
}

#[tokio::test]
async fn several_schedules_run_their_union_with_one_job_per_instant() -> Result<()> {
    let mut env = Env::new("schedules").await?;
    env.start_controller(&[]).await?;
    let yaml = sj_yaml("u", "", "  concurrencyPolicy: Allow\n").replace(
        "  schedule: \"\"\n",
        "  schedules: [\"*/4 * * * * *\", \"*/6 * * * * *\", \"*/4 * * * * *\"]\n",
    );
    env.create_sj(&yaml).await?;
    // Wait until a multiple of 12 s (both schedules' instant) has passed with runs around it.
    let got = env
        .wait_for(
            "runs across a shared instant",
            Duration::from_secs(45),
            || async {
                let p = periods(&env.job_list().await?);
                let shared = p.iter().position(|t| t.as_second() % 12 == 0);
                Ok(shared.filter(|i| *i >= 1 && *i + 1 < p.len()).map(|_| p))
            },
        )
        .await?;
    let distinct: BTreeSet<_> = got.iter().collect();
    ensure(
        &env,
        distinct.len() == got.len(),
        ("one Job per instant", &got),
    )
    .await?;
    ensure(
        &env,
        got.iter()
            .all(|t| t.as_second() % 4 == 0 || t.as_second() % 6 == 0),
        ("every period is an instant of one of the schedules", &got),
    )
    .await?;
    // Between the first and last Job, no instant of the union was passed over.
    let (first, last) = (got[0].as_second(), got[got.len() - 1].as_second());
    let union: Vec<i64> = (first..=last)
        .filter(|s| s % 4 == 0 || s % 6 == 0)
        .collect();
    let seconds: Vec<i64> = got.iter().map(|t| t.as_second()).collect();
    ensure(
        &env,
        seconds == union,
        ("the union, in order", &seconds, &union),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn schedule_and_schedules_together_are_refused_by_the_api_server() -> Result<()> {
    let env = Env::new("schedules-bad").await?;
    let yaml = sj_yaml("both", "* * * * *", "  schedules: [\"0 * * * *\"]\n");
    let err = env
        .create_sj(&yaml)
        .await
        .expect_err("both fields must be refused");
    ensure(
        &env,
        err.to_string()
            .contains("set exactly one of schedule and schedules"),
        ("the message says what to do", err.to_string()),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn periods_on_excluded_days_are_skipped_and_recorded_or_moved_to_the_next_allowed_day()
-> Result<()> {
    let mut env = Env::new("exclusions").await?;
    env.start_controller(&[]).await?;
    let range = format!(
        "  exclusions:\n    ranges: [{{from: \"{}\", to: \"{}\"}}]\n",
        day(-1),
        day(1)
    );
    env.create_sj(&sj_yaml(
        "skip",
        "*/2 * * * * *",
        &format!("  concurrencyPolicy: Allow\n{range}"),
    ))
    .await?;
    env.create_sj(&sj_yaml(
        "shift",
        "*/2 * * * * *",
        &format!("  concurrencyPolicy: Allow\n{range}    action: NextAllowedDay\n"),
    ))
    .await?;
    let skipped = env
        .wait_for(
            "excluded periods recorded",
            Duration::from_secs(30),
            || async {
                let sj = env.get_sj("skip").await?;
                Ok((excluded_count(&sj) >= 3).then_some(sj))
            },
        )
        .await?;
    let status = skipped.status.clone().unwrap_or_default();
    // nextScheduleTimes show when periods run: none today or tomorrow.
    let after = format!("{}T00:00:00Z", day(2));
    let after: Timestamp = after.parse()?;
    ensure(
        &env,
        status.next_schedule_times.iter().all(|t| t.0 >= after),
        (
            "next times after the excluded days",
            &status.next_schedule_times,
        ),
    )
    .await?;
    // The shifted job's periods are the same wall time two days on: nothing runs now, and its
    // next times are the day after tomorrow, two seconds apart, from midnight.
    let next = env
        .wait_for(
            "the shifted job's next times",
            Duration::from_secs(30),
            || async {
                let next = env.get_sj("shift").await?.status.unwrap_or_default();
                Ok((!next.next_schedule_times.is_empty()).then_some(next.next_schedule_times))
            },
        )
        .await?;
    ensure(
        &env,
        next.len() == 3 && next[0].0 == after && next[1].0 == after + SignedDuration::from_secs(2),
        ("shifted next times", &next),
    )
    .await?;
    ensure(
        &env,
        env.job_list().await?.is_empty(),
        "no Job on an excluded day",
    )
    .await?;
    // `kubectl singleton schedule sj/NAME` shows the same: skipped days, shifted instants.
    let skip = preview(&env, "sj/skip")?;
    ensure(
        &env,
        skip.lines().count() == 3 && skip.lines().all(|l| l.ends_with(" skipped (excluded day)")),
        ("the preview marks excluded periods", &skip),
    )
    .await?;
    let shift = preview(&env, "sj/shift")?;
    let first = after.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    ensure(
        &env,
        shift.lines().next().is_some_and(|l| l.starts_with(&first)),
        ("the preview shows the shifted instants", &shift, &first),
    )
    .await?;
    Ok(())
}

/// `kubectl singleton schedule <arg> --namespace <test's> -n 3`'s output.
fn preview(env: &Env, arg: &str) -> Result<String> {
    let out = e2e::plugin(&["schedule", arg, "--namespace", &env.ns, "-n", "3"], &[])?;
    anyhow::ensure!(out.status.success(), "{}", e2e::stderr(&out));
    Ok(e2e::stdout(&out))
}

#[tokio::test]
async fn a_calendar_excludes_days_for_the_jobs_that_name_it_and_its_edits_never_fire_the_past()
-> Result<()> {
    let mut env = Env::new("calendar").await?;
    env.start_controller(&[]).await?;
    // Named before it exists: no run, and the condition says which calendar is missing.
    env.create_sj(&sj_yaml(
        "c",
        "*/2 * * * * *",
        "  concurrencyPolicy: Allow\n  exclusions:\n    calendars: [holidays]\n",
    ))
    .await?;
    env.wait_for(
        "the missing calendar named",
        Duration::from_secs(20),
        || async {
            let sj = env.get_sj("c").await?;
            let named = sj.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.status == "False" && c.message.contains("\"holidays\""))
            });
            Ok(named.then_some(()))
        },
    )
    .await?;
    ensure(
        &env,
        env.job_list().await?.is_empty(),
        "no run without its calendar",
    )
    .await?;

    create_calendar(
        &env,
        &format!(
            "apiVersion: singleton.dev/v1alpha1\nkind: SingletonCalendar\nmetadata:\n  name: holidays\nspec:\n  description: test days\n  ranges: [{{from: \"{}\", to: \"{}\"}}]\n",
            day(-1),
            day(1)
        ),
    )
    .await?;
    env.wait_for(
        "periods skipped by the calendar",
        Duration::from_secs(30),
        || async {
            let sj = env.get_sj("c").await?;
            Ok((excluded_count(&sj) >= 2).then_some(()))
        },
    )
    .await?;
    ensure(
        &env,
        env.job_list().await?.is_empty(),
        "no Job on a calendar day",
    )
    .await?;

    // The edit frees today: runs start from the moment it is seen, never for earlier periods.
    let edited_at = Timestamp::now();
    let patch = serde_json::json!({"spec": {"ranges": [{"from": day(5), "to": day(6)}]}});
    calendars(&env)
        .patch("holidays", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let got = env
        .wait_for("runs after the edit", Duration::from_secs(30), || async {
            let p = periods(&env.job_list().await?);
            Ok((p.len() >= 2).then_some(p))
        })
        .await?;
    ensure(
        &env,
        got.iter()
            .all(|p| *p >= edited_at - SignedDuration::from_secs(1)),
        ("no period from before the edit ran", edited_at, &got),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn jitter_delays_each_start_by_its_periods_offset_and_next_times_show_it() -> Result<()> {
    let mut env = Env::new("jitter").await?;
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml(
        "j",
        "*/10 * * * * *",
        "  concurrencyPolicy: Allow\n  jitterSeconds: 8\n",
    ))
    .await?;
    let key = format!("{}/j", env.ns);
    let jobs = env
        .wait_for("three jittered runs", Duration::from_secs(60), || async {
            // Started ones: a prepared run's Job waits suspended for its instant (issue 33).
            let mut jobs = env.job_list().await?;
            jobs.retain(|j| released_at(j).is_some());
            Ok((jobs.len() >= 3).then_some(jobs))
        })
        .await?;
    for job in &jobs {
        let period: Timestamp = job
            .annotations()
            .get("singleton.dev/period")
            .map(|p| p.parse())
            .transpose()?
            .unwrap_or_default();
        let started = released_at(job);
        let offset = singleton::schedule::jitter(&key, period, 8);
        // managedFields times have whole seconds: the Job is let run no earlier than the second
        // of its period's start (created suspended, it may exist before).
        let start = period + offset;
        ensure(
            &env,
            started.is_some_and(|c| c.as_second() >= start.as_second()),
            (
                "let run at or after its jittered start",
                period,
                offset,
                started,
            ),
        )
        .await?;
        ensure(
            &env,
            period.as_second() % 10 == 0,
            ("the period keeps its instant", period),
        )
        .await?;
    }
    let sj = env.get_sj("j").await?;
    let next = sj.status.unwrap_or_default().next_schedule_times;
    ensure(
        &env,
        next.iter().all(|t| {
            let instant = Timestamp::from_second(t.0.as_second() / 10 * 10).unwrap_or_default();
            // Status times have whole seconds.
            let start = instant + singleton::schedule::jitter(&key, instant, 8);
            t.0.as_second() == start.as_second()
        }),
        ("next times are the jittered starts", &next),
    )
    .await?;
    let lines = preview(&env, "sj/j")?;
    ensure(
        &env,
        lines.lines().count() == 3 && lines.lines().all(|l| l.contains(" starts ")),
        ("the preview shows each period's jittered start", &lines),
    )
    .await?;
    Ok(())
}
