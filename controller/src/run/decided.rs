//! A claimed period decided without a Job (deduplicated, rejected, name taken, missed): the
//! claim is cleared and the outcome recorded, after the claim's token is retired.

use futures::future::BoxFuture;
use jiff::Timestamp;
use kube::runtime::events::EventType;

use crate::Result;
use crate::api::{LockPurpose, Outcome, RunRef, SingletonJob};
use crate::backstop::Backstop;
use crate::context::Context;
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
        if d.unsettled && status.unsettled_claims.len() < MAX_UNSETTLED {
            status.unsettled_claims.push(crate::api::UnsettledClaim {
                unknown: Default::default(),
                period: claim.period.clone(),
                token: claim.token,
            });
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
