//! Steps 2 to 4 of the run protocol ([`super`]): the token, and the backstop's claim row and
//! fence, with what a stale token, a held fence row and an unreachable database lead to.

use futures::future::BoxFuture;
use jiff::{SignedDuration, Timestamp};

use super::decided;
use crate::api::{LockPurpose, Outcome, RunRef, SingletonJob};
use crate::backstop::{Availability, ClaimOutcome};
use crate::context::Context;
use crate::decide::reason;
use crate::kube_io;
use crate::lanes::Lane;
use crate::naming;
use crate::{Error, Result};

/// What step 4 leaves to do.
pub(super) enum Backstopped {
    /// Go on with this claim (its token may have been raised) on this copy of the SingletonJob;
    /// `skipped`: without a backstop claim (Efficiency, database unreachable).
    Go {
        sj: Box<SingletonJob>,
        claim: Box<RunRef>,
        skipped: bool,
    },
    /// The period is decided without a Job (Deduplicated, Missed): nothing more to do.
    Decided,
}

/// How many times step 4 re-claims with a higher token before giving up for this reconcile.
const RECLAIMS: usize = 3;

/// Step 4: the claim row and the fence. Retrying a claim we wrote before finds our own row: ours,
/// go on.
pub(super) async fn backstop_claim(
    ctx: &Context,
    sj: &SingletonJob,
    mut claim: RunRef,
    db: &Availability,
) -> Result<Backstopped> {
    let b = match db {
        Availability::NotConfigured => {
            return Ok(Backstopped::Go {
                sj: Box::new(sj.clone()),
                claim: Box::new(claim),
                skipped: false,
            });
        }
        Availability::Unavailable(why) => return unavailable(ctx, sj, claim, why.clone()).await,
        Availability::Ready(b) => b,
    };
    let mut sj = sj.clone();
    let period = claim.period.0;
    let key = sj.backstop_key();
    let claimer = claimer(ctx, &sj, &claim);
    for _ in 0..=RECLAIMS {
        // Database writes pass the gate as Kubernetes writes do (F4): a replica that lost the
        // Lease while it waited does not claim.
        ctx.gate.check()?;
        let claimed = claim_once(b, &key, &claim, &claimer).await;
        match claimed {
            // Multi-cluster (docs/multi-cluster.md).
            Ok(
                o @ (ClaimOutcome::ClaimedElsewhere { .. }
                | ClaimOutcome::NotYet { .. }
                | ClaimOutcome::TookOver { .. }
                | ClaimOutcome::Superseded { .. }),
            ) => return multi_cluster(ctx, sj, claim, o).await,
            // N4: another namespace's job key. Its period is never this SingletonJob's.
            Ok(ClaimOutcome::NotOwner { owner: o }) => return not_owner(ctx, &sj, &claim, o).await,
            Ok(ClaimOutcome::Duplicate { token, job_name }) if token != claim.token => {
                let d = deduplicated(&claim, token, &job_name);
                decided::decide_without_job(ctx, &sj, &claim, d, None).await?;
                return Ok(Backstopped::Decided);
            }
            // Our own earlier claim (a retry after a crash) whose token was retired meanwhile: a
            // stop of its Job (started by someone else) retired it and did not get to record the
            // decision. No Job is created with a retired token: the period is decided now.
            Ok(ClaimOutcome::Duplicate { token, .. })
                if token == claim.token && Box::pin(retired_itself(b, &key, token)).await? =>
            {
                let d = retired_before_recorded(period, token);
                decided::decide_without_job(ctx, &sj, &claim, d, None).await?;
                return Ok(Backstopped::Decided);
            }
            // A fresh claim, or our own earlier one (a retry after a crash).
            Ok(_) => {
                return Ok(Backstopped::Go {
                    sj: Box::new(sj),
                    claim: Box::new(claim),
                    skipped: false,
                });
            }
            // G3: the fence is at or above this token (a newer token was issued elsewhere: a
            // run of an earlier SingletonJob of this name, a break-lock, a workload). Never run
            // at or below the fence: claim the same period again with a token above it.
            Err(Error::StaleToken { current, .. }) => {
                let (reclaimed, higher) = reclaim(ctx, &sj, &claim, current).await?;
                sj = reclaimed;
                claim = higher;
            }
            Err(Error::FenceHeld(why)) => {
                return fence_held(ctx, &sj, claim, why).await;
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

/// The claim was refused: the job key belongs to the namespace `owner` in the backstop. The
/// period is decided without a Job; the decision (status, Event) does not name the owner, which
/// the SingletonJob's readers need not know; the log, which operators read, does. The claim's
/// transaction rolled back: nothing to retire.
async fn not_owner(
    ctx: &Context,
    sj: &SingletonJob,
    claim: &RunRef,
    owner: String,
) -> Result<Backstopped> {
    let key = sj.backstop_key();
    tracing::warn!(sj = %sj.key(), job_key = %key, owner, "claim refused: the backstop's job key belongs to another namespace");
    let note = format!(
        "not run: the backstop's job key {key} belongs to another namespace (the namespace of its first claim); use a job key of your own, or ask an administrator to share or move it (docs/security.md)"
    );
    let d = decided::Decision::new(Outcome::Missed, reason::JOB_KEY_OWNED_ELSEWHERE, note);
    decided::decide_without_job(ctx, sj, claim, d, None).await?;
    Ok(Backstopped::Decided)
}

/// The period was claimed in the backstop by another token (another replica, cluster or an
/// earlier rerun). The claim's own token never reached the fence (the transaction rolled back):
/// nothing to retire.
fn deduplicated(claim: &RunRef, token: u64, job_name: &str) -> decided::Decision {
    let p = naming::period_rfc3339(claim.period.0);
    let note = match claim.supersedes {
        Some(old) => format!(
            "rerun of period {p} not started: its backstop claim moved from token {old} to {token} ({job_name}) since the rerun was accepted; no Job created"
        ),
        None => format!(
            "period {p} was already claimed in the backstop by {job_name} with token {token}; no Job created"
        ),
    };
    decided::Decision::new(Outcome::Deduplicated, reason::DEDUPLICATED, note)
}

/// Our own earlier claim whose token a stop of its Job retired before the decision was recorded.
fn retired_before_recorded(period: Timestamp, token: u64) -> decided::Decision {
    let p = naming::period_rfc3339(period);
    let note = format!(
        "the claim of period {p} (token {token}) was retired before its run was recorded: its Job was stopped (started by someone else); no other Job is created for it"
    );
    decided::Decision::new(Outcome::Failed, reason::STARTED_BEFORE_CONFIRM, note)
}

/// Whether `token` itself was retired: it is still the stored fence and the retired mark reached
/// it. A token merely below the fence (a later claim, possibly another cluster's, raised and
/// retired its own) is not: its claim may still be completed, as ever.
async fn retired_itself(b: &crate::backstop::Backstop, key: &str, token: u64) -> Result<bool> {
    Ok(b.fence(key).await? == token && b.retired(key).await? >= token)
}

/// Who claims in the backstop: this cluster (`--cluster-id`) under the SingletonJob's
/// multi-cluster policy (`spec.backstop`), for a scheduled run or one a user asked for.
pub(super) fn claimer(
    ctx: &Context,
    sj: &SingletonJob,
    claim: &RunRef,
) -> crate::backstop::Claimer {
    let spec = sj.spec.backstop.as_ref();
    let secs = |s: Option<i64>| s.map(|s| SignedDuration::from_secs(s.max(0)));
    crate::backstop::Claimer {
        cluster: ctx.backstops.cluster().to_string(),
        takeover_after: secs(spec.and_then(|b| b.takeover_after_seconds)),
        standby_delay: secs(spec.and_then(|b| b.standby_delay_seconds)),
        scheduled: claim.origin.is_none(),
        namespace: sj.metadata.namespace.clone().unwrap_or_default(),
    }
}

/// Step 4, multi-cluster confirm: before anything acts on the claim (replacing, creating the
/// Job), its backstop row is confirmed by a conditional update that fails when another cluster
/// took it over meanwhile (the claimer paused past `takeoverAfterSeconds`). Losing it, the period
/// is decided here without a Job: it is the other cluster's now, and this token is fenced out.
/// Without a cluster identity claims are never taken over, and nothing is confirmed.
pub(super) async fn confirm_in_backstop(
    ctx: &Context,
    sj: &SingletonJob,
    claim: &RunRef,
    db: &Availability,
) -> Result<bool> {
    let Availability::Ready(b) = db else {
        return Ok(true);
    };
    if ctx.backstops.cluster().is_empty() {
        return Ok(true);
    }
    let key = sj.backstop_key();
    let period = claim.period.0;
    ctx.gate.check()?;
    if Box::pin(b.confirm(&key, period, claim.token, ctx.backstops.cluster())).await? {
        return Ok(true);
    }
    let row = Box::pin(b.claimed(&key, period)).await?;
    let (cluster, token) = row
        .map(|r| (r.cluster, r.token))
        .unwrap_or_else(|| (String::from("?"), 0));
    crate::metrics::global().multi_cluster_claim(ctx.backstops.cluster(), "ClaimedElsewhere");
    let p = naming::period_rfc3339(period);
    let note = format!(
        "period {p} was taken over by cluster {cluster:?} (token {token}) before this cluster confirmed its claim (token {}); no Job created in this cluster",
        claim.token
    );
    tracing::warn!(sj = %sj.key(), "{note}");
    let d = decided::Decision::new(Outcome::Deduplicated, reason::CLAIMED_ELSEWHERE, note)
        .elsewhere(cluster);
    // The token is below the fence already (the takeover raised it): nothing to retire.
    decided::decide_without_job(ctx, sj, claim, d, None).await?;
    Ok(false)
}

/// Step 4, one claim in the backstop as this cluster, counted by result. A rerun takes the
/// period's row over from the token it found there (`supersedes`).
async fn claim_once(
    b: &crate::backstop::Backstop,
    key: &str,
    claim: &RunRef,
    claimer: &crate::backstop::Claimer,
) -> Result<ClaimOutcome> {
    let claimed = b.claim_as(
        key,
        claim.period.0,
        claim.token,
        &claim.job_name,
        claim.supersedes,
        claimer,
    );
    let claimed = Box::pin(claimed).await;
    if let Ok(outcome) = &claimed {
        crate::metrics::global().multi_cluster_claim(&claimer.cluster, outcome.kind());
    }
    claimed
}

/// Step 4, the multi-cluster outcomes of a backstop claim (docs/multi-cluster.md).
fn multi_cluster<'a>(
    ctx: &'a Context,
    sj: SingletonJob,
    claim: RunRef,
    outcome: ClaimOutcome,
) -> BoxFuture<'a, Result<Backstopped>> {
    // Boxed: a rare path, kept out of its callers' futures (docs/performance.md).
    Box::pin(async move {
        let p = naming::period_rfc3339(claim.period.0);
        match outcome {
            // Another cluster ran or runs this period. This claim's token never reached the
            // fence: nothing to retire.
            ClaimOutcome::ClaimedElsewhere {
                cluster,
                token,
                job_name,
            } => {
                let note = format!(
                    "period {p} was claimed in the shared backstop by cluster {cluster:?} ({job_name}, token {token}); no Job created in this cluster"
                );
                let d =
                    decided::Decision::new(Outcome::Deduplicated, reason::CLAIMED_ELSEWHERE, note)
                        .elsewhere(cluster);
                decided::decide_without_job(ctx, &sj, &claim, d, None).await?;
                Ok(Backstopped::Decided)
            }
            // Not our turn yet, by the database's clock (a standby before its delay, or another
            // cluster's unconfirmed claim within the bound): retried then, the claim pending.
            // G2: a period that may no longer start is recorded, not waited for forever.
            ClaimOutcome::NotYet { until } if past_deadline(&sj, &claim) => {
                let note = format!(
                    "period {p} passed its starting deadline while waiting for its turn in the shared backstop (until {until}, database time)"
                );
                let d = decided::Decision::new(Outcome::Missed, reason::DEADLINE_EXCEEDED, note);
                decided::decide_without_job(ctx, &sj, &claim, d, None).await?;
                Ok(Backstopped::Decided)
            }
            ClaimOutcome::NotYet { until } => Err(Error::StandbyWaiting { until }),
            ClaimOutcome::Superseded {
                period,
                cluster,
                token,
            } => superseded(ctx, &sj, &claim, period, cluster, token).await,
            ClaimOutcome::TookOver { cluster, token } => {
                let note = format!(
                    "took period {p} over from cluster {cluster:?} (token {token}), whose claim was not confirmed within takeoverAfterSeconds; its token is fenced out"
                );
                tracing::warn!(sj = %sj.key(), from = %cluster, stale = token, token = claim.token, "{note}");
                ctx.events
                    .publish(
                        &sj,
                        kube::runtime::events::EventType::Warning,
                        reason::TOOK_OVER,
                        "Claim",
                        note,
                    )
                    .await;
                Ok(Backstopped::Go {
                    sj: Box::new(sj),
                    claim: Box::new(claim),
                    skipped: false,
                })
            }
            ClaimOutcome::Claimed
            | ClaimOutcome::Duplicate { .. }
            | ClaimOutcome::NotOwner { .. } => {
                Err(Error::Backstop("not a multi-cluster claim outcome".into()))
            }
        }
    })
}

/// Step 4 when another cluster claimed a later period first (this cluster was late: a standby
/// after its delay, or behind by its clock). G2 and G3: running this period now would give the
/// older period the higher token, so it is recorded Missed instead, as a later period supersedes
/// late ones within a cluster. Its token never reached the fence: nothing to retire.
async fn superseded(
    ctx: &Context,
    sj: &SingletonJob,
    claim: &RunRef,
    later: Timestamp,
    cluster: String,
    token: u64,
) -> Result<Backstopped> {
    let p = naming::period_rfc3339(claim.period.0);
    let later = naming::period_rfc3339(later);
    let note = format!(
        "period {p} not run: cluster {cluster:?} had already claimed the later period {later} (token {token}) in the shared backstop, and tokens follow the periods"
    );
    let d = decided::Decision::new(Outcome::Missed, reason::SUPERSEDED, note).elsewhere(cluster);
    decided::decide_without_job(ctx, sj, claim, d, None).await?;
    Ok(Backstopped::Decided)
}

/// Step 4, re-claim: the pending claim is rewritten, by compare-and-swap, with a token above the
/// backstop's fence `current` (and above every token of the status). Returns the object as
/// written and the claim with its new token.
fn reclaim<'a>(
    ctx: &'a Context,
    sj: &'a SingletonJob,
    claim: &'a RunRef,
    current: u64,
) -> BoxFuture<'a, Result<(SingletonJob, RunRef)>> {
    // Boxed: a rare path, kept out of its callers' futures (docs/performance.md).
    Box::pin(async move {
        let mut status = sj.status.clone().unwrap_or_default();
        let token = crate::backstop::next_token(status.fencing_token.max(current))?;
        let mut higher = claim.clone();
        higher.token = token;
        status.fencing_token = token;
        status.pending_claim = Some(higher.clone());
        crate::decide::ops::on_reclaim(&mut status.operations, claim, token);
        tracing::warn!(sj = %sj.key(), stale = claim.token, fence = current, token, "the backstop's fence is above the claim's token; claiming again with a higher one");
        let written = kube_io::write_status(ctx, sj, status, Lane::Create).await?;
        crate::metrics::global().token_issued(sj);
        tracing::Span::current().record("token", token);
        Ok((written, higher))
    })
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
    if sj.purpose() == LockPurpose::Efficiency {
        tracing::warn!(sj = %sj.key(), reason = %why, "backstop unavailable; Efficiency: starting without its claim");
        return Ok(Backstopped::Go {
            sj: Box::new(sj.clone()),
            claim: Box::new(claim),
            skipped: true,
        });
    }
    if past_deadline(sj, &claim) {
        let note = format!("the backstop stayed unavailable past the starting deadline: {why}");
        // The claim may have committed before the database stopped answering: its row is
        // withdrawn once the database answers again (F10c).
        let d =
            decided::Decision::new(Outcome::Missed, reason::BACKSTOP_UNAVAILABLE, note).unsettled();
        decided::decide_without_job(ctx, sj, &claim, d, None).await?;
        return Ok(Backstopped::Decided);
    }
    Err(Error::BackstopUnavailable(why))
}

/// Step 4 when an open transaction holds the fence row past the lock timeout. A run this claim
/// replaces is the usual holder (a hung run is why people pick Replace): its Job is deleted now,
/// which ends its pods and with them their transaction, and the claim waits while that Job still
/// exists (foreground deletion: until its pods are gone), past the starting deadline, up to the
/// next period. Any other holder
/// (a workload on a node that died mid-transaction keeps its session and lock until TCP
/// keepalive gives up, hours) is waited for until the wait bound ([`past_wait_bound`]: the
/// starting deadline, else the next period), then the period is Missed (F6); `kubectl singleton
/// break-lock` ends such a holder's session.
fn fence_held<'a>(
    ctx: &'a Context,
    sj: &'a SingletonJob,
    claim: RunRef,
    why: String,
) -> BoxFuture<'a, Result<Backstopped>> {
    // Boxed: a rare path, kept out of its callers' futures (docs/performance.md).
    Box::pin(async move {
        let ns = sj.metadata.namespace.clone().unwrap_or_default();
        let mut stopping = false;
        for old in &claim.replaces {
            // Deleted by this call: its pods' transactions are ending now, even when the Job
            // (without pods to wait for) is gone before the read below.
            stopping |= super::create::delete_replaced(ctx, &ns, old).await?;
            stopping |= kube_io::get_job(ctx, &ns, &old.job_name, Lane::Create)
                .await?
                .is_some_and(|j| old.job_uid.is_none() || j.metadata.uid == old.job_uid);
        }
        // While the replaced run is being stopped the claim waits past its starting deadline
        // (its period is not lost to the hung run it replaces), up to the next period.
        let waited_enough = if stopping {
            crate::decide::next_instant(&sj.spec, claim.period.0)
                .is_some_and(|next| Timestamp::now() > next)
        } else {
            past_deadline(sj, &claim) || past_wait_bound(sj, &claim)
        };
        if waited_enough {
            let note =
                format!("the backstop's fence stayed locked past the starting deadline: {why}");
            let d = decided::Decision::new(Outcome::Missed, reason::FENCE_HELD, note);
            // The claim's transaction rolled back: its token never reached the fence.
            decided::decide_without_job(ctx, sj, &claim, d, None).await?;
            return Ok(Backstopped::Decided);
        }
        Err(Error::FenceHeld(why))
    })
}

/// Whether `claim` waited past its wait bound ([`crate::decide::wait_bound`]).
pub(super) fn past_wait_bound(sj: &SingletonJob, claim: &RunRef) -> bool {
    crate::decide::wait_bound(&sj.spec, claim.period.0).is_some_and(|b| Timestamp::now() > b)
}

pub(super) fn past_deadline(sj: &SingletonJob, claim: &RunRef) -> bool {
    sj.spec
        .starting_deadline_seconds
        .map(|d| claim.period.0 + SignedDuration::from_secs(d))
        .is_some_and(|d| Timestamp::now() > d)
}
