//! Operations users ask for with `kubectl singleton trigger|backfill|break-lock|rerun`.
//!
//! The plugin only asks: it writes a request into an annotation of the SingletonJob (so who may
//! ask is decided by RBAC on `patch singletonjobs`), and the controller, the only writer of runs
//! and tokens, carries it out through the same claim-and-fence path as scheduled runs
//! ([`crate::run`]). `status.operations` records the id of the latest request of each kind it
//! handled; a request with that id is never acted on again, so a retried or re-applied annotation
//! starts nothing twice.
//!
//! Everything here is pure: parsing and checking requests, and where a backfill stands; what a
//! rerun may re-run is in [`super::rerun`].

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::api::{
    ANNOTATION_BACKFILL, ANNOTATION_BREAK_LOCK, ANNOTATION_REPAIR, ANNOTATION_REPAIR_DRY_RUN,
    ANNOTATION_RERUN, ANNOTATION_TRIGGER, OperationPhase, OperationStatus, Operations, RepairOnly,
    RepairOrder, RunOrigin, RunRef, SingletonJob,
};
use crate::schedule::Schedule;
use crate::text;

/// At most this many periods per backfill: a typo in a year should not queue a million runs.
pub const BACKFILL_MAX_PERIODS: u64 = 10_000;
const MAX_ID: usize = 128;
const MAX_BY: usize = 256;
const MAX_REASON: usize = 1024;

/// The kinds of operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperationKind {
    Trigger,
    Backfill,
    BreakLock,
    Rerun,
    /// A range's periods re-run by what their records say ([`super::repair`]).
    Repair,
    /// What a repair would re-run now, nothing run.
    RepairDryRun,
}

impl OperationKind {
    pub const ALL: [OperationKind; 6] = [
        OperationKind::BreakLock,
        OperationKind::Trigger,
        OperationKind::Rerun,
        OperationKind::RepairDryRun,
        OperationKind::Repair,
        OperationKind::Backfill,
    ];

    pub fn annotation(self) -> &'static str {
        match self {
            OperationKind::Trigger => ANNOTATION_TRIGGER,
            OperationKind::Backfill => ANNOTATION_BACKFILL,
            OperationKind::BreakLock => ANNOTATION_BREAK_LOCK,
            OperationKind::Rerun => ANNOTATION_RERUN,
            OperationKind::Repair => ANNOTATION_REPAIR,
            OperationKind::RepairDryRun => ANNOTATION_REPAIR_DRY_RUN,
        }
    }

    /// The command, for messages.
    pub fn command(self) -> &'static str {
        match self {
            OperationKind::Trigger => "trigger",
            OperationKind::Backfill => "backfill",
            OperationKind::BreakLock => "break-lock",
            OperationKind::Rerun => "rerun",
            OperationKind::Repair => "rerun --from --to",
            OperationKind::RepairDryRun => "rerun --from --to --dry-run",
        }
    }

    pub fn slot(self, ops: &Operations) -> Option<&OperationStatus> {
        match self {
            OperationKind::Trigger => ops.trigger.as_ref(),
            OperationKind::Backfill => ops.backfill.as_ref(),
            OperationKind::BreakLock => ops.break_lock.as_ref(),
            OperationKind::Rerun => ops.rerun.as_ref(),
            OperationKind::Repair => ops.repair.as_ref(),
            OperationKind::RepairDryRun => ops.repair_dry_run.as_ref(),
        }
    }

    pub fn slot_mut(self, ops: &mut Operations) -> &mut Option<OperationStatus> {
        match self {
            OperationKind::Trigger => &mut ops.trigger,
            OperationKind::Backfill => &mut ops.backfill,
            OperationKind::BreakLock => &mut ops.break_lock,
            OperationKind::Rerun => &mut ops.rerun,
            OperationKind::Repair => &mut ops.repair,
            OperationKind::RepairDryRun => &mut ops.repair_dry_run,
        }
    }
}

impl From<RunOrigin> for OperationKind {
    fn from(origin: RunOrigin) -> OperationKind {
        match origin {
            RunOrigin::Trigger => OperationKind::Trigger,
            RunOrigin::Backfill => OperationKind::Backfill,
            RunOrigin::Rerun => OperationKind::Rerun,
        }
    }
}

/// A request as written into its annotation (JSON).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Who asks. Serialized first: the chart's admission policy (operationRequester) requires a
    /// request to begin with `{"by":"<the writer's user name>",`, which makes `by` the API
    /// server's word rather than the client's (a second `by` key is a duplicate-field error).
    /// Without that policy it is only what the client reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Unique per request; `kubectl singleton` uses the time of asking with microseconds.
    pub id: String,
    /// Why (break-lock: required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Backfill: first instant of the range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Timestamp>,
    /// Backfill: last instant of the range (inclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Timestamp>,
    /// Rerun: the period to run again (RFC 3339).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "instant"
    )]
    pub period: Option<Timestamp>,
    /// Rerun: fence and delete the period's run if it is still active, instead of refusing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replace: bool,
    /// Backfill: the range may hold periods before the SingletonJob was created. The asker says
    /// they never ran (an earlier SingletonJob of the same name, or another scheduler, may have
    /// run them without a claim row): only then are they run, each still once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub before_creation: bool,
    /// Repair: which periods of the range to re-run (default Failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub only: Option<RepairOnly>,
    /// Repair: the order to walk the range in (default Oldest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<RepairOrder>,
    /// Repair: at most this many of its runs active at once (default 1; above 1 needs
    /// concurrencyPolicy Allow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<u32>,
}

/// An RFC 3339 instant, with an error that says so (rather than serde's "invalid type").
fn instant<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
    let Some(text) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    text.parse().map(Some).map_err(|e| {
        serde::de::Error::custom(format!(
            "period {text:?} is not an RFC 3339 instant such as 2026-11-01T00:00:00Z ({e})"
        ))
    })
}

/// An annotation that is not a valid request: rejected under `id` (the request's own id when it
/// has one, else derived from the text, so the same bad text is rejected once).
#[derive(Clone, Debug, PartialEq)]
pub struct Invalid {
    pub id: String,
    pub message: String,
}

/// The request of `kind` on `sj` that has not been handled yet, if any.
pub fn pending(sj: &SingletonJob, kind: OperationKind) -> Option<Result<Request, Invalid>> {
    let raw = sj.metadata.annotations.as_ref()?.get(kind.annotation())?;
    // Accepted but still waiting (Pending) is not handled yet: it is looked at again.
    let handled = sj
        .status
        .as_ref()
        .and_then(|s| kind.slot(&s.operations))
        .filter(|o| o.phase != OperationPhase::Pending)
        .map(|o| o.id.as_str());
    let parsed = parse(kind, raw);
    let id = match &parsed {
        Ok(r) => r.id.as_str(),
        Err(e) => e.id.as_str(),
    };
    (handled != Some(id)).then_some(parsed)
}

/// Parses and checks one annotation's text.
pub fn parse(kind: OperationKind, raw: &str) -> Result<Request, Invalid> {
    let invalid_id = || format!("invalid-{}", crate::naming::short_hash(raw, 16));
    // serde's message may quote the client's text: printed only once made printable.
    let mut req: Request = serde_json::from_str(raw).map_err(|e| Invalid {
        id: invalid_id(),
        message: format!(
            "annotation {} is not a valid request ({}); expected JSON such as {}",
            kind.annotation(),
            text::printable(&e.to_string()),
            example(kind)
        ),
    })?;
    // Who and why are printed in status, Events and the log: never with control characters.
    req.by = req.by.as_deref().map(text::printable);
    req.reason = req.reason.as_deref().map(text::printable);
    let bad = |message: String| {
        let id = if req.id.is_empty() || req.id.len() > MAX_ID {
            invalid_id()
        } else {
            req.id.clone()
        };
        Err(Invalid { id, message })
    };
    if req.id.trim().is_empty() || req.id.len() > MAX_ID {
        return bad(format!(
            "annotation {}: id must be 1 to {MAX_ID} characters",
            kind.annotation()
        ));
    }
    if !text::is_printable(&req.id) {
        return Err(Invalid {
            id: invalid_id(),
            message: format!(
                "annotation {}: id must not contain control characters",
                kind.annotation()
            ),
        });
    }
    if req.by.as_ref().is_some_and(|b| b.len() > MAX_BY) {
        return bad(format!("by must be at most {MAX_BY} characters"));
    }
    if req.reason.as_ref().is_some_and(|r| r.len() > MAX_REASON) {
        return bad(format!("reason must be at most {MAX_REASON} characters"));
    }
    if let Err(message) = check_fields(kind, &req) {
        return bad(message);
    }
    Ok(req)
}

/// The fields each kind takes and needs, and their values' bounds.
fn check_fields(kind: OperationKind, req: &Request) -> Result<(), String> {
    match kind {
        OperationKind::BreakLock if req.reason.as_deref().is_none_or(|r| r.trim().is_empty()) => {
            return Err("break-lock needs a reason: say why the lock is broken".into());
        }
        OperationKind::Backfill | OperationKind::Repair | OperationKind::RepairDryRun => {
            match (req.from, req.to) {
                (Some(from), Some(to)) if from <= to => {}
                (Some(from), Some(to)) => {
                    return Err(format!(
                        "{} range is empty: from {from} is after to {to}",
                        kind.command()
                    ));
                }
                _ => {
                    return Err(format!(
                        "{} needs both from and to (RFC 3339 instants)",
                        kind.command()
                    ));
                }
            }
        }
        OperationKind::Trigger | OperationKind::BreakLock | OperationKind::Rerun => {
            if req.from.is_some() || req.to.is_some() {
                return Err(format!("{} takes no from/to", kind.command()));
            }
        }
    }
    let repair = matches!(kind, OperationKind::Repair | OperationKind::RepairDryRun);
    if !repair && (req.only.is_some() || req.order.is_some() || req.parallel.is_some()) {
        return Err(format!(
            "{} takes no only/order/parallel (those are rerun --from --to's)",
            kind.command()
        ));
    }
    if let Some(n) = req.parallel
        && !(1..=super::repair::MAX_PARALLEL).contains(&n)
    {
        return Err(format!(
            "parallel must be 1 to {}, not {n}",
            super::repair::MAX_PARALLEL
        ));
    }
    match kind {
        OperationKind::Rerun if req.period.is_none() => {
            return Err(
                "rerun needs the period to run again (an RFC 3339 instant of the schedule)".into(),
            );
        }
        OperationKind::Rerun => {}
        _ if req.period.is_some() || req.replace => {
            return Err(format!(
                "{} takes no period/replace (those are rerun's)",
                kind.command()
            ));
        }
        _ => {}
    }
    Ok(())
}

fn example(kind: OperationKind) -> &'static str {
    match kind {
        OperationKind::Trigger => r#"{"by":"alice","id":"2026-12-02T10:00:00.123456Z"}"#,
        OperationKind::Backfill => {
            r#"{"by":"alice","id":"2026-12-02T10:00:00.123456Z","from":"2026-11-01T00:00:00Z","to":"2026-11-30T00:00:00Z"}"#
        }
        OperationKind::BreakLock => {
            r#"{"by":"alice","id":"2026-12-02T10:00:00.123456Z","reason":"run stuck on a dead node"}"#
        }
        OperationKind::Rerun => {
            r#"{"by":"alice","id":"2026-12-02T10:00:00.123456Z","period":"2026-12-01T00:00:00Z","replace":false}"#
        }
        OperationKind::Repair | OperationKind::RepairDryRun => {
            r#"{"by":"alice","id":"2026-12-02T10:00:00.123456Z","from":"2026-09-01T00:00:00Z","to":"2026-09-30T00:00:00Z","only":"Failed","order":"Oldest","parallel":1}"#
        }
    }
}

/// A fresh record for an accepted request.
pub fn accepted(req: &Request, now: Timestamp) -> OperationStatus {
    OperationStatus {
        id: req.id.clone(),
        phase: OperationPhase::Pending,
        requested_by: req.by.clone(),
        reason: req.reason.clone(),
        from: req.from.map(Into::into),
        to: req.to.map(Into::into),
        period: req.period.map(Into::into),
        only: req.only,
        order: req.order,
        parallel: req.parallel,
        updated: Some(now.into()),
        ..OperationStatus::default()
    }
}

/// The record of a rejected request.
pub fn rejected(
    id: &str,
    req: Option<&Request>,
    message: String,
    now: Timestamp,
) -> OperationStatus {
    OperationStatus {
        id: id.to_string(),
        phase: OperationPhase::Rejected,
        message,
        updated: Some(now.into()),
        ..req.map(|r| accepted(r, now)).unwrap_or_default()
    }
}

/// Sets `slot` to `new`, keeping the old `updated` time when nothing else changed (so waiting
/// does not rewrite the status on every reconcile). Returns whether anything changed.
pub fn set(slot: &mut Option<OperationStatus>, mut new: OperationStatus) -> bool {
    if let Some(old) = slot.as_ref() {
        let same = OperationStatus {
            updated: old.updated.clone(),
            ..new.clone()
        };
        if *old == same {
            return false;
        }
    }
    if new.updated.is_none() {
        new.updated = Some(Timestamp::now().into());
    }
    *slot = Some(new);
    true
}

/// Whether an operation waits or goes on (then the controller looks again soon).
pub fn in_progress(ops: &Operations) -> bool {
    [
        &ops.trigger,
        &ops.backfill,
        &ops.break_lock,
        &ops.rerun,
        &ops.repair,
        &ops.repair_dry_run,
    ]
    .into_iter()
    .flatten()
    .any(|o| matches!(o.phase, OperationPhase::Pending | OperationPhase::Running))
}

/// The range a backfill covers: the schedule's periods in `[from, to]` that are already decided
/// (at or before `decided_through`; later ones are the schedule's to run). Returns the first and
/// last period and how many, or why there is nothing to do.
pub fn backfill_range(
    schedule: &Schedule,
    from: Timestamp,
    to: Timestamp,
    decided_through: Timestamp,
) -> Result<(Timestamp, Timestamp, u64), String> {
    let until = to.min(decided_through);
    let before_from = from - SignedDuration::from_nanos(1);
    let Some(first) = schedule.next_after(before_from).filter(|f| *f <= until) else {
        return Err(if to > decided_through {
            format!(
                "no period of the schedule between {from} and {until} (periods after {decided_through} are not decided yet: the schedule runs them)"
            )
        } else {
            format!("no period of the schedule between {from} and {to}")
        });
    };
    let last = schedule.latest_at_or_before(until).unwrap_or(first);
    let count = schedule.count_between(before_from, last, BACKFILL_MAX_PERIODS + 1);
    if count > BACKFILL_MAX_PERIODS {
        return Err(format!(
            "the range holds more than {BACKFILL_MAX_PERIODS} periods: split it into smaller ranges"
        ));
    }
    Ok((first, last, count))
}

/// Refuses a backfill `range` (first, last, count) holding a period before the backstop recorded
/// every run of this SingletonJob (`recorded.since`): for those the claims table may not know
/// every period that ran (the backstop was added or moved later, or a run went without its
/// claim), so a backfill could run one twice. That includes every period before the
/// SingletonJob was created (F12): an earlier SingletonJob of the same name may have run them
/// without claim rows (under Efficiency, or before it had a backstop), and nothing can tell.
pub fn check_claims_recorded(
    range: (Timestamp, Timestamp, u64),
    created: Option<Timestamp>,
    recorded: Option<&crate::api::ClaimsRecorded>,
    before_creation: bool,
) -> Result<(Timestamp, Timestamp, u64), String> {
    let Some(since) = recorded.map(|r| r.since.0) else {
        return Err(
            "the backstop has not recorded this SingletonJob's runs yet (status.claimsRecorded is unset): wait for BackstopReady"
                .into(),
        );
    };
    let (first, last, _) = range;
    let before = created.filter(|c| first < *c && *c <= since);
    if let Some(created) = before.filter(|_| !before_creation) {
        return Err(format!(
            "the range starts before this SingletonJob was created ({created}): an earlier SingletonJob of the same name (or another scheduler) may have run those periods without a claim row, so a backfill could run them twice; backfill from {since} on, or, if you know they never ran, ask again with --before-creation"
        ));
    }
    // Asked for before the creation: the periods of the SingletonJob's own life are still
    // judged by `since`.
    let lived_before_since = created.is_none_or(|c| last >= c) && since > created.unwrap_or(since);
    if before.is_some() && lived_before_since {
        return Err(format!(
            "the backstop has recorded every run of this SingletonJob only since {since} (status.claimsRecorded): periods of its life before it may have run without a claim row, so a backfill could run them twice; backfill from {since} on"
        ));
    }
    if before.is_none() && first < since {
        return Err(format!(
            "the backstop has recorded every run of this SingletonJob only since {since} (status.claimsRecorded): periods before it may have run without a claim row, so a backfill could run them twice; backfill from {since} on"
        ));
    }
    Ok(range)
}

/// The next period of a backfill still to consider: the first period at or after `next` and at
/// or before `to`.
pub fn backfill_next(schedule: &Schedule, op: &OperationStatus) -> Option<Timestamp> {
    let next = op.next.as_ref().or(op.from.as_ref())?.0;
    let to = op.to.as_ref()?.0;
    schedule
        .next_after(next - SignedDuration::from_nanos(1))
        .filter(|p| *p <= to)
}

/// The backfill cursor just past `period`. Cron's finest unit is the second, and the cursor is
/// stored as a `Time` (whole seconds), so one second past is the next instant that can be due.
pub fn after(period: Timestamp) -> Timestamp {
    period + SignedDuration::from_secs(1)
}

/// Records in `ops` that `claim` was written for an operation (in the claim's own status write,
/// so "handled" and "claimed" are one atomic step).
pub fn on_claim(ops: &mut Operations, kind: OperationKind, claim: &RunRef) {
    let Some(op) = kind.slot_mut(ops).as_mut() else {
        return;
    };
    op.started += 1;
    op.job_name = Some(claim.job_name.clone());
    op.token = Some(claim.token);
    op.updated = claim.claimed_at.clone();
    match kind {
        OperationKind::Rerun => {
            op.phase = OperationPhase::Done;
            op.message = rerun_message(claim);
        }
        // The walk moved its cursor past the period already (super::repair).
        OperationKind::Repair => {
            op.phase = OperationPhase::Running;
            op.message = super::repair::progress(op, claim);
        }
        OperationKind::Backfill => {
            op.phase = OperationPhase::Running;
            op.next = Some(after(claim.period.0).into());
            op.message = format!(
                "started {} run(s), {} period(s) had run before; latest: Job {} (token {})",
                op.started, op.already_run, claim.job_name, claim.token
            );
        }
        OperationKind::Trigger | OperationKind::BreakLock | OperationKind::RepairDryRun => {
            op.phase = OperationPhase::Done;
            op.message = format!(
                "started Job {} with fencing token {}",
                claim.job_name, claim.token
            );
        }
    }
}

/// What a rerun's record says once its claim is written: the Job, the new token, and what it
/// fences out.
fn rerun_message(claim: &RunRef) -> String {
    let mut message = format!(
        "re-ran period {}: started Job {} with fencing token {}",
        crate::naming::period_rfc3339(claim.period.0),
        claim.job_name,
        claim.token
    );
    if let Some(old) = claim.supersedes {
        message.push_str(&format!(
            "; the period's backstop claim moved from token {old} to it, so {old} is refused from now on"
        ));
    }
    let replaced: Vec<String> = claim
        .replaces
        .iter()
        .map(|r| format!("{} (token {})", r.job_name, r.token))
        .collect();
    if !replaced.is_empty() {
        message.push_str(&format!(
            "; replaced the active run {} (fenced, then deleted)",
            replaced.join(", ")
        ));
    }
    message
}

/// A manual claim re-issued with a higher `token` (the backstop's fence was above the first one):
/// the operation's record names the token the run really carries.
pub fn on_reclaim(ops: &mut Operations, claim: &RunRef, token: u64) {
    let slot = match claim.origin {
        Some(RunOrigin::Trigger) => &mut ops.trigger,
        Some(RunOrigin::Backfill) => &mut ops.backfill,
        Some(RunOrigin::Rerun) => &mut ops.rerun,
        None => return,
    };
    if let Some(op) = slot
        .as_mut()
        .filter(|o| o.job_name.as_deref() == Some(claim.job_name.as_str()))
    {
        op.token = Some(token);
        op.message = op
            .message
            .replace(
                &format!("token {})", claim.token),
                &format!("token {token})"),
            )
            .replace(&format!("token {}", claim.token), &format!("token {token}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SingletonJobSpec;
    use crate::schedule::DstPolicy;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn sj(annotations: &[(&str, &str)], ops: Operations) -> SingletonJob {
        let mut sj = SingletonJob::new(
            "a",
            serde_yaml::from_str::<SingletonJobSpec>(
                "schedule: '0 * * * *'\njobTemplate: {spec: {template: {spec: {containers: []}}}}",
            )
            .unwrap(),
        );
        sj.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        sj.status = Some(crate::api::SingletonJobStatus {
            operations: Box::new(ops),
            ..Default::default()
        });
        sj
    }

    #[test]
    fn a_request_is_pending_until_its_id_is_recorded() {
        let raw = r#"{"id":"r1","by":"alice"}"#;
        let fresh = sj(&[(ANNOTATION_TRIGGER, raw)], Operations::default());
        let req = pending(&fresh, OperationKind::Trigger).unwrap().unwrap();
        assert_eq!(req.id, "r1");
        assert_eq!(req.by.as_deref(), Some("alice"));
        assert!(
            pending(&fresh, OperationKind::Backfill).is_none(),
            "no annotation"
        );

        // Accepted but waiting (for a run to finish, the clock, the backstop): still pending.
        let waiting = Operations {
            trigger: Some(accepted(&req, ts("2026-01-01T00:00:00Z"))),
            ..Default::default()
        };
        assert!(
            pending(
                &sj(&[(ANNOTATION_TRIGGER, raw)], waiting),
                OperationKind::Trigger
            )
            .is_some()
        );
        let mut done = accepted(&req, ts("2026-01-01T00:00:00Z"));
        done.phase = OperationPhase::Done;
        let handled = Operations {
            trigger: Some(done),
            ..Default::default()
        };
        assert!(
            pending(
                &sj(&[(ANNOTATION_TRIGGER, raw)], handled.clone()),
                OperationKind::Trigger
            )
            .is_none()
        );
        // A new id is a new request.
        let again = sj(&[(ANNOTATION_TRIGGER, r#"{"id":"r2"}"#)], handled);
        assert_eq!(
            pending(&again, OperationKind::Trigger).unwrap().unwrap().id,
            "r2"
        );
    }

    #[test]
    fn by_is_written_first_so_the_admission_policy_can_check_it() {
        // charts/.../admission.yaml (operationRequester) matches this prefix against the
        // writer's user name; the plugin writes requests with serde_json.
        let mut req = Request {
            id: "r1".into(),
            by: Some("system:serviceaccount:team-a:ci".into()),
            reason: Some("why".into()),
            ..Request::default()
        };
        let text = serde_json::to_string(&req).unwrap();
        assert!(
            text.starts_with(r#"{"by":"system:serviceaccount:team-a:ci","#),
            "{text}"
        );
        // A user name with a quote or backslash is escaped, as the policy's prefix escapes it.
        req.by = Some(r#"o"neil\x"#.into());
        let text = serde_json::to_string(&req).unwrap();
        assert!(text.starts_with(r#"{"by":"o\"neil\\x","#), "{text}");
        // The old order (id first) stays readable.
        let old = parse(OperationKind::Trigger, r#"{"id":"r1","by":"alice"}"#).unwrap();
        assert_eq!(old.by.as_deref(), Some("alice"));
    }

    #[test]
    fn a_second_by_after_the_checked_prefix_is_refused() {
        // The policy checks only the prefix: whatever follows must not name someone else.
        for raw in [
            r#"{"by":"alice","id":"r1","by":"bob"}"#,
            r#"{"by":"alice","id":"r1","\u0062y":"bob"}"#,
            r#"{"by":"alice","id":"r1","\u0062\u0079":"bob"}"#,
        ] {
            let e = parse(OperationKind::Trigger, raw).unwrap_err();
            assert!(
                e.message.contains("duplicate field `by`"),
                "{raw}: {}",
                e.message
            );
        }
    }

    #[test]
    fn control_characters_in_who_and_why_are_stripped() {
        let raw = "{\"by\":\"mallory\\u001b[2K\\ralice\",\"id\":\"r1\",\"reason\":\"stuck\\nLockBroken by \\u202Eeve\"}";
        let req = parse(OperationKind::BreakLock, raw).unwrap();
        assert_eq!(req.by.as_deref(), Some("mallory[2K alice"));
        assert_eq!(req.reason.as_deref(), Some("stuck LockBroken by eve"));
        let op = accepted(&req, ts("2026-01-01T00:00:00Z"));
        assert!(op.requested_by.unwrap().chars().all(|c| !c.is_control()));
        // An id with them is refused (it is the request's identity: not rewritten), under an
        // id of its own; serde's messages quoting the text are stripped too.
        let e = parse(OperationKind::Trigger, "{\"id\":\"r\\u0007\"}").unwrap_err();
        assert!(e.message.contains("control characters"), "{}", e.message);
        assert!(e.id.starts_with("invalid-"), "{}", e.id);
        let e = parse(OperationKind::Trigger, "{\"id\":\"r\",\"\u{202E}x\\n\":1}").unwrap_err();
        assert!(text::is_printable(&e.message), "{:?}", e.message);
    }

    #[test]
    fn bad_requests_are_rejected_once_with_a_clear_message() {
        for (kind, raw, says) in [
            (OperationKind::Trigger, "not json", "not a valid request"),
            (OperationKind::Trigger, r#"{"id":""}"#, "id must be"),
            (
                OperationKind::Trigger,
                r#"{"id":"x","colour":"red"}"#,
                "unknown field",
            ),
            (
                OperationKind::Trigger,
                r#"{"id":"x","from":"2026-01-01T00:00:00Z"}"#,
                "takes no from/to",
            ),
            (OperationKind::BreakLock, r#"{"id":"x"}"#, "needs a reason"),
            (
                OperationKind::BreakLock,
                r#"{"id":"x","reason":"  "}"#,
                "needs a reason",
            ),
            (
                OperationKind::Backfill,
                r#"{"id":"x","from":"2026-01-01T00:00:00Z"}"#,
                "both from and to",
            ),
            (
                OperationKind::Backfill,
                r#"{"id":"x","from":"2026-02-01T00:00:00Z","to":"2026-01-01T00:00:00Z"}"#,
                "range is empty",
            ),
            (
                OperationKind::Backfill,
                r#"{"id":"x","from":"yesterday","to":"today"}"#,
                "not a valid request",
            ),
            (
                OperationKind::Rerun,
                r#"{"id":"x"}"#,
                "rerun needs the period",
            ),
            (
                OperationKind::Rerun,
                r#"{"id":"x","period":"yesterday"}"#,
                "period \"yesterday\" is not an RFC 3339 instant",
            ),
            (
                OperationKind::Rerun,
                r#"{"id":"x","period":7}"#,
                "not a valid request",
            ),
            (
                OperationKind::Rerun,
                r#"{"id":"x","period":"2026-01-01T00:00:00Z","replace":"yes"}"#,
                "not a valid request",
            ),
            (
                OperationKind::Rerun,
                r#"{"id":"x","period":"2026-01-01T00:00:00Z","from":"2026-01-01T00:00:00Z"}"#,
                "takes no from/to",
            ),
            (
                OperationKind::Trigger,
                r#"{"id":"x","period":"2026-01-01T00:00:00Z"}"#,
                "takes no period/replace",
            ),
            (
                OperationKind::Backfill,
                r#"{"id":"x","from":"2026-01-01T00:00:00Z","to":"2026-01-02T00:00:00Z","replace":true}"#,
                "takes no period/replace",
            ),
            (
                OperationKind::Rerun,
                "{\"id\":\"x\",",
                "singleton.dev/rerun is not a valid request",
            ),
            (
                OperationKind::Repair,
                r#"{"id":"x","from":"2026-01-02T00:00:00Z","to":"2026-01-01T00:00:00Z"}"#,
                "rerun --from --to range is empty",
            ),
            (
                OperationKind::RepairDryRun,
                r#"{"id":"x","from":"2026-01-01T00:00:00Z"}"#,
                "needs both from and to",
            ),
            (
                OperationKind::Repair,
                r#"{"id":"x","from":"2026-01-01T00:00:00Z","to":"2026-01-02T00:00:00Z","only":"Broken"}"#,
                "not a valid request",
            ),
            (
                OperationKind::Repair,
                r#"{"id":"x","from":"2026-01-01T00:00:00Z","to":"2026-01-02T00:00:00Z","parallel":0}"#,
                "parallel must be 1 to 100, not 0",
            ),
            (
                OperationKind::Repair,
                r#"{"id":"x","from":"2026-01-01T00:00:00Z","to":"2026-01-02T00:00:00Z","period":"2026-01-01T00:00:00Z"}"#,
                "takes no period/replace",
            ),
            (
                OperationKind::Backfill,
                r#"{"id":"x","from":"2026-01-01T00:00:00Z","to":"2026-01-02T00:00:00Z","only":"All"}"#,
                "takes no only/order/parallel",
            ),
        ] {
            let e = parse(kind, raw).expect_err(raw);
            assert!(e.message.contains(says), "{raw}: {}", e.message);
            assert!(!e.id.is_empty());
            // The same text gives the same id: rejected once, not on every reconcile.
            assert_eq!(parse(kind, raw).unwrap_err().id, e.id);
            let rejected_once = Operations {
                unknown: Default::default(),
                trigger: Some(rejected(
                    &e.id,
                    None,
                    e.message.clone(),
                    ts("2026-01-01T00:00:00Z"),
                )),
                backfill: Some(rejected(
                    &e.id,
                    None,
                    e.message.clone(),
                    ts("2026-01-01T00:00:00Z"),
                )),
                break_lock: Some(rejected(
                    &e.id,
                    None,
                    e.message.clone(),
                    ts("2026-01-01T00:00:00Z"),
                )),
                rerun: Some(rejected(
                    &e.id,
                    None,
                    e.message.clone(),
                    ts("2026-01-01T00:00:00Z"),
                )),
                repair: Some(rejected(
                    &e.id,
                    None,
                    e.message.clone(),
                    ts("2026-01-01T00:00:00Z"),
                )),
                repair_dry_run: Some(rejected(&e.id, None, e.message, ts("2026-01-01T00:00:00Z"))),
            };
            assert!(pending(&sj(&[(kind.annotation(), raw)], rejected_once), kind).is_none());
        }
        let long = format!(r#"{{"id":"{}"}}"#, "x".repeat(200));
        assert!(
            parse(OperationKind::Trigger, &long)
                .unwrap_err()
                .id
                .starts_with("invalid-")
        );
    }

    #[test]
    fn a_rerun_request_round_trips_and_its_record_says_what_it_fenced() {
        let raw = r#"{"by":"alice","id":"r1","period":"2026-01-01T09:00:00Z","replace":true}"#;
        let req = parse(OperationKind::Rerun, raw).unwrap();
        assert_eq!(req.period, Some(ts("2026-01-01T09:00:00Z")));
        assert!(req.replace);
        assert_eq!(serde_json::to_string(&req).unwrap(), raw);
        // `replace` is left out when false, as the plugin writes it.
        let plain = Request {
            replace: false,
            ..req.clone()
        };
        assert!(!serde_json::to_string(&plain).unwrap().contains("replace"));
        let mut ops = Operations {
            rerun: Some(accepted(&req, ts("2026-01-01T10:00:00Z"))),
            ..Default::default()
        };
        let op = ops.rerun.as_ref().unwrap();
        assert_eq!(op.period.as_ref().map(|t| t.0), req.period);
        let p = ts("2026-01-01T09:00:00Z");
        let claim = RunRef {
            unknown: Default::default(),
            late: false,
            period: p.into(),
            token: 9,
            job_name: crate::naming::rerun_job_name("a", p, 9),
            claimed_at: None,
            job_uid: None,
            origin: Some(RunOrigin::Rerun),
            requested_by: Some("alice".into()),
            supersedes: Some(4),
            replaces: vec![crate::api::ReplacedRun {
                unknown: Default::default(),
                period: p.into(),
                token: 4,
                job_name: "a-1767258000".into(),
                job_uid: None,
                claimed_at: None,
            }],
            resume_at: None,
            basis: None,
        };
        on_claim(&mut ops, OperationKind::Rerun, &claim);
        let op = ops.rerun.clone().unwrap();
        assert_eq!(op.phase, OperationPhase::Done);
        assert_eq!(
            (op.job_name.as_deref(), op.token),
            (Some("a-1767258000-r9"), Some(9))
        );
        for want in [
            "re-ran period 2026-01-01T09:00:00Z: started Job a-1767258000-r9 with fencing token 9",
            "moved from token 4 to it, so 4 is refused from now on",
            "replaced the active run a-1767258000 (token 4)",
        ] {
            assert!(op.message.contains(want), "{want:?} in {}", op.message);
        }
        // A fence that rose meanwhile re-issues the claim; the record follows.
        on_reclaim(&mut ops, &claim, 12);
        let op = ops.rerun.unwrap();
        assert_eq!(op.token, Some(12));
        assert!(
            op.message.contains("with fencing token 12"),
            "{}",
            op.message
        );
        assert!(op.message.contains("from token 4 to it"), "{}", op.message);
    }

    #[test]
    fn a_backfill_covers_decided_periods_only() {
        let hourly = Schedule::parse("0 * * * *", None, DstPolicy::default()).unwrap();
        let decided = ts("2026-01-01T10:30:00Z");
        // Inclusive at both ends.
        let (first, last, n) = backfill_range(
            &hourly,
            ts("2026-01-01T02:00:00Z"),
            ts("2026-01-01T05:00:00Z"),
            decided,
        )
        .unwrap();
        assert_eq!(
            (first, last, n),
            (ts("2026-01-01T02:00:00Z"), ts("2026-01-01T05:00:00Z"), 4)
        );
        // Clamped to what the schedule has decided.
        let (_, last, n) = backfill_range(
            &hourly,
            ts("2026-01-01T08:00:00Z"),
            ts("2026-01-02T00:00:00Z"),
            decided,
        )
        .unwrap();
        assert_eq!((last, n), (ts("2026-01-01T10:00:00Z"), 3));
        let e = backfill_range(
            &hourly,
            ts("2026-01-01T11:00:00Z"),
            ts("2026-01-01T12:00:00Z"),
            decided,
        )
        .unwrap_err();
        assert!(e.contains("not decided yet"), "{e}");
        let e = backfill_range(
            &hourly,
            ts("2026-01-01T02:10:00Z"),
            ts("2026-01-01T02:50:00Z"),
            decided,
        )
        .unwrap_err();
        assert!(e.contains("no period"), "{e}");
        let e = backfill_range(
            &hourly,
            ts("2020-01-01T00:00:00Z"),
            ts("2025-12-31T00:00:00Z"),
            decided,
        )
        .unwrap_err();
        assert!(e.contains("split"), "{e}");
    }

    #[test]
    fn a_backfill_walks_its_range_once() {
        let hourly = Schedule::parse("0 * * * *", None, DstPolicy::default()).unwrap();
        let req = Request {
            id: "b".into(),
            from: Some(ts("2026-01-01T02:00:00Z")),
            to: Some(ts("2026-01-01T04:00:00Z")),
            ..Default::default()
        };
        let mut ops = Operations {
            backfill: Some(accepted(&req, ts("2026-01-02T00:00:00Z"))),
            ..Default::default()
        };
        let mut seen = Vec::new();
        let mut token = 10;
        while let Some(p) = backfill_next(&hourly, ops.backfill.as_ref().unwrap()) {
            assert!(seen.len() < 10, "runaway: {seen:?}");
            seen.push(p);
            token += 1;
            let claim = RunRef {
                unknown: Default::default(),
                late: false,
                period: p.into(),
                token,
                job_name: crate::naming::job_name("a", p),
                claimed_at: None,
                job_uid: None,
                origin: Some(RunOrigin::Backfill),
                requested_by: None,
                supersedes: None,
                replaces: Vec::new(),
                resume_at: None,
                basis: None,
            };
            on_claim(&mut ops, OperationKind::Backfill, &claim);
        }
        assert_eq!(
            seen,
            [
                "2026-01-01T02:00:00Z",
                "2026-01-01T03:00:00Z",
                "2026-01-01T04:00:00Z"
            ]
            .map(ts)
        );
        let op = ops.backfill.unwrap();
        assert_eq!(
            (op.started, op.token, op.phase),
            (3, Some(13), OperationPhase::Running)
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

        /// Walking a backfill (claims interleaved with periods that ran before, as the cursor
        /// is stored and re-read between reconciles) visits exactly the schedule's periods of the
        /// range, in order, each once, and counts them all.
        #[test]
        fn a_backfill_visits_each_period_of_its_range_once(
            expr in proptest::sample::select(vec![
                "*/7 * * * * *", "0 */5 * * * *", "30 2 * * *", "0 0 1 * *", "15,45 * * * *",
                "0 0 29 2 *", "0 9 * * 1-5",
            ]),
            zone in proptest::sample::select(vec!["UTC", "Europe/Berlin", "Australia/Lord_Howe"]),
            start in 1_700_000_000i64..1_800_000_000,
            span in 0i64..40 * 86_400,
            ran_before in proptest::collection::vec(proptest::bool::ANY, 64),
        ) {
            let s = Schedule::parse(expr, Some(zone), DstPolicy::default()).unwrap();
            let from = Timestamp::from_second(start).unwrap();
            let to = Timestamp::from_second(start + span).unwrap();
            let decided = to + SignedDuration::from_hours(1);
            let expected: Vec<Timestamp> = s
                .iter_after(from - SignedDuration::from_nanos(1))
                .take_while(|p| *p <= to)
                .take(64)
                .collect();
            let all = s.count_between(from - SignedDuration::from_nanos(1), to, BACKFILL_MAX_PERIODS + 1);
            let (first, last, count) = match backfill_range(&s, from, to, decided) {
                Ok(r) => r,
                Err(e) if all > BACKFILL_MAX_PERIODS => {
                    proptest::prop_assert!(e.contains("split"), "{}", e);
                    return Ok(());
                }
                Err(e) => {
                    proptest::prop_assert!(expected.is_empty(), "{}", e);
                    return Ok(());
                }
            };
            proptest::prop_assert_eq!(Some(&first), expected.first());
            if expected.len() < 64 {
                proptest::prop_assert_eq!(Some(&last), expected.last());
                proptest::prop_assert_eq!(count, expected.len() as u64);
            }
            let mut op = accepted(
                &Request { id: "p".into(), from: Some(first), to: Some(last), ..Default::default() },
                to,
            );
            op.next = Some(first.into());
            let mut seen = Vec::new();
            let mut token = 0;
            while let Some(p) = backfill_next(&s, &op) {
                if seen.len() == expected.len() {
                    break;
                }
                seen.push(p);
                if ran_before[seen.len() - 1] {
                    op.already_run += 1;
                    op.next = Some(after(p).into());
                } else {
                    token += 1;
                    let claim = RunRef {
                        unknown: Default::default(),
                        late: false,
                        period: p.into(),
                        token,
                        job_name: crate::naming::job_name("a", p),
                        claimed_at: None,
                        job_uid: None,
                        origin: Some(RunOrigin::Backfill),
                        requested_by: None,
                        supersedes: None,
                        replaces: Vec::new(),
                        resume_at: None,
                        basis: None,
                    };
                    let mut ops = Operations { backfill: Some(op), ..Default::default() };
                    on_claim(&mut ops, OperationKind::Backfill, &claim);
                    op = ops.backfill.unwrap();
                }
                // The cursor goes through the status as a Time (whole seconds).
                op = serde_json::from_value(serde_json::to_value(&op).unwrap()).unwrap();
            }
            proptest::prop_assert_eq!(&seen, &expected);
            proptest::prop_assert_eq!(op.started + op.already_run, expected.len() as u64);
        }
    }

    #[test]
    fn waiting_does_not_rewrite_the_record() {
        let req = Request {
            id: "t".into(),
            ..Default::default()
        };
        let mut slot = None;
        let mut op = accepted(&req, ts("2026-01-01T00:00:00Z"));
        op.message = "waiting".into();
        assert!(set(&mut slot, op.clone()));
        op.updated = Some(ts("2026-01-01T00:00:05Z").into());
        assert!(!set(&mut slot, op.clone()), "only the time differs");
        op.message = "still waiting, for something else".into();
        assert!(set(&mut slot, op));
    }

    #[test]
    fn backfill_refuses_periods_the_claims_table_may_not_know() {
        let t = |s: &str| -> Timestamp { s.parse().unwrap() };
        let recorded = |since: &str| crate::api::ClaimsRecorded {
            unknown: Default::default(),
            since: t(since).into(),
            target: "sha256:x".into(),
        };
        let created = Some(t("2026-01-01T00:00:00Z"));
        let range = |a: &str, b: &str| (t(a), t(b), 3);
        // Created with the backstop: every period it lived through is in the claims table.
        let fresh = recorded("2026-01-01T00:00:00Z");
        let lived = range("2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z");
        assert!(check_claims_recorded(lived, created, Some(&fresh), false).is_ok());
        // The backstop came (or moved, or a run went without its claim) on 1 March: periods of
        // January and February may have run without a claim row.
        let late = recorded("2026-03-01T00:00:00Z");
        let err = check_claims_recorded(
            range("2026-02-01T00:00:00Z", "2026-04-01T00:00:00Z"),
            created,
            Some(&late),
            false,
        )
        .unwrap_err();
        assert!(err.contains("only since 2026-03-01T00:00:00Z"), "{err}");
        assert!(
            check_claims_recorded(
                range("2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z"),
                created,
                Some(&late),
                false
            )
            .is_ok()
        );
        assert!(
            check_claims_recorded(lived, created, None, false).is_err(),
            "not yet recorded"
        );
    }

    /// F12: periods before the SingletonJob existed are refused, wholly or partly: an earlier
    /// SingletonJob of the same name may have run them without a claim row (Efficiency with its
    /// database down, or before it had a backstop), and the claims table cannot tell.
    #[test]
    fn backfill_refuses_periods_before_the_singletonjob_existed() {
        let t = |s: &str| -> Timestamp { s.parse().unwrap() };
        let fresh = crate::api::ClaimsRecorded {
            unknown: Default::default(),
            since: t("2026-01-01T00:00:00Z").into(),
            target: "sha256:x".into(),
        };
        let created = Some(t("2026-01-01T00:00:00Z"));
        for (a, b) in [
            ("2025-10-01T00:00:00Z", "2025-12-01T00:00:00Z"),
            ("2025-12-01T00:00:00Z", "2026-02-01T00:00:00Z"),
        ] {
            let err =
                check_claims_recorded((t(a), t(b), 3), created, Some(&fresh), false).unwrap_err();
            assert!(
                err.contains("before this SingletonJob was created"),
                "{err}"
            );
            assert!(err.contains("--before-creation"), "says how to ask: {err}");
            // Asked for by someone who knows they never ran: allowed, each still once.
            assert!(check_claims_recorded((t(a), t(b), 3), created, Some(&fresh), true).is_ok());
        }
        // The opt-in covers the time before the creation only, not a life without the backstop.
        let late = crate::api::ClaimsRecorded {
            unknown: Default::default(),
            since: t("2026-03-01T00:00:00Z").into(),
            target: "sha256:x".into(),
        };
        let across = (t("2025-12-01T00:00:00Z"), t("2026-02-01T00:00:00Z"), 3);
        assert!(check_claims_recorded(across, created, Some(&late), true).is_err());
    }
}
