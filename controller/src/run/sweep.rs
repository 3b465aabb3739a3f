//! The last line of defence against a second run, and the completion of a lost resume: held
//! against the status, the SingletonJob's own Jobs (see [`crate::observe::owned()`]) that no claim
//! knows are removed by uid, with an Event; runs someone else started are stopped; confirmed
//! runs whose Job was never released are resumed (or released to their queue).

use jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use crate::api::{Outcome, RunRef, SingletonJob, SingletonJobStatus};
use crate::backstop::Availability;
use crate::context::Context;
use crate::decide::reason;
use crate::kube_io::{self, Propagation, Unreleased};
use crate::lanes::Lane;
use crate::{Error, Result, observe, record, run};

/// The last line of defence and the completion of a lost resume (see [`observe`]): Jobs of
/// decided periods that no claim knows are removed by uid, with an Event; confirmed runs whose
/// Job is still suspended are resumed.
/// Returns whether it wrote the status (a run someone else started was stopped): the reconcile
/// then starts again from the written status. `due_now` is the earliest time the API server's
/// clock may show: no Job is resumed before its `singleton.dev/resume-at` (G4).
pub async fn check_jobs(
    ctx: &Context,
    sj: &SingletonJob,
    status: &SingletonJobStatus,
    owned: &[observe::OwnedJob],
    db: &Availability,
    due_now: Timestamp,
) -> Result<bool> {
    remove_unknown(ctx, sj, status, owned).await?;
    if let Some((run, job)) = observe::started_outside(status, owned).into_iter().next() {
        let note = format!(
            "Job {} (token {}) was started by someone other than the controller (spec.suspend cleared by a person, a tool, a webhook or a queue without the controller's release): only the controller starts a run, after its claim is confirmed; the Job was deleted, its token retired, and the period is decided Failed",
            job.name, run.token
        );
        let stop = Stop {
            outcome: Outcome::Failed,
            reason: reason::STARTED_BEFORE_CONFIRM,
            note,
        };
        stop_run(ctx, sj, status, &run, job, stop, db).await?;
        return Ok(true);
    }
    let resume = observe::to_resume(status, owned, due_now);
    // Decoding the template is only worth it when there is something to resume.
    if resume.is_empty() {
        return Ok(false);
    }
    let admission = run::admission(sj);
    for (name, uid) in resume {
        if ctx.resumed.contains(&uid) {
            continue;
        }
        let Some(run) = status.active.iter().find(|r| r.job_name == name) else {
            continue;
        };
        tracing::info!(sj = %sj.key(), job = %name, "resuming a confirmed run's Job (its resume was lost)");
        match run::resume(ctx, sj, run, &uid, &admission, Unreleased::Untested).await {
            // Refused by admission (a webhook or policy denying the unsuspend) past the period's
            // wait bound: not retried for ever ahead of every later period (F10a).
            Err(Error::Kube(kube::Error::Api(e)))
                if matches!(e.code, 400 | 403 | 422)
                    && crate::decide::wait_bound(&sj.spec, run.period.0)
                        .is_some_and(|b| Timestamp::now() > b) =>
            {
                let Some(job) = owned.iter().find(|j| j.uid == uid) else {
                    continue;
                };
                let note = format!(
                    "the resume of Job {name} (token {}) was refused until the period's wait bound: {}; the Job never ran, it was deleted and the period is decided Missed",
                    run.token, e.message
                );
                let stop = Stop {
                    outcome: Outcome::Missed,
                    reason: reason::RESUME_REFUSED,
                    note,
                };
                stop_run(ctx, sj, status, run, job, stop, db).await?;
                return Ok(true);
            }
            r => {
                r?;
            }
        }
    }
    Ok(false)
}

/// G1's last line: the SingletonJob's Jobs of decided periods that no claim knows are removed
/// by uid, with an Event.
async fn remove_unknown(
    ctx: &Context,
    sj: &SingletonJob,
    status: &SingletonJobStatus,
    owned: &[observe::OwnedJob],
) -> Result<()> {
    let ns = sj.namespace().unwrap_or_default();
    for job in observe::unknown(status, owned) {
        let bg = Propagation::Background;
        if !kube_io::delete_job_uid(ctx, &ns, &job.name, &job.uid, bg, Lane::Create).await? {
            continue;
        }
        let ran = if job.suspended {
            "it never ran"
        } else {
            "it was running: a second run of a decided period"
        };
        let note = format!(
            "removed Job {} (token {}): no claim knows it, its period is decided; {ran}",
            job.name,
            job.token.unwrap_or_default()
        );
        tracing::warn!(sj = %sj.key(), job = %job.name, uid = %job.uid, "{note}");
        ctx.events
            .publish(
                sj,
                EventType::Warning,
                "UnknownJobRemoved",
                "ObserveJobs",
                note,
            )
            .await;
    }
    Ok(())
}

/// How a run the sweep stops is decided.
struct Stop {
    outcome: Outcome,
    reason: &'static str,
    note: String,
}

/// Stops a run the controller did not start (G1: only the controller starts a run, after its
/// confirm), or one it could not: in this order, its token is retired, so nothing its pods write
/// commits from now on (G3), its period is decided with an Event (the run leaves `active` or the
/// pending claim), and its Job is deleted by uid with its pods. Under Correctness nothing happens
/// until the retirement can be written. Deleting before the status write would let a replica
/// complete a pending claim with a new Job of the same token (the model check's
/// `DeleteBeforeRetire`); a Job left behind by a stop cut short is one of a decided period, which
/// the next sweep removes.
async fn stop_run(
    ctx: &Context,
    sj: &SingletonJob,
    status: &SingletonJobStatus,
    run: &RunRef,
    job: &observe::OwnedJob,
    stop: Stop,
    db: &Availability,
) -> Result<()> {
    let ns = sj.namespace().unwrap_or_default();
    match db {
        Availability::Ready(b) => {
            ctx.gate.check()?;
            run::retire(sj, b, run.token).await?;
        }
        Availability::Unavailable(why) if sj.purpose() == crate::api::LockPurpose::Correctness => {
            return Err(Error::BackstopUnavailable(format!(
                "Job {} is to be stopped once its token {} can be retired: {why}",
                job.name, run.token
            )));
        }
        _ => {}
    }
    let mut next = status.clone();
    next.pending_claim = next.pending_claim.filter(|p| p.job_name != run.job_name);
    next.active.retain(|r| r.job_name != run.job_name);
    next.active_count = next.active.len() as i32;
    // A prepared run started before its instant (or after its withdrawal): pods ran, so its
    // period is decided by this stop.
    if next
        .prepared
        .as_ref()
        .is_some_and(|p| p.job_name == run.job_name)
    {
        next.prepared = None;
        if next
            .decided_through
            .as_ref()
            .is_none_or(|c| c.0 < run.period.0)
        {
            next.decided_through = Some(run.period.0.into());
        }
    }
    next.history
        .retain(|h| h.job_name.as_deref() != Some(run.job_name.as_str()));
    let why = Some(stop.reason.to_string());
    let entry = record::run_entry(run, stop.outcome, why, Some(Timestamp::now()));
    next.last_result = Some(stop.outcome);
    record::push_history(&mut next, entry.clone());
    kube_io::write_status(ctx, sj, next, Lane::Background).await?;
    crate::metrics::global().recorded(sj, &entry);
    let fg = Propagation::Foreground;
    kube_io::delete_job_uid(ctx, &ns, &job.name, &job.uid, fg, Lane::Create).await?;
    tracing::warn!(sj = %sj.key(), job = %job.name, uid = %job.uid, "{}", stop.note);
    ctx.events
        .publish(
            sj,
            EventType::Warning,
            stop.reason,
            "ObserveJobs",
            stop.note,
        )
        .await;
    Ok(())
}
