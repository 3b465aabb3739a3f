//! Prepared runs (docs/design/prepared-runs.md, issue 33): what becomes of `status.prepared`, a
//! run claimed, created suspended and confirmed ahead of its instant and resumed at `resumeAt`.
//!
//! [`judge`] decides, from the spec, the status, what is known of the prepared Job and the time,
//! whether the run is kept until its instant, resumed now, promoted (it was resumed), stopped
//! (someone else started it) or withdrawn, and why. At or after `resumeAt` it asks
//! [`super::plan`] what the status *without* the prepared run would decide, so a prepared period
//! is decided exactly as it would have been without preparation (design §3.2): it is resumed only
//! when the plan would start it now, and every other answer withdraws it, leaving the period to
//! the ordinary decision (its cursor never moved). [`basis`] names what the run was decided and
//! built from, so that an edit of either withdraws it.
//!
//! Pure, as the rest of `decide/` is: no I/O and no clock read. The caller passes the earliest
//! time the API server's clock may show (`obs.now`) and what it knows of the Job (a [`JobMark`]),
//! so every rule, the never-early bound (G4) above all, is tested with fixed instants and by
//! property tests, and every replica judges the same inputs the same way.

pub mod lead;

use std::fmt::Write as _;

use jiff::{SignedDuration, Timestamp};
use sha2::{Digest, Sha256};

use super::{
    JobState, Observed, Plan, Waiting, consecutive_failures, fingerprint_with, plan, reason,
    runs_exhausted, suspend_after_failures,
};
use crate::api::{
    BackstopKind, CompletionDeadlinePolicy, LockPurpose, Outcome, RunRef, SingletonJobSpec,
    SingletonJobStatus,
};
use crate::schedule::Schedule;

/// What decide/ may know of a prepared run's Job (from the owned Jobs, a 404 confirmed by a GET).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobMark {
    /// The API server says the Job does not exist (confirmed, not merely absent from a cache).
    Missing,
    /// Suspended, `singleton.dev/released: "false"`: prepared and not resumed.
    NotReleased,
    /// Released by its resume (`singleton.dev/released: <token>`): it runs.
    Released,
    /// Marked withdrawn (`singleton.dev/released: withdrawn`, `singleton.dev/withdrawn: <reason>`)
    /// by this or another replica: the withdrawal goes on from its next step.
    Withdrawn(WithdrawReason),
    /// Not suspended although never released: someone other than the controller started it.
    StartedOutside,
}

/// Why a prepared run was withdrawn. Names are metric labels and Event reasons (CamelCase via
/// [`WithdrawReason::name`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WithdrawReason {
    /// `suspend` set (or a `suspension` covering the period, or
    /// `suspendAfterConsecutiveFailures` reached).
    Suspended,
    /// The schedule, time zone, DST policy, exclusions or a named calendar changed.
    ScheduleChanged,
    /// What the Job was built from changed: `jobTemplate`, the completion deadline, the backstop,
    /// `lock.purpose`, `startAt`/`endAt`.
    SpecChanged,
    /// The SingletonJob was deleted.
    Deleted,
    /// concurrencyPolicy Forbid and a run was active at the instant.
    ConcurrencyForbid,
    /// concurrencyPolicy Allow and `maxActive` runs were active at the instant.
    MaxActive,
    /// `maxRuns` was lowered to the runs counted without this one.
    MaxRuns,
    /// The lock was broken (`kubectl singleton break-lock`).
    LockBroken,
    /// A manual run (trigger, backfill, rerun, repair) or a newer period came first.
    Superseded,
    /// `lock.purpose: Correctness` and the backstop could not be written.
    BackstopUnavailable,
    /// The period could no longer start by its deadline (an outage, `catchUp: None`).
    DeadlineExceeded,
    /// The Job was deleted before the instant.
    JobDeleted,
    /// The status no longer names the run's token, or has decided its period: it was wiped or
    /// restored, or an older release led meanwhile.
    StatusBehind,
    /// The preparation itself was refused before its Job was confirmed: the Job's name was
    /// taken (a deleted SingletonJob's Job not yet collected), the API server rejected the Job,
    /// or the backstop held the period's claim. Nothing is decided: the period runs at its
    /// instant as without preparation.
    Refused,
}

impl WithdrawReason {
    /// Every reason, in declaration order (metrics initialise a series per reason).
    pub const ALL: [WithdrawReason; 14] = [
        WithdrawReason::Suspended,
        WithdrawReason::ScheduleChanged,
        WithdrawReason::SpecChanged,
        WithdrawReason::Deleted,
        WithdrawReason::ConcurrencyForbid,
        WithdrawReason::MaxActive,
        WithdrawReason::MaxRuns,
        WithdrawReason::LockBroken,
        WithdrawReason::Superseded,
        WithdrawReason::BackstopUnavailable,
        WithdrawReason::DeadlineExceeded,
        WithdrawReason::JobDeleted,
        WithdrawReason::StatusBehind,
        WithdrawReason::Refused,
    ];

    /// The metric label, Event reason and Job annotation value: the variant's name.
    pub fn name(self) -> &'static str {
        match self {
            WithdrawReason::Suspended => "Suspended",
            WithdrawReason::ScheduleChanged => "ScheduleChanged",
            WithdrawReason::SpecChanged => "SpecChanged",
            WithdrawReason::Deleted => "Deleted",
            WithdrawReason::ConcurrencyForbid => "ConcurrencyForbid",
            WithdrawReason::MaxActive => "MaxActive",
            WithdrawReason::MaxRuns => "MaxRuns",
            WithdrawReason::LockBroken => "LockBroken",
            WithdrawReason::Superseded => "Superseded",
            WithdrawReason::BackstopUnavailable => "BackstopUnavailable",
            WithdrawReason::DeadlineExceeded => "DeadlineExceeded",
            WithdrawReason::JobDeleted => "JobDeleted",
            WithdrawReason::StatusBehind => "StatusBehind",
            WithdrawReason::Refused => "Refused",
        }
    }

    /// The reason a [`WithdrawReason::name`] names (the Job annotation read back).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.name() == s)
    }

    /// What happened, for an Event: "prepared run ... withdrawn: `<this>`; ...".
    pub fn says(self) -> &'static str {
        match self {
            WithdrawReason::Suspended => "spec.suspend set",
            WithdrawReason::ScheduleChanged => "the schedule changed",
            WithdrawReason::SpecChanged => {
                "the spec its Job was built from changed (jobTemplate, completion deadline, backstop, lock or startAt/endAt)"
            }
            WithdrawReason::Deleted => "the SingletonJob was deleted",
            WithdrawReason::ConcurrencyForbid => {
                "a run was still active at its instant (concurrencyPolicy Forbid)"
            }
            WithdrawReason::MaxActive => "maxActive runs were active at its instant",
            WithdrawReason::MaxRuns => "maxRuns was reached",
            WithdrawReason::LockBroken => "the lock was broken",
            WithdrawReason::Superseded => "a manual run or a newer period came first",
            WithdrawReason::BackstopUnavailable => "the backstop database was unavailable",
            WithdrawReason::DeadlineExceeded => "it could no longer start by its deadline",
            WithdrawReason::JobDeleted => "its Job was deleted before its instant",
            WithdrawReason::StatusBehind => {
                "the status no longer names its token or has decided its period (wiped, restored, or written by an older release)"
            }
            WithdrawReason::Refused => "its preparation was refused before its Job was confirmed",
        }
    }

    /// Whether its Event is a Warning (something went wrong) rather than Normal (the user's edit,
    /// deletion, trigger or break-lock, or the schedule's own rules).
    pub fn warning(self) -> bool {
        matches!(
            self,
            WithdrawReason::BackstopUnavailable
                | WithdrawReason::JobDeleted
                | WithdrawReason::StatusBehind
                | WithdrawReason::DeadlineExceeded
                | WithdrawReason::Refused
        )
    }
}

/// What to do with `status.prepared` now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Leave it prepared; judge again at `until` (or on any change).
    Keep { until: Timestamp },
    /// Resume its Job now: the plan without preparation would start its period now.
    Resume,
    /// Its Job was resumed (or is gone after its instant): move it to `active`.
    Promote,
    /// Someone else started its Job: stop it as a run started outside the protocol.
    Stop,
    /// Withdraw it (design §3.3), saying why.
    Withdraw(WithdrawReason),
}

/// Hex digits kept of each hash in a [`basis`] (64 bits each).
const SHORT_HASH_BYTES: usize = 8;

/// What a prepared run was decided and built from: `fp:<short hash>/spec:<short hash>`. `fp` is
/// the hash of [`fingerprint_with`] (schedules, time zone, DST policy, exclusions and calendars:
/// what the cursor refers to); `spec` is the hash of what the Job was built from that the plan
/// cannot see: the `jobTemplate` (as JSON, keys sorted), `completionDeadlineSeconds` and
/// `completionDeadlinePolicy`, the backstop (kind, Secret, table prefix, `jobKey`), the effective
/// `lock.purpose`, `startAt` and `endAt`. SHA-256 over a canonical text, so every replica and
/// every release computes the same basis; history limits, `notify`, `suspend` and
/// `concurrencyPolicy` do not move it (the plan judges those at the instant).
pub fn basis(spec: &SingletonJobSpec, schedule: &Schedule) -> String {
    let fp = short_hash(fingerprint_with(spec, schedule).as_bytes());
    let built = short_hash(spec_text(spec).as_bytes());
    format!("fp:{fp}/spec:{built}")
}

/// Which part of two bases differs: None if equal; [`WithdrawReason::ScheduleChanged`] if the
/// `fp` parts differ (or either cannot be read), else [`WithdrawReason::SpecChanged`].
pub fn basis_change(recorded: &str, now: &str) -> Option<WithdrawReason> {
    if recorded == now {
        return None;
    }
    match (parts(recorded), parts(now)) {
        (Some((a, _)), Some((b, _))) if a == b => Some(WithdrawReason::SpecChanged),
        _ => Some(WithdrawReason::ScheduleChanged),
    }
}

/// What to do with `status.prepared` (`prepared`) now. `obs.now` is the EARLIEST time the API
/// server's clock may show (the caller's clock's lower bound), `obs.run_count` is
/// `status.runCount`, which includes the prepared run. `job` is what is known of its Job.
///
/// In order (design §3.2): the Job's mark; P2 and the cursor; the basis; a missing Job;
/// suspension and `maxRuns`; the backstop and the clock; before `resumeAt` keep; at or after
/// it, the plan without the prepared run decides. Never [`Verdict::Resume`] before `resumeAt`.
pub fn judge(
    spec: &SingletonJobSpec,
    schedule: &Schedule,
    status: &SingletonJobStatus,
    prepared: &RunRef,
    obs: &Observed<'_>,
    job: JobMark,
) -> Verdict {
    use WithdrawReason as W;

    // (0) A Job gone once its instant came may have been resumed, and run: promoted (recorded
    // as a Job gone), never withdrawn and its period run again (G1), whatever changed since.
    let came = prepared.resume_at.as_ref().is_some_and(|r| obs.now >= r.0);
    if job == JobMark::Missing && came {
        return Verdict::Promote;
    }

    // (1) to (3): the Job's mark, the status and the basis.
    let resume_at = match settled_before_the_plan(spec, schedule, status, prepared, job) {
        Ok(resume_at) => resume_at,
        Err(verdict) => return verdict,
    };
    let period = prepared.period.0;

    // (4) A Job gone before the instant never ran; after it, it may have: the promote records
    // it (as a Job gone from `active` is).
    if job == JobMark::Missing {
        return if obs.now < resume_at {
            Verdict::Withdraw(W::JobDeleted)
        } else {
            Verdict::Promote
        };
    }

    // (5) Suspension, judged at the instant, and `maxRuns` with this run's count given back.
    if suspended_at(spec, status, obs, period) {
        return Verdict::Withdraw(W::Suspended);
    }
    let without = Observed {
        run_count: obs.run_count.saturating_sub(1),
        // When `Observed` learns of the prepared run (design §1.3), this copy must not name it:
        // the plan is asked about the status WITHOUT the prepared run.
        ..obs.clone()
    };
    if runs_exhausted(spec, without.run_count) {
        return Verdict::Withdraw(W::MaxRuns);
    }

    // (6) The backstop cannot record what the run needs; an untrusted clock decides nothing.
    match obs.blocked {
        Some(Waiting::BackstopUnavailable) => return Verdict::Withdraw(W::BackstopUnavailable),
        Some(Waiting::ClockUntrusted) => return Verdict::Keep { until: resume_at },
        _ => {}
    }

    // (7) Never before its instant (G4).
    if obs.now < resume_at {
        return Verdict::Keep { until: resume_at };
    }

    // (8) The decision without preparation.
    let plan = plan(
        spec,
        schedule,
        status.decided_through.as_ref().map(|t| t.0),
        status.schedule_fingerprint.as_deref(),
        &status.active,
        &without,
    );
    from_plan(&plan, period, resume_at)
}

/// Steps 1 to 3 of [`judge`]: a verdict settled by the Job's mark, the status or the basis
/// alone; else the run's `resumeAt`.
fn settled_before_the_plan(
    spec: &SingletonJobSpec,
    schedule: &Schedule,
    status: &SingletonJobStatus,
    prepared: &RunRef,
    job: JobMark,
) -> Result<Timestamp, Verdict> {
    use WithdrawReason as W;

    // (1) What the Job says happened already wins: it was resumed, another replica began its
    // withdrawal, or someone started it.
    match job {
        JobMark::Released => return Err(Verdict::Promote),
        JobMark::Withdrawn(why) => return Err(Verdict::Withdraw(why)),
        JobMark::StartedOutside => return Err(Verdict::Stop),
        JobMark::Missing | JobMark::NotReleased => {}
    }

    // (2) P2 and the cursor: a later token, a decided period, or a run this release's
    // preparation did not write (no instant, no basis, a manual origin) is stale.
    let (Some(resume_at), Some(recorded)) = (
        prepared.resume_at.as_ref().map(|t| t.0),
        prepared.basis.as_deref().filter(|b| parts(b).is_some()),
    ) else {
        return Err(Verdict::Withdraw(W::StatusBehind));
    };
    let decided = status
        .decided_through
        .as_ref()
        .is_some_and(|c| c.0 >= prepared.period.0);
    if prepared.token != status.fencing_token || decided || prepared.origin.is_some() {
        return Err(Verdict::Withdraw(W::StatusBehind));
    }

    // (3) The basis: the schedule or what the Job was built from changed.
    match basis_change(recorded, &basis(spec, schedule)) {
        Some(why) => Err(Verdict::Withdraw(why)),
        None => Ok(resume_at),
    }
}

/// Step 8 of [`judge`]: what the plan without the prepared run says of its period.
fn from_plan(plan: &Plan, period: Timestamp, resume_at: Timestamp) -> Verdict {
    use WithdrawReason as W;
    let keep = Verdict::Keep {
        until: plan.wake_at.unwrap_or_else(|| {
            resume_at
                .checked_add(SignedDuration::from_secs(1))
                .unwrap_or(resume_at)
        }),
    };
    if plan.start == Some(period) {
        // Under Replace the active runs go first (fenced, their Jobs deleted): the prepared Job
        // may not start beside them. Withdrawn, the period is claimed again, replacing.
        return if plan.replace.is_empty() {
            Verdict::Resume
        } else {
            Verdict::Withdraw(W::Superseded)
        };
    }
    // The period was decided without a run: it is not to run now, whatever else waits.
    if let Some(entry) = plan.records.iter().find(|e| covers(e, period)) {
        return Verdict::Withdraw(recorded_reason(entry.reason.as_deref()));
    }
    match plan.waiting {
        Some(Waiting::ClockUntrusted | Waiting::JobTemplateInvalid) => return keep,
        Some(Waiting::Suspended) => return Verdict::Withdraw(W::Suspended),
        Some(Waiting::ConcurrencyForbid) => return Verdict::Withdraw(W::ConcurrencyForbid),
        Some(Waiting::MaxActive) => return Verdict::Withdraw(W::MaxActive),
        Some(Waiting::BackstopUnavailable) => return Verdict::Withdraw(W::BackstopUnavailable),
        None => {}
    }
    if plan.start.is_some() {
        // Another period goes first (an older one under catchUp All).
        return Verdict::Withdraw(W::Superseded);
    }
    if plan.decided_through.is_some_and(|c| c >= period) {
        // The cursor passed the period without a run or a record: only a schedule change
        // (the status's fingerprint is not the spec's) moves it so.
        return Verdict::Withdraw(W::ScheduleChanged);
    }
    // Nothing due yet (a jitter offset moved later): look again when the plan says.
    keep
}

/// Whether a history record of the plan covers `period`.
fn covers(entry: &crate::api::HistoryEntry, period: Timestamp) -> bool {
    let first = entry.period.0;
    let last = entry.last_period.as_ref().map_or(first, |t| t.0);
    first <= period && period <= last
}

/// The withdrawal reason for a period the plan recorded with `why`.
fn recorded_reason(why: Option<&str>) -> WithdrawReason {
    use WithdrawReason as W;
    match why.unwrap_or_default() {
        reason::SUSPENDED => W::Suspended,
        reason::CONCURRENCY_FORBID => W::ConcurrencyForbid,
        reason::MAX_ACTIVE => W::MaxActive,
        reason::DEADLINE_EXCEEDED | reason::CATCH_UP_NONE => W::DeadlineExceeded,
        reason::SCHEDULE_CHANGED | reason::EXCLUDED => W::ScheduleChanged,
        reason::BACKSTOP_UNAVAILABLE => W::BackstopUnavailable,
        // SUPERSEDED, CATCH_UP_LIMIT, and anything else: something else was decided first.
        _ => W::Superseded,
    }
}

/// Whether a suspension holds `period` at its instant, as the plan would judge it there
/// (`Pending::suspended` and `Pending::skip_paused`): `suspend` without an end, or with one
/// after the period (periods before `suspension.until` are Skipped, never run late); or
/// `suspendAfterConsecutiveFailures` reached with the runs that finished now.
fn suspended_at(
    spec: &SingletonJobSpec,
    status: &SingletonJobStatus,
    obs: &Observed<'_>,
    period: Timestamp,
) -> bool {
    let held = spec.suspend.unwrap_or(false) && spec.suspended_until().is_none_or(|u| period < u);
    let finished: Vec<(RunRef, Outcome, Timestamp)> = status
        .active
        .iter()
        .filter_map(|run| {
            let state = obs.job_states.get(&run.job_name).copied();
            match state.unwrap_or(JobState::Active) {
                JobState::Active => None,
                JobState::Succeeded(at) => Some((run.clone(), Outcome::Succeeded, at)),
                JobState::Failed(at) => Some((run.clone(), Outcome::Failed, at)),
                JobState::Gone => Some((run.clone(), Outcome::Failed, obs.now)),
            }
        })
        .collect();
    let failures = consecutive_failures(spec, obs.consecutive_failures, &finished);
    held || suspend_after_failures(spec, failures)
}

/// The two hashes of a basis, if it is one.
fn parts(basis: &str) -> Option<(&str, &str)> {
    let (fp, built) = basis.split_once('/')?;
    let fp = fp.strip_prefix("fp:").filter(|h| !h.is_empty())?;
    let built = built.strip_prefix("spec:").filter(|h| !h.is_empty())?;
    Some((fp, built))
}

/// The first [`SHORT_HASH_BYTES`] of the SHA-256 of `bytes`, in hex.
fn short_hash(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .take(SHORT_HASH_BYTES)
        .fold(String::new(), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

/// The canonical text of what a run's Job is built from besides the schedule: one `name=JSON`
/// line per field, in a fixed order, under a version line. Changing it moves every basis (and
/// withdraws every prepared run once, on upgrade): add a field only with a new version line.
fn spec_text(spec: &SingletonJobSpec) -> String {
    let mut out = String::from("singleton.dev/basis-spec/v1\n");
    let mut line = |name: &str, value: &str| {
        out.push_str(name);
        out.push('=');
        out.push_str(value);
        out.push('\n');
    };
    let text = |s: Option<&str>| s.map_or("null".to_string(), json_string);
    let time = |t: Option<Timestamp>| text(t.map(|t| t.to_string()).as_deref());

    let template = match serde_json::to_value(&spec.job_template) {
        Ok(v) => canonical_json(&v),
        // Not JSON (over the size limit): its error names its size; such a template never runs.
        Err(e) => format!("invalid:{}", json_string(&e.to_string())),
    };
    line("jobTemplate", &template);
    let seconds = spec.completion_deadline_seconds;
    line(
        "completionDeadlineSeconds",
        &seconds.map_or("null".to_string(), |s| s.to_string()),
    );
    let policy = match spec.completion_deadline_policy {
        CompletionDeadlinePolicy::Continue => "Continue",
        CompletionDeadlinePolicy::Stop => "Stop",
    };
    line("completionDeadlinePolicy", &json_string(policy));
    let backstop = spec.backstop.as_ref();
    let database = backstop.and_then(|b| b.database());
    let kind = database.map(|(kind, _, _)| match kind {
        BackstopKind::Postgres => "postgres",
        BackstopKind::Mysql => "mysql",
    });
    line("backstop.kind", &text(kind));
    line(
        "backstop.secret",
        &text(database.map(|(_, secret, _)| secret.name.as_str())),
    );
    line(
        "backstop.tablePrefix",
        &text(database.and_then(|(_, _, prefix)| prefix)),
    );
    line(
        "backstop.jobKey",
        &text(backstop.and_then(|b| b.job_key.as_deref())),
    );
    let purpose = match spec.lock.as_ref().map(|l| l.purpose).unwrap_or_default() {
        LockPurpose::Correctness => "Correctness",
        LockPurpose::Efficiency => "Efficiency",
    };
    line("lock.purpose", &json_string(purpose));
    line("startAt", &time(spec.start_at.as_ref().map(|t| t.0)));
    line("endAt", &time(spec.end_at.as_ref().map(|t| t.0)));
    out
}

/// A JSON string literal.
fn json_string(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// JSON with every object's keys sorted and no whitespace, whatever order the map keeps.
fn canonical_json(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(canonical_json).collect();
            format!("[{}]", items.join(","))
        }
        Value::Object(map) => {
            let mut fields: Vec<(&String, &Value)> = map.iter().collect();
            fields.sort_by(|a, b| a.0.cmp(b.0));
            let fields: Vec<String> = fields
                .into_iter()
                .map(|(k, v)| format!("{}:{}", json_string(k), canonical_json(v)))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        // Null, booleans, numbers and strings print canonically.
        leaf => leaf.to_string(),
    }
}

#[cfg(test)]
mod tests;
