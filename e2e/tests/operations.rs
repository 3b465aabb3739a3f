//! `kubectl singleton trigger|backfill|break-lock` against the real API server and PostgreSQL:
//! the plugin only asks (an annotation), the controller carries it out through the claim-and-fence
//! path, and the results are checked from the outside (Jobs, status, Events, the backstop tables).

use std::time::Duration;

use anyhow::{Context as _, Result};
use e2e::{
    Env, backstop_secret, backstop_spec, database_url, ensure, events_with_reason, never_scheduled,
    pg, plugin, sj_yaml, stderr, stdout, table_prefix, token_of,
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use singleton::api::{OperationPhase, OperationStatus, Outcome, SingletonJob};

/// A schedule that never fires during a test: daily at 03:00 UTC, unless the test happens to run
/// across it (then the scheduled run only adds a Job with its own period, checked apart).
const DAILY: &str = "0 3 * * *";

fn period_of(job: &Job) -> String {
    job.annotations()
        .get("singleton.dev/period")
        .cloned()
        .unwrap_or_default()
}

fn op(out: &std::process::Output) -> Result<OperationStatus> {
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("-o json: {} {}", stdout(out), stderr(out)))
}

/// The claims rows of `job` in the backstop: (period, token), oldest first.
async fn claims(prefix: &str, job: &str) -> Result<Vec<(Timestamp, i64)>> {
    let db = pg().await?;
    let rows = db
        .query(
            &format!("SELECT period, token FROM {prefix}claims WHERE job = $1 ORDER BY period"),
            &[&job],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get::<_, Timestamp>(0), r.get::<_, i64>(1)))
        .collect())
}

/// A workload's fenced write: what `singleton_fence` says to `token`.
async fn fenced_write(
    prefix: &str,
    job: &str,
    token: i64,
) -> Result<std::result::Result<(), String>> {
    let mut db = pg().await?;
    let tx = db.transaction().await?;
    let r = tx
        .query_one(&format!("SELECT {prefix}fence($1, $2)"), &[&job, &token])
        .await;
    Ok(match r {
        Ok(_) => {
            tx.commit().await?;
            Ok(())
        }
        Err(e) => Err(e
            .as_db_error()
            .map(|d| format!("{}: {}", d.code().code(), d.message()))
            .unwrap_or_else(|| e.to_string())),
    })
}

async fn sj_status(env: &Env, name: &str) -> Result<singleton::api::SingletonJobStatus> {
    Ok(env.get_sj(name).await?.status.unwrap_or_default())
}

#[tokio::test]
async fn trigger_runs_now_and_a_backfill_repeated_starts_nothing_new() -> Result<()> {
    let mut env = Env::new("ops-backfill").await?;
    let ns = env.ns.clone();
    let prefix = table_prefix(&env);
    backstop_secret(&env, "db", &database_url()?, true).await?;
    env.start_controller(&[]).await?;
    // Every Job is kept (no pruning), so counting Jobs counts runs.
    let keep = "  successfulJobsHistoryLimit: 100\n";
    env.create_sj(&sj_yaml(
        "billing",
        DAILY,
        &backstop_spec("db", &prefix, keep),
    ))
    .await?;
    let key = format!("{ns}/billing");
    env.wait_for(
        "the controller to decide billing",
        Duration::from_secs(30),
        || async {
            Ok(sj_status(&env, "billing")
                .await?
                .decided_through
                .map(|_| ()))
        },
    )
    .await?;

    // trigger: a run now, its own period (with microseconds) and token.
    let asked = Timestamp::now();
    let out = plugin(&["trigger", "billing", "-n", &ns, "-o", "json"], &[])?;
    let first = op(&out)?;
    ensure(
        &env,
        out.status.success()
            && first.phase == OperationPhase::Done
            && first.token == Some(1)
            && first.requested_by.is_some(),
        ("trigger", &first, stderr(&out)),
    )
    .await?;
    let job_name = first.job_name.clone().unwrap_or_default();
    let job = env.wait_job(&job_name).await?;
    let period: Timestamp = period_of(&job).parse()?;
    ensure(
        &env,
        token_of(&job) == 1
            && period.subsec_nanosecond() != 0
            && period >= asked - SignedDuration::from_secs(1)
            && period <= Timestamp::now(),
        ("the triggered Job", &job.metadata, period),
    )
    .await?;
    // The human form names the Job and the token; the run is recorded as Triggered.
    env.wait_for(
        "the triggered run to succeed",
        Duration::from_secs(60),
        || async {
            let st = sj_status(&env, "billing").await?;
            Ok(st
                .history
                .iter()
                .any(|h| {
                    h.job_name.as_deref() == Some(job_name.as_str())
                        && h.outcome == Outcome::Succeeded
                        && h.reason.as_deref() == Some("Triggered")
                })
                .then_some(()))
        },
    )
    .await?;
    let out = plugin(&["trigger", "billing", "-n", &ns], &[])?;
    let text = stdout(&out);
    ensure(
        &env,
        out.status.success()
            && text.starts_with(&format!(
                "singletonjob {ns}/billing triggered: started Job billing-"
            ))
            && text.contains("with fencing token 2"),
        ("second trigger", &text, stderr(&out)),
    )
    .await?;
    let events = env
        .wait_for(
            "two RunTriggered Events",
            Duration::from_secs(20),
            || async {
                let evs = events_with_reason(&env, "RunTriggered").await?;
                Ok((evs.len() >= 2).then_some(evs))
            },
        )
        .await?;
    let by = first.requested_by.clone().unwrap_or_default();
    ensure(
        &env,
        events.len() == 2
            && events.iter().all(|e| {
                e.message
                    .as_deref()
                    .unwrap_or_default()
                    .contains(&format!("requested by {by}"))
            }),
        (
            "RunTriggered events",
            events.iter().map(|e| &e.message).collect::<Vec<_>>(),
        ),
    )
    .await?;

    // backfill the last three days (before the SingletonJob existed: asked for explicitly, as
    // someone who knows they never ran): each daily period once, oldest first, each its own
    // token.
    let now = Timestamp::now();
    let from = (now - SignedDuration::from_hours(72)).to_string();
    let to = now.to_string();
    let expected: Vec<Timestamp> = {
        let s = singleton::schedule::Schedule::parse(DAILY, None, Default::default())?;
        let created = env
            .get_sj("billing")
            .await?
            .metadata
            .creation_timestamp
            .map(|t| t.0)
            .unwrap_or(now);
        s.iter_after(now - SignedDuration::from_hours(72))
            .take_while(|p| *p <= created)
            .collect()
    };
    let jobs_before = env.job_list().await?.len();
    let out = plugin(
        &[
            "backfill",
            "billing",
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
            "-o",
            "json",
        ],
        &[],
    )?;
    let done = op(&out)?;
    ensure(
        &env,
        out.status.success()
            && done.phase == OperationPhase::Done
            && done.started == expected.len() as u64
            && done.already_run == 0,
        ("first backfill", &done, &expected, stderr(&out)),
    )
    .await?;
    let jobs = env.job_list().await?;
    let mut backfilled: Vec<(Timestamp, u64)> = jobs
        .iter()
        .filter(|j| {
            period_of(j)
                .parse::<Timestamp>()
                .is_ok_and(|p| expected.contains(&p))
        })
        .map(|j| (period_of(j).parse().unwrap_or(now), token_of(j)))
        .collect();
    backfilled.sort();
    let tokens: Vec<u64> = backfilled.iter().map(|(_, t)| *t).collect();
    ensure(
        &env,
        backfilled.iter().map(|(p, _)| *p).collect::<Vec<_>>() == expected
            && tokens.windows(2).all(|w| w[0] < w[1])
            && tokens.first().is_some_and(|t| *t > 2)
            && jobs.len() == jobs_before + expected.len(),
        (
            "backfilled Jobs (period, token), oldest first",
            &backfilled,
            jobs.len(),
            jobs_before,
        ),
    )
    .await?;

    // The same backfill again: every period had run, nothing starts, no token is issued.
    let token_before = sj_status(&env, "billing").await?.fencing_token;
    let out = plugin(
        &[
            "backfill",
            "billing",
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
        ],
        &[],
    )?;
    let text = stdout(&out);
    ensure(
        &env,
        out.status.success()
            && text.contains("backfill done")
            && text.contains(&format!(
                "started 0 run(s); {} period(s) had run before",
                expected.len()
            )),
        ("second backfill", &text, stderr(&out)),
    )
    .await?;
    let st = sj_status(&env, "billing").await?;
    let jobs_after = env.job_list().await?.len();
    ensure(
        &env,
        st.fencing_token == token_before && jobs_after == jobs.len(),
        (
            "nothing new after the repeat",
            st.fencing_token,
            token_before,
            jobs_after,
            jobs.len(),
        ),
    )
    .await?;

    // The backstop holds exactly one claim per period: two manual ones, one per backfilled day.
    let rows = claims(&prefix, &key).await?;
    let manual = rows
        .iter()
        .filter(|(p, _)| p.subsec_nanosecond() != 0)
        .count();
    let daily: Vec<Timestamp> = rows
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| expected.contains(p))
        .collect();
    ensure(&env, manual == 2 && daily == expected, ("claims", &rows)).await?;
    let accepted = events_with_reason(&env, "BackfillAccepted").await?;
    let finished = events_with_reason(&env, "BackfillDone").await?;
    ensure(
        &env,
        accepted.len() == 2 && finished.len() == 2,
        ("backfill events", accepted.len(), finished.len()),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn break_lock_fences_out_a_stuck_run() -> Result<()> {
    let mut env = Env::new("ops-breaklock").await?;
    let ns = env.ns.clone();
    let prefix = table_prefix(&env);
    backstop_secret(&env, "db", &database_url()?, true).await?;
    env.start_controller(&[]).await?;
    // Its Jobs never get a node: a run, once started, is stuck.
    env.create_sj(&never_scheduled(sj_yaml(
        "payout",
        DAILY,
        &backstop_spec("db", &prefix, ""),
    )))
    .await?;
    let key = format!("{ns}/payout");

    let out = plugin(&["trigger", "payout", "-n", &ns, "-o", "json"], &[])?;
    let stuck = op(&out)?;
    let stuck_job = stuck.job_name.clone().unwrap_or_default();
    ensure(
        &env,
        out.status.success() && stuck.token == Some(1),
        ("trigger", &stuck, stderr(&out)),
    )
    .await?;
    // The stuck run holds the fence: its writes go through. Waited for: the trigger's record
    // is written with the status claim, the backstop's claim (which raises the fence) a moment
    // later.
    env.wait_for(
        "token 1 before the break",
        Duration::from_secs(20),
        || async { Ok(fenced_write(&prefix, &key, 1).await?.ok()) },
    )
    .await?;

    // Another trigger waits behind it (Forbid never overlaps), and says so.
    let out = plugin(
        &[
            "trigger",
            "payout",
            "-n",
            &ns,
            "--timeout",
            "3s",
            "-o",
            "json",
        ],
        &[],
    )?;
    let waiting = op(&out)?;
    ensure(
        &env,
        out.status.success()
            && waiting.phase == OperationPhase::Pending
            && waiting.message.contains(&stuck_job),
        ("trigger behind a stuck run", &waiting, stderr(&out)),
    )
    .await?;
    // A third is refused rather than overwriting the waiting one.
    let out = plugin(&["trigger", "payout", "-n", &ns, "--timeout", "3s"], &[])?;
    ensure(
        &env,
        out.status.code() == Some(1)
            && stderr(&out).contains("is not finished: accepted, waiting for the active run"),
        ("trigger over a waiting one", stderr(&out)),
    )
    .await?;

    // break-lock: the fence rises above every issued token, the stuck Job goes.
    let out = plugin(
        &[
            "break-lock",
            "payout",
            "-n",
            &ns,
            "--reason",
            "node lost with the run on it",
        ],
        &[],
    )?;
    let text = stdout(&out);
    ensure(
        &env,
        out.status.success()
            && text.contains("lock broken")
            && text.contains("fencing token raised from 1 to 2")
            && text.contains(&format!("deleted Job(s) {stuck_job}")),
        ("break-lock", &text, stderr(&out)),
    )
    .await?;
    // The old holder is refused by the database itself.
    let refused = fenced_write(&prefix, &key, 1).await?;
    ensure(
        &env,
        refused
            .as_ref()
            .is_err_and(|e| e.starts_with("SF001") && e.contains("stale fencing token 1")),
        ("token 1 after the break", &refused),
    )
    .await?;
    // Who and why: in status and in a LockBroken Event.
    let st = sj_status(&env, "payout").await?;
    let record = st.operations.break_lock.clone().unwrap_or_default();
    let events = events_with_reason(&env, "LockBroken").await?;
    let note = events
        .first()
        .and_then(|e| e.message.clone())
        .unwrap_or_default();
    ensure(
        &env,
        record.phase == OperationPhase::Done
            && record.reason.as_deref() == Some("node lost with the run on it")
            && record.requested_by.is_some()
            && note.contains("node lost with the run on it")
            && note.contains(&format!(
                "lock broken by {}",
                record.requested_by.clone().unwrap_or_default()
            ))
            && st.history.iter().any(|h| {
                h.job_name.as_deref() == Some(stuck_job.as_str())
                    && h.outcome == Outcome::Failed
                    && h.reason.as_deref() == Some("LockBroken")
            }),
        ("status and Event", &record, &note, &st.history),
    )
    .await?;
    env.wait_job_gone("the stuck Job", &stuck_job).await?;

    // The waiting trigger now runs, above the broken fence; the new token writes.
    let started = env
        .wait_for(
            "the waiting trigger to start",
            Duration::from_secs(30),
            || async {
                let st = sj_status(&env, "payout").await?;
                Ok(st
                    .operations
                    .trigger
                    .filter(|t| t.id == waiting.id && t.phase == OperationPhase::Done))
            },
        )
        .await?;
    ensure(
        &env,
        started.token == Some(3),
        ("token after the break", &started),
    )
    .await?;
    ensure(
        &env,
        fenced_write(&prefix, &key, 3).await?.is_ok(),
        "token 3",
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn operation_errors_say_what_to_do() -> Result<()> {
    let env = Env::new("ops-errors").await?;
    let ns = env.ns.clone();
    // No controller runs in this test's namespace yet.
    env.create_sj(&sj_yaml("plain", DAILY, "")).await?;

    // An unknown name.
    for args in [
        vec!["trigger", "nope"],
        vec!["break-lock", "nope", "--reason", "x"],
        vec![
            "backfill",
            "nope",
            "--from",
            "2026-01-01T00:00:00Z",
            "--to",
            "2026-01-02T00:00:00Z",
        ],
    ] {
        let mut a = args.clone();
        a.extend(["-n", &ns]);
        let out = plugin(&a, &[])?;
        ensure(
            &env,
            out.status.code() == Some(1)
                && stderr(&out).contains(&format!("SingletonJob {ns}/nope not found")),
            (&args, stderr(&out)),
        )
        .await?;
    }
    // Bad arguments: usage errors (exit 2) before anything is written.
    for args in [
        vec!["break-lock", "plain"],
        vec![
            "backfill",
            "plain",
            "--from",
            "yesterday",
            "--to",
            "2026-01-02T00:00:00Z",
        ],
        vec!["trigger", "plain", "--timeout", "soon"],
    ] {
        let out = plugin(&args, &[])?;
        ensure(&env, out.status.code() == Some(2), (&args, stderr(&out))).await?;
    }
    let out = plugin(&["break-lock", "plain", "-n", &ns, "--reason", " "], &[])?;
    ensure(
        &env,
        out.status.code() == Some(1) && stderr(&out).contains("--reason must say why"),
        stderr(&out),
    )
    .await?;
    // backfill without a backstop: refused by the plugin, nothing written.
    let out = plugin(
        &[
            "backfill",
            "plain",
            "-n",
            &ns,
            "--from",
            "2026-01-01T00:00:00Z",
            "--to",
            "2026-01-02T00:00:00Z",
        ],
        &[],
    )?;
    ensure(
        &env,
        out.status.code() == Some(1) && stderr(&out).contains("backfill needs spec.backstop"),
        stderr(&out),
    )
    .await?;

    // No controller: the request is written, nobody acts, the message says so and how to withdraw.
    let out = plugin(&["trigger", "plain", "-n", &ns, "--timeout", "2s"], &[])?;
    let err = stderr(&out);
    ensure(
        &env,
        out.status.code() == Some(1)
            && err.contains("no controller acted on the trigger request within 2s")
            && err.contains(&format!(
                "kubectl annotate singletonjob plain -n {ns} singleton.dev/trigger-"
            )),
        ("no controller", &err),
    )
    .await?;
    let sj: SingletonJob = env.get_sj("plain").await?;
    ensure(
        &env,
        sj.annotations().contains_key("singleton.dev/trigger"),
        ("the request stays queued", sj.annotations()),
    )
    .await?;

    // Not permitted: a ServiceAccount that may read but not patch is told the verb.
    e2e::run_ok(e2e::kubectl().args(["create", "serviceaccount", "reader", "-n", &ns]))?;
    e2e::run_ok(e2e::kubectl().args([
        "create",
        "role",
        "sj-reader",
        "-n",
        &ns,
        "--verb=get,list",
        "--resource=singletonjobs.singleton.dev",
    ]))?;
    e2e::run_ok(e2e::kubectl().args([
        "create",
        "rolebinding",
        "sj-reader",
        "-n",
        &ns,
        "--role=sj-reader",
        &format!("--serviceaccount={ns}:reader"),
    ]))?;
    let kc = env.service_account_kubeconfig(&ns, "reader")?;
    let out = plugin(
        &["break-lock", "plain", "--reason", "x"],
        &[("KUBECONFIG", kc.as_os_str())],
    )?;
    ensure(
        &env,
        out.status.code() == Some(1)
            && stderr(&out).contains(&format!(
                "forbidden: you may not patch singletonjobs.singleton.dev in namespace {ns}"
            )),
        ("forbidden break-lock", stderr(&out)),
    )
    .await?;
    Ok(())
}
