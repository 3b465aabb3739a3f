//! Bulk repair: `kubectl singleton rerun NAME --from A --to B --only failed|missed|all
//! [--dry-run] [--parallel N] [--order oldest|newest]`. Pure: what each period's records say,
//! which periods a repair re-runs, and in what order; [`crate::operate`] gathers the records and
//! starts each chosen period through the claim as a rerun ([`crate::run`]: a new token above
//! every earlier one, the period's backstop claim row taken over, the earlier run fenced out).
//!
//! A period's standing comes from, in this order: its run still active (never re-run by a
//! repair: wait, or rerun it alone with `--replace`); the backstop's claim row and the outcome
//! recorded on it (schema 8); the status history entry of the row's token; a history entry or
//! Job without a claim; and, for a period that nothing ran, the claims table itself, which
//! knows every run after `status.claimsRecorded.since` (before that, or before the SingletonJob
//! was created, a period without a row is Unknown: something else may have run it).
//!
//! The dry run and the repair use the same [`standing`] and [`selects`]: what the dry run lists
//! is what the repair, asked at that moment, starts. A second request identical to the latest
//! repair (same range and selection, [`identical`]) starts nothing new.

use jiff::{SignedDuration, Timestamp};

use crate::api::{
    OperationPhase, OperationStatus, Outcome, RepairOnly, RepairOrder, RunOrigin, RunRef,
    SingletonJobStatus,
};
use crate::naming::period_rfc3339;
use crate::schedule::Schedule;

/// The most runs of one repair active at once.
pub const MAX_PARALLEL: u32 = 100;

/// How many periods a dry run lists in its record (it counts them all).
pub const LISTED: usize = 100;

/// A period's claim row in the backstop: its token and the outcome recorded for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimFact {
    pub token: u64,
    /// None: running, or not recorded (a controller before schema 8, or an unrecorded end).
    pub outcome: Option<Outcome>,
}

/// What a decided period's records say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Standing {
    /// Its latest run succeeded.
    Succeeded,
    /// Its latest run failed, or was replaced before it finished.
    Failed,
    /// It never ran (recorded Missed or Skipped, or nothing ran it).
    NeverRan,
    /// It ran, or may have, and no record says how it ended.
    Unknown,
    /// Its run is still active.
    Active,
}

impl Standing {
    pub const ALL: [Standing; 5] = [
        Standing::Failed,
        Standing::NeverRan,
        Standing::Succeeded,
        Standing::Unknown,
        Standing::Active,
    ];

    /// For messages.
    pub fn describe(self) -> &'static str {
        match self {
            Standing::Succeeded => "succeeded",
            Standing::Failed => "failed",
            Standing::NeverRan => "never ran",
            Standing::Unknown => "outcome unknown",
            Standing::Active => "still running",
        }
    }
}

/// What is known of one period besides the status: its claim row and whether a Job of it exists.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Records {
    pub claim: Option<ClaimFact>,
    pub job: bool,
    /// The claims table knows every run of this period (it is after `claimsRecorded.since` and
    /// after the SingletonJob's creation).
    pub covered: bool,
}

/// What `period`'s records say (see the module's order of sources).
pub fn standing(status: &SingletonJobStatus, period: Timestamp, records: Records) -> Standing {
    let active = status
        .active
        .iter()
        .chain(status.pending_claim.as_ref())
        .any(|r| r.period.0 == period);
    if active {
        return Standing::Active;
    }
    let ran = |outcome: Outcome| match outcome {
        Outcome::Succeeded => Some(Standing::Succeeded),
        Outcome::Failed | Outcome::Replaced => Some(Standing::Failed),
        Outcome::Missed | Outcome::Skipped => Some(Standing::NeverRan),
        Outcome::Running | Outcome::Deduplicated => None,
    };
    // Newest first: the first entry of the period is its latest decision.
    let entries = || status.history.iter().filter(|h| h.period.0 == period);
    if let Some(claim) = records.claim {
        let by_token = || {
            entries()
                .find(|h| h.token == Some(claim.token))
                .and_then(|h| ran(h.outcome))
        };
        return claim
            .outcome
            .and_then(ran)
            .or_else(by_token)
            .unwrap_or(Standing::Unknown);
    }
    if let Some(h) = entries().find(|h| h.job_name.is_some()) {
        return ran(h.outcome).unwrap_or(Standing::Unknown);
    }
    if records.job {
        return Standing::Unknown;
    }
    if records.covered {
        Standing::NeverRan
    } else {
        Standing::Unknown
    }
}

/// Whether a repair selecting `only` re-runs a period of this standing.
pub fn selects(only: RepairOnly, standing: Standing) -> bool {
    match (only, standing) {
        (_, Standing::Active) => false,
        (RepairOnly::Failed, s) => s == Standing::Failed,
        (RepairOnly::Missed, s) => s == Standing::NeverRan,
        (RepairOnly::All, _) => true,
    }
}

/// The first period the walk of `op` (fixed range `from`..=`to`, cursor `next`) has not
/// considered yet, in its order.
pub fn next_period(schedule: &Schedule, op: &OperationStatus) -> Option<Timestamp> {
    let (from, to) = (op.from.as_ref()?.0, op.to.as_ref()?.0);
    match op.order.unwrap_or_default() {
        RepairOrder::Oldest => {
            let cursor = op.next.as_ref().map_or(from, |n| n.0);
            schedule
                .next_after(cursor - SignedDuration::from_nanos(1))
                .filter(|p| *p <= to)
        }
        RepairOrder::Newest => {
            let cursor = op.next.as_ref().map_or(to, |n| n.0);
            schedule.latest_at_or_before(cursor).filter(|p| *p >= from)
        }
    }
}

/// The cursor just past `period` in `order`. Cron's finest unit is the second and the cursor is
/// stored as a `Time` (whole seconds), so one second on is the next instant that can be due.
pub fn past(order: RepairOrder, period: Timestamp) -> Timestamp {
    match order {
        RepairOrder::Oldest => period + SignedDuration::from_secs(1),
        RepairOrder::Newest => period - SignedDuration::from_secs(1),
    }
}

/// One step of a repair's walk: moves `op`'s cursor past the periods it does not select
/// (counted in `passed`) and returns the next period it re-runs, its cursor left on it (the claim
/// moves it past, in the same write); None once the range is walked.
pub fn advance(
    schedule: &Schedule,
    op: &mut OperationStatus,
    standing_of: impl Fn(Timestamp) -> Standing,
) -> Option<Timestamp> {
    let (only, order) = (op.only.unwrap_or_default(), op.order.unwrap_or_default());
    while let Some(period) = next_period(schedule, op) {
        if selects(only, standing_of(period)) {
            return Some(period);
        }
        op.passed += 1;
        op.next = Some(past(order, period).into());
    }
    None
}

/// What a repair of `op`'s range would do now: the periods it re-runs in its order, and the
/// standings of those it re-runs and of those it passes. The same walk as [`advance`].
pub fn dry_run(
    schedule: &Schedule,
    op: &OperationStatus,
    standing_of: impl Fn(Timestamp) -> Standing,
) -> (Vec<Timestamp>, Tally, Tally) {
    let mut walk = OperationStatus {
        next: None,
        ..op.clone()
    };
    let order = walk.order.unwrap_or_default();
    let (mut chosen, mut passed, mut periods) = (Tally::default(), Tally::default(), Vec::new());
    while let Some(period) = next_period(schedule, &walk) {
        let standing = standing_of(period);
        if selects(walk.only.unwrap_or_default(), standing) {
            chosen.add(standing);
            periods.push(period);
        } else {
            passed.add(standing);
        }
        walk.next = Some(past(order, period).into());
    }
    (periods, chosen, passed)
}

/// Whether a request for (`from`, `to`, `only`), its range fixed as `first`..=`last`, repeats
/// the latest repair `latest` (running or done): then it starts nothing new.
pub fn identical(
    latest: Option<&OperationStatus>,
    first: Timestamp,
    last: Timestamp,
    only: RepairOnly,
) -> Option<&OperationStatus> {
    latest.filter(|op| {
        matches!(op.phase, OperationPhase::Running | OperationPhase::Done)
            && op.from.as_ref().map(|t| t.0) == Some(first)
            && op.to.as_ref().map(|t| t.0) == Some(last)
            && op.only.unwrap_or_default() == only
    })
}

/// The repair's runs active now: reruns of periods of its range.
pub fn active_runs(active: &[RunRef], op: &OperationStatus) -> usize {
    let (Some(from), Some(to)) = (op.from.as_ref(), op.to.as_ref()) else {
        return 0;
    };
    active
        .iter()
        .filter(|r| {
            r.origin == Some(RunOrigin::Rerun) && from.0 <= r.period.0 && r.period.0 <= to.0
        })
        .count()
}

/// Counts of periods by standing, for messages ("3 failed, 1 still running").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally(pub std::collections::BTreeMap<Standing, u64>);

impl Tally {
    pub fn add(&mut self, s: Standing) {
        *self.0.entry(s).or_default() += 1;
    }

    pub fn describe(&self) -> String {
        let parts: Vec<String> = Standing::ALL
            .iter()
            .filter_map(|s| Some(format!("{} {}", self.0.get(s)?, s.describe())))
            .collect();
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }
}

/// A repair's record once a claim of it is written: its counts and the latest run.
pub fn progress(op: &OperationStatus, claim: &RunRef) -> String {
    format!(
        "re-ran {} period(s), passed {}; latest: period {} as Job {} (token {})",
        op.started,
        op.passed,
        period_rfc3339(claim.period.0),
        claim.job_name,
        claim.token
    )
}

#[cfg(test)]
mod tests;
