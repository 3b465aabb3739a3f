//! Scheduling semantics end to end: concurrency policies, suspend/resume, catch-up after an
//! outage, schedule edits, a half-done claim finished after a restart, and bad specs.
//!
//! Seconds-level schedules keep these fast. A Job that must stay active gets a nodeSelector no
//! node matches, so its pod stays Pending and the Job never finishes.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Result;
use e2e::observer::released_at;
use e2e::{Env, Observer, ensure, periods, sj_yaml};
use jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use singleton::api::{Outcome, RunRef, SingletonJob};

/// A SingletonJob whose Jobs never finish (their pods never get a node).
fn stuck_yaml(name: &str, schedule: &str, extra_spec: &str) -> String {
    e2e::never_scheduled(sj_yaml(name, schedule, extra_spec))
}

fn history_has(sj: &SingletonJob, outcome: Outcome, reason: Option<&str>) -> bool {
    sj.status.as_ref().is_some_and(|s| {
        s.history
            .iter()
            .any(|h| h.outcome == outcome && (reason.is_none() || h.reason.as_deref() == reason))
    })
}

#[tokio::test]
async fn forbid_never_runs_two_at_once() -> Result<()> {
    let mut env = Env::new("forbid").await?;
    env.start_controller(&[]).await?;
    env.create_sj(&stuck_yaml(
        "f",
        "*/2 * * * * *",
        "  concurrencyPolicy: Forbid\n",
    ))
    .await?;
    env.wait_for("the first Job", Duration::from_secs(30), || async {
        Ok((!env.job_list().await?.is_empty()).then_some(()))
    })
    .await?;
    // Several more periods fall due while the first run is active: none may start.
    let t0 = Timestamp::now();
    env.wait_for(
        "three more periods to pass",
        Duration::from_secs(30),
        || async {
            let sj = env.get_sj("f").await?;
            let waited = Timestamp::now().duration_since(t0) > SignedDuration::from_secs(6);
            Ok((waited && sj.status.is_some()).then_some(()))
        },
    )
    .await?;
    let jobs = env.job_list().await?;
    ensure(
        &env,
        jobs.len() == 1,
        ("Forbid: exactly one Job", jobs.len()),
    )
    .await?;
    let sj = env.get_sj("f").await?;
    ensure(
        &env,
        sj.status.as_ref().is_some_and(|s| s.active.len() == 1),
        "one active run",
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn forbid_with_catch_up_none_skips() -> Result<()> {
    let mut env = Env::new("forbid-skip").await?;
    env.start_controller(&[]).await?;
    env.create_sj(&stuck_yaml(
        "s",
        "*/2 * * * * *",
        "  concurrencyPolicy: Forbid\n  catchUp: None\n",
    ))
    .await?;
    env.wait_for(
        "a period Skipped for ConcurrencyForbid",
        Duration::from_secs(30),
        || async {
            let sj = env.get_sj("s").await?;
            Ok(history_has(&sj, Outcome::Skipped, Some("ConcurrencyForbid")).then_some(()))
        },
    )
    .await?;
    let jobs = env.job_list().await?;
    ensure(&env, jobs.len() == 1, ("one Job", jobs.len())).await?;
    Ok(())
}

#[tokio::test]
async fn replace_deletes_the_old_run_before_the_new_one() -> Result<()> {
    let mut env = Env::new("replace").await?;
    env.start_controller(&[]).await?;
    let watch = Observer::watch(env.client.clone(), &env.ns).await?;
    env.create_sj(&stuck_yaml(
        "r",
        "*/2 * * * * *",
        "  concurrencyPolicy: Replace\n",
    ))
    .await?;
    // Two runs Replaced, and three seen running: on a loaded machine a run can be replaced
    // before it was resumed (it never ran), so the first two Replaced need not be two that ran.
    let sj = env
        .wait_for(
            "two runs Replaced and three seen running",
            Duration::from_secs(40),
            || async {
                let sj = env.get_sj("r").await?;
                let n = sj.status.as_ref().map_or(0, |s| {
                    s.history
                        .iter()
                        .filter(|h| h.outcome == Outcome::Replaced)
                        .count()
                });
                let ran = watch.jobs().into_iter().filter(|j| j.ran).count();
                Ok((n >= 2 && ran >= 3).then_some(sj))
            },
        )
        .await?;
    let status = sj.status.unwrap_or_default();
    ensure(
        &env,
        status.active.len() == 1,
        ("one active run", &status.active),
    )
    .await?;
    // Tokens of replaced runs are below the active run's token.
    let active_token = status.active[0].token;
    for h in status
        .history
        .iter()
        .filter(|h| h.outcome == Outcome::Replaced)
    {
        ensure(
            &env,
            h.token.unwrap_or(u64::MAX) < active_token,
            ("replaced token is older", h.token, active_token),
        )
        .await?;
    }
    // The old Jobs are gone (or going): at most the active one and one being deleted remain.
    let live: Vec<_> = env
        .job_list()
        .await?
        .into_iter()
        .filter(|j| j.metadata.deletion_timestamp.is_none())
        .collect();
    ensure(&env, live.len() <= 2, ("old Jobs deleted", live.len())).await?;
    // From outside: each run (no backstop to fence the old one) started only once the run it
    // replaced was gone, as the watch saw them.
    let mut runs: Vec<_> = watch.jobs().into_iter().filter(|j| j.ran).collect();
    runs.sort_by_key(|j| j.period);
    let overlaps: Vec<_> = runs
        .windows(2)
        .filter(|w| !matches!((w[0].deleted, w[1].ran_at), (Some(gone), Some(ran)) if gone <= ran))
        .map(|w| (&w[0].name, w[0].deleted, &w[1].name, w[1].ran_at))
        .collect();
    ensure(
        &env,
        runs.len() >= 3 && overlaps.is_empty() && watch.relists() == 0,
        (
            "each run started after the one it replaced was gone",
            runs.len(),
            &overlaps,
        ),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn allow_overlaps_runs() -> Result<()> {
    let mut env = Env::new("allow").await?;
    env.start_controller(&[]).await?;
    env.create_sj(&stuck_yaml(
        "a",
        "*/2 * * * * *",
        "  concurrencyPolicy: Allow\n",
    ))
    .await?;
    env.wait_for(
        "three overlapping active runs",
        Duration::from_secs(40),
        || async {
            let sj = env.get_sj("a").await?;
            Ok(sj
                .status
                .as_ref()
                .is_some_and(|s| s.active.len() >= 3)
                .then_some(()))
        },
    )
    .await?;
    let ps = periods(&env.job_list().await?);
    let distinct: BTreeSet<_> = ps.iter().collect();
    ensure(
        &env,
        distinct.len() == ps.len(),
        ("one Job per period", &ps),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn suspend_and_resume_with_catch_up_none_fires_nothing_old() -> Result<()> {
    let mut env = Env::new("suspend").await?;
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml(
        "p",
        "*/2 * * * * *",
        "  suspend: true\n  catchUp: None\n",
    ))
    .await?;
    env.wait_for(
        "periods Skipped while suspended",
        Duration::from_secs(30),
        || async {
            let sj = env.get_sj("p").await?;
            let n: u64 = sj.status.as_ref().map_or(0, |s| {
                s.history
                    .iter()
                    .filter(|h| h.reason.as_deref() == Some("Suspended"))
                    .map(|h| h.count)
                    .sum()
            });
            Ok((n >= 2).then_some(()))
        },
    )
    .await?;
    ensure(
        &env,
        env.job_list().await?.is_empty(),
        "no Job while suspended",
    )
    .await?;
    let sj = env.get_sj("p").await?;
    ensure(
        &env,
        singleton::record::conditions::is_true(
            &sj.status.clone().unwrap_or_default().conditions,
            "Suspended",
        ),
        "Suspended condition",
    )
    .await?;

    let resumed = Timestamp::now();
    let patch = serde_json::json!({"spec": {"suspend": false}});
    env.sjs()
        .patch("p", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    env.wait_for("a run after resume", Duration::from_secs(30), || async {
        Ok((!env.job_list().await?.is_empty()).then_some(()))
    })
    .await?;
    let ps = periods(&env.job_list().await?);
    // Date-header resolution: a period in the second before the patch could be "now" at resume.
    let bound = resumed - SignedDuration::from_secs(1);
    ensure(
        &env,
        ps.iter().all(|p| *p >= bound),
        ("no period from the suspended interval ran", &ps, resumed),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn catch_up_all_runs_every_period_missed_while_the_controller_was_down() -> Result<()> {
    let mut env = Env::new("catchup").await?;
    let c = env.start_controller(&[]).await?;
    // Counted from a watch started before the first Job: the list shows only what the history
    // limit (3) keeps, so a fast run would have pruned the periods to be counted.
    let watch = Observer::watch(env.client.clone(), &env.ns).await?;
    let ran = |watch: &Observer| -> Vec<Timestamp> {
        let ps: BTreeSet<Timestamp> = watch
            .jobs()
            .iter()
            .filter(|j| j.ran)
            .filter_map(|j| j.period)
            .collect();
        ps.into_iter().collect()
    };
    env.create_sj(&sj_yaml(
        "c",
        "*/2 * * * * *",
        "  catchUp: All\n  concurrencyPolicy: Allow\n",
    ))
    .await?;
    env.wait_for("the first run", Duration::from_secs(30), || async {
        Ok((!ran(&watch).is_empty()).then_some(()))
    })
    .await?;
    // The fault (a fixed sleep on purpose): the controller is down across several periods.
    env.stop_controller(c, true).await?;
    let down_at = Timestamp::now();
    tokio::time::sleep(Duration::from_secs(9)).await;
    env.start_controller(&[]).await?;
    let want_through = down_at + SignedDuration::from_secs(9);
    let ps = env
        .wait_for(
            "every missed period run",
            Duration::from_secs(60),
            || async {
                let ps = ran(&watch);
                Ok(ps.last().is_some_and(|l| *l >= want_through).then_some(ps))
            },
        )
        .await?;
    ensure(
        &env,
        watch.second_runs().is_empty() && watch.relists() == 0,
        (
            "no period with two Jobs that ran",
            watch.second_runs(),
            watch.relists(),
        ),
    )
    .await?;
    // Consecutive 2-second periods from before the outage to past its end: none lost.
    for w in ps.windows(2) {
        ensure(
            &env,
            w[1].duration_since(w[0]) == SignedDuration::from_secs(2),
            ("gap", w),
        )
        .await?;
    }
    ensure(
        &env,
        ps.first().is_some_and(|f| *f <= down_at),
        ("the periods reach back before the outage", &ps, down_at),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_schedule_edit_never_fires_retroactively() -> Result<()> {
    let mut env = Env::new("edit").await?;
    env.start_controller(&[]).await?;
    // Yearly, with catchUp All: if an edit counted from creation, every second since would run.
    env.create_sj(&sj_yaml(
        "e",
        "0 0 1 1 *",
        "  catchUp: All\n  concurrencyPolicy: Allow\n",
    ))
    .await?;
    env.wait_for(
        "the controller to see it",
        Duration::from_secs(30),
        || async {
            let sj = env.get_sj("e").await?;
            Ok(sj
                .status
                .as_ref()
                .and_then(|s| s.decided_through.clone())
                .map(|_| ()))
        },
    )
    .await?;
    // The scenario itself (a fixed sleep on purpose): time passes under the old schedule; an
    // edit that counted from creation (kubernetes#63371) would now owe the new schedule's
    // periods since then.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let edited = Timestamp::now();
    let patch = serde_json::json!({"spec": {"schedule": "*/2 * * * * *"}});
    env.sjs()
        .patch("e", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    env.wait_for(
        "a run under the new schedule",
        Duration::from_secs(30),
        || async { Ok((!env.job_list().await?.is_empty()).then_some(())) },
    )
    .await?;
    let ps = periods(&env.job_list().await?);
    ensure(
        &env,
        ps.iter().all(|p| *p >= edited),
        ("no period before the edit", &ps, edited),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_claim_whose_job_was_never_created_is_completed_after_a_restart() -> Result<()> {
    let mut env = Env::new("pending").await?;
    // No controller yet: write the state a claimer leaves when it dies between claim and create.
    let sj = env.create_sj(&sj_yaml("k", "0 0 1 1 *", "")).await?;
    let period: Timestamp = "2027-01-01T00:00:00Z".parse()?;
    let claim = RunRef {
        unknown: Default::default(),
        late: false,
        period: period.into(),
        token: 7,
        job_name: singleton::naming::job_name("k", period),
        claimed_at: Some(Timestamp::now().into()),
        job_uid: None,
        origin: None,
        requested_by: None,
        supersedes: None,
        replaces: Vec::new(),
        resume_at: None,
        basis: None,
    };
    let mut obj = sj.clone();
    let mut status = obj.status.clone().unwrap_or_default();
    status.fencing_token = 7;
    status.pending_claim = Some(claim.clone());
    status.decided_through = Some(period.into());
    status.schedule_fingerprint = Some(singleton::decide::fingerprint(&sj.spec));
    obj.status = Some(status);
    env.sjs()
        .replace_status("k", &PostParams::default(), &obj)
        .await?;

    env.start_controller(&[]).await?;
    let job = env
        .wait_for("the claimed Job", Duration::from_secs(30), || async {
            Ok(env
                .job_list()
                .await?
                .into_iter()
                .find(|j| j.name_any() == claim.job_name))
        })
        .await?;
    ensure(
        &env,
        job.annotations()
            .get("singleton.dev/fencing-token")
            .map(String::as_str)
            == Some("7"),
        "same token",
    )
    .await?;
    env.wait_for(
        "the claim moved to active/history",
        Duration::from_secs(30),
        || async {
            let s = env.get_sj("k").await?.status.unwrap_or_default();
            Ok((s.pending_claim.is_none()
                && s.fencing_token == 7
                && s.history.iter().any(|h| h.token == Some(7)))
            .then_some(()))
        },
    )
    .await?;
    ensure(&env, env.job_list().await?.len() == 1, "exactly one Job").await?;
    Ok(())
}

#[tokio::test]
async fn a_bad_spec_gets_a_condition_and_does_not_disturb_a_good_one() -> Result<()> {
    let mut env = Env::new("bad").await?;
    env.start_controller(&[]).await?;
    // What CEL can express is refused at apply time, with a clear message.
    let err = env
        .create_sj(&sj_yaml("cel", "* *", ""))
        .await
        .expect_err("two fields must be refused");
    ensure(
        &env,
        err.to_string().contains("5 fields"),
        ("CEL message", err.to_string()),
    )
    .await?;
    let err = env
        .create_sj(&sj_yaml("tz", "* * * * *", "  timeZone: \"not a zone!\"\n"))
        .await
        .expect_err("bad zone syntax");
    ensure(
        &env,
        err.to_string().contains("IANA"),
        ("CEL message", err.to_string()),
    )
    .await?;

    // The rest is the controller's: a condition and an Event, and the good one keeps running.
    env.create_sj(&sj_yaml("bad-cron", "61 * * * *", ""))
        .await?;
    env.create_sj(&sj_yaml(
        "bad-zone",
        "* * * * *",
        "  timeZone: Mars/Olympus_Mons\n",
    ))
    .await?;
    env.create_sj(&sj_yaml("good", "*/2 * * * * *", "")).await?;
    for (name, needle) in [("bad-cron", "61"), ("bad-zone", "Mars/Olympus_Mons")] {
        env.wait_for(
            &format!("{name} ScheduleValid=False"),
            Duration::from_secs(30),
            || async {
                let s = env.get_sj(name).await?.status.unwrap_or_default();
                Ok(s.conditions
                    .iter()
                    .any(|c| {
                        c.type_ == "ScheduleValid"
                            && c.status == "False"
                            && c.message.contains(needle)
                    })
                    .then_some(()))
            },
        )
        .await?;
    }
    env.wait_for(
        "two runs of the good one",
        Duration::from_secs(30),
        || async {
            let n = env
                .job_list()
                .await?
                .iter()
                .filter(|j| j.name_any().starts_with("good-"))
                .count();
            Ok((n >= 2).then_some(()))
        },
    )
    .await?;
    ensure(
        &env,
        env.job_list()
            .await?
            .iter()
            .all(|j| j.name_any().starts_with("good-")),
        "no Job for a bad spec",
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn history_limits_prune_finished_jobs_and_every_outcome_has_an_event() -> Result<()> {
    let mut env = Env::new("history").await?;
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml(
        "h",
        "*/2 * * * * *",
        "  successfulJobsHistoryLimit: 1\n",
    ))
    .await?;
    // Four successful runs recorded...
    env.wait_for(
        "four Succeeded runs in history",
        Duration::from_secs(60),
        || async {
            let sj = env.get_sj("h").await?;
            let n = sj.status.as_ref().map_or(0, |s| {
                s.history
                    .iter()
                    .filter(|h| h.outcome == Outcome::Succeeded)
                    .count()
            });
            Ok((n >= 4).then_some(()))
        },
    )
    .await?;
    // ...while at most one finished Job is kept (plus, at most, the one running now).
    env.wait_for(
        "finished Jobs pruned to the limit",
        Duration::from_secs(30),
        || async {
            let finished = env
                .job_list()
                .await?
                .into_iter()
                .filter(|j| j.metadata.deletion_timestamp.is_none())
                .filter(|j| j.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0) > 0)
                .count();
            Ok((finished <= 1).then_some(()))
        },
    )
    .await?;
    // An Event for each start and each outcome.
    let events: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(env.client.clone(), &env.ns);
    let reasons: Vec<String> = events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    for want in ["RunStarted", "RunSucceeded"] {
        ensure(
            &env,
            reasons.iter().any(|r| r == want),
            ("event", want, &reasons),
        )
        .await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_controller_whose_clock_disagrees_with_the_api_server_starts_nothing() -> Result<()> {
    let mut env = Env::new("clock").await?;
    // This controller's clock runs 40 s ahead of the API server's (libfaketime).
    let skewed = env
        .start_controller_with_env(&e2e::skewed_clock("+40s")?, &[])
        .await?;
    env.create_sj(&sj_yaml("k", "*/2 * * * * *", "")).await?;
    let seen = env
        .wait_for(
            "ClockTrusted=False and Ready=False",
            Duration::from_secs(30),
            || async {
                let s = env.get_sj("k").await?.status.unwrap_or_default();
                let untrusted = s.conditions.iter().any(|c| {
                    c.type_ == "ClockTrusted" && c.status == "False" && c.reason == "ClockSkew"
                });
                let unready = s
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "False");
                Ok((untrusted && unready).then_some(Timestamp::now()))
            },
        )
        .await?;
    // Several periods fall due (by either clock): none may start.
    env.wait_for("three periods to pass", Duration::from_secs(20), || async {
        Ok((Timestamp::now().duration_since(seen) > SignedDuration::from_secs(6)).then_some(()))
    })
    .await?;
    ensure(
        &env,
        env.job_list().await?.is_empty(),
        "no Job from a skewed controller",
    )
    .await?;

    // With a correct clock, runs start again.
    env.stop_controller(skewed, false).await?;
    env.start_controller(&[]).await?;
    env.wait_for(
        "a run once the clocks agree",
        Duration::from_secs(30),
        || async { Ok((!env.job_list().await?.is_empty()).then_some(())) },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_controller_whose_clock_is_half_a_second_ahead_never_starts_a_run_early() -> Result<()> {
    let mut env = Env::new("clock-ahead").await?;
    // Within the tolerated skew, so this controller runs; but by its clock (libfaketime) every
    // instant comes half a second before the API server's clock reaches it.
    let skew = e2e::skewed_clock("+0.5s")?;
    // The skew applies: a process started with the same environment runs half a second ahead
    // (otherwise this test would pass without its fault).
    let offset = e2e::clock_offset_under(&skew)?;
    ensure(
        &env,
        (0.3..0.7).contains(&offset),
        ("a process under the skew runs 0.5 s ahead", offset),
    )
    .await?;
    env.start_controller_with_env(&skew, &[]).await?;
    // Allow: each period starts at its instant, none waits for an earlier run to finish.
    env.create_sj(&stuck_yaml(
        "a",
        "*/2 * * * * *",
        "  concurrencyPolicy: Allow\n",
    ))
    .await?;
    const JOBS: usize = 6;
    let jobs = env
        .wait_for(&format!("{JOBS} Jobs"), Duration::from_secs(60), || async {
            // Let run ones: a prepared run's Job waits suspended for its instant (issue 33).
            let mut jobs = env.job_list().await?;
            jobs.retain(|j| released_at(j).is_some());
            Ok((jobs.len() >= JOBS).then_some(jobs))
        })
        .await?;
    // The API server stamps managedFields times by its clock, truncated to the second: a Job it
    // let run (the update that cleared spec.suspend) before its period bears the second before
    // the period's.
    let seen: Vec<(String, Option<Timestamp>, Option<Timestamp>)> = jobs
        .iter()
        .map(|j| {
            let period = j
                .annotations()
                .get("singleton.dev/period")
                .and_then(|p| p.parse().ok());
            (j.name_any(), period, released_at(j))
        })
        .collect();
    println!("(job, period, let run at): {seen:#?}");
    let early: Vec<_> = seen
        .iter()
        .filter(|(_, period, created)| !matches!((period, created), (Some(p), Some(c)) if c >= p))
        .collect();
    ensure(
        &env,
        early.is_empty(),
        (
            "Jobs let run before their period by the API server's clock",
            &early,
            &seen,
        ),
    )
    .await?;
    Ok(())
}

/// `@every` instants come from the epoch plus the offset, not from when a controller started:
/// a restart in between keeps them in the same phase.
#[tokio::test]
async fn every_runs_on_the_epoch_anchored_instants_across_a_restart() -> Result<()> {
    let mut env = Env::new("every").await?;
    let first = env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml(
        "e",
        "@every 3s +1s",
        "  concurrencyPolicy: Allow\n",
    ))
    .await?;
    env.wait_for("two runs", Duration::from_secs(30), || async {
        Ok((periods(&env.job_list().await?).len() >= 2).then_some(()))
    })
    .await?;
    env.stop_controller(first, false).await?;
    env.start_controller(&[]).await?;
    let before = periods(&env.job_list().await?).len();
    env.wait_for(
        "two more runs after the restart",
        Duration::from_secs(30),
        || async { Ok((periods(&env.job_list().await?).len() >= before + 2).then_some(())) },
    )
    .await?;
    let periods = periods(&env.job_list().await?);
    ensure(
        &env,
        periods
            .iter()
            .all(|p| p.as_second() % 3 == 1 && p.subsec_nanosecond() == 0),
        ("every period at 3k + 1 s since the epoch", &periods),
    )
    .await?;
    let distinct: BTreeSet<_> = periods.iter().collect();
    ensure(
        &env,
        distinct.len() == periods.len(),
        ("one Job per period", &periods),
    )
    .await?;
    Ok(())
}

/// The workload is told where its period sits (issue 35, item 4): the schedule's periods before
/// and after it, the SingletonJob's time zone, the period's local date there and its key, on
/// every container of the Job the API server stored. Asia/Kolkata's +05:30 makes a UTC value
/// where a local one belongs show.
#[tokio::test]
async fn the_workload_is_told_its_period_window() -> Result<()> {
    let mut env = Env::new("window").await?;
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml("w", "*/5 * * * * *", "  timeZone: Asia/Kolkata\n"))
        .await?;
    let job = env
        .wait_for("the first Job", Duration::from_secs(30), || async {
            Ok(env.job_list().await?.into_iter().next())
        })
        .await?;
    let container = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| p.containers[0].clone())
        .unwrap_or_default();
    let env_of = |name: &str| {
        container
            .env
            .iter()
            .flatten()
            .find(|v| v.name == name)
            .and_then(|v| v.value.clone())
    };
    let period: Timestamp = env_of("SINGLETON_PERIOD").unwrap_or_default().parse()?;
    let kolkata = jiff::tz::TimeZone::get("Asia/Kolkata")?;
    let local = period.to_zoned(kolkata);
    let five = SignedDuration::from_secs(5);
    let want = [
        ("SINGLETON_PREVIOUS_PERIOD", (period - five).to_string()),
        ("SINGLETON_NEXT_PERIOD", (period + five).to_string()),
        ("SINGLETON_TIME_ZONE", "Asia/Kolkata".to_string()),
        ("SINGLETON_BUSINESS_DATE", local.date().to_string()),
        ("SINGLETON_PERIOD_KEY", local.to_string()),
    ];
    for (name, value) in want {
        ensure(
            &env,
            env_of(name).as_deref() == Some(value.as_str()),
            (name, env_of(name), value, &container.env),
        )
        .await?;
    }
    Ok(())
}
