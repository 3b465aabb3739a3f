//! Prepared runs, end to end (issue 33, docs/design/prepared-runs.md §1 to §4): with a lead set
//! (`spec.prepareLeadSeconds`), the controller itself prepares a SingletonJob's next period ahead
//! of its instant `R` (claim, suspended Job annotated `singleton.dev/released: "false"` and
//! `singleton.dev/resume-at: R`, confirm into `status.prepared`) and starts it at `R` with one
//! request, never before; an edit before `R` withdraws it and the period is then decided as
//! without preparation. (tests/prepared.rs crafts prepared runs as a preparing release writes
//! them; here the controller prepares them.)
//!
//! What a user cares about, each in its own namespace: the run is ready before its instant and
//! starts at it, never before (by the API server's clock: the `managedFields` time of the update
//! that cleared `spec.suspend`, whole seconds); a `suspend` or a template edit just before the
//! instant wins (the prepared Job never runs, and the period is Skipped, or runs once with the
//! new template); a crash right after the preparation loses nothing and starts nothing early; a
//! lead longer than the interval is clamped and said. Every test also checks, from a watch of
//! its namespace's Jobs that keeps every state each Job went through: no Job was unsuspended
//! before its instant, only the controller's release started one, a Job marked withdrawn never
//! ran, and no period had two Jobs that ran.
//!
//! Schedule: every 20 s (`*/20 * * * * *`, no jitter), lead 12 s. Each SingletonJob is created at
//! least 15 s before its first instant, so the first period is prepared with the full lead;
//! each test takes under a minute and a half.
//!
//! The harness (the controllers, the readers, the Job watch) is shared with tests/prepared.rs:
//! `e2e::prepared_runs`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context as _, Result};
use e2e::prepared_runs::{
    JobWatch, Replicas, SJ, Seen, annotation, explained, held_back, hold_job, leader, logged,
    marked_withdrawn, never_allowed_to_run, no_pod, period_of, release_job, released_job,
    start_replicas, status, until,
};
use e2e::{Env, ensure, events_with_reason, metric, sj_yaml};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use singleton::api::{Outcome, SingletonJobStatus};
use singleton::failpoint;
use singleton::naming::{self, ANNOTATION_RELEASED, ANNOTATION_RESUME_AT};

/// Its schedule, and the seconds between its instants.
const SCHEDULE: &str = "*/20 * * * * *";
const EVERY: i64 = 20;
/// `spec.prepareLeadSeconds` of most tests.
const LEAD: i64 = 12;
/// The edited template's command (test 3).
const EDITED: &str = "echo edited $SINGLETON_FENCING_TOKEN";

/// The SingletonJob: every 20 s, prepared `lead` seconds ahead; `extra` more spec lines.
fn spec_yaml(lead: i64, extra: &str) -> String {
    sj_yaml(
        SJ,
        SCHEDULE,
        &format!("  prepareLeadSeconds: {lead}\n{extra}"),
    )
}

// ---- The tests ----

/// A run is prepared ahead and started at its instant, never before: before `R` its Job exists,
/// suspended, not released, annotated with `R`, and `status.prepared` names it (uid, token,
/// resumeAt) with `decidedThrough` short of its period and `runCount` counting it; the Job is
/// unsuspended and released with its token no earlier than `R` by the API server's clock (and
/// not long after); then `status.prepared` is empty, the run is active or in the history with
/// its period, `decidedThrough` is its period, `runCount` counted it once, one `RunStarted`
/// Event; exactly one Job for each period, none withdrawn; the `Preparation` condition True,
/// Enabled; the metric counted it Prepared and Resumed.
#[tokio::test]
async fn a_run_is_prepared_ahead_and_started_at_its_instant_never_before() -> Result<()> {
    let w = World::start("preparing-ahead", &spec_yaml(LEAD, ""), Replicas::One, true).await?;
    let result = prepared_and_started(&w).await;
    w.explained(result).await
}

async fn prepared_and_started(w: &World) -> Result<()> {
    let env = &w.env;
    let prep = w
        .next_prepared(SignedDuration::from_secs(3), Duration::from_secs(45))
        .await?;
    w.ready_before_instant(&prep).await?;
    let ahead = prep.r.duration_since(prep.seen_at);
    ensure(
        env,
        ahead >= SignedDuration::from_secs(LEAD - 4),
        (
            "prepared about the lead ahead of its instant (seen prepared that long before)",
            ahead,
            LEAD,
        ),
    )
    .await?;
    env.holds_for(
        "the prepared run kept until 1.5 s before its instant: its Job suspended, not released, \
         status.prepared naming it",
        until(prep.r - SignedDuration::from_millis(1500)),
        || w.still_prepared(&prep),
    )
    .await?;
    w.started_at_instant(&prep, 0).await?;
    w.promoted(&prep).await?;
    w.run_count_counts_runs().await?;
    // The condition says how runs are prepared.
    let st = status(env).await?;
    let cond = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Preparation")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
    ensure(
        env,
        cond.as_ref().is_some_and(|(s, r, m)| {
            s == "True" && r == "Enabled" && m.contains(&format!("prepared {LEAD} s before"))
        }),
        (
            "the Preparation condition True, Enabled, with the lead",
            &cond,
        ),
    )
    .await?;
    // One RunStarted Event for the run.
    let started: Vec<String> = events_with_reason(env, "RunStarted")
        .await?
        .into_iter()
        .filter_map(|e| e.message)
        .filter(|m| m.contains(&prep.job) && m.contains(&format!("token {}", prep.token)))
        .collect();
    ensure(
        env,
        started.len() == 1,
        ("one RunStarted Event naming the run", &started),
    )
    .await?;
    // The metric: prepared, then resumed.
    let ns = env.ns.clone();
    let counts = env
        .wait_for(
            "singleton_prepared_runs_total counting the run Prepared and Resumed",
            Duration::from_secs(15),
            || async {
                let text = env.metrics(0).await?;
                let stage = |s: &str| {
                    metric(
                        &text,
                        "singleton_prepared_runs_total",
                        &[("namespace", &ns), ("name", SJ), ("stage", s)],
                    )
                };
                let (p, r) = (stage("Prepared"), stage("Resumed"));
                Ok((p >= 1.0 && r >= 1.0).then_some((p, r)))
            },
        )
        .await?;
    ensure(
        env,
        counts.1 <= counts.0,
        ("no more runs Resumed than Prepared", counts),
    )
    .await?;
    // No edit: nothing withdrawn, and one Job per period.
    let all = w.watch.all();
    let withdrawn: BTreeSet<&str> = all
        .iter()
        .filter(|x| x.is_withdrawn())
        .map(|x| x.name.as_str())
        .collect();
    ensure(env, withdrawn.is_empty(), ("no Job withdrawn", &withdrawn)).await?;
    let per_period = w.watch.uids_by_period();
    ensure(
        env,
        per_period.values().all(|u| u.len() == 1)
            && per_period.get(&prep.p) == Some(&BTreeSet::from([prep.uid.clone()])),
        ("exactly one Job seen for each period", &per_period),
    )
    .await?;
    w.no_early_or_second_run().await
}

/// `suspend: true` set 4 s before the instant, while the run is prepared, withdraws it: its Job
/// is never unsuspended (nor any pod run), marked `released: withdrawn` with reason Suspended,
/// and deleted; `status.prepared` is cleared and `runCount` given back; one `RunWithdrawn` Event
/// (Normal) names the run. The period is then decided as a suspended SingletonJob's with
/// `catchUp: None` is without preparation (decide/mod.rs, `Pending::decide`: the candidate of a
/// suspended job that will never start it is recorded Skipped, reason Suspended), with the
/// cursor at it; no Job of the period exists after its instant, and no Job is created while
/// suspended.
#[tokio::test]
async fn a_suspend_just_before_the_instant_withdraws_the_prepared_run() -> Result<()> {
    let yaml = spec_yaml(LEAD, "  catchUp: None\n");
    let w = World::start("preparing-suspend", &yaml, Replicas::One, true).await?;
    let result = async {
        let env = &w.env;
        let prep = w
            .next_prepared(SignedDuration::from_secs(6), Duration::from_secs(45))
            .await?;
        w.ready_before_instant(&prep).await?;
        w.edit_just_before(&prep, &Patch::Merge(json!({ "spec": { "suspend": true } })))
            .await?;
        w.withdrawn(&prep, "Suspended", prep.r + SignedDuration::from_secs(10))
            .await?;
        let st = status(env).await?;
        ensure(
            env,
            st.run_count + 1 == prep.st.run_count,
            (
                "runCount given back: while prepared, after the withdrawal",
                prep.st.run_count,
                st.run_count,
            ),
        )
        .await?;
        // The period, decided as without preparation: Skipped (Suspended), the cursor at it.
        let entry = env
            .wait_for(
                "the prepared period recorded Skipped, reason Suspended, decidedThrough at it",
                until(prep.r) + Duration::from_secs(20),
                || async {
                    let st = status(env).await?;
                    let through = st.decided_through.as_ref().map(|t| t.0);
                    let entry = st
                        .history
                        .iter()
                        .find(|h| covers(h, prep.p))
                        .map(|h| (h.outcome, h.reason.clone(), h.token, h.job_name.clone()));
                    Ok(entry.filter(|_| through >= Some(prep.p)))
                },
            )
            .await?;
        ensure(
            env,
            entry == (Outcome::Skipped, Some("Suspended".to_string()), None, None),
            (
                "the period's history entry: Skipped, Suspended, no token, no Job",
                &entry,
            ),
        )
        .await?;
        let st = status(env).await?;
        let runs_of_token: Vec<_> = st
            .history
            .iter()
            .filter(|h| h.token == Some(prep.token))
            .collect();
        ensure(
            env,
            runs_of_token.is_empty() && st.active.is_empty() && st.prepared.is_none(),
            (
                "nothing ran: no history entry with the withdrawn token, nothing active or \
                 prepared",
                &runs_of_token,
                &st.active,
                &st.prepared,
            ),
        )
        .await?;
        env.holds_for(
            "no Job of the withdrawn period exists, until 3 s after its instant",
            until(prep.r + SignedDuration::from_secs(3)),
            || async { Ok(w.jobs_of(prep.p).await?.is_empty()) },
        )
        .await?;
        w.watch
            .only_seen(
                env,
                prep.p,
                &[&prep.uid],
                "no Job of the period seen but the withdrawn one",
            )
            .await?;
        let later: BTreeSet<String> = w
            .watch
            .all()
            .into_iter()
            .filter(|x| x.period.is_some_and(|p| p > prep.p))
            .map(|x| x.name)
            .collect();
        ensure(
            env,
            later.is_empty(),
            ("no Job for a later period while suspended", &later),
        )
        .await?;
        w.no_early_or_second_run().await
    }
    .await;
    w.explained(result).await
}

/// A jobTemplate edit 4 s before the instant, while the run is prepared, withdraws it (reason
/// SpecChanged): the prepared Job never runs and is deleted, one `RunWithdrawn` Event. The
/// period still runs exactly once, at or after its instant (by the API server's clock), in a Job
/// built from the edited template, with a higher token; it is promoted (`decidedThrough` at the
/// period, the run active or in the history with its token).
#[tokio::test]
async fn a_template_edit_before_the_instant_withdraws_and_the_period_runs_once_with_it()
-> Result<()> {
    let w = World::start("preparing-edit", &spec_yaml(LEAD, ""), Replicas::One, true).await?;
    let result = async {
        let env = &w.env;
        let prep = w
            .next_prepared(SignedDuration::from_secs(6), Duration::from_secs(45))
            .await?;
        w.ready_before_instant(&prep).await?;
        let ops: json_patch::Patch = serde_json::from_value(json!([{
            "op": "replace",
            "path": "/spec/jobTemplate/spec/template/spec/containers/0/command",
            "value": ["sh", "-c", EDITED],
        }]))?;
        w.edit_just_before(&prep, &Patch::Json::<()>(ops)).await?;
        w.withdrawn(&prep, "SpecChanged", prep.r + SignedDuration::from_secs(10))
            .await?;
        // The period runs once, with the edited template and a new token.
        let (uid, token) = env
            .wait_for(
                "the period run in a new Job with a higher token, released",
                until(prep.r) + Duration::from_secs(30),
                || async {
                    let jobs = w.jobs_of(prep.p).await?;
                    Ok(jobs.iter().find_map(|j| {
                        let token = e2e::token_of(j);
                        let released =
                            annotation(j, ANNOTATION_RELEASED) == Some(token.to_string().as_str());
                        (token > prep.token && released)
                            .then(|| (j.uid().unwrap_or_default(), token))
                    }))
                },
            )
            .await?;
        let first_run = w.first_run(&uid).await?;
        println!(
            "{}: after the withdrawal of token {}, the period ran as token {token}, unsuspended \
             by {:?}, instant {}",
            env.ns, prep.token, first_run.suspend_set, prep.r
        );
        ensure(
            env,
            first_run
                .suspend_set
                .as_ref()
                .is_some_and(|(_, at)| *at >= prep.r),
            (
                "the period's run unsuspended no earlier than its instant",
                &first_run.suspend_set,
                prep.r,
            ),
        )
        .await?;
        let want = vec!["sh".to_string(), "-c".to_string(), EDITED.to_string()];
        ensure(
            env,
            first_run.command.as_ref() == Some(&want),
            (
                "the Job that ran built from the edited template",
                &first_run.command,
            ),
        )
        .await?;
        let old_command = w
            .watch
            .states(&prep.uid)
            .first()
            .and_then(|x| x.command.clone());
        ensure(
            env,
            old_command.is_some() && old_command.as_ref() != Some(&want),
            (
                "the withdrawn Job had the template before the edit",
                &old_command,
            ),
        )
        .await?;
        // Promoted, with the period decided by this run.
        env.wait_for(
            "the period's run promoted: in active or the history with its token, decidedThrough \
             at the period",
            Duration::from_secs(30),
            || async {
                let st = status(env).await?;
                let holds = st
                    .active
                    .iter()
                    .any(|r| r.token == token && r.period.0 == prep.p)
                    || st
                        .history
                        .iter()
                        .any(|h| h.token == Some(token) && h.period.0 == prep.p);
                let through = st.decided_through.as_ref().map(|t| t.0);
                Ok((holds && through == Some(prep.p)).then_some(()))
            },
        )
        .await?;
        w.watch
            .only_seen(
                env,
                prep.p,
                &[&prep.uid, &uid],
                "the withdrawn Job and the run's, no other, for the period",
            )
            .await?;
        let ran = w.watch.ran_uids_of(prep.p);
        ensure(
            env,
            ran == BTreeSet::from([uid]),
            ("exactly one Job of the period ran: the new one", &ran),
        )
        .await?;
        w.run_count_counts_runs().await?;
        w.no_early_or_second_run().await
    }
    .await;
    w.explained(result).await
}

/// A crash right after a preparation's confirm (`prepare-confirmed`: abort) of the leader, with a
/// second replica standing by: replica 1, leading once replica 0's Lease ran out, keeps the
/// prepared run and starts it at its instant, not before, and exactly once; it promotes it.
#[tokio::test]
async fn a_crash_after_the_preparation_is_resumed_by_the_next_leader_at_the_instant() -> Result<()>
{
    let two = Replicas::Two {
        point: failpoint::PREPARE_CONFIRMED,
        action: "abort",
    };
    crashed_after_preparation("preparing-failover", two).await
}

/// The same crash on a single replica, started again after it: the new process keeps the
/// prepared run it finds in status and starts it at its instant, not before, exactly once.
#[tokio::test]
async fn a_crash_after_the_preparation_is_resumed_at_the_instant_after_a_restart() -> Result<()> {
    let one = Replicas::OneArmed {
        point: failpoint::PREPARE_CONFIRMED,
        action: "abort",
    };
    crashed_after_preparation("preparing-restart", one).await
}

async fn crashed_after_preparation(name: &str, replicas: Replicas) -> Result<()> {
    let mut w = World::start(name, &spec_yaml(LEAD, ""), replicas, true).await?;
    let result = async {
        w.env
            .wait_for(
                "replica 0 to crash right after its preparation's confirm (prepare-confirmed; a \
                 controller built with --features failpoints)",
                Duration::from_secs(45),
                || async { Ok(w.env.controller_exited(0).then_some(())) },
            )
            .await?;
        let crashed_at = Timestamp::now();
        let aborted = logged(
            &w.env,
            0,
            &["failpoint: aborting", failpoint::PREPARE_CONFIRMED],
        );
        ensure(&w.env, aborted, "replica 0 aborted at prepare-confirmed").await?;
        // What the crash left: the run prepared (confirmed), its Job suspended, not released.
        let prep = w
            .next_prepared(SignedDuration::ZERO, Duration::from_secs(5))
            .await?;
        ensure(
            &w.env,
            crashed_at < prep.r,
            ("crashed before the instant", crashed_at, prep.r),
        )
        .await?;
        w.ready_before_instant(&prep).await?;
        if matches!(replicas, Replicas::OneArmed { .. }) {
            w.env.start_controller(&[]).await?;
            w.replicas += 1;
        } else {
            let env = &w.env;
            env.wait_for("replica 1 to lead", Duration::from_secs(30), || async {
                Ok((leader(env).await? == Some(1)).then_some(()))
            })
            .await?;
        }
        let env = &w.env;
        // Kept until shortly before its instant by the next controller.
        if prep.r - SignedDuration::from_millis(1500) > Timestamp::now() {
            env.holds_for(
                "the prepared run kept by the next controller until 1.5 s before its instant",
                until(prep.r - SignedDuration::from_millis(1500)),
                || w.still_prepared(&prep),
            )
            .await?;
        }
        w.started_at_instant(&prep, 1).await?;
        w.promoted(&prep).await?;
        let done = "prepared run resumed at its instant";
        let (by_1, by_0) = (logged(env, 1, &[done]), logged(env, 0, &[done]));
        ensure(
            env,
            by_1 && !by_0,
            (
                "started and promoted by the next controller, not the crashed one",
                ("replica 1", by_1),
                ("replica 0", by_0),
            ),
        )
        .await?;
        w.watch
            .only_seen(
                env,
                prep.p,
                &[&prep.uid],
                "exactly one Job seen for the period",
            )
            .await?;
        w.run_count_counts_runs().await?;
        w.no_early_or_second_run().await
    }
    .await;
    w.explained(result).await
}

/// A lead longer than the interval (`prepareLeadSeconds: 60`, every 20 s): the `Preparation`
/// condition is True, LeadClamped, and says the lead in effect (20 s); runs are still prepared
/// (Jobs created, with `resume-at`, before their instant), but no period's Job is created before
/// the previous instant (by the API server's clock), and each starts at its instant, not
/// before.
#[tokio::test]
async fn a_lead_longer_than_the_interval_is_clamped_to_the_previous_instant() -> Result<()> {
    let w = World::start("preparing-clamp", &spec_yaml(60, ""), Replicas::One, false).await?;
    let result = async {
        let env = &w.env;
        let cond = env
            .wait_for(
                "the Preparation condition True, LeadClamped",
                Duration::from_secs(45),
                || async {
                    let st = status(env).await?;
                    Ok(st
                        .conditions
                        .iter()
                        .find(|c| c.type_ == "Preparation" && c.reason == "LeadClamped")
                        .map(|c| (c.status.clone(), c.message.clone())))
                },
            )
            .await?;
        ensure(
            env,
            cond.0 == "True"
                && cond.1.contains("prepareLeadSeconds 60")
                && cond.1.contains(&format!("prepared {EVERY} s ahead")),
            (
                "LeadClamped: True, naming the lead asked and the lead in effect",
                &cond,
            ),
        )
        .await?;
        // Two prepared runs started (their Jobs created before their instants).
        let prepared = env
            .wait_for(
                "two runs prepared ahead (created before their instant) and started",
                Duration::from_secs(75),
                || async {
                    let prepared = w.watch.prepared_and_ran();
                    Ok((prepared.len() >= 2).then_some(prepared))
                },
            )
            .await?;
        println!(
            "{}: prepared and started (period, created): {prepared:?}",
            env.ns
        );
        // Never created before the previous instant.
        let early: Vec<(String, Option<Timestamp>, Option<Timestamp>)> = w
            .watch
            .firsts()
            .into_iter()
            .filter(|x| match (x.period, x.created) {
                (Some(p), Some(c)) => c < p - SignedDuration::from_secs(EVERY),
                _ => true,
            })
            .map(|x| (x.name, x.period, x.created))
            .collect();
        ensure(
            env,
            early.is_empty(),
            (
                "no Job created before its previous instant (name, period, created)",
                &early,
            ),
        )
        .await?;
        w.run_count_counts_runs().await?;
        w.no_early_or_second_run().await
    }
    .await;
    w.explained(result).await
}

/// A SingletonJob deleted while its run is prepared gives its period back (design §3.1,
/// `Deleted`): its Job never runs, its backstop claim moves to `withdrawn_claims` (reason
/// Deleted) and its token is retired, so the SingletonJob created again under the same name
/// before the instant runs the period once, with a higher token, instead of finding it claimed
/// and recording it Deduplicated (a period lost to preparation). The deleted one's Job is held
/// (a finalizer of this test's) until the new SingletonJob has tried to prepare the period: its
/// Job's name still taken, that preparation is refused and gives the period back (reason
/// `Refused`: claim row archived, nothing recorded, not prepared again), and the period runs at
/// its instant as without preparation, once the name is free.
#[tokio::test]
async fn a_deleted_singletonjob_gives_its_prepared_period_back() -> Result<()> {
    let mut env = Env::new("prep-deleted").await?;
    let p = e2e::table_prefix(&env);
    e2e::backstop_secret(&env, "db", &e2e::database_url()?, true).await?;
    env.start_controller(&[]).await?;
    let extra = e2e::backstop_spec("db", &p, "  prepareLeadSeconds: 25\n");
    let yaml = sj_yaml("pay", "*/30 * * * * *", &extra);
    env.create_sj(&yaml).await?;
    // A prepared run with at least 15 s to its instant: time to delete, create again and see
    // the new one's preparation refused.
    let run = env
        .wait_for(
            "a run prepared 15 s or more ahead",
            Duration::from_secs(75),
            || async {
                let sj = env.get_sj("pay").await?;
                Ok(sj
                    .status
                    .and_then(|s| s.prepared)
                    .filter(|r| r.job_uid.is_some())
                    .filter(|r| {
                        r.resume_at.as_ref().is_some_and(|at| {
                            at.0.duration_since(Timestamp::now()) >= SignedDuration::from_secs(15)
                        })
                    }))
            },
        )
        .await?;
    let first_uid = run.job_uid.clone().unwrap_or_default();
    hold_job(&env, &run.job_name, &first_uid, MANAGER)
        .await
        .context("holding the prepared Job")?;
    env.sjs().delete("pay", &Default::default()).await?;
    let result = async {
        let db = e2e::pg().await?;
        let withdrawn = Withdrawn {
            env: &env,
            db: &db,
            prefix: &p,
            key: format!("{}/pay", env.ns),
            period: run.period.0,
        };
        let reason = withdrawn.reason(Some(run.token)).await?;
        // JobDeleted when the garbage collector's delete of the Job reached the controller
        // before the SingletonJob's (two watches): the same withdrawal.
        ensure(
            &env,
            reason == "Deleted" || reason == "JobDeleted",
            ("withdrawal reason", &reason),
        )
        .await?;
        env.create_sj(&yaml).await?;
        let refused = withdrawn.reason(None).await?;
        ensure(
            &env,
            refused == "Refused",
            ("the new SingletonJob's withdrawal", &refused),
        )
        .await?;
        ensure(
            &env,
            Timestamp::now() < run.period.0 - SignedDuration::from_secs(2),
            ("refused 2 s or more before the instant", run.period.0),
        )
        .await?;
        release_job(&env, &run.job_name, &first_uid, MANAGER)
            .await
            .context("letting the deleted SingletonJob's Job go")?;
        ran_once_with_a_higher_token(&env, run.period.0, run.token, &first_uid).await
    }
    .await;
    // Whatever became of the test: a finalizer left behind would keep the namespace forever.
    let let_go = release_job(&env, &run.job_name, &first_uid, MANAGER).await;
    result.and(let_go)
}

/// This test file's field manager (the hold's finalizer).
const MANAGER: &str = "e2e-preparing";

/// A period's withdrawn backstop claims.
struct Withdrawn<'a> {
    env: &'a Env,
    db: &'a tokio_postgres::Client,
    prefix: &'a str,
    key: String,
    period: Timestamp,
}

impl Withdrawn<'_> {
    /// Waits until the period's claim with `token` (any other than those seen, when None) is
    /// archived in `withdrawn_claims` and no claim of it is live, before its instant; its reason.
    async fn reason(&self, token: Option<u64>) -> Result<String> {
        let p = self.prefix;
        let what = format!("the claim of {} withdrawn (token {token:?})", self.period);
        let reason: String = self
            .env
            .wait_for(&what, until(self.period), || async {
                let live = self
                    .db
                    .query(
                        &format!("SELECT token FROM {p}claims WHERE job = $1 AND period = $2"),
                        &[&self.key, &self.period],
                    )
                    .await?;
                let gone = self
                    .db
                    .query(
                        &format!("SELECT token, reason FROM {p}withdrawn_claims WHERE job = $1 AND period = $2 ORDER BY token DESC"),
                        &[&self.key, &self.period],
                    )
                    .await?;
                let found = gone.iter().find(|r| match token {
                    Some(t) => r.get::<_, i64>(0) == t as i64,
                    None => gone.len() > 1,
                });
                Ok(found.filter(|_| live.is_empty()).map(|r| r.get(1)))
            })
            .await?;
        Ok(reason)
    }
}

/// The period run by the re-created SingletonJob: one history entry, a run with a token above
/// `token`; the deleted one's Job (`first_uid`) gone, never run.
async fn ran_once_with_a_higher_token(
    env: &Env,
    period: Timestamp,
    token: u64,
    first_uid: &str,
) -> Result<()> {
    let entries = env
        .wait_for(
            "the period run by the new SingletonJob",
            until(period) + Duration::from_secs(40),
            || async {
                let h = env.get_sj("pay").await?.status.unwrap_or_default().history;
                let of: Vec<_> = h.into_iter().filter(|e| e.period.0 == period).collect();
                Ok((!of.is_empty()).then_some(of))
            },
        )
        .await?;
    let ran = entries
        .iter()
        .all(|e| e.job_name.is_some() && e.token.is_some_and(|t| t > token));
    ensure(
        env,
        entries.len() == 1 && ran,
        (
            "one history entry for the period: a run with a higher token",
            &entries,
        ),
    )
    .await?;
    let of_period: Vec<_> = env
        .job_list()
        .await?
        .into_iter()
        .filter(|j| period_of(j) == Some(period))
        .collect();
    ensure(
        env,
        of_period
            .iter()
            .all(|j| j.metadata.uid.as_deref() != Some(first_uid)),
        (
            "the deleted SingletonJob's Job is gone, never run",
            first_uid,
        ),
    )
    .await?;
    Ok(())
}

// ---- One test's world ----

/// A namespace, its controllers, the watch of its Jobs, the SingletonJob.
struct World {
    env: Env,
    /// How many controllers it started (`e2e-0` ...).
    replicas: usize,
    watch: JobWatch,
}

/// A prepared run, as status showed it.
#[derive(Debug)]
struct Prep {
    /// The period, and its instant (no jitter: the same).
    p: Timestamp,
    r: Timestamp,
    token: u64,
    job: String,
    uid: String,
    /// The status that showed it, and when this test read it.
    st: SingletonJobStatus,
    seen_at: Timestamp,
}

impl World {
    /// The namespace, its controllers and its Job watch; then the SingletonJob `yaml`. With
    /// `full_lead`, created at least [`LEAD`] + 3 s before its first instant (waiting for the
    /// next instant when it is closer), so its first period is prepared with the whole lead.
    async fn start(name: &str, yaml: &str, replicas: Replicas, full_lead: bool) -> Result<World> {
        let mut env = Env::new(name).await?;
        let count = start_replicas(&mut env, replicas, &[]).await?;
        let watch = JobWatch::start(env.client.clone(), &env.ns, None).await?;
        if full_lead {
            let next = next_instant(Timestamp::now());
            if next.duration_since(Timestamp::now()) < SignedDuration::from_secs(LEAD + 3) {
                tokio::time::sleep(until(next + SignedDuration::from_millis(500))).await;
            }
        }
        env.create_sj(yaml).await?;
        Ok(World {
            env,
            replicas: count,
            watch,
        })
    }

    /// The prepared run of the status, once there is one at least `ahead` of its instant (by
    /// this machine's clock).
    async fn next_prepared(&self, ahead: SignedDuration, timeout: Duration) -> Result<Prep> {
        let env = &self.env;
        let what = format!("status.prepared naming a run at least {ahead} ahead of its instant");
        env.wait_for(&what, timeout, || async {
            let st = status(env).await?;
            let now = Timestamp::now();
            let Some(run) = st.prepared.clone() else {
                return Ok(None);
            };
            let Some(r) = run.resume_at.as_ref().map(|t| t.0) else {
                return Ok(None);
            };
            if r.duration_since(now) < ahead {
                return Ok(None);
            }
            let uid = run
                .job_uid
                .clone()
                .context("status.prepared has no jobUid")?;
            println!(
                "{}: prepared {} (token {}, uid {uid}) for {}, resumeAt {r}, seen {} ahead",
                env.ns,
                run.job_name,
                run.token,
                run.period.0,
                r.duration_since(now)
            );
            Ok(Some(Prep {
                p: run.period.0,
                r,
                token: run.token,
                job: run.job_name,
                uid,
                st,
                seen_at: now,
            }))
        })
        .await
    }

    /// Before its instant: the Job named by `status.prepared` exists with its uid, suspended,
    /// `released: "false"`, `resume-at` its instant; the status names the run with a basis,
    /// carries its token, has not decided its period, runs nothing else, and counts it in
    /// `runCount`.
    async fn ready_before_instant(&self, prep: &Prep) -> Result<()> {
        let env = &self.env;
        let job = env
            .jobs()
            .get_opt(&prep.job)
            .await?
            .context("the prepared Job")?;
        let seen = (
            job.uid(),
            job.spec.as_ref().and_then(|s| s.suspend),
            annotation(&job, ANNOTATION_RELEASED).map(String::from),
            annotation(&job, ANNOTATION_RESUME_AT).and_then(|t| t.parse::<Timestamp>().ok()),
            e2e::token_of(&job),
            period_of(&job),
        );
        let expected = (
            Some(prep.uid.clone()),
            Some(true),
            Some(naming::NOT_RELEASED.to_string()),
            Some(prep.r),
            prep.token,
            Some(prep.p),
        );
        ensure(
            env,
            seen == expected,
            (
                "the prepared Job: uid, suspended, released \"false\", resume-at, token, period",
                &seen,
                &expected,
            ),
        )
        .await?;
        let st = &prep.st;
        let run = st.prepared.as_ref().context("status.prepared")?;
        let through = st.decided_through.as_ref().map(|t| t.0);
        ensure(
            env,
            run.basis.as_deref().is_some_and(|b| !b.is_empty())
                && st.fencing_token == prep.token
                && through.is_none_or(|t| t < prep.p)
                && st.active.is_empty()
                && st.pending_claim.is_none()
                && prep.r >= prep.p,
            (
                "status while prepared: a basis, fencingToken its token, decidedThrough short of \
                 its period, nothing active or pending, resumeAt not before the period",
                &run.basis,
                (st.fencing_token, prep.token),
                (through, prep.p),
                st.active.len(),
                &st.pending_claim,
            ),
        )
        .await?;
        let runs = self.watch.ran_uids().len() as u64;
        ensure(
            env,
            st.run_count == runs + 1,
            (
                "runCount while prepared: the runs so far and this one",
                st.run_count,
                runs,
            ),
        )
        .await?;
        let now = Timestamp::now();
        ensure(
            env,
            now < prep.r,
            ("all of it seen before the instant", now, prep.r),
        )
        .await
    }

    /// Whether the run is still prepared: its Job suspended, not released nor withdrawn, and
    /// `status.prepared` naming it.
    async fn still_prepared(&self, prep: &Prep) -> Result<bool> {
        let Some(job) = self.env.jobs().get_opt(&prep.job).await? else {
            return Ok(false);
        };
        let st = status(&self.env).await?;
        Ok(held_back(&job, &prep.uid)
            && st.prepared.as_ref().is_some_and(|r| {
                r.token == prep.token && r.job_uid.as_deref() == Some(prep.uid.as_str())
            }))
    }

    /// The prepared Job started: unsuspended and released with its token, no earlier than its
    /// instant by the API server's clock, and within 10 s of it; `by` is the controller expected
    /// to have sent it (for the log line).
    async fn started_at_instant(&self, prep: &Prep, by: usize) -> Result<()> {
        let env = &self.env;
        released_job(env, &prep.job, &prep.uid, prep.token, prep.r, "started").await?;
        let first_run = self.first_run(&prep.uid).await?;
        let released_at = first_run.suspend_set.clone();
        println!(
            "{}: prepared run {} (token {}) for {}: unsuspended by {released_at:?} (API server \
             time), seen running by the watch at {} (controller {by} expected)",
            env.ns, prep.job, prep.token, prep.r, first_run.at
        );
        ensure(
            env,
            released_at.as_ref().is_some_and(|(_, at)| {
                *at >= prep.r && *at <= prep.r + SignedDuration::from_secs(10)
            }),
            (
                "the prepared Job unsuspended no earlier than its instant by the API server's \
                 clock (whole seconds), and within 10 s of it",
                &released_at,
                prep.r,
            ),
        )
        .await
    }

    /// The first state of Job `uid` the watch saw allowed to run (the watch may deliver it a
    /// moment after a read showed it).
    async fn first_run(&self, uid: &str) -> Result<Seen> {
        self.env
            .wait_for(
                "the watch to see the Job allowed to run",
                Duration::from_secs(15),
                || async { Ok(self.watch.states(uid).into_iter().find(|x| x.ran)) },
            )
            .await
    }

    /// Promoted: `status.prepared` no longer names the run, the run is active or in the history
    /// with its token and period, `decidedThrough` and `lastScheduleTime` at its period.
    async fn promoted(&self, prep: &Prep) -> Result<()> {
        let env = &self.env;
        env.wait_for(
            "the run promoted: status.prepared without it, the run active or in the history with \
             its token and period, decidedThrough and lastScheduleTime at its period",
            Duration::from_secs(30),
            || async {
                let st = status(env).await?;
                let named = st.prepared.as_ref().is_some_and(|r| r.token == prep.token);
                let holds = st.active.iter().any(|r| {
                    r.token == prep.token
                        && r.period.0 == prep.p
                        && r.job_uid.as_deref() == Some(prep.uid.as_str())
                }) || st
                    .history
                    .iter()
                    .any(|h| h.token == Some(prep.token) && h.period.0 == prep.p);
                let through = st.decided_through.as_ref().map(|t| t.0);
                let last = st.last_schedule_time.as_ref().map(|t| t.0);
                Ok(
                    (!named && holds && through == Some(prep.p) && last == Some(prep.p))
                        .then_some(()),
                )
            },
        )
        .await
    }

    /// Waits until 4 s before the instant, checks the run is still prepared, and applies `edit`
    /// to the SingletonJob.
    async fn edit_just_before<P: serde::Serialize + std::fmt::Debug>(
        &self,
        prep: &Prep,
        edit: &Patch<P>,
    ) -> Result<()> {
        tokio::time::sleep(until(prep.r - SignedDuration::from_secs(4))).await;
        ensure(
            &self.env,
            self.still_prepared(prep).await?,
            "the run still prepared 4 s before its instant",
        )
        .await?;
        self.env
            .sjs()
            .patch(SJ, &PatchParams::default(), edit)
            .await?;
        println!(
            "{}: edited {} before the instant {}",
            self.env.ns,
            prep.r.duration_since(Timestamp::now()),
            prep.r
        );
        Ok(())
    }

    /// The prepared run withdrawn for `reason` before `by`: its Job marked (`released:
    /// withdrawn`, `withdrawn: <reason>`) and deleted, never allowed to run, no pod for it (job
    /// controller Events); `status.prepared` no longer naming it; one `RunWithdrawn` Event,
    /// Normal, naming the run.
    async fn withdrawn(&self, prep: &Prep, reason: &str, by: Timestamp) -> Result<()> {
        let env = &self.env;
        let what = format!(
            "the prepared run withdrawn ({reason}): its Job marked and deleted, status.prepared \
             without it, a RunWithdrawn Event naming it"
        );
        let named = |m: &str| m.contains(&prep.job) && m.contains(&format!("token {}", prep.token));
        let events = env
            .wait_for(&what, until(by), || async {
                let states = self.watch.states(&prep.uid);
                let marked = states.iter().any(|x| x.withdrawn.is_some());
                let gone = states.iter().any(|x| x.deleted);
                let st = status(env).await?;
                let cleared = st.prepared.as_ref().is_none_or(|r| r.token != prep.token);
                let evs: Vec<_> = events_with_reason(env, "RunWithdrawn")
                    .await?
                    .into_iter()
                    .filter(|e| e.message.as_deref().is_some_and(named))
                    .collect();
                Ok((marked && gone && cleared && !evs.is_empty()).then_some(evs))
            })
            .await?;
        let states = self.watch.states(&prep.uid);
        marked_withdrawn(env, &states, reason).await?;
        let marked_at = states.iter().find(|x| x.withdrawn.is_some()).map(|x| x.at);
        println!(
            "{}: marked withdrawn ({reason}) at {marked_at:?}, instant {}",
            env.ns, prep.r
        );
        never_allowed_to_run(env, &states).await?;
        let released: Vec<&Seen> = states
            .iter()
            .filter(|x| x.released.as_deref() == Some(prep.token.to_string().as_str()))
            .collect();
        ensure(
            env,
            released.is_empty(),
            ("the withdrawn Job never released with its token", &released),
        )
        .await?;
        no_pod(env, &prep.uid).await?;
        let kinds: Vec<_> = events
            .iter()
            .map(|e| (e.type_.clone(), e.message.clone()))
            .collect();
        ensure(
            env,
            kinds.len() == 1 && kinds[0].0.as_deref() == Some("Normal"),
            ("one RunWithdrawn Event naming the run, Normal", &kinds),
        )
        .await
    }

    /// The Jobs of period `p` that exist now.
    async fn jobs_of(&self, p: Timestamp) -> Result<Vec<Job>> {
        Ok(self
            .env
            .job_list()
            .await?
            .into_iter()
            .filter(|j| period_of(j) == Some(p))
            .collect())
    }

    /// `runCount` counts each run once: at some moment within 15 s it equals the Jobs that ran
    /// (the watch) plus a run claimed or prepared and not started yet. (A run counted twice, or
    /// a withdrawal not given back, never matches.)
    async fn run_count_counts_runs(&self) -> Result<()> {
        let env = &self.env;
        env.wait_for(
            "runCount equal to the Jobs that ran plus a run pending or prepared",
            Duration::from_secs(15),
            || async {
                let st = status(env).await?;
                let ran = self.watch.ran_uids();
                // A run in status whose Job has not run yet (claimed, prepared, or confirmed and
                // not resumed): counted already.
                let waiting = st
                    .pending_claim
                    .iter()
                    .chain(st.prepared.iter())
                    .chain(st.active.iter())
                    .filter(|r| r.job_uid.as_ref().is_none_or(|u| !ran.contains(u)))
                    .count() as u64;
                Ok((st.run_count == ran.len() as u64 + waiting).then_some(()))
            },
        )
        .await
    }

    /// The check of every test, from every state the watch saw: no Job unsuspended before its
    /// instant (its `resume-at`, else its period; the API server's time of the update that
    /// cleared `spec.suspend`), each Job that ran released by the controller with its own token,
    /// no Job marked withdrawn ever ran, and no period with two Jobs that ran.
    async fn no_early_or_second_run(&self) -> Result<()> {
        let wrong = violations(&self.watch);
        ensure(
            &self.env,
            wrong.is_empty(),
            (
                "no Job unsuspended before its instant, none released by anyone else, no \
                 withdrawn Job ran, no period with two Jobs that ran",
                &wrong,
            ),
        )
        .await
    }

    /// `result`, with what a failure needs besides [`Env`]'s dump: every state of every Job the
    /// watch saw and the controllers' log lines about prepared runs.
    async fn explained(&self, result: Result<()>) -> Result<()> {
        let about = ["prepar", "withdr", "claimed", "failpoint", "error", "warn"];
        explained(result, &self.env, self.replicas, &self.watch, &about, "")
    }
}

// ---- Small readers ----

/// What the check of every test found wrong in every state `watch` saw (see
/// [`World::no_early_or_second_run`]).
fn violations(watch: &JobWatch) -> Vec<String> {
    let all = watch.all();
    let mut wrong = Vec::new();
    let mut ran_by_period: BTreeMap<Option<Timestamp>, BTreeSet<String>> = BTreeMap::new();
    let uids: BTreeSet<&str> = all.iter().map(|x| x.uid.as_str()).collect();
    for uid in uids {
        let states: Vec<&Seen> = all.iter().filter(|x| x.uid == uid).collect();
        let Some(first) = states.iter().find(|x| x.ran) else {
            continue;
        };
        let instant = match (first.period, first.resume_at) {
            (Some(p), Some(r)) => Some(p.max(r)),
            (p, r) => p.or(r),
        };
        match (&first.suspend_set, instant) {
            (Some((_, at)), Some(i)) if *at >= i => {}
            (set, i) => wrong.push(format!(
                "{} (uid {uid}) allowed to run with spec.suspend last set by {set:?}, its \
                 instant {i:?}",
                first.name
            )),
        }
        let token = first.token.map(|t| t.to_string());
        if first.released.is_none() || first.released != token {
            wrong.push(format!(
                "{} (uid {uid}) allowed to run with released {:?}, its token {token:?}",
                first.name, first.released
            ));
        }
        if states.iter().any(|x| x.is_withdrawn()) {
            wrong.push(format!(
                "{} (uid {uid}) marked withdrawn, and ran",
                first.name
            ));
        }
        ran_by_period
            .entry(first.period)
            .or_default()
            .insert(uid.to_string());
    }
    for (p, uids) in ran_by_period {
        if p.is_none() || uids.len() > 1 {
            wrong.push(format!("period {p:?}: Jobs that ran {uids:?}"));
        }
    }
    wrong
}

/// Whether history entry `h` stands for period `p` (a folded range included).
fn covers(h: &singleton::api::HistoryEntry, p: Timestamp) -> bool {
    let last = h.last_period.as_ref().map_or(h.period.0, |t| t.0);
    h.period.0 <= p && p <= last
}

/// The schedule's first instant after `t`.
fn next_instant(t: Timestamp) -> Timestamp {
    let secs = t.as_second().div_euclid(EVERY) * EVERY + EVERY;
    Timestamp::from_second(secs).unwrap_or(t)
}
