//! Operations users ask for through annotations (`kubectl singleton trigger|backfill|break-lock`),
//! carried out by the reconcile: requests are accepted, rejected or followed in
//! `status.operations` (parsing and ranges are pure, in [`crate::decide::ops`]); a run they ask
//! for is claimed through the run protocol like a scheduled one ([`crate::run::start`]).

use std::time::Duration;

use jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use crate::api::{
    ConcurrencyPolicy, OperationPhase, RunOrigin, RunRef, SingletonJob, SingletonJobStatus,
};
use crate::backstop::Availability;
use crate::context::Context;
use crate::decide::Waiting;
use crate::decide::ops::{self, Invalid, OperationKind, Request};
use crate::lanes::Lane;
use crate::observe::OwnedJob;
use crate::schedule::Schedule;
use crate::{Error, Result, naming, observe, run};

/// How soon an operation that waits (clock, backstop, a running Job) is looked at again.
pub const RETRY: Duration = Duration::from_secs(2);

/// Periods a backfill checks against the backstop in one reconcile.
const BACKFILL_CHECKS_PER_RECONCILE: usize = 200;

/// An Event to publish once the status write that goes with it is done.
pub type Note = (EventType, &'static str, String);

/// What stands in the way of a manual run.
pub struct ManualGates<'a> {
    pub blocked: Option<Waiting>,
    pub template: &'a std::result::Result<(), String>,
    /// Runs still active after this reconcile's plan.
    pub active: &'a [RunRef],
    /// The SingletonJob's own Jobs.
    pub owned: &'a [OwnedJob],
}

impl ManualGates<'_> {
    /// Why a manual run cannot start now, if so. Manual runs never replace a run and never
    /// overlap one unless concurrencyPolicy is Allow.
    fn waiting(&self, sj: &SingletonJob) -> Option<String> {
        match self.blocked {
            Some(Waiting::ClockUntrusted) => {
                return Some("waiting for the local clock to agree with the API server's".into());
            }
            Some(Waiting::BackstopUnavailable) => {
                return Some("waiting for the backstop database to answer".into());
            }
            _ => {}
        }
        if !self.active.is_empty() && sj.spec.concurrency_policy != ConcurrencyPolicy::Allow {
            let names: Vec<&str> = self.active.iter().map(|r| r.job_name.as_str()).collect();
            return Some(format!(
                "waiting for the active run {} to finish (a manual run never overlaps or replaces one unless concurrencyPolicy is Allow)",
                names.join(", ")
            ));
        }
        None
    }
}

/// One reconcile's look at the trigger and backfill requests: records acceptance, rejection and
/// progress in `status.operations`, and the Events to publish after the write in `notes`.
pub struct Operations<'a> {
    pub sj: &'a SingletonJob,
    pub status: &'a mut SingletonJobStatus,
    pub schedule: &'a Schedule,
    /// Every scheduled period at or before this is decided (the plan's cursor).
    pub decided_through: Timestamp,
    pub gates: ManualGates<'a>,
    pub db: &'a Availability,
    pub now: Timestamp,
    pub notes: Vec<Note>,
}

impl Operations<'_> {
    /// The next step of a trigger or backfill; when a run is to start now, its period (to be
    /// claimed through [`run::start`], whose claim write also marks the step done).
    pub async fn next(&mut self) -> Result<Option<(Timestamp, RunOrigin)>> {
        if let Some(period) = self.trigger() {
            return Ok(Some((period, RunOrigin::Trigger)));
        }
        if !self.accept_backfill() {
            return Ok(None);
        }
        Ok(self
            .walk_backfill()
            .await?
            .map(|period| (period, RunOrigin::Backfill)))
    }

    fn reject(&mut self, kind: OperationKind, id: &str, req: Option<&Request>, message: String) {
        let note = format!("{} {id} rejected: {message}", kind.command());
        self.notes
            .push((EventType::Warning, "OperationRejected", note));
        *kind.slot_mut(&mut self.status.operations) =
            Some(ops::rejected(id, req, message, self.now));
    }

    /// Trigger: one run now, as a manual period with its own token.
    fn trigger(&mut self) -> Option<Timestamp> {
        let req = match ops::pending(self.sj, OperationKind::Trigger)? {
            Err(bad) => {
                self.reject(OperationKind::Trigger, &bad.id, None, bad.message);
                return None;
            }
            Ok(req) => req,
        };
        if let Err(msg) = self.gates.template {
            let why = format!("the API server rejects the Job template: {msg}");
            self.reject(OperationKind::Trigger, &req.id, Some(&req), why);
        } else if let Some(why) = self.gates.waiting(self.sj) {
            let mut op = ops::accepted(&req, self.now);
            op.message = why;
            ops::set(&mut self.status.operations.trigger, op);
        } else {
            self.status.operations.trigger = Some(ops::accepted(&req, self.now));
            return Some(naming::manual_period(self.now));
        }
        None
    }

    /// Backfill, first: a new request is checked and its range fixed, once. Returns whether the
    /// backfill (new or going on) is to be walked further.
    fn accept_backfill(&mut self) -> bool {
        let Some(req) = ops::pending(self.sj, OperationKind::Backfill) else {
            return true;
        };
        let req = match req {
            Err(bad) => {
                self.reject(OperationKind::Backfill, &bad.id, None, bad.message);
                return false;
            }
            Ok(req) => req,
        };
        let range = match (self.db, self.gates.template, req.from.zip(req.to)) {
            (Availability::NotConfigured, _, _) => Err(
                "backfill needs spec.backstop: only the backstop's claims table remembers every period that ever ran, so without it a backfill could run a period twice"
                    .to_string(),
            ),
            (_, Err(msg), _) => Err(format!("the API server rejects the Job template: {msg}")),
            (_, _, Some((from, to))) => {
                ops::backfill_range(self.schedule, from, to, self.decided_through).and_then(|r| {
                    let created = self.sj.metadata.creation_timestamp.as_ref().map(|t| t.0);
                    let recorded = self.status.claims_recorded.as_deref();
                    ops::check_claims_recorded(r, created, recorded)
                })
            }
            (_, _, None) => Err("backfill needs from and to".into()),
        };
        let (first, last, count) = match range {
            Err(why) => {
                self.reject(OperationKind::Backfill, &req.id, Some(&req), why);
                return false;
            }
            Ok(range) => range,
        };
        let mut op = ops::accepted(&req, self.now);
        op.phase = OperationPhase::Running;
        op.from = Some(first.into());
        op.to = Some(last.into());
        op.next = Some(first.into());
        op.message = format!(
            "backfilling {count} period(s) from {} to {}",
            naming::period_rfc3339(first),
            naming::period_rfc3339(last)
        );
        let by = req.by.as_deref().unwrap_or("unknown");
        let note = format!("backfill requested by {by}: {}", op.message);
        self.notes
            .push((EventType::Normal, "BackfillAccepted", note));
        self.status.operations.backfill = Some(op);
        true
    }

    /// Backfill, then: walked a period at a time. One that ran before (any record says so) is
    /// counted and passed; the first that did not is started, once it may.
    async fn walk_backfill(&mut self) -> Result<Option<Timestamp>> {
        let Some(mut op) = self
            .status
            .operations
            .backfill
            .clone()
            .filter(|o| matches!(o.phase, OperationPhase::Pending | OperationPhase::Running))
        else {
            return Ok(None);
        };
        let backstop = match self.db {
            Availability::Ready(b) => b.clone(),
            Availability::Unavailable(why) => {
                op.message = format!("waiting for the backstop database: {why}");
                ops::set(&mut self.status.operations.backfill, op);
                return Ok(None);
            }
            Availability::NotConfigured => {
                let why = "spec.backstop was removed while the backfill ran".to_string();
                let id = op.id.clone();
                self.reject(OperationKind::Backfill, &id, None, why);
                return Ok(None);
            }
        };
        // Bounded, so a long run of periods that ran before spreads over several reconciles.
        for _ in 0..BACKFILL_CHECKS_PER_RECONCILE {
            let Some(period) = ops::backfill_next(self.schedule, &op) else {
                op.phase = OperationPhase::Done;
                op.message = format!(
                    "started {} run(s); {} period(s) had run before",
                    op.started, op.already_run
                );
                let note = format!("backfill {} done: {}", op.id, op.message);
                self.notes.push((EventType::Normal, "BackfillDone", note));
                ops::set(&mut self.status.operations.backfill, op);
                return Ok(None);
            };
            // Any record that the period ran counts: the backstop's claim, the status history,
            // a Job of the period.
            if observe::ran(self.status, self.gates.owned, period)
                || backstop.claimed(&self.sj.key(), period).await?.is_some()
            {
                op.already_run += 1;
                op.next = Some(ops::after(period).into());
                continue;
            }
            if let Some(why) = self.gates.waiting(self.sj) {
                op.message = why;
                ops::set(&mut self.status.operations.backfill, op);
                return Ok(None);
            }
            ops::set(&mut self.status.operations.backfill, op);
            return Ok(Some(period));
        }
        ops::set(&mut self.status.operations.backfill, op);
        Ok(None)
    }
}

/// Handles a break-lock request (see [`run::break_lock()`]).
pub async fn break_lock(
    ctx: &Context,
    sj: &SingletonJob,
    req: std::result::Result<Request, Invalid>,
    db: &Availability,
) -> Result<Action> {
    let now = Timestamp::now();
    let req = match req {
        Ok(req) => req,
        Err(bad) => {
            let mut status = sj.status.clone().unwrap_or_default();
            status.operations.break_lock =
                Some(ops::rejected(&bad.id, None, bad.message.clone(), now));
            run::write_status(ctx, sj, status, Lane::Background).await?;
            let note = format!("break-lock {} rejected: {}", bad.id, bad.message);
            ctx.events
                .publish(sj, EventType::Warning, "OperationRejected", "Operate", note)
                .await;
            return Ok(Action::requeue(Duration::ZERO));
        }
    };
    match Box::pin(run::break_lock(ctx, sj, ops::accepted(&req, now), db)).await {
        Ok(done) => {
            let note = format!(
                "lock broken by {}: {}; {}",
                req.by.as_deref().unwrap_or("unknown"),
                req.reason.as_deref().unwrap_or_default(),
                done.message
            );
            ctx.events
                .publish(sj, EventType::Warning, "LockBroken", "BreakLock", note)
                .await;
            Ok(Action::requeue(Duration::ZERO))
        }
        Err(Error::BackstopUnavailable(why)) => {
            // Say so where the requester looks, and try again.
            let mut status = sj.status.clone().unwrap_or_default();
            let mut op = ops::accepted(&req, now);
            op.message = format!("waiting for the backstop database to raise the fence: {why}");
            if ops::set(&mut status.operations.break_lock, op) {
                run::write_status(ctx, sj, status, Lane::Background).await?;
            }
            Ok(Action::requeue(RETRY))
        }
        Err(e) => Err(e),
    }
}

/// The Event of a manual run just started: who asked, and what it got.
pub fn started_note(origin: RunOrigin, by: Option<&str>, claim: &RunRef) -> Note {
    let note = format!(
        "{} requested by {}: Job {} for period {} with fencing token {}",
        OperationKind::from(origin).command(),
        by.unwrap_or("unknown"),
        claim.job_name,
        naming::period_rfc3339(claim.period.0),
        claim.token
    );
    let reason = match origin {
        RunOrigin::Trigger => "RunTriggered",
        RunOrigin::Backfill => "BackfillRunStarted",
    };
    (EventType::Normal, reason, note)
}
