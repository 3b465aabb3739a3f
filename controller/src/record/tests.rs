//! The status bookkeeping, without an API server.

use std::collections::HashMap;

use jiff::{SignedDuration, Timestamp};

use super::*;
use crate::api::{HistoryEntry, Outcome, RunRef, SingletonJobStatus};
use crate::clock::ClockState;
use crate::decide::{JobState, Plan, Waiting, reason};
use crate::observe::Behind;

fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn run(period: &str, token: u64) -> RunRef {
    RunRef {
        unknown: Default::default(),
        late: false,
        period: t(period).into(),
        token,
        job_name: format!("a-{token}"),
        claimed_at: Some(t(period).into()),
        job_uid: Some(format!("uid-{token}")),
        origin: None,
        requested_by: None,
        supersedes: None,
        replaces: Vec::new(),
        resume_at: None,
        basis: None,
    }
}

fn condition<'a>(status: &'a SingletonJobStatus, type_: &str) -> Option<&'a str> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.as_str())
}

#[test]
fn the_history_keeps_the_newest_entries_newest_first() {
    let mut status = SingletonJobStatus::default();
    for token in 1..=(HISTORY_LIMIT as u64 + 5) {
        let r = run("2030-01-01T00:00:00Z", token);
        push_history(&mut status, run_entry(&r, Outcome::Succeeded, None, None));
    }
    assert_eq!(status.history.len(), HISTORY_LIMIT);
    assert_eq!(status.history[0].token, Some(HISTORY_LIMIT as u64 + 5));
}

#[test]
fn a_finished_run_replaces_its_running_entry_and_keeps_its_reason() {
    let (a, b) = (
        run("2030-01-01T00:00:00Z", 1),
        run("2030-01-01T00:01:00Z", 2),
    );
    let mut status = SingletonJobStatus {
        active: vec![a.clone(), b.clone()],
        ..Default::default()
    };
    let skipped = Some(reason::BACKSTOP_SKIPPED.to_string());
    push_history(
        &mut status,
        run_entry(&a, Outcome::Running, skipped.clone(), None),
    );
    push_history(&mut status, run_entry(&b, Outcome::Running, None, None));
    let done = t("2030-01-01T00:02:00Z");
    let plan = Plan {
        finished: vec![
            (a.clone(), Outcome::Succeeded, done),
            (b.clone(), Outcome::Failed, done),
        ],
        decided_through: Some(t("2030-01-01T00:01:00Z")),
        fingerprint: "fp".into(),
        ..Plan::default()
    };
    let states = HashMap::from([(b.job_name.clone(), JobState::Gone)]);
    let new = apply_plan(
        &Default::default(),
        &mut status,
        &plan,
        &states,
        Timestamp::now(),
    );
    assert_eq!(new.len(), 2);
    assert_eq!(
        status.history.len(),
        2,
        "the Running entries became outcomes"
    );
    let of = |token| {
        status
            .history
            .iter()
            .find(|h| h.token == Some(token))
            .unwrap()
    };
    assert_eq!(
        (of(1).outcome, of(1).reason.clone()),
        (Outcome::Succeeded, skipped)
    );
    assert_eq!(
        (of(2).outcome, of(2).reason.as_deref()),
        (Outcome::Failed, Some(reason::JOB_DELETED)),
        "a Job that vanished says so"
    );
    assert!(status.active.is_empty() && status.active_count == 0);
    assert_eq!(status.last_successful_time.map(|t| t.0), Some(done));
    assert_eq!(status.last_result, Some(Outcome::Failed));
    assert_eq!(status.schedule_fingerprint.as_deref(), Some("fp"));
}

fn facts<'a>(clock: &'a ClockState, backstop: BackstopSeen, waiting: Option<Waiting>) -> Facts<'a> {
    Facts {
        schedule: "*/5 * * * *",
        time_zone: "UTC",
        suspended: false,
        suspension: None,
        suspended_after_failures: false,
        clock,
        backstop,
        waiting,
        generation: Some(3),
        now: t("2030-01-01T00:00:00Z"),
    }
}

#[test]
fn conditions_say_what_stops_runs_and_a_backstop_outage_is_news_once() {
    let trusted = ClockState::agreeing();
    let mut status = SingletonJobStatus::default();
    assert!(!set_conditions(
        &mut status,
        &facts(&trusted, BackstopSeen::Ready, None)
    ));
    assert_eq!(condition(&status, conditions::READY), Some("True"));
    assert_eq!(condition(&status, conditions::BACKSTOP_READY), Some("True"));
    let down = BackstopSeen::Unavailable("refused".into());
    let waiting = Some(Waiting::BackstopUnavailable);
    assert!(set_conditions(
        &mut status,
        &facts(&trusted, down.clone(), waiting)
    ));
    assert!(
        !set_conditions(&mut status, &facts(&trusted, down, waiting)),
        "the same outage is not news twice"
    );
    assert_eq!(condition(&status, conditions::READY), Some("False"));
    set_conditions(
        &mut status,
        &facts(&trusted, BackstopSeen::NotConfigured, None),
    );
    assert_eq!(condition(&status, conditions::BACKSTOP_READY), None);
    set_conditions(
        &mut status,
        &facts(
            &ClockState::UNKNOWN,
            BackstopSeen::NotConfigured,
            Some(Waiting::ClockUntrusted),
        ),
    );
    assert_eq!(condition(&status, conditions::CLOCK_TRUSTED), Some("False"));
}

#[test]
fn a_status_behind_its_jobs_is_raised_and_says_so_until_a_later_run() {
    let running = run("2030-01-01T10:05:00Z", 8);
    let mut status = SingletonJobStatus::default();
    let behind = Behind {
        token: Some(8),
        decided_through: Some(t("2030-01-01T10:05:00Z")),
        running: vec![running.clone()],
        prepared: None,
    };
    let raised_at = t("2030-01-01T10:06:00Z");
    let msg = raise_to_jobs(&mut status, behind, "fp".into(), Some(1), raised_at);
    assert!(msg.contains("fencingToken from 0 to 8"), "{msg}");
    assert_eq!(status.fencing_token, 8);
    assert_eq!(
        status.decided_through.as_ref().map(|t| t.0),
        Some(t("2030-01-01T10:05:00Z"))
    );
    assert_eq!(status.schedule_fingerprint.as_deref(), Some("fp"));
    assert_eq!(status.active, vec![running]);
    assert_eq!(
        condition(&status, conditions::STATUS_CONSISTENT),
        Some("False")
    );
    // Still False until a run claimed after the raise is recorded.
    settle_consistency(&mut status, Some(1), raised_at);
    assert_eq!(
        condition(&status, conditions::STATUS_CONSISTENT),
        Some("False")
    );
    let mut later = run("2030-01-01T10:10:00Z", 9);
    later.claimed_at = Some(t("2030-01-01T10:10:00Z").into());
    push_history(&mut status, run_entry(&later, Outcome::Running, None, None));
    settle_consistency(&mut status, Some(1), t("2030-01-01T10:10:01Z"));
    assert_eq!(
        condition(&status, conditions::STATUS_CONSISTENT),
        Some("True")
    );
}

#[test]
fn claims_are_recorded_from_creation_for_a_new_singletonjob_else_from_now_rounded_up() {
    let created = t("2030-01-01T00:00:00Z");
    let now = t("2030-01-02T00:00:00.3Z");
    let mut fresh = SingletonJobStatus::default();
    mark_claims_recorded(&mut fresh, "sha256:a".into(), 0, created, now);
    assert_eq!(
        fresh.claims_recorded.as_ref().map(|c| c.since.0),
        Some(created)
    );
    // The same target: unchanged. Another one: from now, rounded up to the whole second.
    mark_claims_recorded(
        &mut fresh,
        "sha256:a".into(),
        0,
        created,
        now + SignedDuration::from_hours(1),
    );
    assert_eq!(
        fresh.claims_recorded.as_ref().map(|c| c.since.0),
        Some(created)
    );
    let mut running = SingletonJobStatus {
        fencing_token: 4,
        ..Default::default()
    };
    mark_claims_recorded(&mut running, "sha256:b".into(), 4, created, now);
    assert_eq!(
        running.claims_recorded.as_ref().map(|c| c.since.0),
        Some(t("2030-01-02T00:00:01Z"))
    );
    let entry = HistoryEntry {
        unknown: Default::default(),
        late: false,
        period: created.into(),
        last_period: None,
        count: 1,
        outcome: Outcome::Missed,
        reason: None,
        job_name: None,
        token: None,
        start_time: None,
        finish_time: None,
        requested_by: None,
        cluster: None,
        message: None,
    };
    let mut with_history = SingletonJobStatus::default();
    with_history.history.push(entry);
    mark_claims_recorded(&mut with_history, "sha256:c".into(), 0, created, now);
    assert_ne!(
        with_history.claims_recorded.map(|c| c.since.0),
        Some(created)
    );
}

/// F12: a wiped status (no token, no history) looks like a new SingletonJob's, but the backstop's
/// fence shows tokens were issued: runs before now may have gone without a claim row (an
/// Efficiency run with its database down), so the claims are recorded from now, not from the
/// creation, and a backfill of those periods is refused.
#[test]
fn a_wiped_status_is_not_taken_for_a_new_singletonjob() {
    let created = t("2030-01-01T00:00:00Z");
    let now = t("2030-01-02T00:00:00Z");
    let mut wiped = SingletonJobStatus::default();
    mark_claims_recorded(&mut wiped, "sha256:a".into(), 7, created, now);
    let since = wiped.claims_recorded.as_ref().map(|c| c.since.0);
    assert_eq!(since, Some(now));
    let range = (t("2030-01-01T06:00:00Z"), t("2030-01-01T06:00:00Z"), 1);
    let recorded = wiped.claims_recorded.as_deref();
    assert!(
        crate::decide::ops::check_claims_recorded(range, Some(created), recorded, false).is_err()
    );
}

/// Version skew (issue 36): a field a newer release recorded on a run's Running entry stays on
/// that run's entry when this release records its outcome, and on no other.
#[test]
fn a_finished_run_keeps_what_a_newer_release_recorded_on_its_entry() {
    let (a, b) = (
        run("2030-01-01T00:00:00Z", 1),
        run("2030-01-01T00:01:00Z", 2),
    );
    let mut status = SingletonJobStatus {
        active: vec![a.clone(), b.clone()],
        ..Default::default()
    };
    let mut newer = run_entry(&a, Outcome::Running, None, None);
    newer
        .unknown
        .insert("attemptsCommitted", serde_json::json!(2));
    push_history(&mut status, newer);
    push_history(&mut status, run_entry(&b, Outcome::Running, None, None));
    let done = t("2030-01-01T00:02:00Z");
    let plan = Plan {
        finished: vec![
            (a.clone(), Outcome::Succeeded, done),
            (b.clone(), Outcome::Succeeded, done),
        ],
        fingerprint: "fp".into(),
        ..Plan::default()
    };
    apply_plan(
        &Default::default(),
        &mut status,
        &plan,
        &HashMap::new(),
        done,
    );
    let kept: Vec<_> = status
        .history
        .iter()
        .map(|h| {
            (
                h.token,
                h.outcome,
                h.unknown.get("attemptsCommitted").cloned(),
            )
        })
        .collect();
    assert_eq!(
        kept,
        vec![
            (Some(2), Outcome::Succeeded, None),
            (Some(1), Outcome::Succeeded, Some(serde_json::json!(2))),
        ]
    );
}

/// A prepared Job adopted by a status behind it becomes the status's prepared run (judged, and
/// withdrawn), never an active one: adopting it as running would resume it before its instant.
#[test]
fn a_status_behind_a_prepared_job_adopts_it_as_prepared() {
    let mut prepared = run("2030-01-01T10:06:00Z", 9);
    prepared.resume_at = Some(t("2030-01-01T10:06:00Z").into());
    let mut status = SingletonJobStatus::default();
    let behind = Behind {
        token: Some(9),
        decided_through: None,
        running: Vec::new(),
        prepared: Some(prepared.clone()),
    };
    let msg = raise_to_jobs(
        &mut status,
        behind,
        "fp".into(),
        Some(1),
        t("2030-01-01T10:05:00Z"),
    );
    assert!(msg.contains("adopted prepared Job"), "{msg}");
    assert_eq!(status.prepared, Some(prepared));
    assert!(status.active.is_empty());
    assert_eq!(status.decided_through, None, "nothing decided by it");
    assert_eq!(status.fencing_token, 9);
    assert_eq!(
        status.run_count, 1,
        "its withdrawal gives back what its preparation counted"
    );
}
