//! Tests of the prepared run's judge and basis with fixed instants (a fake clock), and the two
//! properties of design §3.2: never resumed before `resumeAt`, and decided as without preparation.

use std::collections::HashMap;

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::api::{
    BackstopSpec, CatchUp, ConcurrencyPolicy, ExclusionsSpec, LockSpec, MysqlBackstop,
    NotifyTarget, PostgresBackstop, RunOrigin, SecretRef, Suspension,
};
use crate::decide::{JobState, Observed, Plan, Waiting, fingerprint_with, plan};
use crate::schedule::{DayRules, Schedule};

/// The jitter key (the backstop's job key) the fixture's `resumeAt` was computed with.
const KEY: &str = "ns/job";
/// The prepared run's token, and the status's fencing token (P2).
const TOKEN: u64 = 7;

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn secs(n: i64) -> SignedDuration {
    SignedDuration::from_secs(n)
}

/// When the fixture's SingletonJob was created, and its cursor: the first period is after it.
fn created() -> Timestamp {
    ts("2027-01-01T00:00:00Z")
}

fn template(image: &str) -> crate::api::JobTemplate {
    json!({"spec": {"template": {"spec": {
        "containers": [{"name": "main", "image": image}],
        "restartPolicy": "Never"
    }}}})
    .into()
}

fn spec(schedule: &str) -> SingletonJobSpec {
    SingletonJobSpec {
        schedule: schedule.into(),
        job_template: template("busybox:1"),
        ..Default::default()
    }
}

fn sched(s: &SingletonJobSpec) -> Schedule {
    crate::decide::schedule(s, &Default::default()).unwrap()
}

/// A run of period `p` prepared from `s` with the status's cursor at `cursor`, as the preparing
/// claim and its confirm leave it: `prepared` set with the token, `resumeAt` (period plus
/// jitter) and the basis; `runCount` counts it; the cursor and fingerprint untouched.
fn prepared(s: &SingletonJobSpec, cursor: Timestamp) -> SingletonJobStatus {
    let sc = sched(s);
    let p = sc.next_after(cursor).unwrap();
    let resume_at = p + crate::schedule::jitter(KEY, p, s.jitter_window());
    let run = RunRef {
        unknown: Default::default(),
        late: false,
        period: p.into(),
        token: TOKEN,
        job_name: format!("job-{}", p.as_second()),
        claimed_at: Some((p - secs(30)).into()),
        job_uid: Some("uid-prepared".into()),
        origin: None,
        requested_by: None,
        supersedes: None,
        replaces: Vec::new(),
        resume_at: Some(resume_at.into()),
        basis: Some(basis(s, &sc)),
    };
    SingletonJobStatus {
        fencing_token: TOKEN,
        run_count: 1,
        decided_through: Some(cursor.into()),
        schedule_fingerprint: Some(fingerprint_with(s, &sc)),
        prepared: Some(run),
        ..Default::default()
    }
}

fn period(st: &SingletonJobStatus) -> Timestamp {
    st.prepared.as_ref().unwrap().period.0
}

fn resume_at(st: &SingletonJobStatus) -> Timestamp {
    st.prepared.as_ref().unwrap().resume_at.as_ref().unwrap().0
}

/// An active run (Forbid, Allow) of an earlier period, with a lower token.
fn active_run(p: Timestamp, token: u64) -> RunRef {
    RunRef {
        unknown: Default::default(),
        late: false,
        period: p.into(),
        token,
        job_name: format!("active-{}", p.as_second()),
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

/// What else a judge sees besides spec and status.
#[derive(Clone, Default)]
struct Seen {
    blocked: Option<Waiting>,
    consecutive_failures: i32,
    states: HashMap<String, JobState>,
}

fn observed(now: Timestamp, seen: &Seen, run_count: u64) -> Observed<'_> {
    Observed {
        now,
        key: KEY,
        consecutive_failures: seen.consecutive_failures,
        run_count,
        created: created(),
        blocked: seen.blocked,
        job_states: &seen.states,
    }
}

fn judge_seen(
    s: &SingletonJobSpec,
    st: &SingletonJobStatus,
    now: Timestamp,
    job: JobMark,
    seen: &Seen,
) -> Verdict {
    let obs = observed(now, seen, st.run_count);
    judge(s, &sched(s), st, st.prepared.as_ref().unwrap(), &obs, job)
}

fn judge_at(s: &SingletonJobSpec, st: &SingletonJobStatus, now: Timestamp) -> Verdict {
    judge_seen(s, st, now, JobMark::NotReleased, &Seen::default())
}

/// The plan of the status without the prepared run (its count given back), as an ordinary
/// reconcile would decide at `now` had the run never been prepared.
fn without_preparation(
    s: &SingletonJobSpec,
    st: &SingletonJobStatus,
    now: Timestamp,
    seen: &Seen,
) -> Plan {
    let obs = observed(now, seen, st.run_count - 1);
    plan(
        s,
        &sched(s),
        st.decided_through.as_ref().map(|t| t.0),
        st.schedule_fingerprint.as_deref(),
        &st.active,
        &obs,
    )
}

fn withdraw(r: WithdrawReason) -> Verdict {
    Verdict::Withdraw(r)
}

// ---------------------------------------------------------------------------------------------
// Names

#[test]
fn every_reason_reads_back_from_its_name() {
    for r in WithdrawReason::ALL {
        assert_eq!(WithdrawReason::from_name(r.name()), Some(r), "{r:?}");
        assert_eq!(r.name(), format!("{r:?}"), "the name is the variant's");
        assert!(!r.says().is_empty());
    }
    let mut names: Vec<&str> = WithdrawReason::ALL.iter().map(|r| r.name()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), WithdrawReason::ALL.len(), "names are distinct");
    let mut says: Vec<&str> = WithdrawReason::ALL.iter().map(|r| r.says()).collect();
    says.sort_unstable();
    says.dedup();
    assert_eq!(
        says.len(),
        WithdrawReason::ALL.len(),
        "Event texts are distinct"
    );
    assert_eq!(WithdrawReason::from_name("suspended"), None);
    assert_eq!(WithdrawReason::from_name(""), None);
    assert_eq!(WithdrawReason::Suspended.says(), "spec.suspend set");
    assert_eq!(
        WithdrawReason::ScheduleChanged.says(),
        "the schedule changed"
    );
}

#[test]
fn warnings_are_what_went_wrong_not_what_was_asked() {
    let warnings: Vec<WithdrawReason> = WithdrawReason::ALL
        .into_iter()
        .filter(|r| r.warning())
        .collect();
    assert_eq!(
        warnings,
        [
            WithdrawReason::BackstopUnavailable,
            WithdrawReason::DeadlineExceeded,
            WithdrawReason::JobDeleted,
            WithdrawReason::StatusBehind,
            WithdrawReason::Refused,
        ]
    );
}

#[test]
fn each_recorded_reason_of_the_plan_has_its_withdrawal_reason() {
    use crate::decide::reason as r;
    use WithdrawReason as W;
    let cases = [
        (r::SUSPENDED, W::Suspended),
        (r::CONCURRENCY_FORBID, W::ConcurrencyForbid),
        (r::MAX_ACTIVE, W::MaxActive),
        (r::DEADLINE_EXCEEDED, W::DeadlineExceeded),
        (r::CATCH_UP_NONE, W::DeadlineExceeded),
        (r::SUPERSEDED, W::Superseded),
        (r::CATCH_UP_LIMIT, W::Superseded),
        (r::SCHEDULE_CHANGED, W::ScheduleChanged),
        (r::EXCLUDED, W::ScheduleChanged),
        (r::BACKSTOP_UNAVAILABLE, W::BackstopUnavailable),
    ];
    for (why, want) in cases {
        assert_eq!(recorded_reason(Some(why)), want, "{why}");
    }
    assert_eq!(recorded_reason(None), W::Superseded);
}

// ---------------------------------------------------------------------------------------------
// Marks, P2 and the cursor

#[test]
fn the_jobs_mark_comes_first() {
    let s = spec("*/10 * * * *");
    let mut st = prepared(&s, created());
    let r = resume_at(&st);
    // Even with a stale status and a suspended spec: what happened to the Job decides.
    st.fencing_token += 1;
    let mut suspended = s.clone();
    suspended.suspend = Some(true);
    for now in [r - secs(60), r, r + secs(3600)] {
        for sp in [&s, &suspended] {
            let seen = Seen::default();
            assert_eq!(
                judge_seen(sp, &st, now, JobMark::Released, &seen),
                Verdict::Promote
            );
            assert_eq!(
                judge_seen(sp, &st, now, JobMark::StartedOutside, &seen),
                Verdict::Stop
            );
            for why in WithdrawReason::ALL {
                assert_eq!(
                    judge_seen(sp, &st, now, JobMark::Withdrawn(why), &seen),
                    withdraw(why),
                    "another replica's withdrawal goes on with its reason"
                );
            }
        }
    }
}

#[test]
fn a_status_that_no_longer_names_the_run_withdraws_it() {
    let s = spec("*/10 * * * *");
    let st = prepared(&s, created());
    let (p, r) = (period(&st), resume_at(&st));
    let behind = withdraw(WithdrawReason::StatusBehind);
    let mut stale: Vec<SingletonJobStatus> = Vec::new();
    // P2: a later token (a trigger, a rerun, break-lock, a status raised by `behind`).
    let mut x = st.clone();
    x.fencing_token = TOKEN + 1;
    stale.push(x);
    // An older release led meanwhile and decided the period, or moved past it.
    for c in [p, p + secs(600)] {
        let mut x = st.clone();
        x.decided_through = Some(c.into());
        stale.push(x);
    }
    // Not written by a preparation: no instant, no basis, the empty basis `behind` adopts
    // with, a basis of another form, a manual run.
    let edits: [fn(&mut RunRef); 5] = [
        |run| run.resume_at = None,
        |run| run.basis = None,
        |run| run.basis = Some(String::new()),
        |run| run.basis = Some("fp:/spec:".into()),
        |run| run.origin = Some(RunOrigin::Trigger),
    ];
    for edit in edits {
        let mut x = st.clone();
        edit(x.prepared.as_mut().unwrap());
        stale.push(x);
    }
    for x in &stale {
        for now in [r - secs(60), r, r + secs(60)] {
            assert_eq!(judge_at(&s, x, now), behind, "{:?}", x.prepared);
            // A deleted Job of a stale run is stale too before its instant; from its instant
            // on it may have been resumed and run: promoted, never run again (G1).
            let seen = Seen::default();
            let came = x.prepared.as_ref().and_then(|p| p.resume_at.as_ref());
            let want = match came.is_some_and(|at| now >= at.0) {
                true => Verdict::Promote,
                false => behind,
            };
            assert_eq!(judge_seen(&s, x, now, JobMark::Missing, &seen), want);
        }
    }
    // Before the edit's withdrawal too.
    let mut edited = s.clone();
    edited.schedule = "*/5 * * * *".into();
    assert_eq!(judge_at(&edited, &stale[0], r), behind);
}

// ---------------------------------------------------------------------------------------------
// Before and at the instant

#[test]
fn kept_before_its_instant_and_resumed_at_it() {
    for jitter in [None, Some(600)] {
        let mut s = spec("*/10 * * * *");
        s.jitter_seconds = jitter;
        let st = prepared(&s, created());
        let (p, r) = (period(&st), resume_at(&st));
        let keep = Verdict::Keep { until: r };
        for now in [
            created(),
            r - secs(600),
            p,
            r - SignedDuration::from_millis(1),
            r - SignedDuration::from_nanos(1),
        ] {
            if now < r {
                assert_eq!(judge_at(&s, &st, now), keep, "at {now}");
            }
        }
        assert_eq!(judge_at(&s, &st, r), Verdict::Resume);
        assert_eq!(judge_at(&s, &st, r + secs(5)), Verdict::Resume, "late");
        assert_eq!(
            without_preparation(&s, &st, r, &Seen::default()).start,
            Some(p)
        );
    }
}

#[test]
fn a_job_gone_before_its_instant_was_deleted_and_after_it_may_have_run() {
    let s = spec("*/10 * * * *");
    let st = prepared(&s, created());
    let r = resume_at(&st);
    let seen = Seen::default();
    let gone = |now| judge_seen(&s, &st, now, JobMark::Missing, &seen);
    assert_eq!(gone(r - secs(1)), withdraw(WithdrawReason::JobDeleted));
    assert_eq!(
        gone(r - SignedDuration::from_nanos(1)),
        withdraw(WithdrawReason::JobDeleted)
    );
    assert_eq!(gone(r), Verdict::Promote);
    assert_eq!(gone(r + secs(3600)), Verdict::Promote);
    // An edit withdraws for what it is before the instant; from it on, a Job gone may have run
    // (a resume whose promote was lost, the Job finished and deleted): never run again (G1,
    // found by the model check).
    let mut edited = s.clone();
    edited.job_template = template("busybox:2");
    assert_eq!(
        judge_seen(&edited, &st, r - secs(1), JobMark::Missing, &seen),
        withdraw(WithdrawReason::SpecChanged)
    );
    assert_eq!(
        judge_seen(&edited, &st, r, JobMark::Missing, &seen),
        Verdict::Promote
    );
}

#[test]
fn an_edit_withdraws_it_by_the_part_it_changed() {
    let s = spec("*/10 * * * *");
    let st = prepared(&s, created());
    let r = resume_at(&st);
    let mut schedule = s.clone();
    schedule.schedule = "*/5 * * * *".into();
    let mut built = s.clone();
    built.job_template = template("busybox:2");
    let mut both = schedule.clone();
    both.job_template = template("busybox:2");
    for now in [r - secs(30), r, r + secs(30)] {
        let changed = withdraw(WithdrawReason::ScheduleChanged);
        assert_eq!(judge_at(&schedule, &st, now), changed);
        assert_eq!(judge_at(&both, &st, now), changed);
        let rebuilt = withdraw(WithdrawReason::SpecChanged);
        assert_eq!(judge_at(&built, &st, now), rebuilt);
    }
    // Without preparation: a schedule edit seen at the instant restarts the schedule after it
    // (the period never runs); a template edit runs the period with the new template.
    let seen = Seen::default();
    assert_eq!(without_preparation(&schedule, &st, r, &seen).start, None);
    assert_eq!(
        without_preparation(&built, &st, r, &seen).start,
        Some(period(&st))
    );
    // What the plan judges at the instant (and the basis leaves out) does not withdraw it.
    let mut limits = s.clone();
    limits.successful_jobs_history_limit = Some(0);
    limits.failed_jobs_history_limit = Some(0);
    limits.notify = Some(Vec::new());
    assert_eq!(judge_at(&limits, &st, r), Verdict::Resume);
}

#[test]
fn suspension_at_its_instant_withdraws_it() {
    let s = spec("*/10 * * * *");
    let st = prepared(&s, created());
    let (p, r) = (period(&st), resume_at(&st));
    let suspended = withdraw(WithdrawReason::Suspended);
    let with_until = |until: Option<Timestamp>| {
        let mut x = s.clone();
        x.suspend = Some(true);
        x.suspension = Some(Suspension {
            until: until.map(Into::into),
            reason: Some("finance freeze".into()),
            ..Default::default()
        });
        x
    };
    // Until resumed by hand, or until after the period (a freeze skips what it covers).
    for sp in [
        with_until(None),
        with_until(Some(p + secs(1))),
        with_until(Some(r + secs(3600))),
    ] {
        for now in [r - secs(60), r, r + secs(60)] {
            assert_eq!(judge_at(&sp, &st, now), suspended, "{:?}", sp.suspension);
            let plan = without_preparation(&sp, &st, now.max(r), &Seen::default());
            assert_ne!(plan.start, Some(p));
        }
    }
    // For every catchUp: a suspension never lets the period start at its instant.
    for catch_up in [CatchUp::None, CatchUp::Latest, CatchUp::All] {
        let mut sp = with_until(None);
        sp.catch_up = catch_up;
        assert_eq!(judge_at(&sp, &st, r), suspended);
    }
    // A suspension that ended at or before the period does not hold it.
    let ended = with_until(Some(p));
    assert_eq!(
        judge_at(&ended, &st, r - secs(60)),
        Verdict::Keep { until: r }
    );
    assert_eq!(judge_at(&ended, &st, r), Verdict::Resume);
    assert_eq!(
        without_preparation(&ended, &st, r, &Seen::default()).start,
        Some(p)
    );
}

#[test]
fn failures_in_a_row_suspend_it_as_the_plan_would() {
    let mut s = spec("*/10 * * * *");
    s.suspend_after_consecutive_failures = Some(2);
    s.concurrency_policy = ConcurrencyPolicy::Allow;
    let st = prepared(&s, created());
    let (p, r) = (period(&st), resume_at(&st));
    let suspended = withdraw(WithdrawReason::Suspended);
    // Reached already.
    let seen = Seen {
        consecutive_failures: 2,
        ..Default::default()
    };
    for now in [r - secs(60), r] {
        let v = judge_seen(&s, &st, now, JobMark::NotReleased, &seen);
        assert_eq!(v, suspended);
    }
    // Reached by a run that failed just now.
    let mut x = st.clone();
    let earlier = active_run(created() - secs(600), TOKEN - 1);
    x.active.push(earlier.clone());
    let failed = JobState::Failed(r - secs(5));
    let seen = Seen {
        consecutive_failures: 1,
        states: [(earlier.job_name.clone(), failed)].into(),
        ..Default::default()
    };
    assert_eq!(
        judge_seen(&s, &x, r, JobMark::NotReleased, &seen),
        suspended
    );
    assert!(without_preparation(&s, &x, r, &seen).suspend);
    assert_ne!(without_preparation(&s, &x, r, &seen).start, Some(p));
    // One failure short: it runs.
    let seen = Seen {
        consecutive_failures: 1,
        ..Default::default()
    };
    assert_eq!(
        judge_seen(&s, &st, r, JobMark::NotReleased, &seen),
        Verdict::Resume
    );
}

#[test]
fn max_runs_counts_the_prepared_run_once() {
    let s = spec("*/10 * * * *");
    let mut st = prepared(&s, created());
    let r = resume_at(&st);
    // Two runs before, and the prepared one: runCount 3.
    st.run_count = 3;
    for (max, want) in [
        (3, Verdict::Resume),
        (4, Verdict::Resume),
        (2, withdraw(WithdrawReason::MaxRuns)),
        (1, withdraw(WithdrawReason::MaxRuns)),
    ] {
        let mut sp = s.clone();
        sp.max_runs = Some(max);
        assert_eq!(judge_at(&sp, &st, r), want, "maxRuns {max}");
        let starts = without_preparation(&sp, &st, r, &Seen::default())
            .start
            .is_some();
        assert_eq!(starts, want == Verdict::Resume, "maxRuns {max}");
        if want != Verdict::Resume {
            assert_eq!(
                judge_at(&sp, &st, r - secs(60)),
                want,
                "lowered before the instant"
            );
        }
    }
}

#[test]
fn the_backstop_withdraws_it_and_an_untrusted_clock_holds_it() {
    let s = spec("*/10 * * * *");
    let st = prepared(&s, created());
    let r = resume_at(&st);
    let blocked = |why| Seen {
        blocked: Some(why),
        ..Default::default()
    };
    let down = blocked(Waiting::BackstopUnavailable);
    let untrusted = blocked(Waiting::ClockUntrusted);
    for now in [r - secs(60), r, r + secs(60)] {
        assert_eq!(
            judge_seen(&s, &st, now, JobMark::NotReleased, &down),
            withdraw(WithdrawReason::BackstopUnavailable)
        );
        assert_eq!(
            judge_seen(&s, &st, now, JobMark::NotReleased, &untrusted),
            Verdict::Keep { until: r },
            "nothing is decided on an untrusted clock"
        );
    }
    // Past its deadline with the backstop down: recorded as the plan would (Missed,
    // BackstopUnavailable), withdrawn for that reason either way.
    let mut late = s.clone();
    late.starting_deadline_seconds = Some(30);
    let now = r + secs(120);
    assert_eq!(
        judge_seen(&late, &st, now, JobMark::NotReleased, &down),
        withdraw(WithdrawReason::BackstopUnavailable)
    );
}

#[test]
fn a_template_the_api_server_refuses_holds_it_until_the_plan_looks_again() {
    let s = spec("*/10 * * * *");
    let st = prepared(&s, created());
    let r = resume_at(&st);
    let seen = Seen {
        blocked: Some(Waiting::JobTemplateInvalid),
        ..Default::default()
    };
    let before = judge_seen(&s, &st, r - secs(60), JobMark::NotReleased, &seen);
    assert_eq!(before, Verdict::Keep { until: r });
    let plan = without_preparation(&s, &st, r, &seen);
    assert_eq!(plan.waiting, Some(Waiting::JobTemplateInvalid));
    assert_eq!(plan.wake_at, Some(ts("2027-01-01T00:20:00Z")));
    assert_eq!(
        judge_seen(&s, &st, r, JobMark::NotReleased, &seen),
        Verdict::Keep {
            until: ts("2027-01-01T00:20:00Z")
        }
    );
}

#[test]
fn concurrency_at_its_instant_withdraws_it() {
    let earlier = active_run(created() - secs(600), TOKEN - 1);
    for catch_up in [CatchUp::None, CatchUp::Latest] {
        let mut forbid = spec("*/10 * * * *");
        forbid.catch_up = catch_up;
        let mut st = prepared(&forbid, created());
        st.active.push(earlier.clone());
        let r = resume_at(&st);
        // Before the instant the active run may still finish.
        assert_eq!(
            judge_at(&forbid, &st, r - secs(60)),
            Verdict::Keep { until: r }
        );
        assert_eq!(
            judge_at(&forbid, &st, r),
            withdraw(WithdrawReason::ConcurrencyForbid),
            "{catch_up:?}"
        );
        let mut allow = forbid.clone();
        allow.concurrency_policy = ConcurrencyPolicy::Allow;
        allow.max_active = Some(1);
        assert_eq!(
            judge_at(&allow, &st, r),
            withdraw(WithdrawReason::MaxActive)
        );
        allow.max_active = Some(2);
        assert_eq!(judge_at(&allow, &st, r), Verdict::Resume);
        // The active run finished by the instant: it runs.
        let seen = Seen {
            states: [(earlier.job_name.clone(), JobState::Succeeded(r - secs(1)))].into(),
            ..Default::default()
        };
        let v = judge_seen(&forbid, &st, r, JobMark::NotReleased, &seen);
        assert_eq!(v, Verdict::Resume);
    }
    // Replace would delete the active run before the period's Job may start: the prepared Job
    // is not resumed beside it; the plan starts the period again, replacing, once withdrawn.
    let mut replace = spec("*/10 * * * *");
    replace.concurrency_policy = ConcurrencyPolicy::Replace;
    let mut st = prepared(&replace, created());
    st.active.push(earlier);
    let r = resume_at(&st);
    assert_eq!(
        judge_at(&replace, &st, r),
        withdraw(WithdrawReason::Superseded)
    );
    assert!(
        !without_preparation(&replace, &st, r, &Seen::default())
            .replace
            .is_empty()
    );
}

#[test]
fn past_its_deadline_it_is_withdrawn_as_the_plan_records_it() {
    let s = spec("*/10 * * * *");
    let st = prepared(&s, created());
    let (p, r) = (period(&st), resume_at(&st));
    let exceeded = withdraw(WithdrawReason::DeadlineExceeded);
    // startingDeadlineSeconds passed during an outage.
    let mut deadline = s.clone();
    deadline.starting_deadline_seconds = Some(30);
    assert_eq!(judge_at(&deadline, &st, r + secs(29)), Verdict::Resume);
    assert_eq!(judge_at(&deadline, &st, r + secs(300)), exceeded);
    // catchUp None: its grace passed, or a newer period is due (reason CatchUpNone).
    let mut none = s.clone();
    none.catch_up = CatchUp::None;
    assert_eq!(judge_at(&none, &st, r + secs(90)), exceeded);
    let mut long = none.clone();
    long.starting_deadline_seconds = Some(3600);
    let now = ts("2027-01-01T00:20:05Z");
    let plan = without_preparation(&long, &st, now, &Seen::default());
    assert_eq!(
        plan.records[0].reason.as_deref(),
        Some(crate::decide::reason::CATCH_UP_NONE)
    );
    assert_eq!(plan.records[0].period.0, p);
    assert_eq!(judge_at(&long, &st, now), exceeded);
}

#[test]
fn a_newer_period_due_first_supersedes_it() {
    let s = spec("*/10 * * * *");
    let st = prepared(&s, created());
    let now = ts("2027-01-01T00:20:05Z");
    // Latest: the newest period starts, this one is recorded Superseded.
    assert_eq!(judge_at(&s, &st, now), withdraw(WithdrawReason::Superseded));
    // All: every late period runs, oldest first: this one now.
    let mut all = s.clone();
    all.catch_up = CatchUp::All;
    all.concurrency_policy = ConcurrencyPolicy::Allow;
    assert_eq!(judge_at(&all, &st, now), Verdict::Resume);
    // All, limited to one: only the newest (CatchUpLimit).
    all.catch_up_limit = Some(1);
    assert_eq!(
        judge_at(&all, &st, now),
        withdraw(WithdrawReason::Superseded)
    );
    // An older period still pending runs first (catchUp All, a cursor further back).
    all.catch_up_limit = None;
    let mut older = prepared(&all, created());
    older.decided_through = Some((created() - secs(1200)).into());
    let plan = without_preparation(&all, &older, now, &Seen::default());
    assert!(plan.start.is_some_and(|x| x < period(&older)));
    assert_eq!(
        judge_at(&all, &older, now),
        withdraw(WithdrawReason::Superseded)
    );
}

#[test]
fn a_status_on_another_schedule_decides_the_period_as_changed() {
    let s = spec("*/10 * * * *");
    let mut st = prepared(&s, created());
    let r = resume_at(&st);
    // The cursor refers to an older schedule whose periods include this one: recorded
    // ScheduleChanged by the plan.
    let mut old = s.clone();
    old.schedule = "*/5 * * * *".into();
    st.schedule_fingerprint = Some(crate::decide::fingerprint(&old));
    assert_eq!(
        judge_at(&s, &st, r),
        withdraw(WithdrawReason::ScheduleChanged)
    );
    // No fingerprint: the cursor restarts at now and passes the period without a record.
    st.schedule_fingerprint = None;
    let plan = without_preparation(&s, &st, r, &Seen::default());
    assert!(plan.records.is_empty() && plan.start.is_none());
    assert_eq!(
        judge_at(&s, &st, r),
        withdraw(WithdrawReason::ScheduleChanged)
    );
}

#[test]
fn a_later_jitter_keeps_it_until_the_plan_would_start_it() {
    let s = spec("*/10 * * * *");
    let st = prepared(&s, created());
    let (p, r) = (period(&st), resume_at(&st));
    assert_eq!(r, p, "no jitter when prepared");
    let mut later = s.clone();
    later.jitter_seconds = Some(600);
    let start = p + crate::schedule::jitter(KEY, p, 600);
    assert!(start > r);
    assert_eq!(judge_at(&later, &st, r), Verdict::Keep { until: start });
    assert_eq!(
        judge_at(&later, &st, start - SignedDuration::from_nanos(1)),
        Verdict::Keep { until: start }
    );
    assert_eq!(judge_at(&later, &st, start), Verdict::Resume);
}

// ---------------------------------------------------------------------------------------------
// The basis

fn calendars(days: &[&str]) -> HashMap<String, DayRules> {
    let rules = DayRules {
        days: days.iter().map(|d| d.to_string()).collect(),
        ..Default::default()
    };
    [("holidays".to_string(), rules)].into()
}

/// One edit of a spec, for tables of them.
type SpecEdit = fn(&mut SingletonJobSpec);

fn basis_of(s: &SingletonJobSpec) -> String {
    basis(s, &sched(s))
}

#[test]
fn the_basis_is_two_short_hashes_stable_across_releases() {
    let s = spec("*/10 * * * *");
    let b = basis_of(&s);
    let (fp, built) = parts(&b).unwrap();
    assert_eq!((fp.len(), built.len()), (16, 16));
    assert!(b.starts_with("fp:") && b.contains("/spec:"));
    // Pinned: a release that computed another basis for the same spec would withdraw every
    // prepared run on upgrade (and two releases side by side would withdraw each other's).
    assert_eq!(b, PINNED_BASIS);
    // Same spec, same basis; a template's key order does not matter.
    let mut reordered = s.clone();
    reordered.job_template = serde_json::from_str(
        r#"{"spec":{"template":{"spec":{"restartPolicy":"Never","containers":[{"image":"busybox:1","name":"main"}]}}}}"#,
    )
    .unwrap();
    assert_eq!(basis_of(&reordered), b);
}

/// [`basis`] of `spec("*/10 * * * *")`, computed outside Rust: the first 8 bytes of SHA-256 of
/// `*/10 * * * *|UTC|AfterGap/First` and of the canonical text (`singleton.dev/basis-spec/v1`,
/// then `jobTemplate={"spec":{"template":{"spec":{"containers":[{"image":"busybox:1","name":
/// "main"}],"restartPolicy":"Never"}}}}`, `completionDeadlineSeconds=null`,
/// `completionDeadlinePolicy="Continue"`, the four `backstop.*=null`,
/// `lock.purpose="Correctness"`, `startAt=null`, `endAt=null`, each line ending in `\n`).
const PINNED_BASIS: &str = "fp:3cfdb01870b28676/spec:276bfd5313897472";

#[test]
fn the_basis_ignores_what_the_plan_judges_at_the_instant() {
    let s = spec("*/10 * * * *");
    let b = basis_of(&s);
    let edits: Vec<(&str, SpecEdit)> = vec![
        ("successfulJobsHistoryLimit", |s| {
            s.successful_jobs_history_limit = Some(0)
        }),
        ("failedJobsHistoryLimit", |s| {
            s.failed_jobs_history_limit = Some(7)
        }),
        ("notify", |s| {
            s.notify = Some(vec![
                serde_json::from_value::<NotifyTarget>(json!({
                    "name": "ops", "url": "https://example.invalid/hook"
                }))
                .unwrap(),
            ])
        }),
        ("notify []", |s| s.notify = Some(Vec::new())),
        ("suspend", |s| s.suspend = Some(true)),
        ("suspension", |s| {
            s.suspend = Some(true);
            s.suspension = Some(Suspension {
                until: Some(ts("2027-02-01T00:00:00Z").into()),
                ..Default::default()
            });
        }),
        ("concurrencyPolicy Allow", |s| {
            s.concurrency_policy = ConcurrencyPolicy::Allow
        }),
        ("concurrencyPolicy Replace", |s| {
            s.concurrency_policy = ConcurrencyPolicy::Replace
        }),
        ("maxActive", |s| s.max_active = Some(3)),
        ("catchUp", |s| s.catch_up = CatchUp::All),
        ("catchUpLimit", |s| s.catch_up_limit = Some(5)),
        ("startingDeadlineSeconds", |s| {
            s.starting_deadline_seconds = Some(30)
        }),
        ("maxRuns", |s| s.max_runs = Some(3)),
        ("suspendAfterConsecutiveFailures", |s| {
            s.suspend_after_consecutive_failures = Some(2)
        }),
        ("lock: {} (Correctness, the default)", |s| {
            s.lock = Some(LockSpec::default())
        }),
    ];
    for (what, edit) in edits {
        let mut x = s.clone();
        edit(&mut x);
        assert_eq!(basis_of(&x), b, "{what} moved the basis");
    }
}

#[test]
fn the_basis_moves_with_the_schedule_and_what_the_job_is_built_from() {
    use WithdrawReason::{ScheduleChanged, SpecChanged};
    let s = spec("*/10 * * * *");
    let b = basis_of(&s);
    let pg = |name: &str, prefix: Option<&str>| PostgresBackstop {
        secret_ref: SecretRef { name: name.into() },
        table_prefix: prefix.map(String::from),
    };
    let edits: Vec<(&str, SpecEdit, WithdrawReason)> = vec![
        (
            "schedule",
            |s| s.schedule = "*/5 * * * *".into(),
            ScheduleChanged,
        ),
        (
            "schedules",
            |s| {
                s.schedule = String::new();
                s.schedules = vec!["*/10 * * * *".into(), "0 * * * *".into()];
            },
            ScheduleChanged,
        ),
        (
            "timeZone",
            |s| s.time_zone = Some("Europe/Berlin".into()),
            ScheduleChanged,
        ),
        (
            "dstPolicy",
            |s| s.dst_policy.gap = crate::schedule::GapPolicy::Shift,
            ScheduleChanged,
        ),
        (
            "exclusions",
            |s| {
                s.exclusions = Some(ExclusionsSpec {
                    rules: DayRules {
                        days: vec!["* * SAT,SUN".into()],
                        ..Default::default()
                    },
                    ..Default::default()
                })
            },
            ScheduleChanged,
        ),
        (
            "jobTemplate",
            |s| s.job_template = template("busybox:2"),
            SpecChanged,
        ),
        (
            "completionDeadlineSeconds",
            |s| s.completion_deadline_seconds = Some(60),
            SpecChanged,
        ),
        (
            "completionDeadlinePolicy",
            |s| s.completion_deadline_policy = CompletionDeadlinePolicy::Stop,
            SpecChanged,
        ),
        (
            "backstop",
            |s| {
                s.backstop = Some(BackstopSpec {
                    postgres: Some(PostgresBackstop {
                        secret_ref: SecretRef { name: "db".into() },
                        table_prefix: None,
                    }),
                    ..Default::default()
                })
            },
            SpecChanged,
        ),
        (
            "lock.purpose",
            |s| {
                s.lock = Some(LockSpec {
                    purpose: LockPurpose::Efficiency,
                })
            },
            SpecChanged,
        ),
        (
            "startAt",
            |s| s.start_at = Some(ts("2027-01-01T00:00:00Z").into()),
            SpecChanged,
        ),
        (
            "endAt",
            |s| s.end_at = Some(ts("2028-01-01T00:00:00Z").into()),
            SpecChanged,
        ),
    ];
    for (what, edit, why) in edits {
        let mut x = s.clone();
        edit(&mut x);
        let moved = basis_of(&x);
        assert_ne!(moved, b, "{what} did not move the basis");
        assert_eq!(basis_change(&b, &moved), Some(why), "{what}");
    }

    // Each part of the backstop, from one with a PostgreSQL database.
    let mut base = s.clone();
    base.backstop = Some(BackstopSpec {
        postgres: Some(pg("db", None)),
        ..Default::default()
    });
    let b = basis_of(&base);
    let backstops: Vec<(&str, BackstopSpec)> = vec![
        (
            "kind",
            BackstopSpec {
                mysql: Some(MysqlBackstop {
                    secret_ref: SecretRef { name: "db".into() },
                    table_prefix: None,
                }),
                ..Default::default()
            },
        ),
        (
            "secret",
            BackstopSpec {
                postgres: Some(pg("other", None)),
                ..Default::default()
            },
        ),
        (
            "tablePrefix",
            BackstopSpec {
                postgres: Some(pg("db", Some("jobs_"))),
                ..Default::default()
            },
        ),
        (
            "jobKey",
            BackstopSpec {
                postgres: Some(pg("db", None)),
                job_key: Some("billing/invoices".into()),
                ..Default::default()
            },
        ),
    ];
    for (what, backstop) in backstops {
        let mut x = base.clone();
        x.backstop = Some(backstop);
        assert_eq!(
            basis_change(&b, &basis_of(&x)),
            Some(SpecChanged),
            "backstop {what}"
        );
    }
    // Moving startAt or endAt, not only setting it.
    let mut bounded = s.clone();
    bounded.start_at = Some(ts("2027-01-01T00:00:00Z").into());
    bounded.end_at = Some(ts("2028-01-01T00:00:00Z").into());
    let b = basis_of(&bounded);
    for (start, end) in [
        ("2027-01-01T00:00:01Z", "2028-01-01T00:00:00Z"),
        ("2027-01-01T00:00:00Z", "2027-12-31T00:00:00Z"),
    ] {
        let mut x = bounded.clone();
        x.start_at = Some(ts(start).into());
        x.end_at = Some(ts(end).into());
        assert_eq!(
            basis_change(&b, &basis_of(&x)),
            Some(SpecChanged),
            "{start} {end}"
        );
    }
}

#[test]
fn a_calendar_edit_moves_the_schedules_part() {
    let mut s = spec("0 6 * * *");
    s.exclusions = Some(ExclusionsSpec {
        calendars: vec!["holidays".into()],
        ..Default::default()
    });
    let sc = |days: &[&str]| crate::decide::schedule(&s, &calendars(days)).unwrap();
    let before = basis(&s, &sc(&["25 DEC *"]));
    let after = basis(&s, &sc(&["25 DEC *", "1 JAN *"]));
    assert_eq!(
        basis_change(&before, &after),
        Some(WithdrawReason::ScheduleChanged)
    );
    assert_eq!(basis(&s, &sc(&["25 DEC *"])), before);
}

#[test]
fn an_oversize_template_has_a_basis_of_its_own() {
    let s = spec("*/10 * * * *");
    let mut big = s.clone();
    let filler = "x".repeat(crate::api::MAX_JOB_TEMPLATE_BYTES);
    big.job_template = json!({"metadata": {"annotations": {"filler": filler}}}).into();
    assert!(big.job_template.decode().is_err());
    let b = basis_of(&big);
    assert_eq!(
        basis_change(&basis_of(&s), &b),
        Some(WithdrawReason::SpecChanged)
    );
    assert_eq!(basis_of(&big.clone()), b);
}

#[test]
fn basis_change_says_which_part() {
    use WithdrawReason::{ScheduleChanged, SpecChanged};
    let b = "fp:0011223344556677/spec:8899aabbccddeeff";
    assert_eq!(basis_change(b, b), None);
    assert_eq!(
        basis_change(b, "fp:0011223344556677/spec:0000000000000000"),
        Some(SpecChanged)
    );
    assert_eq!(
        basis_change(b, "fp:0000000000000000/spec:8899aabbccddeeff"),
        Some(ScheduleChanged)
    );
    assert_eq!(
        basis_change(b, "fp:0000000000000000/spec:0000000000000000"),
        Some(ScheduleChanged)
    );
    // One that cannot be read: nothing is known to be unchanged.
    assert_eq!(basis_change("", b), Some(ScheduleChanged));
    assert_eq!(basis_change("garbage", b), Some(ScheduleChanged));
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
    ]
}

/// A SingletonJob as prepared: its spec, and where its cursor stood (seconds after creation).
fn prepared_strategy() -> impl Strategy<Value = (SingletonJobSpec, i64)> {
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
        proptest::option::of(0i32..900),
        0i64..86_400,
    )
        .prop_map(
            |(schedule, catch_up, concurrency, deadline, jitter, cursor)| {
                let mut s = spec(&schedule);
                s.catch_up = catch_up;
                s.concurrency_policy = concurrency;
                s.starting_deadline_seconds = deadline;
                s.jitter_seconds = jitter;
                (s, cursor)
            },
        )
}

/// An edit made after the preparation (each part may be absent).
#[derive(Clone, Debug)]
struct Edit {
    suspend: Option<Option<i64>>,
    schedule: Option<String>,
    time_zone: bool,
    template: bool,
    completion: Option<i64>,
    bounds: Option<(Option<i64>, Option<i64>)>,
    concurrency: Option<ConcurrencyPolicy>,
    catch_up: Option<CatchUp>,
    deadline: Option<Option<i64>>,
    jitter: Option<Option<i32>>,
    limits: bool,
    max_runs: Option<i64>,
}

fn edit_strategy() -> impl Strategy<Value = Edit> {
    let rare = |p: f64| proptest::bool::weighted(p);
    (
        (
            proptest::option::weighted(0.2, proptest::option::of(-7200i64..7200)),
            proptest::option::weighted(0.1, schedule_strategy()),
            rare(0.05),
            rare(0.1),
            proptest::option::weighted(0.1, 1i64..7200),
            proptest::option::weighted(
                0.1,
                (
                    proptest::option::of(-7200i64..7200),
                    proptest::option::of(-7200i64..7200),
                ),
            ),
        ),
        (
            proptest::option::weighted(
                0.2,
                prop_oneof![
                    Just(ConcurrencyPolicy::Forbid),
                    Just(ConcurrencyPolicy::Replace),
                    Just(ConcurrencyPolicy::Allow)
                ],
            ),
            proptest::option::weighted(
                0.2,
                prop_oneof![
                    Just(CatchUp::None),
                    Just(CatchUp::Latest),
                    Just(CatchUp::All)
                ],
            ),
            proptest::option::weighted(0.2, proptest::option::of(1i64..3600)),
            proptest::option::weighted(0.2, proptest::option::of(0i32..900)),
            rare(0.3),
            proptest::option::weighted(0.2, 1i64..5),
        ),
    )
        .prop_map(
            |(
                (suspend, schedule, time_zone, template, completion, bounds),
                (concurrency, catch_up, deadline, jitter, limits, max_runs),
            )| Edit {
                suspend,
                schedule,
                time_zone,
                template,
                completion,
                bounds,
                concurrency,
                catch_up,
                deadline,
                jitter,
                limits,
                max_runs,
            },
        )
}

impl Edit {
    /// `s` edited; instants relative to the prepared period `p`.
    fn apply(&self, s: &SingletonJobSpec, p: Timestamp) -> SingletonJobSpec {
        let mut e = s.clone();
        if let Some(until) = self.suspend {
            e.suspend = Some(true);
            e.suspension = until.map(|u| Suspension {
                until: Some((p + secs(u)).into()),
                ..Default::default()
            });
        }
        if let Some(schedule) = &self.schedule {
            e.schedule = schedule.clone();
        }
        if self.time_zone {
            e.time_zone = Some("Asia/Kolkata".into());
        }
        if self.template {
            e.job_template = template("busybox:2");
        }
        if let Some(c) = self.completion {
            e.completion_deadline_seconds = Some(c);
        }
        if let Some((start, end)) = self.bounds {
            e.start_at = start.map(|d| (p + secs(d)).into());
            e.end_at = end.map(|d| (p + secs(d)).into());
            if let (Some(a), Some(b)) = (&e.start_at, &e.end_at)
                && a.0 > b.0
            {
                e.end_at = None;
            }
        }
        if let Some(c) = self.concurrency {
            e.concurrency_policy = c;
        }
        if let Some(c) = self.catch_up {
            e.catch_up = c;
        }
        if let Some(d) = self.deadline {
            e.starting_deadline_seconds = d;
        }
        if let Some(j) = self.jitter {
            e.jitter_seconds = j;
        }
        if self.limits {
            e.successful_jobs_history_limit = Some(0);
            e.failed_jobs_history_limit = Some(0);
            e.notify = Some(Vec::new());
        }
        if let Some(m) = self.max_runs {
            e.max_runs = Some(m);
        }
        e
    }
}

/// What else is seen at the judge: what blocks runs (clock, template, backstop); an active run
/// (a status that breaks P1, so that the plan's concurrency answers are reached) and its Job's
/// state; `runCount` with the prepared run; failures in a row; and
/// `suspendAfterConsecutiveFailures`.
type Around = (Option<Waiting>, Option<JobState>, u64, i32, Option<i32>);

fn seen_strategy() -> impl Strategy<Value = Around> {
    (
        proptest::option::weighted(
            0.2,
            prop_oneof![
                Just(Waiting::ClockUntrusted),
                Just(Waiting::JobTemplateInvalid),
                Just(Waiting::BackstopUnavailable)
            ],
        ),
        proptest::option::weighted(
            0.2,
            prop_oneof![
                Just(JobState::Active),
                Just(JobState::Failed(ts("2027-01-01T00:00:01Z"))),
                Just(JobState::Gone)
            ],
        ),
        1u64..5,
        0i32..3,
        proptest::option::weighted(0.2, 1i32..3),
    )
}

/// A SingletonJob prepared from `s`, edited into `e`, judged at `now`: its parts.
struct Case {
    s: SingletonJobSpec,
    e: SingletonJobSpec,
    st: SingletonJobStatus,
    seen: Seen,
    p: Timestamp,
    r: Timestamp,
}

fn case(
    (s, cursor): (SingletonJobSpec, i64),
    edit: &Edit,
    (blocked, active, run_count, failures, suspend_after): Around,
) -> Case {
    let mut st = prepared(&s, created() + secs(cursor));
    let (p, r) = (period(&st), resume_at(&st));
    let mut e = edit.apply(&s, p);
    e.suspend_after_consecutive_failures = suspend_after;
    st.run_count = run_count;
    let mut seen = Seen {
        blocked,
        consecutive_failures: failures,
        ..Default::default()
    };
    if let Some(state) = active {
        let run = active_run(created() + secs(cursor) - secs(1), TOKEN - 1);
        seen.states.insert(run.job_name.clone(), state);
        st.active.push(run);
    }
    Case {
        s,
        e,
        st,
        seen,
        p,
        r,
    }
}

/// Offsets from `resumeAt` strictly before it, the last second before it often.
fn before_strategy() -> impl Strategy<Value = SignedDuration> {
    prop_oneof![
        (1i64..1_000_000_000).prop_map(SignedDuration::from_nanos),
        (1i64..900).prop_map(secs),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// G4: whatever the spec, its edit, the status (P2 kept or broken, fields missing), what is
    /// seen and the Job's mark, before `resumeAt` the judge never resumes; what it keeps, it
    /// keeps until `resumeAt`.
    #[test]
    fn never_resumed_before_its_instant(
        prepared in prepared_strategy(),
        edit in edit_strategy(),
        seen in seen_strategy(),
        early in before_strategy(),
        mark in prop_oneof![
            Just(JobMark::NotReleased),
            Just(JobMark::Missing),
            Just(JobMark::Released),
            Just(JobMark::StartedOutside),
            Just(JobMark::Withdrawn(WithdrawReason::LockBroken)),
        ],
        stale in 0u8..6,
    ) {
        let Case { e, mut st, seen, p, r, .. } = case(prepared, &edit, seen);
        let run = st.prepared.as_mut().unwrap();
        match stale {
            1 => run.token = TOKEN - 1,
            2 => run.resume_at = None,
            3 => run.basis = None,
            4 => st.decided_through = Some(p.into()),
            _ => {}
        }
        let now = r - early;
        let v = judge_seen(&e, &st, now, mark, &seen);
        prop_assert_ne!(v, Verdict::Resume, "resumed {} before {}", now, r);
        if let Verdict::Keep { until } = v {
            prop_assert_eq!(until, r);
        }
    }

    /// Design §3.2: for a spec, an edit of it after the preparation, and an instant around
    /// `resumeAt`, the prepared period is decided as the plan without preparation decides it:
    /// resumed only when that plan starts it now, withdrawn or kept only when it does not (but
    /// for a run whose Job was built from a spec since changed, withdrawn to be run from the new
    /// one, and one a Replace must clear the way for); and at or after `resumeAt`, whenever that
    /// plan starts the period, resumed, or withdrawn for that rebuild.
    #[test]
    fn decided_as_without_preparation(
        prepared in prepared_strategy(),
        edit in edit_strategy(),
        seen in seen_strategy(),
        offset in prop_oneof![
            (-900i64..0).prop_map(secs),
            (0i64..1000).prop_map(SignedDuration::from_millis),
            (0i64..7200).prop_map(secs),
        ],
    ) {
        let Case { s, e, st, seen, p, r } = case(prepared, &edit, seen);
        let now = r + offset;
        let v = judge_seen(&e, &st, now, JobMark::NotReleased, &seen);
        let without = without_preparation(&e, &st, now, &seen);
        let starts = without.start == Some(p);
        match v {
            Verdict::Resume => {
                prop_assert!(now >= r);
                prop_assert!(starts, "resumed what the plan does not start: {:?}", without);
                prop_assert!(without.replace.is_empty());
                prop_assert_eq!(basis_of(&e), basis_of(&s), "resumed a Job built from another spec");
            }
            Verdict::Withdraw(WithdrawReason::SpecChanged) => {
                let (sc, ec) = (sched(&s), sched(&e));
                prop_assert_eq!(fingerprint_with(&s, &sc), fingerprint_with(&e, &ec));
                prop_assert_ne!(basis_of(&e), basis_of(&s));
            }
            Verdict::Withdraw(WithdrawReason::Superseded) if starts => {
                prop_assert!(!without.replace.is_empty(), "withdrew what the plan starts");
            }
            Verdict::Withdraw(why) => {
                prop_assert!(!starts, "withdrew ({:?}) what the plan starts now", why);
            }
            Verdict::Keep { until } => {
                prop_assert!(now < r || !starts, "kept what the plan starts now");
                prop_assert!(now >= r || until == r);
            }
            Verdict::Promote | Verdict::Stop => {
                prop_assert!(false, "{:?} for a Job prepared and not released", v);
            }
        }
        if now >= r && starts && without.replace.is_empty() {
            prop_assert!(
                v == Verdict::Resume || v == withdraw(WithdrawReason::SpecChanged),
                "the plan starts the period at {} and the judge says {:?}", now, v
            );
        }
    }
}
