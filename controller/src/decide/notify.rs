//! Notifications, the pure part: which events a status write records (its outbox,
//! `status.notifications.pending`), and what the deliveries' results change in status.
//!
//! An event is recorded in the same status write as the period it is about, by comparing the
//! history before and after the write ([`fill`]), whichever step wrote it (a decision, a claim's
//! confirm, a sweep, a rerun). So no event is lost to a crash or a failover between the two, and
//! none is recorded twice: a write that adds nothing to the history adds no event.

use std::collections::BTreeSet;

use jiff::Timestamp;
use sha2::{Digest, Sha256};

use crate::api::{
    HistoryEntry, Notifications, NotifyOn, NotifyTarget, NotifyTargetStatus, Outcome,
    PendingNotification, SingletonJobStatus,
};

/// Events kept pending at most; the oldest go first.
pub const MAX_PENDING: usize = 100;

/// An event's id: the same for every try and every replica, so a receiver drops a repeat by it.
/// A rerun's events differ from the first run's by the token.
pub fn event_id(job: &str, period: Timestamp, event: NotifyOn, token: Option<u64>) -> String {
    let mut h = Sha256::new();
    let token = token.map_or_else(|| "-".to_string(), |t| t.to_string());
    let text = format!(
        "{job}\n{}\n{}\n{token}",
        crate::naming::period_rfc3339(period),
        event.name()
    );
    h.update(text.as_bytes());
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    hex[..32].to_string()
}

/// The event a history entry's outcome is, if any (a Running entry is a start).
fn outcome_event(outcome: Outcome) -> NotifyOn {
    match outcome {
        Outcome::Running => NotifyOn::Started,
        Outcome::Succeeded => NotifyOn::Succeeded,
        Outcome::Failed => NotifyOn::Failed,
        Outcome::Skipped => NotifyOn::Skipped,
        Outcome::Missed => NotifyOn::Missed,
        Outcome::Replaced => NotifyOn::Replaced,
        Outcome::Deduplicated => NotifyOn::Deduplicated,
    }
}

/// Whether an outcome is a run's end (a Job ran), rather than a period decided without one.
fn ran(outcome: Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Succeeded | Outcome::Failed | Outcome::Replaced
    )
}

/// A run by its period and token (a period decided without a token has none).
type RunKey = (Timestamp, Option<u64>);

fn key(e: &HistoryEntry) -> RunKey {
    (e.period.0, e.token)
}

/// The runs a status knows to be late: active ones marked so, and late history entries.
fn late_runs(status: &SingletonJobStatus) -> BTreeSet<RunKey> {
    let active = status
        .active
        .iter()
        .filter(|r| r.late)
        .map(|r| (r.period.0, Some(r.token)));
    let recorded = status.history.iter().filter(|h| h.late).map(key);
    active.chain(recorded).collect()
}

/// What happened between `old` and `new`, oldest first: each history entry `new` adds (a start
/// for a Running one, else its outcome, after the run's start when `old` never saw it running),
/// and each run `new` knows late that `old` did not.
pub fn events(
    old: Option<&SingletonJobStatus>,
    new: &SingletonJobStatus,
) -> Vec<(NotifyOn, HistoryEntry)> {
    let empty = SingletonJobStatus::default();
    let old = old.unwrap_or(&empty);
    let known: BTreeSet<(RunKey, Outcome)> =
        old.history.iter().map(|h| (key(h), h.outcome)).collect();
    let runs: BTreeSet<RunKey> = old
        .history
        .iter()
        .filter(|h| h.outcome == Outcome::Running || ran(h.outcome))
        .map(key)
        .collect();
    let mut found = Vec::new();
    // History is newest first.
    for e in new.history.iter().rev() {
        if known.contains(&(key(e), e.outcome)) {
            continue;
        }
        // A run that started and ended between two writes started all the same.
        if ran(e.outcome) && !runs.contains(&key(e)) {
            let mut started = e.clone();
            started.outcome = Outcome::Running;
            started.finish_time = None;
            found.push((NotifyOn::Started, started));
        }
        found.push((outcome_event(e.outcome), e.clone()));
    }
    let was_late = late_runs(old);
    for late in late_runs(new).difference(&was_late) {
        // The entry that says so: the finished run's, else the Running one's.
        let entry = new
            .history
            .iter()
            .find(|h| key(h) == *late && h.outcome != Outcome::Running)
            .or_else(|| new.history.iter().find(|h| key(h) == *late));
        if let Some(e) = entry {
            let mut e = e.clone();
            e.late = true;
            found.push((NotifyOn::Late, e));
        }
    }
    found
}

/// Adds to `new`'s outbox the events of this write ([`events`]) that some target asks for, with
/// the Job's pod count from `attempts` (by Job name). `job` is the SingletonJob's `namespace/name`.
pub fn fill(
    targets: &[NotifyTarget],
    job: &str,
    old: Option<&SingletonJobStatus>,
    new: &mut SingletonJobStatus,
    attempts: impl Fn(&str) -> Option<i32>,
    now: Timestamp,
) {
    if targets.is_empty() {
        return;
    }
    // Whole seconds, as the API server keeps a Time: the event's body is the same whether it is
    // sent from this write or from a copy read back.
    let now = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let mut added = Vec::new();
    for (event, entry) in events(old, new) {
        let to: Vec<String> = targets
            .iter()
            .filter(|t| t.wanted().contains(&event))
            .map(|t| t.name.clone())
            .collect();
        if to.is_empty() {
            continue;
        }
        added.push(PendingNotification {
            id: event_id(job, entry.period.0, event, entry.token),
            event,
            recorded: now.into(),
            targets: to,
            attempts: entry.job_name.as_deref().and_then(&attempts),
            entry,
            unknown: Default::default(),
        });
    }
    if added.is_empty() {
        return;
    }
    let n = new.notifications.get_or_insert_with(Default::default);
    for p in added {
        if !n.pending.iter().any(|q| q.id == p.id) {
            n.pending.push(p);
        }
    }
    let over = n.pending.len().saturating_sub(MAX_PENDING);
    if over > 0 {
        n.pending.drain(..over);
        n.dropped += over as u64;
    }
}

/// What became of one try, or of a delivery.
#[derive(Clone, Debug, PartialEq)]
pub enum Fate {
    /// The receiver accepted it (2xx).
    Delivered,
    /// A try failed; the delivery goes on.
    Failing(String),
    /// Tried for `giveUpAfterSeconds` in vain: dropped.
    GaveUp(String),
}

/// A delivery's news for status.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    pub id: String,
    pub target: String,
    pub at: Timestamp,
    pub fate: Fate,
}

/// Writes `deliveries` into `status`: a delivered or given-up event leaves the target's pending
/// list (the event leaves the outbox with its last target), the target's counts and last error
/// move. Targets gone from `spec.notify` are forgotten. Returns the given-up ones that were still
/// pending (for their Events and metric), once each.
pub fn settle(
    targets: &[NotifyTarget],
    status: &mut SingletonJobStatus,
    deliveries: &[Delivery],
) -> Vec<(PendingNotification, Delivery)> {
    let Some(n) = status.notifications.as_mut() else {
        return Vec::new();
    };
    let named = |name: &str| targets.iter().any(|t| t.name == name);
    let mut gave_up = Vec::new();
    for d in deliveries {
        let state = target_state(n, &d.target);
        match &d.fate {
            Fate::Failing(e) | Fate::GaveUp(e) => {
                state.last_failure = Some(d.at.into());
                state.last_error = Some(e.clone());
            }
            Fate::Delivered => {}
        }
        if d.fate == Fate::Delivered || matches!(d.fate, Fate::GaveUp(_)) {
            let Some(p) = n.pending.iter_mut().find(|p| p.id == d.id) else {
                continue;
            };
            let before = p.targets.len();
            p.targets.retain(|t| *t != d.target);
            if p.targets.len() == before {
                continue;
            }
            let p = p.clone();
            let state = target_state(n, &d.target);
            if d.fate == Fate::Delivered {
                state.delivered += 1;
                state.last_delivered = Some(d.at.into());
            } else {
                state.failed += 1;
                gave_up.push((p, d.clone()));
            }
        }
    }
    for p in &mut n.pending {
        p.targets.retain(|t| named(t));
    }
    n.pending.retain(|p| !p.targets.is_empty());
    n.targets.retain(|t| named(&t.name));
    if n.is_empty() {
        status.notifications = None;
    }
    gave_up
}

fn target_state<'a>(n: &'a mut Notifications, name: &str) -> &'a mut NotifyTargetStatus {
    let i = match n.targets.iter().position(|t| t.name == name) {
        Some(i) => i,
        None => {
            n.targets.push(NotifyTargetStatus {
                name: name.to_string(),
                ..Default::default()
            });
            n.targets.len() - 1
        }
    };
    &mut n.targets[i]
}

#[cfg(test)]
mod tests;
