//! A claimed period decided without a Job (deduplicated, rejected, name taken, missed): the
//! claim is cleared and the outcome recorded, after the claim's token is retired.

use futures::future::BoxFuture;
use jiff::Timestamp;
use kube::runtime::events::EventType;

use crate::Result;
use crate::api::{LockPurpose, Outcome, RunRef, SingletonJob};
use crate::backstop::Backstop;
use crate::context::Context;
use crate::decide::prepare::WithdrawReason;
use crate::kube_io;
use crate::lanes::Lane;
use crate::record;

/// A period decided without a Job: its outcome, reason and the Event's note.
pub(super) struct Decision {
    outcome: Outcome,
    reason: &'static str,
    note: String,
    /// Multi-cluster: the cluster that has the period instead (recorded in the history).
    cluster: Option<String>,
    /// A Job with the claim's token may have run pods (it was stopped): its token is retired
    /// whatever attempts registered. Otherwise only if none did (F4).
    started: bool,
    /// The backstop stopped answering in the middle of the claim: its row may exist. Remembered
    /// in `status.unsettledClaims` and withdrawn once the backstop answers ([`settle`], F10c).
    unsettled: bool,
}

impl Decision {
    pub(super) fn new(outcome: Outcome, reason: &'static str, note: String) -> Self {
        Decision {
            outcome,
            reason,
            note,
            cluster: None,
            started: false,
            unsettled: false,
        }
    }

    /// The claim's backstop row may exist (see `unsettled`).
    pub(super) fn unsettled(mut self) -> Self {
        self.unsettled = true;
        self
    }

    /// The claim's Job may have run pods before it was stopped (see `started`).
    pub(super) fn started(mut self) -> Self {
        self.started = true;
        self
    }

    /// The period is another cluster's (`ClaimedElsewhere`): its identity goes to the history.
    pub(super) fn elsewhere(mut self, cluster: String) -> Self {
        self.cluster = Some(cluster);
        self
    }
}

/// Decides a claimed period without a Job (rejected, deduplicated, name taken, missed for the
/// backstop): the claim is cleared and the outcome recorded, so it never blocks later periods
/// (G2). `retire_in`: the backstop whose fence the claim's token reached; it is retired there
/// first (G3: the period is decided), and a Correctness job records nothing until it is. The
/// retirement is refused inside the database when an attempt of the token registered (F4): then
/// a Job of the claim ran, completed by another replica while this one paused, and this
/// decision is stale (its status write would be refused too, but the retirement comes first).
pub(super) fn decide_without_job<'a>(
    ctx: &'a Context,
    sj: &'a SingletonJob,
    claim: &'a RunRef,
    d: Decision,
    retire_in: Option<&'a Backstop>,
) -> BoxFuture<'a, Result<()>> {
    // Boxed: a rare path, kept out of its callers' futures (docs/performance.md).
    Box::pin(async move {
        // A preparation decides nothing before its instant (issue 33, G2): refused, it gives the
        // period back, and the period is decided at its instant as without preparation. Recorded
        // here with the cursor left before the period, the next reconcile would prepare it again
        // and record it again (a deleted SingletonJob's Job, its name taken until collected, gave
        // six entries for one period). A Job of it that may have run is decided now (G1).
        if claim.resume_at.is_some() && !d.started {
            return give_back(ctx, sj, claim, d, retire_in).await;
        }
        if let Some(b) = retire_in {
            ctx.gate.check()?;
            if d.started {
                retire(sj, b, claim.token).await?;
            } else {
                retire_unstarted(sj, b, claim.token).await?;
            }
        }
        let mut status = sj.status.clone().unwrap_or_default();
        status.pending_claim = None;
        status.last_result = Some(d.outcome);
        if d.unsettled {
            remember_unsettled(&mut status, claim);
        }
        if claim.resume_at.is_some() {
            let through = status.decided_through.as_ref().map(|t| t.0);
            if through.is_none_or(|t| t < claim.period.0) {
                status.decided_through = Some(claim.period.0.into());
                status.last_schedule_time = Some(claim.period.0.into());
            }
        }
        let mut entry = record::decided_entry(claim, d.outcome, d.reason, Timestamp::now());
        entry.cluster = d.cluster;
        record::push_history(&mut status, entry.clone());
        kube_io::write_status(ctx, sj, status, Lane::Background).await?;
        crate::metrics::global().recorded(sj, &entry);
        ctx.events
            .publish(sj, EventType::Warning, d.reason, "DecidePeriod", d.note)
            .await;
        Ok(())
    })
}

/// A refused preparation (see [`decide_without_job`]): its backstop claim withdrawn (the row, if
/// the claim reached the backstop, archived with the reason `Refused`; its token retired), the
/// pending claim cleared and its `runCount` given back, no history entry; the period is not
/// prepared again ([`Context::refuse_preparation`]) and runs at its instant as without
/// preparation.
async fn give_back(
    ctx: &Context,
    sj: &SingletonJob,
    claim: &RunRef,
    d: Decision,
    withdraw_in: Option<&Backstop>,
) -> Result<()> {
    let reason = WithdrawReason::Refused;
    if let Some(b) = withdraw_in {
        ctx.gate.check()?;
        let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
        let key = sj.backstop_key();
        match b
            .withdraw(&key, claim.period.0, claim.token, ns, reason.name())
            .await
        {
            Ok(()) => {}
            // An attempt of the token registered: a Job of it ran, and this decision is stale.
            Err(e @ crate::Error::RunStarted { .. }) => return Err(e),
            Err(e) if sj.purpose() == LockPurpose::Efficiency => {
                tracing::warn!(sj = %sj.key(), token = claim.token, error = %e, "could not withdraw a refused preparation's backstop claim; Efficiency: giving the period back anyway");
            }
            Err(e) => return Err(e),
        }
    }
    let mut status = sj.status.clone().unwrap_or_default();
    if status
        .pending_claim
        .as_ref()
        .is_some_and(|p| p.token == claim.token)
    {
        status.pending_claim = None;
        status.run_count = status.run_count.saturating_sub(1);
    }
    if d.unsettled {
        remember_unsettled(&mut status, claim);
    }
    kube_io::write_status(ctx, sj, status, Lane::Background).await?;
    ctx.refuse_preparation(sj, claim.period.0);
    crate::metrics::global().run_withdrawn(sj, reason.name());
    crate::metrics::global().prepared(sj, crate::metrics::PreparedStage::Withdrawn);
    let note = format!(
        "the run of period {} (token {}) was being prepared ahead of its instant and was withdrawn: {}; nothing is decided, token {} is retired, and the period runs at its instant as without preparation",
        crate::naming::period_rfc3339(claim.period.0),
        claim.token,
        d.note,
        claim.token,
    );
    tracing::info!(sj = %sj.key(), reason = d.reason, "{note}");
    ctx.events
        .publish(sj, EventType::Warning, "RunWithdrawn", "WithdrawRun", note)
        .await;
    Ok(())
}

/// Keeps `claim` in `status.unsettledClaims` (up to its bound), for [`settle`] to withdraw its
/// row once the backstop answers: it may have committed while the backstop stopped answering.
fn remember_unsettled(status: &mut crate::api::SingletonJobStatus, claim: &RunRef) {
    if status.unsettled_claims.len() < MAX_UNSETTLED {
        status.unsettled_claims.push(crate::api::UnsettledClaim {
            unknown: Default::default(),
            period: claim.period.clone(),
            token: claim.token,
        });
    }
}

/// The most claims `status.unsettledClaims` holds (its schema's bound).
pub(super) const MAX_UNSETTLED: usize = 100;

/// Settles the claims left unsettled by an outage of the backstop (F10c): each one's row, if the
/// claim did commit, is withdrawn and its token retired, then the list is cleared by a status
/// write. Returns whether it wrote.
pub async fn settle(ctx: &Context, sj: &SingletonJob, b: &Backstop) -> Result<bool> {
    let Some(status) = sj
        .status
        .as_ref()
        .filter(|s| !s.unsettled_claims.is_empty())
    else {
        return Ok(false);
    };
    let key = sj.backstop_key();
    for c in &status.unsettled_claims {
        ctx.gate.check()?;
        b.withdraw(
            &key,
            c.period.0,
            c.token,
            sj.metadata.namespace.as_deref().unwrap_or_default(),
            crate::backstop::withdrawal::BACKSTOP_OUTAGE,
        )
        .await?;
    }
    let mut next = status.clone();
    next.unsettled_claims.clear();
    kube_io::write_status(ctx, sj, next, Lane::Background).await?;
    tracing::info!(sj = %sj.key(), claims = status.unsettled_claims.len(), "withdrew the backstop claims of periods decided without a Job during its outage");
    Ok(true)
}

/// Retires `token` of a run decided without a Job, unless a Job of it ran
/// ([`Backstop::retire_unstarted`]). That refusal stops the caller whatever the purpose: the
/// decision itself is wrong, not merely unrecorded.
async fn retire_unstarted(sj: &SingletonJob, b: &Backstop, token: u64) -> Result<()> {
    match b
        .retire_unstarted(
            &sj.backstop_key(),
            token,
            sj.metadata.namespace.as_deref().unwrap_or_default(),
        )
        .await
    {
        Ok(()) => Ok(()),
        Err(e @ crate::Error::RunStarted { .. }) => Err(e),
        Err(e) if sj.purpose() == LockPurpose::Efficiency => {
            tracing::warn!(sj = %sj.key(), token, error = %e, "could not retire the token of a period decided without a Job; Efficiency: recording it anyway");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Records how the finished runs ended beside their claims, for bulk repair
/// ([`crate::decide::repair`]). Not a safety step: a failure is logged and the decision goes on
/// (repair then reads the outcome from the status history, by the run's token).
pub async fn record_outcomes(
    sj: &SingletonJob,
    b: &Backstop,
    runs: &[(jiff::Timestamp, u64, crate::api::Outcome)],
) {
    if let Err(e) = b.record_outcomes(&sj.backstop_key(), runs).await {
        tracing::warn!(sj = %sj.key(), error = %e, "could not record the outcome of finished runs in the backstop; a repair reads them from the status history instead");
    }
}

/// Retires `token` (its period is decided). Correctness: an error stops the caller from
/// recording the decision (it is retried); Efficiency: logged, and the decision goes on.
pub async fn retire(sj: &SingletonJob, b: &Backstop, token: u64) -> Result<()> {
    match b
        .retire(
            &sj.backstop_key(),
            token,
            sj.metadata.namespace.as_deref().unwrap_or_default(),
        )
        .await
    {
        Ok(()) => Ok(()),
        Err(e) if sj.purpose() == LockPurpose::Efficiency => {
            tracing::warn!(sj = %sj.key(), token, error = %e, "could not retire the token of a decided period; Efficiency: recording it anyway");
            Ok(())
        }
        Err(e) => Err(e),
    }
}
