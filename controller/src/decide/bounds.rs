//! `startAt`, `endAt` and `maxRuns`: where a SingletonJob's periods begin and end. The first two
//! are part of the schedule itself ([`crate::schedule::Bounds`]: instants outside them are not
//! periods); `maxRuns` counts the periods claimed (`status.runCount`). Here: whether the bounds
//! have been reached, and what the `Ended` condition says about it.

use jiff::{SignedDuration, Timestamp};

use crate::api::SingletonJobSpec;
use crate::naming::period_rfc3339;
use crate::schedule::Schedule;

/// Whether `maxRuns` periods have been claimed: then no period is due (until it is raised).
pub fn runs_exhausted(spec: &SingletonJobSpec, run_count: u64) -> bool {
    spec.max_runs().is_some_and(|max| run_count >= max)
}

/// Where a SingletonJob with bounds stands (the `Ended` condition).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Before `startAt`: its first period is this.
    NotStarted(Timestamp),
    /// Periods are due as the schedule says.
    Within,
    /// Every period up to `endAt` is decided: none is left.
    EndAtPassed,
    /// `maxRuns` periods were claimed.
    MaxRunsReached,
    /// No instant of the schedule falls within the bounds after the SingletonJob's creation: it
    /// never runs (bad input, said on the object).
    NoPeriodInBounds,
}

impl Standing {
    /// Whether no period will come.
    pub fn ended(&self) -> bool {
        matches!(
            self,
            Standing::EndAtPassed | Standing::MaxRunsReached | Standing::NoPeriodInBounds
        )
    }

    /// The condition's reason: the variant's name.
    pub fn reason(&self) -> &'static str {
        match self {
            Standing::NotStarted(_) => "NotStarted",
            Standing::Within => "WithinBounds",
            Standing::EndAtPassed => "EndAtPassed",
            Standing::MaxRunsReached => "MaxRunsReached",
            Standing::NoPeriodInBounds => "NoPeriodInBounds",
        }
    }

    /// The condition's message, for people.
    pub fn message(&self, spec: &SingletonJobSpec, run_count: u64) -> String {
        let bounds = spec.bounds();
        let at = |t: Option<Timestamp>| t.map_or("unset".to_string(), period_rfc3339);
        let runs = match spec.max_runs() {
            Some(max) => format!("{run_count} of maxRuns {max} periods claimed"),
            None => format!("{run_count} periods claimed"),
        };
        match self {
            Standing::NotStarted(first) => format!(
                "the first period is {} (startAt {})",
                period_rfc3339(*first),
                at(bounds.start)
            ),
            Standing::Within => format!(
                "periods from startAt {} to endAt {}; {runs}",
                at(bounds.start),
                at(bounds.end)
            ),
            Standing::EndAtPassed => format!(
                "endAt {} has passed: no period after it runs ({runs}); move endAt later to resume",
                at(bounds.end)
            ),
            Standing::MaxRunsReached => {
                format!("{runs}: no period runs any more; raise maxRuns to resume")
            }
            Standing::NoPeriodInBounds => format!(
                "no instant of the schedule falls between startAt {} and endAt {} after the SingletonJob was created: nothing will run; fix startAt, endAt or the schedule",
                at(bounds.start),
                at(bounds.end)
            ),
        }
    }
}

/// Where the SingletonJob stands, if it has bounds (None: no `startAt`, `endAt` or `maxRuns`).
/// `schedule` is its bounded schedule, `decided_through` the cursor after this decision.
pub fn standing(
    spec: &SingletonJobSpec,
    schedule: &Schedule,
    decided_through: Timestamp,
    run_count: u64,
    created: Timestamp,
    now: Timestamp,
) -> Option<Standing> {
    let bounds = spec.bounds();
    if bounds.start.is_none() && bounds.end.is_none() && spec.max_runs().is_none() {
        return None;
    }
    if runs_exhausted(spec, run_count) {
        return Some(Standing::MaxRunsReached);
    }
    let before_creation = created
        .checked_sub(SignedDuration::from_nanos(1))
        .unwrap_or(created);
    if schedule.next_after(before_creation).is_none() && run_count == 0 {
        return Some(Standing::NoPeriodInBounds);
    }
    let Some(next) = schedule.next_after(decided_through) else {
        return Some(Standing::EndAtPassed);
    };
    match bounds.start {
        Some(start) if now < start => Some(Standing::NotStarted(next)),
        _ => Some(Standing::Within),
    }
}
