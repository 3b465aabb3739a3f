//! Steps 7 and 8 of the run protocol ([`super`]): the confirm (a compare-and-swap naming the
//! Job's uid) and the resume of the confirmed Job, in a task of their own.

use std::sync::Arc;

use jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;

use super::create::Admission;
use crate::api::{Outcome, RunRef, SingletonJob, SingletonJobStatus};
use crate::context::Context;
use crate::decide::reason;
use crate::failpoint;
use crate::kube_io::{self, Propagation, Resumed, Unreleased};
use crate::lanes::Lane;
use crate::record;
use crate::{Error, Result};

/// Step 7's status: the claim moves from `pendingClaim` to `active`, the runs it replaced to the
/// history as Replaced, the run itself to the history as Running. A preparation moves to
/// `prepared` instead ([`prepared_after_confirm`]).
pub(super) fn status_after_confirm(
    fresh: &SingletonJob,
    claim: &RunRef,
    backstop_skipped: bool,
) -> SingletonJobStatus {
    if claim.resume_at.is_some() {
        return prepared_after_confirm(fresh, claim);
    }
    let mut status = fresh.status.clone().unwrap_or_default();
    status.pending_claim = None;
    // The confirmed status carries its run's token (G3), also when the status was wiped between
    // the claim and its completion and kept only the pending claim: a later claim then issues a
    // higher token without a backstop too, and this process's own copies are told from older
    // ones by it (`OwnWrites::predates`; with the token 0 every later copy looked older than
    // the confirm, and the SingletonJob waited for a change that never came).
    status.fencing_token = status.fencing_token.max(claim.token);
    status
        .active
        .retain(|r| !claim.replaces.iter().any(|o| o.job_name == r.job_name));
    let mut run = claim.clone();
    run.replaces.clear();
    // The backstop's row is taken over by now (step 4).
    run.supersedes = None;
    status.active.push(run);
    status.active_count = status.active.len() as i32;
    let now = Timestamp::now();
    for old in &claim.replaces {
        record::push_history(&mut status, record::replaced_entry(old, now));
    }
    let why = if backstop_skipped {
        Some(reason::BACKSTOP_SKIPPED.to_string())
    } else {
        claim.origin.map(|o| o.reason().to_string())
    };
    record::push_history(
        &mut status,
        record::run_entry(claim, Outcome::Running, why, None),
    );
    if backstop_skipped {
        // This run has no claim row: the claims table no longer knows every run (backfill).
        status.claims_recorded = None;
    }
    status
}

/// Step 7 of a preparation (issue 33): the claim moves from `pendingClaim` to `prepared`, with
/// its Job's uid. Nothing else changes: its period is not decided and nothing runs until the
/// resume at its instant ([`super::prepared`]); the history shows it from then (a run counts
/// from its resume). It replaces nothing (P1: no run is active).
fn prepared_after_confirm(fresh: &SingletonJob, claim: &RunRef) -> SingletonJobStatus {
    let mut status = fresh.status.clone().unwrap_or_default();
    status.pending_claim = None;
    status.fencing_token = status.fencing_token.max(claim.token);
    let mut run = claim.clone();
    run.replaces.clear();
    run.supersedes = None;
    status.prepared = Some(run);
    status
}

/// Steps 7 and 8: writes `status` over `fresh` (the status read in step 4); if it wins, resumes
/// the Job `uid`. Losing it, the Job never ran: it is deleted, unless the status that won made it
/// the period's run (another replica adopted it, and resumes it) or still holds the claim pending
/// (its completer will adopt it).
async fn confirm(
    ctx: &Context,
    fresh: SingletonJob,
    status: SingletonJobStatus,
    claim: RunRef,
    uid: String,
    admission: Admission,
) -> Result<()> {
    let ns = fresh.metadata.namespace.clone().unwrap_or_default();
    // `fresh` holds no status any more: the outbox was filled when `status` was made.
    let lane = super::lane(&claim, Lane::Create);
    match kube_io::write_status_filled(ctx, &fresh, status, lane, Some(failpoint::CONFIRM)).await {
        // A preparation: resumed at its instant, never now (G4). Its SingletonJob's next
        // reconcile (asked for when this task ends) keeps it until then.
        Ok(_) if claim.resume_at.is_some() => {
            ctx.own_writes.remember(&fresh, claim.token);
            crate::metrics::global().prepared(&fresh, crate::metrics::PreparedStage::Prepared);
            tracing::info!(job = %claim.job_name, token = claim.token, "prepared the run ahead of its instant");
            failpoint::hit(failpoint::PREPARE_CONFIRMED);
            Ok(())
        }
        Ok(_) => {
            ctx.own_writes.remember(&fresh, claim.token);
            for _ in &claim.replaces {
                crate::metrics::global().run_finished(&fresh, Outcome::Replaced);
            }
            let untested = Unreleased::Untested;
            resume(ctx, &fresh, &claim, &uid, &admission, untested).await?;
            Ok(())
        }
        Err(Error::Conflict(what)) => {
            let name = fresh.metadata.name.as_deref().unwrap_or_default();
            let won = kube_io::get_sj(ctx, &ns, name).await?;
            let names = |r: &RunRef| r.job_uid.as_deref() == Some(uid.as_str());
            let adopted = won
                .status
                .as_ref()
                .is_some_and(|s| s.active.iter().any(names) || s.prepared.iter().any(names));
            // Adopted: the winner resumes it (or, if it died first, whoever acts next:
            // `observe::to_resume`). Still pending: its completer adopts it.
            if !adopted && !super::claim_pending(&won, &claim) {
                tracing::warn!(job = %claim.job_name, token = claim.token, "lost the confirm: removing this claim's Job, which never ran");
                let bg = Propagation::Background;
                kube_io::delete_job_uid(ctx, &ns, &claim.job_name, &uid, bg, Lane::Create).await?;
            }
            Err(Error::Conflict(what))
        }
        Err(e) => Err(e),
    }
}

/// Step 8: the confirmed Job may run (G1: only the Job a confirm named, by uid), resumed by the
/// controller or released to its queue; either way marked released by the same patch. A prepared
/// run's resume tests its mark too ([`Unreleased::Tested`]). Returns what became of it.
pub async fn resume(
    ctx: &Context,
    sj: &SingletonJob,
    run: &RunRef,
    uid: &str,
    admission: &Admission,
    unreleased: Unreleased,
) -> Result<Resumed> {
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let release = admission.release();
    let deadline = crate::job::active_deadline_at(sj, run.period.0, Timestamp::now());
    let patch = kube_io::ResumeJob {
        name: &run.job_name,
        uid,
        token: run.token,
        release,
        active_deadline: deadline,
        unreleased,
    };
    let resumed = kube_io::resume_job(ctx, ns, &patch).await?;
    ctx.resumed.note(uid);
    match resumed {
        Resumed::Yes => {
            ctx.events.run_started(sj, run);
            // A rerun is not late for its (past) period: it was due when it was asked for.
            let due = match run.origin {
                Some(crate::api::RunOrigin::Rerun) => run.claimed_at.as_ref().map(|t| t.0),
                _ => None,
            };
            let now = Timestamp::now();
            crate::metrics::global().run_started(sj, due.unwrap_or(run.period.0), now);
        }
        Resumed::Already => {}
        Resumed::Gone => {
            tracing::info!(job = %run.job_name, "the run's Job was deleted before it could be resumed");
        }
    }
    Ok(resumed)
}

/// Starts steps 7 and 8 in a task of its own (see [`crate::context::InFlight`]); its log lines keep the run's
/// span. The task ends when the gate closes, whatever it was doing: a replica that lost the
/// Lease stops at once.
pub(super) fn spawn(
    ctx: &Arc<Context>,
    fresh: SingletonJob,
    status: SingletonJobStatus,
    claim: RunRef,
    uid: String,
    admission: Admission,
) {
    let sj_uid = fresh.metadata.uid.clone();
    let obj = ObjectRef::from_obj(&fresh);
    ctx.confirming.begin(sj_uid.as_deref());
    let ctx = ctx.clone();
    let task = async move {
        let work = confirm(&ctx, fresh, status, claim, uid, admission);
        let result = tokio::select! {
            r = work => r,
            () = ctx.gate.closed() => Err(Error::NotLeader),
        };
        ctx.confirming.end(sj_uid.as_deref(), obj, result).await;
    };
    tokio::spawn(tracing::Instrument::in_current_span(task));
}
