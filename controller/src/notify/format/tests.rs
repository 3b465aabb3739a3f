use super::*;
use crate::api::{HistoryEntry, Outcome};

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

const JOB: Job<'static> = Job {
    namespace: "billing",
    name: "invoices",
};

fn pending(event: NotifyOn, outcome: Outcome) -> PendingNotification {
    PendingNotification {
        id: "0123456789abcdef0123456789abcdef".into(),
        event,
        recorded: ts("2030-01-01T00:01:00Z").into(),
        targets: vec!["ops".into()],
        attempts: Some(2),
        entry: HistoryEntry {
            unknown: Default::default(),
            late: false,
            period: ts("2030-01-01T00:00:00Z").into(),
            last_period: None,
            count: 1,
            outcome,
            reason: Some("BackoffLimitExceeded".into()),
            job_name: Some("invoices-1893456000".into()),
            token: Some(7),
            start_time: Some(ts("2030-01-01T00:00:01Z").into()),
            finish_time: Some(ts("2030-01-01T00:00:31Z").into()),
            requested_by: None,
            cluster: None,
            message: None,
        },
        unknown: Default::default(),
    }
}

#[test]
fn a_cloud_event_has_the_required_attributes_and_the_runs_facts() {
    let p = pending(NotifyOn::Failed, Outcome::Failed);
    let r = request(
        NotifyFormat::CloudEvents,
        "https://hooks.example/x",
        JOB,
        &p,
    );
    assert_eq!(r.url, "https://hooks.example/x");
    assert_eq!(r.content_type, "application/cloudevents+json");
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["specversion"], "1.0");
    assert_eq!(v["id"], p.id);
    assert_eq!(v["type"], "dev.singleton.period.failed");
    assert_eq!(
        v["source"],
        "/apis/singleton.dev/v1/namespaces/billing/singletonjobs/invoices"
    );
    assert_eq!(v["subject"], "billing/invoices/2030-01-01T00:00:00Z");
    assert_eq!(v["time"], "2030-01-01T00:01:00Z");
    let d = &v["data"];
    assert_eq!(d["token"], 7);
    assert_eq!(d["attempts"], 2);
    assert_eq!(d["reason"], "BackoffLimitExceeded");
    assert_eq!(d["jobName"], "invoices-1893456000");
    assert_eq!(d["durationSeconds"], 30.0);
    assert_eq!(d["startDelaySeconds"], 1.0);
    assert_eq!(d["outcome"], "Failed");
}

#[test]
fn slack_gets_one_line_of_text() {
    let p = pending(NotifyOn::Failed, Outcome::Failed);
    let r = request(
        NotifyFormat::Slack,
        "https://hooks.slack.com/services/T/B/X",
        JOB,
        &p,
    );
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        v["text"],
        ":x: billing/invoices period 2030-01-01T00:00:00Z: Failed, reason BackoffLimitExceeded, Job invoices-1893456000, token 7, 2 attempt(s), 30 s"
    );
}

#[test]
fn check_ins_pair_a_runs_start_and_end_by_its_id() {
    let url = "https://hc.example/ping/abc/";
    let rid = run_id(JOB, ts("2030-01-01T00:00:00Z"), 7);
    assert_eq!(rid.len(), 36);
    assert_eq!(rid.matches('-').count(), 4);
    let at = |event, outcome| {
        request(
            NotifyFormat::Healthchecks,
            url,
            JOB,
            &pending(event, outcome),
        )
        .url
    };
    assert_eq!(
        at(NotifyOn::Started, Outcome::Running),
        format!("https://hc.example/ping/abc/start?rid={rid}")
    );
    assert_eq!(
        at(NotifyOn::Succeeded, Outcome::Succeeded),
        format!("https://hc.example/ping/abc?rid={rid}")
    );
    assert_eq!(
        at(NotifyOn::Late, Outcome::Running),
        format!("https://hc.example/ping/abc/fail?rid={rid}")
    );
    assert_eq!(
        at(NotifyOn::Skipped, Outcome::Skipped),
        format!("https://hc.example/ping/abc/log?rid={rid}")
    );
    // A query of the user's stays; a period without a token has no run id.
    let mut missed = pending(NotifyOn::Missed, Outcome::Missed);
    missed.entry.token = None;
    assert_eq!(
        check_in_url("https://hc.example/ping/k/slug?create=1", JOB, &missed),
        "https://hc.example/ping/k/slug/fail?create=1"
    );
}
