//! Operations users ask for through annotations
//! (`kubectl singleton trigger|backfill|break-lock|rerun`), carried out by the reconcile: requests
//! are accepted, rejected or followed in `status.operations` (parsing, ranges and what a rerun or
//! a repair may re-run are pure, in [`crate::decide::ops`], [`crate::decide::rerun`] and
//! [`crate::decide::repair`]); a run they ask for is claimed through the run protocol like a
//! scheduled one ([`crate::run::start`]). A repair's steps are in `operate/repair.rs`.

mod repair;

use std::time::Duration;

use jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use crate::api::{
    ConcurrencyPolicy, LockPurpose, OperationPhase, OperationStatus, RunOrigin, RunRef,
    SingletonJob, SingletonJobStatus,
};
use crate::backstop::{Availability, Backstop};
use crate::context::Context;
use crate::decide::ops::{self, Invalid, OperationKind, Request};
use crate::decide::{Waiting, rerun};
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
    /// overlap one unless concurrencyPolicy is Allow; a rerun with `--replace` replaces its own
    /// period's active run (`replacing`), and waits for any other like every manual run.
    fn waiting(&self, sj: &SingletonJob, replacing: &[RunRef]) -> Option<String> {
        match self.blocked {
            Some(Waiting::ClockUntrusted) => {
                return Some("waiting for the local clock to agree with the API server's".into());
            }
            Some(Waiting::BackstopUnavailable) => {
                return Some("waiting for the backstop database to answer".into());
            }
            _ => {}
        }
        let others: Vec<&RunRef> = self
            .active
            .iter()
            .filter(|r| !replacing.iter().any(|o| o.job_name == r.job_name))
            .collect();
        let names = || -> String {
            let names: Vec<&str> = others.iter().map(|r| r.job_name.as_str()).collect();
            names.join(", ")
        };
        if !others.is_empty() && sj.spec.concurrency_policy != ConcurrencyPolicy::Allow {
            return Some(format!(
                "waiting for the active run {} to finish (a manual run never overlaps or replaces one unless concurrencyPolicy is Allow)",
                names()
            ));
        }
        // Allow: bounded by maxActive, so that a burst of requests cannot start unbounded Jobs.
        let max = sj.spec.max_active();
        if others.len() >= max {
            return Some(format!(
                "waiting for one of the {} active runs to finish (maxActive is {max}): {}",
                others.len(),
                names()
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

/// A manual run to claim now (through [`run::start`], whose claim write also marks its
/// operation's step done).
#[derive(Clone, Debug, PartialEq)]
pub struct ManualRun {
    pub period: Timestamp,
    pub origin: RunOrigin,
    /// Rerun with `--replace`: the period's active runs, fenced and deleted first.
    pub replace: Vec<RunRef>,
    /// Rerun: the token of the period's claim row in the backstop, which the claim takes over.
    pub supersedes: Option<u64>,
    /// Rerun: one period of a repair (`rerun --from --to`), counted in its record.
    pub repair: bool,
}

impl ManualRun {
    fn new(period: Timestamp, origin: RunOrigin) -> Self {
        ManualRun {
            period,
            origin,
            replace: Vec::new(),
            supersedes: None,
            repair: false,
        }
    }

    /// How [`run::start`] claims it.
    pub fn cause(&self) -> run::Cause<'_> {
        match self.origin {
            RunOrigin::Rerun => run::Cause::Rerun {
                replace: &self.replace,
                supersedes: self.supersedes,
                repair: self.repair,
            },
            origin => run::Cause::Manual(origin),
        }
    }
}

impl Operations<'_> {
    /// The next step of a trigger, rerun or backfill; the manual run to start now, if any.
    pub async fn next(&mut self) -> Result<Option<ManualRun>> {
        if let Some(period) = self.trigger() {
            return Ok(Some(ManualRun::new(period, RunOrigin::Trigger)));
        }
        if let Some(run) = Box::pin(self.rerun()).await? {
            return Ok(Some(run));
        }
        Box::pin(self.repair_dry_run()).await?;
        if let Some(run) = Box::pin(self.repair()).await? {
            return Ok(Some(run));
        }
        if !self.accept_backfill() {
            return Ok(None);
        }
        Ok(self
            .walk_backfill()
            .await?
            .map(|period| ManualRun::new(period, RunOrigin::Backfill)))
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
        } else if let Some(why) = self.gates.waiting(self.sj, &[]) {
            let mut op = ops::accepted(&req, self.now);
            op.message = why;
            ops::set(&mut self.status.operations.trigger, op);
        } else {
            self.status.operations.trigger = Some(ops::accepted(&req, self.now));
            return Some(naming::manual_period(self.now));
        }
        None
    }

    /// Rerun: a period decided before, run again with a new token that fences the earlier run
    /// out (the refusal rules are [`rerun`]'s). Refused with what to do instead, waiting like any
    /// manual run (for another period's active run, the clock, the backstop), or started.
    async fn rerun(&mut self) -> Result<Option<ManualRun>> {
        let kind = OperationKind::Rerun;
        let req = match ops::pending(self.sj, kind) {
            None => return Ok(None),
            Some(Err(bad)) => {
                self.reject(kind, &bad.id, None, bad.message);
                return Ok(None);
            }
            Some(Ok(req)) => req,
        };
        let Some(period) = req.period else {
            self.reject(kind, &req.id, Some(&req), "rerun needs a period".into());
            return Ok(None);
        };
        let checked = match self.gates.template {
            Err(msg) => Err(format!("the API server rejects the Job template: {msg}")),
            Ok(()) => rerun::check_period(self.schedule, period, self.now, self.decided_through),
        };
        if let Err(why) = checked {
            self.reject(kind, &req.id, Some(&req), why);
            return Ok(None);
        }
        // The period's records: the status, its Jobs, and the backstop's claim row (which the
        // rerun's claim takes over from the token found here).
        let claim = match self.db {
            Availability::Ready(b) => b
                .claimed(&self.sj.backstop_key(), period)
                .await?
                .map(|r| r.token),
            Availability::Unavailable(why) if self.sj.purpose() == LockPurpose::Correctness => {
                let mut op = ops::accepted(&req, self.now);
                op.message = format!(
                    "waiting for the backstop database, which holds the period's claim: {why}"
                );
                ops::set(&mut self.status.operations.rerun, op);
                return Ok(None);
            }
            _ => None,
        };
        let recorded = rerun::recorded(self.status, period)
            || claim.is_some()
            || self.gates.owned.iter().any(|j| j.period == Some(period));
        let replace = match rerun::check_runs(self.status, period, recorded, req.replace) {
            Ok(replace) => replace,
            Err(why) => {
                self.reject(kind, &req.id, Some(&req), why);
                return Ok(None);
            }
        };
        let mut op = ops::accepted(&req, self.now);
        if let Some(why) = self.gates.waiting(self.sj, &replace) {
            op.message = why;
            ops::set(&mut self.status.operations.rerun, op);
            return Ok(None);
        }
        self.status.operations.rerun = Some(op);
        Ok(Some(ManualRun {
            period,
            origin: RunOrigin::Rerun,
            replace,
            supersedes: claim,
            repair: false,
        }))
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
                    ops::check_claims_recorded(r, created, recorded, req.before_creation)
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

    /// The backstop a walk over a range (backfill, repair) reads, or None with its record
    /// `op` saying why: it waits while the database does not answer, and is rejected once
    /// `spec.backstop` was removed.
    fn walk_backstop(
        &mut self,
        kind: OperationKind,
        mut op: OperationStatus,
    ) -> Option<std::sync::Arc<Backstop>> {
        match self.db {
            Availability::Ready(b) => Some(b.clone()),
            Availability::Unavailable(why) => {
                op.message = format!("waiting for the backstop database: {why}");
                ops::set(kind.slot_mut(&mut self.status.operations), op);
                None
            }
            Availability::NotConfigured => {
                let why = format!("spec.backstop was removed while the {} ran", kind.command());
                self.reject(kind, &op.id, None, why);
                None
            }
        }
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
        let Some(backstop) = self.walk_backstop(OperationKind::Backfill, op.clone()) else {
            return Ok(None);
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
                || backstop
                    .claimed(&self.sj.backstop_key(), period)
                    .await?
                    .is_some()
            {
                op.already_run += 1;
                op.next = Some(ops::after(period).into());
                continue;
            }
            // maxRuns counts backfilled periods too: no period beyond it, however asked for.
            if crate::decide::runs_exhausted(&self.sj.spec, self.status.run_count) {
                let why = format!(
                    "maxRuns ({}) reached after {} run(s) of this backfill: the periods from {} on were not run",
                    self.sj.spec.max_runs().unwrap_or_default(),
                    op.started,
                    crate::naming::period_rfc3339(period)
                );
                // Rejected (not carried out to its end), its counts kept.
                op.phase = OperationPhase::Rejected;
                op.message = why;
                let note = format!("backfill {} stopped: {}", op.id, op.message);
                self.notes
                    .push((EventType::Warning, "OperationRejected", note));
                ops::set(&mut self.status.operations.backfill, op);
                return Ok(None);
            }
            if let Some(why) = self.gates.waiting(self.sj, &[]) {
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
    let mut note = format!(
        "{} requested by {}: Job {} for period {} with fencing token {}",
        OperationKind::from(origin).command(),
        by.unwrap_or("unknown"),
        claim.job_name,
        naming::period_rfc3339(claim.period.0),
        claim.token
    );
    if origin == RunOrigin::Rerun {
        let mut fenced: Vec<String> = claim.supersedes.iter().map(u64::to_string).collect();
        fenced.extend(claim.replaces.iter().map(|r| r.token.to_string()));
        fenced.dedup();
        if !fenced.is_empty() {
            note.push_str(&format!(
                "; the period's earlier token {} is fenced out",
                fenced.join(", ")
            ));
        }
        let replaced: Vec<&str> = claim.replaces.iter().map(|r| r.job_name.as_str()).collect();
        if !replaced.is_empty() {
            note.push_str(&format!("; replaced Job {}", replaced.join(", ")));
        }
    }
    let reason = match origin {
        RunOrigin::Trigger => "RunTriggered",
        RunOrigin::Backfill => "BackfillRunStarted",
        RunOrigin::Rerun => "RerunStarted",
    };
    (EventType::Normal, reason, note)
}
