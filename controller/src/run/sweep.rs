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
use crate::kube_io::{self, Propagation};
use crate::lanes::Lane;
use crate::{Result, observe, record, run};

/// The last line of defence and the completion of a lost resume (see [`observe`]): Jobs of
/// decided periods that no claim knows are removed by uid, with an Event; confirmed runs whose
/// Job is still suspended are resumed.
/// Returns whether it wrote the status (a run someone else started was stopped): the reconcile
/// then starts again from the written status.
pub async fn check_jobs(
    ctx: &Context,
    sj: &SingletonJob,
    status: &SingletonJobStatus,
    owned: &[observe::OwnedJob],
    db: &Availability,
) -> Result<bool> {
    let ns = sj.namespace().unwrap_or_default();
    for job in observe::unknown(status, owned) {
        let bg = Propagation::Background;
        if kube_io::delete_job_uid(ctx, &ns, &job.name, &job.uid, bg, Lane::Create).await? {
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
    }
    if let Some((run, job)) = observe::started_outside(status, owned).into_iter().next() {
        stop_started_outside(ctx, sj, status, &run, job, db).await?;
        return Ok(true);
    }
    let resume = observe::to_resume(status, owned);
    // Decoding the template is only worth it when there is something to resume.
    if resume.is_empty() {
        return Ok(false);
    }
    let admission = run::admission(sj);
    for (name, uid) in resume {
        if ctx.resumed.contains(&uid) {
            continue;
        }
        if let Some(run) = status.active.iter().find(|r| r.job_name == name) {
            tracing::info!(sj = %sj.key(), job = %name, "resuming a confirmed run's Job (its resume was lost)");
            run::resume(ctx, sj, run, &uid, &admission).await?;
        }
    }
    Ok(false)
}

/// A run someone else started (G1: only the controller starts a run, after its confirm): its
/// token is retired first, so nothing its pods write commits from now on (G3), then its Job is
/// deleted by uid with its pods, and its period is decided Failed (StartedBeforeConfirm) with an
/// Event. Under Correctness nothing is recorded until the retirement is written; the Job is
/// stopped meanwhile anyway.
async fn stop_started_outside(
    ctx: &Context,
    sj: &SingletonJob,
    status: &SingletonJobStatus,
    run: &RunRef,
    job: &observe::OwnedJob,
    db: &Availability,
) -> Result<()> {
    let ns = sj.namespace().unwrap_or_default();
    let retired = match db {
        Availability::Ready(b) => {
            ctx.gate.check()?;
            run::retire(sj, b, run.token).await.map(|()| true)
        }
        Availability::NotConfigured => Ok(true),
        Availability::Unavailable(_) => Ok(false),
    };
    let fg = Propagation::Foreground;
    kube_io::delete_job_uid(ctx, &ns, &job.name, &job.uid, fg, Lane::Create).await?;
    if !retired? && sj.purpose() == crate::api::LockPurpose::Correctness {
        return Err(crate::Error::BackstopUnavailable(format!(
            "Job {} was started outside the controller and is stopped; its token {} is retired before its outcome is recorded",
            job.name, run.token
        )));
    }
    let mut next = status.clone();
    next.pending_claim = next.pending_claim.filter(|p| p.job_name != run.job_name);
    next.active.retain(|r| r.job_name != run.job_name);
    next.active_count = next.active.len() as i32;
    next.history
        .retain(|h| h.job_name.as_deref() != Some(run.job_name.as_str()));
    let why = Some(reason::STARTED_BEFORE_CONFIRM.to_string());
    let entry = record::run_entry(run, Outcome::Failed, why, Some(Timestamp::now()));
    next.last_result = Some(Outcome::Failed);
    record::push_history(&mut next, entry.clone());
    kube_io::write_status(ctx, sj, next, Lane::Background).await?;
    crate::metrics::global().recorded(sj, &entry);
    let note = format!(
        "Job {} (token {}) was started by someone other than the controller (spec.suspend cleared by a person, a tool, a webhook or a queue without the controller's release): only the controller starts a run, after its claim is confirmed; the Job was deleted, its token retired, and the period is decided Failed",
        job.name, run.token
    );
    tracing::warn!(sj = %sj.key(), job = %job.name, uid = %job.uid, "{note}");
    ctx.events
        .publish(sj, EventType::Warning, reason::STARTED_BEFORE_CONFIRM, "ObserveJobs", note)
        .await;
    Ok(())
}
