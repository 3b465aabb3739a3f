//! `kubectl singleton rerun NAME --period T [--replace]` against the real API server and
//! PostgreSQL: a decided period runs again with the same SINGLETON_PERIOD and idempotency key and
//! a new, greater token; in the backstop the period keeps one claim row, moved to the new token,
//! so PostgreSQL itself refuses the earlier run's writes through `singleton_fence`. A rerun while
//! the period's run is active is refused, and with `--replace` replaces it; periods that were
//! never decided, are not instants of the schedule or lie in the future are refused with what to
//! do instead; a malformed request is rejected in status and loses nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result};
use e2e::{
    Env, backstop_secret, backstop_spec, database_url, ensure, events_with_reason, never_scheduled,
    pg, plugin, sj_yaml, stderr, stdout, table_prefix, token_of,
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use singleton::api::{OperationPhase, OperationStatus, Outcome, SingletonJobStatus};
use singleton::schedule::Schedule;

/// Daily at 03:00 UTC: no scheduled period falls due during a test (unless it runs across 03:00,
/// which only adds a Job of another period). The periods re-run are backfilled ones from before
/// the SingletonJob existed.
const DAILY: &str = "0 3 * * *";

/// The `SINGLETON_*` environment of a Job's first container.
fn run_env(job: &Job) -> BTreeMap<String, String> {
    job.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.env.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.name.starts_with("SINGLETON_"))
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect()
}

fn op(out: &std::process::Output) -> Result<OperationStatus> {
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("-o json: {} {}", stdout(out), stderr(out)))
}

/// The backstop's claim rows of (`job`, `period`): (token, job name).
async fn claim_rows(prefix: &str, job: &str, period: Timestamp) -> Result<Vec<(i64, String)>> {
    let db = pg().await?;
    let rows = db
        .query(
            &format!("SELECT token, job_name FROM {prefix}claims WHERE job = $1 AND period = $2"),
            &[&job, &period],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// A workload's fenced write: what `singleton_fence` says to `token` (committed when it passes).
async fn fenced_write(
    prefix: &str,
    job: &str,
    token: u64,
) -> Result<std::result::Result<(), String>> {
    let mut db = pg().await?;
    let tx = db.transaction().await?;
    let token = i64::try_from(token)?;
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

async fn sj_status(env: &Env, name: &str) -> Result<SingletonJobStatus> {
    Ok(env.get_sj(name).await?.status.unwrap_or_default())
}

/// A SingletonJob `name` with the backstop, once the backstop records every run of it (so a
/// backfill may start); and the latest period of [`DAILY`] before it was created.
async fn ready(env: &Env, name: &str, prefix: &str, stuck: bool) -> Result<Timestamp> {
    let yaml = sj_yaml(name, DAILY, &backstop_spec("db", prefix, ""));
    let sj = env
        .create_sj(&if stuck { never_scheduled(yaml) } else { yaml })
        .await?;
    env.wait_for(
        "the backstop to record the SingletonJob's runs",
        Duration::from_secs(30),
        || async { Ok(sj_status(env, name).await?.claims_recorded.map(|_| ())) },
    )
    .await?;
    let created = sj
        .metadata
        .creation_timestamp
        .map(|t| t.0)
        .context("no creationTimestamp")?;
    Schedule::parse(DAILY, None, Default::default())?
        .latest_at_or_before(created - SignedDuration::from_secs(1))
        .context("no period before creation")
}

/// Runs `period` once with a backfill (it never ran: the SingletonJob is newer, so the backfill
/// says it knows, `--before-creation`), and returns its Job.
async fn backfill(env: &Env, name: &str, period: Timestamp) -> Result<Job> {
    let p = period.to_string();
    let out = plugin(
        &[
            "backfill",
            name,
            "-n",
            &env.ns,
            "--from",
            &p,
            "--to",
            &p,
            "--before-creation",
            "--wait",
            "-o",
            "json",
        ],
        &[],
    )?;
    let done = op(&out)?;
    ensure(
        env,
        out.status.success() && done.phase == OperationPhase::Done && done.started == 1,
        ("backfill", &done, stderr(&out)),
    )
    .await?;
    let job_name = done.job_name.clone().unwrap_or_default();
    Ok(env.jobs().get(&job_name).await?)
}

#[tokio::test]
async fn a_rerun_fences_out_the_earlier_run_and_replace_replaces_an_active_one() -> Result<()> {
    let mut env = Env::new("rerun-fence").await?;
    let ns = env.ns.clone();
    let prefix = table_prefix(&env);
    backstop_secret(&env, "db", &database_url()?, true).await?;
    env.start_controller(&[]).await?;
    // Its Jobs never get a node: a run, once started, stays active.
    let period = ready(&env, "ledger", &prefix, true).await?;
    let key = format!("{ns}/ledger");
    let p = period.to_string();

    let first = backfill(&env, "ledger", period).await?;
    let (first_name, first_token, first_env) =
        (first.name_any(), token_of(&first), run_env(&first));
    ensure(
        &env,
        fenced_write(&prefix, &key, first_token).await?.is_ok(),
        "the earlier run holds the fence and writes",
    )
    .await?;

    // Refused while the period's run is active: the message says how to go on.
    let out = plugin(&["rerun", "ledger", "-n", &ns, "--period", &p], &[])?;
    let err = stderr(&out);
    ensure(
        &env,
        out.status.code() == Some(1)
            && err.contains(&format!(
                "rerun rejected by the controller: period {p} is still running (Job {first_name} with token {first_token})"
            ))
            && err.contains("--replace"),
        ("rerun while active", &err, stdout(&out)),
    )
    .await?;
    let st = sj_status(&env, "ledger").await?;
    ensure(
        &env,
        st.operations
            .rerun
            .as_ref()
            .is_some_and(|o| o.phase == OperationPhase::Rejected)
            && st.fencing_token == first_token
            && env.jobs().get_opt(&first_name).await?.is_some(),
        ("refused: nothing issued, nothing deleted", &st.operations),
    )
    .await?;

    // --replace: the active run is fenced out and deleted, the period runs again.
    let out = plugin(
        &[
            "rerun",
            "ledger",
            "-n",
            &ns,
            "--period",
            &p,
            "--replace",
            "-o",
            "json",
        ],
        &[],
    )?;
    let rerun = op(&out)?;
    let token = rerun.token.unwrap_or_default();
    let job_name = rerun.job_name.clone().unwrap_or_default();
    ensure(
        &env,
        out.status.success()
            && rerun.phase == OperationPhase::Done
            && token > first_token
            && job_name == format!("{first_name}-r{token}")
            && rerun.requested_by.is_some()
            && rerun.message.contains(&format!(
                "replaced the active run {first_name} (token {first_token})"
            )),
        ("rerun --replace", &rerun, stderr(&out)),
    )
    .await?;
    let job = env.wait_job(&job_name).await?;
    let again = run_env(&job);
    ensure(
        &env,
        token_of(&job) == token
            && again.get("SINGLETON_PERIOD") == first_env.get("SINGLETON_PERIOD")
            && again.get("SINGLETON_PERIOD") == Some(&p)
            && again.get("SINGLETON_IDEMPOTENCY_KEY") == first_env.get("SINGLETON_IDEMPOTENCY_KEY")
            && again.get("SINGLETON_FENCING_TOKEN") == Some(&token.to_string()),
        ("the rerun's Job", &again, &first_env),
    )
    .await?;

    // The fence: PostgreSQL refuses the earlier run's writes, the rerun's pass.
    let refused = fenced_write(&prefix, &key, first_token).await?;
    ensure(
        &env,
        refused.as_ref().is_err_and(|e| {
            e.starts_with("SF001") && e.contains(&format!("stale fencing token {first_token}"))
        }),
        ("the earlier token after the rerun", &refused),
    )
    .await?;
    let passed = fenced_write(&prefix, &key, token).await?;
    ensure(&env, passed.is_ok(), ("the rerun's token", &passed)).await?;
    // One claim per (job, period), now naming the rerun.
    let rows = claim_rows(&prefix, &key, period).await?;
    ensure(
        &env,
        rows == [(i64::try_from(token)?, job_name.clone())],
        ("the period's claim rows", &rows),
    )
    .await?;

    env.wait_job_gone("the replaced Job", &first_name).await?;
    // History: the rerun with who asked, the earlier run as Replaced; an Event says the same.
    let by = rerun.requested_by.clone().unwrap_or_default();
    let st = sj_status(&env, "ledger").await?;
    let events = events_with_reason(&env, "RerunStarted").await?;
    let note = events
        .first()
        .and_then(|e| e.message.clone())
        .unwrap_or_default();
    ensure(
        &env,
        st.history.iter().any(|h| {
            h.job_name.as_deref() == Some(job_name.as_str())
                && h.outcome == Outcome::Running
                && h.reason.as_deref() == Some("Rerun")
                && h.requested_by.as_deref() == Some(by.as_str())
                && h.token == Some(token)
        }) && st.history.iter().any(|h| {
            h.job_name.as_deref() == Some(first_name.as_str())
                && h.outcome == Outcome::Replaced
                && h.token == Some(first_token)
        }) && st
            .active
            .iter()
            .map(|r| r.job_name.as_str())
            .eq([job_name.as_str()])
            && note.contains(&format!("rerun requested by {by}: Job {job_name}"))
            && note.contains(&format!("earlier token {first_token} is fenced out")),
        (
            "history, active runs and the Event",
            &st.history,
            &st.active,
            &note,
        ),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_finished_period_is_re_run_and_periods_never_decided_are_refused() -> Result<()> {
    let mut env = Env::new("rerun-done").await?;
    let ns = env.ns.clone();
    let prefix = table_prefix(&env);
    backstop_secret(&env, "db", &database_url()?, true).await?;
    env.start_controller(&[]).await?;
    let period = ready(&env, "billing", &prefix, false).await?;
    let key = format!("{ns}/billing");
    let p = period.to_string();
    let first = backfill(&env, "billing", period).await?;
    let (first_name, first_token, first_env) =
        (first.name_any(), token_of(&first), run_env(&first));
    env.wait_for(
        "the period's run to succeed",
        Duration::from_secs(60),
        || async {
            let st = sj_status(&env, "billing").await?;
            Ok(st
                .history
                .iter()
                .any(|h| {
                    h.job_name.as_deref() == Some(first_name.as_str())
                        && h.outcome == Outcome::Succeeded
                })
                .then_some(()))
        },
    )
    .await?;

    // Periods that cannot be re-run: each refused with why and what to do instead.
    let day = SignedDuration::from_hours(24);
    let never = (period - day).to_string();
    let not_an_instant = (period + SignedDuration::from_mins(30)).to_string();
    let future = (period + day * 3).to_string();
    for (at, says) in [
        (never.as_str(), "was never decided"),
        (never.as_str(), "kubectl singleton backfill --from"),
        (not_an_instant.as_str(), "is not an instant of the schedule"),
        (not_an_instant.as_str(), "kubectl singleton trigger"),
        (future.as_str(), "lies in the future"),
    ] {
        let out = plugin(&["rerun", "billing", "-n", &ns, "--period", at], &[])?;
        let err = stderr(&out);
        ensure(
            &env,
            out.status.code() == Some(1)
                && err.contains("rerun rejected by the controller")
                && err.contains(says),
            (at, says, &err),
        )
        .await?;
    }
    // Not an instant at all: a usage error before anything is written.
    let out = plugin(
        &["rerun", "billing", "-n", &ns, "--period", "yesterday"],
        &[],
    )?;
    ensure(
        &env,
        out.status.code() == Some(2),
        ("--period yesterday", stderr(&out)),
    )
    .await?;
    // A malformed request written by hand: rejected in status, saying why.
    let bad = r#"{"id":"by-hand-1","by":"someone","period":"last tuesday"}"#;
    let patch = serde_json::json!({"metadata": {"annotations": {"singleton.dev/rerun": bad}}});
    env.sjs()
        .patch("billing", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let rejected = env
        .wait_for(
            "the malformed request to be rejected",
            Duration::from_secs(20),
            || async {
                let st = sj_status(&env, "billing").await?;
                Ok(st.operations.rerun.filter(|o| {
                    o.phase == OperationPhase::Rejected && o.message.contains("last tuesday")
                }))
            },
        )
        .await?;
    ensure(
        &env,
        rejected.message.contains("is not an RFC 3339 instant")
            && rejected
                .message
                .contains("singleton.dev/rerun is not a valid request"),
        ("the malformed request's record", &rejected),
    )
    .await?;
    let token_before = sj_status(&env, "billing").await?.fencing_token;
    ensure(
        &env,
        token_before == first_token,
        ("no token issued by a refusal", token_before),
    )
    .await?;

    // The finished period, re-run (nothing lost by the refusals before): the text names the Job
    // and the new token.
    let out = plugin(&["rerun", "billing", "-n", &ns, "--period", &p], &[])?;
    let text = stdout(&out);
    let token = first_token + 1;
    let job_name = format!("{first_name}-r{token}");
    ensure(
        &env,
        out.status.success()
            && text.starts_with(&format!(
                "singletonjob {ns}/billing: re-ran period {p}: started Job {job_name} with fencing token {token}"
            ))
            && text.contains(&format!("moved from token {first_token} to it")),
        ("rerun of a finished period", &text, stderr(&out)),
    )
    .await?;
    let job = env.wait_job(&job_name).await?;
    let again = run_env(&job);
    ensure(
        &env,
        again.get("SINGLETON_PERIOD") == first_env.get("SINGLETON_PERIOD")
            && again.get("SINGLETON_IDEMPOTENCY_KEY") == first_env.get("SINGLETON_IDEMPOTENCY_KEY")
            && token_of(&job) == token
            // The earlier Job is kept as history under its own name.
            && env.jobs().get_opt(&first_name).await?.is_some(),
        ("the rerun's Job", &again, &first_env),
    )
    .await?;
    let rows = claim_rows(&prefix, &key, period).await?;
    ensure(
        &env,
        rows == [(i64::try_from(token)?, job_name.clone())],
        ("one claim row, moved to the rerun", &rows),
    )
    .await?;
    let refused = fenced_write(&prefix, &key, first_token).await?;
    ensure(
        &env,
        refused.as_ref().is_err_and(|e| e.starts_with("SF001")),
        ("the earlier token", &refused),
    )
    .await?;
    // The rerun finishes like any run; the period's history holds both runs.
    env.wait_for("the rerun to succeed", Duration::from_secs(60), || async {
        let st = sj_status(&env, "billing").await?;
        let ran = |name: &str, reason: &str| {
            st.history.iter().any(|h| {
                h.job_name.as_deref() == Some(name)
                    && h.outcome == Outcome::Succeeded
                    && h.reason.as_deref() == Some(reason)
                    && h.requested_by.is_some()
            })
        };
        Ok((ran(&job_name, "Rerun") && ran(&first_name, "Backfill")).then_some(()))
    })
    .await?;
    Ok(())
}
