//! Breaking a stuck lock (`kubectl singleton break-lock`), with its own numbered steps.

use jiff::Timestamp;

use crate::api::{Outcome, RunRef, SingletonJob, SingletonJobStatus};
use crate::backstop::Availability;
use crate::context::Context;
use crate::decide::prepare::WithdrawReason;
use crate::decide::reason;
use crate::job;
use crate::kube_io::{self, Marked, Propagation};
use crate::lanes::Lane;
use crate::naming;
use crate::record;
use crate::{Error, Result};

/// Breaks the lock (`kubectl singleton break-lock`): every token issued so far is fenced out, a
/// pending claim is cleared and the active runs are stopped, so a stuck or stale holder can
/// neither block later periods nor write. Who asked and why go into
/// `status.operations.breakLock` and a `LockBroken` Event. `op` is the accepted request's record.
/// Returns the record as written (phase Done).
///
/// ```text
/// 1. Gate   : only the replica that may act                                         G4
/// 1b.Prepared: a prepared run's Job is marked withdrawn (LockBroken): never resumed   G1
/// 2. Token  : one above every issued token (status and backstop fence)               G3
/// 3. Fence  : the backstop's fence rises to it and it is retired: from now on
///             singleton_fence refuses every older token, whatever its holder does.
///             A stuck run holding the fence row is stopped first (5), the sessions
///             holding the fence ended, then 3 again.                              G5
/// 4. Record : one resourceVersion-guarded status write: the new token, the stopped
///             runs as Failed/LockBroken, no pending claim, the operation Done. A 409
///             redoes it all: raising a fence twice only skips a token number.         G3
/// 5. Stop   : delete the pending claim's Job and the active runs' Jobs (foreground),
///             only once 4 is written: deleted before it, a pending claim's name would
///             be free for its completion to create a Job with a retired token.   G1, G5
/// ```
pub async fn break_lock(
    ctx: &Context,
    sj: &SingletonJob,
    mut op: crate::api::OperationStatus,
    db: &Availability,
) -> Result<crate::api::OperationStatus> {
    // 1. Gate.
    ctx.gate.check()?;
    let mut status = sj.status.clone().unwrap_or_default();
    let ns = sj.metadata.namespace.clone().unwrap_or_default();
    // 1b. A prepared run never runs once the lock is broken (G1).
    let resumed = withdraw_prepared(ctx, &ns, &mut status).await?;

    // 2. Token.
    let fence = match db {
        Availability::Ready(b) => b.fence(&sj.backstop_key()).await?,
        Availability::NotConfigured => 0,
        // Breaking a lock without the fence would promise what it cannot keep: wait for it.
        Availability::Unavailable(why) => return Err(Error::BackstopUnavailable(why.clone())),
    };
    let before = status.fencing_token.max(fence);
    let token = crate::backstop::next_token(before)?;

    // 5 before 3 when the stuck run holds the fence row in an open transaction.
    let mut stopped: Vec<RunRef> = std::mem::take(&mut status.active);
    stopped.extend(status.pending_claim.take());
    stopped.extend(resumed);
    if let Availability::Ready(b) = db {
        // 3. Fence.
        ctx.gate.check()?;
        if let Err(e) = b.retire(&sj.backstop_key(), token, &ns).await {
            if matches!(e, Error::FenceHeld(_)) {
                stop_runs(ctx, &ns, &stopped).await?;
                end_holders(ctx, sj, b).await?;
            }
            return Err(e);
        }
    }

    // 4. Record.
    let now = Timestamp::now();
    for run in &stopped {
        status
            .history
            .retain(|h| h.job_name.as_deref() != Some(run.job_name.as_str()));
        let entry = record::run_entry(
            run,
            Outcome::Failed,
            Some(reason::LOCK_BROKEN.into()),
            Some(now),
        );
        record::push_history(&mut status, entry);
    }
    status.active_count = 0;
    status.fencing_token = token;
    op.phase = crate::api::OperationPhase::Done;
    op.token = Some(token);
    op.message = message(before, token, &stopped, db);
    op.updated = Some(now.into());
    status.operations.break_lock = Some(op.clone());
    kube_io::write_status(ctx, sj, status, Lane::Claim).await?;
    // Like a confirmed claim: a cached copy from before this write (a Job deletion below can
    // trigger a reconcile before the watch delivers it) would break the lock again and skip a
    // token.
    ctx.own_writes.remember(sj, token);

    // 5. Stop.
    stop_runs(ctx, &ns, &stopped).await?;
    for _ in &stopped {
        crate::metrics::global().run_finished(sj, Outcome::Failed);
    }
    Ok(op)
}

/// Step 4's record of the break: the tokens, the Jobs stopped, what refuses older tokens now.
fn message(before: u64, token: u64, stopped: &[RunRef], db: &Availability) -> String {
    let jobs = if stopped.is_empty() {
        "no run was active".to_string()
    } else {
        let names: Vec<&str> = stopped.iter().map(|r| r.job_name.as_str()).collect();
        format!("deleted Job(s) {}", names.join(", "))
    };
    let fenced = match db {
        Availability::Ready(_) => "the backstop refuses every older token from now on",
        _ => "without a backstop, only workloads that compare tokens themselves refuse older ones",
    };
    format!("fencing token raised from {before} to {token}; {jobs}; {fenced}")
}

/// Break-lock's step 1b: a prepared run's Job is marked withdrawn (step W1 of
/// [`super::prepared`], reason LockBroken), so no resume can pass any more; the next reconcile
/// finishes the withdrawal (its token is fenced out by step 3 anyway). One resumed already runs:
/// it leaves `prepared`, its period is decided, and it is returned to be stopped with the active
/// runs.
async fn withdraw_prepared(
    ctx: &Context,
    ns: &str,
    status: &mut SingletonJobStatus,
) -> Result<Option<RunRef>> {
    let Some(run) = status.prepared.clone() else {
        return Ok(None);
    };
    let Some(uid) = run.job_uid.as_deref() else {
        return Ok(None);
    };
    let why = WithdrawReason::LockBroken.name();
    if kube_io::withdraw_job(ctx, ns, &run.job_name, uid, why).await? != Marked::Not {
        return Ok(None);
    }
    // Not marked: resumed (its release names its token), or withdrawn by another replica.
    let released = kube_io::get_job(ctx, ns, &run.job_name, Lane::Claim)
        .await?
        .filter(|j| j.metadata.uid.as_deref() == Some(uid))
        .and_then(|j| j.metadata.annotations)
        .and_then(|a| a.get(naming::ANNOTATION_RELEASED).cloned())
        .is_some_and(|v| v == run.token.to_string());
    if !released {
        return Ok(None);
    }
    status.prepared = None;
    if status
        .decided_through
        .as_ref()
        .is_none_or(|c| c.0 < run.period.0)
    {
        status.decided_through = Some(run.period.0.into());
    }
    Ok(Some(run))
}

/// Break-lock's step 3 when an open transaction holds the fence row: its Job is stopped (4), but a
/// pod on a node that stopped answering keeps its database session, and so the row's lock, until
/// TCP keepalive gives up (hours). The sessions holding the job's fence are ended in the database
/// (F6): their transactions roll back, nothing they wrote commits. Each one ended, or why it
/// could not be (the controller's role may not signal another role's sessions: a DBA then runs
/// `pg_terminate_backend`), is logged and goes into an Event; the break-lock is retried.
async fn end_holders(
    ctx: &Context,
    sj: &SingletonJob,
    b: &crate::backstop::Backstop,
) -> Result<()> {
    ctx.gate.check()?;
    let ended = b.end_fence_holders(&sj.backstop_key()).await?;
    if ended.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = ended
        .iter()
        .map(|e| match &e.result {
            Ok(()) => format!("ended {}", e.holder),
            Err(why) => format!(
                "could not end {}: {why} (a DBA can: SELECT pg_terminate_backend({}))",
                e.holder, e.holder.pid
            ),
        })
        .collect();
    let note = format!(
        "break-lock: the job's fence was held by an open transaction; {}",
        lines.join("; ")
    );
    tracing::warn!(sj = %sj.key(), "{note}");
    ctx.events
        .publish(
            sj,
            kube::runtime::events::EventType::Warning,
            reason::FENCE_HELD,
            "BreakLock",
            note,
        )
        .await;
    Ok(())
}

/// Break-lock's step 4: each run's Job goes, by uid when known. A pending claim's Job has no uid
/// in status yet: it is deleted only if it carries the claim's token (another Job of that name
/// is not the claim's).
async fn stop_runs(ctx: &Context, ns: &str, runs: &[RunRef]) -> Result<()> {
    // Foreground: the Job stays (being deleted) until its pods are gone, so the next run's
    // Forbid sees it and a Replace waits for it (F13).
    let bg = Propagation::Foreground;
    for run in runs {
        let uid = match run.job_uid.clone() {
            Some(uid) => Some(uid),
            None => kube_io::get_job(ctx, ns, &run.job_name, Lane::Claim)
                .await?
                .filter(|j| job::token(j) == Some(run.token))
                .and_then(|j| j.metadata.uid),
        };
        if let Some(uid) = uid {
            kube_io::delete_job_uid(ctx, ns, &run.job_name, &uid, bg, Lane::Claim).await?;
        }
    }
    Ok(())
}
