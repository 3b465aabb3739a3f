//! Record: what a reconcile writes into status, as pure functions of the status, the plan and
//! what was observed, so every rule is unit-tested without an API server; the conditions
//! ([`conditions`]); and the pruning of finished Jobs by the history limits ([`prune`]).

pub mod conditions;
pub mod preparation;
pub mod prune;

use std::collections::HashMap;

use jiff::{SignedDuration, Timestamp};

use kube::runtime::events::EventType;

use crate::api::{
    ClaimsRecorded, HistoryEntry, Outcome, ReplacedRun, RunRef, SingletonJobSpec,
    SingletonJobStatus, Suspension,
};
use crate::clock::ClockState;
use crate::decide::bounds::Standing;
use crate::decide::{JobState, Plan, Waiting, reason};
use crate::naming;
use crate::observe::Behind;
use crate::schedule::Schedule;

pub use preparation::preparation;

/// Entries kept in `status.history`.
pub const HISTORY_LIMIT: usize = 20;

/// Adds `entry` at the top of the history (newest first), keeping the newest [`HISTORY_LIMIT`].
pub fn push_history(status: &mut SingletonJobStatus, entry: HistoryEntry) {
    status.history.insert(0, entry);
    status.history.truncate(HISTORY_LIMIT);
}

/// The history entry of a run (a Job was created for it): Running while `finished` is None.
pub fn run_entry(
    run: &RunRef,
    outcome: Outcome,
    reason: Option<String>,
    finished: Option<Timestamp>,
) -> HistoryEntry {
    HistoryEntry {
        unknown: Default::default(),
        late: run.late,
        period: run.period.clone(),
        last_period: None,
        count: 1,
        outcome,
        reason,
        job_name: Some(run.job_name.clone()),
        token: Some(run.token),
        start_time: run.claimed_at.clone(),
        finish_time: finished.map(Into::into),
        requested_by: run.requested_by.clone(),
        cluster: None,
        message: None,
    }
}

/// The history entry of a run fenced and deleted for a newer one (concurrencyPolicy Replace).
pub fn replaced_entry(old: &ReplacedRun, at: Timestamp) -> HistoryEntry {
    HistoryEntry {
        unknown: Default::default(),
        late: false,
        period: old.period.clone(),
        last_period: None,
        count: 1,
        outcome: Outcome::Replaced,
        reason: Some(reason::REPLACED.into()),
        job_name: Some(old.job_name.clone()),
        token: Some(old.token),
        start_time: old.claimed_at.clone(),
        finish_time: Some(at.into()),
        requested_by: None,
        cluster: None,
        message: None,
    }
}

/// The history entry of a claimed period decided without a Job (deduplicated, rejected, ...).
pub fn decided_entry(claim: &RunRef, outcome: Outcome, why: &str, at: Timestamp) -> HistoryEntry {
    HistoryEntry {
        unknown: Default::default(),
        late: false,
        period: claim.period.clone(),
        last_period: None,
        count: 1,
        outcome,
        reason: Some(why.into()),
        job_name: None,
        token: Some(claim.token),
        start_time: claim.claimed_at.clone(),
        finish_time: Some(at.into()),
        requested_by: claim.requested_by.clone(),
        cluster: None,
        message: None,
    }
}

/// Writes what `plan` decided into `status`: finished runs and periods decided without a run go
/// to the history, the active runs and the cursor move. Returns the new entries, oldest first,
/// for their Events and metrics. `states` is what was observed of the active runs' Jobs.
pub fn apply_plan(
    spec: &SingletonJobSpec,
    status: &mut SingletonJobStatus,
    plan: &Plan,
    states: &HashMap<String, JobState>,
    now: Timestamp,
) -> Vec<HistoryEntry> {
    let mut new_entries = Vec::new();
    for (run, outcome, at) in &plan.finished {
        if *outcome == Outcome::Succeeded {
            status.last_successful_time = Some((*at).into());
        }
        let earlier = status
            .history
            .iter()
            .find(|h| h.job_name.as_deref() == Some(&run.job_name));
        // Keep what the run's entry already said (such as BackstopSkipped) unless the Job vanished.
        let why = matches!(states.get(&run.job_name), Some(JobState::Gone))
            .then(|| reason::JOB_DELETED.to_string())
            .or_else(|| earlier.and_then(|h| h.reason.clone()));
        // And what a newer release recorded on it (version skew, issue 36).
        let unknown = earlier.map(|h| h.unknown.clone()).unwrap_or_default();
        // The run's "Running" entry becomes its outcome.
        status
            .history
            .retain(|h| h.job_name.as_deref() != Some(&run.job_name));
        let mut entry = run_entry(run, *outcome, why, Some(*at));
        entry.unknown = unknown;
        new_entries.push(entry);
    }
    new_entries.extend(plan.records.iter().cloned());
    note_suspension(spec, status, plan.consecutive_failures, now);
    for e in &new_entries {
        status.last_result = Some(e.outcome);
        push_history(status, e.clone());
    }
    status.active = plan.still_active.clone();
    status.active_count = status.active.len() as i32;
    status.decided_through = plan.decided_through.map(Into::into);
    status.schedule_fingerprint = Some(plan.fingerprint.clone());
    new_entries
}

/// The failure count, and when `suspendAfterConsecutiveFailures` suspended the SingletonJob:
/// the first decision that sees `suspend: true` with the count at the limit (the count is held
/// until the suspension is seen, so a failed write of it is tried again). Resuming clears it.
fn note_suspension(
    spec: &SingletonJobSpec,
    status: &mut SingletonJobStatus,
    failures: i32,
    now: Timestamp,
) {
    let suspended = spec.suspend.unwrap_or(false);
    let reached = spec
        .suspend_after_consecutive_failures
        .is_some_and(|n| status.consecutive_failures >= n);
    if suspended && reached {
        status.suspended_after_failures = Some(now.into());
    } else if !suspended {
        status.suspended_after_failures = None;
    }
    status.consecutive_failures = failures;
}

/// How many periods [`next_times`] looks through for three that run.
const NEXT_TIMES_SEARCH: usize = 100_000;

/// `status.nextScheduleTime(s)`: when the next periods start, as they will: excluded days left
/// out (or shifted), each period's jitter added. Returns the first.
pub fn next_times(
    status: &mut SingletonJobStatus,
    schedule: &Schedule,
    jitter: impl Fn(Timestamp) -> SignedDuration,
    left: Option<u64>,
    now: Timestamp,
) -> Option<Timestamp> {
    // No more than `maxRuns` leaves to run.
    let shown = left.map_or(3, |l| l.min(3) as usize);
    // Bounded: a schedule whose every period is excluded shows none rather than searching on.
    let next: Vec<Timestamp> = schedule
        .iter_after(now)
        .take(NEXT_TIMES_SEARCH)
        .filter(|t| !schedule.excluded(*t))
        .take(shown)
        .map(|t| t + jitter(t))
        .collect();
    status.next_schedule_time = next.first().map(|t| naming::period_rfc3339(*t));
    status.next_schedule_times = next.iter().map(|t| (*t).into()).collect();
    next.first().copied()
}

/// The backstop as the conditions see it (the connection itself is not needed here).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackstopSeen {
    NotConfigured,
    Ready,
    Unavailable(String),
}

/// What the conditions of one reconcile are made of.
pub struct Facts<'a> {
    /// The schedule and its time zone, as the user wrote them.
    pub schedule: &'a str,
    pub time_zone: &'a str,
    pub suspended: bool,
    /// Why, by whom and until when (`spec.suspension`), if said.
    pub suspension: Option<&'a Suspension>,
    /// Suspended by `suspendAfterConsecutiveFailures`.
    pub suspended_after_failures: bool,
    pub clock: &'a ClockState,
    pub backstop: BackstopSeen,
    /// Why no run starts although one is due, if so.
    pub waiting: Option<Waiting>,
    pub generation: Option<i64>,
    pub now: Timestamp,
}

/// Sets the conditions of a reconcile that parsed its schedule. Returns whether `BackstopReady`
/// turned False (an Event is due).
pub fn set_conditions(status: &mut SingletonJobStatus, f: &Facts<'_>) -> bool {
    let (generation, now) = (f.generation, f.now);
    let conds = &mut status.conditions;
    let schedule = format!("{} in {}", f.schedule, f.time_zone);
    conditions::set(
        conds,
        conditions::SCHEDULE_VALID,
        true,
        "Parsed",
        schedule,
        generation,
        now,
    );
    let (suspended, why) = match (f.suspended, f.suspended_after_failures) {
        (true, true) => (
            "SuspendedAfterFailures",
            "suspendAfterConsecutiveFailures was reached; set spec.suspend to false to resume"
                .to_string(),
        ),
        (true, false) => (
            "Suspended",
            f.suspension.map(Suspension::note).unwrap_or_default(),
        ),
        (false, _) => ("Active", String::new()),
    };
    conditions::set(
        conds,
        conditions::SUSPENDED,
        f.suspended,
        suspended,
        why,
        generation,
        now,
    );
    let (trusted, clock_reason, clock_msg) = clock_condition(f.clock);
    conditions::set(
        conds,
        conditions::CLOCK_TRUSTED,
        trusted,
        clock_reason,
        clock_msg,
        generation,
        now,
    );
    let turned_unavailable = backstop_condition(conds, &f.backstop, generation, now);
    let (ready, why) = match f.waiting {
        Some(Waiting::ClockUntrusted) => (false, "ClockSkew"),
        Some(Waiting::JobTemplateInvalid) => (false, "JobTemplateRejected"),
        Some(Waiting::BackstopUnavailable) => (false, "BackstopUnavailable"),
        _ => (true, "Scheduled"),
    };
    conditions::set(conds, conditions::READY, ready, why, "", generation, now);
    settle_consistency(status, generation, now);
    turned_unavailable
}

/// The `Ended` condition (only for a SingletonJob with `startAt`, `endAt` or `maxRuns`), and
/// `ScheduleValid` False when its bounds hold no period at all. Returns the Event to publish
/// when it turned True: Normal when the bounds were reached, Warning when they hold no period.
pub fn bounds_condition(
    status: &mut SingletonJobStatus,
    spec: &SingletonJobSpec,
    standing: Option<&Standing>,
    run_count: u64,
    f: &Facts<'_>,
) -> Option<(EventType, &'static str, String)> {
    let conds = &mut status.conditions;
    let Some(standing) = standing else {
        conds.retain(|c| c.type_ != conditions::ENDED);
        return None;
    };
    let (reason, message) = (standing.reason(), standing.message(spec, run_count));
    let was = conditions::is_true(conds, conditions::ENDED);
    let ended = standing.ended();
    let (generation, now) = (f.generation, f.now);
    conditions::set(
        conds,
        conditions::ENDED,
        ended,
        reason,
        &message,
        generation,
        now,
    );
    let invalid = *standing == Standing::NoPeriodInBounds;
    if invalid {
        conditions::set(
            conds,
            conditions::SCHEDULE_VALID,
            false,
            reason,
            &message,
            generation,
            now,
        );
    }
    match (ended && !was, invalid) {
        (true, true) => Some((EventType::Warning, reason, message)),
        (true, false) => Some((EventType::Normal, "Ended", message)),
        _ => None,
    }
}

/// `ClockTrusted`: whether, why, and what. The exact offset changes with every measurement, so the
/// message only says it in whole seconds when the clocks disagree: only a verdict change is worth
/// a write.
fn clock_condition(clock: &ClockState) -> (bool, &'static str, String) {
    match (clock.trusted, clock.offset) {
        (true, _) => (
            true,
            "InSync",
            "the local clock agrees with the API server's".to_string(),
        ),
        (false, Some(o)) => (
            false,
            "ClockSkew",
            format!(
                "API server clock minus local clock: {} s; no run starts until they agree",
                o.as_secs()
            ),
        ),
        (false, None) => (
            false,
            "ClockSkew",
            "the API server's clock has not been measured yet; no run starts until it is".into(),
        ),
    }
}

/// `BackstopReady` (absent without a backstop). Returns whether it turned False.
fn backstop_condition(
    conds: &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    backstop: &BackstopSeen,
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    match backstop {
        BackstopSeen::NotConfigured => {
            conds.retain(|c| c.type_ != conditions::BACKSTOP_READY);
            false
        }
        BackstopSeen::Ready => {
            let msg = "the backstop database answers and its schema is in place";
            conditions::set(
                conds,
                conditions::BACKSTOP_READY,
                true,
                "Connected",
                msg,
                generation,
                now,
            );
            false
        }
        BackstopSeen::Unavailable(why) => {
            let why = why.clone();
            conditions::set(
                conds,
                conditions::BACKSTOP_READY,
                false,
                "Unavailable",
                why,
                generation,
                now,
            )
        }
    }
}

/// A schedule that does not parse: `ScheduleValid` and `Ready` say so. Returns whether anything
/// a reader would notice changed.
pub fn invalid_schedule(
    status: &mut SingletonJobStatus,
    msg: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let conds = &mut status.conditions;
    let mut changed = conditions::set(
        conds,
        conditions::SCHEDULE_VALID,
        false,
        "InvalidSchedule",
        msg,
        generation,
        now,
    );
    changed |= conditions::set(
        conds,
        conditions::READY,
        false,
        "InvalidSchedule",
        msg,
        generation,
        now,
    );
    status.next_schedule_time = None;
    status.next_schedule_times.clear();
    changed
}

/// The API server's verdict on the Job template (a dry run): `JobTemplateValid`. Returns whether
/// it turned False (an Event is due).
pub fn template_verdict(
    status: &mut SingletonJobStatus,
    verdict: &std::result::Result<(), String>,
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let conds = &mut status.conditions;
    match verdict {
        Ok(()) => {
            let msg = "the API server accepts the Job template (dry run)";
            conditions::set(
                conds,
                conditions::JOB_TEMPLATE_VALID,
                true,
                "Accepted",
                msg,
                generation,
                now,
            );
            false
        }
        Err(msg) => conditions::set(
            conds,
            conditions::JOB_TEMPLATE_VALID,
            false,
            "Rejected",
            msg.clone(),
            generation,
            now,
        ),
    }
}

/// Raises a status behind its SingletonJob's own Jobs (wiped by hand, or an etcd restore) to the
/// bounds their labels give: the token and the cursor, the Jobs still running adopted as active,
/// `StatusConsistent=False`. `fingerprint` is the current schedule's (a wiped status lost the one
/// its cursor refers to). Returns what was raised, for the Event.
pub fn raise_to_jobs(
    status: &mut SingletonJobStatus,
    behind: Behind,
    fingerprint: String,
    generation: Option<i64>,
    now: Timestamp,
) -> String {
    let mut raised = Vec::new();
    if let Some(token) = behind.token {
        raised.push(format!(
            "fencingToken from {} to {token}",
            status.fencing_token
        ));
        status.fencing_token = token;
    }
    if let Some(through) = behind.decided_through {
        let was = status
            .decided_through
            .as_ref()
            .map_or("unset".to_string(), |t| naming::period_rfc3339(t.0));
        raised.push(format!(
            "decidedThrough from {was} to {}",
            naming::period_rfc3339(through)
        ));
        status.decided_through = Some(through.into());
        if status
            .last_schedule_time
            .as_ref()
            .is_none_or(|t| t.0 < through)
        {
            status.last_schedule_time = Some(through.into());
        }
        // Without its fingerprint the cursor would be taken for an edit's and jump to now.
        if status.schedule_fingerprint.is_none() {
            status.schedule_fingerprint = Some(fingerprint);
        }
    }
    for run in &behind.running {
        raised.push(format!(
            "adopted running Job {} (token {})",
            run.job_name, run.token
        ));
    }
    status.active.extend(behind.running);
    status.active_count = status.active.len() as i32;
    if let Some(run) = behind.prepared {
        raised.push(format!(
            "adopted prepared Job {} (token {}), to be withdrawn: this status cannot vouch for its decision",
            run.job_name, run.token
        ));
        // Counted as its preparation counted it, so its withdrawal gives back only that.
        status.run_count = status.run_count.saturating_add(1);
        status.prepared = Some(run);
    }
    let message = format!(
        "status was behind this SingletonJob's Jobs (wiped or restored from an older copy); raised {}; no period they ran is run again",
        raised.join(", ")
    );
    conditions::set(
        &mut status.conditions,
        conditions::STATUS_CONSISTENT,
        false,
        "StatusBehind",
        message.clone(),
        generation,
        now,
    );
    message
}

/// After [`raise_to_jobs`] (a status behind its Jobs), `StatusConsistent` stays False until a run claimed after the raise
/// is in the history: from then on the status again records what it started itself.
pub fn settle_consistency(
    status: &mut SingletonJobStatus,
    generation: Option<i64>,
    now: Timestamp,
) {
    let Some(raised_at) = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::STATUS_CONSISTENT && c.status == "False")
        .map(|c| c.last_transition_time.0)
    else {
        return;
    };
    let since_raise = status
        .history
        .iter()
        .any(|h| h.job_name.is_some() && h.start_time.as_ref().is_some_and(|t| t.0 >= raised_at));
    if since_raise {
        conditions::set(
            &mut status.conditions,
            conditions::STATUS_CONSISTENT,
            true,
            "Consistent",
            "runs started since the status was raised are recorded in it",
            generation,
            now,
        );
    }
}

/// Whether `status.claimsRecorded` must be (re)set for the backstop `target`: it is unset, or
/// names another target.
pub fn claims_recorded_stale(status: &SingletonJobStatus, target: &str) -> bool {
    status
        .claims_recorded
        .as_ref()
        .is_none_or(|c| c.target != target)
}

/// Keeps `status.claimsRecorded` true: from when the backstop `target` has recorded every run.
/// A SingletonJob that never issued a token has had it from its creation; otherwise from now
/// (the backstop was added or moved, or a run went without its claim). `fence`: the token the
/// backstop stores for the job: above 0, tokens were issued although the status shows none (it
/// was wiped, or restored from an old copy), and the status cannot say which runs went without
/// a claim, so it is not fresh (F12).
pub fn mark_claims_recorded(
    status: &mut SingletonJobStatus,
    target: String,
    fence: u64,
    created: Timestamp,
    now: Timestamp,
) {
    if !claims_recorded_stale(status, &target) {
        return;
    }
    let fresh = status.fencing_token == 0 && status.history.is_empty() && fence == 0;
    // Status keeps whole seconds: rounded up, so a period that ran without a claim in the same
    // second is never after `since`.
    let since = if fresh {
        created
    } else {
        Timestamp::from_second(now.as_second() + i64::from(now.subsec_nanosecond() > 0))
            .unwrap_or(now)
    };
    // A record of a new target: what a newer release recorded about the old one is not its.
    status.claims_recorded = Some(Box::new(ClaimsRecorded {
        unknown: Default::default(),
        since: since.into(),
        target,
    }));
}

#[cfg(test)]
mod tests;
