//! Repair (`kubectl singleton rerun --from --to --only`) and its dry run: the steps of one
//! reconcile. Which periods are chosen is pure ([`crate::decide::repair`]); here the records are
//! gathered (the status, the SingletonJob's Jobs, the backstop's claim rows with their outcomes)
//! and each chosen period is handed to the claim as a rerun, one per reconcile.

use std::collections::{HashMap, HashSet};

use jiff::Timestamp;
use kube::runtime::events::EventType;

use super::{ManualRun, Operations};
use crate::Result;
use crate::api::{ConcurrencyPolicy, OperationPhase, OperationStatus, RepairOnly, RunOrigin};
use crate::backstop::{Availability, Backstop};
use crate::decide::ops::{self, OperationKind, Request};
use crate::decide::repair::{self, ClaimFact, Records};
use crate::naming::period_rfc3339;

/// A repair request checked, with its range fixed (first and last period, and how many).
struct Accepted {
    req: Request,
    first: Timestamp,
    last: Timestamp,
    count: u64,
}

impl Operations<'_> {
    /// A new request of `kind` (repair or its dry run) checked once; rejected with why, or
    /// accepted with its range.
    fn accept_repair(&mut self, kind: OperationKind) -> Option<Accepted> {
        let req = match ops::pending(self.sj, kind)? {
            Err(bad) => {
                self.reject(kind, &bad.id, None, bad.message);
                return None;
            }
            Ok(req) => req,
        };
        match self.check_repair(&req) {
            Ok((first, last, count)) => Some(Accepted {
                req,
                first,
                last,
                count,
            }),
            Err(why) => {
                self.reject(kind, &req.id.clone(), Some(&req), why);
                None
            }
        }
    }

    /// What makes a repair request impossible: no backstop (only its claims table knows every
    /// period that ran), a Job template the API server rejects, a range with no decided period,
    /// more than one run at a time under a concurrencyPolicy that never overlaps runs.
    fn check_repair(
        &self,
        req: &Request,
    ) -> std::result::Result<(Timestamp, Timestamp, u64), String> {
        if matches!(self.db, Availability::NotConfigured) {
            return Err("rerun --from --to needs spec.backstop: only the backstop's claims table remembers every period that ran and how it ended".into());
        }
        if let Err(msg) = self.gates.template {
            return Err(format!("the API server rejects the Job template: {msg}"));
        }
        let parallel = req.parallel.unwrap_or(1);
        if parallel > 1 && self.sj.spec.concurrency_policy != ConcurrencyPolicy::Allow {
            return Err(format!(
                "--parallel {parallel} needs concurrencyPolicy Allow: under {:?} runs never overlap, so a repair re-runs one period at a time (--parallel 1)",
                self.sj.spec.concurrency_policy
            ));
        }
        let (Some(from), Some(to)) = (req.from, req.to) else {
            return Err("rerun --from --to needs both from and to".into());
        };
        ops::backfill_range(self.schedule, from, to, self.decided_through)
    }

    /// The dry run: what a repair asked now would re-run, decided by the same rules, recorded in
    /// `status.operations.repairDryRun` with the periods in order (the first
    /// [`repair::LISTED`]). Nothing is run.
    pub(super) async fn repair_dry_run(&mut self) -> Result<()> {
        let kind = OperationKind::RepairDryRun;
        let Some(a) = self.accept_repair(kind) else {
            return Ok(());
        };
        let mut op = plan(&a, self.now);
        let backstop = match self.db {
            Availability::Ready(b) => b.clone(),
            _ => {
                op.phase = OperationPhase::Pending;
                op.message = "waiting for the backstop database, which holds each period's claim and outcome".into();
                ops::set(&mut self.status.operations.repair_dry_run, op);
                return Ok(());
            }
        };
        op.phase = OperationPhase::Done;
        let only = a.req.only.unwrap_or_default();
        if let Some(same) = repair::identical(
            self.status.operations.repair.as_ref(),
            a.first,
            a.last,
            only,
        ) {
            op.selected = Some(0);
            op.message = format!(
                "a repair now would start nothing new: it is identical to repair {} ({:?}{})",
                same.id,
                same.phase,
                match same.phase {
                    OperationPhase::Running => ", which goes on",
                    _ => "",
                }
            );
            ops::set(&mut self.status.operations.repair_dry_run, op);
            return Ok(());
        }
        let records = self.records(&backstop, &op).await?;
        let status = &*self.status;
        let (periods, chosen, passed) = repair::dry_run(self.schedule, &op, |p| {
            repair::standing(status, p, records.of(p))
        });
        let selected = periods.len() as u64;
        op.periods = periods
            .into_iter()
            .take(repair::LISTED)
            .map(Into::into)
            .collect();
        op.passed = passed.0.values().sum();
        op.selected = Some(selected);
        op.message = format!(
            "would re-run {selected} of {} period(s) ({}); would pass {} ({})",
            a.count,
            chosen.describe(),
            op.passed,
            passed.describe()
        );
        ops::set(&mut self.status.operations.repair_dry_run, op);
        Ok(())
    }

    /// The repair: a new request accepted (or, identical to the latest, answered without a new
    /// run), then walked a period at a time, each chosen one started as a rerun once it may.
    pub(super) async fn repair(&mut self) -> Result<Option<ManualRun>> {
        if let Some(a) = self.accept_repair(OperationKind::Repair) {
            self.begin_repair(a);
        }
        let Some(mut op) = self
            .status
            .operations
            .repair
            .clone()
            .filter(|o| o.phase == OperationPhase::Running)
        else {
            return Ok(None);
        };
        let Some(backstop) = self.walk_backstop(OperationKind::Repair, op.clone()) else {
            return Ok(None);
        };
        let records = self.records(&backstop, &op).await?;
        let status = &*self.status;
        let next = repair::advance(self.schedule, &mut op, |p| {
            repair::standing(status, p, records.of(p))
        });
        if let Some(period) = next {
            let parallel = op.parallel.unwrap_or(1) as usize;
            let running = repair::active_runs(self.gates.active, &op);
            let waiting = match running >= parallel {
                true => Some(format!(
                    "waiting: {running} of its runs active (parallel {parallel}); next period {}",
                    period_rfc3339(period)
                )),
                false => self.gates.waiting(self.sj, &[]),
            };
            if let Some(why) = waiting {
                op.message = why;
                ops::set(&mut self.status.operations.repair, op);
                return Ok(None);
            }
            // The cursor moves past the period in the claim's own write (see run::start).
            op.next = Some(repair::past(op.order.unwrap_or_default(), period).into());
            ops::set(&mut self.status.operations.repair, op);
            return Ok(Some(ManualRun {
                period,
                origin: RunOrigin::Rerun,
                replace: Vec::new(),
                supersedes: records.of(period).claim.map(|c| c.token),
                repair: true,
            }));
        }
        op.phase = OperationPhase::Done;
        op.message = format!("re-ran {} period(s), passed {}", op.started, op.passed);
        let note = format!("repair {} done: {}", op.id, op.message);
        self.notes.push((EventType::Normal, "RepairDone", note));
        ops::set(&mut self.status.operations.repair, op);
        Ok(None)
    }

    /// Records a newly accepted repair: identical to the latest one (same range and
    /// selection), it starts nothing new: one still running goes on under the new request's
    /// id, one done is answered done. Else a new walk of the range begins.
    fn begin_repair(&mut self, a: Accepted) {
        let only = a.req.only.unwrap_or_default();
        let latest = self.status.operations.repair.as_ref();
        let mut op = plan(&a, self.now);
        if let Some(same) = repair::identical(latest, a.first, a.last, only) {
            op = OperationStatus {
                id: op.id,
                requested_by: op.requested_by,
                reason: op.reason,
                updated: op.updated,
                message: format!(
                    "identical to repair {} ({:?}): nothing new started, nothing started twice",
                    same.id, same.phase
                ),
                ..same.clone()
            };
            ops::set(&mut self.status.operations.repair, op);
            return;
        }
        op.phase = OperationPhase::Running;
        op.message = format!(
            "re-running the {} periods of {} period(s) from {} to {}, {} first, {} at a time",
            match only {
                RepairOnly::Failed => "failed",
                RepairOnly::Missed => "never-run",
                RepairOnly::All => "decided",
            },
            a.count,
            period_rfc3339(a.first),
            period_rfc3339(a.last),
            match op.order.unwrap_or_default() {
                crate::api::RepairOrder::Oldest => "oldest",
                crate::api::RepairOrder::Newest => "newest",
            },
            op.parallel.unwrap_or(1)
        );
        // One repair at a time: a different request replaces one still running, and says so.
        if let Some(old) = latest.filter(|o| o.phase == OperationPhase::Running) {
            op.message.push_str(&format!(
                "; replaces repair {}, stopped after re-running {} period(s)",
                old.id, old.started
            ));
        }
        let by = a.req.by.as_deref().unwrap_or("unknown");
        let note = format!("repair requested by {by}: {}", op.message);
        self.notes.push((EventType::Normal, "RepairAccepted", note));
        self.status.operations.repair = Some(op);
    }

    /// What is known of each period of `op`'s range besides the status: its claim row (one read
    /// of the range), whether a Job of it exists, and whether the claims table covers it.
    async fn records(&self, backstop: &Backstop, op: &OperationStatus) -> Result<PeriodRecords> {
        let (from, to) = match (op.from.as_ref(), op.to.as_ref()) {
            (Some(f), Some(t)) => (f.0, t.0),
            _ => (self.now, self.now),
        };
        let claims = backstop
            .claims_between(&self.sj.backstop_key(), from, to)
            .await?
            .into_iter()
            .collect();
        // Every run after `since` has its row in this backstop, and none before the
        // SingletonJob's creation can be told from an earlier one's (as backfill, F12).
        let stale = crate::record::claims_recorded_stale(self.status, &backstop.target_id());
        Ok(PeriodRecords {
            claims,
            jobs: self.gates.owned.iter().filter_map(|j| j.period).collect(),
            since: self
                .status
                .claims_recorded
                .as_ref()
                .filter(|_| !stale)
                .map(|r| r.since.0),
            created: self.sj.metadata.creation_timestamp.as_ref().map(|t| t.0),
        })
    }
}

/// The records of a range's periods besides the status, read once per reconcile.
struct PeriodRecords {
    claims: HashMap<Timestamp, ClaimFact>,
    jobs: HashSet<Timestamp>,
    since: Option<Timestamp>,
    created: Option<Timestamp>,
}

impl PeriodRecords {
    fn of(&self, period: Timestamp) -> Records {
        Records {
            claim: self.claims.get(&period).copied(),
            job: self.jobs.contains(&period),
            covered: self.since.is_some_and(|s| s < period)
                && self.created.is_some_and(|c| c <= period),
        }
    }
}

/// The record of an accepted repair request with its fixed range.
fn plan(a: &Accepted, now: Timestamp) -> OperationStatus {
    let mut op = ops::accepted(&a.req, now);
    op.from = Some(a.first.into());
    op.to = Some(a.last.into());
    op.only = Some(a.req.only.unwrap_or_default());
    op.order = Some(a.req.order.unwrap_or_default());
    op.parallel = Some(a.req.parallel.unwrap_or(1));
    op
}
