//! Names and labels. Deterministic: the same SingletonJob and period always give the same Job
//! name, so the API server's name uniqueness refuses a second Job for a period (layer 3 of the
//! defence, G1).

use jiff::Timestamp;
use sha2::{Digest, Sha256};

pub const LABEL_JOB: &str = "singleton.dev/job";
pub const LABEL_PERIOD: &str = "singleton.dev/period";
pub const LABEL_TOKEN: &str = "singleton.dev/fencing-token";

pub const ENV_JOB: &str = "SINGLETON_JOB";
pub const ENV_PERIOD: &str = "SINGLETON_PERIOD";
pub const ENV_TOKEN: &str = "SINGLETON_FENCING_TOKEN";
pub const ENV_IDEMPOTENCY_KEY: &str = "SINGLETON_IDEMPOTENCY_KEY";
/// The period's window ([`crate::schedule::Window`]): the schedule's periods around it, its
/// time zone, its local date there and a readable key of it.
pub const ENV_PREVIOUS_PERIOD: &str = "SINGLETON_PREVIOUS_PERIOD";
pub const ENV_NEXT_PERIOD: &str = "SINGLETON_NEXT_PERIOD";
pub const ENV_TIME_ZONE: &str = "SINGLETON_TIME_ZONE";
pub const ENV_BUSINESS_DATE: &str = "SINGLETON_BUSINESS_DATE";
pub const ENV_PERIOD_KEY: &str = "SINGLETON_PERIOD_KEY";
/// The attempt's id: its pod's uid (downward API), so the fence can tell the pods of one run
/// apart (`<p>attempt()`, docs/fencing.md).
pub const ENV_ATTEMPT: &str = "SINGLETON_ATTEMPT";

/// Set by the controller's resume (or queue release) of a run's Job, in the same patch that lets
/// it run, after its claim is confirmed: a Job of ours unsuspended without it was started by
/// someone else (a webhook, a queue, a person) and is stopped (issue 31). Its value is the token.
pub const ANNOTATION_RELEASED: &str = "singleton.dev/released";
/// [`ANNOTATION_RELEASED`]'s value on a Job not released yet (created suspended).
pub const NOT_RELEASED: &str = "false";
/// [`ANNOTATION_RELEASED`]'s value on a prepared run's Job that was withdrawn before its instant:
/// it never ran and may never be resumed (a resume tests for [`NOT_RELEASED`]).
pub const WITHDRAWN: &str = "withdrawn";
/// On a prepared run's Job: why it was withdrawn (a `WithdrawReason`).
pub const ANNOTATION_WITHDRAWN: &str = "singleton.dev/withdrawn";
/// On a prepared run's Job: the instant (RFC 3339, UTC) before which it is never resumed.
pub const ANNOTATION_RESUME_AT: &str = "singleton.dev/resume-at";

/// Kueue's queue label: on a queue-managed template it is withheld at create and added by the
/// release after the confirm, so the queue admits only confirmed runs.
pub const LABEL_KUEUE_QUEUE: &str = "kueue.x-k8s.io/queue-name";

/// Job names become the `job-name` label of pods, limited to 63 characters.
const MAX_NAME: usize = 63;

pub(crate) fn short_hash(s: &str, hex_len: usize) -> String {
    let digest = Sha256::digest(s.as_bytes());
    digest
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()[..hex_len]
        .to_string()
}

/// Trims a name to `max` characters so it still ends in an alphanumeric (DNS-1123).
fn trim_name(name: &str, max: usize) -> &str {
    let mut end = name.len().min(max);
    while end > 0 && !name.as_bytes()[end - 1].is_ascii_alphanumeric() {
        end -= 1;
    }
    &name[..end]
}

/// A label-safe (at most 63 characters) form of the SingletonJob name: the name itself when it
/// fits, else a prefix and a hash of the whole name, so distinct names stay distinct.
pub fn job_label(sj_name: &str) -> String {
    if sj_name.len() <= MAX_NAME {
        sj_name.to_string()
    } else {
        format!(
            "{}-{}",
            trim_name(sj_name, MAX_NAME - 11),
            short_hash(sj_name, 10)
        )
    }
}

/// Label-safe compact period: `20270328T010000Z` (a manual period: `20270328T010000.123456Z`).
pub fn period_label(period: Timestamp) -> String {
    if is_manual(period) {
        period.strftime("%Y%m%dT%H%M%S%.6fZ").to_string()
    } else {
        period.strftime("%Y%m%dT%H%M%SZ").to_string()
    }
}

/// RFC 3339 UTC with seconds, the value of SINGLETON_PERIOD; a manual period (see
/// [`manual_period`]) carries its microseconds.
pub fn period_rfc3339(period: Timestamp) -> String {
    if is_manual(period) {
        period.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
    } else {
        period.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    }
}

/// The period of a manual run (`kubectl singleton trigger`) claimed at `now`: `now` at
/// microsecond precision (what the backstop stores), never on a whole second. Cron has whole
/// seconds only, so a manual period can never be one of the schedule's: its claim, Job name and
/// idempotency key never collide with a scheduled run's, however the two fall.
pub fn manual_period(now: Timestamp) -> Timestamp {
    let micros = now.as_microsecond();
    let micros = if micros % 1_000_000 == 0 {
        micros + 1
    } else {
        micros
    };
    // In range: `now` was, and moving by one microsecond off a whole second stays within a second.
    Timestamp::from_microsecond(micros).unwrap_or(now)
}

/// Whether `period` is a manual one (not on a whole second).
pub fn is_manual(period: Timestamp) -> bool {
    period.subsec_nanosecond() != 0
}

/// The Job name for a period: `<name>-<unix seconds>` (a manual period:
/// `<name>-<unix seconds>-<microseconds>`), with the name shortened and a hash of the full name
/// added when the result would exceed 63 characters.
pub fn job_name(sj_name: &str, period: Timestamp) -> String {
    let suffix = if is_manual(period) {
        format!(
            "{}-{:06}",
            period.as_second(),
            period.subsec_microsecond().unsigned_abs()
        )
    } else {
        period.as_second().to_string()
    };
    with_suffix(sj_name, &suffix)
}

/// The Job name of a re-run of `period` (`kubectl singleton rerun`) with fencing token `token`:
/// the period's name ([`job_name`]) plus `-r<token>`, `<name>-<unix seconds>-r<token>`, shortened
/// as [`job_name`] is. Distinct from the period's own Job (which may still exist as history), from
/// a manual period's (whose suffix is digits only) and from every other re-run of the period: a
/// token is issued once, by the claim's compare-and-swap that records this name (a re-claim above
/// a fence that rose meanwhile raises the token and keeps the name). Deterministic: whoever
/// completes the claim creates the Job under the name the claim recorded.
pub fn rerun_job_name(sj_name: &str, period: Timestamp, token: u64) -> String {
    with_suffix(sj_name, &format!("{}-r{token}", period.as_second()))
}

/// `<sj_name>-<suffix>`, or, beyond 63 characters, the name trimmed with a hash of the full name.
fn with_suffix(sj_name: &str, suffix: &str) -> String {
    let full = format!("{sj_name}-{suffix}");
    if full.len() <= MAX_NAME {
        return full;
    }
    let hash = short_hash(sj_name, 8);
    let room = MAX_NAME - suffix.len() - hash.len() - 2;
    format!("{}-{hash}-{suffix}", trim_name(sj_name, room))
}

/// Stable per SingletonJob and period, also across re-creation of the SingletonJob; 64 hex
/// characters fit every idempotency-key field we know of (Stripe allows 255).
pub fn idempotency_key(sj_key: &str, period: Timestamp) -> String {
    short_hash(&format!("{sj_key}@{}", period_rfc3339(period)), 64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_deterministic_and_short() {
        let p: Timestamp = "2027-03-28T01:00:00Z".parse().unwrap();
        assert_eq!(job_name("hello", p), "hello-1806195600");
        assert_eq!(job_name("hello", p), job_name("hello", p));
        let long = "a".repeat(253);
        let other = format!("{}b", "a".repeat(252));
        let n1 = job_name(&long, p);
        let n2 = job_name(&other, p);
        assert!(n1.len() <= 63 && n2.len() <= 63, "{n1} {n2}");
        assert_ne!(n1, n2, "long names differing only at the end stay distinct");
        assert!(n1.ends_with("-1806195600"));
        assert_ne!(
            job_name("x", p),
            job_name("x", p + jiff::SignedDuration::from_secs(1))
        );
    }

    #[test]
    fn trimmed_names_end_alphanumeric() {
        let name = format!("{}-x", "a".repeat(50));
        let n = job_name(&name, "2027-03-28T01:00:00Z".parse().unwrap());
        assert!(n.len() <= 63);
        assert!(!n.contains("--"), "{n}");
        let l = job_label(&format!("{}-{}", "b".repeat(51), "c".repeat(40)));
        assert!(l.len() <= 63 && !l.contains("--"), "{l}");
    }

    #[test]
    fn labels_are_label_safe() {
        let p: Timestamp = "2027-03-28T01:00:00Z".parse().unwrap();
        assert_eq!(period_label(p), "20270328T010000Z");
        assert_eq!(period_rfc3339(p), "2027-03-28T01:00:00Z");
        assert_eq!(idempotency_key("ns/a", p).len(), 64);
        assert_ne!(idempotency_key("ns/a", p), idempotency_key("ns/b", p));
    }

    #[test]
    fn a_rerun_has_a_name_of_its_own() {
        let p: Timestamp = "2027-03-28T01:00:00Z".parse().unwrap();
        let first = rerun_job_name("hello", p, 8);
        assert_eq!(first, "hello-1806195600-r8");
        assert_eq!(first, rerun_job_name("hello", p, 8), "deterministic");
        assert_ne!(first, job_name("hello", p), "not the period's own Job");
        assert_ne!(first, rerun_job_name("hello", p, 9), "nor another re-run's");
        let manual = manual_period(p + jiff::SignedDuration::from_micros(8));
        assert_ne!(first, job_name("hello", manual), "nor a manual period's");
        // The longest name and token still fit, and stay distinct.
        let long = "a".repeat(253);
        let n = rerun_job_name(&long, p, u64::MAX);
        assert!(
            n.len() <= 63 && n.ends_with("-1806195600-r18446744073709551615"),
            "{n}"
        );
        assert!(!n.contains("--"), "{n}");
        assert_ne!(
            n,
            rerun_job_name(&format!("{}b", "a".repeat(252)), p, u64::MAX)
        );
    }

    #[test]
    fn manual_periods_never_fall_on_a_scheduled_instant() {
        let whole: Timestamp = "2027-03-28T01:00:00Z".parse().unwrap();
        // Claimed exactly on a whole second: moved off it by a microsecond.
        let m = manual_period(whole);
        assert!(is_manual(m) && !is_manual(whole));
        assert_eq!(m, whole + jiff::SignedDuration::from_micros(1));
        // Finer than the backstop's microseconds: truncated, so the stored claim is exact.
        let fine: Timestamp = "2027-03-28T01:00:00.123456789Z".parse().unwrap();
        let m = manual_period(fine);
        assert_eq!(period_rfc3339(m), "2027-03-28T01:00:00.123456Z");
        assert_eq!(period_label(m), "20270328T010000.123456Z");
        assert_eq!(job_name("hello", m), "hello-1806195600-123456");
        assert_ne!(job_name("hello", m), job_name("hello", whole));
        assert_ne!(
            idempotency_key("ns/a", m),
            idempotency_key("ns/a", whole),
            "a manual run is not the scheduled period's retry"
        );
        let long = "a".repeat(253);
        let n = job_name(&long, m);
        assert!(n.len() <= 63 && n.ends_with("-1806195600-123456"), "{n}");
    }
}
