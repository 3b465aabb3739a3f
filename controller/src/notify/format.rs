//! What is sent for an event, per `format`: pure functions of the event and the target's URL.

use jiff::Timestamp;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::api::{NotifyFormat, NotifyOn, PendingNotification};
use crate::naming::period_rfc3339;

/// A request to send: always a POST.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub url: String,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

/// The SingletonJob an event is about.
#[derive(Clone, Copy, Debug)]
pub struct Job<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
}

/// The request for `p` to a target of `format` at `url`.
pub fn request(format: NotifyFormat, url: &str, job: Job<'_>, p: &PendingNotification) -> Request {
    match format {
        NotifyFormat::CloudEvents => Request {
            url: url.to_string(),
            content_type: "application/cloudevents+json",
            body: cloud_event(job, p).to_string().into_bytes(),
        },
        NotifyFormat::Slack => Request {
            url: url.to_string(),
            content_type: "application/json",
            body: json!({ "text": summary(job, p) }).to_string().into_bytes(),
        },
        NotifyFormat::Healthchecks => Request {
            url: check_in_url(url, job, p),
            content_type: "text/plain; charset=utf-8",
            body: summary(job, p).into_bytes(),
        },
    }
}

/// `dev.singleton.period.<event>`, lower case.
pub fn event_type(event: NotifyOn) -> String {
    format!("dev.singleton.period.{}", event.name().to_ascii_lowercase())
}

/// The event in CloudEvents 1.0's structured JSON mode.
pub fn cloud_event(job: Job<'_>, p: &PendingNotification) -> serde_json::Value {
    let e = &p.entry;
    let period = period_rfc3339(e.period.0);
    // Whole seconds, as the API server keeps them: the body is the same from any copy.
    let secs = |t: Timestamp| Timestamp::from_second(t.as_second()).unwrap_or(t);
    let start = e.start_time.as_ref().map(|t| secs(t.0));
    let finish = e.finish_time.as_ref().map(|t| secs(t.0));
    let seconds = |a: Timestamp, b: Timestamp| b.duration_since(a).as_secs_f64();
    json!({
        "specversion": "1.0",
        "id": p.id,
        "source": format!(
            "/apis/singleton.dev/v1/namespaces/{}/singletonjobs/{}",
            job.namespace, job.name
        ),
        "type": event_type(p.event),
        "subject": format!("{}/{}/{period}", job.namespace, job.name),
        "time": secs(p.recorded.0).to_string(),
        "datacontenttype": "application/json",
        "data": {
            "namespace": job.namespace,
            "name": job.name,
            "event": p.event.name(),
            "period": period,
            "lastPeriod": e.last_period.as_ref().map(|t| period_rfc3339(t.0)),
            "periods": e.count,
            "outcome": e.outcome.name(),
            "reason": e.reason,
            "message": e.message,
            "token": e.token,
            "jobName": e.job_name,
            "attempts": p.attempts,
            "startTime": start.map(|t| t.to_string()),
            "finishTime": finish.map(|t| t.to_string()),
            // From the claim to the outcome, and from the period's instant to the claim.
            "durationSeconds": start.zip(finish).map(|(s, f)| seconds(s, f)),
            "startDelaySeconds": start.map(|s| seconds(e.period.0, s)),
            "late": e.late,
            "requestedBy": e.requested_by,
            "cluster": e.cluster,
        },
    })
}

/// One line for people (Slack, a check-in's log).
pub fn summary(job: Job<'_>, p: &PendingNotification) -> String {
    let e = &p.entry;
    let mut s = format!(
        "{} {}/{} period {}: {}",
        mark(p.event),
        job.namespace,
        job.name,
        period_rfc3339(e.period.0),
        p.event.name()
    );
    if let Some(last) = &e.last_period {
        s.push_str(&format!(
            " ({} periods to {})",
            e.count,
            period_rfc3339(last.0)
        ));
    }
    if let Some(r) = &e.reason {
        s.push_str(&format!(", reason {r}"));
    }
    if let Some(j) = &e.job_name {
        s.push_str(&format!(", Job {j}"));
    }
    if let Some(t) = e.token {
        s.push_str(&format!(", token {t}"));
    }
    if let Some(a) = p.attempts {
        s.push_str(&format!(", {a} attempt(s)"));
    }
    if let (Some(a), Some(b)) = (&e.start_time, &e.finish_time) {
        s.push_str(&format!(", {:.0} s", b.0.duration_since(a.0).as_secs_f64()));
    }
    if let Some(m) = &e.message {
        s.push_str(&format!(": {m}"));
    }
    s
}

fn mark(event: NotifyOn) -> &'static str {
    match event {
        NotifyOn::Succeeded => ":white_check_mark:",
        NotifyOn::Failed => ":x:",
        NotifyOn::Missed | NotifyOn::Late => ":warning:",
        NotifyOn::Started => ":arrow_forward:",
        NotifyOn::Skipped | NotifyOn::Replaced | NotifyOn::Deduplicated => ":information_source:",
    }
}

/// A Healthchecks-style check-in: `/start` when a run starts, the URL itself when it succeeds,
/// `/fail` when it fails, is missed or late, `/log` for the rest (recorded, the check's state
/// unchanged). A run's check-ins carry its id as `rid`, so start and end pair up.
pub fn check_in_url(url: &str, job: Job<'_>, p: &PendingNotification) -> String {
    let suffix = match p.event {
        NotifyOn::Started => "/start",
        NotifyOn::Succeeded => "",
        NotifyOn::Failed | NotifyOn::Missed | NotifyOn::Late => "/fail",
        NotifyOn::Skipped | NotifyOn::Replaced | NotifyOn::Deduplicated => "/log",
    };
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out = format!("{}{suffix}", base.trim_end_matches('/'));
    let mut params: Vec<String> = query.into_iter().map(str::to_string).collect();
    if let Some(token) = p.entry.token {
        params.push(format!("rid={}", run_id(job, p.entry.period.0, token)));
    }
    if !params.is_empty() {
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

/// A run's id as a UUID (Healthchecks takes only UUIDs as `rid`): from the job, the period and
/// the token, so every replica gives a run the same one.
pub fn run_id(job: Job<'_>, period: Timestamp, token: u64) -> String {
    let mut h = Sha256::new();
    h.update(format!(
        "{}/{}\n{}\n{token}",
        job.namespace,
        job.name,
        period_rfc3339(period)
    ));
    let b = h.finalize();
    let hex: String = b[..16].iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests;
