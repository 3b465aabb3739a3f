//! Tests of the pure decision core with fixed instants (a fake clock).

use std::collections::HashMap;

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;

use super::*;
use crate::api::{CatchUp, ConcurrencyPolicy, HistoryEntry, Outcome, RunRef, SingletonJobSpec};
use crate::schedule::{DstPolicy, Schedule};

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn spec(schedule: &str) -> SingletonJobSpec {
    SingletonJobSpec {
        schedule: schedule.into(),
        time_zone: None,
        dst_policy: DstPolicy::default(),
        starting_deadline_seconds: None,
        catch_up: CatchUp::Latest,
        concurrency_policy: ConcurrencyPolicy::Forbid,
        suspend: None,
        successful_jobs_history_limit: None,
        failed_jobs_history_limit: None,
        lock: None,
        backstop: None,
        job_template: Default::default(),
        ..Default::default()
    }
}

fn sched(s: &SingletonJobSpec) -> Schedule {
    super::schedule(s, &Default::default()).unwrap()
}

/// The controller's memory between two decisions, as status holds it.
#[derive(Clone, Debug, Default)]
struct State {
    decided_through: Option<Timestamp>,
    fingerprint: Option<String>,
    active: Vec<RunRef>,
    /// `status.runCount`: the scheduled periods claimed.
    run_count: u64,
}

fn run_ref(p: Timestamp) -> RunRef {
    RunRef {
        unknown: Default::default(),
        late: false,
        period: p.into(),
        token: 0,
        job_name: format!("job-{}", p.as_second()),
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

fn decide(
    s: &SingletonJobSpec,
    st: &State,
    now: Timestamp,
    created: Timestamp,
    states: &HashMap<String, JobState>,
) -> Plan {
    let obs = Observed {
        key: "ns/job",
        consecutive_failures: 0,
        run_count: st.run_count,
        now,
        created,
        blocked: None,
        job_states: states,
    };
    plan(
        s,
        &sched(s),
        st.decided_through,
        st.fingerprint.as_deref(),
        &st.active,
        &obs,
    )
}

/// Applies a plan as the controller does: cursor, fingerprint, active runs (+ the started one).
fn apply(st: &mut State, p: &Plan) {
    st.decided_through = p.decided_through;
    st.fingerprint = Some(p.fingerprint.clone());
    st.active = p.still_active.clone();
    st.active
        .retain(|r| !p.replace.iter().any(|o| o.job_name == r.job_name));
    if let Some(start) = p.start {
        st.decided_through = Some(start);
        st.active.push(run_ref(start));
        st.run_count += 1;
    }
}

fn recorded(p: &Plan) -> Vec<(Outcome, &str, u64)> {
    p.records
        .iter()
        .map(|r| (r.outcome, r.reason.as_deref().unwrap_or(""), r.count))
        .collect()
}

const NONE: &[(&str, JobState)] = &[];

fn states(entries: &[(&str, JobState)]) -> HashMap<String, JobState> {
    entries.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn never_starts_before_the_instant_and_starts_at_it() {
    let s = spec("*/10 * * * *");
    let created = ts("2027-01-01T00:03:00Z");
    let st = State::default();
    let early = decide(
        &s,
        &st,
        ts("2027-01-01T00:09:59.999Z"),
        created,
        &states(NONE),
    );
    assert_eq!(early.start, None);
    assert_eq!(early.wake_at, Some(ts("2027-01-01T00:10:00Z")));
    let on_time = decide(&s, &st, ts("2027-01-01T00:10:00Z"), created, &states(NONE));
    assert_eq!(on_time.start, Some(ts("2027-01-01T00:10:00Z")));
    assert!(
        on_time.records.is_empty(),
        "periods before creation are never due"
    );
}

#[test]
fn catch_up_all_starts_every_missed_period_in_order_once() {
    let mut s = spec("*/10 * * * *");
    s.catch_up = CatchUp::All;
    s.concurrency_policy = ConcurrencyPolicy::Allow;
    let created = ts("2027-01-01T00:00:00Z");
    let now = ts("2027-01-01T00:55:00Z"); // controller was down: 00:10 .. 00:50 are pending
    let mut st = State::default();
    let mut started = vec![];
    for _ in 0..10 {
        let p = decide(&s, &st, now, created, &states(NONE));
        assert!(p.records.is_empty());
        apply(&mut st, &p);
        match p.start {
            Some(x) => started.push(x),
            None => break,
        }
    }
    let want: Vec<Timestamp> = (1..=5)
        .map(|i| created + SignedDuration::from_mins(10 * i))
        .collect();
    assert_eq!(started, want);
}

#[test]
fn catch_up_latest_starts_the_newest_and_records_the_rest_folded() {
    let s = spec("*/10 * * * *");
    let created = ts("2027-01-01T00:00:00Z");
    let p = decide(
        &s,
        &State::default(),
        ts("2027-01-01T00:55:00Z"),
        created,
        &states(NONE),
    );
    assert_eq!(p.start, Some(ts("2027-01-01T00:50:00Z")));
    assert_eq!(recorded(&p), vec![(Outcome::Missed, reason::SUPERSEDED, 4)]);
    assert_eq!(p.records[0].period.0, ts("2027-01-01T00:10:00Z"));
    assert_eq!(
        p.records[0].last_period.as_ref().unwrap().0,
        ts("2027-01-01T00:40:00Z")
    );
}

#[test]
fn catch_up_none_starts_nothing_late() {
    let mut s = spec("*/10 * * * *");
    s.catch_up = CatchUp::None;
    let created = ts("2027-01-01T00:00:00Z");
    let p = decide(
        &s,
        &State::default(),
        ts("2027-01-01T00:55:00Z"),
        created,
        &states(NONE),
    );
    assert_eq!(p.start, None);
    assert_eq!(
        recorded(&p),
        vec![(Outcome::Missed, reason::DEADLINE_EXCEEDED, 5)]
    );
    // On time (within the grace) it runs.
    let p = decide(
        &s,
        &State::default(),
        ts("2027-01-01T00:10:30Z"),
        created,
        &states(NONE),
    );
    assert_eq!(p.start, Some(ts("2027-01-01T00:10:00Z")));
}

#[test]
fn deadline_records_old_periods_and_all_starts_the_rest() {
    let mut s = spec("* * * * * *"); // every second
    s.catch_up = CatchUp::All;
    s.concurrency_policy = ConcurrencyPolicy::Allow;
    s.starting_deadline_seconds = Some(5);
    let created = ts("2027-01-01T00:00:00Z");
    // Two weeks down: 1.2 million periods, folded into one record, decided without iterating.
    let now = ts("2027-01-15T00:00:00Z");
    let p = decide(&s, &State::default(), now, created, &states(NONE));
    assert_eq!(
        recorded(&p),
        vec![(Outcome::Missed, reason::DEADLINE_EXCEEDED, 14 * 86400 - 5)]
    );
    assert_eq!(p.start, Some(now - SignedDuration::from_secs(4)));
    assert_eq!(
        p.wake_at,
        Some(now),
        "more are pending: decide again at once"
    );
}

#[test]
fn suspended_periods_wait_within_the_deadline_and_run_on_resume_with_all() {
    let mut s = spec("*/10 * * * *");
    s.catch_up = CatchUp::All;
    s.starting_deadline_seconds = Some(25 * 60);
    s.suspend = Some(true);
    let created = ts("2027-01-01T00:00:00Z");
    let now = ts("2027-01-01T00:55:00Z");
    let p = decide(&s, &State::default(), now, created, &states(NONE));
    assert_eq!(p.start, None);
    assert_eq!(p.waiting, Some(Waiting::Suspended));
    assert_eq!(recorded(&p), vec![(Outcome::Skipped, reason::SUSPENDED, 3)]); // 00:10..00:30
    let mut st = State::default();
    apply(&mut st, &p);
    s.suspend = Some(false);
    let p = decide(&s, &st, now, created, &states(NONE));
    assert_eq!(p.start, Some(ts("2027-01-01T00:40:00Z")));
}

#[test]
fn suspended_with_catch_up_none_skips_at_once_and_resume_fires_nothing_old() {
    let mut s = spec("*/10 * * * *");
    s.catch_up = CatchUp::None;
    s.suspend = Some(true);
    let created = ts("2027-01-01T00:00:00Z");
    let mut st = State::default();
    let p = decide(&s, &st, ts("2027-01-01T00:10:00Z"), created, &states(NONE));
    assert_eq!(recorded(&p), vec![(Outcome::Skipped, reason::SUSPENDED, 1)]);
    apply(&mut st, &p);
    s.suspend = Some(false);
    let p = decide(&s, &st, ts("2027-01-01T00:15:00Z"), created, &states(NONE));
    assert_eq!(p.start, None);
    assert!(p.records.is_empty());
}

#[test]
fn forbid_waits_or_skips_and_replace_replaces() {
    let created = ts("2027-01-01T00:00:00Z");
    let now = ts("2027-01-01T00:20:00Z");
    let running = run_ref(ts("2027-01-01T00:10:00Z"));
    let st = State {
        decided_through: Some(running.period.0),
        fingerprint: Some(fingerprint(&spec("*/10 * * * *"))),
        active: vec![running.clone()],
        run_count: 0,
    };
    let active = states(&[(running.job_name.as_str(), JobState::Active)]);

    let s = spec("*/10 * * * *");
    let p = decide(&s, &st, now, created, &active);
    assert_eq!(
        (p.start, p.waiting),
        (None, Some(Waiting::ConcurrencyForbid))
    );

    let mut none = s.clone();
    none.catch_up = CatchUp::None;
    let p = decide(&none, &st, now, created, &active);
    assert_eq!(p.start, None);
    assert_eq!(
        recorded(&p),
        vec![(Outcome::Skipped, reason::CONCURRENCY_FORBID, 1)]
    );

    let mut replace = s.clone();
    replace.concurrency_policy = ConcurrencyPolicy::Replace;
    let p = decide(&replace, &st, now, created, &active);
    assert_eq!(p.start, Some(now));
    assert_eq!(p.replace, vec![running.clone()]);

    let mut allow = s.clone();
    allow.concurrency_policy = ConcurrencyPolicy::Allow;
    let p = decide(&allow, &st, now, created, &active);
    assert_eq!(p.start, Some(now));
    assert!(p.replace.is_empty());

    // Once the run finishes, Forbid starts the waiting period.
    let done = states(&[(running.job_name.as_str(), JobState::Succeeded(now))]);
    let p = decide(&s, &st, now, created, &done);
    assert_eq!(p.start, Some(now));
    assert_eq!(p.finished.len(), 1);
}

#[test]
fn a_schedule_edit_never_fires_retroactively() {
    let created = ts("2027-01-01T00:00:00Z");
    let old = spec("0 0 * * *");
    let st = State {
        decided_through: Some(created),
        fingerprint: Some(fingerprint(&old)),
        active: vec![],
        run_count: 0,
    };
    // At 10:30 the schedule becomes hourly: 01:00 .. 10:00 are not due under the new schedule.
    let new = spec("0 * * * *");
    let now = ts("2027-01-01T10:30:00Z");
    let p = decide(&new, &st, now, created, &states(NONE));
    assert_eq!(p.start, None);
    assert!(p.records.is_empty());
    assert_eq!(p.decided_through, Some(now));
    assert_eq!(p.wake_at, Some(ts("2027-01-01T11:00:00Z")));
}

#[test]
fn a_schedule_edit_records_the_waiting_periods_it_drops() {
    let created = ts("2027-01-01T00:00:00Z");
    let old = spec("*/10 * * * *");
    let new = spec("0 * * * *");
    let now = ts("2027-01-01T00:35:00Z");
    // Forbid: 00:20 and 00:30 wait behind the run of 00:10; suspended: they wait for resume;
    // no controller: they were missed while it was down. Then the schedule is edited.
    let running = run_ref(ts("2027-01-01T00:10:00Z"));
    let mut suspended = new.clone();
    suspended.suspend = Some(true);
    for (edited, active) in [
        (&new, vec![running.clone()]),
        (&suspended, vec![]),
        (&new, vec![]),
    ] {
        let st = State {
            decided_through: Some(ts("2027-01-01T00:10:00Z")),
            fingerprint: Some(fingerprint(&old)),
            active,
            run_count: 0,
        };
        let p = decide(edited, &st, now, created, &states(NONE));
        assert_eq!(
            recorded(&p),
            vec![(Outcome::Skipped, reason::SCHEDULE_CHANGED, 2)],
            "{edited:?}"
        );
        assert_eq!(p.records[0].period.0, ts("2027-01-01T00:20:00Z"));
        assert_eq!(
            p.records[0].last_period.as_ref().map(|t| t.0),
            Some(ts("2027-01-01T00:30:00Z"))
        );
        assert_eq!(p.start, None, "never retroactively");
        assert_eq!(p.decided_through, Some(now));
    }
    // A fingerprint that cannot be read back (written by an older version) records nothing.
    let st = State {
        decided_through: Some(ts("2027-01-01T00:10:00Z")),
        fingerprint: Some("garbage".into()),
        active: vec![],
        run_count: 0,
    };
    assert!(
        decide(&new, &st, now, created, &states(NONE))
            .records
            .is_empty()
    );
}

#[test]
fn fingerprints_read_back_to_their_schedule() {
    let mut s = spec("0 2 * * *");
    s.time_zone = Some("Europe/Berlin".into());
    s.dst_policy.gap = crate::schedule::GapPolicy::Shift;
    let back = fingerprinted(&fingerprint(&s)).expect("parses");
    let t = ts("2027-03-28T00:00:00Z");
    assert_eq!(back.next_after(t), sched(&s).next_after(t));
    assert_eq!(fingerprint(&s), "0 2 * * *|Europe/Berlin|Shift/First");
}

#[test]
fn an_untrusted_clock_or_a_rejected_template_starts_nothing() {
    let s = spec("*/10 * * * *");
    let created = ts("2027-01-01T00:00:00Z");
    let st = states(NONE);
    for why in [Waiting::ClockUntrusted, Waiting::JobTemplateInvalid] {
        let obs = Observed {
            key: "ns/job",
            consecutive_failures: 0,
            run_count: 0,
            now: ts("2027-01-01T00:10:00Z"),
            created,
            blocked: Some(why),
            job_states: &st,
        };
        let p = plan(&s, &sched(&s), None, None, &[], &obs);
        assert_eq!((p.start, p.waiting), (None, Some(why)));
    }
}

#[test]
fn an_untrusted_clock_decides_nothing_not_even_misses() {
    let s = spec("*/10 * * * *");
    let created = ts("2027-01-01T00:00:00Z");
    let cursor = ts("2027-01-01T00:10:00Z");
    let st = states(NONE);
    // Our clock says 05:00: by it, dozens of periods are pending; by the API server's, maybe none.
    let obs = Observed {
        key: "ns/job",
        consecutive_failures: 0,
        run_count: 0,
        now: ts("2027-01-01T05:00:00Z"),
        created,
        blocked: Some(Waiting::ClockUntrusted),
        job_states: &st,
    };
    let fp = fingerprint(&s);
    let p = plan(&s, &sched(&s), Some(cursor), Some(&fp), &[], &obs);
    assert_eq!(p.decided_through, Some(cursor));
    assert!(p.records.is_empty() && p.start.is_none());
    // A schedule edit seen meanwhile is applied once the clock is trusted, not now.
    let p = plan(
        &spec("0 * * * *"),
        &sched(&spec("0 * * * *")),
        Some(cursor),
        Some(&fp),
        &[],
        &obs,
    );
    assert_eq!(
        (p.decided_through, p.fingerprint.as_str()),
        (Some(cursor), fp.as_str())
    );
}

#[test]
fn periods_past_their_deadline_while_the_backstop_is_down_say_so() {
    let mut s = spec("*/10 * * * *");
    s.starting_deadline_seconds = Some(60);
    let st = states(NONE);
    let obs = Observed {
        key: "ns/job",
        consecutive_failures: 0,
        run_count: 0,
        now: ts("2027-01-01T00:35:00Z"),
        created: ts("2027-01-01T00:00:00Z"),
        blocked: Some(Waiting::BackstopUnavailable),
        job_states: &st,
    };
    let p = plan(&s, &sched(&s), None, None, &[], &obs);
    assert_eq!(p.start, None);
    assert_eq!(
        recorded(&p),
        vec![(Outcome::Missed, reason::BACKSTOP_UNAVAILABLE, 3)]
    );
}

#[test]
fn finished_runs_are_reported_with_their_outcome() {
    let s = spec("0 0 1 1 *");
    let now = ts("2027-06-01T00:00:00Z");
    let (a, b, c) = (
        run_ref(ts("2027-01-01T00:00:00Z")),
        run_ref(ts("2026-01-01T00:00:00Z")),
        run_ref(ts("2025-01-01T00:00:00Z")),
    );
    let st = State {
        decided_through: Some(a.period.0),
        fingerprint: Some(fingerprint(&s)),
        active: vec![a.clone(), b.clone(), c.clone()],
        run_count: 0,
    };
    let js = states(&[
        (a.job_name.as_str(), JobState::Succeeded(now)),
        (b.job_name.as_str(), JobState::Failed(now)),
        (c.job_name.as_str(), JobState::Gone),
    ]);
    let p = decide(&s, &st, now, ts("2024-01-01T00:00:00Z"), &js);
    let outcomes: Vec<Outcome> = p.finished.iter().map(|f| f.1).collect();
    assert_eq!(
        outcomes,
        vec![Outcome::Succeeded, Outcome::Failed, Outcome::Failed]
    );
    assert!(p.still_active.is_empty());
}

/// A random schedule from a small generator of common shapes.
/// What a simulated controller did: its final state, the periods it started, its records.
struct Simulated {
    state: State,
    started: Vec<Timestamp>,
    records: Vec<HistoryEntry>,
}

impl Simulated {
    /// Every period is started at most once, in order, and every period up to the cursor was
    /// started or recorded, exactly once. Returns the cursor.
    fn check_each_period_decided_once(
        &self,
        sc: &Schedule,
        created: Timestamp,
    ) -> Result<Timestamp, TestCaseError> {
        for w in self.started.windows(2) {
            prop_assert!(w[0] < w[1], "started out of order or twice: {:?}", w);
        }
        let through = self.state.decided_through.unwrap();
        let due = sc.count_between(created, through, u64::MAX);
        let recorded: u64 = self.records.iter().map(|r| r.count).sum();
        prop_assert_eq!(self.started.len() as u64 + recorded, due);
        Ok(through)
    }
}

/// A controller that wakes when its plans say, from `created` to `end`, down during `down`;
/// `check` sees every plan. Runs finish at once (the specs use Allow, which never waits).
fn simulate(
    s: &SingletonJobSpec,
    created: Timestamp,
    end: Timestamp,
    down: &[(Timestamp, Timestamp)],
    mut check: impl FnMut(&Plan, Timestamp) -> Result<(), TestCaseError>,
) -> Result<Simulated, TestCaseError> {
    let mut run = Simulated {
        state: State::default(),
        started: vec![],
        records: vec![],
    };
    let none = states(NONE);
    let mut now = created;
    for _ in 0..200_000 {
        if now > end {
            break;
        }
        if let Some(back) = down
            .iter()
            .filter(|(a, b)| now >= *a && now < *b)
            .map(|(_, b)| *b)
            .max()
        {
            now = back;
            continue;
        }
        let p = decide(s, &run.state, now, created, &none);
        check(&p, now)?;
        run.records.extend(p.records.iter().cloned());
        run.started.extend(p.start);
        apply(&mut run.state, &p);
        run.state.active.clear();
        now = match p.wake_at {
            Some(w) if w > now => w,
            Some(_) => now,
            None => break,
        };
    }
    Ok(run)
}

/// Outages of a simulated controller: each `(a, len)` is down from `created + 10 a` seconds for
/// `len` seconds.
fn outage_windows(created: Timestamp, outages: &[(i64, i64)]) -> Vec<(Timestamp, Timestamp)> {
    outages
        .iter()
        .map(|(a, len)| {
            let a = created + SignedDuration::from_secs(*a * 10);
            (a, a + SignedDuration::from_secs(*len))
        })
        .collect()
}

fn schedule_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        (5u32..30).prop_map(|n| format!("*/{n} * * * * *")),
        (1u32..30).prop_map(|n| format!("*/{n} * * * *")),
        (0u32..60, 0u32..24).prop_map(|(m, h)| format!("{m} {h} * * *")),
        (0u32..60).prop_map(|m| format!("{m} * * * *")),
        Just("0 9 * * MON-FRI".to_string()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Random outages of a controller that wakes when told to: every period in the window is
    /// started at most once, never before its instant, and every period is started or recorded.
    #[test]
    fn each_period_started_at_most_once_and_none_lost(
        schedule in schedule_strategy(),
        catch_up in prop_oneof![Just(CatchUp::None), Just(CatchUp::Latest), Just(CatchUp::All)],
        deadline in proptest::option::of(1i64..7200),
        outages in proptest::collection::vec((0i64..4_000, 0i64..20_000), 0..4),
        start_offset in 0i64..86_400,
    ) {
        let mut s = spec(&schedule);
        s.catch_up = catch_up;
        s.starting_deadline_seconds = deadline;
        s.concurrency_policy = ConcurrencyPolicy::Allow;
        let sc = sched(&s);
        let created = ts("2027-01-01T00:00:00Z") + SignedDuration::from_secs(start_offset);
        let end = created + SignedDuration::from_secs(12 * 3600);
        let down = outage_windows(created, &outages);
        let run = simulate(&s, created, end, &down, |p, now| {
            if let Some(x) = p.start {
                prop_assert!(x <= now, "started {x} before its instant (now {now})");
            }
            Ok(())
        })?;
        run.check_each_period_decided_once(&sc, created)?;
    }
}

fn weekends() -> crate::api::ExclusionsSpec {
    crate::api::ExclusionsSpec {
        rules: crate::schedule::DayRules {
            days: vec!["* * SAT,SUN".into()],
            ..Default::default()
        },
        ..Default::default()
    }
}

#[test]
fn several_schedules_run_their_union_once_per_instant() {
    let mut s = spec("");
    s.schedules = vec!["0 * * * *".into(), "*/30 * * * *".into()];
    let created = ts("2027-01-01T00:00:00Z");
    let mut st = State::default();
    let mut started = vec![];
    let mut now = created;
    while now < ts("2027-01-01T02:00:01Z") {
        let p = decide(&s, &st, now, created, &states(NONE));
        started.extend(p.start);
        apply(&mut st, &p);
        st.active.clear();
        now = p.wake_at.unwrap();
    }
    assert_eq!(
        started,
        [
            ts("2027-01-01T00:30:00Z"),
            ts("2027-01-01T01:00:00Z"),
            ts("2027-01-01T01:30:00Z"),
            ts("2027-01-01T02:00:00Z")
        ]
    );
    let fp = fingerprint(&s);
    assert_eq!(fp, "0 * * * *; */30 * * * *|UTC|AfterGap/First");
    let back = fingerprinted(&fp).unwrap();
    assert_eq!(back.expr(), "0 * * * *; */30 * * * *");
}

#[test]
fn excluded_periods_are_skipped_with_their_reason_and_never_started() {
    let mut s = spec("0 6 * * *");
    s.exclusions = Some(weekends());
    // Friday 2027-01-01 to Tuesday: the controller wakes when told to.
    let created = ts("2027-01-01T00:00:00Z");
    let mut st = State::default();
    let (mut started, mut records) = (vec![], vec![]);
    let mut now = created;
    while now < ts("2027-01-05T07:00:00Z") {
        let p = decide(&s, &st, now, created, &states(NONE));
        started.extend(p.start);
        records.extend(
            recorded(&p)
                .into_iter()
                .map(|(o, r, c)| (o, r.to_string(), c)),
        );
        apply(&mut st, &p);
        st.active.clear();
        now = p.wake_at.unwrap();
    }
    assert_eq!(
        started,
        [
            ts("2027-01-01T06:00:00Z"),
            ts("2027-01-04T06:00:00Z"),
            ts("2027-01-05T06:00:00Z")
        ]
    );
    let excluded = (Outcome::Skipped, reason::EXCLUDED.to_string(), 1);
    assert_eq!(records, [excluded.clone(), excluded]);
}

#[test]
fn catching_up_over_excluded_days_records_them_as_excluded() {
    // Down from Friday 05:00 to Monday 07:00: Friday's period is superseded by Monday's, and
    // the weekend's are Excluded, not Missed.
    let mut s = spec("0 6 * * *");
    s.exclusions = Some(weekends());
    let created = ts("2027-01-01T00:00:00Z");
    let p = decide(
        &s,
        &State::default(),
        ts("2027-01-04T07:00:00Z"),
        created,
        &states(NONE),
    );
    assert_eq!(p.start, Some(ts("2027-01-04T06:00:00Z")));
    assert_eq!(
        recorded(&p),
        [
            (Outcome::Missed, reason::SUPERSEDED, 1),
            (Outcome::Skipped, reason::EXCLUDED, 2)
        ]
    );
    // The newest period excluded: the newest allowed one runs, the excluded ones are recorded.
    let p = decide(
        &s,
        &State::default(),
        ts("2027-01-02T07:00:00Z"),
        created,
        &states(NONE),
    );
    assert_eq!(p.start, Some(ts("2027-01-01T06:00:00Z")));
    let mut st = State::default();
    apply(&mut st, &p);
    let next = decide(&s, &st, ts("2027-01-02T07:00:00Z"), created, &states(NONE));
    assert_eq!(recorded(&next), [(Outcome::Skipped, reason::EXCLUDED, 1)]);
}

#[test]
fn a_shifted_period_starts_at_its_shifted_instant_not_before() {
    let mut s = spec("0 6 1 * *");
    s.exclusions = Some(crate::api::ExclusionsSpec {
        action: crate::schedule::ExcludedAction::NextAllowedDay,
        ..weekends()
    });
    // 1 May 2027 is a Saturday: the period moves to Monday 3 May 06:00.
    let created = ts("2027-04-20T00:00:00Z");
    let p = decide(
        &s,
        &State::default(),
        ts("2027-05-01T06:00:00Z"),
        created,
        &states(NONE),
    );
    assert_eq!(p.start, None);
    assert_eq!(p.wake_at, Some(ts("2027-05-03T06:00:00Z")));
    let p = decide(
        &s,
        &State::default(),
        ts("2027-05-03T06:00:00Z"),
        created,
        &states(NONE),
    );
    assert_eq!(p.start, Some(ts("2027-05-03T06:00:00Z")));
    assert!(p.records.is_empty());
}

#[test]
fn an_edit_of_the_excluded_days_never_fires_a_past_period() {
    // Saturday excluded and skipped; on Sunday the exclusion is removed: Saturday never runs.
    let mut s = spec("0 6 * * *");
    s.exclusions = Some(weekends());
    let created = ts("2027-01-01T00:00:00Z");
    let mut st = State::default();
    let p = decide(&s, &st, ts("2027-01-01T06:00:00Z"), created, &states(NONE));
    apply(&mut st, &p);
    st.active.clear();
    // Saturday 06:00 comes and goes while Forbid... no: it is recorded as excluded at once.
    let p = decide(&s, &st, ts("2027-01-02T06:00:00Z"), created, &states(NONE));
    assert_eq!(recorded(&p), [(Outcome::Skipped, reason::EXCLUDED, 1)]);
    // Sunday 05:00: the exclusions change, with Sunday 06:00 still ahead and Saturday past.
    s.exclusions = Some(crate::api::ExclusionsSpec {
        rules: crate::schedule::DayRules {
            dates: vec!["2027-01-08".into()],
            ..Default::default()
        },
        ..Default::default()
    });
    let before = st.fingerprint.clone().unwrap();
    let p = decide(&s, &st, ts("2027-01-03T05:00:00Z"), created, &states(NONE));
    assert_ne!(p.fingerprint, before, "the edit changes the fingerprint");
    assert_eq!(p.start, None);
    assert_eq!(p.wake_at, Some(ts("2027-01-03T06:00:00Z")));
    // An edit seen late (after a period that the old rules excluded) records, never runs, it.
    let mut late = st.clone();
    late.decided_through = Some(ts("2027-01-01T06:00:00Z"));
    let p = decide(
        &s,
        &late,
        ts("2027-01-02T07:00:00Z"),
        created,
        &states(NONE),
    );
    assert_eq!(p.start, None);
    assert_eq!(
        recorded(&p),
        [(Outcome::Skipped, reason::SCHEDULE_CHANGED, 1)]
    );
}

#[test]
fn jitter_delays_the_start_within_its_window_and_deadlines_count_from_its_end() {
    let mut s = spec("0 6 * * *");
    s.jitter_seconds = Some(600);
    s.catch_up = CatchUp::None;
    let created = ts("2027-01-01T00:00:00Z");
    let period = ts("2027-01-01T06:00:00Z");
    let offset = crate::schedule::jitter("ns/job", period, 600);
    assert!(offset > SignedDuration::ZERO && offset < SignedDuration::from_secs(600));
    let p = decide(&s, &State::default(), period, created, &states(NONE));
    assert_eq!(p.start, None);
    assert_eq!(p.wake_at, Some(period + offset));
    let p = decide(
        &s,
        &State::default(),
        period + offset,
        created,
        &states(NONE),
    );
    assert_eq!(
        p.start,
        Some(period),
        "the period keeps its instant as its identity"
    );
    // catchUp None's grace counts from the end of the window: still startable 10m30s later.
    let p = decide(
        &s,
        &State::default(),
        period + SignedDuration::from_secs(630),
        created,
        &states(NONE),
    );
    assert_eq!(p.start, Some(period));
}

fn day_schedule_strategy() -> impl Strategy<Value = Vec<String>> {
    let one = prop_oneof![
        (0u32..60, 0u32..24).prop_map(|(m, h)| format!("{m} {h} * * *")),
        (0u32..60, 1u32..7).prop_map(|(m, h)| format!("{m} */{h} * * *")),
        (1u32..29).prop_map(|d| format!("0 6 {d} * *")),
        Just("0 9 * * MON-FRI".to_string()),
    ];
    proptest::collection::vec(one, 1..3)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Several schedules, excluded days (skipped or shifted), jitter and outages: every period
    /// is started at most once and never before its instant plus its jitter, no excluded period
    /// starts, and every period is started or recorded; the excluded ones as Excluded.
    #[test]
    fn excluded_shifted_and_jittered_periods_are_each_decided_once(
        schedules in day_schedule_strategy(),
        catch_up in prop_oneof![Just(CatchUp::None), Just(CatchUp::Latest), Just(CatchUp::All)],
        shift in any::<bool>(),
        jitter_seconds in proptest::option::of(1i32..1800),
        dates in proptest::collection::vec(0i64..40, 0..5),
        outages in proptest::collection::vec((0i64..40 * 24, 1i64..72), 0..3),
    ) {
        let mut s = spec("");
        s.schedules = schedules;
        s.catch_up = catch_up;
        s.concurrency_policy = ConcurrencyPolicy::Allow;
        s.jitter_seconds = jitter_seconds;
        let created = ts("2027-03-01T00:00:00Z");
        let mut x = weekends();
        x.rules.dates = dates
            .iter()
            .map(|d| (created + SignedDuration::from_hours(24 * d)).to_string()[..10].to_string())
            .collect();
        if shift {
            x.action = crate::schedule::ExcludedAction::NextAllowedDay;
        }
        s.exclusions = Some(x);
        let sc = sched(&s);
        let end = created + SignedDuration::from_hours(24 * 40);
        let down: Vec<(Timestamp, Timestamp)> = outages
            .iter()
            .map(|(a, len)| {
                let a = created + SignedDuration::from_hours(*a);
                (a, a + SignedDuration::from_hours(*len))
            })
            .collect();
        let run = simulate(&s, created, end, &down, |p, now| {
            if let Some(x) = p.start {
                let jitter = crate::schedule::jitter("ns/job", x, s.jitter_window());
                prop_assert!(x + jitter <= now, "started {x} before its jittered start");
                prop_assert!(!sc.excluded(x), "started excluded period {x}");
            }
            Ok(())
        })?;
        let through = run.check_each_period_decided_once(&sc, created)?;
        let excluded_recorded: u64 = run
            .records
            .iter()
            .filter(|r| r.reason.as_deref() == Some(reason::EXCLUDED))
            .map(|r| r.count)
            .sum();
        let excluded_due = sc
            .iter_after(created)
            .take_while(|t| *t <= through)
            .filter(|t| sc.excluded(*t))
            .count() as u64;
        prop_assert_eq!(excluded_recorded, excluded_due);
    }
}

#[test]
fn a_run_not_succeeded_by_its_completion_deadline_is_late_once() {
    let mut s = spec("0 6 * * *");
    s.completion_deadline_seconds = Some(3600);
    let period = ts("2027-01-01T06:00:00Z");
    let created = ts("2027-01-01T00:00:00Z");
    let st = State {
        decided_through: Some(period),
        fingerprint: Some(fingerprint(&s)),
        active: vec![run_ref(period)],
        run_count: 0,
    };
    let before = decide(&s, &st, ts("2027-01-01T06:59:59Z"), created, &states(NONE));
    assert!(before.late.is_empty());
    assert_eq!(
        before.wake_at,
        Some(ts("2027-01-01T07:00:00Z")),
        "woken at the deadline"
    );
    let at = decide(&s, &st, ts("2027-01-01T07:00:00Z"), created, &states(NONE));
    assert_eq!(at.late.len(), 1);
    assert!(at.still_active[0].late);
    let mut marked = st.clone();
    marked.active = at.still_active.clone();
    let again = decide(
        &s,
        &marked,
        ts("2027-01-01T07:30:00Z"),
        created,
        &states(NONE),
    );
    assert!(again.late.is_empty(), "the Event and metric come once");
    assert!(again.still_active[0].late);
    // A run that finished after its deadline between two looks is late too; one before is not.
    let job = run_ref(period).job_name;
    for (finished, late) in [
        ("2027-01-01T07:00:01Z", true),
        ("2027-01-01T06:59:00Z", false),
    ] {
        let done = states(&[(job.as_str(), JobState::Succeeded(ts(finished)))]);
        let p = decide(&s, &st, ts("2027-01-01T08:00:00Z"), created, &done);
        assert_eq!(p.finished[0].0.late, late, "finished at {finished}");
    }
}

#[test]
fn consecutive_failures_suspend_and_a_success_or_a_suspension_starts_the_count_again() {
    let mut s = spec("*/10 * * * *");
    s.suspend_after_consecutive_failures = Some(2);
    s.concurrency_policy = ConcurrencyPolicy::Allow;
    let created = ts("2027-01-01T00:00:00Z");
    let failed = |p: &str, at: &str| (run_ref(ts(p)), Outcome::Failed, ts(at));
    let ok = |p: &str, at: &str| (run_ref(ts(p)), Outcome::Succeeded, ts(at));
    assert_eq!(
        consecutive_failures(
            &s,
            1,
            &[failed("2027-01-01T00:10:00Z", "2027-01-01T00:11:00Z")]
        ),
        2
    );
    // In the order they finished, not their periods'.
    let runs = [
        failed("2027-01-01T00:10:00Z", "2027-01-01T00:25:00Z"),
        ok("2027-01-01T00:20:00Z", "2027-01-01T00:21:00Z"),
    ];
    assert_eq!(consecutive_failures(&s, 5, &runs), 1);
    let mut suspended = s.clone();
    suspended.suspend = Some(true);
    assert_eq!(consecutive_failures(&suspended, 5, &runs), 0);
    assert!(suspend_after_failures(&s, 2));
    assert!(!suspend_after_failures(&s, 1));
    assert!(!suspend_after_failures(&suspended, 9));

    // The second failure is seen while a period is due: it does not start, the plan suspends.
    let mut st = State {
        decided_through: Some(ts("2027-01-01T00:10:00Z")),
        fingerprint: Some(fingerprint(&s)),
        active: vec![run_ref(ts("2027-01-01T00:10:00Z"))],
        run_count: 0,
    };
    let job = st.active[0].job_name.clone();
    let done = states(&[(job.as_str(), JobState::Failed(ts("2027-01-01T00:19:00Z")))]);
    let obs = Observed {
        key: "ns/job",
        consecutive_failures: 1,
        run_count: 0,
        now: ts("2027-01-01T00:20:00Z"),
        created,
        blocked: None,
        job_states: &done,
    };
    let p = plan(
        &s,
        &sched(&s),
        st.decided_through,
        st.fingerprint.as_deref(),
        &st.active,
        &obs,
    );
    assert!(p.suspend);
    assert_eq!(p.consecutive_failures, 2);
    assert_eq!(p.start, None, "nothing starts while it is being suspended");
    assert_eq!(p.waiting, Some(Waiting::Suspended));
    st.active.clear();
}

/// Issue 19: an every-second Allow schedule with catchUp All, suspended for a day, owes 86,400
/// periods on resume; it starts at most `catchUpLimit` (the newest) and records the rest.
#[test]
fn catch_up_all_after_a_suspended_day_starts_at_most_the_limit() {
    let mut s = spec("* * * * * *");
    s.catch_up = CatchUp::All;
    s.concurrency_policy = ConcurrencyPolicy::Allow;
    s.max_active = Some(1000);
    s.suspend = Some(true);
    let created = ts("2027-01-01T00:00:00Z");
    let now = created + SignedDuration::from_hours(24);
    let mut st = State {
        decided_through: Some(created),
        fingerprint: Some(fingerprint(&s)),
        active: vec![],
        run_count: 0,
    };
    // Suspended: the periods beyond the newest 100 are recorded at once; nothing starts.
    let p = decide(&s, &st, now, created, &states(NONE));
    assert_eq!(p.start, None);
    assert_eq!(p.waiting, Some(Waiting::Suspended));
    assert_eq!(
        recorded(&p),
        vec![(Outcome::Missed, reason::CATCH_UP_LIMIT, 86_400 - 100)]
    );
    apply(&mut st, &p);
    // Resumed: exactly the 100 newest start, oldest first, one per decision.
    s.suspend = None;
    let mut started = vec![];
    for _ in 0..200 {
        let p = decide(&s, &st, now, created, &states(NONE));
        assert!(p.records.is_empty(), "{:?}", p.records);
        let Some(x) = p.start else { break };
        started.push(x);
        apply(&mut st, &p);
    }
    assert_eq!(started.len(), 100);
    assert_eq!(started[0], now - SignedDuration::from_secs(99));
    assert_eq!(*started.last().unwrap(), now);
}

/// A controller whose runs each stay active `run_secs` after they start; otherwise as
/// [`simulate`]. `check` sees every plan and the runs active before it.
fn simulate_long_runs(
    s: &SingletonJobSpec,
    created: Timestamp,
    end: Timestamp,
    run_secs: i64,
    mut check: impl FnMut(&Plan, usize) -> Result<(), TestCaseError>,
) -> Result<Simulated, TestCaseError> {
    let mut run = Simulated {
        state: State::default(),
        started: vec![],
        records: vec![],
    };
    let mut started_at: HashMap<String, Timestamp> = HashMap::new();
    let mut now = created;
    for _ in 0..200_000 {
        if now > end {
            break;
        }
        let js: HashMap<String, JobState> = run
            .state
            .active
            .iter()
            .filter_map(|r| {
                let done = started_at[&r.job_name] + SignedDuration::from_secs(run_secs);
                (done <= now).then(|| (r.job_name.clone(), JobState::Succeeded(done)))
            })
            .collect();
        let p = decide(s, &run.state, now, created, &js);
        check(&p, run.state.active.len())?;
        run.records.extend(p.records.iter().cloned());
        run.started.extend(p.start);
        if let Some(x) = p.start {
            started_at.insert(run_ref(x).job_name, now);
        }
        apply(&mut run.state, &p);
        // Look again when the next run finishes, too.
        let finish = run
            .state
            .active
            .iter()
            .map(|r| started_at[&r.job_name] + SignedDuration::from_secs(run_secs))
            .min();
        let wake = match (p.wake_at, finish) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        now = match wake {
            Some(w) if w > now => w,
            Some(_) => now,
            None => break,
        };
    }
    Ok(run)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// catchUp All after an outage of any length starts at most `catchUpLimit` of the periods
    /// that fell due while no controller ran; the others are recorded (Missed, CatchUpLimit), and
    /// every period is still decided exactly once.
    #[test]
    fn catch_up_all_never_starts_more_than_the_limit(
        every in 1u32..30,
        limit in 1i32..60,
        outage_start in 0i64..600,
        outage_len in 0i64..5_000,
    ) {
        let mut s = spec(&format!("*/{every} * * * * *"));
        s.catch_up = CatchUp::All;
        s.catch_up_limit = Some(limit);
        s.concurrency_policy = ConcurrencyPolicy::Allow;
        let sc = sched(&s);
        let created = ts("2027-01-01T00:00:00Z");
        let end = created + SignedDuration::from_secs(outage_start + outage_len + 3600);
        let a = created + SignedDuration::from_secs(outage_start);
        let b = a + SignedDuration::from_secs(outage_len);
        let run = simulate(&s, created, end, &[(a, b)], |_, _| Ok(()))?;
        run.check_each_period_decided_once(&sc, created)?;
        // Down from `a` (inclusive) until `b`: the periods in [a, b] are pending at `b`.
        // (Periods at or before `created` are never due.)
        let from = (a - SignedDuration::from_nanos(1)).max(created);
        let owed = sc.count_between(from, b, u64::MAX);
        let caught_up = run.started.iter().filter(|x| **x >= a && **x <= b).count() as u64;
        prop_assert!(caught_up <= limit as u64, "{caught_up} of {owed} late periods started, limit {limit}");
        prop_assert_eq!(caught_up, owed.min(limit as u64));
        let dropped: u64 = run.records.iter()
            .filter(|r| r.reason.as_deref() == Some(reason::CATCH_UP_LIMIT))
            .map(|r| r.count).sum();
        prop_assert_eq!(dropped, owed.saturating_sub(limit as u64));
    }

    /// Under Allow, runs that outlast their period never exceed `maxActive` at once; the periods
    /// that could not start are decided (Skipped with reason MaxActive under catchUp None, else
    /// waiting and then Superseded, past their deadline or CatchUpLimit), none lost.
    #[test]
    fn allow_never_exceeds_max_active(
        every in 1u32..20,
        max_active in 1i32..8,
        run_secs in 1i64..120,
        catch_up in prop_oneof![Just(CatchUp::None), Just(CatchUp::Latest), Just(CatchUp::All)],
        deadline in proptest::option::of(1i64..600),
    ) {
        let mut s = spec(&format!("*/{every} * * * * *"));
        s.catch_up = catch_up;
        s.starting_deadline_seconds = deadline;
        s.concurrency_policy = ConcurrencyPolicy::Allow;
        s.max_active = Some(max_active);
        s.catch_up_limit = Some(50);
        let sc = sched(&s);
        let created = ts("2027-01-01T00:00:00Z");
        let end = created + SignedDuration::from_secs(400);
        let mut peak = 0;
        let run = simulate_long_runs(&s, created, end, run_secs, |p, _| {
            let active = p.still_active.len() + usize::from(p.start.is_some());
            peak = peak.max(active);
            prop_assert!(active <= max_active as usize, "{active} active, maxActive {max_active}");
            Ok(())
        })?;
        run.check_each_period_decided_once(&sc, created)?;
        if run_secs > i64::from(every) * i64::from(max_active) {
            // Runs outlast maxActive periods: the bound is reached.
            prop_assert_eq!(peak, max_active as usize);
        }
        if catch_up == CatchUp::None && run_secs > i64::from(every) * (i64::from(max_active) + 1) {
            prop_assert!(run.records.iter().any(|r| r.reason.as_deref() == Some(reason::MAX_ACTIVE)));
        }
    }
}

/// F9: a weekly run on Friday ran; on Saturday a holiday calendar excludes that Friday, moving
/// its periods to the next allowed day. The Friday period was decided before the edit: it is not
/// run again on Monday under a new identity (new period, Job name, claim row, idempotency key),
/// while a later Friday on an excluded day still moves.
#[test]
fn a_retroactive_exclusion_never_runs_a_decided_period_again() {
    let mut s = spec("0 6 * * 5");
    let created = ts("2027-01-01T00:00:00Z");
    let mut st = State::default();
    // Friday 8 January 06:00 runs and finishes.
    let p = decide(&s, &st, ts("2027-01-08T06:00:00Z"), created, &states(NONE));
    assert_eq!(p.start, Some(ts("2027-01-08T06:00:00Z")));
    apply(&mut st, &p);
    st.active.clear();
    // Saturday: that Friday and the next are declared holidays, moved to the next business day.
    s.exclusions = Some(crate::api::ExclusionsSpec {
        action: crate::schedule::ExcludedAction::NextAllowedDay,
        rules: crate::schedule::DayRules {
            dates: vec!["2027-01-08".into(), "2027-01-15".into()],
            days: vec!["* * SAT,SUN".into()],
            ..Default::default()
        },
        ..Default::default()
    });
    let decide_floored = |st: &State, floor: Option<Timestamp>, now: Timestamp| {
        let obs = Observed {
            key: "ns/job",
            consecutive_failures: 0,
            run_count: 0,
            now,
            created,
            blocked: None,
            job_states: &HashMap::new(),
        };
        let schedule = sched(&s).with_shift_floor(floor);
        plan(
            &s,
            &schedule,
            st.decided_through,
            st.fingerprint.as_deref(),
            &st.active,
            &obs,
        )
    };
    let saturday = ts("2027-01-09T10:00:00Z");
    let fp = fingerprint_with(&s, &sched(&s));
    let floor = shift_floor(
        &fp,
        st.fingerprint.as_deref(),
        st.decided_through,
        None,
        saturday,
    );
    assert_eq!(floor, Some(saturday), "the edit's cursor");
    let p = decide_floored(&st, floor, saturday);
    assert_eq!(p.start, None);
    assert_ne!(
        p.wake_at,
        Some(ts("2027-01-11T06:00:00Z")),
        "Friday's period does not come back on Monday"
    );
    apply(&mut st, &p);
    let kept = shift_floor(
        &fp,
        st.fingerprint.as_deref(),
        st.decided_through,
        floor,
        saturday,
    );
    assert_eq!(kept, floor, "kept while the schedule stays the same");
    let monday = decide_floored(&st, kept, ts("2027-01-11T06:00:00Z"));
    assert_eq!(monday.start, None, "{monday:?}");
    // The next Friday, excluded after the edit, moves to Monday 18 January as declared.
    let p = decide_floored(&st, kept, ts("2027-01-18T06:00:00Z"));
    assert_eq!(p.start, Some(ts("2027-01-18T06:00:00Z")));
    // Without the floor, Friday's period would run again on Monday (the finding).
    let unfloored = decide_floored(&st, None, ts("2027-01-11T06:00:00Z"));
    assert_eq!(unfloored.start, Some(ts("2027-01-11T06:00:00Z")));
}

/// F3: while the backstop cannot retire a finished run's token (Correctness, unavailable), the
/// run's outcome is not recorded: it stays active (Forbid waits for it), and it is recorded once
/// the retirement can be written.
#[test]
fn a_finished_run_is_not_recorded_before_its_token_can_be_retired() {
    let s = spec("*/10 * * * *");
    let created = ts("2027-01-01T00:00:00Z");
    let mut st = State::default();
    let p = decide(&s, &st, ts("2027-01-01T00:10:00Z"), created, &states(NONE));
    apply(&mut st, &p);
    let done = states(&[(
        "job-1798762200",
        JobState::Succeeded(ts("2027-01-01T00:10:05Z")),
    )]);
    let held = hold_outcomes(&done);
    let p = decide(&s, &st, ts("2027-01-01T00:20:00Z"), created, &held);
    assert!(p.finished.is_empty(), "{p:?}");
    assert_eq!(p.still_active.len(), 1);
    assert_eq!(
        p.start, None,
        "Forbid waits for the run whose outcome is held"
    );
    let p = decide(&s, &st, ts("2027-01-01T00:20:00Z"), created, &done);
    assert_eq!(p.finished.len(), 1);
    assert_eq!(p.start, Some(ts("2027-01-01T00:20:00Z")));
}

/// F6, F10: what a claim may wait for is bounded by its starting deadline, or without one by the
/// schedule's next instant.
#[test]
fn a_claims_wait_is_bounded_by_its_deadline_or_the_next_period() {
    let mut s = spec("0 * * * *");
    let p = ts("2027-01-01T06:00:00Z");
    assert_eq!(wait_bound(&s, p), Some(ts("2027-01-01T07:00:00Z")));
    s.starting_deadline_seconds = Some(120);
    assert_eq!(wait_bound(&s, p), Some(ts("2027-01-01T06:02:00Z")));
    s.starting_deadline_seconds = None;
    // A manual period (a trigger) waits until the next scheduled one.
    let manual = ts("2027-01-01T06:30:00.000123Z");
    assert_eq!(wait_bound(&s, manual), Some(ts("2027-01-01T07:00:00Z")));
}

fn at(s: &str) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> {
    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(ts(s)))
}

#[test]
fn no_period_before_start_at_or_after_end_at_runs_or_is_recorded() {
    let mut s = spec("0 * * * *");
    s.start_at = at("2027-01-01T05:00:00Z");
    s.end_at = at("2027-01-01T07:00:00Z");
    let created = ts("2027-01-01T00:30:00Z");
    // Before startAt nothing is due, and the next look is startAt's period, not each hour.
    let p = decide(
        &s,
        &State::default(),
        ts("2027-01-01T03:10:00Z"),
        created,
        &states(NONE),
    );
    assert_eq!(p.start, None);
    assert!(p.records.is_empty(), "{:?}", recorded(&p));
    assert_eq!(p.wake_at, Some(ts("2027-01-01T05:00:00Z")));
    // At startAt its period runs; the ones before it are not periods (nothing Superseded).
    let mut st = State::default();
    let p = decide(&s, &st, ts("2027-01-01T05:00:01Z"), created, &states(NONE));
    assert_eq!(p.start, Some(ts("2027-01-01T05:00:00Z")));
    assert!(p.records.is_empty(), "{:?}", recorded(&p));
    apply(&mut st, &p);
    st.active.clear();
    // endAt's own instant is included; nothing after it, and no look after it.
    let p = decide(&s, &st, ts("2027-01-01T07:00:00Z"), created, &states(NONE));
    assert_eq!(p.start, Some(ts("2027-01-01T07:00:00Z")));
    assert_eq!(
        recorded(&p),
        vec![(Outcome::Missed, reason::SUPERSEDED, 1)],
        "06:00 was missed while down, 07:00 runs"
    );
    apply(&mut st, &p);
    st.active.clear();
    let p = decide(&s, &st, ts("2027-01-02T12:00:00Z"), created, &states(NONE));
    assert_eq!(p.start, None);
    assert!(p.records.is_empty(), "{:?}", recorded(&p));
    assert_eq!(p.wake_at, None);
    let sc = sched(&s);
    let standing = bounds::standing(
        &s,
        &sc,
        st.decided_through.unwrap(),
        2,
        created,
        ts("2027-01-02T12:00:00Z"),
    );
    assert_eq!(standing, Some(bounds::Standing::EndAtPassed));
    // Moving endAt later resumes as `suspend: false` does: catchUp Latest runs the newest.
    s.end_at = at("2027-01-03T00:00:00Z");
    let p = decide(&s, &st, ts("2027-01-02T12:00:30Z"), created, &states(NONE));
    assert_eq!(p.start, Some(ts("2027-01-02T12:00:00Z")));
}

#[test]
fn max_runs_stops_the_schedule_until_it_is_raised() {
    let mut s = spec("*/10 * * * *");
    s.max_runs = Some(2);
    let created = ts("2027-01-01T00:00:00Z");
    let mut st = State::default();
    for (now, expect) in [
        ("2027-01-01T00:10:00Z", Some("2027-01-01T00:10:00Z")),
        ("2027-01-01T00:20:00Z", Some("2027-01-01T00:20:00Z")),
        ("2027-01-01T00:30:00Z", None),
        ("2027-01-01T05:00:00Z", None),
    ] {
        let p = decide(&s, &st, ts(now), created, &states(NONE));
        assert_eq!(p.start, expect.map(ts), "at {now}");
        assert!(p.records.is_empty(), "at {now}: {:?}", recorded(&p));
        if expect.is_none() {
            assert_eq!(
                p.wake_at, None,
                "an exhausted job is not looked at by the clock"
            );
        }
        apply(&mut st, &p);
        st.active.clear();
    }
    assert_eq!(st.run_count, 2);
    assert!(runs_exhausted(&s, st.run_count));
    let sc = sched(&s);
    let now = ts("2027-01-01T05:00:00Z");
    let standing = bounds::standing(&s, &sc, st.decided_through.unwrap(), 2, created, now);
    assert_eq!(standing, Some(bounds::Standing::MaxRunsReached));
    s.max_runs = Some(3);
    let p = decide(&s, &st, ts("2027-01-01T05:00:10Z"), created, &states(NONE));
    assert_eq!(p.start, Some(ts("2027-01-01T05:00:00Z")));
}

#[test]
fn bounds_that_hold_no_period_are_said_so() {
    let mut s = spec("0 0 1 1 *");
    s.start_at = at("2027-02-01T00:00:00Z");
    s.end_at = at("2027-12-01T00:00:00Z");
    let created = ts("2027-01-15T00:00:00Z");
    let sc = sched(&s);
    let standing = bounds::standing(&s, &sc, created, 0, created, created);
    assert_eq!(standing, Some(bounds::Standing::NoPeriodInBounds));
    assert!(
        standing
            .unwrap()
            .message(&s, 0)
            .contains("nothing will run")
    );
    // An endAt before the SingletonJob was created holds no period either.
    let mut s = spec("0 * * * *");
    s.end_at = at("2027-01-01T00:00:00Z");
    let sc = sched(&s);
    let standing = bounds::standing(&s, &sc, created, 0, created, created);
    assert_eq!(standing, Some(bounds::Standing::NoPeriodInBounds));
    // Without bounds, no standing at all (no Ended condition).
    let s = spec("0 * * * *");
    assert_eq!(
        bounds::standing(&s, &sched(&s), created, 0, created, created),
        None
    );
}

#[test]
fn a_suspension_with_an_end_skips_its_periods_and_never_runs_them_late() {
    for catch_up in [CatchUp::None, CatchUp::Latest, CatchUp::All] {
        let mut s = spec("0 * * * *");
        s.catch_up = catch_up;
        s.suspend = Some(true);
        s.suspension = Some(crate::api::Suspension {
            until: at("2027-01-01T03:30:00Z"),
            reason: Some("finance freeze".into()),
            by: Some("alice".into()),
            since: None,
        });
        let created = ts("2027-01-01T00:30:00Z");
        let mut st = State::default();
        // While it lasts: each period is Skipped at once, with the reason; the look is at its end.
        let p = decide(&s, &st, ts("2027-01-01T01:00:05Z"), created, &states(NONE));
        assert_eq!(p.start, None);
        assert_eq!(recorded(&p), vec![(Outcome::Skipped, reason::SUSPENDED, 1)]);
        assert_eq!(
            p.records[0].message.as_deref(),
            Some("suspended until 2027-01-01T03:30:00Z, by alice: finance freeze")
        );
        assert_eq!(p.wake_at, Some(ts("2027-01-01T02:00:00Z")));
        apply(&mut st, &p);
        // Looked at only after its end (down meanwhile): 02:00 and 03:00 are Skipped, not run,
        // whatever catchUp says; 04:00 runs as usual.
        let p = decide(&s, &st, ts("2027-01-01T03:45:00Z"), created, &states(NONE));
        assert_eq!(p.start, None, "{catch_up:?}");
        assert_eq!(
            recorded(&p),
            vec![(Outcome::Skipped, reason::SUSPENDED, 2)],
            "{catch_up:?}"
        );
        assert_eq!(p.wake_at, Some(ts("2027-01-01T04:00:00Z")));
        apply(&mut st, &p);
        let p = decide(&s, &st, ts("2027-01-01T04:00:00Z"), created, &states(NONE));
        assert_eq!(p.start, Some(ts("2027-01-01T04:00:00Z")), "{catch_up:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random bounds and outages: no period outside startAt..endAt starts, at most maxRuns start,
    /// none before its instant, and every period in the bounds up to the last decided one is
    /// started or recorded once.
    #[test]
    fn bounds_hold_under_outages(
        schedule in schedule_strategy(),
        catch_up in prop_oneof![Just(CatchUp::None), Just(CatchUp::Latest), Just(CatchUp::All)],
        start in proptest::option::of(0i64..20_000),
        len in proptest::option::of(0i64..30_000),
        max_runs in proptest::option::of(1i64..40),
        outages in proptest::collection::vec((0i64..4_000, 0i64..20_000), 0..4),
    ) {
        let mut s = spec(&schedule);
        s.catch_up = catch_up;
        s.concurrency_policy = ConcurrencyPolicy::Allow;
        let created = ts("2027-01-01T00:00:00Z");
        let start_at = start.map(|a| created + SignedDuration::from_secs(a));
        let end_at = len.map(|l| start_at.unwrap_or(created) + SignedDuration::from_secs(l));
        s.start_at = start_at.map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time);
        s.end_at = end_at.map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time);
        s.max_runs = max_runs;
        let sc = sched(&s);
        let end = created + SignedDuration::from_secs(12 * 3600);
        let down = outage_windows(created, &outages);
        let run = simulate(&s, created, end, &down, |p, now| {
            if let Some(x) = p.start {
                prop_assert!(x <= now, "started {x} before its instant (now {now})");
                prop_assert!(start_at.is_none_or(|a| x >= a), "started {x} before startAt");
                prop_assert!(end_at.is_none_or(|e| x <= e), "started {x} after endAt");
            }
            for r in &p.records {
                let last = r.last_period.as_ref().map_or(r.period.0, |l| l.0);
                prop_assert!(start_at.is_none_or(|a| r.period.0 >= a), "recorded {r:?} before startAt");
                prop_assert!(end_at.is_none_or(|e| last <= e), "recorded {r:?} after endAt");
            }
            Ok(())
        })?;
        prop_assert!(max_runs.is_none_or(|m| run.started.len() as i64 <= m), "{} runs", run.started.len());
        run.check_each_period_decided_once(&sc, created)?;
    }

    /// A suspension with an end, at a random place: no period before its end starts, each is
    /// Skipped once, and the periods after it run as without it.
    #[test]
    fn a_suspension_with_an_end_never_runs_its_periods(
        schedule in schedule_strategy(),
        catch_up in prop_oneof![Just(CatchUp::None), Just(CatchUp::Latest), Just(CatchUp::All)],
        until in 0i64..30_000,
        outages in proptest::collection::vec((0i64..4_000, 0i64..20_000), 0..4),
    ) {
        let mut s = spec(&schedule);
        s.catch_up = catch_up;
        s.concurrency_policy = ConcurrencyPolicy::Allow;
        s.suspend = Some(true);
        let created = ts("2027-01-01T00:00:00Z");
        let until = created + SignedDuration::from_secs(until);
        s.suspension = Some(crate::api::Suspension {
            until: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(until)),
            ..Default::default()
        });
        let sc = sched(&s);
        let end = created + SignedDuration::from_secs(12 * 3600);
        let down = outage_windows(created, &outages);
        let run = simulate(&s, created, end, &down, |p, _| {
            if let Some(x) = p.start {
                prop_assert!(x >= until, "started {x}, before the suspension's end {until}");
            }
            for r in &p.records {
                let last = r.last_period.as_ref().map_or(r.period.0, |l| l.0);
                let suspended = r.reason.as_deref() == Some(reason::SUSPENDED);
                prop_assert_eq!(suspended, last < until, "{:?}", r);
            }
            Ok(())
        })?;
        run.check_each_period_decided_once(&sc, created)?;
    }
}
