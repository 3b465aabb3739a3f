//! Tests of the lead and of [`next`] with fixed instants (a fake clock), and its properties:
//! a period is prepared now only inside its lead window, at least [`MIN_AHEAD`] before its
//! `resumeAt`, and only when the plan asked at `resumeAt` would start it; preparation never
//! begins before the previous instant nor after `resumeAt`; a lead of 0 prepares nothing.

use std::collections::HashMap;

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::api::{CatchUp, ConcurrencyPolicy, ExcludedAction, ExclusionsSpec, RunRef, Suspension};
use crate::decide::{JobState, Observed, Plan, Waiting, fingerprint_with, plan};
use crate::schedule::{DayRules, Schedule};

/// The jitter key (the backstop's job key).
const KEY: &str = "ns/job";

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn secs(n: i64) -> SignedDuration {
    SignedDuration::from_secs(n)
}

fn ms(n: i64) -> SignedDuration {
    SignedDuration::from_millis(n)
}

const NANO: SignedDuration = SignedDuration::from_nanos(1);

/// When the fixture's SingletonJob was created (a Friday).
fn created() -> Timestamp {
    ts("2027-01-01T00:00:00Z")
}

fn spec(schedule: &str) -> SingletonJobSpec {
    SingletonJobSpec {
        schedule: schedule.into(),
        job_template: json!({"spec": {"template": {"spec": {
            "containers": [{"name": "main", "image": "busybox:1"}],
            "restartPolicy": "Never"
        }}}})
        .into(),
        ..Default::default()
    }
}

fn sched(s: &SingletonJobSpec) -> Schedule {
    crate::decide::schedule(s, &Default::default()).unwrap()
}

/// A status whose cursor stands at `cursor` on `s`'s schedule.
fn decided(s: &SingletonJobSpec, cursor: Timestamp) -> SingletonJobStatus {
    SingletonJobStatus {
        decided_through: Some(cursor.into()),
        schedule_fingerprint: Some(fingerprint_with(s, &sched(s))),
        ..Default::default()
    }
}

/// A run of period `p` (active, a pending claim or a prepared run).
fn run(p: Timestamp, token: u64) -> RunRef {
    RunRef {
        unknown: Default::default(),
        late: false,
        period: p.into(),
        token,
        job_name: format!("run-{}", p.as_second()),
        claimed_at: None,
        job_uid: None,
        origin: None,
        requested_by: None,
        supersedes: None,
        replaces: Vec::new(),
        resume_at: None,
        basis: None,
    }
}

/// What a reconcile sees besides spec, status and time.
#[derive(Clone, Debug, Default)]
struct Around {
    blocked: Option<Waiting>,
    /// The active runs' Jobs (missing: Active).
    states: HashMap<String, JobState>,
    shared: bool,
    operation_pending: bool,
    /// The period whose preparation was refused.
    refused: Option<Timestamp>,
}

/// What one reconcile at `now` decides: its plan, the status it writes, and [`next`].
struct Asked {
    plan: Plan,
    written: SingletonJobStatus,
    next: Next,
}

/// The status a reconcile writes from `plan` (the parts [`next`] and the plan read).
fn applied(st: &SingletonJobStatus, plan: &Plan) -> SingletonJobStatus {
    let mut written = st.clone();
    written.decided_through = plan.decided_through.map(Into::into);
    written.schedule_fingerprint = Some(plan.fingerprint.clone());
    written.active = plan.still_active.clone();
    written.consecutive_failures = plan.consecutive_failures;
    written
}

/// `Observed` as the reconcile builds it for [`next`]: from the written status, with no Job
/// states (its active runs are the plan's `still_active`).
fn seen_by_next<'a>(
    now: Timestamp,
    written: &SingletonJobStatus,
    blocked: Option<Waiting>,
    states: &'a HashMap<String, JobState>,
) -> Observed<'a> {
    Observed {
        now,
        key: KEY,
        consecutive_failures: written.consecutive_failures,
        run_count: written.run_count,
        created: created(),
        blocked,
        job_states: states,
    }
}

/// [`next`] for a plan already made (and possibly altered by the test).
fn next_with(
    s: &SingletonJobSpec,
    written: &SingletonJobStatus,
    plan: &Plan,
    now: Timestamp,
    lead: SignedDuration,
    around: &Around,
) -> Next {
    let none = HashMap::new();
    let obs = seen_by_next(now, written, around.blocked, &none);
    next(&Ahead {
        spec: s,
        schedule: &sched(s),
        status: written,
        plan,
        obs: &obs,
        lead,
        shared: around.shared,
        operation_pending: around.operation_pending,
        refused: around.refused,
    })
}

/// One reconcile at `now`: the plan, the status it writes, and what [`next`] says.
fn ask(
    s: &SingletonJobSpec,
    st: &SingletonJobStatus,
    now: Timestamp,
    lead: SignedDuration,
    around: &Around,
) -> Asked {
    let obs = Observed {
        now,
        key: KEY,
        consecutive_failures: st.consecutive_failures,
        run_count: st.run_count,
        created: created(),
        blocked: around.blocked,
        job_states: &around.states,
    };
    let plan = plan(
        s,
        &sched(s),
        st.decided_through.as_ref().map(|t| t.0),
        st.schedule_fingerprint.as_deref(),
        &st.active,
        &obs,
    );
    let written = applied(st, &plan);
    let next = next_with(s, &written, &plan, now, lead, around);
    Asked {
        plan,
        written,
        next,
    }
}

/// [`next`] at `now` with `lead` seconds and nothing else in the way.
fn next_at(s: &SingletonJobSpec, st: &SingletonJobStatus, now: Timestamp, lead: i64) -> Next {
    ask(s, st, now, secs(lead), &Around::default()).next
}

fn prep(period: &str, resume_at: &str, from: &str, clamped: Option<SignedDuration>) -> Preparation {
    Preparation {
        period: ts(period),
        resume_at: ts(resume_at),
        from: ts(from),
        clamped: clamped.map(by_previous),
    }
}

/// A lead shortened to the previous instant.
fn by_previous(lead: SignedDuration) -> Clamp {
    Clamp {
        lead,
        by: Floor::PreviousInstant,
    }
}

fn not(why: NotPrepared) -> Next {
    Next::Not(why)
}

/// Every five minutes, decided through 00:10: the next period is 00:15, the previous 00:10.
fn five_minutes() -> (SingletonJobSpec, SingletonJobStatus) {
    let s = spec("*/5 * * * *");
    let st = decided(&s, ts("2027-01-01T00:10:00Z"));
    (s, st)
}

// ---------------------------------------------------------------------------------------------
// The lead

#[test]
fn the_specs_lead_overrides_the_flag() {
    let mut s = spec("*/5 * * * *");
    assert_eq!(base_lead(&s, 30), secs(30), "unset: the flag");
    assert_eq!(base_lead(&s, 0), SignedDuration::ZERO, "unset, flag 0: off");
    s.prepare_lead_seconds = Some(120);
    assert_eq!(base_lead(&s, 30), secs(120));
    assert_eq!(
        base_lead(&s, 0),
        secs(120),
        "the spec's lead on with the flag off"
    );
    s.prepare_lead_seconds = Some(0);
    assert_eq!(base_lead(&s, 30), SignedDuration::ZERO, "0: never prepared");
    s.prepare_lead_seconds = Some(3600);
    assert_eq!(base_lead(&s, 30), secs(3600));
}

#[test]
fn a_hostile_lead_is_clamped_to_an_hour() {
    let mut s = spec("*/5 * * * *");
    for (asked, flag, lead) in [
        (Some(-1), 30, 0),
        (Some(-3600), 30, 0),
        (Some(i64::MIN), 30, 0),
        (Some(3601), 30, 3600),
        (Some(i64::MAX), 30, 3600),
        (None, 3601, 3600),
        (None, u32::MAX, 3600),
    ] {
        s.prepare_lead_seconds = asked;
        assert_eq!(
            base_lead(&s, flag),
            secs(lead),
            "spec {asked:?}, flag {flag}"
        );
    }
    assert_eq!(MAX_LEAD_SECONDS, 3600);
}

#[test]
fn every_reason_is_named_as_its_variant() {
    let mut names: Vec<&str> = NotPrepared::ALL.iter().map(|r| r.name()).collect();
    for r in NotPrepared::ALL {
        assert_eq!(r.name(), format!("{r:?}"));
    }
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), NotPrepared::ALL.len(), "names are distinct");
    assert_eq!(NotPrepared::ALL.len(), 10);
}

// ---------------------------------------------------------------------------------------------
// When and from when

#[test]
fn prepared_later_before_the_lead_and_now_within_it() {
    let (s, st) = five_minutes();
    let p = prep(
        "2027-01-01T00:15:00Z",
        "2027-01-01T00:15:00Z",
        "2027-01-01T00:13:00Z",
        None,
    );
    assert_eq!(
        next_at(&s, &st, ts("2027-01-01T00:10:00Z"), 120),
        Next::At(p)
    );
    assert_eq!(
        next_at(&s, &st, ts("2027-01-01T00:13:00Z") - NANO, 120),
        Next::At(p)
    );
    assert_eq!(
        next_at(&s, &st, ts("2027-01-01T00:13:00Z"), 120),
        Next::Now(p)
    );
    assert_eq!(
        next_at(&s, &st, ts("2027-01-01T00:14:00Z"), 120),
        Next::Now(p)
    );
    // A lead of one second still leaves MIN_AHEAD.
    let one = prep(
        "2027-01-01T00:15:00Z",
        "2027-01-01T00:15:00Z",
        "2027-01-01T00:14:59Z",
        None,
    );
    assert_eq!(
        next_at(&s, &st, ts("2027-01-01T00:14:59Z"), 1),
        Next::Now(one)
    );
    assert_eq!(
        next_at(&s, &st, ts("2027-01-01T00:14:58Z"), 1),
        Next::At(one)
    );
}

#[test]
fn a_period_whose_preparation_was_refused_is_not_prepared_again_but_the_next_one_is() {
    let (s, st) = five_minutes();
    let refused = Around {
        refused: Some(ts("2027-01-01T00:15:00Z")),
        ..Default::default()
    };
    let at = |now: &str| ask(&s, &st, ts(now), secs(120), &refused).next;
    assert_eq!(at("2027-01-01T00:14:00Z"), not(NotPrepared::Refused));
    assert_eq!(at("2027-01-01T00:10:00Z"), not(NotPrepared::Refused));
    // Decided through 00:15 (it ran at its instant): 00:20 is prepared as usual.
    let later = decided(&s, ts("2027-01-01T00:15:00Z"));
    let p = prep(
        "2027-01-01T00:20:00Z",
        "2027-01-01T00:20:00Z",
        "2027-01-01T00:18:00Z",
        None,
    );
    assert_eq!(
        ask(&s, &later, ts("2027-01-01T00:19:00Z"), secs(120), &refused).next,
        Next::Now(p)
    );
}

#[test]
fn a_new_singleton_job_prepares_its_first_period_after_its_creation() {
    let s = spec("*/5 * * * *");
    let st = SingletonJobStatus::default();
    assert_eq!(
        next_at(&s, &st, ts("2027-01-01T00:04:00Z"), 120),
        Next::Now(prep(
            "2027-01-01T00:05:00Z",
            "2027-01-01T00:05:00Z",
            "2027-01-01T00:03:00Z",
            None,
        ))
    );
}

/// Nothing is acted on before `startAt`: the first period's preparation begins there, and the
/// lead in effect says so (an hour's lead would have claimed it before `startAt`).
#[test]
fn the_first_period_is_not_prepared_before_start_at() {
    let mut s = spec("*/5 * * * *");
    s.start_at = Some(ts("2027-01-01T00:12:00Z").into());
    let st = SingletonJobStatus::default();
    let from_start = |at: &str| {
        let p = Preparation {
            period: ts("2027-01-01T00:15:00Z"),
            resume_at: ts("2027-01-01T00:15:00Z"),
            from: ts("2027-01-01T00:12:00Z"),
            clamped: Some(Clamp {
                lead: secs(180),
                by: Floor::StartAt,
            }),
        };
        match ts(at) < p.from {
            true => Next::At(p),
            false => Next::Now(p),
        }
    };
    let now = "2027-01-01T00:01:00Z";
    assert_eq!(next_at(&s, &st, ts(now), 3600), from_start(now));
    let now = "2027-01-01T00:12:00Z";
    assert_eq!(next_at(&s, &st, ts(now), 3600), from_start(now));
    // A lead within the time after startAt is not shortened.
    assert_eq!(
        next_at(&s, &st, ts("2027-01-01T00:13:30Z"), 120),
        Next::Now(prep(
            "2027-01-01T00:15:00Z",
            "2027-01-01T00:15:00Z",
            "2027-01-01T00:13:00Z",
            None,
        ))
    );
}

#[test]
fn too_late_within_a_second_of_the_instant() {
    let (s, st) = five_minutes();
    let p = prep(
        "2027-01-01T00:15:00Z",
        "2027-01-01T00:15:00Z",
        "2027-01-01T00:13:00Z",
        None,
    );
    let instant = ts("2027-01-01T00:15:00Z");
    assert_eq!(MIN_AHEAD, secs(1));
    assert_eq!(next_at(&s, &st, instant - MIN_AHEAD, 120), Next::Now(p));
    assert_eq!(
        next_at(&s, &st, instant - MIN_AHEAD + NANO, 120),
        not(NotPrepared::TooLate)
    );
    assert_eq!(
        next_at(&s, &st, instant - ms(1), 120),
        not(NotPrepared::TooLate)
    );
    // At the instant the plan starts it: no preparation, a period is due.
    let at = ask(&s, &st, instant, secs(120), &Around::default());
    assert_eq!(at.plan.start, Some(instant));
    assert_eq!(at.next, not(NotPrepared::Pending));
}

#[test]
fn a_lead_longer_than_the_interval_begins_at_the_previous_instant() {
    let (s, st) = five_minutes();
    let now = ts("2027-01-01T00:11:00Z");
    let clamped = |lead| next_at(&s, &st, now, lead);
    let at_previous = |c| {
        Next::Now(prep(
            "2027-01-01T00:15:00Z",
            "2027-01-01T00:15:00Z",
            "2027-01-01T00:10:00Z",
            c,
        ))
    };
    assert_eq!(clamped(600), at_previous(Some(secs(300))));
    assert_eq!(clamped(3600), at_previous(Some(secs(300))));
    assert_eq!(clamped(301), at_previous(Some(secs(300))));
    // Exactly the interval: not shortened.
    assert_eq!(clamped(300), at_previous(None));
    assert_eq!(
        next_at(&s, &st, ts("2027-01-01T00:10:00Z"), 299),
        Next::At(prep(
            "2027-01-01T00:15:00Z",
            "2027-01-01T00:15:00Z",
            "2027-01-01T00:10:01Z",
            None,
        ))
    );
    assert_eq!(
        clamped(299),
        Next::Now(prep(
            "2027-01-01T00:15:00Z",
            "2027-01-01T00:15:00Z",
            "2027-01-01T00:10:01Z",
            None,
        ))
    );
}

#[test]
fn the_clamp_is_the_interval_before_the_period_not_after_it() {
    // Minutes 0 and 50: 10 minutes before each full hour, 50 before each :50.
    let s = spec("0,50 * * * *");
    let st = decided(&s, ts("2027-01-01T00:50:00Z"));
    assert_eq!(
        next_at(&s, &st, ts("2027-01-01T00:52:00Z"), 900),
        Next::Now(prep(
            "2027-01-01T01:00:00Z",
            "2027-01-01T01:00:00Z",
            "2027-01-01T00:50:00Z",
            Some(secs(600)),
        ))
    );
    let st = decided(&s, ts("2027-01-01T01:00:00Z"));
    assert_eq!(
        next_at(&s, &st, ts("2027-01-01T01:02:00Z"), 900),
        Next::At(prep(
            "2027-01-01T01:50:00Z",
            "2027-01-01T01:50:00Z",
            "2027-01-01T01:35:00Z",
            None,
        ))
    );
}

#[test]
fn jitter_delays_the_resume_and_the_lead_counts_from_it() {
    let (mut s, st) = five_minutes();
    s.jitter_seconds = Some(120);
    let period = ts("2027-01-01T00:15:00Z");
    // The key's offset for 00:15 within a 120 s window.
    let offset = ms(98_381);
    assert_eq!(crate::schedule::jitter(KEY, period, 120), offset);
    let resume_at = ts("2027-01-01T00:16:38.381Z");
    assert_eq!(period + offset, resume_at);
    let p = Preparation {
        period,
        resume_at,
        from: ts("2027-01-01T00:15:38.381Z"),
        clamped: None,
    };
    assert_eq!(
        next_at(&s, &st, ts("2027-01-01T00:14:00Z"), 60),
        Next::At(p)
    );
    assert_eq!(
        next_at(&s, &st, ts("2027-01-01T00:15:38.381Z") - NANO, 60),
        Next::At(p)
    );
    // Due at 00:15 but its offset not passed: the plan does not start it, so it may still be
    // prepared, up to a second before `resumeAt`.
    let due = ask(
        &s,
        &st,
        ts("2027-01-01T00:16:00Z"),
        secs(60),
        &Around::default(),
    );
    assert_eq!(due.plan.start, None);
    assert_eq!(
        due.plan.decided_through,
        Some(ts("2027-01-01T00:10:00Z")),
        "not decided before its offset"
    );
    assert_eq!(due.next, Next::Now(p));
    assert_eq!(next_at(&s, &st, resume_at - MIN_AHEAD, 60), Next::Now(p));
    assert_eq!(
        next_at(&s, &st, resume_at - ms(999), 60),
        not(NotPrepared::TooLate)
    );
    // Clamped to the previous instant, the lead in effect runs to `resumeAt`.
    assert_eq!(
        next_at(&s, &st, ts("2027-01-01T00:11:00Z"), 600),
        Next::Now(Preparation {
            period,
            resume_at,
            from: ts("2027-01-01T00:10:00Z"),
            clamped: Some(by_previous(ms(398_381))),
        })
    );
}

// ---------------------------------------------------------------------------------------------
// Why not

#[test]
fn a_lead_of_zero_prepares_nothing() {
    let (mut s, st) = five_minutes();
    let now = ts("2027-01-01T00:14:00Z");
    assert_eq!(next_at(&s, &st, now, 0), not(NotPrepared::Off));
    let negative = ask(&s, &st, now, secs(-30), &Around::default());
    assert_eq!(negative.next, not(NotPrepared::Off));
    s.prepare_lead_seconds = Some(0);
    let lead = base_lead(&s, 30);
    assert_eq!(
        ask(&s, &st, now, lead, &Around::default()).next,
        not(NotPrepared::Off)
    );
}

#[test]
fn a_shared_backstop_prepares_nothing() {
    let (s, st) = five_minutes();
    let shared = Around {
        shared: true,
        ..Default::default()
    };
    let now = ts("2027-01-01T00:14:00Z");
    assert_eq!(
        ask(&s, &st, now, secs(120), &shared).next,
        not(NotPrepared::Shared)
    );
    assert_eq!(
        ask(&s, &st, now, SignedDuration::ZERO, &shared).next,
        not(NotPrepared::Off),
        "Off is said first"
    );
}

#[test]
fn a_run_active_claimed_or_prepared_holds_the_next_period() {
    let (s, st) = five_minutes();
    let now = ts("2027-01-01T00:14:00Z");
    let previous = ts("2027-01-01T00:10:00Z");
    let lead = secs(120);

    let mut active = st.clone();
    active.active.push(run(previous, 3));
    assert_eq!(
        ask(&s, &active, now, lead, &Around::default()).next,
        not(NotPrepared::RunActive)
    );
    // The run finished in this reconcile: nothing holds the next period any more.
    let finished = Around {
        states: [(
            run(previous, 3).job_name,
            JobState::Succeeded(ts("2027-01-01T00:12:00Z")),
        )]
        .into(),
        ..Default::default()
    };
    let done = ask(&s, &active, now, lead, &finished);
    assert!(done.written.active.is_empty());
    assert_eq!(
        done.next,
        Next::Now(prep(
            "2027-01-01T00:15:00Z",
            "2027-01-01T00:15:00Z",
            "2027-01-01T00:13:00Z",
            None,
        ))
    );

    let mut claimed = st.clone();
    claimed.pending_claim = Some(run(previous, 3));
    assert_eq!(
        ask(&s, &claimed, now, lead, &Around::default()).next,
        not(NotPrepared::RunActive)
    );

    let mut prepared = st.clone();
    let mut r = run(ts("2027-01-01T00:15:00Z"), 4);
    r.resume_at = Some(ts("2027-01-01T00:15:00Z").into());
    prepared.prepared = Some(r);
    assert_eq!(
        ask(&s, &prepared, now, lead, &Around::default()).next,
        not(NotPrepared::RunActive)
    );
}

#[test]
fn a_period_due_or_an_operation_waiting_prepares_nothing() {
    let (s, st) = five_minutes();
    let lead = secs(120);
    let operating = Around {
        operation_pending: true,
        ..Default::default()
    };
    assert_eq!(
        ask(&s, &st, ts("2027-01-01T00:14:00Z"), lead, &operating).next,
        not(NotPrepared::Pending)
    );
    // The plan starts a period now (00:20 is due, 00:15 superseded by it).
    let due = ask(
        &s,
        &st,
        ts("2027-01-01T00:20:30Z"),
        lead,
        &Around::default(),
    );
    assert_eq!(due.plan.start, Some(ts("2027-01-01T00:20:00Z")));
    assert_eq!(due.next, not(NotPrepared::Pending));
}

#[test]
fn a_period_the_plan_would_not_start_at_its_instant_is_not_prepared() {
    // Every 10 s with 15 minutes of jitter: 00:10:10 resumes at 00:16:29.317, when the newest
    // period has long been due; catchUp Latest supersedes 00:10:10 then.
    let mut s = spec("*/10 * * * * *");
    s.jitter_seconds = Some(900);
    s.catch_up = CatchUp::Latest;
    let st = decided(&s, ts("2027-01-01T00:10:00Z"));
    let now = ts("2027-01-01T00:10:05Z");
    let period = ts("2027-01-01T00:10:10Z");
    let resume_at = ts("2027-01-01T00:16:29.317Z");
    assert_eq!(
        period + crate::schedule::jitter(KEY, period, 900),
        resume_at
    );
    let asked = ask(&s, &st, now, secs(600), &Around::default());
    assert_eq!(asked.next, not(NotPrepared::Pending));
    // Before its window it is still announced (asked again then, the plan decides).
    assert_eq!(
        next_at(&s, &st, now, 5),
        Next::At(Preparation {
            period,
            resume_at,
            from: resume_at - secs(5),
            clamped: None,
        })
    );
    // Under catchUp All the oldest goes first: the plan starts it at its instant.
    s.catch_up = CatchUp::All;
    let st = decided(&s, ts("2027-01-01T00:10:00Z"));
    assert_eq!(
        next_at(&s, &st, now, 600),
        Next::Now(Preparation {
            period,
            resume_at,
            from: ts("2027-01-01T00:10:00Z"),
            clamped: Some(by_previous(ms(389_317))),
        })
    );
}

#[test]
fn a_period_on_an_excluded_day_is_not_prepared() {
    // Noon daily, weekends excluded (Skip): after Friday 2027-01-01 comes Saturday's, recorded
    // Skipped at its instant, never started.
    let mut s = spec("0 12 * * *");
    s.exclusions = Some(ExclusionsSpec {
        rules: DayRules {
            days: vec!["* * SAT,SUN".into()],
            ..Default::default()
        },
        ..Default::default()
    });
    let st = decided(&s, ts("2027-01-01T12:00:00Z"));
    assert_eq!(
        next_at(&s, &st, ts("2027-01-02T11:59:00Z"), 120),
        not(NotPrepared::Pending)
    );
    // Moved to Monday by NextAllowedDay, it is prepared for Monday.
    s.exclusions.as_mut().unwrap().action = ExcludedAction::NextAllowedDay;
    let st = decided(&s, ts("2027-01-01T12:00:00Z"));
    assert_eq!(
        next_at(&s, &st, ts("2027-01-04T11:59:00Z"), 120),
        Next::Now(prep(
            "2027-01-04T12:00:00Z",
            "2027-01-04T12:00:00Z",
            "2027-01-04T11:58:00Z",
            None,
        ))
    );
}

#[test]
fn suspended_prepares_nothing() {
    let (mut s, st) = five_minutes();
    let now = ts("2027-01-01T00:14:00Z");
    s.suspend = Some(true);
    assert_eq!(next_at(&s, &st, now, 120), not(NotPrepared::Suspended));
    // Until a time before the period: still suspended now (the lift comes at `until`).
    s.suspension = Some(Suspension {
        until: Some(ts("2027-01-01T00:14:30Z").into()),
        ..Default::default()
    });
    assert_eq!(next_at(&s, &st, now, 120), not(NotPrepared::Suspended));

    // suspendAfterConsecutiveFailures reached by a run that failed now.
    let (mut s, mut st) = five_minutes();
    s.suspend_after_consecutive_failures = Some(1);
    st.active.push(run(ts("2027-01-01T00:10:00Z"), 3));
    let failed = Around {
        states: [(
            run(ts("2027-01-01T00:10:00Z"), 3).job_name,
            JobState::Failed(ts("2027-01-01T00:13:00Z")),
        )]
        .into(),
        ..Default::default()
    };
    let asked = ask(&s, &st, now, secs(120), &failed);
    assert!(asked.plan.suspend);
    assert!(asked.written.active.is_empty());
    assert_eq!(asked.next, not(NotPrepared::Suspended));
}

#[test]
fn blocked_prepares_nothing() {
    let (s, st) = five_minutes();
    let now = ts("2027-01-01T00:14:00Z");
    for why in [
        Waiting::ClockUntrusted,
        Waiting::JobTemplateInvalid,
        Waiting::BackstopUnavailable,
    ] {
        let blocked = Around {
            blocked: Some(why),
            ..Default::default()
        };
        assert_eq!(
            ask(&s, &st, now, secs(120), &blocked).next,
            not(NotPrepared::Blocked),
            "{why:?}"
        );
    }
    // The plan waiting for anything, with nothing seen blocked.
    let asked = ask(&s, &st, now, secs(120), &Around::default());
    assert!(matches!(asked.next, Next::Now(_)));
    for why in [
        Waiting::ConcurrencyForbid,
        Waiting::MaxActive,
        Waiting::JobTemplateInvalid,
        Waiting::BackstopUnavailable,
    ] {
        let waiting = Plan {
            waiting: Some(why),
            ..asked.plan.clone()
        };
        assert_eq!(
            next_with(
                &s,
                &asked.written,
                &waiting,
                now,
                secs(120),
                &Around::default()
            ),
            not(NotPrepared::Blocked),
            "{why:?}"
        );
    }
}

#[test]
fn max_runs_reached_prepares_nothing() {
    let (mut s, mut st) = five_minutes();
    let now = ts("2027-01-01T00:14:00Z");
    s.max_runs = Some(3);
    st.run_count = 3;
    assert_eq!(next_at(&s, &st, now, 120), not(NotPrepared::MaxRuns));
    st.run_count = 2;
    assert_eq!(
        next_at(&s, &st, now, 120),
        Next::Now(prep(
            "2027-01-01T00:15:00Z",
            "2027-01-01T00:15:00Z",
            "2027-01-01T00:13:00Z",
            None,
        )),
        "the last run is prepared"
    );
    s.max_runs = Some(-1);
    st.run_count = 0;
    assert_eq!(
        next_at(&s, &st, now, 120),
        not(NotPrepared::MaxRuns),
        "a hostile maxRuns is 0"
    );
}

#[test]
fn no_period_to_come_prepares_nothing() {
    let (mut s, st) = five_minutes();
    let now = ts("2027-01-01T00:14:00Z");
    // endAt before the next instant.
    s.end_at = Some(ts("2027-01-01T00:14:59Z").into());
    assert_eq!(next_at(&s, &st, now, 120), not(NotPrepared::Ended));
    // endAt long passed.
    s.end_at = Some(ts("2027-01-01T00:05:00Z").into());
    assert_eq!(next_at(&s, &st, now, 120), not(NotPrepared::Ended));
    // endAt is included: its own instant is prepared.
    s.end_at = Some(ts("2027-01-01T00:15:00Z").into());
    assert_eq!(
        next_at(&s, &st, now, 120),
        Next::Now(prep(
            "2027-01-01T00:15:00Z",
            "2027-01-01T00:15:00Z",
            "2027-01-01T00:13:00Z",
            None,
        ))
    );
}

#[test]
fn the_first_reason_in_order_is_said() {
    // Everything in the way at once; taken away one by one, the next reason shows.
    let (mut s, mut st) = five_minutes();
    let now = ts("2027-01-01T00:14:59.5Z");
    s.suspend = Some(true);
    s.max_runs = Some(1);
    st.run_count = 1;
    st.pending_claim = Some(run(ts("2027-01-01T00:10:00Z"), 3));
    let mut around = Around {
        shared: true,
        operation_pending: true,
        blocked: Some(Waiting::JobTemplateInvalid),
        ..Default::default()
    };
    let mut lead = SignedDuration::ZERO;
    let said = |s: &SingletonJobSpec, st: &SingletonJobStatus, lead, around: &Around| {
        ask(s, st, now, lead, around).next
    };
    assert_eq!(said(&s, &st, lead, &around), not(NotPrepared::Off));
    lead = secs(120);
    assert_eq!(said(&s, &st, lead, &around), not(NotPrepared::Shared));
    around.shared = false;
    assert_eq!(said(&s, &st, lead, &around), not(NotPrepared::RunActive));
    st.pending_claim = None;
    assert_eq!(said(&s, &st, lead, &around), not(NotPrepared::Pending));
    around.operation_pending = false;
    assert_eq!(said(&s, &st, lead, &around), not(NotPrepared::Suspended));
    s.suspend = None;
    assert_eq!(said(&s, &st, lead, &around), not(NotPrepared::Blocked));
    around.blocked = None;
    assert_eq!(said(&s, &st, lead, &around), not(NotPrepared::MaxRuns));
    s.max_runs = None;
    assert_eq!(said(&s, &st, lead, &around), not(NotPrepared::TooLate));
}

// ---------------------------------------------------------------------------------------------
// Properties

fn schedule_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        (10u32..40).prop_map(|n| format!("*/{n} * * * * *")),
        (1u32..30).prop_map(|n| format!("*/{n} * * * *")),
        (0u32..60).prop_map(|m| format!("{m} * * * *")),
        (0u32..60, 0u32..24).prop_map(|(m, h)| format!("{m} {h} * * *")),
        Just("0 9 * * MON-FRI".to_string()),
        Just("0,50 * * * *".to_string()),
    ]
}

/// A SingletonJob, what is in the way, and a time to ask at.
#[derive(Clone, Debug)]
struct World {
    s: SingletonJobSpec,
    st: SingletonJobStatus,
    around: Around,
    now: Timestamp,
}

/// The spec's parts drawn: schedule, catchUp, concurrency, starting deadline, jitter, Skip
/// weekends, (startAt, endAt) in seconds after creation, maxRuns, suspend.
type Drawn = (
    String,
    CatchUp,
    ConcurrencyPolicy,
    Option<i64>,
    Option<i32>,
    bool,
    (Option<i64>, Option<i64>),
    Option<i64>,
    bool,
);

fn spec_strategy() -> impl Strategy<Value = Drawn> {
    (
        schedule_strategy(),
        prop_oneof![
            Just(CatchUp::None),
            Just(CatchUp::Latest),
            Just(CatchUp::All)
        ],
        prop_oneof![
            Just(ConcurrencyPolicy::Forbid),
            Just(ConcurrencyPolicy::Replace),
            Just(ConcurrencyPolicy::Allow)
        ],
        proptest::option::of(1i64..3600),
        proptest::option::weighted(0.6, 0i32..900),
        proptest::bool::weighted(0.1),
        (
            proptest::option::weighted(0.1, 0i64..172_800),
            proptest::option::weighted(0.1, 0i64..172_800),
        ),
        proptest::option::weighted(0.1, 0i64..5),
        proptest::bool::weighted(0.05),
    )
}

fn build_spec(
    (schedule, catch_up, concurrency, deadline, jitter, weekends, (start, end), max_runs, suspend): Drawn,
) -> SingletonJobSpec {
    let mut s = spec(&schedule);
    s.catch_up = catch_up;
    s.concurrency_policy = concurrency;
    s.starting_deadline_seconds = deadline;
    s.jitter_seconds = jitter;
    if weekends {
        s.exclusions = Some(ExclusionsSpec {
            rules: DayRules {
                days: vec!["* * SAT,SUN".into()],
                ..Default::default()
            },
            ..Default::default()
        });
    }
    s.start_at = start.map(|d| (created() + secs(d)).into());
    s.end_at = end.map(|d| (created() + secs(d)).into());
    s.max_runs = max_runs;
    s.suspend = suspend.then_some(true);
    s
}

/// The status's parts drawn: cursor (seconds after creation; None: a new SingletonJob), another
/// schedule's fingerprint, an active run's Job, a pending claim, a prepared run, runCount.
type Status = (Option<i64>, bool, Option<JobState>, bool, bool, u64);

fn status_strategy() -> impl Strategy<Value = Status> {
    (
        proptest::option::weighted(0.8, 0i64..172_800),
        proptest::bool::weighted(0.05),
        proptest::option::weighted(
            0.1,
            prop_oneof![
                Just(JobState::Active),
                Just(JobState::Succeeded(ts("2027-01-01T00:00:01Z"))),
                Just(JobState::Failed(ts("2027-01-01T00:00:01Z"))),
                Just(JobState::Gone),
            ],
        ),
        proptest::bool::weighted(0.05),
        proptest::bool::weighted(0.05),
        0u64..4,
    )
}

/// When to ask: this long before the next instant after the cursor (negative: after it).
fn before_strategy() -> impl Strategy<Value = SignedDuration> {
    prop_oneof![
        4 => (0i64..4_000_000).prop_map(ms),
        2 => (0i64..3_000).prop_map(ms),
        1 => (-1_000_000i64..0).prop_map(ms),
        1 => (0i64..1_000_000_000).prop_map(SignedDuration::from_nanos),
    ]
}

fn world_strategy() -> impl Strategy<Value = World> {
    (
        spec_strategy(),
        status_strategy(),
        before_strategy(),
        proptest::option::weighted(
            0.1,
            prop_oneof![
                Just(Waiting::ClockUntrusted),
                Just(Waiting::JobTemplateInvalid),
                Just(Waiting::BackstopUnavailable)
            ],
        ),
        proptest::bool::weighted(0.05),
        proptest::bool::weighted(0.05),
    )
        .prop_map(
            |(
                drawn,
                (cursor, moved, job, claim, prepared, run_count),
                before,
                blocked,
                shared,
                op,
            )| {
                let s = build_spec(drawn);
                let sc = sched(&s);
                let mut st = match cursor {
                    Some(c) => decided(&s, created() + secs(c)),
                    None => SingletonJobStatus::default(),
                };
                if moved {
                    st.schedule_fingerprint = Some("0 0 1 1 *|UTC|ShiftForward/First".into());
                }
                let at = created() + secs(cursor.unwrap_or(0));
                let mut around = Around {
                    blocked,
                    shared,
                    operation_pending: op,
                    ..Default::default()
                };
                if let Some(state) = job {
                    let r = run(at, 1);
                    around.states.insert(r.job_name.clone(), state);
                    st.active.push(r);
                }
                if claim {
                    st.pending_claim = Some(run(at, 2));
                }
                if prepared {
                    st.prepared = Some(run(at, 3));
                }
                st.run_count = run_count;
                // Around the next instant after the cursor (or a day on, if none comes), and
                // never before the cursor.
                let coming = sc.next_after(at).unwrap_or(at + secs(86_400));
                let now = coming.checked_sub(before).unwrap_or(coming).max(at);
                World { s, st, around, now }
            },
        )
}

/// The plan at `at`, from the status as written, as [`next`] asks it.
fn plan_at(w: &World, written: &SingletonJobStatus, at: Timestamp) -> Plan {
    let none = HashMap::new();
    let obs = seen_by_next(at, written, w.around.blocked, &none);
    plan(
        &w.s,
        &sched(&w.s),
        written.decided_through.as_ref().map(|t| t.0),
        written.schedule_fingerprint.as_deref(),
        &written.active,
        &obs,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// (1) Prepared now only inside the lead window, at least MIN_AHEAD before `resumeAt`, when
    /// nothing is in the way, and when the plan asked at `resumeAt` with the status as written
    /// starts exactly the period (and replaces nothing), which it starts no earlier.
    #[test]
    fn prepared_now_only_what_the_plan_starts_at_its_instant(
        w in world_strategy(),
        lead in 1i64..=3600,
    ) {
        let lead = secs(lead);
        let asked = ask(&w.s, &w.st, w.now, lead, &w.around);
        let sc = sched(&w.s);
        match asked.next {
            Next::Now(p) => {
                prop_assert!(w.now >= p.from, "now {} before from {}", w.now, p.from);
                prop_assert!(p.resume_at.duration_since(w.now) >= MIN_AHEAD);
                let then = plan_at(&w, &asked.written, p.resume_at);
                prop_assert_eq!(then.start, Some(p.period), "the plan at resumeAt: {:?}", then);
                prop_assert!(then.replace.is_empty());
                let before = plan_at(&w, &asked.written, p.resume_at - NANO);
                prop_assert_ne!(before.start, Some(p.period), "started before resumeAt");
                // Nothing in the way.
                let st = &asked.written;
                prop_assert!(!w.around.shared && !w.around.operation_pending);
                prop_assert!(w.around.blocked.is_none() && asked.plan.waiting.is_none());
                prop_assert!(st.active.is_empty() && st.pending_claim.is_none());
                prop_assert!(st.prepared.is_none());
                prop_assert!(asked.plan.start.is_none() && !asked.plan.suspend);
                prop_assert!(!w.s.suspend.unwrap_or(false));
                prop_assert!(!crate::decide::runs_exhausted(&w.s, st.run_count));
            }
            Next::At(p) => {
                prop_assert!(w.now < p.from, "At({}) at {}", p.from, w.now);
            }
            Next::Not(_) => {}
        }
        if let Next::Now(p) | Next::At(p) = asked.next {
            // The next period after the cursor, resumed at its instant plus its jitter.
            let cursor = asked.written.decided_through.as_ref().unwrap().0;
            prop_assert_eq!(Some(p.period), sc.next_after(cursor));
            let offset = crate::schedule::jitter(KEY, p.period, w.s.jitter_window());
            prop_assert_eq!(p.resume_at, p.period + offset);
            prop_assert!(p.resume_at >= p.period);
            prop_assert!(
                p.resume_at.duration_since(p.period)
                    < secs(i64::from(w.s.jitter_window())).max(NANO)
            );
        }
    }

    /// (2) Preparation begins `lead` before `resumeAt`, but never before the previous instant
    /// nor before `startAt` (then the lead in effect is said, with what shortened it), and never
    /// after `resumeAt`.
    #[test]
    fn preparation_begins_between_the_previous_instant_and_resume_at(
        w in world_strategy(),
        lead in 1i64..=3600,
    ) {
        let lead = secs(lead);
        let asked = ask(&w.s, &w.st, w.now, lead, &w.around);
        if let Next::Now(p) | Next::At(p) = asked.next {
            let sc = sched(&w.s);
            let previous = sc.latest_at_or_before(p.period - NANO);
            let start = w.s.start_at.as_ref().map(|t| t.0.min(p.resume_at));
            let asked_from = p.resume_at - lead;
            prop_assert!(p.from <= p.resume_at);
            prop_assert!(p.from >= asked_from);
            if let Some(prev) = previous {
                prop_assert!(p.from >= prev, "from {} before the previous instant {}", p.from, prev);
            }
            if let Some(start) = start {
                prop_assert!(p.from >= start, "from {} before startAt {}", p.from, start);
            }
            let floor = previous.into_iter().chain(start).max();
            prop_assert_eq!(p.from, floor.map_or(asked_from, |f| asked_from.max(f)));
            match p.clamped {
                Some(c) => {
                    prop_assert!(floor.is_some_and(|f| f > asked_from));
                    let by = match c.by {
                        Floor::PreviousInstant => previous,
                        Floor::StartAt => start,
                    };
                    prop_assert_eq!(by, Some(p.from));
                    prop_assert_eq!(c.lead, p.resume_at.duration_since(p.from));
                    prop_assert!(c.lead < lead);
                    prop_assert!(c.lead >= SignedDuration::ZERO);
                }
                None => prop_assert_eq!(p.from, asked_from),
            }
        }
    }

    /// (3) A lead of 0 (or below, or a spec's 0 or hostile negative lead) never prepares.
    #[test]
    fn a_lead_of_zero_never_prepares(
        w in world_strategy(),
        lead in prop_oneof![Just(0i64), -3600i64..0],
        asked in proptest::option::of(i64::MIN..=0),
        flag in 0u32..=7200,
    ) {
        let direct = ask(&w.s, &w.st, w.now, secs(lead), &w.around);
        prop_assert_eq!(direct.next, not(NotPrepared::Off));
        let mut s = w.s.clone();
        s.prepare_lead_seconds = Some(asked.unwrap_or(0));
        let base = base_lead(&s, flag);
        prop_assert_eq!(base, SignedDuration::ZERO);
        prop_assert_eq!(ask(&s, &w.st, w.now, base, &w.around).next, not(NotPrepared::Off));
    }

    /// An announced preparation holds: asked again at its `from` (the status as written), the
    /// same period is prepared then if the plan would start it at its instant (unless `from`
    /// leaves less than MIN_AHEAD); never if it would not.
    #[test]
    fn asked_again_at_from_the_same_period_is_prepared(
        w in world_strategy(),
        lead in 1i64..=3600,
    ) {
        let lead = secs(lead);
        let asked = ask(&w.s, &w.st, w.now, lead, &w.around);
        if let Next::At(p) = asked.next {
            let again = ask(&w.s, &asked.written, p.from, lead, &w.around);
            let starts = plan_at(&w, &asked.written, p.resume_at).start == Some(p.period);
            if !starts {
                prop_assert_ne!(again.next, Next::Now(p));
            } else if p.resume_at.duration_since(p.from) < MIN_AHEAD {
                prop_assert_eq!(again.next, not(NotPrepared::TooLate));
            } else {
                prop_assert_eq!(again.next, Next::Now(p), "asked again at {}", p.from);
            }
        }
    }

    /// The base lead is the spec's, else the flag's, within 0..=3600 whatever was written.
    #[test]
    fn the_base_lead_is_within_an_hour(
        asked in proptest::option::of(any::<i64>()),
        flag in any::<u32>(),
    ) {
        let mut s = spec("*/5 * * * *");
        s.prepare_lead_seconds = asked;
        let want = asked.unwrap_or(i64::from(flag)).clamp(0, 3600);
        prop_assert_eq!(base_lead(&s, flag), secs(want));
    }
}
