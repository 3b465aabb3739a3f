//! A SingletonJob with every part of its status filled in, for the rendering and operation
//! tests.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::{
    HistoryEntry, Outcome, RunRef, SingletonJob, SingletonJobSpec, SingletonJobStatus,
};

pub(super) fn t(s: &str) -> Time {
    Time(s.parse().unwrap())
}

pub(super) fn entry(
    period: &str,
    o: Outcome,
    token: Option<u64>,
    reason: Option<&str>,
) -> HistoryEntry {
    HistoryEntry {
        unknown: Default::default(),
        late: false,
        period: t(period).0.into(),
        last_period: None,
        count: 1,
        outcome: o,
        reason: reason.map(String::from),
        job_name: token.map(|_| "hello-1".into()),
        token,
        start_time: token.map(|_| t(period)),
        finish_time: Some(t(period)),
        requested_by: None,
        cluster: None,
        message: None,
    }
}

/// The run of `period` with `token`, its Job named after the period as the controller names it.
pub(super) fn run(period: &str, token: u64) -> RunRef {
    let period = t(period).0;
    RunRef {
        unknown: Default::default(),
        late: false,
        period: period.into(),
        token,
        job_name: format!("hello-{}", period.as_second()),
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

/// A run prepared for `period` (token 8, the one after the active run's), resumed at
/// `resume_at`: claimed, its Job created suspended and confirmed, not started yet.
pub(super) fn prepared(period: &str, resume_at: &str) -> RunRef {
    RunRef {
        claimed_at: Some(t("2026-01-01T00:05:30Z")),
        job_uid: Some("0d6c1f5e-prepared".into()),
        resume_at: Some(t(resume_at).0.into()),
        basis: Some("fp:1a2b3c/spec:4d5e6f".into()),
        ..run(period, 8)
    }
}

pub(super) fn sj() -> SingletonJob {
    let spec: SingletonJobSpec = serde_json::from_value(serde_json::json!({
        "schedule": "*/5 * * * *",
        "timeZone": "Europe/Berlin",
        "jobTemplate": {}
    }))
    .unwrap();
    let mut sj = SingletonJob::new("hello", spec);
    sj.metadata.namespace = Some("team-a".into());
    sj.status = Some(SingletonJobStatus {
        fencing_token: 7,
        active_count: 1,
        last_result: Some(Outcome::Succeeded),
        last_schedule_time: Some(t("2026-01-01T00:05:00Z")),
        next_schedule_time: Some("2026-01-01T00:10:00Z".into()),
        next_schedule_times: vec![
            t("2026-01-01T00:10:00Z"),
            t("2026-01-01T00:15:00Z"),
            t("2026-01-01T00:20:00Z"),
        ],
        active: vec![run("2026-01-01T00:05:00Z", 7)],
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "Scheduled".into(),
            message: "all good".into(),
            observed_generation: Some(1),
            last_transition_time: t("2026-01-01T00:00:00Z"),
        }],
        history: (0..12)
            .map(|i| {
                entry(
                    &format!("2026-01-01T00:{:02}:00Z", 55 - i * 5),
                    Outcome::Succeeded,
                    Some(20 - i as u64),
                    None,
                )
            })
            .collect(),
        ..Default::default()
    });
    sj
}

pub(super) fn now() -> Timestamp {
    "2026-01-01T00:06:30Z".parse().unwrap()
}
