//! The checker: pure functions from what the outside world recorded (the backstop's claims table,
//! the Jobs as a watch of the API server saw them, Events and status, the workload's fenced
//! writes and attempts, and what the harness measured of its own fault) to one row of the chaos
//! table. Nothing here trusts the controller's own logs or counters.
//!
//! Runs are counted as users count them (DESIGN.md G1): by Job uid, not by token, and only Jobs
//! that were ever allowed to run pods. A Job created suspended and removed before it was resumed
//! never ran; it is reported, not counted.
//!
//! What each must-be-zero column rests on:
//! - Jobs per period, duplicates, same-token re-creations: Job uids from the watch and the job
//!   controller's Events, claim rows, the workload's committed writes.
//! - Runs without a claim, Jobs before their instant: the watch against the claims table and
//!   the schedule. A Job counts as let run when the API server applied the update that cleared
//!   its `spec.suspend` (the time of its `managedFields` entry, whole seconds); a Job that is no
//!   prepared run's (no `singleton.dev/resume-at`) is also judged by its `creationTimestamp`,
//!   since its claim follows the instant. A prepared run's Job is created ahead of its instant
//!   by design (issue 33): only its release counts.
//! - Withdrawn Jobs that ran: a prepared run's Job once marked withdrawn must never run, whoever
//!   resumes it however late (the watch saw the mark and the Job allowed to run).
//! - Lost: a due period counts as *started* only from the watch or the job controller's Events. A
//!   period the controller *recorded* (Missed, Skipped) is the controller's own word, so it is
//!   accepted only when the harness's own record of the fault explains it: the reason is one the
//!   row's fault can cause ([`Expect::reasons`]) and the period fell due inside the fault window
//!   the harness measured (from an interval before the fault to an interval after every
//!   SingletonJob ran again). `Deduplicated` never explains a period no Job ran. A period the
//!   controller has not decided (after `status.decidedThrough`) is *pending* only while it is
//!   younger than the row's settle time plus its schedule's interval at the check; older, it is
//!   lost. Anything else without a run is lost.
//! - Stale writes accepted, overlapping committed attempts: the workload's own rows (commit
//!   order, token, attempt) and the backstop's attempt registrations, in the backstop's database
//!   (PostgreSQL; MariaDB in the `*-mariadb` rows).
//!
//! And what each row must prove beyond them (checked in [`Row::violations`]): that its fault
//! fired ([`Proof`], measured by the harness: a component's pid and port, a process state, a
//! clock offset in a log, a takeover, a precondition), that periods fell due inside the fault
//! window ([`Expect::min_due_in_fault`]), that the workload committed writes (a fence that
//! refuses everything, or a workload that never wrote, fails), and the failover bounds the
//! documentation promises ([`Expect::failover_max`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

/// A row of the backstop's claims table.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    pub period: Timestamp,
    pub token: u64,
}

/// A Job of a run, by uid, as the outside observer saw it over its whole life (the watch of
/// [`crate::observer`], cross-checked with the job controller's Events).
#[derive(Clone, Debug, PartialEq)]
pub struct JobSeen {
    pub uid: String,
    pub name: String,
    pub period: Timestamp,
    /// From the Job's annotation; None when only the job controller's Events show the Job (they
    /// carry its name and uid, not its annotations).
    pub token: Option<u64>,
    /// Ever allowed to run pods: `spec.suspend` not true in some state seen, or a pod count or
    /// `status.startTime` set, or the job controller reported acting on its pods.
    pub ran: bool,
    /// Gone from the API server before the check (pruned, replaced or deleted).
    pub removed: bool,
    /// Seen only in the job controller's Events: the watch missed it (a relist gap).
    pub events_only: bool,
    /// `metadata.creationTimestamp`: the API server's clock, whole seconds (rounded down, so a
    /// Job created before a whole-second instant always shows a time before it). None when only
    /// Events show the Job.
    pub created: Option<Timestamp>,
    /// When the watch first saw it finished (Complete or Failed), else gone; None: still active
    /// at the check (or known from Events only).
    pub ended: Option<Timestamp>,
    /// Seen allowed to run while its `singleton.dev/released` annotation still said `false`:
    /// started by someone other than the controller (issue 31: only the controller starts a
    /// run, by a resume that sets the annotation in the same patch).
    pub unreleased: bool,
    /// When it was let run: the API server's time (whole seconds, rounded down) of the update
    /// that cleared `spec.suspend` ([`crate::observer::released_at`]). None: not seen released,
    /// or known from Events only.
    pub released: Option<Timestamp>,
    /// Its `singleton.dev/resume-at` annotation: a prepared run's Job (issue 33), created ahead
    /// of its instant by design and let run at it.
    pub resume_at: Option<Timestamp>,
    /// Ever marked withdrawn (`singleton.dev/released: withdrawn`), with the reason its
    /// `singleton.dev/withdrawn` annotation gave: it must never run.
    pub withdrawn: Option<String>,
    /// Its template's first container's command and arguments (which template it was built
    /// from).
    pub command: Option<String>,
}

impl JobSeen {
    /// A Job as the watch saw it, attributed to `period`.
    pub fn watched(r: &crate::observer::JobRecord, period: Timestamp) -> JobSeen {
        JobSeen {
            uid: r.uid.clone(),
            name: r.name.clone(),
            period,
            token: r.token,
            ran: r.ran,
            removed: r.deleted.is_some(),
            events_only: false,
            created: r.created,
            ended: r.finished_at.or(r.deleted),
            unreleased: r.ran_unreleased,
            released: r.released_at,
            resume_at: r.resume_at,
            withdrawn: r.withdrawn.clone(),
            command: r.command.clone(),
        }
    }

    /// A Job the watch never saw, known from the job controller's Events only (its name and
    /// uid; gone by the check).
    pub fn from_events(uid: &str, name: &str, period: Timestamp, ran: bool) -> JobSeen {
        JobSeen {
            uid: uid.to_string(),
            name: name.to_string(),
            period,
            token: None,
            ran,
            removed: true,
            events_only: true,
            created: None,
            ended: None,
            unreleased: false,
            released: None,
            resume_at: None,
            withdrawn: None,
            command: None,
        }
    }
}

/// Periods recorded with an outcome and a reason but no run, inclusive, from a `RunMissed`,
/// `RunSkipped` or `RunDeduplicated` Event or a `status.history` entry without a Job (whatever its
/// outcome: only Missed and Skipped can explain a period that no Job ran).
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    pub first: Timestamp,
    pub last: Timestamp,
    /// `Missed`, `Skipped`, `Deduplicated`, or another outcome recorded without a Job (`Failed`).
    pub outcome: String,
    /// `Superseded`, `DeadlineExceeded`, `BackstopUnavailable`, ...; empty when none was given.
    pub reason: String,
}

impl Recorded {
    fn covers(&self, t: Timestamp) -> bool {
        self.first <= t && t <= self.last
    }
}

/// What was observed of one SingletonJob.
#[derive(Clone, Debug, Default)]
pub struct SjObservation {
    /// The key the controller files its claims under: `spec.backstop.jobKey` when set, else
    /// `namespace/name`.
    pub key: String,
    /// It has `spec.backstop`: every run it starts must have a claim row.
    pub backstop: bool,
    /// Time between two instants of its schedule (bounds how long a period may stay pending,
    /// and how far around the fault a recorded period is explained by it).
    pub interval: Duration,
    /// The scheduled instants that fell due inside the observation window.
    pub due: Vec<Timestamp>,
    /// `status.decidedThrough`: periods after it are still undecided.
    pub decided_through: Option<Timestamp>,
    pub claims: Vec<Claim>,
    /// Every Job of this SingletonJob seen since before its first run, one per uid.
    pub jobs: Vec<JobSeen>,
    pub recorded: Vec<Recorded>,
}

/// Result of one fenced write by the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteResult {
    /// Committed; the row's id in the writes table (commit order per job: the fence's row lock
    /// serialises the writers of one job).
    Accepted { seq: i64 },
    /// Refused as stale by the fence (SQLSTATE SF001: an older or retired token; SF004: a
    /// superseded attempt), at the write or at the attempt's registration.
    Refused,
    /// Refused by the fence for another reason (SF002 not permitted, SF003 never issued): the
    /// workload used a token the controller handed it, so this is always a failure.
    Rejected { sqlstate: [u8; 5] },
    /// The database never answered within the workload's retry budget.
    Unavailable,
}

/// One fenced write of the workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    /// `namespace/name` of the SingletonJob (the fence's key).
    pub job: String,
    pub period: Timestamp,
    pub token: u64,
    /// Deliberately late: the workload held this token until a newer run had started (the pause
    /// of Kleppmann's diagram). Such a write must be refused.
    pub held: bool,
    pub result: WriteResult,
}

/// An attempt (a pod of a run) whose fenced writes committed: a row of the workload's own table
/// (`chaos_writes` of the simulated workload, `run_attempts` of the billing workload) joined
/// with its registration in the backstop's `<p>attempts` table (docs: attempts-design).
#[derive(Clone, Debug, PartialEq)]
pub struct CommittedAttempt {
    pub job: String,
    pub period: Timestamp,
    pub token: u64,
    /// The attempt's id (the pod's uid, or the simulated pod's).
    pub attempt: String,
    /// Its registration order within (job, token), from `<p>attempts.seq`; None: not registered.
    pub seq: Option<i64>,
    /// `<p>attempts.registered_at` (the database's clock); None: not registered.
    pub registered_at: Option<Timestamp>,
    /// When its fenced transaction wrote its row (the database's clock, inside the transaction).
    pub committed_at: Timestamp,
}

/// When the fault was on, by the harness's clock: from its injection (`from`) to its healing
/// (`to`), and when every SingletonJob was seen running again (`recovered`, if it was).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultWindow {
    pub from: Timestamp,
    pub to: Timestamp,
    pub recovered: Option<Timestamp>,
}

/// One piece of evidence, measured by the harness, that the row's fault did happen (a pid that
/// changed, a port that refused, a process seen stopped, a skewed clock in a log, a takeover, a
/// precondition met); `held` false: the fault cannot be shown to have fired, the row fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proof {
    pub held: bool,
    pub what: String,
}

impl Proof {
    pub fn new(held: bool, what: impl Into<String>) -> Proof {
        Proof {
            held,
            what: what.into(),
        }
    }
}

/// How a workload transaction that hung holding the fence row (replace-hung-tx) ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HungEnd {
    /// Its Job was deleted and its connection dropped with it, as a killed pod's is.
    JobDeleted,
    /// Still open when the fault was healed (the suite dropped it).
    Healed,
    /// `singleton_fence` refused its token: a newer run had already advanced the fence.
    Refused,
    /// It never got the lock: the database failed it.
    Failed(String),
}

/// A workload transaction that called `singleton_fence` and then hung.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HungTx {
    pub job: String,
    pub token: u64,
    pub end: HungEnd,
}

/// Everything one scenario observed.
#[derive(Clone, Debug, Default)]
pub struct Observations {
    pub sjs: Vec<SjObservation>,
    pub writes: Vec<Write>,
    /// Committed attempts; None: the backstop has no attempt registration (schema before 5) or
    /// the workload does not record attempts, and the attempt columns show n/a.
    pub attempts: Option<Vec<CommittedAttempt>>,
    /// From a fault that removed the leader to another replica holding the Lease.
    pub failovers: Vec<Duration>,
    pub hung: Vec<HungTx>,
    /// Times the Job watch had to list again (410 Gone): a Job created and removed in between is
    /// known only from the job controller's Events.
    pub watch_relists: u64,
    /// Errors of the Job watch (retried; informational).
    pub watch_errors: u64,
    /// Jobs found only in the job controller's Events (the watch missed them): name and uid.
    pub events_only: Vec<String>,
    /// Jobs of the namespace labelled as runs but without the SingletonJob or period annotation:
    /// no run of the controller looks like that, and the checker could not attribute them.
    pub unattributed: Vec<String>,
    /// When the fault was on (the harness's clock).
    pub fault: Option<FaultWindow>,
    /// When the observations were read: a period undecided by then is pending only while it is
    /// younger than `settle` plus its schedule's interval. None: no period may be pending.
    pub checked_at: Option<Timestamp>,
    /// The row's settle time (observed after recovery, before the check).
    pub settle: Duration,
    /// Evidence that the fault fired.
    pub proofs: Vec<Proof>,
}

/// What a scenario must show beyond the common checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Expect {
    /// The workload holds tokens past a newer run: some stale write must be refused.
    pub pause: bool,
    /// No due period may be recorded Missed with reason BackstopUnavailable.
    pub no_backstop_missed: bool,
    /// A Replace must have ended a transaction hung on the fence (by deleting its Job).
    pub hung_replace: bool,
    /// The reasons with which this row's fault may make the controller record a period instead
    /// of running it. A period recorded with another reason is lost.
    pub reasons: &'static [&'static str],
    /// How many due periods must fall inside the fault window (at least 1 whatever this says):
    /// what the row's planned fault duration guarantees for its schedules.
    pub min_due_in_fault: u64,
    /// The longest failover the documentation promises for this row, if it promises one.
    pub failover_max: Option<Duration>,
    /// How many failovers the row's fault must have caused (measured ones).
    pub min_failovers: usize,
    /// The row's fault starts Jobs from outside the controller (queue-resumer): a Job seen
    /// running before its release is the fault, not a violation, but it must have been stopped
    /// (gone by the check) and at least one must have been seen.
    pub outside_starts: bool,
}

/// One row of the table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    pub scenario: String,
    pub fault_window: Duration,
    pub due: u64,
    /// Due periods inside the fault window.
    pub due_in_fault: u64,
    /// Due periods with a Job that ran.
    pub started: u64,
    /// Due periods not started but recorded with an outcome and a reason the fault explains.
    pub recorded: u64,
    /// Due periods after `decidedThrough` at check time and younger than the pending bound.
    pub pending: u64,
    /// Max over (SingletonJob, period) of the Job uids that ran: at most 1 (G1).
    pub jobs_per_period_max: u64,
    pub duplicates: u64,
    /// (SingletonJob, period, token) that ran in more than one Job uid: 0 (G3: a decided period's
    /// token never starts a Job again).
    pub same_token: u64,
    pub lost: u64,
    /// Periods of a SingletonJob with a backstop that ran without a claim row: 0.
    pub unclaimed: u64,
    /// Jobs that ran, let run (or, if no prepared run's, created) before their period's instant
    /// by the API server's clock: 0.
    pub early: u64,
    /// Prepared runs' Jobs marked withdrawn (informational).
    pub withdrawn: u64,
    /// Of those, Jobs that ran: 0.
    pub withdrawn_ran: u64,
    pub non_monotonic: u64,
    pub stale_accepted: u64,
    /// Held (deliberately late) writes refused by the fence.
    pub stale_refused: u64,
    /// Writes made as soon as their run started, refused by the fence anyway (the workload learnt
    /// of the run late, after a newer one started or its period was decided). Informational.
    pub fresh_refused: u64,
    /// Writes refused with SF002/SF003: always a failure.
    pub writes_rejected: u64,
    /// Writes whose database never answered within the workload's retry budget.
    pub writes_unavailable: u64,
    pub writes_accepted: u64,
    /// Max over (job, period) of the distinct attempts whose writes committed: at most 1. None:
    /// not measured (n/a).
    pub attempts_max: Option<u64>,
    /// Pairs of committed attempts of one period where the older one committed after the newer
    /// one registered: 0. None: not measured.
    pub attempts_overlapping: Option<u64>,
    /// Jobs created suspended and removed without ever being allowed to run (informational).
    pub unrun_removed: u64,
    /// Due periods recorded Missed with reason BackstopUnavailable.
    pub backstop_missed: u64,
    pub hung: u64,
    /// Hung transactions ended because their Job was deleted.
    pub hung_released: u64,
    pub failovers: Vec<Duration>,
    /// Evidence that the fault fired.
    pub proofs: Vec<Proof>,
    /// Human-readable evidence of every violation.
    pub details: Vec<String>,
    /// What a reader should know but is no failure (watch relists, Jobs known only from Events).
    pub notes: Vec<String>,
}

impl Row {
    /// Whether every proof held (and there is one).
    pub fn fault_proven(&self) -> bool {
        !self.proofs.is_empty() && self.proofs.iter().all(|p| p.held)
    }

    /// What makes the scenario fail; empty when it passed.
    pub fn violations(&self, expect: Expect) -> Vec<String> {
        let mut v = Vec::new();
        self.count_violations(&mut v);
        self.per_period_violations(&mut v);
        self.workload_violations(&expect, &mut v);
        self.fault_violations(&expect, &mut v);
        v.extend(
            self.details
                .iter()
                .map(|d| format!("{}: {d}", self.scenario)),
        );
        v
    }

    /// The counters that must stay at 0.
    fn count_violations(&self, v: &mut Vec<String>) {
        for (what, n) in [
            ("duplicate runs", self.duplicates),
            ("same-token re-creations", self.same_token),
            ("lost periods", self.lost),
            ("runs without a claim row", self.unclaimed),
            ("Jobs let run before their period's instant", self.early),
            ("withdrawn Jobs that ran", self.withdrawn_ran),
            ("non-monotonic tokens", self.non_monotonic),
            ("stale writes accepted", self.stale_accepted),
            (
                "writes rejected by the fence (SF002/SF003)",
                self.writes_rejected,
            ),
        ] {
            if n > 0 {
                v.push(format!("{}: {n} {what}", self.scenario));
            }
        }
    }

    /// At most one Job and one committed attempt per period, and no overlapping attempts.
    fn per_period_violations(&self, v: &mut Vec<String>) {
        if self.jobs_per_period_max > 1 {
            v.push(format!(
                "{}: Jobs per period (max) is {}, at most 1 may run",
                self.scenario, self.jobs_per_period_max
            ));
        }
        if let Some(n) = self.attempts_max.filter(|n| *n > 1) {
            v.push(format!(
                "{}: attempts that committed per period (max) is {n}, at most 1 may",
                self.scenario
            ));
        }
        if let Some(n) = self.attempts_overlapping.filter(|n| *n > 0) {
            v.push(format!(
                "{}: {n} overlapping committed attempts",
                self.scenario
            ));
        }
    }

    /// Runs started and writes committed at all, and what `expect` asks of the workload.
    fn workload_violations(&self, expect: &Expect, v: &mut Vec<String>) {
        if self.started == 0 {
            v.push(format!("{}: no run started at all", self.scenario));
        }
        if self.writes_accepted == 0 {
            v.push(format!(
                "{}: the workload committed no write at all (a fence that refuses everything, or a workload that never wrote)",
                self.scenario
            ));
        }
        if expect.pause && self.stale_refused == 0 {
            v.push(format!(
                "{}: a pause scenario refused no stale write",
                self.scenario
            ));
        }
        if expect.no_backstop_missed && self.backstop_missed > 0 {
            v.push(format!(
                "{}: {} period(s) recorded Missed (BackstopUnavailable)",
                self.scenario, self.backstop_missed
            ));
        }
        if expect.hung_replace && self.hung_released == 0 {
            v.push(format!(
                "{}: no Replace ended a transaction hung on the fence ({} hung, none had its Job deleted)",
                self.scenario, self.hung
            ));
        }
    }

    /// The fault hit due periods, caused the failovers `expect` asks for within their bound, and
    /// was shown to have fired.
    fn fault_violations(&self, expect: &Expect, v: &mut Vec<String>) {
        let need = expect.min_due_in_fault.max(1);
        if self.due_in_fault < need {
            v.push(format!(
                "{}: {} period(s) fell due inside the fault window, at least {need} needed",
                self.scenario, self.due_in_fault
            ));
        }
        if self.failovers.len() < expect.min_failovers {
            v.push(format!(
                "{}: {} failover(s) measured, the fault must cause {}",
                self.scenario,
                self.failovers.len(),
                expect.min_failovers
            ));
        }
        if let Some(max) = expect.failover_max {
            for f in self.failovers.iter().filter(|f| **f > max) {
                v.push(format!(
                    "{}: a failover took {} s, beyond the bound of {} s",
                    self.scenario,
                    secs(*f),
                    secs(max)
                ));
            }
        }
        if self.proofs.is_empty() {
            v.push(format!(
                "{}: nothing shows that the fault fired",
                self.scenario
            ));
        }
        for p in self.proofs.iter().filter(|p| !p.held) {
            v.push(format!("{}: fault not shown: {}", self.scenario, p.what));
        }
    }
}

/// `d` as a jiff duration (saturating).
fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

/// Computes a scenario's row from its observations.
pub fn evaluate(
    scenario: &str,
    fault_window: Duration,
    expect: &Expect,
    obs: &Observations,
) -> Row {
    evaluate_tokens(scenario, fault_window, expect, obs, true)
}

/// [`evaluate`], with the check that tokens rise with the period (`period_order`) optional:
/// several clusters claiming one job's periods each claim in their own order (super::dr_check).
pub fn evaluate_tokens(
    scenario: &str,
    fault_window: Duration,
    expect: &Expect,
    obs: &Observations,
    period_order: bool,
) -> Row {
    let mut row = Row {
        scenario: scenario.to_string(),
        fault_window,
        failovers: obs.failovers.clone(),
        proofs: obs.proofs.clone(),
        ..Row::default()
    };
    let ctx = Ctx {
        period_order,
        expect,
        fault: obs.fault,
        checked_at: obs.checked_at,
        settle: obs.settle,
    };
    if obs.fault.is_none() {
        row.details
            .push("the harness recorded no fault window".to_string());
    }
    for sj in &obs.sjs {
        evaluate_sj(sj, &mut row, &ctx);
    }
    evaluate_writes(&obs.writes, &mut row);
    evaluate_attempts(obs.attempts.as_deref(), &mut row);
    evaluate_hung(&obs.hung, &mut row);
    if !obs.unattributed.is_empty() {
        row.details.push(format!(
            "{} Job(s) labelled as runs without their SingletonJob or period annotation: {}",
            obs.unattributed.len(),
            obs.unattributed.join(", ")
        ));
    }
    if obs.watch_relists > 0 || obs.watch_errors > 0 {
        row.notes.push(format!(
            "the Job watch failed {} time(s) (retried) and listed again {} time(s) after 410 Gone; Jobs created and removed before a new list are known from the job controller's Events only",
            obs.watch_errors, obs.watch_relists
        ));
    }
    if !obs.events_only.is_empty() {
        row.notes.push(format!(
            "{} Job(s) seen only in the job controller's Events (no token): {}",
            obs.events_only.len(),
            obs.events_only.join(", ")
        ));
    }
    let proven: Vec<&str> = row
        .proofs
        .iter()
        .filter(|p| p.held)
        .map(|p| p.what.as_str())
        .collect();
    if !proven.is_empty() {
        row.notes
            .push(format!("the fault fired: {}", proven.join("; ")));
    }
    row
}

/// What every SingletonJob of a row is judged against.
struct Ctx<'a> {
    period_order: bool,
    expect: &'a Expect,
    fault: Option<FaultWindow>,
    checked_at: Option<Timestamp>,
    settle: Duration,
}

/// What corroborates a period the controller recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Explained {
    /// Due in (or an interval around) the fault window the harness measured.
    Fault,
    /// `Superseded` while a run of an earlier period of the same SingletonJob was still active at
    /// its instant by the watch (under `Forbid` with `catchUp: Latest` a period that cannot start
    /// before the next one falls due is superseded: a slow run, not a lost period).
    ActiveRun,
}

impl Ctx<'_> {
    /// Whether something outside the controller corroborates `r` for period `p` of `sj`: the
    /// reason is one the row's fault can cause, and either the period fell due in the fault
    /// window (from an interval before the fault to an interval after every SingletonJob ran
    /// again), or (`Superseded`) the watch saw an earlier run of the same SingletonJob still
    /// active at its instant. Deduplicated explains no missing run (the period's claim exists,
    /// so its run should too).
    fn explains(
        &self,
        r: &Recorded,
        p: Timestamp,
        sj: &SjObservation,
    ) -> Result<Explained, String> {
        if r.outcome == "Deduplicated" {
            return Err("Deduplicated explains no period that no Job ran".into());
        }
        if !matches!(r.outcome.as_str(), "Missed" | "Skipped") {
            return Err(format!(
                "outcome {} is not one a period may have without a run",
                r.outcome
            ));
        }
        if !self.expect.reasons.contains(&r.reason.as_str()) {
            return Err(format!(
                "reason {:?} is not one this row's fault causes ({:?})",
                r.reason, self.expect.reasons
            ));
        }
        let behind_active_run = r.reason == SUPERSEDED
            && sj.jobs.iter().any(|j| {
                j.ran
                    && j.period < p
                    && j.created.is_some_and(|c| c <= p)
                    && j.ended.is_none_or(|e| e > p)
            });
        let window = self.fault.map(|f| {
            (
                f.from - signed(sj.interval),
                f.recovered.unwrap_or(f.to).max(f.to) + signed(sj.interval),
            )
        });
        match window {
            Some((from, to)) if from <= p && p <= to => Ok(Explained::Fault),
            _ if behind_active_run => Ok(Explained::ActiveRun),
            None => Err("no fault window to explain it".into()),
            Some((from, to)) => {
                let active = if r.reason == SUPERSEDED {
                    ", and no earlier run of it was active at its instant (watch)"
                } else {
                    ""
                };
                Err(format!(
                    "due outside the fault window ({from} to {to}, one interval either side){active}"
                ))
            }
        }
    }
}

/// The reason catch-up records for a period passed over by a later one.
const SUPERSEDED: &str = "Superseded";

fn describe(j: &JobSeen) -> String {
    let token = j.token.map_or("?".to_string(), |t| t.to_string());
    let from = if j.events_only { ", Events only" } else { "" };
    format!("{} (uid {}, token {token}{from})", j.name, j.uid)
}

/// A SingletonJob's claim tokens, by period.
type ClaimsByPeriod = BTreeMap<Timestamp, Vec<u64>>;

/// A SingletonJob's Jobs that ran, by period, then by uid.
type RanByPeriod<'a> = BTreeMap<Timestamp, BTreeMap<&'a str, &'a JobSeen>>;

fn evaluate_sj(sj: &SjObservation, row: &mut Row, ctx: &Ctx) {
    let claims_by_period = claims_by_period(sj);
    let ran_by_period = ran_by_period(sj);
    count_unrun(sj, row);
    check_duplicates(sj, &claims_by_period, &ran_by_period, row);
    check_claim_rows(sj, &claims_by_period, &ran_by_period, row);
    check_outside_starts(sj, row, ctx);
    check_early(sj, row, ctx);
    check_withdrawn_ran(sj, row);
    check_token_order(sj, &claims_by_period, &ran_by_period, row, ctx);
    check_due(sj, &claims_by_period, &ran_by_period, row, ctx);
}

/// The tokens `sj`'s periods were claimed with.
fn claims_by_period(sj: &SjObservation) -> ClaimsByPeriod {
    let mut claims_by_period: ClaimsByPeriod = BTreeMap::new();
    for c in &sj.claims {
        claims_by_period.entry(c.period).or_default().push(c.token);
    }
    claims_by_period
}

/// Only Jobs that ran count; a uid appears once whatever the sources said.
fn ran_by_period(sj: &SjObservation) -> RanByPeriod<'_> {
    let mut ran_by_period: RanByPeriod = BTreeMap::new();
    for j in sj.jobs.iter().filter(|j| j.ran) {
        ran_by_period.entry(j.period).or_default().insert(&j.uid, j);
    }
    ran_by_period
}

/// The Jobs that never ran: removed ones are counted, those left suspended are noted.
fn count_unrun(sj: &SjObservation, row: &mut Row) {
    let mut unrun_left = 0;
    for j in sj.jobs.iter().filter(|j| !j.ran) {
        if j.removed {
            row.unrun_removed += 1;
        } else {
            unrun_left += 1;
        }
    }
    if unrun_left > 0 {
        row.notes.push(format!(
            "{}: {unrun_left} Job(s) still suspended at the check, never resumed",
            sj.key
        ));
    }
}

/// Duplicates: a period claimed twice, two Job uids that ran for one period, or the one Job
/// that ran carrying a token that is not its period's claim.
fn check_duplicates(
    sj: &SjObservation,
    claims_by_period: &ClaimsByPeriod,
    ran_by_period: &RanByPeriod,
    row: &mut Row,
) {
    for (p, tokens) in claims_by_period {
        if tokens.len() > 1 {
            row.duplicates += tokens.len() as u64 - 1;
            row.details.push(format!(
                "{} period {p} claimed {} times",
                sj.key,
                tokens.len()
            ));
        }
    }
    for (p, jobs) in ran_by_period {
        let n = jobs.len() as u64;
        row.jobs_per_period_max = row.jobs_per_period_max.max(n);
        if n > 1 {
            row.duplicates += n - 1;
            let list: Vec<String> = jobs.values().map(|j| describe(j)).collect();
            row.details.push(format!(
                "{} period {p} ran in {n} Jobs: {}",
                sj.key,
                list.join(", ")
            ));
        }
        check_same_token(sj, *p, jobs, row);
        if n == 1 {
            check_claimed_token(sj, *p, jobs, claims_by_period, row);
        }
    }
}

/// No token of period `p` ran in two Jobs (a re-created Job).
fn check_same_token(
    sj: &SjObservation,
    p: Timestamp,
    jobs: &BTreeMap<&str, &JobSeen>,
    row: &mut Row,
) {
    let mut by_token: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for j in jobs.values() {
        if let Some(t) = j.token {
            by_token.entry(t).or_default().push(&j.uid);
        }
    }
    for (t, uids) in by_token {
        if uids.len() > 1 {
            row.same_token += 1;
            row.details.push(format!(
                "{} period {p}: token {t} ran in {} Jobs (re-created): uids {}",
                sj.key,
                uids.len(),
                uids.join(", ")
            ));
        }
    }
}

/// The one Job that ran for period `p` carries one of the period's claimed tokens.
fn check_claimed_token(
    sj: &SjObservation,
    p: Timestamp,
    jobs: &BTreeMap<&str, &JobSeen>,
    claims_by_period: &ClaimsByPeriod,
    row: &mut Row,
) {
    if let Some(claimed) = claims_by_period.get(&p)
        && let Some(j) = jobs.values().next()
        && let Some(t) = j.token
        && !claimed.contains(&t)
    {
        row.duplicates += 1;
        row.details.push(format!(
            "{} period {p}: Job {} ran, but the period was claimed with token(s) {claimed:?}",
            sj.key,
            describe(j)
        ));
    }
}

/// With a backstop, no run without its claim row (looked up by the key the controller files
/// claims under): a Job that ran for an unclaimed period started without the database's
/// consent. A SingletonJob whose runs have no claim at all is said so once, so that a lookup
/// under the wrong key can never pass for "every run claimed".
fn check_claim_rows(
    sj: &SjObservation,
    claims_by_period: &ClaimsByPeriod,
    ran_by_period: &RanByPeriod,
    row: &mut Row,
) {
    if !sj.backstop {
        return;
    }
    if sj.claims.is_empty() && !ran_by_period.is_empty() {
        row.details.push(format!(
            "{} has a backstop and {} period(s) ran, but the claims table has no row under that key",
            sj.key,
            ran_by_period.len()
        ));
    }
    for (p, jobs) in ran_by_period {
        if !claims_by_period.contains_key(p) {
            row.unclaimed += 1;
            let list: Vec<String> = jobs.values().map(|j| describe(j)).collect();
            row.details.push(format!(
                "{} period {p} ran without a claim row: {}",
                sj.key,
                list.join(", ")
            ));
        }
    }
}

/// Only the controller starts a run: no Job seen running before its release; where the fault
/// starts them, each is stopped.
fn check_outside_starts(sj: &SjObservation, row: &mut Row, ctx: &Ctx) {
    for j in sj.jobs.iter().filter(|j| j.ran && j.unreleased) {
        if ctx.expect.outside_starts {
            if !j.removed {
                row.details.push(format!(
                    "{} period {}: Job {} was started by someone other than the controller and never stopped",
                    sj.key,
                    j.period,
                    describe(j)
                ));
            }
            continue;
        }
        row.details.push(format!(
            "{} period {}: Job {} ran while its singleton.dev/released annotation said false (started by someone other than the controller)",
            sj.key,
            j.period,
            describe(j)
        ));
    }
}

/// No Job that ran was let run before its instant, by the API server's clock (whole seconds,
/// rounded down: a Job released or created a moment before a whole-second instant shows the
/// second before). Judged by its release; a Job that is no prepared run's is judged by its
/// creation too (its claim, and so its creation, follows the instant). A prepared run's Job is
/// created ahead of its instant by design: only its release counts, and one that ran without a
/// known release time is noted. G4 is the controller's promise: where the row's fault itself
/// starts Jobs (queue-resumer), a Job started by someone else (its released mark still "false")
/// is the fault's, judged by [`check_outside_starts`] (it must have been stopped); with runs
/// prepared ahead, such a start may come before the instant.
fn check_early(sj: &SjObservation, row: &mut Row, ctx: &Ctx) {
    let mut unknown = Vec::new();
    let by_the_fault = |j: &&JobSeen| ctx.expect.outside_starts && j.unreleased;
    for j in sj
        .jobs
        .iter()
        .filter(|j| j.ran)
        .filter(|j| !by_the_fault(j))
    {
        let early = match (j.released, j.created) {
            (Some(r), _) if r < j.period => Some(format!("released {r}")),
            (_, Some(c)) if j.resume_at.is_none() && c < j.period => Some(format!("created {c}")),
            (None, _) if j.resume_at.is_some() => {
                unknown.push(j.name.clone());
                None
            }
            _ => None,
        };
        if let Some(when) = early {
            row.early += 1;
            row.details.push(format!(
                "{} period {} started early: Job {} {when}",
                sj.key,
                j.period,
                describe(j)
            ));
        }
    }
    if !unknown.is_empty() {
        row.notes.push(format!(
            "{}: prepared Job(s) seen running without a release time (not judged early or not): {}",
            sj.key,
            unknown.join(", ")
        ));
    }
}

/// A prepared run's Job once marked withdrawn never runs (the withdrawal's mark is the
/// linearisation point against its resume, however late either is sent): counted, each one
/// that ran a violation.
fn check_withdrawn_ran(sj: &SjObservation, row: &mut Row) {
    let mut reasons: BTreeMap<&str, u64> = BTreeMap::new();
    for j in sj.jobs.iter() {
        let Some(why) = j.withdrawn.as_deref() else {
            continue;
        };
        row.withdrawn += 1;
        *reasons.entry(why).or_default() += 1;
        if j.ran {
            row.withdrawn_ran += 1;
            row.details.push(format!(
                "{} period {}: Job {} ran although it was marked withdrawn ({why})",
                sj.key,
                j.period,
                describe(j)
            ));
        }
    }
    if !reasons.is_empty() {
        let parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
        row.notes.push(format!(
            "{}: prepared Job(s) withdrawn: {}",
            sj.key,
            parts.join(", ")
        ));
    }
}

/// Tokens strictly increase with the period (one token per period: the claim's, else the
/// lowest of its Jobs that ran). A token reused by a later period shows here too.
fn check_token_order(
    sj: &SjObservation,
    claims_by_period: &ClaimsByPeriod,
    ran_by_period: &RanByPeriod,
    row: &mut Row,
    ctx: &Ctx,
) {
    let token_of = token_per_period(claims_by_period, ran_by_period);
    let mut last: Option<(Timestamp, u64)> = None;
    for (p, t) in token_of.iter().filter(|_| ctx.period_order) {
        if let Some((lp, lt)) = last
            && *t <= lt
        {
            row.non_monotonic += 1;
            row.details.push(format!(
                "{} token {t} of period {p} not above token {lt} of earlier period {lp}",
                sj.key
            ));
        }
        last = Some((*p, *t));
    }
}

/// Each period's one token: the lowest claimed, else the lowest of its Jobs that ran.
fn token_per_period(
    claims_by_period: &ClaimsByPeriod,
    ran_by_period: &RanByPeriod,
) -> BTreeMap<Timestamp, u64> {
    let mut token_of: BTreeMap<Timestamp, u64> = BTreeMap::new();
    for (p, jobs) in ran_by_period {
        if let Some(t) = jobs.values().filter_map(|j| j.token).min() {
            token_of.insert(*p, t);
        }
    }
    for (p, tokens) in claims_by_period {
        if let Some(t) = tokens.iter().min() {
            token_of.insert(*p, *t);
        }
    }
    token_of
}

/// The due periods without a run that a recorded outcome explains: by what, and which of them
/// the backstop missed.
#[derive(Default)]
struct ExplainedTally {
    by_fault: u64,
    by_active_run: u64,
    /// The periods recorded Missed with reason BackstopUnavailable, in order.
    backstop_missed: Vec<Timestamp>,
}

/// Every due period: started (a Job ran), recorded with a reason the fault explains, still
/// pending within its bound, or lost.
fn check_due(
    sj: &SjObservation,
    claims_by_period: &ClaimsByPeriod,
    ran_by_period: &RanByPeriod,
    row: &mut Row,
    ctx: &Ctx,
) {
    let mut tally = ExplainedTally::default();
    let pending_bound = ctx.settle + sj.interval;
    for p in &sj.due {
        row.due += 1;
        if ctx.fault.is_some_and(|f| f.from <= *p && *p <= f.to) {
            row.due_in_fault += 1;
        }
        let covering: Vec<&Recorded> = sj.recorded.iter().filter(|r| r.covers(*p)).collect();
        let explained = covering
            .iter()
            .find_map(|r| ctx.explains(r, *p, sj).ok().map(|how| (r, how)));
        if ran_by_period.contains_key(p) {
            row.started += 1;
        } else if let Some((r, how)) = explained {
            row.recorded += 1;
            match how {
                Explained::Fault => tally.by_fault += 1,
                Explained::ActiveRun => tally.by_active_run += 1,
            }
            if r.reason == "BackstopUnavailable" {
                tally.backstop_missed.push(*p);
            }
        } else if let Some(r) = covering.first() {
            row.lost += 1;
            let why = ctx.explains(r, *p, sj).err().unwrap_or_default();
            row.details.push(format!(
                "{} period {p} due, no run; recorded {} ({}), which the fault does not explain: {why}",
                sj.key, r.outcome, r.reason
            ));
        } else if ctx
            .checked_at
            .is_some_and(|c| *p > c - signed(pending_bound))
            && (sj.decided_through.is_none_or(|d| *p > d) || claims_by_period.contains_key(p))
        {
            // Undecided, or claimed with its run still on the way (claim, create, confirm,
            // resume: a catch-up after an outage claims a backlog just before the check).
            row.pending += 1;
        } else {
            lost_unrecorded(sj, *p, claims_by_period, row, ctx, pending_bound);
        }
    }
    note_backstop_missed(sj, &tally.backstop_missed, row);
    note_recorded(sj, ran_by_period, &tally, row);
}

/// Due period `p` with no run and no record, and past its pending bound (or decided): lost.
fn lost_unrecorded(
    sj: &SjObservation,
    p: Timestamp,
    claims_by_period: &ClaimsByPeriod,
    row: &mut Row,
    ctx: &Ctx,
    pending_bound: Duration,
) {
    row.lost += 1;
    let claimed = claims_by_period
        .get(&p)
        .map(|t| format!(" (claimed with token {t:?}, but no Job of it ran)"))
        .unwrap_or_default();
    let undecided = sj.decided_through.is_none_or(|d| p > d);
    let why = match (undecided, ctx.checked_at) {
        (true, Some(c)) => format!(
            "still undecided (decidedThrough {:?}) {:.1} s after it fell due, beyond the pending bound of {} s (settle + interval)",
            sj.decided_through.map(|d| d.to_string()),
            c.duration_since(p).as_secs_f64(),
            secs(pending_bound)
        ),
        (true, None) => "undecided, and no check time to bound pending".to_string(),
        (false, _) => "no run and no recorded reason".to_string(),
    };
    row.details
        .push(format!("{} period {p} due, {why}{claimed}", sj.key));
}

/// Counts and notes the due periods recorded Missed (BackstopUnavailable).
fn note_backstop_missed(sj: &SjObservation, backstop_missed: &[Timestamp], row: &mut Row) {
    if let (Some(first), Some(last)) = (backstop_missed.first(), backstop_missed.last()) {
        row.backstop_missed += backstop_missed.len() as u64;
        row.notes.push(format!(
            "{}: {} due period(s) from {first} through {last} recorded Missed (BackstopUnavailable)",
            sj.key,
            backstop_missed.len()
        ));
    }
}

/// Notes the outcomes recorded for due periods without a run, and how many the fault window
/// and a still active run explained.
fn note_recorded(
    sj: &SjObservation,
    ran_by_period: &RanByPeriod,
    tally: &ExplainedTally,
    row: &mut Row,
) {
    let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
    for p in sj.due.iter().filter(|p| !ran_by_period.contains_key(*p)) {
        if let Some(r) = sj.recorded.iter().find(|r| r.covers(*p)) {
            *reasons
                .entry(format!("{} ({})", r.outcome, r.reason))
                .or_default() += 1;
        }
    }
    if !reasons.is_empty() {
        let (by_fault, by_active_run) = (tally.by_fault, tally.by_active_run);
        let parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
        row.notes.push(format!(
            "{}: recorded {} ({by_fault} in the fault window, {by_active_run} behind a run still active at their instant)",
            sj.key,
            parts.join(", ")
        ));
    }
}

/// What [`evaluate_writes`] gathers from the writes, by job.
#[derive(Default)]
struct WriteTally<'a> {
    /// Accepted writes: (commit sequence, token, period).
    accepted: BTreeMap<&'a str, Vec<(i64, u64, Timestamp)>>,
    tokens_per_period: BTreeMap<(&'a str, Timestamp), BTreeSet<u64>>,
    /// Per job: fresh writes made, fresh writes accepted.
    fresh: BTreeMap<&'a str, (u64, u64)>,
}

fn evaluate_writes(writes: &[Write], row: &mut Row) {
    let tally = tally_writes(writes, row);
    // A job whose every fresh write was refused: a fence that refuses current tokens.
    for (job, (made, ok)) in tally.fresh {
        if made > 0 && ok == 0 {
            row.details.push(format!(
                "{job}: none of its {made} fresh write(s) was accepted"
            ));
        }
    }
    if row.writes_unavailable > 0 {
        row.notes.push(format!(
            "{} write(s) never reached the database within the workload's retry budget",
            row.writes_unavailable
        ));
    }
    check_commit_order(tally.accepted, row);
    // Two runs' writes for one period are a duplicate run seen by the resource itself.
    for ((job, period), tokens) in tally.tokens_per_period {
        if tokens.len() > 1 {
            row.duplicates += tokens.len() as u64 - 1;
            row.details.push(format!(
                "{job} period {period}: writes committed with tokens {tokens:?}"
            ));
        }
    }
}

/// Counts every write by its result into `row`, and gathers what the later checks need.
fn tally_writes<'a>(writes: &'a [Write], row: &mut Row) -> WriteTally<'a> {
    let mut tally = WriteTally::default();
    for w in writes {
        if !w.held {
            tally.fresh.entry(&w.job).or_default().0 += 1;
        }
        match w.result {
            WriteResult::Accepted { seq } => tally_accepted(&mut tally, w, seq, row),
            WriteResult::Refused if w.held => row.stale_refused += 1,
            WriteResult::Refused => row.fresh_refused += 1,
            WriteResult::Rejected { sqlstate } => {
                row.writes_rejected += 1;
                row.details.push(format!(
                    "{} token {} (period {}) rejected by the fence with SQLSTATE {}",
                    w.job,
                    w.token,
                    w.period,
                    String::from_utf8_lossy(&sqlstate)
                ));
            }
            WriteResult::Unavailable => row.writes_unavailable += 1,
        }
    }
    tally
}

/// One accepted write: counted, gathered, and a violation if its token was held.
fn tally_accepted<'a>(tally: &mut WriteTally<'a>, w: &'a Write, seq: i64, row: &mut Row) {
    row.writes_accepted += 1;
    if !w.held {
        tally.fresh.entry(&w.job).or_default().1 += 1;
    }
    tally
        .accepted
        .entry(&w.job)
        .or_default()
        .push((seq, w.token, w.period));
    tally
        .tokens_per_period
        .entry((&w.job, w.period))
        .or_default()
        .insert(w.token);
    if w.held {
        row.stale_accepted += 1;
        row.details.push(format!(
            "{} held token {} (period {}) accepted after a newer run",
            w.job, w.token, w.period
        ));
    }
}

/// In commit order, a job's accepted tokens never go down: a lower one after a higher one is
/// a stale write the fence let through.
fn check_commit_order(accepted: BTreeMap<&str, Vec<(i64, u64, Timestamp)>>, row: &mut Row) {
    for (job, mut ws) in accepted {
        ws.sort();
        let mut max = 0;
        for (seq, token, period) in ws {
            if token < max {
                row.stale_accepted += 1;
                row.details.push(format!(
                    "{job} write #{seq} with token {token} (period {period}) committed after token {max}"
                ));
            }
            max = max.max(token);
        }
    }
}

/// The attempt columns (attempts-design): per (job, period), the distinct attempts whose fenced
/// writes committed (at most 1), and pairs of them, in registration order (token, then
/// `<p>attempts.seq`), where the older committed at or after the newer registered (0). A
/// committed attempt with no registration row is a violation too: the 3-argument fence refuses
/// an unregistered attempt. So is a workload that committed writes but no attempt (its writers
/// did not record themselves, so the columns would hold vacuously). Runs after
/// [`evaluate_writes`].
fn evaluate_attempts(attempts: Option<&[CommittedAttempt]>, row: &mut Row) {
    let Some(attempts) = attempts else {
        return;
    };
    if attempts.is_empty() && row.writes_accepted > 0 {
        row.details.push(format!(
            "the workload committed {} write(s) but no committed attempt was recorded",
            row.writes_accepted
        ));
    }
    let verdict = judge_attempts(attempts);
    row.details.extend(verdict.details);
    row.attempts_max = Some(verdict.max);
    row.attempts_overlapping = Some(verdict.overlapping);
}

/// What the committed attempts say: the most distinct attempts that committed for one (job,
/// period), the pairs where an older attempt committed at or after a newer one registered, and
/// each violation in words (also a committed attempt without a registration row).
#[derive(Clone, Debug, Default)]
pub struct AttemptVerdict {
    pub max: u64,
    pub overlapping: u64,
    pub details: Vec<String>,
}

/// The attempt columns' verdict, for the chaos rows and the failpoint tests.
pub fn judge_attempts(attempts: &[CommittedAttempt]) -> AttemptVerdict {
    let mut v = AttemptVerdict::default();
    let mut by: BTreeMap<(&str, Timestamp), Vec<&CommittedAttempt>> = BTreeMap::new();
    for a in attempts {
        by.entry((&a.job, a.period)).or_default().push(a);
        if a.registered_at.is_none() {
            v.details.push(format!(
                "{} period {}: attempt {} (token {}) committed without a registration row",
                a.job, a.period, a.attempt, a.token
            ));
        }
    }
    for ((job, period), mut list) in by {
        list.sort_by_key(|a| (a.token, a.seq.unwrap_or(i64::MAX), a.committed_at));
        let distinct: BTreeSet<&str> = list.iter().map(|a| a.attempt.as_str()).collect();
        v.max = v.max.max(distinct.len() as u64);
        if distinct.len() > 1 {
            let names: Vec<String> = list
                .iter()
                .map(|a| format!("{} (token {}, #{:?})", a.attempt, a.token, a.seq))
                .collect();
            v.details.push(format!(
                "{job} period {period} committed by {} attempts: {}",
                distinct.len(),
                names.join(", ")
            ));
        }
        for (i, older) in list.iter().enumerate() {
            for newer in &list[i + 1..] {
                if newer.attempt == older.attempt {
                    continue;
                }
                if let Some(r) = newer.registered_at
                    && older.committed_at >= r
                {
                    v.overlapping += 1;
                    v.details.push(format!(
                        "{job} period {period}: attempt {} (token {}) committed at {} after attempt {} (token {}) registered at {r}",
                        older.attempt, older.token, older.committed_at, newer.attempt, newer.token
                    ));
                }
            }
        }
    }
    v
}

fn evaluate_hung(hung: &[HungTx], row: &mut Row) {
    row.hung = hung.len() as u64;
    row.hung_released = hung.iter().filter(|h| h.end == HungEnd::JobDeleted).count() as u64;
    if !hung.is_empty() {
        let ends: Vec<String> = hung
            .iter()
            .map(|h| format!("token {}: {:?}", h.token, h.end))
            .collect();
        row.notes.push(format!(
            "hung transactions ({} ended by their Job's deletion): {}",
            row.hung_released,
            ends.join("; ")
        ));
    }
}

/// What became of the prepared run of a period the harness acted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreparedFate {
    /// Its Job was marked withdrawn with this reason (and, like every withdrawn Job, never ran).
    Withdrawn(&'static str),
    /// Its Job is the one that ran: resumed at the instant, never withdrawn.
    Resumed,
    /// Either: a prepared Job of the period was resumed, or withdrawn (and the period decided as
    /// without preparation).
    ResumedOrWithdrawn,
}

/// How a period the harness acted on (an edit before its instant, a fault while it was
/// prepared) must have been decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// No Job of it ran; recorded with this outcome and reason.
    Recorded {
        outcome: &'static str,
        reason: &'static str,
    },
    /// No Job of it ran and no claim of it is live: the schedule no longer has it.
    NeverRun,
    /// Exactly one Job of it ran, built with this command (the template as edited).
    RanWith { command: String },
    /// Exactly one Job of it ran, let run no later than `within` after the period (by the API
    /// server's clock; never before it is `check_early`'s).
    RanWithin { within: Duration },
}

/// One period the harness acted on, and what must have become of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Expected {
    /// The SingletonJob's key ([`SjObservation::key`]).
    pub key: String,
    pub period: Timestamp,
    /// A prepared Job of the period existed (the watch saw one with `singleton.dev/resume-at`),
    /// and became this.
    pub prepared: PreparedFate,
    pub decision: Decision,
}

/// Judges each expected period against the observations: what is wrong, in words (empty: each
/// was decided as expected).
pub fn check_decisions(obs: &Observations, expected: &[Expected]) -> Vec<String> {
    let mut out = Vec::new();
    for e in expected {
        let Some(sj) = obs.sjs.iter().find(|s| s.key == e.key) else {
            out.push(format!("{}: not observed", e.key));
            continue;
        };
        let what = format!("{} period {}", e.key, e.period);
        let of_period: Vec<&JobSeen> = sj.jobs.iter().filter(|j| j.period == e.period).collect();
        let ran: Vec<&JobSeen> = of_period.iter().copied().filter(|j| j.ran).collect();
        check_fate(&what, e.prepared, &of_period, &ran, &mut out);
        match &e.decision {
            Decision::Recorded { outcome, reason } => {
                check_recorded(&what, sj, e.period, (*outcome, *reason), &ran, &mut out)
            }
            Decision::NeverRun => check_never_run(&what, sj, e.period, &ran, &mut out),
            Decision::RanWith { command } => check_ran_with(&what, command, &ran, &mut out),
            Decision::RanWithin { within } => {
                check_ran_within(&what, e.period, *within, &ran, &mut out)
            }
        }
    }
    out
}

/// [`Decision::Recorded`] for [`check_decisions`]: nothing of `period` ran (`ran`), and a
/// decision covering it recorded `outcome` for `reason`.
fn check_recorded(
    what: &str,
    sj: &SjObservation,
    period: Timestamp,
    (outcome, reason): (&str, &str),
    ran: &[&JobSeen],
    out: &mut Vec<String>,
) {
    if !ran.is_empty() {
        out.push(format!(
            "{what} ran ({}), expected recorded {outcome} ({reason})",
            names(ran)
        ));
    }
    let covering: Vec<&Recorded> = sj.recorded.iter().filter(|r| r.covers(period)).collect();
    if !covering
        .iter()
        .any(|r| r.outcome == outcome && r.reason == reason)
    {
        let got: Vec<String> = covering
            .iter()
            .map(|r| format!("{} ({})", r.outcome, r.reason))
            .collect();
        out.push(format!(
            "{what}: expected recorded {outcome} ({reason}), recorded {got:?}"
        ));
    }
}

/// [`Decision::NeverRun`] for [`check_decisions`]: nothing of `period` ran (`ran`), and no
/// claim of it is live.
fn check_never_run(
    what: &str,
    sj: &SjObservation,
    period: Timestamp,
    ran: &[&JobSeen],
    out: &mut Vec<String>,
) {
    if !ran.is_empty() {
        out.push(format!(
            "{what} ran ({}), but the schedule no longer had it",
            names(ran)
        ));
    }
    let live: Vec<u64> = sj
        .claims
        .iter()
        .filter(|c| c.period == period)
        .map(|c| c.token)
        .collect();
    if !live.is_empty() {
        out.push(format!(
            "{what}: the schedule no longer has it, but its claim is live (tokens {live:?})"
        ));
    }
}

/// [`Decision::RanWith`] for [`check_decisions`]: exactly one Job ran (`ran`), with `command`.
fn check_ran_with(what: &str, command: &str, ran: &[&JobSeen], out: &mut Vec<String>) {
    if ran.len() != 1 {
        out.push(format!(
            "{what}: {} Job(s) ran ({}), expected 1",
            ran.len(),
            names(ran)
        ));
    }
    for j in ran.iter().filter(|j| j.command.as_deref() != Some(command)) {
        out.push(format!(
            "{what}: Job {} ran with command {:?}, expected the edited template's {command:?}",
            describe(j),
            j.command
        ));
    }
}

/// [`Decision::RanWithin`] for [`check_decisions`]: exactly one Job ran (`ran`), let run no
/// later than `within` after `period`.
fn check_ran_within(
    what: &str,
    period: Timestamp,
    within: Duration,
    ran: &[&JobSeen],
    out: &mut Vec<String>,
) {
    if ran.len() != 1 {
        out.push(format!(
            "{what}: {} Job(s) ran ({}), expected 1",
            ran.len(),
            names(ran)
        ));
    }
    let bound = period + signed(within);
    for j in ran {
        match j.released {
            Some(r) if r > bound => out.push(format!(
                "{what}: Job {} let run at {r}, later than {} s after its instant",
                describe(j),
                secs(within)
            )),
            Some(_) => {}
            None => out.push(format!(
                "{what}: Job {} ran, but no release time was seen",
                describe(j)
            )),
        }
    }
}

/// The prepared Job's fate for [`check_decisions`]: `jobs` are the period's Jobs, `ran` those
/// that ran.
fn check_fate(
    what: &str,
    fate: PreparedFate,
    jobs: &[&JobSeen],
    ran: &[&JobSeen],
    out: &mut Vec<String>,
) {
    let prepared: Vec<&JobSeen> = jobs
        .iter()
        .copied()
        .filter(|j| j.resume_at.is_some())
        .collect();
    if prepared.is_empty() {
        out.push(format!(
            "{what}: no prepared Job of it was seen (none with singleton.dev/resume-at): the fault did not meet a prepared run"
        ));
        return;
    }
    let withdrawn: Vec<&str> = prepared
        .iter()
        .filter_map(|j| j.withdrawn.as_deref())
        .collect();
    let resumed = ran
        .iter()
        .any(|j| j.resume_at.is_some() && j.withdrawn.is_none());
    match fate {
        PreparedFate::Withdrawn(why) if !withdrawn.contains(&why) => out.push(format!(
            "{what}: its prepared Job was not withdrawn with reason {why} (withdrawn: {withdrawn:?})"
        )),
        PreparedFate::Resumed if !resumed || !withdrawn.is_empty() => out.push(format!(
            "{what}: its prepared Job was not the run (resumed: {resumed}, withdrawn: {withdrawn:?})"
        )),
        PreparedFate::ResumedOrWithdrawn if !resumed && withdrawn.is_empty() => out.push(format!(
            "{what}: its prepared Job was neither resumed nor withdrawn"
        )),
        _ => {}
    }
}

fn names(jobs: &[&JobSeen]) -> String {
    jobs.iter()
        .map(|j| describe(j))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parses the note of a `RunMissed`/`RunSkipped`/`RunDeduplicated` Event into the periods it
/// records: "period from P Missed: R" or "N periods through L from P Missed: R".
pub fn recorded_note(note: &str) -> Option<Recorded> {
    let (head, rest) = note.split_once(" from ")?;
    let mut words = rest.split_whitespace();
    let first: Timestamp = words.next()?.parse().ok()?;
    let outcome = words.next()?.trim_end_matches(':').to_string();
    let reason = rest
        .split_once(": ")
        .map_or(String::new(), |(_, r)| r.trim().to_string());
    let last = if head == "period" {
        first
    } else {
        head.split_once(" periods through ")?
            .1
            .trim()
            .parse()
            .ok()?
    };
    Some(Recorded {
        first,
        last,
        outcome,
        reason,
    })
}

/// Formats a duration as seconds with one decimal ("3.4 s").
pub fn secs(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}

fn or_na(v: Option<u64>) -> String {
    v.map_or("n/a".to_string(), |n| n.to_string())
}

/// The markdown table of `rows`, then each row's notes.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| scenario | fault | fault shown | periods due | due in fault | runs started | recorded (reason) | pending | Jobs per period (max) | duplicates | same-token re-creations | lost | runs without a claim | Jobs before their instant | non-monotonic tokens | writes accepted | stale writes accepted | stale writes refused | fresh writes refused | writes unavailable | attempts that committed per period (max) | overlapping committed attempts | suspended, removed unrun | withdrawn Jobs that ran | failover (s) |\n\
         | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    for r in rows {
        let failover = if r.failovers.is_empty() {
            "-".to_string()
        } else {
            r.failovers
                .iter()
                .map(|d| format!("{:.2}", d.as_secs_f64()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let cells: Vec<String> = vec![
            r.scenario.clone(),
            format!("{} s", secs(r.fault_window)),
            if r.fault_proven() { "yes" } else { "NO" }.to_string(),
            r.due.to_string(),
            r.due_in_fault.to_string(),
            r.started.to_string(),
            r.recorded.to_string(),
            r.pending.to_string(),
            r.jobs_per_period_max.to_string(),
            r.duplicates.to_string(),
            r.same_token.to_string(),
            r.lost.to_string(),
            r.unclaimed.to_string(),
            r.early.to_string(),
            r.non_monotonic.to_string(),
            r.writes_accepted.to_string(),
            r.stale_accepted.to_string(),
            r.stale_refused.to_string(),
            r.fresh_refused.to_string(),
            r.writes_unavailable.to_string(),
            or_na(r.attempts_max),
            or_na(r.attempts_overlapping),
            r.unrun_removed.to_string(),
            r.withdrawn_ran.to_string(),
            failover,
        ];
        out += &format!("| {} |\n", cells.join(" | "));
    }
    let noted: Vec<&Row> = rows.iter().filter(|r| !r.notes.is_empty()).collect();
    if !noted.is_empty() {
        out += "\nNotes:\n";
        for r in noted {
            for n in &r.notes {
                out += &format!("- {}: {n}\n", r.scenario);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn job(period: Timestamp, token: u64, uid: &str) -> JobSeen {
        JobSeen {
            uid: uid.into(),
            name: format!("a-{}", period.as_second()),
            period,
            token: Some(token),
            ran: true,
            removed: true,
            events_only: false,
            created: Some(period),
            ended: Some(period + SignedDuration::from_secs(1)),
            unreleased: false,
            released: Some(period),
            resume_at: None,
            withdrawn: None,
            command: None,
        }
    }

    /// What the tests' rows must show: the reasons of an outage, a period in the fault.
    fn expect() -> Expect {
        Expect {
            reasons: &["Superseded", "DeadlineExceeded"],
            min_due_in_fault: 1,
            ..Expect::default()
        }
    }

    fn eval(obs: &Observations) -> Row {
        evaluate("test", Duration::from_secs(4), &expect(), obs)
    }

    /// Periods every 2 s, 0..=10; each run with token period/2 + 1, its Job pruned since; the
    /// fault from t(4) to t(8), every SingletonJob running again at t(9); checked at t(14).
    fn healthy() -> Observations {
        let due: Vec<Timestamp> = (0..=5).map(|i| t(2 * i)).collect();
        let claims: Vec<Claim> = (0..=5)
            .map(|i| Claim {
                period: t(2 * i),
                token: i as u64 + 1,
            })
            .collect();
        let jobs = claims
            .iter()
            .map(|c| job(c.period, c.token, &format!("uid-{}", c.token)))
            .collect();
        let writes = claims
            .iter()
            .enumerate()
            .map(|(i, c)| Write {
                job: "ns/a".into(),
                period: c.period,
                token: c.token,
                held: false,
                result: WriteResult::Accepted { seq: i as i64 + 1 },
            })
            .collect();
        Observations {
            sjs: vec![SjObservation {
                key: "ns/a".into(),
                backstop: true,
                interval: Duration::from_secs(2),
                due,
                decided_through: Some(t(10)),
                claims,
                jobs,
                recorded: vec![],
            }],
            writes,
            failovers: vec![Duration::from_millis(3400)],
            fault: Some(FaultWindow {
                from: t(4),
                to: t(8),
                recovered: Some(t(9)),
            }),
            checked_at: Some(t(14)),
            settle: Duration::from_secs(3),
            proofs: vec![Proof::new(true, "the leader was seen stopped")],
            ..Observations::default()
        }
    }

    fn passes(row: &Row) -> bool {
        row.violations(expect()).is_empty()
    }

    fn fails_with(row: &Row, expect: Expect, what: &str) {
        let v = row.violations(expect);
        assert!(
            v.iter().any(|d| d.contains(what)),
            "expected a violation with {what:?}, got {v:?}"
        );
    }

    /// Takes period `p` out of the healthy observations: no claim, no Job, no write.
    fn without(obs: &mut Observations, p: Timestamp) {
        let sj = &mut obs.sjs[0];
        sj.claims.retain(|c| c.period != p);
        sj.jobs.retain(|j| j.period != p);
        obs.writes.retain(|w| w.period != p);
    }

    fn recorded(p: Timestamp, outcome: &str, reason: &str) -> Recorded {
        Recorded {
            first: p,
            last: p,
            outcome: outcome.into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn a_healthy_run_passes() {
        let row = eval(&healthy());
        assert_eq!((row.due, row.started, row.recorded), (6, 6, 0));
        assert_eq!(row.due_in_fault, 3);
        assert_eq!(
            (
                row.jobs_per_period_max,
                row.duplicates,
                row.same_token,
                row.lost,
                row.non_monotonic,
                row.stale_accepted,
                row.unclaimed,
                row.early
            ),
            (1, 0, 0, 0, 0, 0, 0, 0)
        );
        assert_eq!(row.writes_accepted, 6);
        assert_eq!((row.attempts_max, row.attempts_overlapping), (None, None));
        assert!(passes(&row), "{:?}", row.violations(expect()));
        assert!(row.fault_proven());
        // A pause scenario without a refused stale write fails: the checker is not vacuous.
        let pause = Expect {
            pause: true,
            ..expect()
        };
        fails_with(&row, pause, "refused no stale write");
    }

    #[test]
    fn two_job_uids_that_ran_for_one_period_fail() {
        let mut obs = healthy();
        // Period t(4) ran again in a second Job (its first was pruned) with a later token.
        obs.sjs[0].jobs.push(job(t(4), 9, "uid-again"));
        let row = eval(&obs);
        assert_eq!((row.jobs_per_period_max, row.same_token), (2, 0));
        assert!(row.duplicates >= 1);
        let v = row.violations(expect());
        assert!(
            v.iter()
                .any(|d| d.contains("uid-again") && d.contains("token 9"))
        );
        assert!(v.iter().any(|d| d.contains("Jobs per period (max) is 2")));
    }

    #[test]
    fn a_second_job_that_stayed_suspended_never_ran_and_passes() {
        let mut obs = healthy();
        // The same period's Job created again, suspended, and removed before it was resumed.
        let mut unrun = job(t(4), 3, "uid-suspended");
        unrun.ran = false;
        obs.sjs[0].jobs.push(unrun);
        let row = eval(&obs);
        assert_eq!((row.jobs_per_period_max, row.unrun_removed), (1, 1));
        assert!(passes(&row), "{:?}", row.violations(expect()));
    }

    #[test]
    fn the_same_token_recreated_is_counted_apart() {
        let mut obs = healthy();
        // Period t(6) (token 4) re-created under the same name and token after it was pruned: the
        // token-based checker saw one run, the uids show two.
        obs.sjs[0].jobs.push(job(t(6), 4, "uid-recreated"));
        let row = eval(&obs);
        assert_eq!((row.jobs_per_period_max, row.same_token), (2, 1));
        assert_eq!(row.non_monotonic, 0);
        let v = row.violations(expect());
        assert!(v.iter().any(|d| d.contains("1 same-token re-creations")));
        assert!(
            v.iter()
                .any(|d| d.contains("uid-4") && d.contains("uid-recreated"))
        );
    }

    #[test]
    fn a_job_known_only_from_events_still_counts() {
        let mut obs = healthy();
        obs.sjs[0].jobs.push(JobSeen {
            token: None,
            events_only: true,
            created: None,
            ended: None,
            unreleased: false,
            released: None,
            ..job(t(8), 0, "uid-from-events")
        });
        obs.events_only = vec!["a-1800000008 (uid uid-from-events)".into()];
        let row = eval(&obs);
        assert_eq!((row.jobs_per_period_max, row.same_token), (2, 0));
        assert!(!passes(&row));
        assert!(row.notes.iter().any(|n| n.contains("Events")));
    }

    #[test]
    fn a_job_started_before_its_release_fails() {
        let mut obs = healthy();
        obs.sjs[0].jobs[1].unreleased = true;
        fails_with(
            &eval(&obs),
            expect(),
            "ran while its singleton.dev/released annotation said false",
        );
    }

    #[test]
    fn a_job_without_its_annotations_fails() {
        let mut obs = healthy();
        obs.unattributed = vec!["stray (uid u-1)".into()];
        fails_with(
            &eval(&obs),
            expect(),
            "without their SingletonJob or period",
        );
    }

    #[test]
    fn a_period_claimed_twice_is_a_duplicate() {
        let mut obs = healthy();
        obs.sjs[0].claims.push(Claim {
            period: t(6),
            token: 20,
        });
        let row = eval(&obs);
        assert!(row.duplicates >= 1);
    }

    #[test]
    fn a_job_that_ran_with_another_token_than_its_claim_is_a_duplicate() {
        let mut obs = healthy();
        obs.writes.retain(|w| w.period != t(4));
        obs.sjs[0].jobs[2].token = Some(30);
        let row = eval(&obs);
        assert_eq!(row.duplicates, 1);
        assert!(!passes(&row));
    }

    #[test]
    fn a_run_without_its_claim_row_fails_where_there_is_a_backstop() {
        let mut obs = healthy();
        obs.sjs[0].claims.retain(|c| c.period != t(4));
        let row = eval(&obs);
        assert_eq!(row.unclaimed, 1);
        fails_with(
            &row,
            expect(),
            "period 2027-01-15T08:00:04Z ran without a claim row",
        );
        // Without a backstop there is no claim to have.
        obs.sjs[0].backstop = false;
        let row = eval(&obs);
        assert_eq!(row.unclaimed, 0);
        assert!(passes(&row), "{:?}", row.violations(expect()));
    }

    #[test]
    fn a_backstopped_singletonjob_whose_runs_have_no_claims_at_all_fails() {
        // Claims looked up under a key the controller does not write (namespace/name instead of
        // its jobKey): before, an empty lookup made every claim check pass.
        let mut obs = healthy();
        obs.sjs[0].claims.clear();
        let row = eval(&obs);
        assert_eq!(row.unclaimed, 6);
        fails_with(&row, expect(), "the claims table has no row under that key");
    }

    #[test]
    fn a_job_created_before_its_instant_fails() {
        let mut obs = healthy();
        // Created 1 s before its period by the API server's clock (a skewed leader started early).
        obs.sjs[0].jobs[3].created = Some(t(6) - SignedDuration::from_secs(1));
        let row = eval(&obs);
        assert_eq!(row.early, 1);
        fails_with(&row, expect(), "started early");
        // One not allowed to run does not count.
        let mut obs = healthy();
        let mut unrun = job(t(6), 4, "uid-early-unrun");
        unrun.ran = false;
        unrun.created = Some(t(6) - SignedDuration::from_secs(40));
        obs.sjs[0].jobs.push(unrun);
        assert_eq!(eval(&obs).early, 0);
    }

    #[test]
    fn where_the_fault_starts_jobs_its_early_start_of_a_prepared_job_is_the_faults_not_g4s() {
        // queue-resumer: something outside the controller cleared spec.suspend on a prepared
        // Job 3 s before its instant (its released mark still "false"), and it was stopped.
        let outside = Expect {
            outside_starts: true,
            ..expect()
        };
        let mut obs = healthy();
        let j = &mut obs.sjs[0].jobs[3];
        j.created = Some(t(6) - SignedDuration::from_secs(6));
        j.resume_at = Some(t(6));
        j.released = Some(t(6) - SignedDuration::from_secs(3));
        j.unreleased = true;
        let row = evaluate("test", Duration::from_secs(4), &outside, &obs);
        assert_eq!(row.early, 0, "{:?}", row.details);
        // The same start in a row whose fault starts nothing: early, and started outside.
        let row = eval(&obs);
        assert_eq!(row.early, 1);
        fails_with(&row, expect(), "started early");
        // Released early by the controller itself (its mark set): early in any row.
        obs.sjs[0].jobs[3].unreleased = false;
        let row = evaluate("test", Duration::from_secs(4), &outside, &obs);
        assert_eq!(row.early, 1);
        fails_with(&row, outside, "started early");
    }

    #[test]
    fn a_prepared_job_is_judged_by_its_release_not_its_creation() {
        // Created 6 s ahead by design, released at its instant: not early.
        let mut obs = healthy();
        let j = &mut obs.sjs[0].jobs[3];
        j.created = Some(t(6) - SignedDuration::from_secs(6));
        j.resume_at = Some(t(6));
        let row = eval(&obs);
        assert_eq!(row.early, 0, "{:?}", row.details);
        assert!(passes(&row), "{:?}", row.violations(expect()));
        // Released the second before its instant (the whole-second time shows it): early.
        obs.sjs[0].jobs[3].released = Some(t(6) - SignedDuration::from_secs(1));
        let row = eval(&obs);
        assert_eq!(row.early, 1);
        fails_with(&row, expect(), "released 2027-01-15T08:00:05Z");
        // Released on time but not prepared and created early: still early (its claim came
        // before the instant).
        let mut obs = healthy();
        obs.sjs[0].jobs[3].created = Some(t(5));
        fails_with(&eval(&obs), expect(), "created 2027-01-15T08:00:05Z");
        // A prepared Job seen running with no release time: noted, not judged.
        let mut obs = healthy();
        let j = &mut obs.sjs[0].jobs[3];
        j.created = Some(t(0));
        j.resume_at = Some(t(6));
        j.released = None;
        let row = eval(&obs);
        assert_eq!(row.early, 0);
        assert!(
            row.notes
                .iter()
                .any(|n| n.contains("without a release time")),
            "{:?}",
            row.notes
        );
    }

    #[test]
    fn a_withdrawn_job_that_ran_fails() {
        let mut obs = healthy();
        // A prepared Job of t(6) withdrawn and never run, the period then run by another Job.
        let mut gone = job(t(6), 4, "uid-withdrawn");
        gone.ran = false;
        gone.resume_at = Some(t(6));
        gone.withdrawn = Some("Suspended".into());
        obs.sjs[0].jobs.push(gone);
        let row = eval(&obs);
        assert_eq!((row.withdrawn, row.withdrawn_ran), (1, 0));
        assert!(passes(&row), "{:?}", row.violations(expect()));
        assert!(
            row.notes.iter().any(|n| n.contains("1 Suspended")),
            "{:?}",
            row.notes
        );
        // The withdrawn Job ran after all.
        obs.sjs[0].jobs.last_mut().unwrap().ran = true;
        let row = eval(&obs);
        assert_eq!(row.withdrawn_ran, 1);
        fails_with(&row, expect(), "1 withdrawn Jobs that ran");
        fails_with(&row, expect(), "uid-withdrawn");
    }

    #[test]
    fn each_acted_on_period_is_decided_as_expected() {
        let key = "ns/a".to_string();
        let prepared = |p: Timestamp, uid: &str, why: Option<&str>, ran: bool| JobSeen {
            ran,
            resume_at: Some(p),
            withdrawn: why.map(String::from),
            command: Some("old".into()),
            ..job(p, 50, uid)
        };
        let base = || {
            let mut obs = healthy();
            // t(4): suspended before its instant, its prepared Job withdrawn, recorded Skipped.
            without(&mut obs, t(4));
            let sj = &mut obs.sjs[0];
            sj.jobs.push(prepared(t(4), "p4", Some("Suspended"), false));
            sj.recorded.push(recorded(t(4), "Skipped", "Suspended"));
            // t(6): the template edited; its prepared Job withdrawn, the run has the new one.
            sj.jobs
                .push(prepared(t(6), "p6", Some("SpecChanged"), false));
            for j in sj.jobs.iter_mut().filter(|j| j.period == t(6) && j.ran) {
                j.command = Some("new".into());
            }
            // t(8): resumed at its instant (released 1 s after).
            for j in sj.jobs.iter_mut().filter(|j| j.period == t(8)) {
                j.resume_at = Some(t(8));
                j.released = Some(t(9));
            }
            // t(11): not the schedule's any more: withdrawn, never run, its claim archived.
            sj.jobs
                .push(prepared(t(11), "p11", Some("ScheduleChanged"), false));
            obs
        };
        let expected = vec![
            Expected {
                key: key.clone(),
                period: t(4),
                prepared: PreparedFate::Withdrawn("Suspended"),
                decision: Decision::Recorded {
                    outcome: "Skipped",
                    reason: "Suspended",
                },
            },
            Expected {
                key: key.clone(),
                period: t(6),
                prepared: PreparedFate::Withdrawn("SpecChanged"),
                decision: Decision::RanWith {
                    command: "new".into(),
                },
            },
            Expected {
                key: key.clone(),
                period: t(8),
                prepared: PreparedFate::Resumed,
                decision: Decision::RanWithin {
                    within: Duration::from_secs(2),
                },
            },
            Expected {
                key: key.clone(),
                period: t(11),
                prepared: PreparedFate::Withdrawn("ScheduleChanged"),
                decision: Decision::NeverRun,
            },
        ];
        assert_eq!(check_decisions(&base(), &expected), Vec::<String>::new());
        let fails = |obs: &Observations, what: &str| {
            let v = check_decisions(obs, &expected);
            assert!(
                v.iter().any(|d| d.contains(what)),
                "expected {what:?} in {v:?}"
            );
        };
        // The suspended period ran anyway (its prepared Job resumed by a stale leader).
        let mut obs = base();
        obs.sjs[0]
            .jobs
            .iter_mut()
            .filter(|j| j.uid == "p4")
            .for_each(|j| j.ran = true);
        fails(&obs, "ran (a-1800000004 (uid p4");
        // Recorded with another reason.
        let mut obs = base();
        obs.sjs[0].recorded.retain(|r| r.first != t(4));
        obs.sjs[0]
            .recorded
            .push(recorded(t(4), "Missed", "DeadlineExceeded"));
        fails(
            &obs,
            "expected recorded Skipped (Suspended), recorded [\"Missed (DeadlineExceeded)\"]",
        );
        // The old template ran.
        let mut obs = base();
        for j in obs.sjs[0]
            .jobs
            .iter_mut()
            .filter(|j| j.period == t(6) && j.ran)
        {
            j.command = Some("old".into());
        }
        fails(&obs, "expected the edited template's");
        // Released too late, or with no release time.
        let mut obs = base();
        for j in obs.sjs[0].jobs.iter_mut().filter(|j| j.period == t(8)) {
            j.released = Some(t(11));
        }
        fails(&obs, "later than 2.0 s after its instant");
        // The dropped instant's claim left live.
        let mut obs = base();
        obs.sjs[0].claims.push(Claim {
            period: t(11),
            token: 50,
        });
        fails(&obs, "its claim is live (tokens [50])");
        // No prepared Job at all: the edit met nothing prepared.
        let mut obs = base();
        obs.sjs[0].jobs.retain(|j| j.uid != "p11");
        fails(&obs, "no prepared Job of it was seen");
        // Withdrawn for another reason.
        let mut obs = base();
        obs.sjs[0]
            .jobs
            .iter_mut()
            .filter(|j| j.uid == "p6")
            .for_each(|j| j.withdrawn = Some("Superseded".into()));
        fails(&obs, "was not withdrawn with reason SpecChanged");
    }

    #[test]
    fn a_lost_period_is_told_from_a_recorded_and_a_pending_one() {
        let mut obs = healthy();
        // t(4) never ran and nothing says why; t(6) never ran, recorded Missed (Superseded) in
        // the fault; t(12) is due after decidedThrough and younger than the pending bound; t(8)
        // was claimed but its Job never ran (created suspended, then removed): not started.
        without(&mut obs, t(4));
        without(&mut obs, t(6));
        let sj = &mut obs.sjs[0];
        sj.jobs
            .iter_mut()
            .filter(|j| j.period == t(8))
            .for_each(|j| j.ran = false);
        sj.recorded.push(recorded(t(6), "Missed", "Superseded"));
        sj.due.push(t(12));
        let row = eval(&obs);
        assert_eq!(
            (row.due, row.started, row.recorded, row.pending, row.lost),
            (7, 3, 1, 1, 2)
        );
        assert_eq!((row.non_monotonic, row.unrun_removed), (0, 1));
        let v = row.violations(expect());
        assert!(v.iter().any(|d| d.contains("claimed with token [5]")));
    }

    #[test]
    fn a_period_pending_longer_than_settle_plus_interval_is_lost() {
        // decidedThrough stopped at t(6): t(8) and t(10) never ran. Checked at t(14), settle 3 s
        // and interval 2 s: pending only after t(9). Before the bound, both counted as pending.
        let mut obs = healthy();
        without(&mut obs, t(8));
        without(&mut obs, t(10));
        obs.sjs[0].decided_through = Some(t(6));
        let row = eval(&obs);
        assert_eq!((row.pending, row.lost), (1, 1));
        fails_with(&row, expect(), "beyond the pending bound of 5.0 s");
        // A controller that never sets decidedThrough gets no unbounded pending either.
        obs.sjs[0].decided_through = None;
        assert_eq!(eval(&obs).lost, 1);
        // Nor does a check without a time.
        obs.checked_at = None;
        let row = eval(&obs);
        assert_eq!((row.pending, row.lost), (0, 2));
    }

    #[test]
    fn a_claimed_period_whose_run_is_on_its_way_is_pending_within_the_bound() {
        // t(10) is decided and claimed (token 6), but its Job was not seen running by the check
        // at t(14): pending while younger than settle + interval (5 s), lost after.
        let mut obs = healthy();
        obs.sjs[0].jobs.retain(|j| j.period != t(10));
        let row = eval(&obs);
        assert_eq!((row.pending, row.lost), (1, 0), "{:?}", row.details);
        obs.checked_at = Some(t(16));
        let row = eval(&obs);
        assert_eq!((row.pending, row.lost), (0, 1));
        fails_with(
            &row,
            expect(),
            "claimed with token [6], but no Job of it ran",
        );
    }

    #[test]
    fn a_record_the_fault_does_not_explain_is_lost() {
        let base = {
            let mut obs = healthy();
            without(&mut obs, t(6));
            obs
        };
        // A reason the row's fault does not cause.
        let mut obs = base.clone();
        obs.sjs[0]
            .recorded
            .push(recorded(t(6), "Missed", "BackstopUnavailable"));
        let row = eval(&obs);
        assert_eq!((row.recorded, row.lost), (0, 1));
        fails_with(&row, expect(), "is not one this row's fault causes");
        // The right reason, for a period long before the fault.
        let mut obs = base.clone();
        obs.fault = Some(FaultWindow {
            from: t(20),
            to: t(30),
            recovered: Some(t(31)),
        });
        obs.sjs[0]
            .recorded
            .push(recorded(t(6), "Missed", "Superseded"));
        fails_with(&eval(&obs), expect(), "due outside the fault window");
        // A run recorded Failed without a Job (StartedBeforeConfirm for a Job the watch saw
        // never run) explains nothing either.
        let mut obs = base.clone();
        obs.sjs[0]
            .recorded
            .push(recorded(t(6), "Failed", "StartedBeforeConfirm"));
        fails_with(
            &eval(&obs),
            expect(),
            "outcome Failed is not one a period may have",
        );
        // Deduplicated explains no missing run.
        let mut obs = base.clone();
        obs.sjs[0]
            .recorded
            .push(recorded(t(6), "Deduplicated", "AlreadyClaimed"));
        fails_with(&eval(&obs), expect(), "Deduplicated explains no period");
        // The right reason inside the window: recorded.
        let mut obs = base;
        obs.sjs[0]
            .recorded
            .push(recorded(t(6), "Missed", "Superseded"));
        let row = eval(&obs);
        assert_eq!((row.recorded, row.lost), (1, 0));
        assert!(passes(&row), "{:?}", row.violations(expect()));
    }

    #[test]
    fn superseded_behind_a_run_still_active_is_corroborated_by_the_watch() {
        // t(6) never ran and is recorded Superseded, long before the fault: lost, unless the run
        // of t(4) was still active at t(6) by the watch (a slow run under Forbid).
        let mut obs = healthy();
        without(&mut obs, t(6));
        obs.fault = Some(FaultWindow {
            from: t(20),
            to: t(30),
            recovered: Some(t(31)),
        });
        obs.checked_at = Some(t(40));
        obs.sjs[0]
            .recorded
            .push(recorded(t(6), "Missed", "Superseded"));
        let row = eval(&obs);
        assert_eq!((row.recorded, row.lost), (0, 1));
        fails_with(
            &row,
            expect(),
            "no earlier run of it was active at its instant",
        );
        obs.sjs[0].jobs[2].ended = Some(t(7));
        let row = eval(&obs);
        assert_eq!((row.recorded, row.lost), (1, 0));
        assert!(
            row.notes
                .iter()
                .any(|n| n.contains("0 in the fault window, 1 behind a run still active")),
            "{:?}",
            row.notes
        );
        // Another reason gets no such help.
        obs.sjs[0].recorded[0].reason = "DeadlineExceeded".into();
        assert_eq!(eval(&obs).lost, 1);
    }

    #[test]
    fn tokens_must_strictly_increase_with_periods() {
        let mut obs = healthy();
        obs.sjs[0].claims[3].token = 3; // equal to the token of the period before
        obs.sjs[0].jobs[3].token = Some(3);
        obs.writes.retain(|w| w.period != t(6));
        let row = eval(&obs);
        assert_eq!(row.non_monotonic, 1);
        assert!(!passes(&row));
    }

    #[test]
    fn a_token_reused_without_a_backstop_is_out_of_order() {
        // No claims (no backstop); the status was wiped and tokens started again at 1.
        let mut obs = healthy();
        obs.sjs[0].backstop = false;
        obs.sjs[0].claims.clear();
        obs.sjs[0].jobs[4].token = Some(1);
        obs.writes.retain(|w| w.period != t(8));
        let row = eval(&obs);
        assert!(row.non_monotonic >= 1);
        assert!(!passes(&row));
    }

    fn write(period: Timestamp, token: u64, held: bool, result: WriteResult) -> Write {
        Write {
            job: "ns/a".into(),
            period,
            token,
            held,
            result,
        }
    }

    #[test]
    fn stale_writes_refused_and_accepted() {
        let pause = Expect {
            pause: true,
            ..expect()
        };
        let mut obs = healthy();
        // A held token refused: counted, and a pause scenario passes.
        obs.writes.push(write(t(2), 2, true, WriteResult::Refused));
        let row = eval(&obs);
        assert_eq!((row.stale_refused, row.stale_accepted), (1, 0));
        assert!(
            row.violations(pause).is_empty(),
            "{:?}",
            row.violations(pause)
        );
        // A held token accepted, and a lower token committed after a higher one: both stale.
        obs.writes
            .push(write(t(0), 1, true, WriteResult::Accepted { seq: 50 }));
        let row = eval(&obs);
        assert_eq!(row.stale_accepted, 2);
        assert!(!row.violations(pause).is_empty());
    }

    #[test]
    fn only_refusals_of_held_writes_count_as_stale_refused() {
        // A refused fresh write (the workload learnt of its run late) proves nothing about the
        // paused client: a pause scenario with only that fails.
        let pause = Expect {
            pause: true,
            ..expect()
        };
        let mut obs = healthy();
        obs.writes
            .push(write(t(10), 6, false, WriteResult::Refused));
        let row = eval(&obs);
        assert_eq!((row.stale_refused, row.fresh_refused), (0, 1));
        fails_with(&row, pause, "refused no stale write");
    }

    #[test]
    fn a_fence_that_refuses_every_token_or_a_workload_that_never_wrote_fails() {
        let mut obs = healthy();
        for w in &mut obs.writes {
            w.result = WriteResult::Refused;
        }
        let row = eval(&obs);
        assert_eq!((row.writes_accepted, row.fresh_refused), (0, 6));
        fails_with(&row, expect(), "committed no write at all");
        fails_with(&row, expect(), "none of its 6 fresh write(s) was accepted");
        let mut obs = healthy();
        obs.writes.clear();
        fails_with(&eval(&obs), expect(), "committed no write at all");
    }

    #[test]
    fn one_job_whose_fresh_writes_are_all_refused_fails_beside_a_healthy_one() {
        let mut obs = healthy();
        obs.writes.push(Write {
            job: "ns/b".into(),
            ..write(t(2), 1, false, WriteResult::Refused)
        });
        fails_with(&eval(&obs), expect(), "ns/b: none of its 1 fresh write(s)");
    }

    #[test]
    fn unavailable_writes_are_counted_and_rejections_fail() {
        let mut obs = healthy();
        obs.writes
            .push(write(t(10), 6, false, WriteResult::Unavailable));
        let row = eval(&obs);
        assert_eq!(row.writes_unavailable, 1);
        assert!(row.notes.iter().any(|n| n.contains("never reached")));
        assert!(passes(&row));
        obs.writes.push(write(
            t(10),
            6,
            false,
            WriteResult::Rejected {
                sqlstate: *b"SF003",
            },
        ));
        let row = eval(&obs);
        assert_eq!(row.writes_rejected, 1);
        fails_with(&row, expect(), "rejected by the fence with SQLSTATE SF003");
    }

    #[test]
    fn backstop_unavailable_fails_only_where_it_must_not_happen() {
        let db = Expect {
            reasons: &["Superseded", "DeadlineExceeded", "BackstopUnavailable"],
            ..expect()
        };
        let mut obs = healthy();
        without(&mut obs, t(6));
        obs.sjs[0]
            .recorded
            .push(recorded(t(6), "Missed", "BackstopUnavailable"));
        let row = evaluate("db", Duration::ZERO, &db, &obs);
        assert_eq!((row.recorded, row.backstop_missed, row.lost), (1, 1, 0));
        assert!(row.violations(db).is_empty(), "{:?}", row.violations(db));
        let strict = Expect {
            no_backstop_missed: true,
            ..db
        };
        assert!(!row.violations(strict).is_empty());
    }

    #[test]
    fn a_hung_transaction_must_be_ended_by_a_replace() {
        let expect = Expect {
            hung_replace: true,
            ..expect()
        };
        let mut obs = healthy();
        obs.hung = vec![HungTx {
            job: "ns/a".into(),
            token: 3,
            end: HungEnd::Healed,
        }];
        let row = eval(&obs);
        assert!(!row.violations(expect).is_empty());
        obs.hung.insert(
            0,
            HungTx {
                job: "ns/a".into(),
                token: 2,
                end: HungEnd::JobDeleted,
            },
        );
        let row = eval(&obs);
        assert_eq!((row.hung, row.hung_released), (2, 1));
        assert!(row.violations(expect).is_empty());
    }

    #[test]
    fn a_row_must_prove_its_fault_fired() {
        let mut obs = healthy();
        obs.proofs.clear();
        let row = eval(&obs);
        assert!(!row.fault_proven());
        fails_with(&row, expect(), "nothing shows that the fault fired");
        obs.proofs = vec![
            Proof::new(true, "kube-apiserver pid 10 replaced by pid 11"),
            Proof::new(false, "port 6443 never refused a connection"),
        ];
        let row = eval(&obs);
        assert!(!row.fault_proven());
        fails_with(&row, expect(), "fault not shown: port 6443 never refused");
    }

    #[test]
    fn periods_must_fall_due_inside_the_fault_window() {
        // A fault shorter than an interval: nothing fell due while it was on.
        let mut obs = healthy();
        obs.fault = Some(FaultWindow {
            from: t(4) + SignedDuration::from_millis(100),
            to: t(5),
            recovered: Some(t(5)),
        });
        let row = eval(&obs);
        assert_eq!(row.due_in_fault, 0);
        fails_with(
            &row,
            expect(),
            "0 period(s) fell due inside the fault window",
        );
        // More where the row's duration allows.
        let row = eval(&healthy());
        let more = Expect {
            min_due_in_fault: 4,
            ..expect()
        };
        fails_with(
            &row,
            more,
            "3 period(s) fell due inside the fault window, at least 4",
        );
        // No window at all.
        let mut obs = healthy();
        obs.fault = None;
        fails_with(&eval(&obs), expect(), "no fault window");
    }

    #[test]
    fn failovers_within_their_bound_and_as_many_as_the_fault_caused() {
        let row = eval(&healthy());
        let bounded = Expect {
            failover_max: Some(Duration::from_secs(6)),
            min_failovers: 1,
            ..expect()
        };
        assert!(row.violations(bounded).is_empty());
        let tight = Expect {
            failover_max: Some(Duration::from_secs(1)),
            ..bounded
        };
        fails_with(
            &row,
            tight,
            "a failover took 3.4 s, beyond the bound of 1.0 s",
        );
        let more = Expect {
            min_failovers: 2,
            ..bounded
        };
        fails_with(&row, more, "1 failover(s) measured, the fault must cause 2");
    }

    fn attempt(
        period: Timestamp,
        token: u64,
        id: &str,
        seq: i64,
        reg: i64,
        commit: i64,
    ) -> CommittedAttempt {
        CommittedAttempt {
            job: "ns/a".into(),
            period,
            token,
            attempt: id.into(),
            seq: Some(seq),
            registered_at: Some(t(reg)),
            committed_at: t(commit),
        }
    }

    #[test]
    fn attempts_one_per_period_and_never_overlapping() {
        let mut obs = healthy();
        obs.attempts = Some(
            (0..=5)
                .map(|i| {
                    attempt(
                        t(2 * i),
                        i as u64 + 1,
                        &format!("pod-{i}"),
                        1,
                        2 * i,
                        2 * i + 1,
                    )
                })
                .collect(),
        );
        let row = eval(&obs);
        assert_eq!(
            (row.attempts_max, row.attempts_overlapping),
            (Some(1), Some(0))
        );
        assert!(passes(&row), "{:?}", row.violations(expect()));

        // A second pod of the run of t(4) registered at 6 and committed at 7, after the first
        // (registered at 4) committed at 5: two attempts committed, no overlap.
        let mut two = obs.clone();
        two.attempts
            .as_mut()
            .unwrap()
            .push(attempt(t(4), 3, "pod-2b", 2, 6, 7));
        let row = eval(&two);
        assert_eq!(
            (row.attempts_max, row.attempts_overlapping),
            (Some(2), Some(0))
        );
        fails_with(
            &row,
            expect(),
            "attempts that committed per period (max) is 2",
        );

        // The first committed at 6, after the second registered at 5.5: overlapping.
        let mut overlap = obs.clone();
        let list = overlap.attempts.as_mut().unwrap();
        list.retain(|a| a.period != t(4));
        list.push(attempt(t(4), 3, "pod-old", 1, 4, 6));
        list.push(CommittedAttempt {
            registered_at: Some(t(5) + SignedDuration::from_millis(500)),
            ..attempt(t(4), 3, "pod-new", 2, 5, 8)
        });
        let row = eval(&overlap);
        assert_eq!(row.attempts_overlapping, Some(1));
        fails_with(&row, expect(), "1 overlapping committed attempts");
        fails_with(&row, expect(), "attempt pod-old (token 3) committed at");

        // Writes committed, attempts measured, but none recorded: the columns would be vacuous.
        let mut none = obs.clone();
        none.attempts = Some(Vec::new());
        let row = eval(&none);
        assert_eq!(row.attempts_max, Some(0));
        fails_with(&row, expect(), "no committed attempt was recorded");

        // Committed without a registration row.
        let mut unregistered = obs;
        unregistered.attempts.as_mut().unwrap()[0].registered_at = None;
        unregistered.attempts.as_mut().unwrap()[0].seq = None;
        fails_with(
            &eval(&unregistered),
            expect(),
            "committed without a registration row",
        );
    }

    #[test]
    fn event_notes_parse_into_ranges() {
        let p = |s: &str| s.parse::<Timestamp>().unwrap();
        assert_eq!(
            recorded_note("period from 2027-01-01T00:00:02Z Missed: Superseded"),
            Some(Recorded {
                first: p("2027-01-01T00:00:02Z"),
                last: p("2027-01-01T00:00:02Z"),
                outcome: "Missed".into(),
                reason: "Superseded".into(),
            })
        );
        assert_eq!(
            recorded_note(
                "4 periods through 2027-01-01T00:00:08Z from 2027-01-01T00:00:02Z Missed: DeadlineExceeded"
            ),
            Some(Recorded {
                first: p("2027-01-01T00:00:02Z"),
                last: p("2027-01-01T00:00:08Z"),
                outcome: "Missed".into(),
                reason: "DeadlineExceeded".into(),
            })
        );
        assert_eq!(
            recorded_note("period from 2027-01-01T00:00:02Z Deduplicated")
                .map(|r| (r.outcome, r.reason)),
            Some(("Deduplicated".into(), String::new()))
        );
        assert_eq!(recorded_note("Created Job a-1 for period x"), None);
    }

    #[test]
    fn the_table_has_a_row_per_scenario_and_the_new_columns() {
        let row = eval(&healthy());
        let text = table(&[row.clone(), row]);
        assert_eq!(text.lines().filter(|l| l.starts_with('|')).count(), 4);
        for col in [
            "| Jobs per period (max) |",
            "| same-token re-creations |",
            "| runs without a claim |",
            "| Jobs before their instant |",
            "| due in fault |",
            "| fault shown |",
            "| fresh writes refused |",
            "| writes unavailable |",
            "| attempts that committed per period (max) | overlapping committed attempts |",
            "| withdrawn Jobs that ran |",
        ] {
            assert!(text.contains(col), "{col} missing in {text}");
        }
        assert!(
            text.contains(
                "| test | 4.0 s | yes | 6 | 3 | 6 | 0 | 0 | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 6 | 0 | 0 | 0 | 0 | n/a | n/a | 0 | 0 | 3.40 |"
            ),
            "{text}"
        );
    }
}
