//! The run protocol: how one period becomes one Job. Read it top to bottom; each step names the
//! guarantee it serves (DESIGN.md G1 to G5).
//!
//! ```text
//! 1. Gate     : act only while this replica may (the leader, not shutting down)    G4
//! 2. Token    : one more than the highest of status.fencingToken and the
//!               backstop's fence, so a re-created SingletonJob never reuses one   G3
//! 3. Claim    : one status write, carrying the observed resourceVersion, records
//!               the period as decided and issues the token. A 409 means someone
//!               else acted: abort, re-read, decide again. This write is the
//!               linearisation point of the run.                                  G1, G3
//! 4. Backstop : insert the claim row, UNIQUE(job, period), and advance the fence
//!               in one transaction: a period that ran before (even under an
//!               earlier SingletonJob of the same name) is Deduplicated; older
//!               runs' writes are refused by singleton_fence from now on.          G1, G5
//!    Re-check : re-read the status: go on only while this claim is still pending
//!               (a paused claimer must not act on a claim another completed). Right
//!               after our own claim write, with no backstop and no Replace, that
//!               write's response is the re-read.                                  G1
//! 5. Replace  : with concurrencyPolicy Replace, the old runs are fenced by 4, then
//!               their Jobs are deleted, before the new Job exists.                G5
//! 6. Create   : the Job's name is deterministic per period, so the API server
//!               refuses a second Job for the same period while it exists.         G1
//! 7. Confirm  : a compare-and-swap on the re-read status moves the claim to
//!               `active`; losing it with a Job the winner does not know removes
//!               that Job. If we die between 3 and 7, whoever acts next finds
//!               `pendingClaim` and completes it with the same name and token.
//!               It runs in a task of its own: the reconcile is free once the Job
//!               exists, and the SingletonJob's next reconcile waits for it.        G1, G2
//! ```
//!
//! Each request to the API server waits for a slot in a lane ([`crate::lanes`]): steps 4 to 6
//! (re-read, deletes, create) go first, then claims (3), then the confirm (7) and everything
//! else nobody waits on, so that in a burst the Jobs exist before the bookkeeping is done. A
//! reconcile does not wait for its confirm ([`Confirms`]): in a burst its slot goes to the next
//! due run's claim.
//!
//! Runs a user asks for (`kubectl singleton trigger|backfill`, see [`crate::ops`]) take the same
//! seven steps ([`Why::Manual`]); their claim write also marks the request handled, so a request
//! is claimed once. Breaking a lock ([`break_lock`]) has its own numbered steps below.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::api::{
    HistoryEntry, LockPurpose, Outcome, RunOrigin, RunRef, SingletonJob, SingletonJobStatus,
};
use crate::backstop::{Backstop, ClaimOutcome};
use crate::controller::Context;
use crate::decide::reason;
use crate::lanes::Lane;
use crate::naming;
use crate::{Error, Result};

/// The backstop database as this reconcile found it.
#[derive(Clone, Debug)]
pub enum Db {
    /// The SingletonJob has no backstop.
    NotConfigured,
    /// Reachable, schema in place.
    Ready(Arc<Backstop>),
    /// Configured but unusable now; the reason names no secret value.
    Unavailable(String),
}

fn purpose(sj: &SingletonJob) -> LockPurpose {
    sj.spec.lock.as_ref().map(|l| l.purpose).unwrap_or_default()
}

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
    why: Why<'_>,
    db: &Db,
) -> Result<RunRef> {
    // 1. Gate (G4): a replica that is not allowed to act must not write at all.
    ctx.gate.check()?;

    // 2. Token (G3): above every token this status and the backstop have ever seen.
    let fence = match db {
        Db::Ready(b) => match Box::pin(b.fence(&sj.key())).await {
            Ok(f) => f,
            Err(e) if purpose(sj) == LockPurpose::Efficiency => {
                tracing::warn!(sj = %sj.key(), error = %e, "backstop fence unreadable; Efficiency: going on without it");
                0
            }
            Err(e) => return Err(e),
        },
        _ => 0,
    };
    let token = status.fencing_token.max(fence) + 1;
    tracing::Span::current().record("token", token);

    // 3. Claim (G1, G3): the write fails if anyone else wrote since we read.
    let now = Timestamp::now();
    let claim = RunRef {
        period: period.into(),
        token,
        job_name: naming::job_name(sj.metadata.name.as_deref().unwrap_or_default(), period),
        claimed_at: Some(now.into()),
        job_uid: None,
        origin: why.origin(),
    };
    status.fencing_token = token;
    status.pending_claim = Some(claim.clone());
    match why {
        // Only the schedule moves the schedule's cursor; a manual run is outside it.
        Why::Scheduled { .. } => {
            status.decided_through = Some(period.into());
            status.last_schedule_time = Some(period.into());
        }
        // The operation is marked handled by this same write: asked once, claimed once.
        Why::Manual(origin) => crate::ops::on_claim(&mut status.operations, origin, &claim),
    }
    let claimed = write_status(ctx, sj, status, Lane::Claim)
        .await
        .inspect_err(|e| crate::metrics::global().claim_failed(sj, e))?;
    tracing::info!(sj = %sj.key(), period = %naming::period_rfc3339(period), token, epoch = ctx.gate.epoch(), "claimed period");
    crate::metrics::global().token_issued(sj);

    // 4 to 7.
    let replace = match why {
        Why::Scheduled { replace } => replace,
        Why::Manual(_) => &[],
    };
    Box::pin(complete_claim(
        ctx,
        &claimed,
        claim.clone(),
        replace,
        db,
        Read::JustWritten,
    ))
    .await?;
    Ok(claim)
}

/// Why a period is claimed.
#[derive(Clone, Copy, Debug)]
pub enum Why<'a> {
    /// The schedule made it due; `replace` are the active runs to fence and delete first
    /// (concurrencyPolicy Replace).
    Scheduled { replace: &'a [RunRef] },
    /// A user asked for it (trigger, backfill): it moves no schedule cursor and replaces nothing.
    Manual(RunOrigin),
}

impl Why<'_> {
    fn origin(self) -> Option<RunOrigin> {
        match self {
            Why::Scheduled { .. } => None,
            Why::Manual(o) => Some(o),
        }
    }
}

/// Where the `sj` given to [`complete_claim`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    /// The response of this process's own claim write, just now.
    JustWritten,
    /// A copy read earlier (the cache): another replica may have moved on since.
    Earlier,
}

/// Steps 4 to 7 for a claim written earlier, possibly by another (dead) replica.
pub async fn complete_claim(
    ctx: &Arc<Context>,
    sj: &SingletonJob,
    claim: RunRef,
    replaced: &[RunRef],
    db: &Db,
    read: Read,
) -> Result<()> {
    ctx.gate.check()?;
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let period = claim.period.0;

    // 4. Backstop (G1, G5). Retrying a claim we wrote before finds our own row: ours, go on.
    let mut backstop_skipped = false;
    let unavailable = match db {
        Db::NotConfigured => None,
        Db::Ready(b) => {
            match Box::pin(b.claim(&sj.key(), period, claim.token, &claim.job_name)).await {
                Ok(outcome) if outcome.is_ours(claim.token) => None,
                Ok(ClaimOutcome::Duplicate { token, job_name }) => {
                    let note = format!(
                        "period {} was already claimed in the backstop by {job_name} with token {token}; no Job created",
                        naming::period_rfc3339(period)
                    );
                    return Box::pin(decide_without_job(
                        ctx,
                        sj,
                        &claim,
                        Outcome::Deduplicated,
                        reason::DEDUPLICATED,
                        note,
                    ))
                    .await;
                }
                Ok(ClaimOutcome::Claimed) => None,
                Err(e) => Some(e.to_string()),
            }
        }
        Db::Unavailable(why) => Some(why.clone()),
    };
    if let Some(why) = unavailable {
        if purpose(sj) == LockPurpose::Efficiency {
            // Efficiency: a double run only wastes work; run, and say the claim was skipped.
            tracing::warn!(sj = %sj.key(), reason = %why, "backstop unavailable; Efficiency: starting without its claim");
            backstop_skipped = true;
        } else {
            // Correctness: no Job without its claim. Retry until the period's deadline, then
            // record it (G2).
            let deadline = sj
                .spec
                .starting_deadline_seconds
                .map(|d| period + SignedDuration::from_secs(d));
            if deadline.is_some_and(|d| Timestamp::now() > d) {
                let note =
                    format!("the backstop stayed unavailable past the starting deadline: {why}");
                return Box::pin(decide_without_job(
                    ctx,
                    sj,
                    &claim,
                    Outcome::Missed,
                    reason::BACKSTOP_UNAVAILABLE,
                    note,
                ))
                .await;
            }
            return Err(Error::BackstopUnavailable(why));
        }
    }

    // Still ours? A claimer paused since its claim may find that another replica completed it
    // meanwhile, and that its Job has since been deleted (Replace, pruning, a user): name
    // uniqueness holds only while a Job exists, so creating it again would run the period twice,
    // and deleting "old" runs from a stale view is not ours to do either. A pause between this
    // read and the create remains possible (Kubernetes has no conditional create); step 7 then
    // removes the duplicate, and with a backstop its writes are refused by the fence all along.
    // When `sj` is our claim write's own response and nothing ran since (no backstop round trip,
    // no Jobs to replace), that response is the re-read: a GET now would be no fresher, and the
    // window left (response → create) is the same one request as after a GET.
    let sjs: Api<SingletonJob> = Api::namespaced(ctx.client.clone(), ns);
    let sj_name = sj.metadata.name.as_deref().unwrap_or_default();
    let fresh =
        if read == Read::JustWritten && matches!(db, Db::NotConfigured) && replaced.is_empty() {
            sj.clone()
        } else {
            ctx.lanes.run(Lane::Create, || sjs.get(sj_name)).await?
        };
    if !claim_pending(&fresh, &claim) {
        return Err(Error::Conflict(format!(
            "claim of {} completed by another replica",
            claim.job_name
        )));
    }

    // 5. Replace (G5): the old runs' tokens are below the fence now; stop them.
    for old in replaced {
        delete_job(ctx, sj, &old.job_name, Lane::Create).await?;
    }

    // 6. Create (G1): the deterministic name makes a second Job for this period impossible while the first
    //    exists. If it exists, it must be this claim's (same token); anything else is refused.
    // On the heap: a Job is kilobytes, and this future waits in a lane with it.
    let job = Box::new(naming::build_job(sj, period, claim.token)?);
    let mut created_uid = None;
    let mut claim = claim;
    let pp = PostParams::default();
    match ctx.lanes.run(Lane::Create, || jobs.create(&pp, &job)).await {
        Ok(created) => {
            created_uid = created.metadata.uid.clone();
            claim.job_uid = created.metadata.uid.clone();
            ctx.events.run_started(sj, &claim);
            crate::metrics::global().run_started(sj, period, &created);
        }
        // The API server will never accept this Job: the period is decided, as Failed, rather than
        // retried forever with the claim blocking every later period (G2).
        Err(kube::Error::Api(s)) if s.code == 400 || s.code == 422 => {
            let note = format!(
                "the API server rejected Job {}: {}",
                claim.job_name, s.message
            );
            return Box::pin(decide_without_job(
                ctx,
                sj,
                &claim,
                Outcome::Failed,
                reason::JOB_REJECTED,
                note,
            ))
            .await;
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let existing = ctx
                .lanes
                .run(Lane::Create, || jobs.get(&claim.job_name))
                .await?;
            let found = naming::job_token(&existing);
            if found != Some(claim.token) {
                return Err(Error::ForeignJob {
                    name: claim.job_name.clone(),
                    found,
                    expected: claim.token,
                });
            }
            claim.job_uid = existing.metadata.uid.clone();
        }
        Err(e) => return Err(e.into()),
    }

    // 7. Confirm (G1, G2): the run is active; the claim is done. A compare-and-swap on the status
    //    read in 4. Nobody waits for it (the Job exists), so it runs in a task of its own and this
    //    reconcile's slot goes to the next due run; until it is done, this SingletonJob's
    //    reconciles wait for it ([`Confirms`]).
    let status = confirmed_status(&fresh, &claim, replaced, backstop_skipped);
    // The task keeps what its write needs: in a burst a thousand of them wait in the last lane,
    // and a response's managed fields are a decoded JSON tree of kilobytes.
    let mut fresh = fresh;
    fresh.status = None;
    crate::controller::slim_sj(&mut fresh);
    spawn_confirm(ctx, fresh, status, claim, created_uid, replaced.len());
    Ok(())
}

/// Step 7's status: the claim moves from `pendingClaim` to `active`, the runs it replaced to the
/// history as Replaced, the run itself to the history as Running.
fn confirmed_status(
    fresh: &SingletonJob,
    claim: &RunRef,
    replaced: &[RunRef],
    backstop_skipped: bool,
) -> SingletonJobStatus {
    let mut status = fresh.status.clone().unwrap_or_default();
    status.pending_claim = None;
    status
        .active
        .retain(|r| !replaced.iter().any(|o| o.job_name == r.job_name));
    status.active.push(claim.clone());
    status.active_count = status.active.len() as i32;
    let now = Timestamp::now();
    for old in replaced {
        status.history.insert(
            0,
            HistoryEntry {
                period: old.period.clone(),
                last_period: None,
                count: 1,
                outcome: Outcome::Replaced,
                reason: Some(reason::REPLACED.into()),
                job_name: Some(old.job_name.clone()),
                token: Some(old.token),
                start_time: old.claimed_at.clone(),
                finish_time: Some(now.into()),
            },
        );
    }
    status.history.insert(
        0,
        HistoryEntry {
            period: claim.period.clone(),
            last_period: None,
            count: 1,
            outcome: Outcome::Running,
            reason: if backstop_skipped {
                Some(reason::BACKSTOP_SKIPPED.to_string())
            } else {
                claim.origin.map(|o| o.reason().to_string())
            },
            job_name: Some(claim.job_name.clone()),
            token: Some(claim.token),
            start_time: claim.claimed_at.clone(),
            finish_time: None,
        },
    );
    status.history.truncate(crate::controller::HISTORY_LIMIT);
    status
}

/// Step 7 itself: writes `status` over `fresh` (the status read in step 4), in the lane nobody
/// waits on (in a burst it yields to claims and creates).
async fn confirm(
    ctx: &Context,
    fresh: SingletonJob,
    status: SingletonJobStatus,
    claim: RunRef,
    created_uid: Option<String>,
    replaced: usize,
) -> Result<()> {
    match write_status(ctx, &fresh, status, Lane::Background).await {
        Ok(_) => {
            ctx.confirmed(&fresh, claim.token);
            for _ in 0..replaced {
                crate::metrics::global().run_finished(&fresh, Outcome::Replaced);
            }
            Ok(())
        }
        Err(Error::Conflict(what)) => {
            // Lost the confirm. If the status that won neither holds this claim as pending nor
            // knows the Job we just created, that Job re-creates a period another replica had
            // completed: remove it (only that Job, by uid) before it does more.
            if let Some(uid) = created_uid {
                let ns = fresh.metadata.namespace.as_deref().unwrap_or_default();
                let name = fresh.metadata.name.as_deref().unwrap_or_default();
                let sjs: Api<SingletonJob> = Api::namespaced(ctx.client.clone(), ns);
                let now_sj = ctx.lanes.run(Lane::Create, || sjs.get(name)).await?;
                let known = claim_pending(&now_sj, &claim)
                    || now_sj.status.as_ref().is_some_and(|s| {
                        s.active
                            .iter()
                            .any(|r| r.job_uid.as_deref() == Some(uid.as_str()))
                    });
                if !known {
                    tracing::warn!(job = %claim.job_name, token = claim.token, "removing a Job re-created for a period another replica completed");
                    delete_job_uid(ctx, &fresh, &claim.job_name, &uid).await?;
                }
            }
            Err(Error::Conflict(what))
        }
        Err(e) => Err(e),
    }
}

/// The confirms (step 7) in flight, each in its own task, by SingletonJob uid.
///
/// A reconcile of a SingletonJob whose confirm is in flight does nothing: the status it read is
/// about to change, and acting on it would complete the claim a second time. When the confirm is
/// done (written, lost or failed), the SingletonJob is reconciled again, by a request on the
/// channel the controller listens to ([`Confirms::new`]); after a failure other than a lost
/// compare-and-swap, only after [`CONFIRM_RETRY`], like a failed reconcile.
pub struct Confirms {
    in_flight: Mutex<HashSet<String>>,
    done: mpsc::UnboundedSender<ObjectRef<SingletonJob>>,
}

/// How long a confirm that failed (other than by a lost compare-and-swap) waits before its
/// SingletonJob is reconciled again; a reconcile would then find the claim pending and complete it.
const CONFIRM_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

impl Confirms {
    /// The registry, and the stream of SingletonJobs to reconcile because their confirm is done.
    pub fn new() -> (Self, UnboundedReceiverStream<ObjectRef<SingletonJob>>) {
        let (done, rx) = mpsc::unbounded_channel();
        let confirms = Confirms {
            in_flight: Mutex::default(),
            done,
        };
        (confirms, UnboundedReceiverStream::new(rx))
    }

    /// Whether a confirm of `sj` is in flight.
    pub fn in_flight(&self, sj: &SingletonJob) -> bool {
        sj.metadata.uid.as_ref().is_some_and(|uid| {
            self.in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(uid)
        })
    }

    fn begin(&self, uid: Option<&str>) {
        if let Some(uid) = uid {
            self.in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(uid.to_string());
        }
    }

    async fn end(&self, uid: Option<&str>, sj: ObjectRef<SingletonJob>, result: Result<()>) {
        if let Some(uid) = uid {
            self.in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(uid);
        }
        if let Err(e) = &result {
            crate::metrics::global().reconcile_error(e);
            match e {
                Error::Conflict(_) | Error::NotLeader => {
                    tracing::debug!(error = %e, "confirm not written");
                }
                _ => {
                    tracing::warn!(kind = e.kind(), error = %e, "confirm failed");
                    tokio::time::sleep(CONFIRM_RETRY).await;
                }
            }
        }
        // The controller may have stopped; then there is nobody to ask.
        let _ = self.done.send(sj);
    }
}

/// Starts step 7 in a task of its own (see [`Confirms`]); its log lines keep the run's span.
fn spawn_confirm(
    ctx: &Arc<Context>,
    fresh: SingletonJob,
    status: SingletonJobStatus,
    claim: RunRef,
    created_uid: Option<String>,
    replaced: usize,
) {
    let uid = fresh.metadata.uid.clone();
    let obj = ObjectRef::from_obj(&fresh);
    ctx.confirms.begin(uid.as_deref());
    let ctx = ctx.clone();
    let task = async move {
        let result = confirm(&ctx, fresh, status, claim, created_uid, replaced).await;
        ctx.confirms.end(uid.as_deref(), obj, result).await;
    };
    tokio::spawn(tracing::Instrument::in_current_span(task));
}

/// Breaks the lock (`kubectl singleton break-lock`): every token issued so far is fenced out and
/// the active runs are stopped, so a stuck or stale holder can neither block later periods nor
/// write. Who asked and why go into `status.operations.breakLock` and a `LockBroken` Event.
/// `op` is the accepted request's record. Returns the record as written (phase Done).
///
/// ```text
/// 1. Gate   : only the replica that may act                                         G4
/// 2. Token  : one above every issued token (status and backstop fence)               G3
/// 3. Fence  : the backstop's fence rises to it; from now on singleton_fence refuses
///             every older token, whatever its holder does                             G5
/// 4. Stop   : delete the active runs' Jobs (their tokens are fenced already)          G5
/// 5. Record : one resourceVersion-guarded status write: the new token, the stopped
///             runs as Failed/LockBroken, the operation Done. A 409 redoes it all:
///             raising a fence twice only skips a token number.                        G3
/// ```
pub async fn break_lock(
    ctx: &Context,
    sj: &SingletonJob,
    mut op: crate::api::OperationStatus,
    db: &Db,
) -> Result<crate::api::OperationStatus> {
    // 1. Gate.
    ctx.gate.check()?;
    let mut status = sj.status.clone().unwrap_or_default();

    // 2. Token.
    let fence = match db {
        Db::Ready(b) => b.fence(&sj.key()).await?,
        Db::NotConfigured => 0,
        // Breaking a lock without the fence would promise what it cannot keep: wait for it.
        Db::Unavailable(why) => return Err(Error::BackstopUnavailable(why.clone())),
    };
    let before = status.fencing_token.max(fence);
    let token = before + 1;

    // 3. Fence.
    if let Db::Ready(b) = db {
        b.advance_fence(&sj.key(), token).await?;
    }

    // 4. Stop.
    let stopped = std::mem::take(&mut status.active);
    for run in &stopped {
        delete_job(ctx, sj, &run.job_name, Lane::Claim).await?;
    }

    // 5. Record.
    let now = Timestamp::now();
    for run in &stopped {
        status
            .history
            .retain(|h| h.job_name.as_deref() != Some(run.job_name.as_str()));
        status.history.insert(
            0,
            HistoryEntry {
                period: run.period.clone(),
                last_period: None,
                count: 1,
                outcome: Outcome::Failed,
                reason: Some(reason::LOCK_BROKEN.into()),
                job_name: Some(run.job_name.clone()),
                token: Some(run.token),
                start_time: run.claimed_at.clone(),
                finish_time: Some(now.into()),
            },
        );
    }
    status.history.truncate(crate::controller::HISTORY_LIMIT);
    status.active_count = 0;
    status.fencing_token = token;
    let jobs = if stopped.is_empty() {
        "no run was active".to_string()
    } else {
        let names: Vec<&str> = stopped.iter().map(|r| r.job_name.as_str()).collect();
        format!("deleted Job(s) {}", names.join(", "))
    };
    let fenced = match db {
        Db::Ready(_) => "the backstop refuses every older token from now on",
        _ => "without a backstop, only workloads that compare tokens themselves refuse older ones",
    };
    op.phase = crate::api::OperationPhase::Done;
    op.token = Some(token);
    op.message = format!("fencing token raised from {before} to {token}; {jobs}; {fenced}");
    op.updated = Some(now.into());
    status.operations.break_lock = Some(op.clone());
    write_status(ctx, sj, status, Lane::Claim).await?;
    // Like a confirmed claim: a cached copy from before this write (a Job deletion above can
    // trigger a reconcile before the watch delivers it) would break the lock again and skip a
    // token.
    ctx.confirmed(sj, token);
    for _ in &stopped {
        crate::metrics::global().run_finished(sj, Outcome::Failed);
    }
    Ok(op)
}

/// Whether `sj`'s status still holds `claim` as its pending claim.
fn claim_pending(sj: &SingletonJob, claim: &RunRef) -> bool {
    sj.status
        .as_ref()
        .and_then(|s| s.pending_claim.as_ref())
        .is_some_and(|p| p.token == claim.token && p.job_name == claim.job_name)
}

/// Deletes one Job only if it is still the object with `uid` (never a later one of that name).
async fn delete_job_uid(ctx: &Context, sj: &SingletonJob, name: &str, uid: &str) -> Result<()> {
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match ctx.lanes.run(Lane::Create, || jobs.delete(name, &dp)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The span of a run's log lines (namespace, name, period, token), for steps 4 to 7 of a claim
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

/// Decides a claimed period without a Job (rejected, deduplicated, or missed for the backstop):
/// the claim is cleared and the outcome recorded, so it never blocks later periods (G2).
async fn decide_without_job(
    ctx: &Context,
    sj: &SingletonJob,
    claim: &RunRef,
    outcome: Outcome,
    why: &str,
    note: String,
) -> Result<()> {
    let mut status = sj.status.clone().unwrap_or_default();
    status.pending_claim = None;
    status.last_result = Some(outcome);
    let entry = HistoryEntry {
        period: claim.period.clone(),
        last_period: None,
        count: 1,
        outcome,
        reason: Some(why.into()),
        job_name: None,
        token: Some(claim.token),
        start_time: claim.claimed_at.clone(),
        finish_time: Some(Timestamp::now().into()),
    };
    status.history.insert(0, entry.clone());
    status.history.truncate(crate::controller::HISTORY_LIMIT);
    write_status(ctx, sj, status, Lane::Background).await?;
    crate::metrics::global().recorded(sj, &entry);
    ctx.events
        .publish(sj, EventType::Warning, why, "DecidePeriod", note)
        .await;
    Ok(())
}

/// Asks the API server whether it would accept this SingletonJob's Job (a dry-run create, which
/// runs validation and admission but stores nothing). `Ok(Err(message))` when it would not.
pub async fn dry_run_job(
    ctx: &Context,
    sj: &SingletonJob,
    now: Timestamp,
) -> Result<std::result::Result<(), String>> {
    let job = match naming::build_job(sj, now, 0) {
        Ok(job) => job,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    // Only the verdict matters: the response (the Job as it would be) is skipped unparsed.
    let dry_run = || async {
        let body = serde_json::to_vec(&job).map_err(kube::Error::SerdeError)?;
        let req = kube::core::Request::new(jobs.resource_url())
            .create(&pp, body)
            .map_err(kube::Error::BuildRequest)?;
        ctx.client.request::<serde::de::IgnoredAny>(req).await
    };
    match ctx.lanes.run(Lane::Background, dry_run).await {
        // 409: a Job of that name exists, so the template itself was not the problem.
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Ok(())),
        Err(kube::Error::Api(s)) if s.code == 400 || s.code == 422 => Ok(Err(s.message)),
        Err(e) => Err(e.into()),
    }
}

/// What the controller reads of a write's response. The rest is skipped unparsed: decoding whole
/// responses (each with its managed fields, a JSON tree of kilobytes) was most of what a start-up
/// with 10,000 SingletonJobs allocated and freed, and the fragmentation it left stayed resident.
#[derive(serde::Deserialize)]
struct Written {
    #[serde(default)]
    metadata: WrittenMeta,
}

#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenMeta {
    resource_version: Option<String>,
}

/// Writes `status` to `sj`'s status subresource with `sj`'s resourceVersion as precondition
/// (compare-and-swap). Returns the object as written, carrying the new resourceVersion.
pub async fn write_status(
    ctx: &Context,
    sj: &SingletonJob,
    status: SingletonJobStatus,
    lane: Lane,
) -> Result<SingletonJob> {
    ctx.gate
        .check()
        .inspect_err(|e| crate::metrics::global().write_refused(sj, e))?;
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let name = sj.metadata.name.as_deref().unwrap_or_default();
    let api: Api<SingletonJob> = Api::namespaced(ctx.client.clone(), ns);
    // Never write without a precondition: a missing resourceVersion would turn the PUT into a
    // blind overwrite and silently undo another replica's claim.
    if sj.metadata.resource_version.is_none() {
        return Err(Error::Conflict(format!(
            "{ns}/{name} read without a resourceVersion"
        )));
    }
    let pp = PostParams::default();
    // The copy to send is made once the request has a slot, not while it waits for one. What
    // comes back is what was sent with a new resourceVersion (and managed fields, which the
    // controller never reads), so only the resourceVersion is read from the response.
    let send = || async {
        let mut obj = sj.clone();
        obj.status = Some(status);
        let body = serde_json::to_vec(&obj).map_err(kube::Error::SerdeError)?;
        let req = kube::core::Request::new(api.resource_url())
            .replace_subresource("status", name, &pp, body)
            .map_err(kube::Error::BuildRequest)?;
        let written: Written = ctx.client.request(req).await?;
        obj.metadata.resource_version = written.metadata.resource_version;
        Ok::<_, kube::Error>(obj)
    };
    ctx.lanes
        .run(lane, send)
        .await
        .map_err(|e| Error::from_write(e, &format!("singletonjob {ns}/{name} status")))
        .inspect_err(|e| crate::metrics::global().write_refused(sj, e))
}

/// Deletes a run's Job and its pods (background propagation: the Job object goes at once).
pub async fn delete_job(ctx: &Context, sj: &SingletonJob, name: &str, lane: Lane) -> Result<()> {
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    match ctx.lanes.run(lane, || jobs.delete(name, &dp)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    //! The exact shape of the claim's write, against kube's mock service: the one place where a
    //! mock is right, since the real API server cannot show us the request we sent.
    use super::*;
    use crate::api::{SingletonJob, SingletonJobSpec};
    use crate::controller::{Events, Gate};
    use futures::StreamExt;
    use http::{Request, Response};
    use kube::client::Body;
    use kube::runtime::events::Reporter;
    use kube::runtime::reflector;

    fn context(client: kube::Client) -> Context {
        let clock = Arc::new(crate::clock::Clock::new(
            crate::clock::Samples::new(jiff::SignedDuration::from_secs(5)),
            client.clone(),
            std::time::Duration::from_secs(30),
        ));
        let lanes = crate::lanes::Lanes::new(4);
        Context {
            client: client.clone(),
            events: Events::new(
                client,
                Reporter {
                    controller: "test".into(),
                    instance: None,
                },
                lanes.clone(),
            ),
            lanes,
            jobs: reflector::store().0,
            clock,
            gate: Gate::always(),
            backstops: Default::default(),
            rejections_seen: Default::default(),
            confirmed: Default::default(),
            confirms: Confirms::new().0,
        }
    }

    fn sj() -> SingletonJob {
        let mut sj = SingletonJob::new(
            "hello",
            serde_yaml::from_str::<SingletonJobSpec>(
                "schedule: '* * * * *'\njobTemplate: {spec: {template: {spec: {containers: []}}}}",
            )
            .unwrap(),
        );
        sj.metadata.namespace = Some("ns".into());
        sj.metadata.resource_version = Some("4711".into());
        sj
    }

    #[tokio::test]
    async fn the_status_write_is_a_put_guarded_by_the_observed_resource_version() {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let ctx = context(kube::Client::new(svc, "ns"));
        let server = tokio::spawn(async move {
            let (req, send) = handle.next_request().await.expect("a request");
            assert_eq!(
                req.method(),
                http::Method::PUT,
                "a replace, never a patch: patches carry no precondition"
            );
            assert_eq!(
                req.uri().path(),
                "/apis/singleton.dev/v1alpha1/namespaces/ns/singletonjobs/hello/status"
            );
            let body: serde_json::Value =
                serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
            assert_eq!(body["metadata"]["resourceVersion"], "4711");
            assert_eq!(body["status"]["fencingToken"], 8);
            // Someone else wrote first.
            let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "the object has been modified"});
            send.send_response(
                Response::builder()
                    .status(409)
                    .body(Body::from(serde_json::to_vec(&status).unwrap()))
                    .unwrap(),
            );
        });
        let status = SingletonJobStatus {
            fencing_token: 8,
            ..Default::default()
        };
        let err = write_status(&ctx, &sj(), status, Lane::Claim)
            .await
            .expect_err("409 must fail the claim");
        assert!(matches!(err, Error::Conflict(_)), "{err:?}");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_written_status_carries_the_resource_version_of_the_response() {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let ctx = context(kube::Client::new(svc, "ns"));
        let server = tokio::spawn(async move {
            let (req, send) = next(&mut handle, "the status write").await;
            let mut stored: serde_json::Value =
                serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
            stored["metadata"]["resourceVersion"] = "4712".into();
            stored["metadata"]["managedFields"] =
                serde_json::json!([{"manager": "x", "fieldsV1": {"f:status": {}}}]);
            respond(send, 200, serde_json::to_vec(&stored).unwrap());
        });
        let status = SingletonJobStatus {
            fencing_token: 9,
            ..Default::default()
        };
        let written = write_status(&ctx, &sj(), status.clone(), Lane::Claim)
            .await
            .expect("written");
        assert_eq!(written.metadata.resource_version.as_deref(), Some("4712"));
        assert_eq!(written.status, Some(status));
        assert!(written.metadata.managed_fields.is_none(), "never decoded");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn no_write_without_a_resource_version_or_without_the_gate() {
        let (svc, _handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let ctx = context(kube::Client::new(svc, "ns"));
        let mut blind = sj();
        blind.metadata.resource_version = None;
        let err = write_status(&ctx, &blind, SingletonJobStatus::default(), Lane::Claim)
            .await
            .expect_err("blind write");
        assert!(matches!(err, Error::Conflict(_)), "{err:?}");

        let (tx, rx) = tokio::sync::watch::channel(crate::controller::GateState {
            may_act: false,
            epoch: 3,
            valid_until: None,
        });
        let closed = Context {
            gate: Gate::new(rx),
            ..ctx
        };
        let err = write_status(&closed, &sj(), SingletonJobStatus::default(), Lane::Claim)
            .await
            .expect_err("gate closed");
        assert!(matches!(err, Error::NotLeader), "{err:?}");
        drop(tx);
    }

    /// A SingletonJob as read, with a pending claim (token 7) whose Job was created with `job-uid`.
    fn claimed() -> (SingletonJob, RunRef) {
        let mut sj = sj();
        sj.metadata.uid = Some("sj-uid".into());
        let claim = RunRef {
            period: Timestamp::from_second(1_800_000_000).unwrap().into(),
            token: 7,
            job_name: "hello-1800000000".into(),
            claimed_at: None,
            job_uid: Some("job-uid".into()),
            origin: None,
        };
        sj.status = Some(SingletonJobStatus {
            fencing_token: 7,
            pending_claim: Some(claim.clone()),
            ..Default::default()
        });
        (sj, claim)
    }

    fn respond(send: tower_test::mock::SendResponse<Response<Body>>, code: u16, body: Vec<u8>) {
        send.send_response(
            Response::builder()
                .status(code)
                .body(Body::from(body))
                .unwrap(),
        );
    }

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    /// The next request the controller sends; a test fails rather than hangs if none comes.
    async fn next(
        handle: &mut Handle,
        what: &str,
    ) -> (
        Request<Body>,
        tower_test::mock::SendResponse<Response<Body>>,
    ) {
        tokio::time::timeout(std::time::Duration::from_secs(10), handle.next_request())
            .await
            .unwrap_or_else(|_| panic!("no {what} within 10 s"))
            .unwrap_or_else(|| panic!("the client is gone before the {what}"))
    }

    /// A confirm of [`claimed`]'s claim, spawned against a mock API server: the context, the
    /// server's handle, the stream of reconciles asked for, and the object.
    fn confirming() -> (
        Arc<Context>,
        Handle,
        UnboundedReceiverStream<ObjectRef<SingletonJob>>,
        SingletonJob,
        RunRef,
    ) {
        let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let (confirms, done) = Confirms::new();
        let ctx = Arc::new(Context {
            confirms,
            ..context(kube::Client::new(svc, "ns"))
        });
        let (sj, claim) = claimed();
        let status = confirmed_status(&sj, &claim, &[], false);
        spawn_confirm(
            &ctx,
            sj.clone(),
            status,
            claim.clone(),
            Some("job-uid".into()),
            0,
        );
        (ctx, handle, done, sj, claim)
    }

    /// The reconcile the confirm asks for once it is done; a test fails rather than hangs.
    async fn asked(
        done: &mut UnboundedReceiverStream<ObjectRef<SingletonJob>>,
    ) -> ObjectRef<SingletonJob> {
        tokio::time::timeout(std::time::Duration::from_secs(10), done.next())
            .await
            .expect("a reconcile asked for within 10 s")
            .expect("the channel is open")
    }

    fn conflict() -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "the object has been modified"})).unwrap()
    }

    #[tokio::test]
    async fn reconciles_wait_for_a_confirm_in_flight_and_are_asked_for_when_it_is_done() {
        let (ctx, mut handle, mut done, sj, _) = confirming();
        assert!(
            ctx.confirms.in_flight(&sj),
            "the confirm is in flight until answered"
        );

        let (req, send) = next(&mut handle, "the confirm").await;
        assert_eq!(req.method(), http::Method::PUT);
        let body: serde_json::Value =
            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        assert_eq!(
            body["metadata"]["resourceVersion"], "4711",
            "a compare-and-swap"
        );
        assert!(body["status"].get("pendingClaim").is_none(), "{body}");
        assert_eq!(body["status"]["active"][0]["token"], 7);
        assert!(ctx.confirms.in_flight(&sj));
        respond(send, 200, serde_json::to_vec(&body).unwrap());

        assert_eq!(asked(&mut done).await, ObjectRef::from_obj(&sj));
        assert!(!ctx.confirms.in_flight(&sj));
        // Copies read before the confirm are recognised as stale.
        assert!(ctx.is_stale(&sj, sj.status.as_ref().unwrap()));
    }

    #[tokio::test]
    async fn a_lost_confirm_removes_its_job_only_if_the_winner_does_not_know_it() {
        for winner_knows in [false, true] {
            let (ctx, mut handle, mut done, sj, claim) = confirming();

            let (_, send) = next(&mut handle, "the confirm").await;
            respond(send, 409, conflict());
            // The status that won: another replica completed this period and has moved on.
            let (req, send) = next(&mut handle, "the re-read").await;
            assert_eq!(req.method(), http::Method::GET);
            let mut won = sj.clone();
            won.metadata.resource_version = Some("4712".into());
            let active = if winner_knows {
                vec![claim.clone()]
            } else {
                vec![]
            };
            won.status = Some(SingletonJobStatus {
                fencing_token: 7,
                active,
                ..Default::default()
            });
            respond(send, 200, serde_json::to_vec(&won).unwrap());
            if !winner_knows {
                let (req, send) = next(&mut handle, "the removal").await;
                assert_eq!(req.method(), http::Method::DELETE);
                assert_eq!(
                    req.uri().path(),
                    "/apis/batch/v1/namespaces/ns/jobs/hello-1800000000"
                );
                let body: serde_json::Value =
                    serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap())
                        .unwrap();
                assert_eq!(
                    body["preconditions"]["uid"], "job-uid",
                    "only that Job, never a later one of its name"
                );
                respond(send, 200, b"{}".to_vec());
            }
            assert_eq!(asked(&mut done).await, ObjectRef::from_obj(&sj));
            assert!(!ctx.confirms.in_flight(&sj));
            assert!(
                !ctx.is_stale(&sj, sj.status.as_ref().unwrap()),
                "not confirmed"
            );
            // Nothing else was sent: the task is over and holds no client.
            drop(ctx);
            let after =
                tokio::time::timeout(std::time::Duration::from_secs(10), handle.next_request());
            assert!(
                matches!(after.await, Ok(None)),
                "a request after the confirm was done (winner_knows={winner_knows})"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_gate_closes_by_itself_at_the_renew_deadline() {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
        let (_tx, rx) = tokio::sync::watch::channel(crate::controller::GateState {
            may_act: true,
            epoch: 1,
            valid_until: Some(deadline),
        });
        let gate = Gate::new(rx);
        assert!(gate.check().is_ok());
        // Nobody updates the state (the election loop is stuck or paused): time alone closes it.
        tokio::time::advance(std::time::Duration::from_secs(3)).await;
        assert!(matches!(gate.check(), Err(Error::NotLeader)));
    }
}
