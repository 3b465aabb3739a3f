//! Two faults from outside the controller at a run's edges (issue 31), on the kwok world:
//!
//! - `queue-resumer`: something that admits every Job it sees (a queue configured to manage Jobs
//!   without its label, a GitOps tool, a person) clears `spec.suspend` on each suspended Job of
//!   the namespace within 20 ms of seeing it. Only the controller starts a run: a Job started
//!   before its release is stopped (its token retired first) and its period decided, so each
//!   period still has at most one attempt that committed. Proves: the resumer started Jobs the
//!   controller had not released, the watch saw them allowed to run unreleased, and every one of
//!   them is gone, its run decided `StartedBeforeConfirm`.
//! - `db-cut-at-completion`: the replicas' link to PostgreSQL (a proxy of the test's; the
//!   workload connects directly) is cut while a run works and stays cut until after the run
//!   completed. Its outcome waits for its token's retirement (G3): while cut the run stays active
//!   and nothing of it is recorded; once the link is back it is recorded and the fence's retired
//!   mark has reached its token. Proves: the run completed inside the cut.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, ListParams, Patch, PatchParams};
use singleton::api::{Outcome, SingletonJobStatus};
use singleton::decide::reason;

use super::Injected;
use super::check::Proof;
use super::world::World;
use crate::observer::JobRecord;

/// How often the resumer lists the namespace's Jobs: well inside the controller's window
/// between create and resume (a status write), so it wins that race often.
const RESUMER_POLL: Duration = Duration::from_millis(20);
/// How much longer than its window queue-resumer keeps the resumer on while it has not yet won
/// a race.
const RESUMER_EXTRA: Duration = Duration::from_secs(60);
/// The SingletonJob whose run db-cut-at-completion cuts the link under.
const CUT_SJ: &str = "tick";

/// `queue-resumer`; see the module doc.
pub(super) async fn queue_resumer(w: &mut World, window: Duration) -> Result<Injected> {
    let mut inj = Injected::default();
    let jobs: Api<Job> = Api::namespaced(w.env.client.clone(), &w.env.ns);
    let started = Arc::new(AtomicUsize::new(0));
    let resumer = tokio::spawn(resume_everything(jobs, started.clone()));
    inj.from = Some(Timestamp::now());
    w.run_for(window).await?;
    // The resumer races the controller's confirm and resume (tens of milliseconds); on a busy
    // machine its list can lose every race of a short window (a CI run: 0 of 8). The fault is
    // then kept on, a period at a time, until it has fired (at most RESUMER_EXTRA more): the row
    // judges the controller against a resumer that won, never against one that did not.
    let extra = Instant::now();
    while started.load(Ordering::SeqCst) == 0 && extra.elapsed() < RESUMER_EXTRA {
        w.run_for(Duration::from_secs(1)).await?;
    }
    resumer.abort();
    let started = started.load(Ordering::SeqCst);
    inj.proofs.push(Proof::new(
        started > 0,
        format!("the resumer cleared spec.suspend on {started} Job(s) still suspended"),
    ));
    // What the watch saw, not what the resumer believes: runs allowed to run while their
    // released mark still said "false", each stopped since (given 30 s).
    let unreleased = |jobs: &[JobRecord]| -> Vec<JobRecord> {
        jobs.iter().filter(|j| j.ran_unreleased).cloned().collect()
    };
    let gone = w
        .wait_jobs(
            Duration::from_secs(30),
            Duration::from_millis(200),
            |jobs| unreleased(jobs).iter().all(|j| j.deleted.is_some()),
        )
        .await?;
    let seen = unreleased(&w.observer.jobs());
    // Stopped, not merely pruned: each one's run decided as started outside (its history entry,
    // or its Event when history has moved on).
    let mut undecided = Vec::new();
    for j in &seen {
        let sj = j.sj.clone().unwrap_or_default();
        let st = w.env.get_sj(&sj).await?.status.unwrap_or_default();
        let decided = st.history.iter().any(|h| {
            h.job_name.as_deref() == Some(j.name.as_str())
                && h.reason.as_deref() == Some(reason::STARTED_BEFORE_CONFIRM)
        });
        if !decided {
            undecided.push(j.name.clone());
        }
    }
    inj.proofs.push(Proof::new(
        !seen.is_empty() && gone && undecided.is_empty(),
        format!(
            "the watch saw {} Job(s) run before the controller released them; all gone: {gone}; decided {} (runs not decided so: {undecided:?})",
            seen.len(),
            reason::STARTED_BEFORE_CONFIRM
        ),
    ));
    Ok(inj)
}

/// Unsuspends every suspended Job of the controller's it lists, every [`RESUMER_POLL`], as a
/// queue admitting everything would; counts the patches that found the Job still suspended.
async fn resume_everything(jobs: Api<Job>, started: Arc<AtomicUsize>) {
    let lp = ListParams::default().labels("singleton.dev/job");
    // Only a Job still suspended: the count is of runs this resumer started.
    let ops = serde_json::json!([
        {"op": "test", "path": "/spec/suspend", "value": true},
        {"op": "replace", "path": "/spec/suspend", "value": false},
    ]);
    let Ok(unsuspend) = serde_json::from_value::<json_patch::Patch>(ops) else {
        return;
    };
    loop {
        if let Ok(list) = jobs.list(&lp).await {
            for job in list {
                if job.spec.as_ref().and_then(|s| s.suspend) != Some(true) {
                    continue;
                }
                let name = job.metadata.name.clone().unwrap_or_default();
                let pp = PatchParams::default();
                if jobs
                    .patch(&name, &pp, &Patch::Json::<()>(unsuspend.clone()))
                    .await
                    .is_ok()
                {
                    started.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        tokio::time::sleep(RESUMER_POLL).await;
    }
}

/// `db-cut-at-completion`; see the module doc. The cut lasts at least `window`, and until a
/// few seconds after the run completed.
pub(super) async fn db_cut_at_completion(w: &mut World, window: Duration) -> Result<Injected> {
    let mut inj = Injected::default();
    let working = |jobs: &[JobRecord]| -> Option<JobRecord> {
        jobs.iter()
            .find(|j| {
                j.sj.as_deref() == Some(CUT_SJ) && j.ran && !j.finished && j.deleted.is_none()
            })
            .cloned()
    };
    let found = w
        .wait_jobs(Duration::from_secs(20), Duration::from_millis(10), |jobs| {
            working(jobs).is_some()
        })
        .await?;
    let run = working(&w.observer.jobs())
        .filter(|_| found)
        .context("no run of `tick` was seen working within 20 s")?;
    let link = w
        .db_link
        .as_ref()
        .context("the world has no database link to cut")?;
    link.stall();
    let cut = Instant::now();
    inj.from = Some(Timestamp::now());

    // While cut: the run completes; it stays active and nothing of it is recorded.
    let mut completed_at = None;
    let mut recorded_while_cut = Vec::new();
    let mut held_after_completion = false;
    while cut.elapsed() < window
        || completed_at.is_none_or(|t: Instant| t.elapsed() < Duration::from_secs(3))
    {
        if cut.elapsed() > window + Duration::from_secs(30) {
            break;
        }
        w.run_for(Duration::from_millis(250)).await?;
        let seen = w.observer.jobs();
        if completed_at.is_none() && seen.iter().any(|j| j.uid == run.uid && j.finished) {
            completed_at = Some(Instant::now());
        }
        let st = w.env.get_sj(CUT_SJ).await?.status.unwrap_or_default();
        if recorded_outcome(&st, &run.name) {
            recorded_while_cut.push(Timestamp::now());
        }
        if completed_at.is_some() {
            held_after_completion = st.active.iter().any(|r| r.job_name == run.name);
        }
    }
    if let Some(link) = &w.db_link {
        link.up();
    }
    let cut_for = cut.elapsed();
    inj.proofs.push(Proof::new(
        completed_at.is_some(),
        format!(
            "run {} (token {}) completed while the link was cut ({:.1} s): {}",
            run.name,
            run.token.unwrap_or_default(),
            cut_for.as_secs_f64(),
            completed_at.map_or("no".to_string(), |t| format!(
                "{:.1} s into the cut",
                (t - cut).as_secs_f64()
            ))
        ),
    ));
    inj.proofs.push(Proof::new(
        recorded_while_cut.is_empty() && held_after_completion,
        format!(
            "its outcome was held while cut (still active at the end of the cut: {held_after_completion}; recorded while cut at {recorded_while_cut:?})"
        ),
    ));
    inj.proofs.push(recorded_after_retirement(w, &run).await?);
    Ok(inj)
}

/// Once the link is back (given 60 s): the run's outcome recorded, and the fence's retired mark
/// at or above its token, read from the database.
async fn recorded_after_retirement(w: &mut World, run: &JobRecord) -> Result<Proof> {
    let token = run.token.unwrap_or_default();
    let end = Instant::now() + Duration::from_secs(60);
    let mut recorded = false;
    while !recorded && Instant::now() < end {
        w.run_for(Duration::from_millis(500)).await?;
        let st = w.env.get_sj(CUT_SJ).await?.status.unwrap_or_default();
        recorded = recorded_outcome(&st, &run.name);
    }
    let key = format!("{}/{CUT_SJ}", w.env.ns);
    let retired: Option<i64> = crate::pg()
        .await?
        .query_opt(
            &format!("SELECT retired FROM {}fences WHERE job = $1", w.prefix),
            &[&key],
        )
        .await?
        .map(|r| r.get(0));
    let retired = retired.unwrap_or_default();
    Ok(Proof::new(
        recorded && retired >= token as i64,
        format!(
            "recorded once the link was back: {recorded}; the fence's retired mark {retired} (its token {token})"
        ),
    ))
}

/// Whether the status records an outcome of the run of Job `name` (its history shows a run
/// still in progress as `Running`: that is no outcome).
fn recorded_outcome(st: &SingletonJobStatus, name: &str) -> bool {
    st.history
        .iter()
        .any(|h| h.job_name.as_deref() == Some(name) && h.outcome != Outcome::Running)
}
