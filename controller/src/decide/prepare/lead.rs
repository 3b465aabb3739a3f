//! Whether to prepare the next period now (design §2): the lead time, its clamp, and the rules
//! under which nothing is prepared. Pure, as the rest of `decide/`.
//!
//! Preparation is only ever an optimisation: [`super::judge`] decides at the instant whether a
//! prepared run starts. So [`next`] prepares a period only when the plan, asked about the
//! period's own instant with the status as it is now, would start it then: with nothing edited
//! meanwhile, the judge resumes what was prepared, and anything else is withdrawn.

use jiff::{SignedDuration, Timestamp};

use super::super::{Observed, Plan, plan, runs_exhausted};
use crate::api::{SingletonJobSpec, SingletonJobStatus};
use crate::schedule::Schedule;

/// The longest lead, in seconds (`--prepare-lead-seconds`, `spec.prepareLeadSeconds`).
pub const MAX_LEAD_SECONDS: i64 = 3600;

/// A preparation that ends closer than this to its instant is not begun: the period runs as
/// without preparation (a claim after the instant), rather than a preparation racing it.
pub const MIN_AHEAD: SignedDuration = SignedDuration::from_secs(1);

/// The lead a SingletonJob's runs are prepared with: `spec.prepareLeadSeconds`, else the
/// controller's `--prepare-lead-seconds` (`flag`). A value that bypassed the schema is clamped to
/// 0..=[`MAX_LEAD_SECONDS`], as `startingDeadlineSeconds` is.
pub fn base_lead(spec: &SingletonJobSpec, flag: u32) -> SignedDuration {
    let secs = spec
        .prepare_lead_seconds
        .unwrap_or(i64::from(flag))
        .clamp(0, MAX_LEAD_SECONDS);
    SignedDuration::from_secs(secs)
}

/// API requests one preparation costs: the claim's status write, the create and the confirm.
pub const REQUESTS_PER_PREPARATION: f64 = 3.0;

/// With a backstop, one more: the re-read after its claim (`complete_claim`).
pub const REQUESTS_PER_PREPARATION_WITH_BACKSTOP: f64 = 4.0;

/// The rate assumed before the API server was ever seen saturated, in requests per second: low,
/// so an unmeasured burst is prepared early rather than late.
pub const UNMEASURED_RATE: f64 = 100.0;

/// How much longer than the work itself a burst is given: its requests share the API server
/// with everything else the controller sends meanwhile.
const MARGIN: f64 = 1.5;

/// The lead a burst asks for, whatever the base (design §2.3): `ceil(1.5 · W · N / R)` for
/// `due` runs (`N`) of `requests_per_run` requests each (`W`) at `rate` requests per second
/// (`R`, [`UNMEASURED_RATE`] when None), at most `max`.
pub fn burst_lead(
    max: SignedDuration,
    due: usize,
    requests_per_run: f64,
    rate: Option<f64>,
) -> SignedDuration {
    let max = max.max(SignedDuration::ZERO);
    // `f64::max` drops a NaN: a nonsense count or rate cannot make the lead shorter than 0.
    let work = MARGIN * requests_per_run.max(0.0) * due as f64;
    if work <= 0.0 {
        return SignedDuration::ZERO;
    }
    let secs = work / rate.unwrap_or(UNMEASURED_RATE).max(0.0);
    // A rate of 0 (saturated seconds that completed nothing: the API server stalled) gives the
    // longest lead.
    if secs >= max.as_secs_f64() {
        return max;
    }
    SignedDuration::from_secs(secs.ceil() as i64)
}

/// The lead for one SingletonJob of a burst (design §2.3): its `base` ([`base_lead`]) raised
/// to [`burst_lead`] when the burst needs longer, never lowered (a base above `max` is kept),
/// and 0 when the base is 0: the adaptive lead never turns preparation on.
pub fn adaptive_lead(
    base: SignedDuration,
    max: SignedDuration,
    due: usize,
    requests_per_run: f64,
    rate: Option<f64>,
) -> SignedDuration {
    if base <= SignedDuration::ZERO {
        return base;
    }
    base.max(burst_lead(max, due, requests_per_run, rate))
}

/// Why the next period is not prepared. Names are metric labels and condition reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotPrepared {
    /// The lead is 0.
    Off,
    /// A backstop shared with other clusters (`--cluster-id`) or a standby delay: the
    /// database's clock arbitrates claims at the instant (docs/multi-cluster.md), never before.
    Shared,
    /// A run is active, or a claim or a prepared run is pending (P1: a preparation advances the
    /// fence, and must not fence out a live run).
    RunActive,
    /// A period is due now, a user's operation waits, or the plan would not start the next
    /// period at its instant as things stand.
    Pending,
    /// The SingletonJob is suspended.
    Suspended,
    /// The clock is untrusted, the template rejected, or the backstop unavailable.
    Blocked,
    /// `maxRuns` is reached.
    MaxRuns,
    /// No period comes.
    Ended,
    /// The next instant is too close (under [`MIN_AHEAD`]), or comes too soon after what
    /// preparation may not begin before (`startAt`).
    TooLate,
    /// This period's preparation was refused (its Job's name taken, the Job rejected, the
    /// backstop's claim held): it runs at its instant as without preparation.
    Refused,
}

impl NotPrepared {
    /// Every reason, in declaration order.
    pub const ALL: [NotPrepared; 10] = [
        NotPrepared::Off,
        NotPrepared::Shared,
        NotPrepared::RunActive,
        NotPrepared::Pending,
        NotPrepared::Suspended,
        NotPrepared::Blocked,
        NotPrepared::MaxRuns,
        NotPrepared::Ended,
        NotPrepared::TooLate,
        NotPrepared::Refused,
    ];

    /// The metric label and condition reason: the variant's name.
    pub fn name(self) -> &'static str {
        match self {
            NotPrepared::Off => "Off",
            NotPrepared::Shared => "Shared",
            NotPrepared::RunActive => "RunActive",
            NotPrepared::Pending => "Pending",
            NotPrepared::Suspended => "Suspended",
            NotPrepared::Blocked => "Blocked",
            NotPrepared::MaxRuns => "MaxRuns",
            NotPrepared::Ended => "Ended",
            NotPrepared::TooLate => "TooLate",
            NotPrepared::Refused => "Refused",
        }
    }
}

/// The next period's preparation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preparation {
    /// The period.
    pub period: Timestamp,
    /// Its instant plus its jitter: the Job is resumed at it, never before.
    pub resume_at: Timestamp,
    /// When preparing may begin: `resume_at` minus the lead, but not before the previous
    /// instant nor before `startAt`.
    pub from: Timestamp,
    /// The lead in effect when shorter than asked, and what shortened it.
    pub clamped: Option<Clamp>,
}

/// A lead shortened to what precedes the instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clamp {
    /// The lead in effect: `resume_at` minus the floor.
    pub lead: SignedDuration,
    pub by: Floor,
}

/// What a preparation may not begin before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Floor {
    /// The schedule's instant before the period: that period is decided first.
    PreviousInstant,
    /// `spec.startAt`: nothing of the SingletonJob's schedule is acted on before it.
    StartAt,
}

/// What to do about the next period ahead of its instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Prepare it now.
    Now(Preparation),
    /// Prepare it at `from` (look again then).
    At(Preparation),
    /// It is not prepared: it runs as without preparation.
    Not(NotPrepared),
}

/// What [`next`] decides from.
pub struct Ahead<'a> {
    pub spec: &'a SingletonJobSpec,
    pub schedule: &'a Schedule,
    /// The status as this reconcile writes it (the plan's records applied).
    pub status: &'a SingletonJobStatus,
    /// This reconcile's plan.
    pub plan: &'a Plan,
    /// `obs.now` is the earliest time the API server's clock may show.
    pub obs: &'a Observed<'a>,
    /// [`base_lead`].
    pub lead: SignedDuration,
    /// The backstop is shared between clusters, or this SingletonJob has a standby delay.
    pub shared: bool,
    /// A user's operation (trigger, backfill, rerun, break-lock) is pending.
    pub operation_pending: bool,
    /// The period whose preparation was refused (never prepared again).
    pub refused: Option<Timestamp>,
}

/// Whether to prepare the next period now, later, or not at all.
pub fn next(a: &Ahead<'_>) -> Next {
    if let Some(why) = not_prepared(a) {
        return Next::Not(why);
    }
    let now = a.obs.now;
    let cursor = a
        .plan
        .decided_through
        .or(a.status.decided_through.as_ref().map(|t| t.0))
        .unwrap_or(a.obs.created);
    let Some(period) = a.schedule.next_after(cursor.max(a.obs.created)) else {
        return Next::Not(NotPrepared::Ended);
    };
    if a.refused == Some(period) {
        return Next::Not(NotPrepared::Refused);
    }
    let window = a.spec.jitter_window();
    let resume_at = period + crate::schedule::jitter(a.obs.key, period, window);
    if resume_at.duration_since(now) < MIN_AHEAD {
        return Next::Not(NotPrepared::TooLate);
    }
    let start = a.spec.start_at.as_ref().map(|t| t.0);
    let (from, clamped) = begin(a.schedule, start, period, resume_at, a.lead);
    // No time to prepare in (`startAt` at the instant): as without preparation.
    if resume_at.duration_since(from) < MIN_AHEAD {
        return Next::Not(NotPrepared::TooLate);
    }
    let prep = Preparation {
        period,
        resume_at,
        from,
        clamped,
    };
    if now < from {
        return Next::At(prep);
    }
    // As things stand, would the plan start it at its instant? (Then the judge resumes it.)
    let at_instant = Observed {
        now: resume_at,
        ..a.obs.clone()
    };
    let planned = plan(
        a.spec,
        a.schedule,
        a.status.decided_through.as_ref().map(|t| t.0),
        a.status.schedule_fingerprint.as_deref(),
        &a.status.active,
        &at_instant,
    );
    if planned.start == Some(period) && planned.replace.is_empty() {
        Next::Now(prep)
    } else {
        Next::Not(NotPrepared::Pending)
    }
}

/// The rules under which nothing is prepared, in order.
fn not_prepared(a: &Ahead<'_>) -> Option<NotPrepared> {
    let s = a.status;
    if a.lead <= SignedDuration::ZERO {
        Some(NotPrepared::Off)
    } else if a.shared {
        Some(NotPrepared::Shared)
    } else if !s.active.is_empty() || s.pending_claim.is_some() || s.prepared.is_some() {
        Some(NotPrepared::RunActive)
    } else if a.plan.start.is_some() || a.operation_pending {
        Some(NotPrepared::Pending)
    } else if a.spec.suspend.unwrap_or(false) || a.plan.suspend {
        Some(NotPrepared::Suspended)
    } else if a.obs.blocked.is_some() || a.plan.waiting.is_some() {
        Some(NotPrepared::Blocked)
    } else if runs_exhausted(a.spec, s.run_count) {
        Some(NotPrepared::MaxRuns)
    } else {
        None
    }
}

/// When preparing `period` (resumed at `resume_at`) may begin with `lead`: not before the
/// previous instant, so the previous period is decided first, nor before `start` (`startAt`);
/// and the lead in effect when either shortened it.
fn begin(
    schedule: &Schedule,
    start: Option<Timestamp>,
    period: Timestamp,
    resume_at: Timestamp,
    lead: SignedDuration,
) -> (Timestamp, Option<Clamp>) {
    let asked = resume_at.checked_sub(lead).unwrap_or(resume_at);
    let previous = period
        .checked_sub(SignedDuration::from_nanos(1))
        .ok()
        .and_then(|t| schedule.latest_at_or_before(t));
    let floor = [
        previous.map(|t| (t, Floor::PreviousInstant)),
        start.map(|t| (t.min(resume_at), Floor::StartAt)),
    ]
    .into_iter()
    .flatten()
    .filter(|(t, _)| *t > asked)
    .max_by_key(|(t, _)| *t);
    match floor {
        Some((t, by)) => {
            let lead = resume_at.duration_since(t);
            (t, Some(Clamp { lead, by }))
        }
        None => (asked, None),
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod adaptive_tests;
