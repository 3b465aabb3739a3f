//! The run protocol: how one period becomes one Job that runs once. Read it top to bottom; each
//! step names the guarantee it serves (DESIGN.md G1 to G5).
//!
//! ```text
//! 1. Gate     : act only while this replica may (the leader, not shutting down)    G4
//! 2. Token    : one more than the highest of status.fencingToken and the
//!               backstop's fence, so a re-created SingletonJob never reuses one   G3
//! 3. Claim    : one status write, carrying the observed resourceVersion, records
//!               the period as decided, issues the token and names the runs it
//!               replaces. A 409 means someone else acted: abort, re-read, decide
//!               again. This write decides which period is run.                   G1, G3
//! 4. Backstop : insert the claim row, UNIQUE(job, period), and advance the fence
//!               in one transaction: a period that ran before (even under an
//!               earlier SingletonJob of the same name) is Deduplicated; older
//!               runs' writes are refused by singleton_fence from now on. A fence
//!               above the token re-claims with a higher one; a fence row held by
//!               the run being replaced stops that run first.                      G1, G3, G5
//!    Re-check : re-read the status: go on only while this claim is still pending
//!               (a paused claimer must not act on a claim another completed).     G1
//! 4b.Confirm  : multi-cluster (`--cluster-id`): confirm the backstop claim row by a
//!               conditional update; another cluster took it over (this claimer
//!               paused past takeoverAfterSeconds, judged by the database's clock,
//!               the fence raised above this token): decide ClaimedElsewhere,
//!               create nothing (docs/multi-cluster.md).                            G1, G3
//! 5. Replace  : with concurrencyPolicy Replace, the old runs are fenced by 4, then
//!               their Jobs are deleted, before the new Job exists; without a
//!               fence, the new Job waits until the old Jobs (and pods) are gone.   G5
//! 6. Create   : the Job, SUSPENDED: it cannot run pods yet. Its name is
//!               deterministic per period, so the API server refuses a second Job
//!               for the period while one exists.                                  G1
//! 7. Confirm  : a compare-and-swap on the re-read status moves the claim to
//!               `active` with the Job's uid. This write decides which Job of the
//!               period may run: the one it names, ever. Losing it, the Job never
//!               ran and is deleted by uid (unless the winner adopted it).         G1
//! 8. Resume   : only now the confirmed Job (by uid) may run its pods.              G1, G4
//! ```
//!
//! Why suspended: Kubernetes has no conditional create, so a claimer paused between its last
//! check and its create (a frozen VM, a request stalled in a lane) could create a period's Job
//! again after another replica completed the period and the Job was pruned. Such a Job now stays
//! suspended: its confirm cannot win (the status moved on), so nobody resumes it, and it is
//! deleted by its creator, or by the leader's sweep ([`crate::observe::unknown`]). And once a
//! period is decided its token is retired in the backstop, so even its workload's writes would be
//! refused. If a replica dies between 3 and 8, whoever acts next finds `pendingClaim` and
//! completes it with the same name and token, or finds a confirmed run whose Job is still
//! suspended and resumes it ([`crate::observe::to_resume`]).
//!
//! Each write waits for a slot in a lane ([`crate::lanes`]) and checks the gate right before it
//! is sent ([`crate::kube_io`]). Steps 4 to 8 go in the first lane, claims (3) in the second,
//! everything else nobody waits on in the last. A reconcile does not wait for its confirm and
//! resume ([`confirm`]): its slot goes to the next due run's claim.
//!
//! The steps are in the files of this module, in order: [`claim`] (steps 2 to 4), [`create`]
//! (5 and 6), [`confirm`] (7 and 8); [`decided`] decides a claimed period without a Job;
//! [`sweep`] removes the Jobs no claim knows and resumes the confirmed runs whose resume was
//! lost; [`mod@break_lock`] breaks a stuck lock; [`prepared`] resumes at its instant, or
//! withdraws, a run prepared ahead of it (issue 33).
//!
//! Preparation (issue 33, [`Cause::Prepared`]): with a lead set, steps 1 to 7 run ahead of the
//! next period's instant in their own lane ([`Lane::Prepare`]): the claim leaves the cursor where
//! it is (the period is not decided yet, G2), the Job is created suspended with
//! `singleton.dev/resume-at`, and the confirm writes `status.prepared` instead of `active`. Step 8
//! waits for the instant in [`prepared`], which resumes the Job then, never before (G4), or
//! withdraws it when the period's decision changed meanwhile.
//!
//! Runs a user asks for (`kubectl singleton trigger|backfill`, see [`crate::decide::ops`]) take the same
//! steps ([`Cause::Manual`]); their claim write also marks the request handled, so a request is
//! claimed once. A rerun (`kubectl singleton rerun`, [`Cause::Rerun`]) takes them too, for a
//! period decided before: its claim names a Job of its own (the period's earlier Job may still
//! exist), takes the period's backstop claim row over from the earlier token in step 4 (so the
//! new token fences the earlier run out, and the period keeps one claim row), and with
//! `--replace` names the period's active run to replace, as concurrencyPolicy Replace does.
//! Breaking a lock ([`break_lock()`]) has its own numbered steps below.

pub mod break_lock;
pub mod claim;
pub mod confirm;
pub mod create;
pub mod decided;
pub mod prepared;
pub mod sweep;

use std::sync::Arc;

use jiff::Timestamp;

use crate::api::{LockPurpose, ReplacedRun, RunOrigin, RunRef, SingletonJob, SingletonJobStatus};
use crate::backstop::Availability;
use crate::context::Context;
use crate::failpoint;
use crate::kube_io;
use crate::lanes::Lane;
use crate::naming;
use crate::{Error, Result};

pub use break_lock::break_lock;
pub use confirm::resume;
pub use create::{Admission, admission};
pub use decided::{record_outcomes, retire};
pub use kube_io::write_status;

/// Claims `period` and starts its Job. `status` is the status to write with the claim (already
/// carrying this reconcile's records); `sj` must be the object as read, with its resourceVersion.
/// Its log lines carry the run's namespace, name, period and (once issued) token.
#[tracing::instrument(name = "run", skip_all, fields(
    namespace = sj.metadata.namespace.as_deref().unwrap_or_default(),
    name = sj.metadata.name.as_deref().unwrap_or_default(),
    period = %naming::period_rfc3339(period),
    token = tracing::field::Empty,
))]
pub async fn start(
    ctx: &Arc<Context>,
    sj: &SingletonJob,
    mut status: SingletonJobStatus,
    period: Timestamp,
    cause: Cause<'_>,
    db: &Availability,
) -> Result<RunRef> {
    // 1. Gate (G4): a replica that is not allowed to act must not write at all.
    ctx.gate.check()?;

    // 2. Token (G3): above every token this status and the backstop have ever seen.
    let fence = match db {
        Availability::Ready(b) => match Box::pin(b.fence(&sj.backstop_key())).await {
            Ok(f) => f,
            Err(e) if sj.purpose() == LockPurpose::Efficiency => {
                tracing::warn!(sj = %sj.key(), error = %e, "backstop fence unreadable; Efficiency: going on without it");
                0
            }
            Err(e) => return Err(e),
        },
        _ => 0,
    };
    let token = crate::backstop::next_token(status.fencing_token.max(fence))?;
    tracing::Span::current().record("token", token);

    // 3. Claim (G1, G3): the write fails if anyone else wrote since we read. The runs to replace
    //    are part of the claim, so whoever completes it replaces them.
    let origin = cause.origin();
    let claim = new_claim(sj, &status, period, token, cause);
    status.fencing_token = token;
    status.pending_claim = Some(claim.clone());
    match (cause, origin) {
        // A prepared period is not decided yet: its cursor moves when it is resumed (design
        // §1.3), and the judge decides it at its instant as if it had not been prepared (G2).
        (Cause::Prepared { .. }, _) => {}
        // Only the schedule moves the schedule's cursor; a manual run is outside it.
        (Cause::Scheduled { .. }, _) => {
            status.decided_through = Some(period.into());
            status.last_schedule_time = Some(period.into());
        }
        // The operation is marked handled by this same write: asked once, claimed once.
        (_, Some(_)) => {
            if let Some(kind) = cause.operation() {
                crate::decide::ops::on_claim(&mut status.operations, kind, &claim);
            }
        }
        (_, None) => {}
    }
    // maxRuns counts the schedule's periods claimed, in the claim's own write: never one more.
    if matches!(origin, None | Some(RunOrigin::Backfill)) {
        status.run_count = status.run_count.saturating_add(1);
    }
    let claimed = write_status(ctx, sj, status, cause.lane())
        .await
        .inspect_err(|e| crate::metrics::global().claim_failed(sj, e))?;
    tracing::info!(sj = %sj.key(), period = %naming::period_rfc3339(period), token, epoch = ctx.gate.epoch(), "claimed period");
    crate::metrics::global().token_issued(sj);
    failpoint::hit(failpoint::CLAIM_WRITTEN);

    // 4 to 8.
    Box::pin(complete_claim(
        ctx,
        &claimed,
        claim.clone(),
        db,
        Source::OwnWrite,
    ))
    .await?;
    Ok(claim)
}

/// Step 3's claim: the period's run with its token, Job name and origin.
fn new_claim(
    sj: &SingletonJob,
    status: &SingletonJobStatus,
    period: Timestamp,
    token: u64,
    cause: Cause<'_>,
) -> RunRef {
    let name = sj.metadata.name.as_deref().unwrap_or_default();
    let origin = cause.origin();
    RunRef {
        unknown: Default::default(),
        late: false,
        period: period.into(),
        token,
        job_name: match cause {
            Cause::Rerun { .. } => naming::rerun_job_name(name, period, token),
            _ => naming::job_name(name, period),
        },
        claimed_at: Some(Timestamp::now().into()),
        job_uid: None,
        origin,
        requested_by: cause
            .operation()
            .and_then(|kind| kind.slot(&status.operations))
            .and_then(|op| op.requested_by.clone()),
        supersedes: match cause {
            Cause::Rerun { supersedes, .. } => supersedes,
            _ => None,
        },
        replaces: cause.replaces().iter().map(ReplacedRun::from).collect(),
        resume_at: match cause {
            Cause::Prepared { resume_at, .. } => Some(resume_at.into()),
            _ => None,
        },
        basis: match cause {
            Cause::Prepared { basis, .. } => Some(basis.to_string()),
            _ => None,
        },
    }
}

/// What a period is claimed for.
#[derive(Clone, Copy, Debug)]
pub enum Cause<'a> {
    /// The schedule made it due; `replace` are the active runs to fence and delete first
    /// (concurrencyPolicy Replace).
    Scheduled { replace: &'a [RunRef] },
    /// A user asked for it (trigger, backfill): it moves no schedule cursor and replaces nothing.
    Manual(RunOrigin),
    /// A user asked to run a decided period again (`kubectl singleton rerun`): it moves no
    /// schedule cursor; its Job has a name of its own; `supersedes` is the token of the period's
    /// backstop claim row, which the claim takes over (None: the backstop has no row, or there is
    /// no backstop); `replace` are the period's active runs to fence and delete first
    /// (`--replace`, as concurrencyPolicy Replace does); `repair`: one period of a repair
    /// (`rerun --from --to`), whose record counts it.
    Rerun {
        replace: &'a [RunRef],
        supersedes: Option<u64>,
        repair: bool,
    },
    /// The schedule's next period, prepared ahead of its instant (issue 33): claimed (the cursor
    /// left where it is), its Job created suspended and confirmed into `status.prepared`, then
    /// resumed at `resume_at` (never before, G4) or withdrawn by [`prepared`]. `basis` is
    /// [`crate::decide::prepare::basis`] of what it was decided and built from.
    Prepared {
        resume_at: Timestamp,
        basis: &'a str,
    },
}

impl Cause<'_> {
    fn origin(self) -> Option<RunOrigin> {
        match self {
            Cause::Scheduled { .. } | Cause::Prepared { .. } => None,
            Cause::Manual(o) => Some(o),
            Cause::Rerun { .. } => Some(RunOrigin::Rerun),
        }
    }

    /// The lane of the claim's write: a period due now before work ahead of time.
    fn lane(self) -> Lane {
        match self {
            Cause::Prepared { .. } => Lane::Prepare,
            _ => Lane::Claim,
        }
    }

    /// The operation whose record the claim's write updates, if a user asked for the run.
    pub fn operation(self) -> Option<crate::decide::ops::OperationKind> {
        use crate::decide::ops::OperationKind;
        match self {
            Cause::Scheduled { .. } | Cause::Prepared { .. } => None,
            Cause::Manual(o) => Some(OperationKind::from(o)),
            Cause::Rerun { repair: false, .. } => Some(OperationKind::Rerun),
            Cause::Rerun { repair: true, .. } => Some(OperationKind::Repair),
        }
    }

    fn replaces(&self) -> &[RunRef] {
        match self {
            Cause::Scheduled { replace } | Cause::Rerun { replace, .. } => replace,
            Cause::Manual(_) | Cause::Prepared { .. } => &[],
        }
    }
}

/// Where the `sj` given to [`complete_claim`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The response of this process's own claim write, just now.
    OwnWrite,
    /// A copy read earlier (the cache): another replica may have moved on since.
    Cache,
}

/// Steps 4 to 8 for a claim written earlier, possibly by another (dead) replica.
pub async fn complete_claim(
    ctx: &Arc<Context>,
    sj: &SingletonJob,
    claim: RunRef,
    db: &Availability,
    source: Source,
) -> Result<()> {
    ctx.gate.check()?;

    // 4. Backstop (G1, G3, G5).
    let (sj, claim, backstop_skipped) =
        match Box::pin(claim::backstop_claim(ctx, sj, claim, db)).await? {
            claim::Backstopped::Go { sj, claim, skipped } => (*sj, *claim, skipped),
            claim::Backstopped::Decided => return Ok(()),
        };
    failpoint::hit(failpoint::BACKSTOP_CLAIMED);

    // Still ours? A claimer paused since its claim may find that another replica completed it
    // meanwhile: acting on it (deleting "old" runs, creating its Job) is not ours to do. When
    // `sj` is our own claim write's response and nothing ran since (no backstop round trip, no
    // Jobs to replace), that response is the re-read: a GET now would be no fresher. A pause
    // after this check is harmless: the Job is created suspended and only a winning confirm (7)
    // lets it run.
    let ns = sj.metadata.namespace.clone().unwrap_or_default();
    let fresh = if source == Source::OwnWrite
        && matches!(db, Availability::NotConfigured)
        && claim.replaces.is_empty()
    {
        sj
    } else {
        let name = sj.metadata.name.as_deref().unwrap_or_default();
        kube_io::get_sj(ctx, &ns, name).await?
    };
    if !claim_pending(&fresh, &claim) {
        return Err(Error::Conflict(format!(
            "claim of {} completed by another replica",
            claim.job_name
        )));
    }
    failpoint::hit(failpoint::REREAD);

    // 4b. Confirm in the backstop (G1, multi-cluster only): a conditional update that fails when
    //     another cluster took the claim over while this claimer was paused; then the period is
    //     theirs, this token is fenced out, and nothing is created here.
    if !Box::pin(claim::confirm_in_backstop(ctx, &fresh, &claim, db)).await? {
        return Ok(());
    }

    // 5. Replace (G5): the old runs' tokens are below the fence now; stop them. Without a fence
    //    (no backstop, or an Efficiency run without its claim) nothing refuses their writes:
    //    the new run waits until their Jobs, deleted in the foreground, are gone with their pods.
    for old in &claim.replaces {
        create::delete_replaced(ctx, &ns, old).await?;
    }
    let fenced = matches!(db, Availability::Ready(_)) && !backstop_skipped;
    if !fenced && !Box::pin(create::replaced_gone(ctx, &fresh, &claim, db)).await? {
        return Ok(());
    }

    // 6. Create (G1), suspended.
    let Some(uid) = Box::pin(create::create(ctx, &fresh, &claim, db)).await? else {
        return Ok(());
    };

    // 7 and 8, in a task of its own: nobody waits for them here, and this reconcile's slot goes
    // to the next due run. Until they are done, this SingletonJob's reconciles wait for them
    // ([`crate::context::InFlight`]).
    let mut claim = claim;
    claim.job_uid = Some(uid.clone());
    let mut status = confirm::status_after_confirm(&fresh, &claim, backstop_skipped);
    // Its notifications (the run's start), while the status it was made from is at hand.
    crate::kube_io::fill_outbox(ctx, &fresh, fresh.status.as_ref(), &mut status);
    // The task keeps only what its write needs: in a burst many of them wait in a lane.
    let admission = create::admission(&fresh);
    let mut fresh = fresh;
    fresh.status = None;
    crate::context::slim_sj(&mut fresh);
    confirm::spawn(ctx, fresh, status, claim, uid, admission);
    Ok(())
}

/// The lane of a request for `claim`: [`Lane::Prepare`] while it is a preparation ahead of its
/// instant, else `due` (a preparation still in flight at its instant goes on as a due run's).
pub(super) fn lane(claim: &RunRef, due: Lane) -> Lane {
    match &claim.resume_at {
        Some(at) if Timestamp::now() < at.0 => Lane::Prepare,
        _ => due,
    }
}

/// Whether `sj`'s status still holds `claim` as its pending claim.
pub(super) fn claim_pending(sj: &SingletonJob, claim: &RunRef) -> bool {
    sj.status
        .as_ref()
        .and_then(|s| s.pending_claim.as_ref())
        .is_some_and(|p| p.token == claim.token && p.job_name == claim.job_name)
}

/// The span of a run's log lines (namespace, name, period, token), for steps 4 to 8 of a claim
/// completed outside [`start`].
pub fn span(sj: &SingletonJob, claim: &RunRef) -> tracing::Span {
    tracing::info_span!(
        "run",
        namespace = sj.metadata.namespace.as_deref().unwrap_or_default(),
        name = sj.metadata.name.as_deref().unwrap_or_default(),
        period = %naming::period_rfc3339(claim.period.0),
        token = claim.token,
    )
}

#[cfg(test)]
mod tests;
