use proptest::prelude::*;

use super::*;
use crate::api::{NotifyFormat, RunRef};

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn entry(period: &str, outcome: Outcome, token: Option<u64>) -> HistoryEntry {
    HistoryEntry {
        unknown: Default::default(),
        late: false,
        period: ts(period).into(),
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

fn active(period: &str, token: u64, late: bool) -> RunRef {
    RunRef {
        unknown: Default::default(),
        late,
        period: ts(period).into(),
        token,
        job_name: format!("a-{token}"),
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

fn target(name: &str, on: &[NotifyOn]) -> NotifyTarget {
    NotifyTarget {
        name: name.into(),
        format: NotifyFormat::CloudEvents,
        url: Some("http://127.0.0.1:1/".into()),
        events: on.to_vec(),
        ..Default::default()
    }
}

/// Adds `e` to the history, newest first and bounded, as the record step does (a module the
/// decisions do not import).
fn push(st: &mut SingletonJobStatus, e: HistoryEntry) {
    st.history.insert(0, e);
    st.history.truncate(20);
}

/// Newest first, as status keeps it.
fn status(history: Vec<HistoryEntry>) -> SingletonJobStatus {
    SingletonJobStatus {
        history,
        ..Default::default()
    }
}

const NOW: &str = "2030-01-01T00:10:00Z";
const ALL: [NotifyOn; 8] = [
    NotifyOn::Started,
    NotifyOn::Succeeded,
    NotifyOn::Failed,
    NotifyOn::Missed,
    NotifyOn::Late,
    NotifyOn::Skipped,
    NotifyOn::Replaced,
    NotifyOn::Deduplicated,
];

fn kinds(found: &[(NotifyOn, HistoryEntry)]) -> Vec<NotifyOn> {
    found.iter().map(|(k, _)| *k).collect()
}

#[test]
fn a_start_and_then_its_outcome_are_one_event_each() {
    let started = status(vec![entry(
        "2030-01-01T00:00:00Z",
        Outcome::Running,
        Some(3),
    )]);
    assert_eq!(kinds(&events(None, &started)), vec![NotifyOn::Started]);
    let done = status(vec![entry(
        "2030-01-01T00:00:00Z",
        Outcome::Succeeded,
        Some(3),
    )]);
    assert_eq!(
        kinds(&events(Some(&started), &done)),
        vec![NotifyOn::Succeeded]
    );
    // A write that adds nothing to the history (a condition, a cursor) records nothing.
    assert!(events(Some(&done), &done).is_empty());
    // A run that started and ended between two writes: its start, then its outcome.
    assert_eq!(
        kinds(&events(None, &done)),
        vec![NotifyOn::Started, NotifyOn::Succeeded]
    );
}

#[test]
fn several_entries_of_one_write_come_oldest_first() {
    let old = status(vec![entry(
        "2030-01-01T00:00:00Z",
        Outcome::Succeeded,
        Some(1),
    )]);
    let new = status(vec![
        entry("2030-01-01T00:02:00Z", Outcome::Running, Some(2)),
        entry("2030-01-01T00:01:00Z", Outcome::Missed, None),
        entry("2030-01-01T00:00:00Z", Outcome::Succeeded, Some(1)),
    ]);
    assert_eq!(
        kinds(&events(Some(&old), &new)),
        vec![NotifyOn::Missed, NotifyOn::Started]
    );
}

#[test]
fn a_run_becoming_late_is_one_event_whether_it_is_active_or_finished() {
    let p = "2030-01-01T00:00:00Z";
    let mut running = status(vec![entry(p, Outcome::Running, Some(4))]);
    running.active = vec![active(p, 4, false)];
    let mut late = running.clone();
    late.active[0].late = true;
    assert_eq!(kinds(&events(Some(&running), &late)), vec![NotifyOn::Late]);
    // It finishes, late: its outcome only (the lateness was told).
    let mut finished = status(vec![entry(p, Outcome::Failed, Some(4))]);
    finished.history[0].late = true;
    assert_eq!(
        kinds(&events(Some(&late), &finished)),
        vec![NotifyOn::Failed]
    );
    // Finished past its deadline before any write saw it late: both.
    assert_eq!(
        kinds(&events(Some(&running), &finished)),
        vec![NotifyOn::Failed, NotifyOn::Late]
    );
}

#[test]
fn a_rerun_of_a_period_is_told_again_under_another_id() {
    let p = "2030-01-01T00:00:00Z";
    let first = status(vec![entry(p, Outcome::Succeeded, Some(1))]);
    let rerun = status(vec![
        entry(p, Outcome::Succeeded, Some(7)),
        entry(p, Outcome::Succeeded, Some(1)),
    ]);
    let found = events(Some(&first), &rerun);
    assert_eq!(kinds(&found), vec![NotifyOn::Started, NotifyOn::Succeeded]);
    assert_eq!(found[1].1.token, Some(7));
    assert_ne!(
        event_id("ns/a", ts(p), NotifyOn::Succeeded, Some(1)),
        event_id("ns/a", ts(p), NotifyOn::Succeeded, Some(7))
    );
}

#[test]
fn fill_records_only_what_a_target_asks_for_with_its_targets() {
    let targets = [
        target("ops", &[]),
        target("slack", &[NotifyOn::Failed, NotifyOn::Succeeded]),
    ];
    let old = status(vec![entry(
        "2030-01-01T00:00:00Z",
        Outcome::Running,
        Some(1),
    )]);
    let mut new = status(vec![
        entry("2030-01-01T00:01:00Z", Outcome::Skipped, None),
        entry("2030-01-01T00:00:00Z", Outcome::Failed, Some(1)),
    ]);
    fill(&targets, "ns/a", Some(&old), &mut new, |_| Some(2), ts(NOW));
    let n = new.notifications.as_ref().unwrap();
    assert_eq!(n.pending.len(), 1, "Skipped is asked for by nobody");
    let p = &n.pending[0];
    assert_eq!(p.event, NotifyOn::Failed);
    assert_eq!(p.targets, vec!["ops".to_string(), "slack".to_string()]);
    assert_eq!(p.attempts, Some(2));
    assert_eq!(
        p.id,
        event_id(
            "ns/a",
            ts("2030-01-01T00:00:00Z"),
            NotifyOn::Failed,
            Some(1)
        )
    );
    // Without targets, nothing.
    let mut bare = status(new.history.clone());
    fill(&[], "ns/a", Some(&old), &mut bare, |_| None, ts(NOW));
    assert!(bare.notifications.is_none());
}

#[test]
fn the_outbox_keeps_the_newest_hundred_and_counts_the_rest() {
    let targets = [target("ops", &[NotifyOn::Succeeded])];
    let mut st = SingletonJobStatus::default();
    for i in 0..130u64 {
        let old = st.clone();
        let period = Timestamp::from_second(1_900_000_000 + i as i64 * 60).unwrap();
        let mut e = entry("2030-01-01T00:00:00Z", Outcome::Succeeded, Some(i + 1));
        e.period = period.into();
        push(&mut st, e);
        fill(&targets, "ns/a", Some(&old), &mut st, |_| None, ts(NOW));
    }
    let n = st.notifications.as_ref().unwrap();
    assert_eq!(n.pending.len(), MAX_PENDING);
    assert_eq!(n.dropped, 30);
    assert_eq!(n.pending.last().unwrap().entry.token, Some(130));
}

fn pending_for(targets: &[NotifyTarget]) -> SingletonJobStatus {
    let old = SingletonJobStatus::default();
    let mut new = status(vec![entry(
        "2030-01-01T00:00:00Z",
        Outcome::Failed,
        Some(1),
    )]);
    fill(targets, "ns/a", Some(&old), &mut new, |_| None, ts(NOW));
    new
}

fn delivery(id: &str, target: &str, fate: Fate) -> Delivery {
    Delivery {
        id: id.into(),
        target: target.into(),
        at: ts(NOW),
        fate,
    }
}

#[test]
fn a_delivered_event_leaves_the_outbox_with_its_last_target_and_counts_once() {
    let targets = [target("ops", &[]), target("slack", &[])];
    let mut st = pending_for(&targets);
    let id = st.notifications.as_ref().unwrap().pending[0].id.clone();
    let ok = delivery(&id, "ops", Fate::Delivered);
    assert!(settle(&targets, &mut st, &[ok.clone(), ok.clone()]).is_empty());
    let n = st.notifications.as_ref().unwrap();
    assert_eq!(n.pending[0].targets, vec!["slack".to_string()]);
    assert_eq!(n.targets[0].delivered, 1, "a repeated result counts once");
    let failing = delivery(&id, "slack", Fate::Failing("503".into()));
    settle(&targets, &mut st, &[failing]);
    let n = st.notifications.as_ref().unwrap();
    assert_eq!(n.pending.len(), 1, "a failing try keeps it pending");
    assert_eq!(n.targets[1].last_error.as_deref(), Some("503"));
    let gone = delivery(&id, "slack", Fate::GaveUp("503 for an hour".into()));
    let gave_up = settle(&targets, &mut st, &[gone.clone(), gone]);
    assert_eq!(gave_up.len(), 1, "given up once");
    let n = st.notifications.as_ref().unwrap();
    assert!(n.pending.is_empty());
    assert_eq!((n.targets[0].delivered, n.targets[1].failed), (1, 1));
}

#[test]
fn a_target_removed_from_the_spec_is_forgotten_with_its_events() {
    let targets = [target("ops", &[])];
    let mut st = pending_for(&targets);
    settle(&targets, &mut st, &[]);
    assert_eq!(st.notifications.as_ref().unwrap().pending.len(), 1);
    settle(&[], &mut st, &[]);
    assert!(st.notifications.is_none());
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        Just(Outcome::Running),
        Just(Outcome::Succeeded),
        Just(Outcome::Failed),
        Just(Outcome::Skipped),
        Just(Outcome::Missed),
        Just(Outcome::Replaced),
        Just(Outcome::Deduplicated),
    ]
}

proptest! {
    /// Over any sequence of writes, each (period, token, outcome) the history ever shows is
    /// recorded, with a start for each run that ended, once each (ids unique), and nothing else.
    #[test]
    fn every_history_entry_is_recorded_once(
        steps in prop::collection::vec((0i64..6, 1u64..4, outcome(), any::<bool>()), 1..40)
    ) {
        let targets = [target("ops", &ALL)];
        let mut st = SingletonJobStatus::default();
        let mut want = BTreeSet::new();
        let id = |k: RunKey, event| event_id("ns/a", k.0, event, k.1);
        for (minute, token, outcome, repeat) in steps {
            let old = st.clone();
            let mut e = entry("2030-01-01T00:00:00Z", outcome, Some(token));
            e.period = (ts("2030-01-01T00:00:00Z") + jiff::SignedDuration::from_mins(minute)).into();
            let k = (key(&e), outcome);
            // A run's entry is replaced by its outcome; a repeat is a write of the same entry.
            if !(repeat && st.history.iter().any(|h| (key(h), h.outcome) == k)) {
                st.history.retain(|h| key(h) != key(&e));
                push(&mut st, e);
            }
            fill(&targets, "ns/a", Some(&old), &mut st, |_| None, ts(NOW));
            for h in &st.history {
                want.insert(id(key(h), outcome_event(h.outcome)));
                if ran(h.outcome) {
                    want.insert(id(key(h), NotifyOn::Started));
                }
            }
        }
        let pending = st.notifications.map(|n| n.pending).unwrap_or_default();
        let ids: BTreeSet<_> = pending.iter().map(|p| p.id.clone()).collect();
        prop_assert_eq!(ids.len(), pending.len());
        prop_assert_eq!(ids, want);
    }
}
