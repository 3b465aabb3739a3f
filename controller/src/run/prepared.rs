//! A prepared run (`status.prepared`, issue 33): a period claimed, its Job created suspended and
//! confirmed ahead of its instant (`resumeAt`). This release settles one it finds in status (a
//! release that prepares runs wrote it, or it is adopted from a status behind its Jobs); it
//! prepares none itself yet. Read top to bottom:
//!
//! ```text
//! 0. Mark     : what its Job says (the cache; a Job missing from it is read)
//! 1. Judge    : decide::prepare::judge, pure: keep, resume, promote, stop or withdraw  G1, G2
//! 2. Keep     : nothing before resumeAt by the earliest time the API server's clock
//!               may show                                                            G4
//! 3. Resume   : one JSON patch testing uid, suspend and `released: "false"`         G1, G4
//! 4. Promote  : a status write moves it to `active`: its period is decided; after
//!               this reconcile's own resume, in a task (the slot goes to the next run) G2
//! W1 Mark     : its Job marked withdrawn, testing `released: "false"`: of a resume
//!               and a withdrawal exactly one succeeds, however late either is sent G1
//! W2+W3       : its backstop claim archived and its token retired, in one
//!               transaction (deferred into unsettledClaims while the backstop does
//!               not answer)                                                        G1, G3
//! W4 Record   : a status write clears it and gives its runCount back; the cursor
//!               never moved, so the next plan decides the period as it would have
//!               without preparation                                                G2
//! W5 Delete   : its Job, by uid, in the background                                 hygiene
//! ```
//!
//! Stop (someone else unsuspended the prepared Job) is the sweep's: it sees the prepared run
//! through [`crate::observe::started_outside`]. Every step is idempotent: whoever acts next
//! continues from the marks it finds (a Job marked withdrawn goes on at W2).

mod deleted;

pub use deleted::withdraw_deleted;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;

use super::decided::MAX_UNSETTLED;
use crate::api::{LockPurpose, Outcome, RunRef, SingletonJob, SingletonJobStatus, UnsettledClaim};
use crate::backstop::Availability;
use crate::clock::ClockState;
use crate::context::{Context, asked};
use crate::decide::prepare::{self, JobMark, Verdict, WithdrawReason};
use crate::decide::{Observed, Waiting, ops};
use crate::failpoint;
use crate::kube_io::{self, Marked, Propagation, Resumed, Unreleased};
use crate::lanes::Lane;
use crate::observe::{OwnedJob, Release};
use crate::{Result, record};

/// How soon to look again when the cache has not caught up with a Job's mark yet.
const REREAD: Duration = Duration::from_secs(1);

/// How long before its instant a prepared run's SingletonJob is read by quorum (the freshness
/// check), so that the resume at the instant is the one request: an edit committed before that
/// read always wins (design §1.2).
const FRESH_AHEAD: Duration = Duration::from_millis(500);

/// Settles `sj`'s prepared run, if it has one. `now` is the earliest time the API server's clock
/// may show. Returns what the reconcile does next, or `None` when it goes on (no prepared run,
/// or one someone else started, which the sweep stops).
pub async fn settle(
    ctx: &Arc<Context>,
    sj: &SingletonJob,
    owned: &[OwnedJob],
    clock: &ClockState,
    now: Timestamp,
    db: &Availability,
) -> Result<Option<Action>> {
    let Some(status) = sj.status.as_ref() else {
        return Ok(None);
    };
    let Some(run) = status.prepared.clone() else {
        return Ok(None);
    };
    let it = Settle {
        ctx,
        sj,
        run: &run,
        clock,
        db,
    };
    // 0. Mark.
    let job = job_of(ctx, sj, &run, owned).await?;
    let mark = mark(job.as_ref());
    // 1. Judge.
    match it.verdict(status, mark, now) {
        // 2. Keep (G4): looked at again at its instant, and on any change before it.
        Verdict::Keep { until } => it.keep(until, now).await.map(Some),
        Verdict::Resume => it.resume(job.as_ref()).await.map(Some),
        Verdict::Promote => it.promote().await.map(Some),
        Verdict::Stop => Ok(None),
        Verdict::Withdraw(reason) => {
            let marked = matches!(mark, JobMark::Withdrawn(_) | JobMark::Missing);
            it.withdraw(job.as_ref(), reason, marked).await.map(Some)
        }
    }
}

/// What settling one prepared run works with.
struct Settle<'a> {
    ctx: &'a Arc<Context>,
    sj: &'a SingletonJob,
    run: &'a RunRef,
    clock: &'a ClockState,
    db: &'a Availability,
}

/// The prepared run's Job: from the cache, else read (the cache may not have it yet).
async fn job_of(
    ctx: &Context,
    sj: &SingletonJob,
    run: &RunRef,
    owned: &[OwnedJob],
) -> Result<Option<OwnedJob>> {
    let is_run = |j: &OwnedJob| match &run.job_uid {
        Some(uid) => *uid == j.uid,
        None => j.name == run.job_name && j.token == Some(run.token),
    };
    if let Some(j) = owned.iter().find(|j| is_run(j)) {
        return Ok(Some(j.clone()));
    }
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let owner = sj.metadata.uid.as_deref().unwrap_or_default();
    let read = kube_io::get_job(ctx, ns, &run.job_name, Lane::Background).await?;
    Ok(read
        .and_then(|j| OwnedJob::of(&j, owner))
        .filter(|j| is_run(j)))
}

/// What decide/ may know of the Job.
fn mark(job: Option<&OwnedJob>) -> JobMark {
    let Some(job) = job.filter(|j| !j.deleting) else {
        return JobMark::Missing;
    };
    match &job.release {
        Release::Released => JobMark::Released,
        // Unsuspended without the controller's release (before its instant, or after its
        // withdrawal): the sweep stops it.
        _ if !job.suspended => JobMark::StartedOutside,
        // A reason this release does not know is still a withdrawal: never resumed.
        Release::Withdrawn(why) => JobMark::Withdrawn(
            WithdrawReason::from_name(why).unwrap_or(WithdrawReason::StatusBehind),
        ),
        Release::NotReleased | Release::Unmarked => JobMark::NotReleased,
    }
}

impl Settle<'_> {
    /// The judge's verdict on this reconcile's inputs. A manual run asked for while a run is
    /// prepared supersedes it: withdrawn first, the manual run claimed by the next reconcile.
    fn verdict(&self, status: &SingletonJobStatus, mark: JobMark, now: Timestamp) -> Verdict {
        let (ctx, sj, run) = (self.ctx, self.sj, self.run);
        // G1: a Job gone when its instant may have passed by the API server's clock may have
        // been resumed by another replica, and run: promoted (and recorded as a Job gone), never
        // withdrawn and run again, whatever was edited since. Judged by the clock's upper bound
        // (the judge has the lower).
        if mark == JobMark::Missing && may_have_passed(self.clock, run) {
            return Verdict::Promote;
        }
        let schedule = match ctx.schedule_of(sj) {
            Ok(s) => s.with_shift_floor(status.shifts_after.as_ref().map(|t| t.0)),
            // An invalid schedule: an edit since the run was prepared (its basis had a valid one).
            Err(_) => {
                return match mark {
                    JobMark::Released => Verdict::Promote,
                    JobMark::StartedOutside => Verdict::Stop,
                    JobMark::Withdrawn(r) => Verdict::Withdraw(r),
                    JobMark::NotReleased | JobMark::Missing => {
                        Verdict::Withdraw(WithdrawReason::ScheduleChanged)
                    }
                };
            }
        };
        let blocked = if !self.clock.trusted {
            Some(Waiting::ClockUntrusted)
        } else if matches!(self.db, Availability::Unavailable(_))
            && sj.purpose() == LockPurpose::Correctness
        {
            Some(Waiting::BackstopUnavailable)
        } else {
            None
        };
        let key = sj.backstop_key();
        let states = HashMap::new();
        let obs = Observed {
            now,
            key: &key,
            consecutive_failures: status.consecutive_failures,
            run_count: status.run_count,
            created: sj.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0),
            blocked,
            job_states: &states,
        };
        match prepare::judge(&sj.spec, &schedule, status, run, &obs, mark) {
            Verdict::Keep { .. } | Verdict::Resume if manual_asked(sj) => {
                Verdict::Withdraw(WithdrawReason::Superseded)
            }
            v => v,
        }
    }

    /// Step 3, resume (G1, G4): the one request at the instant. Its tests make it change
    /// nothing on any Job but this one, still suspended and not withdrawn; then step 4.
    async fn resume(&self, job: Option<&OwnedJob>) -> Result<Action> {
        let Some(job) = job else {
            return Ok(Action::requeue(REREAD));
        };
        let (ctx, sj, run) = (self.ctx, self.sj, self.run);
        let uid = sj.metadata.uid.as_deref().unwrap_or_default();
        if !ctx.fresh_reads.holds(uid, asked(sj)) && !self.fresh().await? {
            return Ok(Action::requeue(REREAD));
        }
        let admission = super::admission(sj);
        match super::resume(ctx, sj, run, &job.uid, &admission, Unreleased::Tested).await? {
            Resumed::Yes => {
                crate::metrics::global().prepared(sj, crate::metrics::PreparedStage::Resumed);
                Ok(self.promote_apart())
            }
            // Withdrawn or resumed by another replica, or gone: its mark says which.
            Resumed::Already | Resumed::Gone => match self.reread().await? {
                JobMark::Released => self.promote().await,
                JobMark::Withdrawn(reason) => self.withdraw(Some(job), reason, true).await,
                _ => Ok(Action::requeue(REREAD)),
            },
        }
    }

    /// Step 2: nothing before `until`. Shortly before the instant ([`FRESH_AHEAD`]) the
    /// freshness check is made, so that at the instant the resume is the one request.
    async fn keep(&self, until: Timestamp, now: Timestamp) -> Result<Action> {
        let (ctx, sj) = (self.ctx, self.sj);
        ctx.clock.prepare(until);
        // Held past its instant (an untrusted clock): looked at again shortly.
        if until <= now {
            return Ok(Action::requeue(REREAD));
        }
        let left = until.duration_since(now).unsigned_abs();
        let at_instant = self.run.resume_at.as_ref().is_some_and(|r| r.0 == until);
        if !at_instant {
            return Ok(Action::requeue(left.max(Duration::from_millis(1))));
        }
        if left > FRESH_AHEAD {
            return Ok(Action::requeue(left - FRESH_AHEAD));
        }
        let uid = sj.metadata.uid.as_deref().unwrap_or_default();
        if !ctx.fresh_reads.holds(uid, asked(sj)) {
            if !self.fresh().await? {
                return Ok(Action::requeue(REREAD));
            }
            ctx.fresh_reads.note(uid, asked(sj));
        }
        let left = until.duration_since(ctx.clock.fresh().await.due_now(Timestamp::now()));
        let left = match left.is_positive() {
            true => left.unsigned_abs(),
            false => Duration::ZERO,
        };
        Ok(Action::requeue(left.max(Duration::from_millis(1))))
    }

    /// The freshness check (design §1.2): the watch lags, and an edit or a user's request
    /// committed before the instant must not lose to a stale cache, as it would not have without
    /// preparation (the claim's compare-and-swap after the instant would have failed). So the
    /// SingletonJob is read by quorum [`FRESH_AHEAD`] before the instant (or right before the
    /// resume, when that was missed), and the run waits (for the watch
    /// to bring the newer copy, which the judge sees) unless it is the copy judged: the same spec
    /// generation, no operation asked for, not being deleted.
    async fn fresh(&self) -> Result<bool> {
        let sj = self.sj;
        let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
        let name = sj.metadata.name.as_deref().unwrap_or_default();
        let now = kube_io::get_sj(self.ctx, ns, name).await?;
        let same = now.metadata.uid == sj.metadata.uid
            && now.metadata.generation == sj.metadata.generation
            && now.metadata.deletion_timestamp.is_none()
            && !manual_asked(&now)
            && ops::pending(&now, ops::OperationKind::BreakLock).is_none();
        if !same {
            tracing::info!(sj = %sj.key(), job = %self.run.job_name, "the SingletonJob changed since the cached copy: the prepared run is judged again on the newer one");
        }
        Ok(same)
    }

    /// Step 4, promote (G2): the resumed run becomes an active run, and its period is decided.
    async fn promote(&self) -> Result<Action> {
        promote(self.ctx, self.sj, self.run).await?;
        Ok(Action::await_change())
    }

    /// Step 4 right after this reconcile's own resume, in a task of its own, as a confirm is
    /// ([`crate::context::InFlight`]): the reconcile's slot goes to the next run due at the same
    /// instant, so that in a burst the resumes are the only requests the reconciles wait for (with
    /// the promote inline, 1,000 runs due at once were resumed over 12 s, each slot held through a
    /// status write). Until the promote is done the SingletonJob is not reconciled (the status it
    /// would read is about to change); then it is asked for. The task ends when the gate closes.
    fn promote_apart(&self) -> Action {
        let (ctx, sj, run) = (Arc::clone(self.ctx), self.sj.clone(), self.run.clone());
        let uid = sj.metadata.uid.clone();
        let obj = ObjectRef::from_obj(&sj);
        ctx.confirming.begin(uid.as_deref());
        let task = async move {
            let result = tokio::select! {
                r = promote(&ctx, &sj, &run) => r,
                () = ctx.gate.closed() => Err(crate::Error::NotLeader),
            };
            ctx.confirming.end(uid.as_deref(), obj, result).await;
        };
        tokio::spawn(tracing::Instrument::in_current_span(task));
        Action::await_change()
    }

    /// W1 to W5: the prepared run never runs, and its period is decided as without
    /// preparation. `marked`: its Job is marked withdrawn already, or gone (W1 is done).
    async fn withdraw(
        &self,
        job: Option<&OwnedJob>,
        reason: WithdrawReason,
        marked: bool,
    ) -> Result<Action> {
        let (ctx, sj, run) = (self.ctx, self.sj, self.run);
        let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
        // W1 (G1): from here no resume can pass, whoever sends it, however late.
        if !marked && let Some(job) = job {
            let done = kube_io::withdraw_job(ctx, ns, &job.name, &job.uid, reason.name()).await?;
            let mark = match done {
                Marked::Withdrawn => JobMark::Withdrawn(reason),
                Marked::Gone => JobMark::Missing,
                // Resumed meanwhile (the resume won), or marked by another replica.
                Marked::Not => self.reread().await?,
            };
            match mark {
                JobMark::Released => return self.promote().await,
                JobMark::Withdrawn(_) => {}
                // Gone: it may have run if its instant may have passed (G1); the next judge
                // says.
                JobMark::Missing if !may_have_passed(self.clock, run) => {}
                _ => return Ok(Action::requeue(REREAD)),
            }
            failpoint::hit(failpoint::WITHDRAW_MARKED);
        }
        let deferred = self.withdraw_claim(reason).await?;
        failpoint::hit(failpoint::WITHDRAW_BACKSTOP);
        // W4 (G2).
        let status = sj.status.clone().unwrap_or_default();
        let next = withdrawn(status, run, deferred);
        kube_io::write_status(ctx, sj, next, Lane::Background).await?;
        failpoint::hit(failpoint::WITHDRAW_RECORDED);
        self.withdrawn_said(reason).await;
        // W5: if lost, the sweep removes a withdrawn Job ([`crate::observe::unknown`]).
        if let Some(job) = job {
            let bg = Propagation::Background;
            kube_io::delete_job_uid(ctx, ns, &job.name, &job.uid, bg, Lane::Background).await?;
        }
        // The period is decided at once, as without preparation.
        Ok(Action::requeue(Duration::ZERO))
    }

    /// W2+W3 (G1, G3): the claim row archived, so the period may be claimed again, and the
    /// token retired, so the fence refuses it. The backstop not answering: the claim to settle
    /// later (`run::decided::settle`).
    async fn withdraw_claim(&self, reason: WithdrawReason) -> Result<Option<UnsettledClaim>> {
        let (sj, run) = (self.sj, self.run);
        let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
        Ok(match self.db {
            Availability::Ready(b) => {
                self.ctx.gate.check()?;
                let key = sj.backstop_key();
                b.withdraw(&key, run.period.0, run.token, ns, reason.name())
                    .await?;
                None
            }
            Availability::Unavailable(_) => Some(UnsettledClaim {
                unknown: Default::default(),
                period: run.period.clone(),
                token: run.token,
            }),
            Availability::NotConfigured => None,
        })
    }

    /// The withdrawal's metric, log line and Event.
    async fn withdrawn_said(&self, reason: WithdrawReason) {
        let (sj, run) = (self.sj, self.run);
        crate::metrics::global().run_withdrawn(sj, reason.name());
        crate::metrics::global().prepared(sj, crate::metrics::PreparedStage::Withdrawn);
        let note = format!(
            "prepared run {} (token {}) for {} withdrawn: {}; its Job never ran and was deleted, token {} retired, its backstop claim withdrawn; the period is decided as the schedule says",
            run.job_name,
            run.token,
            crate::naming::period_rfc3339(run.period.0),
            reason.says(),
            run.token,
        );
        tracing::info!(sj = %sj.key(), "{note}");
        let kind = match reason.warning() {
            true => EventType::Warning,
            false => EventType::Normal,
        };
        self.ctx
            .events
            .publish(sj, kind, "RunWithdrawn", "WithdrawRun", note)
            .await;
    }

    /// The Job's mark as the API server has it now.
    async fn reread(&self) -> Result<JobMark> {
        let job = job_of(self.ctx, self.sj, self.run, &[]).await?;
        Ok(mark(job.as_ref()))
    }
}

/// Step 4 (G2): the status write that moves the resumed run to `active` and decides its period.
async fn promote(ctx: &Context, sj: &SingletonJob, run: &RunRef) -> Result<()> {
    failpoint::hit(failpoint::PROMOTE);
    let status = sj.status.clone().unwrap_or_default();
    kube_io::write_status(ctx, sj, promoted(status, run), Lane::Background).await?;
    // The resume's Job event may reconcile the copy from before this write: it waits.
    ctx.own_writes.remember_promoted(sj, run.token);
    tracing::info!(sj = %sj.key(), job = %run.job_name, token = run.token, "prepared run resumed at its instant");
    Ok(())
}

/// Whether `run`'s instant may have passed by the API server's clock (unmeasured: it may).
fn may_have_passed(clock: &ClockState, run: &RunRef) -> bool {
    let Some(at) = run.resume_at.as_ref().map(|t| t.0) else {
        return false;
    };
    clock
        .latest_now(Timestamp::now())
        .is_none_or(|latest| latest >= at)
}

/// Whether a user asked for a run (trigger, backfill, rerun, repair) not handled yet.
fn manual_asked(sj: &SingletonJob) -> bool {
    use ops::OperationKind::{Backfill, Repair, Rerun, Trigger};
    [Trigger, Backfill, Rerun, Repair]
        .into_iter()
        .any(|kind| matches!(ops::pending(sj, kind), Some(Ok(_))))
}

/// Step 4's status: the run moves from `prepared` to `active`, its period is decided, and the
/// history shows it Running from now (a run counts from its resume).
pub fn promoted(mut status: SingletonJobStatus, run: &RunRef) -> SingletonJobStatus {
    if status
        .prepared
        .as_ref()
        .is_some_and(|p| p.token == run.token)
    {
        status.prepared = None;
    }
    status.fencing_token = status.fencing_token.max(run.token);
    let mut active = run.clone();
    active.basis = None;
    if !status.active.iter().any(|r| r.job_name == active.job_name) {
        status.active.push(active.clone());
    }
    status.active_count = status.active.len() as i32;
    let period = run.period.0;
    if status.decided_through.as_ref().is_none_or(|c| c.0 < period) {
        status.decided_through = Some(period.into());
    }
    if status
        .last_schedule_time
        .as_ref()
        .is_none_or(|t| t.0 < period)
    {
        status.last_schedule_time = Some(period.into());
    }
    record::push_history(
        &mut status,
        record::run_entry(&active, Outcome::Running, None, None),
    );
    status
}

/// Step W4's status: no prepared run, its count given back (`maxRuns` counts only runs), the
/// claim to settle with the backstop if it did not answer. The cursor is not touched: it never
/// passed the period.
pub fn withdrawn(
    mut status: SingletonJobStatus,
    run: &RunRef,
    deferred: Option<UnsettledClaim>,
) -> SingletonJobStatus {
    if status
        .prepared
        .as_ref()
        .is_some_and(|p| p.token == run.token)
    {
        status.prepared = None;
        status.run_count = status.run_count.saturating_sub(1);
    }
    if let Some(claim) = deferred
        && status.unsettled_claims.len() < MAX_UNSETTLED
        && !status
            .unsettled_claims
            .iter()
            .any(|c| c.token == claim.token)
    {
        status.unsettled_claims.push(claim);
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn prepared(period: &str, token: u64) -> RunRef {
        RunRef {
            unknown: Default::default(),
            late: false,
            period: t(period).into(),
            token,
            job_name: "a-1".into(),
            claimed_at: None,
            job_uid: Some("uid-1".into()),
            origin: None,
            requested_by: None,
            supersedes: None,
            replaces: Vec::new(),
            resume_at: Some(t(period).into()),
            basis: Some("fp:1/spec:2".into()),
        }
    }

    fn status_with(run: &RunRef) -> SingletonJobStatus {
        SingletonJobStatus {
            fencing_token: run.token,
            decided_through: Some(t("2030-01-01T00:00:00Z").into()),
            run_count: 4,
            prepared: Some(run.clone()),
            ..Default::default()
        }
    }

    /// P1/P2 kept, and the period decided only now: a run counts from its resume.
    #[test]
    fn a_promoted_run_is_active_and_decides_its_period() {
        let run = prepared("2030-01-01T00:01:00Z", 7);
        let st = promoted(status_with(&run), &run);
        assert_eq!(st.prepared, None);
        assert_eq!(st.active.len(), 1);
        assert_eq!(st.active_count, 1);
        assert_eq!(st.active[0].job_uid.as_deref(), Some("uid-1"));
        assert_eq!(st.active[0].basis, None);
        assert_eq!(st.decided_through.as_ref().map(|t| t.0), Some(run.period.0));
        assert_eq!(
            st.last_schedule_time.as_ref().map(|t| t.0),
            Some(run.period.0)
        );
        assert_eq!(st.fencing_token, 7);
        assert_eq!(st.run_count, 4, "counted when it was prepared");
        assert_eq!(st.history[0].outcome, Outcome::Running);
        // Promoted twice (a lost write retried): still one active run.
        let again = promoted(st.clone(), &run);
        assert_eq!(again.active.len(), 1);
    }

    /// G2: a withdrawal moves no cursor, gives the count back, keeps the token issued; a second
    /// one (another replica's, cut short) changes nothing more.
    #[test]
    fn a_withdrawn_run_leaves_its_period_undecided() {
        let run = prepared("2030-01-01T00:01:00Z", 7);
        let st = withdrawn(status_with(&run), &run, None);
        assert_eq!(st.prepared, None);
        assert_eq!(st.run_count, 3);
        assert_eq!(st.fencing_token, 7, "the next claim issues a higher token");
        assert_eq!(
            st.decided_through.as_ref().map(|t| t.0),
            Some(t("2030-01-01T00:00:00Z"))
        );
        assert!(st.history.is_empty(), "nothing ran");
        assert_eq!(withdrawn(st.clone(), &run, None), st);
        // Another prepared run (a later token) is not this one's to clear.
        let mut later = status_with(&prepared("2030-01-01T00:02:00Z", 8));
        later.run_count = 5;
        assert_eq!(withdrawn(later.clone(), &run, None), later);
    }

    /// The backstop did not answer: the claim is settled later (`run::decided::settle`).
    #[test]
    fn a_withdrawal_without_the_backstop_leaves_its_claim_to_settle() {
        let run = prepared("2030-01-01T00:01:00Z", 7);
        let claim = UnsettledClaim {
            unknown: Default::default(),
            period: run.period.clone(),
            token: 7,
        };
        let st = withdrawn(status_with(&run), &run, Some(claim.clone()));
        assert_eq!(st.unsettled_claims, vec![claim.clone()]);
        let st = withdrawn(st, &run, Some(claim));
        assert_eq!(st.unsettled_claims.len(), 1, "once");
    }

    #[test]
    fn the_mark_is_read_from_the_job() {
        let job = OwnedJob {
            name: "a-1".into(),
            uid: "uid-1".into(),
            period: None,
            token: Some(7),
            suspended: true,
            finished: false,
            deleting: false,
            release: Release::NotReleased,
            resume_at: None,
        };
        assert_eq!(mark(Some(&job)), JobMark::NotReleased);
        assert_eq!(mark(None), JobMark::Missing);
        let going = OwnedJob {
            deleting: true,
            ..job.clone()
        };
        assert_eq!(mark(Some(&going)), JobMark::Missing);
        let resumed = OwnedJob {
            suspended: false,
            release: Release::Released,
            ..job.clone()
        };
        assert_eq!(mark(Some(&resumed)), JobMark::Released);
        let started = OwnedJob {
            suspended: false,
            ..job.clone()
        };
        assert_eq!(mark(Some(&started)), JobMark::StartedOutside);
        let out = OwnedJob {
            release: Release::Withdrawn("Suspended".into()),
            ..job.clone()
        };
        assert_eq!(
            mark(Some(&out)),
            JobMark::Withdrawn(WithdrawReason::Suspended)
        );
        let odd = OwnedJob {
            release: Release::Withdrawn("SomethingNewer".into()),
            ..job
        };
        assert_eq!(
            mark(Some(&odd)),
            JobMark::Withdrawn(WithdrawReason::StatusBehind),
            "a newer release's reason is still a withdrawal"
        );
    }
}
