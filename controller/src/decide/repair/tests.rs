use proptest::prelude::*;

use super::*;
use crate::api::HistoryEntry;
use crate::schedule::DstPolicy;

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn daily() -> Schedule {
    Schedule::parse("0 0 * * *", None, DstPolicy::default()).unwrap()
}

fn run(period: Timestamp, token: u64, origin: Option<RunOrigin>) -> RunRef {
    RunRef {
        unknown: Default::default(),
        late: false,
        period: period.into(),
        token,
        job_name: crate::naming::job_name("a", period),
        claimed_at: None,
        job_uid: None,
        origin,
        requested_by: None,
        supersedes: None,
        replaces: Vec::new(),
        resume_at: None,
        basis: None,
    }
}

fn entry(period: Timestamp, outcome: Outcome, token: Option<u64>) -> HistoryEntry {
    HistoryEntry {
        unknown: Default::default(),
        late: false,
        period: period.into(),
        last_period: None,
        count: 1,
        outcome,
        reason: None,
        job_name: token.map(|t| format!("a-{t}")),
        token,
        start_time: None,
        finish_time: None,
        requested_by: None,
        cluster: None,
        message: None,
    }
}

fn claim(token: u64, outcome: Option<Outcome>) -> Option<ClaimFact> {
    Some(ClaimFact { token, outcome })
}

const COVERED: Records = Records {
    claim: None,
    job: false,
    covered: true,
};

#[test]
fn a_periods_standing_comes_from_its_newest_record() {
    let p = ts("2026-09-03T00:00:00Z");
    let mut st = SingletonJobStatus::default();
    let with = |c| Records {
        claim: c,
        ..COVERED
    };
    // The claim row's outcome is the record of its token's run.
    assert_eq!(
        standing(&st, p, with(claim(3, Some(Outcome::Failed)))),
        Standing::Failed
    );
    assert_eq!(
        standing(&st, p, with(claim(3, Some(Outcome::Replaced)))),
        Standing::Failed
    );
    assert_eq!(
        standing(&st, p, with(claim(3, Some(Outcome::Succeeded)))),
        Standing::Succeeded
    );
    // A claim decided without a Job never ran.
    assert_eq!(
        standing(&st, p, with(claim(3, Some(Outcome::Missed)))),
        Standing::NeverRan
    );
    // No outcome on the row: the history entry of the row's token, not an older run's.
    st.history.push(entry(p, Outcome::Failed, Some(2)));
    assert_eq!(standing(&st, p, with(claim(3, None))), Standing::Unknown);
    st.history.insert(0, entry(p, Outcome::Succeeded, Some(3)));
    assert_eq!(standing(&st, p, with(claim(3, None))), Standing::Succeeded);
    // Without a claim row: a run the history records; a period nothing ran.
    assert_eq!(standing(&st, p, COVERED), Standing::Succeeded);
    st.history.clear();
    st.history.push(entry(p, Outcome::Missed, None));
    assert_eq!(standing(&st, p, COVERED), Standing::NeverRan);
    st.history.clear();
    assert_eq!(standing(&st, p, COVERED), Standing::NeverRan);
    // Before the claims table knew every run, or with a Job of it about: unknown.
    let uncovered = Records {
        covered: false,
        ..COVERED
    };
    assert_eq!(standing(&st, p, uncovered), Standing::Unknown);
    assert_eq!(
        standing(
            &st,
            p,
            Records {
                job: true,
                ..COVERED
            }
        ),
        Standing::Unknown
    );
    // A run still active wins over every record.
    st.active.push(run(p, 4, Some(RunOrigin::Rerun)));
    assert_eq!(
        standing(&st, p, with(claim(3, Some(Outcome::Failed)))),
        Standing::Active
    );
    st.active.clear();
    st.pending_claim = Some(run(p, 4, None));
    assert_eq!(standing(&st, p, COVERED), Standing::Active);
}

#[test]
fn each_selection_takes_its_standings_and_never_an_active_run() {
    for s in Standing::ALL {
        assert_eq!(
            selects(RepairOnly::Failed, s),
            s == Standing::Failed,
            "{s:?}"
        );
        assert_eq!(
            selects(RepairOnly::Missed, s),
            s == Standing::NeverRan,
            "{s:?}"
        );
        assert_eq!(selects(RepairOnly::All, s), s != Standing::Active, "{s:?}");
    }
}

fn september(order: RepairOrder, only: RepairOnly) -> OperationStatus {
    OperationStatus {
        id: "r".into(),
        phase: OperationPhase::Running,
        from: Some(ts("2026-09-01T00:00:00Z").into()),
        to: Some(ts("2026-09-30T00:00:00Z").into()),
        only: Some(only),
        order: Some(order),
        ..OperationStatus::default()
    }
}

#[test]
fn the_walk_goes_either_way_through_the_range_and_counts_what_it_passes() {
    let failed = [3, 9, 27];
    let standing_of = |p: Timestamp| {
        let day = p.in_tz("UTC").unwrap().day();
        match failed.contains(&day) {
            true => Standing::Failed,
            false => Standing::Succeeded,
        }
    };
    let day = |d: i8| ts(&format!("2026-09-{d:02}T00:00:00Z"));
    for (order, want) in [
        (RepairOrder::Oldest, [day(3), day(9), day(27)]),
        (RepairOrder::Newest, [day(27), day(9), day(3)]),
    ] {
        let mut op = september(order, RepairOnly::Failed);
        let mut started = Vec::new();
        while let Some(p) = advance(&daily(), &mut op, standing_of) {
            started.push(p);
            op.next = Some(past(order, p).into());
        }
        assert_eq!(started, want, "{order:?}");
        assert_eq!(op.passed, 27, "{order:?}");
        let (listed, chosen, passed) =
            dry_run(&daily(), &september(order, RepairOnly::Failed), standing_of);
        assert_eq!(
            listed, want,
            "the dry run lists what the walk starts ({order:?})"
        );
        assert_eq!(chosen.describe(), "3 failed");
        assert_eq!(passed.describe(), "27 succeeded");
    }
}

#[test]
fn an_identical_request_is_one_with_the_same_range_and_selection() {
    let (first, last) = (ts("2026-09-01T00:00:00Z"), ts("2026-09-30T00:00:00Z"));
    let done = OperationStatus {
        phase: OperationPhase::Done,
        ..september(RepairOrder::Newest, RepairOnly::Failed)
    };
    assert!(identical(Some(&done), first, last, RepairOnly::Failed).is_some());
    assert!(identical(Some(&done), first, last, RepairOnly::All).is_none());
    assert!(
        identical(
            Some(&done),
            first,
            ts("2026-09-29T00:00:00Z"),
            RepairOnly::Failed
        )
        .is_none()
    );
    let rejected = OperationStatus {
        phase: OperationPhase::Rejected,
        ..done.clone()
    };
    assert!(identical(Some(&rejected), first, last, RepairOnly::Failed).is_none());
    assert!(identical(None, first, last, RepairOnly::Failed).is_none());
}

#[test]
fn only_the_ranges_reruns_count_against_its_parallelism() {
    let op = september(RepairOrder::Oldest, RepairOnly::Failed);
    let active = [
        run(ts("2026-09-03T00:00:00Z"), 7, Some(RunOrigin::Rerun)),
        run(ts("2026-10-03T00:00:00Z"), 8, Some(RunOrigin::Rerun)),
        run(ts("2026-09-04T00:00:00Z"), 9, None),
    ];
    assert_eq!(active_runs(&active, &op), 1);
}

fn any_standing() -> impl Strategy<Value = Standing> {
    prop::sample::select(Standing::ALL.to_vec())
}

fn any_only() -> impl Strategy<Value = RepairOnly> {
    prop::sample::select(vec![
        RepairOnly::Failed,
        RepairOnly::Missed,
        RepairOnly::All,
    ])
}

proptest! {
    /// Whatever the records say and however the walk is interrupted (a run started, a wait,
    /// another reconcile), the repair starts exactly the periods its dry run lists, in the
    /// order asked, each once, and passes every other period of the range once.
    #[test]
    fn a_repair_starts_what_its_dry_run_lists_each_once(
        standings in prop::collection::vec(any_standing(), 30),
        only in any_only(),
        newest in any::<bool>(),
        waits in prop::collection::vec(any::<bool>(), 64),
    ) {
        let order = if newest { RepairOrder::Newest } else { RepairOrder::Oldest };
        let standing_of = |p: Timestamp| {
            let day = p.in_tz("UTC").unwrap().day() as usize;
            standings[day - 1]
        };
        let (listed, chosen, passed) = dry_run(&daily(), &september(order, only), standing_of);
        let mut op = september(order, only);
        let mut started = Vec::new();
        let mut waits = waits.into_iter();
        while let Some(p) = advance(&daily(), &mut op, standing_of) {
            prop_assert!(selects(only, standing_of(p)));
            // A wait leaves the cursor on the period: the next reconcile finds it again.
            if waits.next().unwrap_or(false) {
                continue;
            }
            started.push(p);
            op.next = Some(past(order, p).into());
        }
        prop_assert_eq!(&started, &listed);
        let mut sorted = started.clone();
        sorted.sort();
        sorted.dedup();
        prop_assert_eq!(sorted.len(), started.len(), "a period started twice");
        prop_assert!(started.windows(2).all(|w| (w[0] < w[1]) != newest));
        prop_assert_eq!(op.passed, passed.0.values().sum::<u64>());
        prop_assert_eq!(started.len() as u64 + op.passed, 30);
        prop_assert_eq!(chosen.0.values().sum::<u64>(), started.len() as u64);
    }
}
