//! The checker: pure functions from what the outside world recorded (the backstop's claims table,
//! the Jobs, Events and status in the API server, the workload's fenced writes) to one row of the
//! chaos table. Nothing here trusts the controller's own logs or counters.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;

/// A row of the backstop's claims table.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    pub period: Timestamp,
    pub token: u64,
}

/// A Kubernetes Job of a run, from its annotations.
#[derive(Clone, Debug, PartialEq)]
pub struct RunJob {
    pub name: String,
    pub period: Timestamp,
    pub token: u64,
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
    pub jobs: Vec<RunJob>,
    /// Inclusive ranges of periods recorded with an outcome and a reason but no run (Missed,
    /// Skipped, Deduplicated), from Events and `status.history`.
    pub recorded: Vec<(Timestamp, Timestamp)>,
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

/// Everything one scenario observed.
#[derive(Clone, Debug, Default)]
pub struct Observations {
    pub sjs: Vec<SjObservation>,
    pub writes: Vec<Write>,
    /// From a fault that removed the leader to another replica holding the Lease.
    pub failovers: Vec<Duration>,
}

/// One row of the table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Row {
    pub scenario: String,
    pub fault_window: Duration,
    pub due: u64,
    pub started: u64,
    /// Due periods not started but recorded with an outcome and reason.
    pub recorded: u64,
    /// Due periods after `decidedThrough` at check time (neither started nor decided yet).
    pub pending: u64,
    pub duplicates: u64,
    pub lost: u64,
    pub non_monotonic: u64,
    pub stale_accepted: u64,
    pub stale_refused: u64,
    pub writes_accepted: u64,
    pub failovers: Vec<Duration>,
    /// Human-readable evidence of every duplicate, loss, order violation and accepted stale write.
    pub details: Vec<String>,
}

impl Row {
    /// What makes the scenario fail; empty when it passed. `pause`: a scenario whose workload
    /// holds tokens past a newer run, which must see its stale writes refused.
    pub fn violations(&self, pause: bool) -> Vec<String> {
        let mut v = Vec::new();
        for (what, n) in [
            ("duplicate runs", self.duplicates),
            ("lost periods", self.lost),
            ("non-monotonic tokens", self.non_monotonic),
            ("stale writes accepted", self.stale_accepted),
        ] {
            if n > 0 {
                v.push(format!("{}: {n} {what}", self.scenario));
            }
        }
        if self.started == 0 {
            v.push(format!("{}: no run started at all", self.scenario));
        }
        if pause && self.stale_refused == 0 {
            v.push(format!(
                "{}: a pause scenario refused no stale write",
                self.scenario
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

fn covered(ranges: &[(Timestamp, Timestamp)], t: Timestamp) -> bool {
    ranges.iter().any(|(a, b)| *a <= t && t <= *b)
}

/// Computes a scenario's row from its observations.
pub fn evaluate(scenario: &str, fault_window: Duration, obs: &Observations) -> Row {
    let mut row = Row {
        scenario: scenario.to_string(),
        fault_window,
        failovers: obs.failovers.clone(),
        ..Row::default()
    };
    for sj in &obs.sjs {
        evaluate_sj(sj, &mut row);
    }
    evaluate_writes(&obs.writes, &mut row);
    row
}

fn evaluate_sj(sj: &SjObservation, row: &mut Row) {
    // Duplicates: a period claimed twice, two Jobs (tokens) for one period, or a Job whose token
    // is not its period's claim.
    let mut claims_by_period: BTreeMap<Timestamp, Vec<u64>> = BTreeMap::new();
    for c in &sj.claims {
        claims_by_period.entry(c.period).or_default().push(c.token);
    }
    let mut jobs_by_period: BTreeMap<Timestamp, BTreeSet<u64>> = BTreeMap::new();
    for j in &sj.jobs {
        jobs_by_period.entry(j.period).or_default().insert(j.token);
    }
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
    for (p, tokens) in &jobs_by_period {
        let mut all: BTreeSet<u64> = tokens.clone();
        if let Some(c) = claims_by_period.get(p) {
            all.extend(c.iter().copied());
        }
        if all.len() > 1 {
            row.duplicates += all.len() as u64 - 1;
            row.details
                .push(format!("{} period {p} ran with tokens {all:?}", sj.key));
        }
    }

    // Tokens strictly increase with the period (one token per period: the claim's, else the
    // Job's).
    let mut token_of: BTreeMap<Timestamp, u64> = BTreeMap::new();
    for j in &sj.jobs {
        token_of.entry(j.period).or_insert(j.token);
    }
    for (p, tokens) in &claims_by_period {
        if let Some(t) = tokens.iter().min() {
            token_of.insert(*p, *t);
        }
    }
    let mut last: Option<(Timestamp, u64)> = None;
    for (p, t) in &token_of {
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

    // Every due period: started, recorded with a reason, still pending, or lost.
    for p in &sj.due {
        row.due += 1;
        if token_of.contains_key(p) {
            row.started += 1;
        } else if covered(&sj.recorded, *p) {
            row.recorded += 1;
        } else if sj.decided_through.is_none_or(|d| *p > d) {
            row.pending += 1;
        } else {
            row.lost += 1;
            row.details.push(format!(
                "{} period {p} due, no run and no recorded reason",
                sj.key
            ));
        }
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

/// Parses the note of a `RunMissed`/`RunSkipped`/`RunDeduplicated` Event into the inclusive range
/// of periods it records: "period from P Missed: R" or "N periods through L from P Missed: R".
pub fn recorded_range(note: &str) -> Option<(Timestamp, Timestamp)> {
    let (head, rest) = note.split_once(" from ")?;
    let first: Timestamp = rest.split_whitespace().next()?.parse().ok()?;
    if head == "period" {
        return Some((first, first));
    }
    let last: Timestamp = head
        .split_once(" periods through ")?
        .1
        .trim()
        .parse()
        .ok()?;
    Some((first, last))
}

/// Formats a duration as seconds with one decimal ("3.4 s").
pub fn secs(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}

/// The markdown table of `rows`.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| scenario | fault | periods due | runs started | recorded (reason) | pending | duplicates | lost | non-monotonic tokens | stale writes accepted | stale writes refused | failover (s) |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
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
            "| {} | {} s | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.scenario,
            secs(r.fault_window),
            r.due,
            r.started,
            r.recorded,
            r.pending,
            r.duplicates,
            r.lost,
            r.non_monotonic,
            r.stale_accepted,
            r.stale_refused,
            failover
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    /// Periods every 2 s, 0..=10; each run with token period/2 + 1.
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
            .map(|c| RunJob {
                name: format!("a-{}", c.period.as_second()),
                period: c.period,
                token: c.token,
            })
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
        }
    }

    #[test]
    fn a_healthy_run_passes() {
        let row = evaluate("healthy", Duration::from_secs(10), &healthy());
        assert_eq!((row.due, row.started, row.recorded), (6, 6, 0));
        assert_eq!(
            (
                row.duplicates,
                row.lost,
                row.non_monotonic,
                row.stale_accepted
            ),
            (0, 0, 0, 0)
        );
        assert!(
            row.violations(false).is_empty(),
            "{:?}",
            row.violations(false)
        );
        // A pause scenario without a refused stale write fails: the checker is not vacuous.
        assert!(!row.violations(true).is_empty());
    }

    #[test]
    fn a_duplicate_is_counted_from_the_jobs_and_from_the_writes() {
        let mut obs = healthy();
        // Period t(4) ran a second time with a later token, seen as a Job and a write.
        obs.sjs[0].jobs.push(RunJob {
            name: "a-other".into(),
            period: t(4),
            token: 9,
        });
        obs.writes.push(Write {
            job: "ns/a".into(),
            period: t(4),
            token: 9,
            held: false,
            result: WriteResult::Accepted { seq: 100 },
        });
        let row = evaluate("dup", Duration::ZERO, &obs);
        assert_eq!(row.duplicates, 2);
        assert!(!row.violations(false).is_empty());
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
    fn a_lost_period_is_told_from_a_recorded_and_a_pending_one() {
        let mut obs = healthy();
        let sj = &mut obs.sjs[0];
        // t(4) never ran and nothing says why; t(6) never ran, recorded Missed; t(12) is due but
        // after decidedThrough.
        sj.claims.retain(|c| c.period != t(4) && c.period != t(6));
        sj.jobs.retain(|j| j.period != t(4) && j.period != t(6));
        sj.recorded.push((t(6), t(6)));
        sj.due.push(t(12));
        obs.writes.clear();
        let row = evaluate("lost", Duration::ZERO, &obs);
        assert_eq!(
            (row.due, row.started, row.recorded, row.pending, row.lost),
            (7, 4, 1, 1, 1)
        );
        assert_eq!(row.non_monotonic, 0);
        assert!(!row.violations(false).is_empty());
    }

    #[test]
    fn tokens_must_strictly_increase_with_periods() {
        let mut obs = healthy();
        obs.sjs[0].claims[3].token = 3; // equal to the token of the period before
        obs.sjs[0].jobs[3].token = 3;
        obs.writes.clear();
        let row = evaluate("order", Duration::ZERO, &obs);
        assert_eq!(row.non_monotonic, 1);
        assert!(!row.violations(false).is_empty());
    }

    #[test]
    fn stale_writes_refused_and_accepted() {
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
            row.violations(true).is_empty(),
            "{:?}",
            row.violations(true)
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
        assert!(!row.violations(true).is_empty());
    }

    #[test]
    fn event_notes_parse_into_ranges() {
        assert_eq!(
            recorded_range("period from 2027-01-01T00:00:02Z Missed: Superseded"),
            Some((
                "2027-01-01T00:00:02Z".parse().unwrap(),
                "2027-01-01T00:00:02Z".parse().unwrap()
            ))
        );
        assert_eq!(
            recorded_range(
                "4 periods through 2027-01-01T00:00:08Z from 2027-01-01T00:00:02Z Missed: DeadlineExceeded"
            ),
            Some((
                "2027-01-01T00:00:02Z".parse().unwrap(),
                "2027-01-01T00:00:08Z".parse().unwrap()
            ))
        );
        assert_eq!(recorded_range("Created Job a-1 for period x"), None);
    }

    #[test]
    fn the_table_has_a_row_per_scenario() {
        let row = evaluate("healthy", Duration::from_secs(10), &healthy());
        let text = table(&[row.clone(), row]);
        assert_eq!(text.lines().count(), 4);
        assert!(text.contains("| healthy | 10.0 s | 6 | 6 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 3.40 |"));
    }
}
