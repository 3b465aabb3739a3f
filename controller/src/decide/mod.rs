//! Pure decisions: given a SingletonJob's spec, its status, what is known of its Jobs, and the time,
//! which periods are due and what to do now. No I/O and no clock here, so every rule is tested with
//! fixed instants (see the tests below and the property tests).
//!
//! The model: `status.decidedThrough` is a cursor. Every scheduled period at or before it has been
//! decided, either started (a claim was written) or recorded with an outcome and a reason. The
//! periods after it and at or before `now` are *pending*. Each reconcile moves the cursor forward
//! over pending periods, in order, so a period is decided once (G1) and none is passed over without
//! a record (G2).

use std::collections::HashMap;

use jiff::{SignedDuration, Timestamp};

use crate::api::{CatchUp, ConcurrencyPolicy, HistoryEntry, Outcome, RunRef, SingletonJobSpec};
use crate::schedule::{
    DayRules, DstPolicy, Exclusions, FoldPolicy, GapPolicy, Schedule, ScheduleError,
};

/// With `catchUp: None` and no `startingDeadlineSeconds`, a period that has not started within this
/// long of its instant is late and is not started.
pub const CATCH_UP_NONE_GRACE: SignedDuration = SignedDuration::from_secs(60);

/// What the controller knows of one run's Job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    /// The Job exists and has not finished.
    Active,
    /// The Job completed; when.
    Succeeded(Timestamp),
    /// The Job failed; when.
    Failed(Timestamp),
    /// The API server says the Job does not exist (checked, not merely absent from a cache).
    Gone,
}

/// Inputs besides spec and status.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    pub now: Timestamp,
    /// The SingletonJob's `namespace/name`: with the period, it picks the period's jitter.
    pub key: &'a str,
    /// `status.consecutiveFailures` before this decision.
    pub consecutive_failures: i32,
    /// `status.runCount` before this decision: the periods claimed so far, for `maxRuns`.
    pub run_count: u64,
    /// When the SingletonJob was created: periods before it are never due.
    pub created: Timestamp,
    /// Why no run may start now, if so: the local clock disagrees with the API server's (a run
    /// must never start before its instant, G4), or the API server rejects the Job template.
    pub blocked: Option<Waiting>,
    /// State of the Job of each entry of `status.active`, by job name (missing: Active).
    pub job_states: &'a HashMap<String, JobState>,
}

/// The outcome of one decision.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// The cursor after this plan (see module docs).
    pub decided_through: Option<Timestamp>,
    /// The schedule fingerprint the cursor now refers to.
    pub fingerprint: String,
    /// Periods decided without a run, oldest first, already folded into ranges.
    pub records: Vec<HistoryEntry>,
    /// Active runs that finished: (run, outcome, when).
    pub finished: Vec<(RunRef, Outcome, Timestamp)>,
    /// Runs still active after `finished` are removed.
    pub still_active: Vec<RunRef>,
    /// The period to claim and start now.
    pub start: Option<Timestamp>,
    /// Active runs to fence and delete before `start` (concurrencyPolicy Replace).
    pub replace: Vec<RunRef>,
    /// When to decide again (the next scheduled instant, or a deadline), if ever.
    pub wake_at: Option<Timestamp>,
    /// Why nothing started although a period is pending (for a condition).
    pub waiting: Option<Waiting>,
    /// Active runs that passed their completion deadline in this decision (marked `late` in
    /// `still_active`), for their Event and metric.
    pub late: Vec<RunRef>,
    /// `status.consecutiveFailures` after the finished runs.
    pub consecutive_failures: i32,
    /// `suspendAfterConsecutiveFailures` was reached: the SingletonJob is to be suspended, and
    /// nothing starts meanwhile.
    pub suspend: bool,
}

/// Why a pending period has not started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// The SingletonJob is suspended.
    Suspended,
    /// concurrencyPolicy Forbid and a run is active.
    ConcurrencyForbid,
    /// concurrencyPolicy Allow and `maxActive` runs are active.
    MaxActive,
    /// The local clock disagrees with the API server's.
    ClockUntrusted,
    /// The API server rejects the Job template (a dry run failed).
    JobTemplateInvalid,
    /// `lock.purpose: Correctness` and the backstop database cannot record a claim.
    BackstopUnavailable,
}

/// Reasons recorded with periods that did not run. CamelCase, as Kubernetes reasons are.
pub mod reason {
    pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
    pub const SUPERSEDED: &str = "Superseded";
    pub const CATCH_UP_NONE: &str = "CatchUpNone";
    pub const SUSPENDED: &str = "Suspended";
    pub const CONCURRENCY_FORBID: &str = "ConcurrencyForbid";
    pub const JOB_DELETED: &str = "JobDeleted";
    pub const REPLACED: &str = "Replaced";
    pub const JOB_REJECTED: &str = "JobRejected";
    pub const BACKSTOP_UNAVAILABLE: &str = "BackstopUnavailable";
    pub const BACKSTOP_SKIPPED: &str = "BackstopSkipped";
    pub const DEDUPLICATED: &str = "AlreadyClaimed";
    /// Multi-cluster: another cluster claimed (and ran, or runs) the period in the shared backstop.
    pub const CLAIMED_ELSEWHERE: &str = "ClaimedElsewhere";
    /// Multi-cluster: this cluster took over another's claim left unconfirmed past the bound.
    pub const TOOK_OVER: &str = "TookOver";
    pub const LOCK_BROKEN: &str = "LockBroken";
    /// A run's Job was started (unsuspended) by someone other than the controller: only the
    /// controller starts a run, after its claim is confirmed (issue 31).
    pub const STARTED_BEFORE_CONFIRM: &str = "StartedBeforeConfirm";
    /// The API server returned the run's Job not suspended (a mutating webhook cleared
    /// `spec.suspend` at create): it is deleted before anything else (issue 31).
    pub const JOB_NOT_SUSPENDED: &str = "JobNotSuspended";
    /// Replace without a backstop: the replaced run's Job did not go away before the period's
    /// wait bound, and the new run never starts beside it (F13).
    pub const REPLACED_RUN_RUNNING: &str = "ReplacedRunStillRunning";
    /// A confirmed run's resume was refused by admission until the period's wait bound: its Job
    /// never ran and is deleted (F10a).
    pub const RESUME_REFUSED: &str = "ResumeRefused";
    /// The backstop's fence row stayed locked by an open transaction past the deadline.
    pub const FENCE_HELD: &str = "FenceHeld";
    /// The job key belongs to another namespace in the backstop (the namespace of its first
    /// claim; issue 34, N4): this SingletonJob may not claim it.
    pub const JOB_KEY_OWNED_ELSEWHERE: &str = "JobKeyOwnedElsewhere";
    /// A Job of the period existed already (an earlier run of it): no second Job.
    pub const JOB_EXISTS: &str = "JobExists";
    /// The period's Job name is taken by a Job that is not this SingletonJob's run.
    pub const JOB_NAME_TAKEN: &str = "JobNameTaken";
    /// The period's Job could not be created (refused for a reason that may pass) by its deadline.
    pub const JOB_NOT_CREATED: &str = "JobNotCreated";
    /// The schedule changed while the period waited (or before it was decided): it never runs.
    pub const SCHEDULE_CHANGED: &str = "ScheduleChanged";
    /// The period falls on a day its exclusions or calendars exclude.
    pub const EXCLUDED: &str = "Excluded";
    /// catchUp All: more late periods were pending than `catchUpLimit`; the older ones never run.
    pub const CATCH_UP_LIMIT: &str = "CatchUpLimit";
    /// concurrencyPolicy Allow with catchUp None: `maxActive` runs were active.
    pub const MAX_ACTIVE: &str = "MaxActive";
}

/// The expressions of `schedule` or `schedules`, trimmed.
pub fn expressions(spec: &SingletonJobSpec) -> Vec<&str> {
    if spec.schedules.is_empty() {
        vec![spec.schedule.trim()]
    } else {
        spec.schedules.iter().map(|s| s.trim()).collect()
    }
}

/// The SingletonJob's periods: its schedule or schedules, with the days excluded by its
/// `exclusions` and by the SingletonCalendars it names (`calendars`: those found, by name).
pub fn schedule(
    spec: &SingletonJobSpec,
    calendars: &HashMap<String, DayRules>,
) -> Result<Schedule, ScheduleError> {
    let schedule = Schedule::parse_all(
        &expressions(spec),
        spec.time_zone.as_deref(),
        spec.dst_policy,
    )?;
    let schedule = schedule.with_bounds(spec.bounds());
    let Some(x) = &spec.exclusions else {
        return Ok(schedule);
    };
    let mut sets = vec![("exclusions", &x.rules)];
    for name in &x.calendars {
        let rules = calendars
            .get(name)
            .ok_or_else(|| ScheduleError::MissingCalendar(name.clone()))?;
        sets.push((name.as_str(), rules));
    }
    Ok(schedule.with_exclusions(Exclusions::compile(sets, x.action)?))
}

/// `status.shiftsAfter` for a decision: the cursor an edit restarts the schedule from when the
/// schedule's fingerprint (`fp`, of the spec and the excluded days) differs from the status's
/// (see [`crate::schedule::Schedule::with_shift_floor`], F9); else what the status kept.
pub fn shift_floor(
    fp: &str,
    status_fingerprint: Option<&str>,
    decided_through: Option<Timestamp>,
    kept: Option<Timestamp>,
    now: Timestamp,
) -> Option<Timestamp> {
    match (decided_through, status_fingerprint) {
        (Some(c), f) if f != Some(fp) => Some(c.max(now)),
        _ => kept,
    }
}

/// How long a claimed period may wait for something that may never come (a fence row held by a
/// session on a dead node, a Job name that stays taken, a resume refused by a webhook): its
/// starting deadline, or without one the schedule's next instant after it (excluded days aside:
/// a bound, not a period), when the next period wants the slot. Past it, the period is recorded
/// rather than blocking every later period (G2; F6, F10). None: the schedule has no next instant.
pub fn wait_bound(spec: &SingletonJobSpec, period: Timestamp) -> Option<Timestamp> {
    if let Some(d) = spec.starting_deadline_seconds {
        return period.checked_add(SignedDuration::from_secs(d)).ok();
    }
    next_instant(spec, period)
}

/// The schedule's next instant after `period`, if the spec parses and has one.
pub fn next_instant(spec: &SingletonJobSpec, period: Timestamp) -> Option<Timestamp> {
    let exprs = expressions(spec);
    let schedule = Schedule::parse_all(&exprs, spec.time_zone.as_deref(), spec.dst_policy).ok()?;
    schedule.next_after(period)
}

/// Identifies what the cursor refers to: a change of any part re-anchors the schedule. The
/// schedules' part; [`fingerprint_with`] adds the excluded days.
pub fn fingerprint(spec: &SingletonJobSpec) -> String {
    format!(
        "{}|{}|{}/{}",
        expressions(spec).join("; "),
        spec.time_zone.as_deref().unwrap_or("UTC"),
        spec.dst_policy.gap.name(),
        spec.dst_policy.fold.name()
    )
}

/// [`fingerprint`] with the digest of the schedule's excluded days, if it has any: an edit of
/// the exclusions or of a calendar applies from when it is seen, as a schedule edit does.
pub fn fingerprint_with(spec: &SingletonJobSpec, schedule: &Schedule) -> String {
    let fp = fingerprint(spec);
    match schedule.exclusions_digest() {
        Some(digest) => format!("{fp}|x:{digest}"),
        None => fp,
    }
}

/// The schedule a [`fingerprint`] was made of, if it can be read back (the schedule before an
/// edit, so its waiting periods can be recorded). Excluded days are not read back: the periods
/// recorded are those of the schedules alone.
pub fn fingerprinted(fp: &str) -> Option<Schedule> {
    let fp = match fp.rsplit_once('|') {
        Some((rest, digest)) if digest.starts_with("x:") => rest,
        _ => fp,
    };
    let mut parts = fp.rsplitn(3, '|');
    let (policy, tz, expr) = (parts.next()?, parts.next()?, parts.next()?);
    let (gap, fold) = policy.split_once('/')?;
    let dst = DstPolicy {
        gap: GapPolicy::from_name(gap)?,
        fold: FoldPolicy::from_name(fold)?,
    };
    let exprs: Vec<&str> = expr.split("; ").collect();
    Schedule::parse_all(&exprs, Some(tz), dst).ok()
}

/// Decides what to do now. `status_*` are the relevant parts of the current status.
pub fn plan(
    spec: &SingletonJobSpec,
    schedule: &Schedule,
    decided_through: Option<Timestamp>,
    status_fingerprint: Option<&str>,
    active: &[RunRef],
    obs: &Observed<'_>,
) -> Plan {
    let fp = fingerprint_with(spec, schedule);
    let mut plan = Plan {
        fingerprint: fp.clone(),
        ..Plan::default()
    };
    let mut records = Records::default();
    let cursor = cursor(decided_through, status_fingerprint, &fp, obs, &mut records);
    sort_runs(active, obs, &mut plan);
    mark_late(spec, obs.now, &mut plan);
    plan.consecutive_failures =
        consecutive_failures(spec, obs.consecutive_failures, &plan.finished);
    plan.suspend = suspend_after_failures(spec, plan.consecutive_failures);

    // When "now" itself is in doubt nothing is decided, not even which periods are late: a clock
    // running ahead would otherwise record future periods as missed (or a schedule edit's
    // waiting periods as skipped: that too waits for a trusted clock).
    if obs.blocked == Some(Waiting::ClockUntrusted) {
        plan.waiting = Some(Waiting::ClockUntrusted);
        plan.decided_through = Some(decided_through.unwrap_or(obs.created));
        plan.fingerprint = status_fingerprint.map_or(fp, str::to_string);
        return plan;
    }

    // A jittered period may start as late as the end of its window: deadlines count from there.
    let window = SignedDuration::from_secs(i64::from(spec.jitter_window()));
    // Within the CRD's bounds, also for an object that bypassed them (hostile input must not
    // overflow an instant, nor a negative deadline walk every period since 1970).
    let deadline = spec
        .starting_deadline_seconds
        .map(|s| SignedDuration::from_secs(s.clamp(1, crate::api::MAX_STARTING_DEADLINE_SECONDS)))
        .or((spec.catch_up == CatchUp::None).then_some(CATCH_UP_NONE_GRACE))
        .map(|d| d + window);
    let mut pending = Pending {
        spec,
        schedule,
        obs,
        cursor,
        records,
        suspending: plan.suspend,
    };
    // maxRuns reached: no period is due, none recorded, until it is raised (as endAt passed).
    let exhausted = runs_exhausted(spec, obs.run_count);
    if !exhausted {
        pending.skip_paused();
        pending.past_deadline(deadline);
        pending.skip_excluded();
        if let Some(candidate) = pending.candidate() {
            pending.decide(candidate, deadline, &mut plan);
        }
    }
    let Pending {
        cursor, records, ..
    } = pending;
    plan.decided_through = Some(cursor);
    plan.records = records.into_vec();
    with_suspension_reason(spec, &mut plan.records);
    if !exhausted {
        plan.wake_at = next_look(schedule, obs.now, cursor, &plan);
    }
    // A suspension with an end is looked at when it ends (and is lifted then).
    if let Some(until) = spec.suspended_until().filter(|u| *u > obs.now) {
        plan.wake_at = Some(plan.wake_at.map_or(until, |w| w.min(until)));
    }
    if let Some(at) = next_completion_deadline(spec, &plan.still_active) {
        plan.wake_at = Some(plan.wake_at.map_or(at, |w| w.min(at)));
    }
    plan
}

/// When a run's period must have succeeded by (`completionDeadlineSeconds` after its instant).
pub fn completion_deadline(spec: &SingletonJobSpec, run: &RunRef) -> Option<Timestamp> {
    let seconds = spec.completion_deadline_seconds?;
    run.period
        .0
        .checked_add(SignedDuration::from_secs(seconds))
        .ok()
}

/// Runs not succeeded by their completion deadline are late: the active ones are marked (and
/// listed in `plan.late` the first time), a finished one is late if it finished after it.
fn mark_late(spec: &SingletonJobSpec, now: Timestamp, plan: &mut Plan) {
    for run in &mut plan.still_active {
        if !run.late && completion_deadline(spec, run).is_some_and(|d| d <= now) {
            run.late = true;
            plan.late.push(run.clone());
        }
    }
    for (run, _, at) in &mut plan.finished {
        if completion_deadline(spec, run).is_some_and(|d| d < *at) {
            run.late = true;
        }
    }
}

/// The earliest completion deadline of an active run not yet late: look again then.
fn next_completion_deadline(spec: &SingletonJobSpec, active: &[RunRef]) -> Option<Timestamp> {
    active
        .iter()
        .filter(|r| !r.late)
        .filter_map(|r| completion_deadline(spec, r))
        .min()
}

/// `status.consecutiveFailures` after the finished runs, in the order they finished: a failure
/// adds one, a success starts again at zero. While suspended it stays zero, so that resuming
/// starts the count again.
pub fn consecutive_failures(
    spec: &SingletonJobSpec,
    before: i32,
    finished: &[(RunRef, Outcome, Timestamp)],
) -> i32 {
    if spec.suspend.unwrap_or(false) {
        return 0;
    }
    let mut by_time: Vec<&(RunRef, Outcome, Timestamp)> = finished.iter().collect();
    by_time.sort_by_key(|(_, _, at)| *at);
    by_time
        .iter()
        .fold(before, |n, (_, outcome, _)| match outcome {
            Outcome::Failed => n.saturating_add(1),
            Outcome::Succeeded => 0,
            _ => n,
        })
}

/// Whether `suspendAfterConsecutiveFailures` suspends the SingletonJob now.
pub fn suspend_after_failures(spec: &SingletonJobSpec, consecutive_failures: i32) -> bool {
    !spec.suspend.unwrap_or(false)
        && spec
            .suspend_after_consecutive_failures
            .is_some_and(|n| consecutive_failures >= n)
}

/// Where pending periods begin. A new SingletonJob starts at its creation; a changed schedule
/// starts at the time the change is seen, so an edit never fires periods retroactively. The old
/// schedule's periods that were still waiting (Forbid, suspended, the backstop or the clock, or
/// missed while no controller ran) never run: they are recorded as such (G2).
fn cursor(
    decided_through: Option<Timestamp>,
    status_fingerprint: Option<&str>,
    fp: &str,
    obs: &Observed<'_>,
    records: &mut Records,
) -> Timestamp {
    let now = obs.now;
    match (decided_through, status_fingerprint) {
        (Some(c), Some(f)) if f == fp => c,
        (Some(c), f) => {
            if let Some(old) = f.and_then(fingerprinted)
                && let Some(last) = old.latest_at_or_before(now).filter(|l| *l > c)
            {
                let first = old.next_after(c).unwrap_or(last);
                let count = old.count_between(c, last, u64::MAX);
                let why = reason::SCHEDULE_CHANGED;
                records.push_range(first, last, count, Outcome::Skipped, why, now);
            }
            c.max(now)
        }
        (None, _) => obs.created,
    }
}

/// The Job states with every finished run held as still active: with a backstop under
/// `Correctness` a run's outcome is recorded only once its token's retirement is written (G3),
/// so while the backstop cannot be written a finished run stays in `active` (Forbid waits for
/// it, and nothing about it is recorded) instead of being recorded with its token still
/// accepted by the fence, which nothing would retire later (F3).
pub fn hold_outcomes(states: &HashMap<String, JobState>) -> HashMap<String, JobState> {
    states
        .keys()
        .map(|name| (name.clone(), JobState::Active))
        .collect()
}

/// Runs that finished since the last look, and those still active.
fn sort_runs(active: &[RunRef], obs: &Observed<'_>, plan: &mut Plan) {
    for run in active {
        match obs
            .job_states
            .get(&run.job_name)
            .copied()
            .unwrap_or(JobState::Active)
        {
            JobState::Active => plan.still_active.push(run.clone()),
            JobState::Succeeded(at) => plan.finished.push((run.clone(), Outcome::Succeeded, at)),
            JobState::Failed(at) => plan.finished.push((run.clone(), Outcome::Failed, at)),
            JobState::Gone => plan.finished.push((run.clone(), Outcome::Failed, obs.now)),
        }
    }
}

/// The pending periods (after `cursor`, at or before now) being decided, and the records made.
struct Pending<'a> {
    spec: &'a SingletonJobSpec,
    schedule: &'a Schedule,
    obs: &'a Observed<'a>,
    /// Every period at or before this is decided.
    cursor: Timestamp,
    records: Records,
    /// Being suspended by `suspendAfterConsecutiveFailures`: as if suspended already.
    suspending: bool,
}

impl Pending<'_> {
    /// Whether periods due now are held by a suspension: `suspend` (one with an end holds only
    /// until `suspension.until`; [`Pending::skip_paused`] decided the periods before it), or
    /// `suspendAfterConsecutiveFailures` about to suspend.
    fn suspended(&self) -> bool {
        let until = self.spec.suspended_until();
        let held = self.spec.suspend.unwrap_or(false) && until.is_none_or(|u| self.obs.now < u);
        held || self.suspending
    }

    /// Step 0: under a suspension with an end (`suspension.until`), the pending periods before
    /// that end are Skipped (reason Suspended) now: planned as a freeze, they never start late,
    /// whatever `catchUp` says; the thaw runs only what falls due after it.
    fn skip_paused(&mut self) {
        let Some(until) = self.spec.suspended_until() else {
            return;
        };
        let Ok(before_end) = until.checked_sub(SignedDuration::from_nanos(1)) else {
            return;
        };
        let limit = self.obs.now.min(before_end);
        if let Some(last) = self
            .schedule
            .latest_at_or_before(limit)
            .filter(|l| *l > self.cursor)
        {
            self.push_periods(last, Outcome::Skipped, reason::SUSPENDED);
        }
    }

    /// Step 1: periods past the deadline, one folded record however many (no "too many missed"
    /// cliff).
    fn past_deadline(&mut self, deadline: Option<SignedDuration>) {
        let now = self.obs.now;
        // Periods at or before this instant can no longer start. A deadline reaching before
        // the calendar's first instant (a hostile startingDeadlineSeconds) has no such period.
        let Some(limit) = deadline
            .and_then(|d| now.checked_sub(d).ok())
            .filter(|l| *l > self.cursor)
        else {
            return;
        };
        let Some(last) = self
            .schedule
            .latest_at_or_before(limit)
            .filter(|l| *l > self.cursor)
        else {
            return;
        };
        let (outcome, why) = if self.suspended() {
            (Outcome::Skipped, reason::SUSPENDED)
        } else if self.obs.blocked == Some(Waiting::BackstopUnavailable) {
            (Outcome::Missed, reason::BACKSTOP_UNAVAILABLE)
        } else {
            (Outcome::Missed, reason::DEADLINE_EXCEEDED)
        };
        self.push_periods(last, outcome, why);
    }

    /// Step 1b: periods on excluded days at the head of the pending ones are decided now, as
    /// Skipped (reason Excluded); one behind a waiting period is decided after it.
    fn skip_excluded(&mut self) {
        if !self.schedule.has_exclusions() {
            return;
        }
        let now = self.obs.now;
        while let Some(at) = self
            .schedule
            .next_after(self.cursor)
            .filter(|at| *at <= now && self.schedule.excluded(*at))
        {
            let why = reason::EXCLUDED;
            self.records
                .push_range(at, at, 1, Outcome::Skipped, why, now);
            self.cursor = at;
        }
    }

    /// Records the periods after the cursor up to `last` with an outcome and moves the cursor
    /// there; those on excluded days are Skipped, reason Excluded, whatever befell the others.
    fn push_periods(&mut self, last: Timestamp, outcome: Outcome, why: &str) {
        let now = self.obs.now;
        if !self.schedule.has_exclusions() {
            let first = self.schedule.next_after(self.cursor).unwrap_or(last);
            let count = self.schedule.count_between(self.cursor, last, u64::MAX);
            self.records
                .push_range(first, last, count, outcome, why, now);
        } else {
            // Consecutive periods alike (excluded or not) are one record.
            let mut group: Option<(Timestamp, Timestamp, u64, bool)> = None;
            let periods = self.schedule.iter_after(self.cursor);
            for at in periods.take_while(|at| *at <= last) {
                let excluded = self.schedule.excluded(at);
                match &mut group {
                    Some((_, end, count, e)) if *e == excluded => (*end, *count) = (at, *count + 1),
                    _ => {
                        if let Some(g) = group.replace((at, at, 1, excluded)) {
                            self.records.push_group(g, outcome, why, now);
                        }
                    }
                }
            }
            if let Some(g) = group {
                self.records.push_group(g, outcome, why, now);
            }
        }
        self.cursor = last;
    }

    /// Step 2: of the periods still within the deadline, the candidate to start now; the ones
    /// before it that the catch-up mode will never start are recorded now.
    fn candidate(&mut self) -> Option<Timestamp> {
        let now = self.obs.now;
        let mut newest = self
            .schedule
            .latest_at_or_before(now)
            .filter(|n| *n > self.cursor)?;
        let oldest = self.schedule.next_after(self.cursor)?;
        // The newest that may run: `skip_excluded` left the oldest pending period allowed.
        while self.schedule.excluded(newest) && newest > oldest {
            newest = self
                .schedule
                .latest_at_or_before(newest - SignedDuration::from_nanos(1))
                .unwrap_or(oldest);
        }
        if self.spec.catch_up == CatchUp::All {
            self.cap_catch_up(newest);
            // The cap may have left an excluded period at the head.
            self.skip_excluded();
            return self
                .schedule
                .next_after(self.cursor)
                .filter(|o| *o <= newest);
        }
        if newest <= oldest {
            return Some(newest);
        }
        let before = newest - SignedDuration::from_nanos(1);
        let last_older = self.schedule.latest_at_or_before(before).unwrap_or(oldest);
        let (outcome, why) = match (self.suspended(), self.spec.catch_up) {
            (true, _) => (Outcome::Skipped, reason::SUSPENDED),
            (false, CatchUp::None) => (Outcome::Missed, reason::CATCH_UP_NONE),
            (false, _) => (Outcome::Missed, reason::SUPERSEDED),
        };
        self.push_periods(last_older, outcome, why);
        Some(newest)
    }

    /// catchUp All starts at most `catchUpLimit` late periods, the newest ones (counted back from
    /// `newest`, so the work is bounded by the limit, not by how long the job waited); the
    /// pending periods before them are recorded as Missed, reason CatchUpLimit.
    fn cap_catch_up(&mut self, newest: Timestamp) {
        let cursor = self.cursor;
        let before = |t: Timestamp| {
            self.schedule
                .latest_at_or_before(t - SignedDuration::from_nanos(1))
                .filter(|p| *p > cursor)
        };
        let mut first_kept = newest;
        for _ in 1..self.spec.catch_up_limit() {
            match before(first_kept) {
                Some(p) => first_kept = p,
                None => return,
            }
        }
        if let Some(last_dropped) = before(first_kept) {
            self.push_periods(last_dropped, Outcome::Missed, reason::CATCH_UP_LIMIT);
        }
    }

    /// Why concurrency keeps the candidate from starting, if it does: Forbid with a run active,
    /// or Allow with `maxActive` runs active. (Replace replaces them.)
    fn concurrency_block(&self, plan: &Plan) -> Option<(Waiting, &'static str)> {
        let active = plan.still_active.len();
        match self.spec.concurrency_policy {
            ConcurrencyPolicy::Forbid if active > 0 => {
                Some((Waiting::ConcurrencyForbid, reason::CONCURRENCY_FORBID))
            }
            ConcurrencyPolicy::Allow if active >= self.spec.max_active() => {
                Some((Waiting::MaxActive, reason::MAX_ACTIVE))
            }
            _ => None,
        }
    }

    /// Step 3: start the candidate, or say why it waits, or decide it now when it never will
    /// (catchUp None); look again when its deadline passes.
    fn decide(&mut self, candidate: Timestamp, deadline: Option<SignedDuration>, plan: &mut Plan) {
        let (spec, now) = (self.spec, self.obs.now);
        let concurrency = self.concurrency_block(plan);
        let never = spec.catch_up == CatchUp::None;
        if self.suspended() {
            if never {
                // Resuming will never start it: decide it now.
                let why = reason::SUSPENDED;
                self.records
                    .push_range(candidate, candidate, 1, Outcome::Skipped, why, now);
                self.cursor = candidate;
            } else {
                plan.waiting = Some(Waiting::Suspended);
            }
        } else if let Some((waiting, why)) = concurrency {
            if never {
                self.records
                    .push_range(candidate, candidate, 1, Outcome::Skipped, why, now);
                self.cursor = candidate;
            } else {
                plan.waiting = Some(waiting);
            }
        } else if let Some(why) = self.obs.blocked {
            plan.waiting = Some(why);
        } else {
            // Never before its instant (G4): candidate <= latest_at_or_before(now) <= now.
            debug_assert!(candidate <= now);
            let window = spec.jitter_window();
            let start_at = candidate + crate::schedule::jitter(self.obs.key, candidate, window);
            if start_at <= now {
                plan.start = Some(candidate);
                if spec.concurrency_policy == ConcurrencyPolicy::Replace {
                    plan.replace = plan.still_active.clone();
                }
            } else {
                // Due, but its jitter offset has not passed.
                plan.wake_at = Some(start_at);
            }
        }
        // Look again when the candidate's deadline passes (it will be recorded then).
        if plan.start.is_none()
            && let Some(d) = deadline
        {
            let at = candidate + d + SignedDuration::from_millis(1);
            plan.wake_at = Some(plan.wake_at.map_or(at, |w| w.min(at)));
        }
    }
}

/// Next look: the next scheduled instant after now, or a deadline the plan set earlier (a later
/// period may also already be pending behind a started one: then look again right away).
fn next_look(
    schedule: &Schedule,
    now: Timestamp,
    cursor: Timestamp,
    plan: &Plan,
) -> Option<Timestamp> {
    let next = schedule.next_after(now.max(cursor));
    let pending_behind_start = plan
        .start
        .is_some_and(|s| s < schedule.latest_at_or_before(now).unwrap_or(s));
    match (plan.wake_at, next) {
        _ if pending_behind_start => Some(now),
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The user's reason for a suspension (`suspension`) on the periods it skipped, for the history
/// and its Events: "suspended until ..., by ...: finance freeze".
fn with_suspension_reason(spec: &SingletonJobSpec, records: &mut [HistoryEntry]) {
    let Some(s) = spec
        .suspension
        .as_ref()
        .filter(|_| spec.suspend.unwrap_or(false))
    else {
        return;
    };
    let note = match s.note() {
        said if said.is_empty() => "suspended".to_string(),
        said => format!("suspended {said}"),
    };
    for e in records.iter_mut() {
        if e.reason.as_deref() == Some(reason::SUSPENDED) {
            e.message = Some(note.clone());
        }
    }
}

/// Folds consecutive records with the same outcome and reason into one range entry.
#[derive(Default)]
struct Records(Vec<HistoryEntry>);

impl Records {
    fn push_range(
        &mut self,
        first: Timestamp,
        last: Timestamp,
        count: u64,
        outcome: Outcome,
        why: &str,
        now: Timestamp,
    ) {
        if count == 0 {
            return;
        }
        if let Some(prev) = self.0.last_mut()
            && prev.outcome == outcome
            && prev.reason.as_deref() == Some(why)
        {
            prev.last_period = Some(last.into());
            prev.count += count;
            return;
        }
        self.0.push(HistoryEntry {
            unknown: Default::default(),
            late: false,
            period: first.into(),
            last_period: (count > 1 || first != last).then(|| last.into()),
            count,
            outcome,
            reason: Some(why.to_string()),
            job_name: None,
            token: None,
            start_time: None,
            finish_time: Some(now.into()),
            requested_by: None,
            cluster: None,
            message: None,
        });
    }

    /// A group of consecutive periods from `push_periods`: (first, last, count, excluded).
    fn push_group(
        &mut self,
        (first, last, count, excluded): (Timestamp, Timestamp, u64, bool),
        outcome: Outcome,
        why: &str,
        now: Timestamp,
    ) {
        if excluded {
            self.push_range(first, last, count, Outcome::Skipped, reason::EXCLUDED, now);
        } else {
            self.push_range(first, last, count, outcome, why, now);
        }
    }

    fn into_vec(self) -> Vec<HistoryEntry> {
        self.0
    }
}

pub mod bounds;
pub mod notify;
pub mod ops;
pub mod prepare;
pub mod repair;
pub mod rerun;

pub use bounds::runs_exhausted;

#[cfg(test)]
mod tests;
