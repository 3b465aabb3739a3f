//! Multi-cluster claims (docs/multi-cluster.md): several clusters, each with its own controller,
//! share one backstop database, which decides which cluster runs each period. Every judgement of
//! time here is made with the database's clock (`now()` in the claim transaction), the one clock
//! all clusters share; a cluster's own clock never decides a takeover or a standby's turn.
//!
//! These are the pure halves of the decisions; the claim transaction (`claim_tx` in the parent module) reads the
//! row (locked) and the database's `now()`, asks these, and acts on the answer.

use jiff::{SignedDuration, Timestamp};

/// Who claims, and under which multi-cluster policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claimer {
    /// This cluster's identity (`--cluster-id`). Empty: no identity (a single cluster); a claim
    /// without an identity is never taken over, so an older controller's rows stay its own.
    pub cluster: String,
    /// A claim of another cluster that was not confirmed as started (the Job about to be
    /// created) within this long, by the database's clock, may be taken over. `None`: never.
    pub takeover_after: Option<SignedDuration>,
    /// Active/standby: claim a period only once the database's clock is this far past the
    /// period's instant, so the primary (no delay) claims first in normal operation.
    pub standby_delay: Option<SignedDuration>,
    /// A scheduled run's claim (not a trigger, backfill or rerun). With an identity, it is
    /// refused ([`super::ClaimOutcome::Superseded`]) once another cluster has claimed a later
    /// period of the job, so that tokens follow the periods across clusters as they do within
    /// one: an older period claimed after a newer one would get the higher token, and the
    /// newer run's writes after it would be refused by the fence.
    pub scheduled: bool,
    /// The claiming SingletonJob's namespace, the job key's owner once recorded
    /// ([`super::owner`]): a key recorded for another namespace is refused. Empty: not recorded
    /// and not checked (library callers and tests; the controller always names it).
    pub namespace: String,
}

/// The period's existing claim row, as the claim transaction read it (locked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Existing {
    pub token: u64,
    pub cluster: String,
    /// The database's time of the claim (or of the last takeover).
    pub claimed_at: Timestamp,
    /// Whether the claimer confirmed it is starting the Job: from then on it is never taken over.
    pub confirmed: bool,
}

/// What a claimer does with a period that has a claim row already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The row carries our own token: our earlier claim (a retry after a crash). Go on.
    Ours,
    /// A claim of our own cluster (or one without an identity): the period ran or runs here.
    Duplicate,
    /// Another cluster's claim that may not be taken over: it ran, or runs, there.
    Elsewhere,
    /// Another cluster's unconfirmed claim, within the bound: it may still start there, or be
    /// taken over from this database time on. Ask again then (or once it is confirmed).
    WaitUntil(Timestamp),
    /// Another cluster's claim, unconfirmed past the bound: take it over and raise the fence.
    TakeOver,
}

/// Judges the period's existing claim row for `me`, claiming with `token`, at the database's
/// time `db_now`.
pub fn judge(existing: &Existing, me: &Claimer, token: u64, db_now: Timestamp) -> Verdict {
    // Tokens are chosen before the claim transaction, so two clusters may pick the same one: a
    // row is ours only if it names our cluster too.
    if existing.token == token && existing.cluster == me.cluster {
        return Verdict::Ours;
    }
    if existing.cluster.is_empty() || existing.cluster == me.cluster {
        return Verdict::Duplicate;
    }
    let bound = match me.takeover_after {
        Some(bound) if !me.cluster.is_empty() && !existing.confirmed => bound,
        _ => return Verdict::Elsewhere,
    };
    match existing.claimed_at.checked_add(bound) {
        Ok(from) if db_now < from => Verdict::WaitUntil(from),
        Ok(_) => Verdict::TakeOver,
        // A bound beyond the calendar's end, which no clock reaches.
        Err(_) => Verdict::Elsewhere,
    }
}

/// A standby's turn: `None` when `me` may claim `period` at the database's time `db_now`, else
/// the database time from which it may.
pub fn standby_until(me: &Claimer, period: Timestamp, db_now: Timestamp) -> Option<Timestamp> {
    let delay = me.standby_delay?;
    let from = period.checked_add(delay).ok()?;
    (db_now < from).then_some(from)
}

/// The claim's answer for `verdict` on the period's `existing` row, whose Job is `job_name`;
/// `None` for [`Verdict::TakeOver`], which the engine carries out (the answer is then
/// [`super::ClaimOutcome::TookOver`]). The same for every engine.
pub fn answer(
    verdict: Verdict,
    existing: &Existing,
    job_name: String,
) -> Option<super::ClaimOutcome> {
    use super::ClaimOutcome;
    Some(match verdict {
        Verdict::Ours | Verdict::Duplicate => ClaimOutcome::Duplicate {
            token: existing.token,
            job_name,
        },
        Verdict::WaitUntil(until) => ClaimOutcome::NotYet { until },
        Verdict::Elsewhere => ClaimOutcome::ClaimedElsewhere {
            cluster: existing.cluster.clone(),
            token: existing.token,
            job_name,
        },
        Verdict::TakeOver => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn me(cluster: &str, bound: Option<i64>) -> Claimer {
        Claimer {
            cluster: cluster.into(),
            takeover_after: bound.map(SignedDuration::from_secs),
            standby_delay: None,
            scheduled: true,
            namespace: String::new(),
        }
    }

    fn row(cluster: &str, token: u64, at: &str, confirmed: bool) -> Existing {
        Existing {
            token,
            cluster: cluster.into(),
            claimed_at: t(at),
            confirmed,
        }
    }

    const AT: &str = "2026-01-01T00:00:00Z";

    #[test]
    fn every_case_of_judge() {
        let late = t("2026-01-01T00:01:00Z"); // 60 s after AT
        let early = t("2026-01-01T00:00:59Z");
        // Our own token in our cluster's row: ours (a retry), confirmed or not.
        assert_eq!(
            judge(&row("a", 7, AT, true), &me("a", Some(60)), 7, late),
            Verdict::Ours
        );
        assert_eq!(
            judge(&row("", 7, AT, false), &me("", None), 7, late),
            Verdict::Ours
        );
        // The same token chosen by another cluster (tokens are chosen before the claim): not
        // ours.
        assert_eq!(
            judge(&row("b", 7, AT, false), &me("a", Some(60)), 7, late),
            Verdict::TakeOver
        );
        assert_eq!(
            judge(&row("b", 7, AT, true), &me("a", Some(60)), 7, late),
            Verdict::Elsewhere
        );
        // Our cluster, or no identity on the row: a plain duplicate, never taken over.
        assert_eq!(
            judge(&row("a", 7, AT, false), &me("a", Some(60)), 8, late),
            Verdict::Duplicate
        );
        assert_eq!(
            judge(&row("", 7, AT, false), &me("a", Some(1)), 8, late),
            Verdict::Duplicate
        );
        // Another cluster's confirmed claim: it ran there, never taken over.
        assert_eq!(
            judge(&row("b", 7, AT, true), &me("a", Some(1)), 8, late),
            Verdict::Elsewhere
        );
        // Unconfirmed, within the bound (by the database's clock): theirs for now; ask again
        // when the bound ends.
        assert_eq!(
            judge(&row("b", 7, AT, false), &me("a", Some(60)), 8, early),
            Verdict::WaitUntil(late)
        );
        // Unconfirmed, at the bound: taken over.
        assert_eq!(
            judge(&row("b", 7, AT, false), &me("a", Some(60)), 8, late),
            Verdict::TakeOver
        );
        // No bound: never taken over.
        assert_eq!(
            judge(&row("b", 7, AT, false), &me("a", None), 8, late),
            Verdict::Elsewhere
        );
        // A claimer without an identity never takes over.
        assert_eq!(
            judge(&row("b", 7, AT, false), &me("", Some(1)), 8, late),
            Verdict::Elsewhere
        );
        // A row dated after the database's now (cannot happen with one clock): not overdue.
        assert_eq!(
            judge(
                &row("b", 7, "2026-01-01T00:05:00Z", false),
                &me("a", Some(60)),
                8,
                late
            ),
            Verdict::WaitUntil(t("2026-01-01T00:06:00Z"))
        );
    }

    #[test]
    fn standby_waits_for_its_delay_by_the_database_clock() {
        let period = t(AT);
        let mut s = me("standby", None);
        assert_eq!(
            standby_until(&s, period, period),
            None,
            "no delay: a primary"
        );
        s.standby_delay = Some(SignedDuration::from_secs(30));
        let from = t("2026-01-01T00:00:30Z");
        assert_eq!(standby_until(&s, period, period), Some(from));
        assert_eq!(
            standby_until(&s, period, t("2026-01-01T00:00:29Z")),
            Some(from)
        );
        assert_eq!(standby_until(&s, period, from), None);
        assert_eq!(standby_until(&s, period, t("2026-01-01T01:00:00Z")), None);
    }
}
