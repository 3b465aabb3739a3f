//! What `kubectl singleton rerun NAME --period T [--replace]` may re-run: the refusal rules,
//! pure (the controller gathers the records, [`crate::operate`] applies these rules, and the run
//! goes through the claim like any other, [`crate::run`]).
//!
//! A re-run runs a decided period again: the same period and idempotency key as its earlier run,
//! a new token above every token issued before (which fences the earlier run out), and a Job
//! name of its own ([`crate::naming::rerun_job_name`]). It is refused, with what to do instead,
//! when the period
//!
//! 1. is not an instant of the schedule (a manual period, a typo, an instant of an earlier
//!    schedule): `trigger` runs outside the schedule;
//! 2. lies in the future, or is not decided yet: the schedule runs it when it falls due;
//! 3. was never decided (no history entry, no Job and no backstop claim records it): nothing ran,
//!    so there is nothing to re-run; `backfill` runs a period that never ran;
//! 4. still has its run active, unless `--replace`: then that run is fenced and deleted first,
//!    as `concurrencyPolicy: Replace` does.

use jiff::{SignedDuration, Timestamp};

use crate::api::{RunRef, SingletonJobStatus};
use crate::naming::{is_manual, period_rfc3339};
use crate::schedule::Schedule;

/// Rules 1 and 2, which need neither the status's records nor the backstop: `period` is an
/// instant of `schedule`, at or before `now` and at or before the schedule's cursor
/// `decided_through`.
pub fn check_period(
    schedule: &Schedule,
    period: Timestamp,
    now: Timestamp,
    decided_through: Timestamp,
) -> Result<(), String> {
    let p = period_rfc3339(period);
    if is_manual(period) {
        return Err(format!(
            "{p} is not an instant of the schedule but a manual period (a triggered run's, with fractions of a second): a triggered run cannot be re-run; use kubectl singleton trigger for another run now"
        ));
    }
    if schedule.next_after(period - SignedDuration::from_nanos(1)) != Some(period) {
        let near = |t: Option<Timestamp>| t.map_or("none".to_string(), period_rfc3339);
        return Err(format!(
            "{p} is not an instant of the schedule {:?} (the nearest are {} and {}): rerun takes a period the schedule decided (kubectl singleton history lists them); use kubectl singleton trigger for a run outside the schedule",
            schedule.expr(),
            near(schedule.latest_at_or_before(period)),
            near(schedule.next_after(period)),
        ));
    }
    if period > now {
        return Err(format!(
            "period {p} lies in the future: the schedule runs it when it falls due; use kubectl singleton trigger for a run now"
        ));
    }
    if period > decided_through {
        return Err(format!(
            "period {p} is not decided yet (the schedule has decided every period up to {}): it runs, or is recorded, when the schedule gets to it; re-run it after that, or use kubectl singleton trigger for a run now",
            period_rfc3339(decided_through)
        ));
    }
    Ok(())
}

/// Whether `status` records `period` as decided: a history entry (also one folded over a range
/// of periods), an active run or a pending claim.
pub fn recorded(status: &SingletonJobStatus, period: Timestamp) -> bool {
    let in_history = status.history.iter().any(|h| match &h.last_period {
        Some(last) => h.period.0 <= period && period <= last.0,
        None => h.period.0 == period,
    });
    in_history
        || status
            .active
            .iter()
            .chain(status.pending_claim.as_ref())
            .any(|r| r.period.0 == period)
}

/// Rules 3 and 4. `recorded`: any record says the period was decided (the status, see
/// [`recorded`], a Job of the period, or the backstop's claim row). Returns the period's active
/// runs to replace first (empty unless `replace`), or why the rerun is refused.
pub fn check_runs(
    status: &SingletonJobStatus,
    period: Timestamp,
    recorded: bool,
    replace: bool,
) -> Result<Vec<RunRef>, String> {
    let p = period_rfc3339(period);
    if !recorded {
        return Err(format!(
            "period {p} was never decided: no history entry, Job or backstop claim records it (the SingletonJob did not exist then, or its records were pruned and no backstop keeps them), so there is nothing to re-run; use kubectl singleton backfill --from {p} --to {p} to run a period that never ran (it needs spec.backstop), or kubectl singleton trigger for a run now"
        ));
    }
    let active: Vec<RunRef> = status
        .active
        .iter()
        .filter(|r| r.period.0 == period)
        .cloned()
        .collect();
    if active.is_empty() || replace {
        return Ok(active);
    }
    let runs: Vec<String> = active
        .iter()
        .map(|r| format!("Job {} with token {}", r.job_name, r.token))
        .collect();
    Err(format!(
        "period {p} is still running ({}): wait for it to finish, or re-run with --replace, which fences that run out and deletes it first (as concurrencyPolicy Replace does)",
        runs.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HistoryEntry, Outcome};
    use crate::schedule::DstPolicy;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn hourly() -> Schedule {
        Schedule::parse("0 * * * *", None, DstPolicy::default()).unwrap()
    }

    fn run(period: &str, token: u64) -> RunRef {
        RunRef {
            unknown: Default::default(),
            late: false,
            period: ts(period).into(),
            token,
            job_name: crate::naming::job_name("a", ts(period)),
            claimed_at: None,
            job_uid: Some(format!("uid-{token}")),
            origin: None,
            requested_by: None,
            supersedes: None,
            replaces: Vec::new(),
            resume_at: None,
            basis: None,
        }
    }

    fn entry(period: &str, last: Option<&str>, outcome: Outcome) -> HistoryEntry {
        HistoryEntry {
            unknown: Default::default(),
            late: false,
            period: ts(period).into(),
            last_period: last.map(|l| ts(l).into()),
            count: if last.is_some() { 3 } else { 1 },
            outcome,
            reason: None,
            job_name: None,
            token: None,
            start_time: None,
            finish_time: None,
            requested_by: None,
            cluster: None,
            message: None,
        }
    }

    #[test]
    fn only_a_decided_instant_of_the_schedule_may_be_re_run() {
        let (now, cursor) = (ts("2026-01-01T10:30:00Z"), ts("2026-01-01T10:00:00Z"));
        let check = |p: &str| check_period(&hourly(), ts(p), now, cursor);
        assert_eq!(check("2026-01-01T09:00:00Z"), Ok(()));
        assert_eq!(check("2026-01-01T10:00:00Z"), Ok(()), "the cursor itself");
        for (p, says) in [
            (
                "2026-01-01T09:00:00.000042Z",
                "a triggered run cannot be re-run",
            ),
            ("2026-01-01T09:30:00Z", "not an instant of the schedule"),
            (
                "2026-01-01T09:30:00Z",
                "nearest are 2026-01-01T09:00:00Z and 2026-01-01T10:00:00Z",
            ),
            ("2026-01-01T12:00:00Z", "lies in the future"),
            ("2026-01-01T12:00:00Z", "kubectl singleton trigger"),
        ] {
            let e = check(p).unwrap_err();
            assert!(e.contains(says), "{p}: {e}");
        }
        // Due by the clock but not yet decided (a Forbid wait, a controller catching up).
        let e = check_period(
            &hourly(),
            ts("2026-01-01T10:00:00Z"),
            now,
            ts("2026-01-01T09:00:00Z"),
        )
        .unwrap_err();
        assert!(e.contains("not decided yet"), "{e}");
    }

    #[test]
    fn a_period_is_recorded_by_any_entry_or_run() {
        let p = ts("2026-01-01T09:00:00Z");
        let mut st = SingletonJobStatus::default();
        assert!(!recorded(&st, p));
        // A folded range of periods decided without a run still records each of them.
        st.history.push(entry(
            "2026-01-01T07:00:00Z",
            Some("2026-01-01T09:00:00Z"),
            Outcome::Missed,
        ));
        assert!(recorded(&st, p));
        assert!(!recorded(&st, ts("2026-01-01T10:00:00Z")));
        st.history.clear();
        st.history
            .push(entry("2026-01-01T09:00:00Z", None, Outcome::Succeeded));
        assert!(recorded(&st, p));
        st.history.clear();
        st.active.push(run("2026-01-01T09:00:00Z", 4));
        assert!(recorded(&st, p));
        st.active.clear();
        st.pending_claim = Some(run("2026-01-01T09:00:00Z", 4));
        assert!(recorded(&st, p));
    }

    #[test]
    fn a_never_decided_or_running_period_is_refused_unless_replaced() {
        let p = ts("2026-01-01T09:00:00Z");
        let mut st = SingletonJobStatus::default();
        let e = check_runs(&st, p, false, true).unwrap_err();
        assert!(e.contains("never decided"), "{e}");
        assert!(
            e.contains("backfill --from 2026-01-01T09:00:00Z --to 2026-01-01T09:00:00Z"),
            "{e}"
        );
        assert_eq!(check_runs(&st, p, true, false), Ok(Vec::new()));
        // Its run is active: refused, saying how to go on; with --replace, that run is replaced.
        let own = run("2026-01-01T09:00:00Z", 4);
        st.active = vec![own.clone(), run("2026-01-01T10:00:00Z", 5)];
        let e = check_runs(&st, p, true, false).unwrap_err();
        assert!(
            e.contains("still running (Job a-1767258000 with token 4)"),
            "{e}"
        );
        assert!(e.contains("--replace"), "{e}");
        assert_eq!(check_runs(&st, p, true, true), Ok(vec![own]));
        // Another period's active run is not this rerun's to replace (it waits like any manual
        // run, see crate::operate).
        assert_eq!(
            check_runs(&st, ts("2026-01-01T08:00:00Z"), true, true),
            Ok(Vec::new())
        );
    }
}
