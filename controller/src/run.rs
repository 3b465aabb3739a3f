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
//! 5. Replace  : with concurrencyPolicy Replace, the old runs are fenced by 4, then
//!               their Jobs are deleted, before the new Job exists.                G5
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
//! resume ([`Confirms`]): its slot goes to the next due run's claim.
//!
//! Runs a user asks for (`kubectl singleton trigger|backfill`, see [`crate::ops`]) take the same
//! steps ([`Why::Manual`]); their claim write also marks the request handled, so a request is
//! claimed once. Breaking a lock ([`break_lock`]) has its own numbered steps below.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, PostParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::api::{
    HistoryEntry, LockPurpose, Outcome, ReplacedRun, RunOrigin, RunRef, SingletonJob,
    SingletonJobStatus,
};
use crate::backstop::{Backstop, ClaimOutcome};
use crate::controller::Context;
use crate::decide::reason;
use crate::failpoint;
use crate::kube_io::{self, Propagation, Resumed};
use crate::lanes::Lane;
use crate::naming;
use crate::{Error, Result};

pub use crate::kube_io::write_status;

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

    // 3. Claim (G1, G3): the write fails if anyone else wrote since we read. The runs to replace
    //    are part of the claim, so whoever completes it replaces them.
    let claim = RunRef {
        period: period.into(),
        token,
        job_name: naming::job_name(sj.metadata.name.as_deref().unwrap_or_default(), period),
        claimed_at: Some(Timestamp::now().into()),
        job_uid: None,
        origin: why.origin(),
        replaces: why.replaces().iter().map(ReplacedRun::from).collect(),
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
    failpoint::hit(failpoint::CLAIM_WRITTEN);

    // 4 to 8.
    Box::pin(complete_claim(
        ctx,
        &claimed,
        claim.clone(),
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

    fn replaces(&self) -> &[RunRef] {
        match self {
            Why::Scheduled { replace } => replace,
            Why::Manual(_) => &[],
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

/// Steps 4 to 8 for a claim written earlier, possibly by another (dead) replica.
pub async fn complete_claim(
    ctx: &Arc<Context>,
    sj: &SingletonJob,
    claim: RunRef,
    db: &Db,
    read: Read,
) -> Result<()> {
    ctx.gate.check()?;

    // 4. Backstop (G1, G3, G5).
    let (sj, claim, backstop_skipped) = match Box::pin(backstop_claim(ctx, sj, claim, db)).await? {
        Backstopped::Go { sj, claim, skipped } => (*sj, claim, skipped),
        Backstopped::Decided => return Ok(()),
    };
    failpoint::hit(failpoint::BACKSTOP_CLAIMED);

    // Still ours? A claimer paused since its claim may find that another replica completed it
    // meanwhile: acting on it (deleting "old" runs, creating its Job) is not ours to do. When
    // `sj` is our own claim write's response and nothing ran since (no backstop round trip, no
    // Jobs to replace), that response is the re-read: a GET now would be no fresher. A pause
    // after this check is harmless: the Job is created suspended and only a winning confirm (7)
    // lets it run.
    let ns = sj.metadata.namespace.clone().unwrap_or_default();
    let fresh = if read == Read::JustWritten
        && matches!(db, Db::NotConfigured)
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

    // 5. Replace (G5): the old runs' tokens are below the fence now; stop them.
    for old in &claim.replaces {
        delete_replaced(ctx, &ns, old).await?;
    }

    // 6. Create (G1), suspended.
    let Some(uid) = Box::pin(create(ctx, &fresh, &claim, db)).await? else {
        return Ok(());
    };

    // 7 and 8, in a task of its own: nobody waits for them here, and this reconcile's slot goes
    // to the next due run. Until they are done, this SingletonJob's reconciles wait for them
    // ([`Confirms`]).
    let mut claim = claim;
    claim.job_uid = Some(uid.clone());
    let status = confirmed_status(&fresh, &claim, backstop_skipped);
    // The task keeps what its write needs: in a burst a thousand of them may wait in a lane,
    // and a response's managed fields are a decoded JSON tree of kilobytes.
    let keep_suspended = keeps_suspended(&fresh);
    let mut fresh = fresh;
    fresh.status = None;
    crate::controller::slim_sj(&mut fresh);
    spawn_confirm(ctx, fresh, status, claim, uid, keep_suspended);
    Ok(())
}

/// What step 4 leaves to do.
enum Backstopped {
    /// Go on with this claim (its token may have been raised) on this copy of the SingletonJob;
    /// `skipped`: without a backstop claim (Efficiency, database unreachable).
    Go {
        sj: Box<SingletonJob>,
        claim: RunRef,
        skipped: bool,
    },
    /// The period is decided without a Job (Deduplicated, Missed): nothing more to do.
    Decided,
}

/// How many times step 4 re-claims with a higher token before giving up for this reconcile.
const RECLAIMS: usize = 3;

/// Step 4: the claim row and the fence. Retrying a claim we wrote before finds our own row: ours,
/// go on.
async fn backstop_claim(
    ctx: &Context,
    sj: &SingletonJob,
    mut claim: RunRef,
    db: &Db,
) -> Result<Backstopped> {
    let b = match db {
        Db::NotConfigured => {
            return Ok(Backstopped::Go {
                sj: Box::new(sj.clone()),
                claim,
                skipped: false,
            });
        }
        Db::Unavailable(why) => return unavailable(ctx, sj, claim, why.clone()).await,
        Db::Ready(b) => b,
    };
    let mut sj = sj.clone();
    let period = claim.period.0;
    for _ in 0..=RECLAIMS {
        match Box::pin(b.claim(&sj.key(), period, claim.token, &claim.job_name)).await {
            Ok(ClaimOutcome::Duplicate { token, job_name }) if token != claim.token => {
                // The claim's own token never reached the fence (the transaction rolled back):
                // nothing to retire.
                let note = format!(
                    "period {} was already claimed in the backstop by {job_name} with token {token}; no Job created",
                    naming::period_rfc3339(period)
                );
                let d = Decision::new(Outcome::Deduplicated, reason::DEDUPLICATED, note);
                Box::pin(decide_without_job(ctx, &sj, &claim, d, None)).await?;
                return Ok(Backstopped::Decided);
            }
            // A fresh claim, or our own earlier one (a retry after a crash).
            Ok(_) => {
                return Ok(Backstopped::Go {
                    sj: Box::new(sj),
                    claim,
                    skipped: false,
                });
            }
            // G3: the fence is at or above this token (a newer token was issued elsewhere: a
            // run of an earlier SingletonJob of this name, a break-lock, a workload). Never run
            // at or below the fence: claim the same period again with a token above it.
            Err(Error::StaleToken { current, .. }) => {
                let (reclaimed, higher) = Box::pin(reclaim(ctx, &sj, &claim, current)).await?;
                sj = reclaimed;
                claim = higher;
            }
            Err(Error::FenceHeld(why)) => {
                return Box::pin(fence_held(ctx, &sj, claim, why)).await;
            }
            Err(e) if e.is_retryable() => return unavailable(ctx, &sj, claim, e.to_string()).await,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Conflict(format!(
        "the backstop's fence kept rising above the claim of {}",
        claim.job_name
    )))
}

/// Step 4, re-claim: the pending claim is rewritten, by compare-and-swap, with a token above the
/// backstop's fence `current` (and above every token of the status). Returns the object as
/// written and the claim with its new token.
async fn reclaim(
    ctx: &Context,
    sj: &SingletonJob,
    claim: &RunRef,
    current: u64,
) -> Result<(SingletonJob, RunRef)> {
    let mut status = sj.status.clone().unwrap_or_default();
    let token = status.fencing_token.max(current) + 1;
    let mut higher = claim.clone();
    higher.token = token;
    status.fencing_token = token;
    status.pending_claim = Some(higher.clone());
    crate::ops::on_reclaim(&mut status.operations, claim, token);
    tracing::warn!(sj = %sj.key(), stale = claim.token, fence = current, token, "the backstop's fence is above the claim's token; claiming again with a higher one");
    let written = write_status(ctx, sj, status, Lane::Create).await?;
    crate::metrics::global().token_issued(sj);
    tracing::Span::current().record("token", token);
    Ok((written, higher))
}

/// Step 4 when the backstop cannot record the claim. Efficiency: a double run only wastes work;
/// run, and say the claim was skipped. Correctness: no Job without its claim; retry until the
/// period's deadline, then record it as Missed (G2).
async fn unavailable(
    ctx: &Context,
    sj: &SingletonJob,
    claim: RunRef,
    why: String,
) -> Result<Backstopped> {
    if purpose(sj) == LockPurpose::Efficiency {
        tracing::warn!(sj = %sj.key(), reason = %why, "backstop unavailable; Efficiency: starting without its claim");
        return Ok(Backstopped::Go {
            sj: Box::new(sj.clone()),
            claim,
            skipped: true,
        });
    }
    if past_deadline(sj, &claim) {
        let note = format!("the backstop stayed unavailable past the starting deadline: {why}");
        let d = Decision::new(Outcome::Missed, reason::BACKSTOP_UNAVAILABLE, note);
        Box::pin(decide_without_job(ctx, sj, &claim, d, None)).await?;
        return Ok(Backstopped::Decided);
    }
    Err(Error::BackstopUnavailable(why))
}

/// Step 4 when an open transaction holds the fence row past the lock timeout. A run this claim
/// replaces is the usual holder (a hung run is why people pick Replace): its Job is deleted now,
/// which ends its pods and with them their transaction, and the claim waits, whatever the
/// deadline, while that Job still exists (foreground deletion: until its pods are gone). Any
/// other holder is waited for until the period's deadline, then the period is Missed.
async fn fence_held(
    ctx: &Context,
    sj: &SingletonJob,
    claim: RunRef,
    why: String,
) -> Result<Backstopped> {
    let ns = sj.metadata.namespace.clone().unwrap_or_default();
    let mut stopping = false;
    for old in &claim.replaces {
        delete_replaced(ctx, &ns, old).await?;
        stopping |= kube_io::get_job(ctx, &ns, &old.job_name, Lane::Create)
            .await?
            .is_some_and(|j| old.job_uid.is_none() || j.metadata.uid == old.job_uid);
    }
    if !stopping && past_deadline(sj, &claim) {
        let note = format!("the backstop's fence stayed locked past the starting deadline: {why}");
        let d = Decision::new(Outcome::Missed, reason::FENCE_HELD, note);
        // The claim's transaction rolled back: its token never reached the fence.
        Box::pin(decide_without_job(ctx, sj, &claim, d, None)).await?;
        return Ok(Backstopped::Decided);
    }
    Err(Error::FenceHeld(why))
}

fn past_deadline(sj: &SingletonJob, claim: &RunRef) -> bool {
    sj.spec
        .starting_deadline_seconds
        .map(|d| claim.period.0 + SignedDuration::from_secs(d))
        .is_some_and(|d| Timestamp::now() > d)
}

/// Step 5 for one replaced run: its Job goes, and, foreground, its pods before it.
async fn delete_replaced(ctx: &Context, ns: &str, old: &ReplacedRun) -> Result<()> {
    let fg = Propagation::Foreground;
    match &old.job_uid {
        Some(uid) => kube_io::delete_job_uid(ctx, ns, &old.job_name, uid, fg, Lane::Create).await,
        None => kube_io::delete_job_named(ctx, ns, &old.job_name, fg, Lane::Create).await,
    }
    .map(|_| ())
}

/// How many times step 6 retries a create whose name was taken by a Job it removed.
const CREATES: usize = 2;

/// Step 6: creates the claim's Job, suspended. Returns its uid, or None when the period was
/// decided without a Job (the API server rejects the Job, or its name is taken by another run).
async fn create(
    ctx: &Context,
    fresh: &SingletonJob,
    claim: &RunRef,
    db: &Db,
) -> Result<Option<String>> {
    let ns = fresh.metadata.namespace.clone().unwrap_or_default();
    // On the heap: a Job is kilobytes, and this future waits in a lane with it.
    let mut job = Box::new(naming::build_job(fresh, claim.period.0, claim.token)?);
    if let Some(spec) = job.spec.as_mut() {
        spec.suspend = Some(true);
    }
    for _ in 0..CREATES {
        match kube_io::create_job(ctx, &job).await? {
            Ok(created) => {
                return created
                    .metadata
                    .uid
                    .map(Some)
                    .ok_or_else(|| Error::Conflict(format!("Job {} has no uid", claim.job_name)));
            }
            // The API server will never accept this Job: the period is decided, as Failed,
            // rather than retried forever with the claim blocking every later period (G2).
            Err(kube::Error::Api(s)) if s.code == 400 || s.code == 422 => {
                let note = format!(
                    "the API server rejected Job {}: {}",
                    claim.job_name, s.message
                );
                let d = Decision::new(Outcome::Failed, reason::JOB_REJECTED, note);
                Box::pin(decide_without_job(ctx, fresh, claim, d, ready(db))).await?;
                return Ok(None);
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let Some(existing) =
                    kube_io::get_job(ctx, &ns, &claim.job_name, Lane::Create).await?
                else {
                    continue; // deleted meanwhile: create again
                };
                match Box::pin(name_taken(ctx, fresh, claim, &existing, db)).await? {
                    Taken::Ours(uid) => return Ok(Some(uid)),
                    Taken::Removed => continue,
                    Taken::Decided => return Ok(None),
                }
            }
            // Refused for now (a quota, an admission webhook down, the API server itself): retried
            // until the period's deadline, then decided, never blocking later periods for ever.
            Err(e) if past_deadline(fresh, claim) => {
                let note = format!(
                    "Job {} could not be created before the starting deadline: {e}",
                    claim.job_name
                );
                let d = Decision::new(Outcome::Missed, reason::JOB_NOT_CREATED, note);
                Box::pin(decide_without_job(ctx, fresh, claim, d, ready(db))).await?;
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Conflict(format!(
        "the name of Job {} stayed taken",
        claim.job_name
    )))
}

/// What a create that found its name taken does.
enum Taken {
    /// The Job is this claim's (an earlier attempt created it, suspended): adopt its uid.
    Ours(String),
    /// A suspended Job no claim knows (it never ran) was removed: create again.
    Removed,
    /// Another run's Job: the period is decided without a Job of this claim.
    Decided,
}

/// Step 6 when a Job of the claim's name exists. It carries this claim's token: an earlier
/// attempt (a retry, or the claimer that died) created it; nobody can have resumed it, since
/// resuming follows a winning confirm and the claim is still pending. A suspended Job of this
/// SingletonJob that no claim knows never ran: removed by uid. Anything else is another run's
/// Job (an earlier run of the period, or not ours at all): the period is decided with an outcome
/// and an Event instead of being retried for ever ahead of every later period.
async fn name_taken(
    ctx: &Context,
    fresh: &SingletonJob,
    claim: &RunRef,
    existing: &Job,
    db: &Db,
) -> Result<Taken> {
    let ns = fresh.metadata.namespace.clone().unwrap_or_default();
    let found = naming::job_token(existing);
    let status = fresh.status.clone().unwrap_or_default();
    let owned = fresh
        .metadata
        .uid
        .as_deref()
        .and_then(|uid| crate::observe::OwnedJob::of(existing, uid));
    if found == Some(claim.token)
        && let Some(uid) = existing.metadata.uid.clone()
    {
        return Ok(Taken::Ours(uid));
    }
    if let Some(job) = owned.filter(|j| j.suspended && !crate::observe::known(&status, j)) {
        tracing::warn!(job = %job.name, token = ?job.token, "removing a suspended Job no claim knows (it never ran) to create this claim's");
        let bg = Propagation::Background;
        kube_io::delete_job_uid(ctx, &ns, &job.name, &job.uid, bg, Lane::Create).await?;
        return Ok(Taken::Removed);
    }
    let same_run = existing.metadata.annotations.as_ref().is_some_and(|a| {
        a.get(naming::LABEL_JOB) == fresh.metadata.name.as_ref()
            && a.get(naming::LABEL_PERIOD) == Some(&naming::period_rfc3339(claim.period.0))
    });
    let token = found.map_or("no".to_string(), |t| t.to_string());
    let d = if same_run {
        let note = format!(
            "Job {} of period {} exists already with token {token}: the period ran before; no second Job created",
            claim.job_name,
            naming::period_rfc3339(claim.period.0)
        );
        Decision::new(Outcome::Deduplicated, reason::JOB_EXISTS, note)
    } else {
        let note = format!(
            "a Job named {} that is not this SingletonJob's run (token {token}) exists; the period cannot run under that name",
            claim.job_name
        );
        Decision::new(Outcome::Failed, reason::JOB_NAME_TAKEN, note)
    };
    Box::pin(decide_without_job(ctx, fresh, claim, d, ready(db))).await?;
    Ok(Taken::Decided)
}

/// Whether the SingletonJob's template asks for suspended Jobs (a queueing system such as Kueue
/// resumes them): then the controller confirms but never resumes.
pub fn keeps_suspended(sj: &SingletonJob) -> bool {
    sj.spec
        .job_template
        .decode()
        .ok()
        .and_then(|t| t.spec)
        .and_then(|s| s.suspend)
        .unwrap_or(false)
}

/// Step 7's status: the claim moves from `pendingClaim` to `active`, the runs it replaced to the
/// history as Replaced, the run itself to the history as Running.
fn confirmed_status(
    fresh: &SingletonJob,
    claim: &RunRef,
    backstop_skipped: bool,
) -> SingletonJobStatus {
    let mut status = fresh.status.clone().unwrap_or_default();
    status.pending_claim = None;
    status
        .active
        .retain(|r| !claim.replaces.iter().any(|o| o.job_name == r.job_name));
    let mut run = claim.clone();
    run.replaces.clear();
    status.active.push(run);
    status.active_count = status.active.len() as i32;
    let now = Timestamp::now();
    for old in &claim.replaces {
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
    if backstop_skipped {
        // This run has no claim row: the claims table no longer knows every run (backfill).
        status.claims_recorded = None;
    }
    status.history.truncate(crate::controller::HISTORY_LIMIT);
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
    keep_suspended: bool,
) -> Result<()> {
    let ns = fresh.metadata.namespace.clone().unwrap_or_default();
    match kube_io::write_status_at(ctx, &fresh, status, Lane::Create, Some(failpoint::CONFIRM))
        .await
    {
        Ok(_) => {
            ctx.confirmed(&fresh, claim.token);
            for _ in &claim.replaces {
                crate::metrics::global().run_finished(&fresh, Outcome::Replaced);
            }
            resume(ctx, &fresh, &claim, &uid, keep_suspended).await
        }
        Err(Error::Conflict(what)) => {
            let name = fresh.metadata.name.as_deref().unwrap_or_default();
            let won = kube_io::get_sj(ctx, &ns, name).await?;
            let adopted = won.status.as_ref().is_some_and(|s| {
                s.active
                    .iter()
                    .any(|r| r.job_uid.as_deref() == Some(uid.as_str()))
            });
            // Adopted: the winner resumes it (or, if it died first, whoever acts next:
            // `observe::to_resume`). Still pending: its completer adopts it.
            if !adopted && !claim_pending(&won, &claim) {
                tracing::warn!(job = %claim.job_name, token = claim.token, "lost the confirm: removing this claim's Job, which never ran");
                let bg = Propagation::Background;
                kube_io::delete_job_uid(ctx, &ns, &claim.job_name, &uid, bg, Lane::Create).await?;
            }
            Err(Error::Conflict(what))
        }
        Err(e) => Err(e),
    }
}

/// Step 8: the confirmed Job may run (G1: only the Job a confirm named, by uid).
pub async fn resume(
    ctx: &Context,
    sj: &SingletonJob,
    run: &RunRef,
    uid: &str,
    keep_suspended: bool,
) -> Result<()> {
    if keep_suspended {
        return Ok(());
    }
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let resumed = kube_io::resume_job(ctx, ns, &run.job_name, uid).await?;
    ctx.resumed.note(uid);
    match resumed {
        Resumed::Yes => {
            ctx.events.run_started(sj, run);
            crate::metrics::global().run_started(sj, run.period.0, Timestamp::now());
        }
        Resumed::Already => {}
        Resumed::Gone => {
            tracing::info!(job = %run.job_name, "the run's Job was deleted before it could be resumed");
        }
    }
    Ok(())
}

/// The confirms (steps 7 and 8) in flight, each in its own task, by SingletonJob uid.
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

/// Starts steps 7 and 8 in a task of its own (see [`Confirms`]); its log lines keep the run's
/// span. The task ends when the gate closes, whatever it was doing: a replica that lost the
/// Lease stops at once.
fn spawn_confirm(
    ctx: &Arc<Context>,
    fresh: SingletonJob,
    status: SingletonJobStatus,
    claim: RunRef,
    uid: String,
    keep_suspended: bool,
) {
    let sj_uid = fresh.metadata.uid.clone();
    let obj = ObjectRef::from_obj(&fresh);
    ctx.confirms.begin(sj_uid.as_deref());
    let ctx = ctx.clone();
    let task = async move {
        let work = confirm(&ctx, fresh, status, claim, uid, keep_suspended);
        let result = tokio::select! {
            r = work => r,
            () = ctx.gate.closed() => Err(Error::NotLeader),
        };
        ctx.confirms.end(sj_uid.as_deref(), obj, result).await;
    };
    tokio::spawn(tracing::Instrument::in_current_span(task));
}

/// Breaks the lock (`kubectl singleton break-lock`): every token issued so far is fenced out, a
/// pending claim is cleared and the active runs are stopped, so a stuck or stale holder can
/// neither block later periods nor write. Who asked and why go into
/// `status.operations.breakLock` and a `LockBroken` Event. `op` is the accepted request's record.
/// Returns the record as written (phase Done).
///
/// ```text
/// 1. Gate   : only the replica that may act                                         G4
/// 2. Token  : one above every issued token (status and backstop fence)               G3
/// 3. Fence  : the backstop's fence rises to it and it is retired: from now on
///             singleton_fence refuses every older token, whatever its holder does.
///             A stuck run holding the fence row is stopped first (4), then 3 again.  G5
/// 4. Stop   : delete the pending claim's Job and the active runs' Jobs               G5
/// 5. Record : one resourceVersion-guarded status write: the new token, the stopped
///             runs as Failed/LockBroken, no pending claim, the operation Done. A 409
///             redoes it all: raising a fence twice only skips a token number.         G3
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
    let ns = sj.metadata.namespace.clone().unwrap_or_default();

    // 2. Token.
    let fence = match db {
        Db::Ready(b) => b.fence(&sj.key()).await?,
        Db::NotConfigured => 0,
        // Breaking a lock without the fence would promise what it cannot keep: wait for it.
        Db::Unavailable(why) => return Err(Error::BackstopUnavailable(why.clone())),
    };
    let before = status.fencing_token.max(fence);
    let token = before + 1;

    // 4 before 3 when the stuck run holds the fence row in an open transaction.
    let mut stopped: Vec<RunRef> = std::mem::take(&mut status.active);
    stopped.extend(status.pending_claim.take());
    if let Db::Ready(b) = db {
        // 3. Fence.
        if let Err(e) = b.retire(&sj.key(), token).await {
            if matches!(e, Error::FenceHeld(_)) {
                stop_runs(ctx, &ns, &stopped).await?;
            }
            return Err(e);
        }
    }

    // 4. Stop.
    stop_runs(ctx, &ns, &stopped).await?;

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

/// Break-lock's step 4: each run's Job goes, by uid when known. A pending claim's Job has no uid
/// in status yet: it is deleted only if it carries the claim's token (another Job of that name
/// is not the claim's).
async fn stop_runs(ctx: &Context, ns: &str, runs: &[RunRef]) -> Result<()> {
    let bg = Propagation::Background;
    for run in runs {
        let uid = match run.job_uid.clone() {
            Some(uid) => Some(uid),
            None => kube_io::get_job(ctx, ns, &run.job_name, Lane::Claim)
                .await?
                .filter(|j| naming::job_token(j) == Some(run.token))
                .and_then(|j| j.metadata.uid),
        };
        if let Some(uid) = uid {
            kube_io::delete_job_uid(ctx, ns, &run.job_name, &uid, bg, Lane::Claim).await?;
        }
    }
    Ok(())
}

/// Whether `sj`'s status still holds `claim` as its pending claim.
fn claim_pending(sj: &SingletonJob, claim: &RunRef) -> bool {
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

/// A period decided without a Job: its outcome, reason and the Event's note.
struct Decision {
    outcome: Outcome,
    reason: &'static str,
    note: String,
}

impl Decision {
    fn new(outcome: Outcome, reason: &'static str, note: String) -> Self {
        Decision {
            outcome,
            reason,
            note,
        }
    }
}

/// Decides a claimed period without a Job (rejected, deduplicated, name taken, missed for the
/// backstop): the claim is cleared and the outcome recorded, so it never blocks later periods
/// (G2). `retire_in`: the backstop whose fence the claim's token reached; it is retired there
/// first (G3: the period is decided), and a Correctness job records nothing until it is.
async fn decide_without_job(
    ctx: &Context,
    sj: &SingletonJob,
    claim: &RunRef,
    d: Decision,
    retire_in: Option<&Backstop>,
) -> Result<()> {
    if let Some(b) = retire_in {
        retire(sj, b, claim.token).await?;
    }
    let mut status = sj.status.clone().unwrap_or_default();
    status.pending_claim = None;
    status.last_result = Some(d.outcome);
    let entry = HistoryEntry {
        period: claim.period.clone(),
        last_period: None,
        count: 1,
        outcome: d.outcome,
        reason: Some(d.reason.into()),
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
        .publish(sj, EventType::Warning, d.reason, "DecidePeriod", d.note)
        .await;
    Ok(())
}

/// The backstop of `db`, if it is ready.
fn ready(db: &Db) -> Option<&Backstop> {
    match db {
        Db::Ready(b) => Some(b),
        _ => None,
    }
}

/// Retires `token` (its period is decided). Correctness: an error stops the caller from
/// recording the decision (it is retried); Efficiency: logged, and the decision goes on.
pub async fn retire(sj: &SingletonJob, b: &Backstop, token: u64) -> Result<()> {
    match b.retire(&sj.key(), token).await {
        Ok(()) => Ok(()),
        Err(e) if purpose(sj) == LockPurpose::Efficiency => {
            tracing::warn!(sj = %sj.key(), token, error = %e, "could not retire the token of a decided period; Efficiency: recording it anyway");
            Ok(())
        }
        Err(e) => Err(e),
    }
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
        // 409: a Job of that name exists, so the template itself was not the problem; nor is
        // it with 403 (a quota with no room, or no permission): creating the run's Job will say
        // so, and the claim is decided by its deadline.
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 403 => Ok(Ok(())),
        Err(kube::Error::Api(s)) if s.code == 400 || s.code == 422 => Ok(Err(s.message)),
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
            resumed: Default::default(),
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
            replaces: Vec::new(),
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
        let status = confirmed_status(&sj, &claim, false);
        spawn_confirm(
            &ctx,
            sj.clone(),
            status,
            claim.clone(),
            "job-uid".into(),
            false,
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

    /// Asserts that `req` resumes the Job `hello-1800000000` only if its uid is `uid`.
    async fn assert_resume(req: Request<Body>, uid: &str) {
        assert_eq!(req.method(), http::Method::PATCH);
        assert_eq!(
            req.uri().path(),
            "/apis/batch/v1/namespaces/ns/jobs/hello-1800000000"
        );
        assert_eq!(
            req.headers()[http::header::CONTENT_TYPE],
            "application/json-patch+json"
        );
        let body: serde_json::Value =
            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        assert_eq!(
            body,
            serde_json::json!([
                {"op": "test", "path": "/metadata/uid", "value": uid},
                {"op": "test", "path": "/spec/suspend", "value": true},
                {"op": "replace", "path": "/spec/suspend", "value": false},
            ]),
            "only that object, never another Job of its name"
        );
    }

    #[tokio::test]
    async fn a_won_confirm_resumes_its_job_by_uid_and_reconciles_wait_for_both() {
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
        assert_eq!(body["status"]["active"][0]["jobUid"], "job-uid");
        assert!(ctx.confirms.in_flight(&sj));
        respond(send, 200, serde_json::to_vec(&body).unwrap());

        // Step 8 follows the won confirm, and only it.
        let (req, send) = next(&mut handle, "the resume").await;
        assert_resume(req, "job-uid").await;
        assert!(ctx.confirms.in_flight(&sj), "in flight until resumed");
        respond(send, 200, b"{}".to_vec());

        assert_eq!(asked(&mut done).await, ObjectRef::from_obj(&sj));
        assert!(!ctx.confirms.in_flight(&sj));
        // Copies read before the confirm are recognised as stale.
        assert!(ctx.is_stale(&sj, sj.status.as_ref().unwrap()));
    }

    /// What the status that beat a confirm says of the confirm's claim and Job.
    #[derive(Clone, Copy, Debug)]
    enum Winner {
        /// Another replica completed the claim with this very Job (it adopted it).
        AdoptedTheJob,
        /// The claim is still pending (an unrelated write won): its completer adopts the Job.
        StillPending,
        /// The period was completed without this Job (it is a late re-creation).
        MovedOn,
    }

    #[tokio::test]
    async fn a_lost_confirm_never_lets_an_unknown_job_run() {
        for winner in [Winner::AdoptedTheJob, Winner::StillPending, Winner::MovedOn] {
            let (ctx, mut handle, mut done, sj, claim) = confirming();

            let (_, send) = next(&mut handle, "the confirm").await;
            respond(send, 409, conflict());
            let (req, send) = next(&mut handle, "the re-read").await;
            assert_eq!(req.method(), http::Method::GET);
            let mut won = sj.clone();
            won.metadata.resource_version = Some("4712".into());
            let mut status = SingletonJobStatus {
                fencing_token: 7,
                ..Default::default()
            };
            match winner {
                Winner::AdoptedTheJob => status.active = vec![claim.clone()],
                Winner::StillPending => status.pending_claim = Some(claim.clone()),
                Winner::MovedOn => {}
            }
            won.status = Some(status);
            respond(send, 200, serde_json::to_vec(&won).unwrap());
            match winner {
                // The winner resumes it; a loser never does.
                Winner::AdoptedTheJob | Winner::StillPending => {}
                Winner::MovedOn => {
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
            }
            assert_eq!(asked(&mut done).await, ObjectRef::from_obj(&sj));
            assert!(!ctx.confirms.in_flight(&sj));
            assert!(
                !ctx.is_stale(&sj, sj.status.as_ref().unwrap()),
                "not confirmed"
            );
            // Nothing else was sent (never a resume after a lost confirm): the task is over and
            // holds no client.
            drop(ctx);
            let after =
                tokio::time::timeout(std::time::Duration::from_secs(10), handle.next_request());
            assert!(
                matches!(after.await, Ok(None)),
                "a request after the confirm was done ({winner:?})"
            );
        }
    }

    #[tokio::test]
    async fn the_job_is_created_suspended_then_confirmed_then_resumed() {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let (confirms, mut done) = Confirms::new();
        let ctx = Arc::new(Context {
            confirms,
            ..context(kube::Client::new(svc, "ns"))
        });
        let (sj, claim) = claimed();
        let mut claim = claim;
        claim.job_uid = None;
        let server = async {
            let (req, send) = next(&mut handle, "the create").await;
            assert_eq!(req.method(), http::Method::POST);
            assert_eq!(req.uri().path(), "/apis/batch/v1/namespaces/ns/jobs");
            let mut job: serde_json::Value =
                serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
            assert_eq!(job["spec"]["suspend"], true, "created unable to run");
            assert_eq!(job["metadata"]["name"], "hello-1800000000");
            job["metadata"]["uid"] = "new-uid".into();
            respond(send, 201, serde_json::to_vec(&job).unwrap());
            let (req, send) = next(&mut handle, "the confirm").await;
            assert_eq!(req.method(), http::Method::PUT);
            let body: serde_json::Value =
                serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
            assert_eq!(body["status"]["active"][0]["jobUid"], "new-uid");
            respond(send, 200, serde_json::to_vec(&body).unwrap());
            let (req, send) = next(&mut handle, "the resume").await;
            assert_resume(req, "new-uid").await;
            respond(send, 200, b"{}".to_vec());
        };
        let (completed, ()) = tokio::join!(
            complete_claim(&ctx, &sj, claim, &Db::NotConfigured, Read::JustWritten),
            server
        );
        completed.expect("completed");
        assert_eq!(asked(&mut done).await, ObjectRef::from_obj(&sj));
    }

    #[tokio::test]
    async fn a_write_waiting_for_a_lane_when_the_gate_closes_is_never_sent() {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let (tx, rx) = tokio::sync::watch::channel(crate::controller::GateState {
            may_act: true,
            epoch: 1,
            valid_until: None,
        });
        let ctx = Context {
            gate: Gate::new(rx),
            lanes: crate::lanes::Lanes::new(1),
            ..context(kube::Client::new(svc, "ns"))
        };
        // Every slot is taken: the write waits in its lane, past the gate check at its start.
        let held = ctx.lanes.acquire(Lane::Background).await;
        let obj = sj();
        let write = write_status(&ctx, &obj, SingletonJobStatus::default(), Lane::Create);
        tokio::pin!(write);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), &mut write)
                .await
                .is_err(),
            "waits for a slot"
        );
        // The Lease is lost meanwhile; then the slot frees.
        tx.send_replace(crate::controller::GateState {
            may_act: false,
            epoch: 1,
            valid_until: None,
        });
        drop(held);
        let err = tokio::time::timeout(std::time::Duration::from_secs(5), write)
            .await
            .expect("refused without a request, not sent")
            .expect_err("the gate is closed");
        assert!(matches!(err, Error::NotLeader), "{err:?}");
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(200), handle.next_request())
                .await
                .is_err(),
            "nothing was sent"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn gate_closed_resolves_on_a_state_change_or_at_the_deadline() {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
        let (tx, rx) = tokio::sync::watch::channel(crate::controller::GateState {
            may_act: true,
            epoch: 1,
            valid_until: Some(deadline),
        });
        let gate = Gate::new(rx);
        // The deadline alone closes it.
        let started = tokio::time::Instant::now();
        gate.closed().await;
        assert_eq!(started.elapsed(), std::time::Duration::from_secs(3));
        // A renewal moves the deadline; losing the Lease closes it before.
        tx.send_replace(crate::controller::GateState {
            may_act: true,
            epoch: 1,
            valid_until: Some(tokio::time::Instant::now() + std::time::Duration::from_secs(10)),
        });
        let closing = gate.closed();
        tokio::pin!(closing);
        assert!(
            tokio::time::timeout(std::time::Duration::from_secs(1), &mut closing)
                .await
                .is_err()
        );
        tx.send_replace(crate::controller::GateState {
            may_act: false,
            epoch: 1,
            valid_until: None,
        });
        closing.await;
        assert!(
            tokio::time::timeout(std::time::Duration::from_secs(60), Gate::always().closed())
                .await
                .is_err(),
            "an always-open gate never closes"
        );
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
