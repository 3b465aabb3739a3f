//! The checker: pure functions from what the outside world recorded (the backstop's claims table,
//! the Jobs as a watch of the API server saw them, Events and status, the workload's fenced
//! writes) to one row of the chaos table. Nothing here trusts the controller's own logs or
//! counters.
//!
//! Runs are counted as users count them (DESIGN.md G1): by Job uid, not by token, and only Jobs
//! that were ever allowed to run pods. A Job created suspended and removed before it was resumed
//! never ran; it is reported, not counted.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;

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
}

/// Periods recorded with an outcome and a reason but no run (Missed, Skipped, Deduplicated),
/// inclusive, from an Event or `status.history`.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    pub first: Timestamp,
    pub last: Timestamp,
    /// `Missed`, `Skipped`, `Deduplicated`.
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
    /// `namespace/name`.
    pub key: String,
    /// The scheduled instants that fell due inside the observation window.
    pub due: Vec<Timestamp>,
    /// `status.decidedThrough`: periods after it are still undecided (pending), not lost.
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
    /// Refused by `singleton_fence` (SQLSTATE SF001, or 40001).
    Refused,
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
}

/// One row of the table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    pub scenario: String,
    pub fault_window: Duration,
    pub due: u64,
    /// Due periods with a Job that ran.
    pub started: u64,
    /// Due periods not started but recorded with an outcome and reason.
    pub recorded: u64,
    /// Due periods after `decidedThrough` at check time (neither started nor decided yet).
    pub pending: u64,
    /// Max over (SingletonJob, period) of the Job uids that ran: at most 1 (G1).
    pub jobs_per_period_max: u64,
    pub duplicates: u64,
    /// (SingletonJob, period, token) that ran in more than one Job uid: 0 (G3: a decided period's
    /// token never starts a Job again).
    pub same_token: u64,
    pub lost: u64,
    pub non_monotonic: u64,
    pub stale_accepted: u64,
    pub stale_refused: u64,
    pub writes_accepted: u64,
    /// Jobs created suspended and removed without ever being allowed to run (informational).
    pub unrun_removed: u64,
    /// Due periods recorded Missed with reason BackstopUnavailable.
    pub backstop_missed: u64,
    pub hung: u64,
    /// Hung transactions ended because their Job was deleted.
    pub hung_released: u64,
    pub failovers: Vec<Duration>,
    /// Human-readable evidence of every violation.
    pub details: Vec<String>,
    /// What a reader should know but is no failure (watch relists, Jobs known only from Events).
    pub notes: Vec<String>,
}

impl Row {
    /// What makes the scenario fail; empty when it passed.
    pub fn violations(&self, expect: Expect) -> Vec<String> {
        let mut v = Vec::new();
        for (what, n) in [
            ("duplicate runs", self.duplicates),
            ("same-token re-creations", self.same_token),
            ("lost periods", self.lost),
            ("non-monotonic tokens", self.non_monotonic),
            ("stale writes accepted", self.stale_accepted),
        ] {
            if n > 0 {
                v.push(format!("{}: {n} {what}", self.scenario));
            }
        }
        if self.jobs_per_period_max > 1 {
            v.push(format!(
                "{}: Jobs per period (max) is {}, at most 1 may run",
                self.scenario, self.jobs_per_period_max
            ));
        }
        if self.started == 0 {
            v.push(format!("{}: no run started at all", self.scenario));
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
        v.extend(
            self.details
                .iter()
                .map(|d| format!("{}: {d}", self.scenario)),
        );
        v
    }
}

/// Computes a scenario's row from its observations.
pub fn evaluate(scenario: &str, fault_window: Duration, obs: &Observations) -> Row {
    evaluate_tokens(scenario, fault_window, obs, true)
}

/// [`evaluate`], with the check that tokens rise with the period (`period_order`) optional:
/// several clusters claiming one job's periods each claim in their own order (super::dr_check).
pub fn evaluate_tokens(
    scenario: &str,
    fault_window: Duration,
    obs: &Observations,
    period_order: bool,
) -> Row {
    let mut row = Row {
        scenario: scenario.to_string(),
        fault_window,
        failovers: obs.failovers.clone(),
        ..Row::default()
    };
    for sj in &obs.sjs {
        evaluate_sj(sj, &mut row, period_order);
    }
    evaluate_writes(&obs.writes, &mut row);
    evaluate_hung(&obs.hung, &mut row);
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
    row
}

fn describe(j: &JobSeen) -> String {
    let token = j.token.map_or("?".to_string(), |t| t.to_string());
    let from = if j.events_only { ", Events only" } else { "" };
    format!("{} (uid {}, token {token}{from})", j.name, j.uid)
}

fn evaluate_sj(sj: &SjObservation, row: &mut Row, period_order: bool) {
    let mut claims_by_period: BTreeMap<Timestamp, Vec<u64>> = BTreeMap::new();
    for c in &sj.claims {
        claims_by_period.entry(c.period).or_default().push(c.token);
    }
    // Only Jobs that ran count; a uid appears once whatever the sources said.
    let mut ran_by_period: BTreeMap<Timestamp, BTreeMap<&str, &JobSeen>> = BTreeMap::new();
    let mut unrun_left = 0;
    for j in &sj.jobs {
        if j.ran {
            ran_by_period.entry(j.period).or_default().insert(&j.uid, j);
        } else if j.removed {
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

    // Duplicates: a period claimed twice, two Job uids that ran for one period, or the one Job
    // that ran carrying a token that is not its period's claim.
    for (p, tokens) in &claims_by_period {
        if tokens.len() > 1 {
            row.duplicates += tokens.len() as u64 - 1;
            row.details.push(format!(
                "{} period {p} claimed {} times",
                sj.key,
                tokens.len()
            ));
        }
    }
    for (p, jobs) in &ran_by_period {
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
        if n == 1
            && let Some(claimed) = claims_by_period.get(p)
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

    // Tokens strictly increase with the period (one token per period: the claim's, else the
    // lowest of its Jobs that ran). A token reused by a later period shows here too.
    let mut token_of: BTreeMap<Timestamp, u64> = BTreeMap::new();
    for (p, jobs) in &ran_by_period {
        if let Some(t) = jobs.values().filter_map(|j| j.token).min() {
            token_of.insert(*p, t);
        }
    }
    for (p, tokens) in &claims_by_period {
        if let Some(t) = tokens.iter().min() {
            token_of.insert(*p, *t);
        }
    }
    let mut last: Option<(Timestamp, u64)> = None;
    for (p, t) in token_of.iter().filter(|_| period_order) {
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

    // Every due period: started (a Job ran), recorded with a reason, still pending, or lost.
    let mut backstop_missed = Vec::new();
    for p in &sj.due {
        row.due += 1;
        if ran_by_period.contains_key(p) {
            row.started += 1;
        } else if sj.recorded.iter().any(|r| r.covers(*p)) {
            row.recorded += 1;
            if sj
                .recorded
                .iter()
                .any(|r| r.covers(*p) && r.reason == "BackstopUnavailable")
            {
                backstop_missed.push(*p);
            }
        } else if sj.decided_through.is_none_or(|d| *p > d) {
            row.pending += 1;
        } else {
            row.lost += 1;
            let claimed = claims_by_period
                .get(p)
                .map(|t| format!(" (claimed with token {t:?}, but no Job of it ran)"))
                .unwrap_or_default();
            row.details.push(format!(
                "{} period {p} due, no run and no recorded reason{claimed}",
                sj.key
            ));
        }
    }
    if let (Some(first), Some(last)) = (backstop_missed.first(), backstop_missed.last()) {
        row.backstop_missed += backstop_missed.len() as u64;
        row.notes.push(format!(
            "{}: {} due period(s) from {first} through {last} recorded Missed (BackstopUnavailable)",
            sj.key,
            backstop_missed.len()
        ));
    }
}

fn evaluate_writes(writes: &[Write], row: &mut Row) {
    let mut accepted: BTreeMap<&str, Vec<(i64, u64, Timestamp)>> = BTreeMap::new();
    let mut tokens_per_period: BTreeMap<(&str, Timestamp), BTreeSet<u64>> = BTreeMap::new();
    for w in writes {
        match w.result {
            WriteResult::Accepted { seq } => {
                row.writes_accepted += 1;
                accepted
                    .entry(&w.job)
                    .or_default()
                    .push((seq, w.token, w.period));
                tokens_per_period
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
            WriteResult::Refused => row.stale_refused += 1,
            WriteResult::Unavailable => {}
        }
    }
    // In commit order, a job's accepted tokens never go down: a lower one after a higher one is
    // a stale write the fence let through.
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
    // Two runs' writes for one period are a duplicate run seen by the resource itself.
    for ((job, period), tokens) in tokens_per_period {
        if tokens.len() > 1 {
            row.duplicates += tokens.len() as u64 - 1;
            row.details.push(format!(
                "{job} period {period}: writes committed with tokens {tokens:?}"
            ));
        }
    }
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

/// The markdown table of `rows`, then each row's notes.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| scenario | fault | periods due | runs started | recorded (reason) | pending | Jobs per period (max) | duplicates | same-token re-creations | lost | non-monotonic tokens | stale writes accepted | stale writes refused | suspended, removed unrun | failover (s) |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
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
        out += &format!(
            "| {} | {} s | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.scenario,
            secs(r.fault_window),
            r.due,
            r.started,
            r.recorded,
            r.pending,
            r.jobs_per_period_max,
            r.duplicates,
            r.same_token,
            r.lost,
            r.non_monotonic,
            r.stale_accepted,
            r.stale_refused,
            r.unrun_removed,
            failover
        );
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
        }
    }

    /// Periods every 2 s, 0..=10; each run with token period/2 + 1, its Job pruned since.
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
                due,
                decided_through: Some(t(10)),
                claims,
                jobs,
                recorded: vec![],
            }],
            writes,
            failovers: vec![Duration::from_millis(3400)],
            ..Observations::default()
        }
    }

    fn passes(row: &Row) -> bool {
        row.violations(Expect::default()).is_empty()
    }

    #[test]
    fn a_healthy_run_passes() {
        let row = evaluate("healthy", Duration::from_secs(10), &healthy());
        assert_eq!((row.due, row.started, row.recorded), (6, 6, 0));
        assert_eq!(
            (
                row.jobs_per_period_max,
                row.duplicates,
                row.same_token,
                row.lost,
                row.non_monotonic,
                row.stale_accepted
            ),
            (1, 0, 0, 0, 0, 0)
        );
        assert!(passes(&row), "{:?}", row.violations(Expect::default()));
        // A pause scenario without a refused stale write fails: the checker is not vacuous.
        let pause = Expect {
            pause: true,
            ..Expect::default()
        };
        assert!(!row.violations(pause).is_empty());
    }

    #[test]
    fn two_job_uids_that_ran_for_one_period_fail() {
        let mut obs = healthy();
        obs.writes.clear();
        // Period t(4) ran again in a second Job (its first was pruned) with a later token.
        obs.sjs[0].jobs.push(job(t(4), 9, "uid-again"));
        let row = evaluate("dup", Duration::ZERO, &obs);
        assert_eq!((row.jobs_per_period_max, row.same_token), (2, 0));
        assert!(row.duplicates >= 1);
        let v = row.violations(Expect::default());
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
        let row = evaluate("suspended", Duration::ZERO, &obs);
        assert_eq!((row.jobs_per_period_max, row.unrun_removed), (1, 1));
        assert!(passes(&row), "{:?}", row.violations(Expect::default()));
    }

    #[test]
    fn the_same_token_recreated_is_counted_apart() {
        let mut obs = healthy();
        obs.writes.clear();
        // Period t(6) (token 4) re-created under the same name and token after it was pruned: the
        // token-based checker saw one run, the uids show two.
        obs.sjs[0].jobs.push(job(t(6), 4, "uid-recreated"));
        let row = evaluate("same-token", Duration::ZERO, &obs);
        assert_eq!((row.jobs_per_period_max, row.same_token), (2, 1));
        assert_eq!(row.non_monotonic, 0);
        let v = row.violations(Expect::default());
        assert!(v.iter().any(|d| d.contains("1 same-token re-creations")));
        assert!(
            v.iter()
                .any(|d| d.contains("uid-4") && d.contains("uid-recreated"))
        );
    }

    #[test]
    fn a_job_known_only_from_events_still_counts() {
        let mut obs = healthy();
        obs.writes.clear();
        obs.sjs[0].jobs.push(JobSeen {
            token: None,
            events_only: true,
            ..job(t(8), 0, "uid-from-events")
        });
        obs.events_only = vec!["a-1800000008 (uid uid-from-events)".into()];
        let row = evaluate("events", Duration::ZERO, &obs);
        assert_eq!((row.jobs_per_period_max, row.same_token), (2, 0));
        assert!(!passes(&row));
        assert!(row.notes.iter().any(|n| n.contains("Events")));
    }

    #[test]
    fn a_period_claimed_twice_is_a_duplicate() {
        let mut obs = healthy();
        obs.sjs[0].claims.push(Claim {
            period: t(6),
            token: 20,
        });
        let row = evaluate("dup-claim", Duration::ZERO, &obs);
        assert!(row.duplicates >= 1);
    }

    #[test]
    fn a_job_that_ran_without_its_claim_is_a_duplicate() {
        let mut obs = healthy();
        obs.writes.clear();
        obs.sjs[0].jobs[2].token = Some(30);
        let row = evaluate("foreign", Duration::ZERO, &obs);
        assert_eq!(row.duplicates, 1);
        assert!(!passes(&row));
    }

    #[test]
    fn a_lost_period_is_told_from_a_recorded_and_a_pending_one() {
        let mut obs = healthy();
        let sj = &mut obs.sjs[0];
        // t(4) never ran and nothing says why; t(6) never ran, recorded Missed; t(12) is due but
        // after decidedThrough; t(8) was claimed but its Job never ran (created suspended, then
        // removed): not started.
        sj.claims.retain(|c| c.period != t(4) && c.period != t(6));
        sj.jobs.retain(|j| j.period != t(4) && j.period != t(6));
        sj.jobs
            .iter_mut()
            .filter(|j| j.period == t(8))
            .for_each(|j| j.ran = false);
        sj.recorded.push(Recorded {
            first: t(6),
            last: t(6),
            outcome: "Missed".into(),
            reason: "Superseded".into(),
        });
        sj.due.push(t(12));
        obs.writes.clear();
        let row = evaluate("lost", Duration::ZERO, &obs);
        assert_eq!(
            (row.due, row.started, row.recorded, row.pending, row.lost),
            (7, 3, 1, 1, 2)
        );
        assert_eq!((row.non_monotonic, row.unrun_removed), (0, 1));
        let v = row.violations(Expect::default());
        assert!(v.iter().any(|d| d.contains("claimed with token [5]")));
    }

    #[test]
    fn tokens_must_strictly_increase_with_periods() {
        let mut obs = healthy();
        obs.sjs[0].claims[3].token = 3; // equal to the token of the period before
        obs.sjs[0].jobs[3].token = Some(3);
        obs.writes.clear();
        let row = evaluate("order", Duration::ZERO, &obs);
        assert_eq!(row.non_monotonic, 1);
        assert!(!passes(&row));
    }

    #[test]
    fn a_token_reused_without_a_backstop_is_out_of_order() {
        // No claims (no backstop); the status was wiped and tokens started again at 1.
        let mut obs = healthy();
        obs.writes.clear();
        obs.sjs[0].claims.clear();
        obs.sjs[0].jobs[4].token = Some(1);
        let row = evaluate("reuse", Duration::ZERO, &obs);
        assert!(row.non_monotonic >= 1);
        assert!(!passes(&row));
    }

    #[test]
    fn stale_writes_refused_and_accepted() {
        let pause = Expect {
            pause: true,
            ..Expect::default()
        };
        let mut obs = healthy();
        // A held token refused: counted, and a pause scenario passes.
        obs.writes.push(Write {
            job: "ns/a".into(),
            period: t(2),
            token: 2,
            held: true,
            result: WriteResult::Refused,
        });
        let row = evaluate("pause", Duration::ZERO, &obs);
        assert_eq!((row.stale_refused, row.stale_accepted), (1, 0));
        assert!(
            row.violations(pause).is_empty(),
            "{:?}",
            row.violations(pause)
        );
        // A held token accepted, and a lower token committed after a higher one: both stale.
        obs.writes.push(Write {
            job: "ns/a".into(),
            period: t(0),
            token: 1,
            held: true,
            result: WriteResult::Accepted { seq: 50 },
        });
        let row = evaluate("pause", Duration::ZERO, &obs);
        assert_eq!(row.stale_accepted, 2);
        assert!(!row.violations(pause).is_empty());
    }

    #[test]
    fn backstop_unavailable_fails_only_where_it_must_not_happen() {
        let mut obs = healthy();
        let sj = &mut obs.sjs[0];
        sj.claims.retain(|c| c.period != t(6));
        sj.jobs.retain(|j| j.period != t(6));
        sj.recorded.push(Recorded {
            first: t(6),
            last: t(6),
            outcome: "Missed".into(),
            reason: "BackstopUnavailable".into(),
        });
        obs.writes.clear();
        let row = evaluate("hung", Duration::ZERO, &obs);
        assert_eq!((row.recorded, row.backstop_missed, row.lost), (1, 1, 0));
        assert!(passes(&row));
        let strict = Expect {
            no_backstop_missed: true,
            ..Expect::default()
        };
        assert!(!row.violations(strict).is_empty());
    }

    #[test]
    fn a_hung_transaction_must_be_ended_by_a_replace() {
        let expect = Expect {
            hung_replace: true,
            ..Expect::default()
        };
        let mut obs = healthy();
        obs.hung = vec![HungTx {
            job: "ns/a".into(),
            token: 3,
            end: HungEnd::Healed,
        }];
        let row = evaluate("hung", Duration::ZERO, &obs);
        assert!(!row.violations(expect).is_empty());
        obs.hung.insert(
            0,
            HungTx {
                job: "ns/a".into(),
                token: 2,
                end: HungEnd::JobDeleted,
            },
        );
        let row = evaluate("hung", Duration::ZERO, &obs);
        assert_eq!((row.hung, row.hung_released), (2, 1));
        assert!(row.violations(expect).is_empty());
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
        let row = evaluate("healthy", Duration::from_secs(10), &healthy());
        let text = table(&[row.clone(), row]);
        assert_eq!(text.lines().count(), 4);
        assert!(text.contains("| Jobs per period (max) |"));
        assert!(text.contains("| same-token re-creations |"));
        assert!(
            text.contains(
                "| healthy | 10.0 s | 6 | 6 | 0 | 0 | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 3.40 |"
            ),
            "{text}"
        );
    }
}
