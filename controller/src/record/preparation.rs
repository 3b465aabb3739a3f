//! The `Preparation` condition (issue 33): how a SingletonJob's runs are prepared ahead of their
//! instants. Set only while a lead is in effect (`spec.prepareLeadSeconds` or
//! `--prepare-lead-seconds` above 0): a SingletonJob whose runs are never prepared carries none.

use jiff::{SignedDuration, Timestamp};

use super::conditions::{self, PREPARATION};
use crate::api::SingletonJobStatus;
use crate::decide::prepare::lead::{Floor, Next};

/// Sets (or removes) the condition from this reconcile's lead and decision; returns whether it
/// changed. `spec_lead`: the lead is the SingletonJob's own (a clamp of it is said; the
/// controller's default is shortened silently, as it applies to every schedule).
pub fn preparation(
    status: &mut SingletonJobStatus,
    lead: SignedDuration,
    shared: bool,
    next: Next,
    spec_lead: bool,
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    if lead <= SignedDuration::ZERO {
        let before = status.conditions.len();
        status.conditions.retain(|c| c.type_ != PREPARATION);
        return status.conditions.len() != before;
    }
    let secs = lead.as_secs();
    let (ok, reason, message) = if shared {
        (
            false,
            "MultiCluster",
            "runs are not prepared ahead: the backstop is shared by several clusters (or has a standby delay), and the database's clock decides each claim at its instant".to_string(),
        )
    } else {
        match next {
            Next::Now(p) | Next::At(p) => match p.clamped {
                Some(c) if spec_lead => {
                    let l = c.lead.as_secs();
                    let message = match c.by {
                        Floor::PreviousInstant => format!(
                            "prepareLeadSeconds {secs} is longer than the {l} s since the previous instant; runs are prepared {l} s ahead"
                        ),
                        Floor::StartAt => format!(
                            "prepareLeadSeconds {secs} reaches before startAt; the first run is prepared from startAt, {l} s ahead"
                        ),
                    };
                    (true, "LeadClamped", message)
                }
                _ => enabled(secs),
            },
            // Nothing to prepare now (a run active, a period due, suspended): what was said
            // for the next period stands.
            Next::Not(_) if has(status) => return false,
            Next::Not(_) => enabled(secs),
        }
    };
    conditions::set(
        &mut status.conditions,
        PREPARATION,
        ok,
        reason,
        message,
        generation,
        now,
    )
}

fn enabled(secs: i64) -> (bool, &'static str, String) {
    (
        true,
        "Enabled",
        format!(
            "runs are prepared {secs} s before their instant, and started at it by one request"
        ),
    )
}

/// Whether the condition is there, for a lead in effect.
fn has(status: &SingletonJobStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == PREPARATION && c.reason != "MultiCluster")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::prepare::lead::{Clamp, NotPrepared, Preparation};

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn prep(clamped: Option<i64>) -> Next {
        Next::At(Preparation {
            period: t("2027-01-01T00:01:00Z"),
            resume_at: t("2027-01-01T00:01:00Z"),
            from: t("2027-01-01T00:00:30Z"),
            clamped: clamped.map(|s| Clamp {
                lead: SignedDuration::from_secs(s),
                by: Floor::PreviousInstant,
            }),
        })
    }

    fn condition(status: &SingletonJobStatus) -> Option<(&str, &str, &str)> {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == PREPARATION)
            .map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str()))
    }

    #[test]
    fn says_how_runs_are_prepared_and_goes_with_the_lead() {
        let now = t("2027-01-01T00:00:00Z");
        let lead = SignedDuration::from_secs(30);
        let mut s = SingletonJobStatus::default();
        assert!(preparation(
            &mut s,
            lead,
            false,
            prep(None),
            false,
            Some(1),
            now
        ));
        assert_eq!(condition(&s).map(|c| (c.0, c.1)), Some(("True", "Enabled")));
        assert!(condition(&s).unwrap().2.contains("30 s before"));

        // The SingletonJob's own lead, longer than the interval: said, with the lead in effect.
        assert!(preparation(
            &mut s,
            SignedDuration::from_secs(300),
            false,
            prep(Some(60)),
            true,
            Some(2),
            now
        ));
        let (st, reason, msg) = condition(&s).unwrap();
        assert_eq!((st, reason), ("True", "LeadClamped"));
        assert!(
            msg.contains("prepareLeadSeconds 300") && msg.contains("60 s ahead"),
            "{msg}"
        );

        // Shortened by startAt (the first run only).
        let mut first = prep(Some(180));
        if let Next::At(p) = &mut first {
            p.clamped = Some(Clamp {
                lead: SignedDuration::from_secs(180),
                by: Floor::StartAt,
            });
        }
        let mut s2 = SingletonJobStatus::default();
        preparation(
            &mut s2,
            SignedDuration::from_secs(3600),
            false,
            first,
            true,
            Some(1),
            now,
        );
        let (_, reason, msg) = condition(&s2).unwrap();
        assert_eq!(reason, "LeadClamped");
        assert!(
            msg.contains("startAt") && msg.contains("180 s ahead"),
            "{msg}"
        );

        // Nothing to prepare in this reconcile: what was said stands (no flapping).
        let not = Next::Not(NotPrepared::RunActive);
        assert!(!preparation(
            &mut s,
            SignedDuration::from_secs(300),
            false,
            not,
            true,
            Some(2),
            now
        ));
        assert_eq!(condition(&s).unwrap().1, "LeadClamped");

        // Shared between clusters: never prepared, and said.
        assert!(preparation(
            &mut s,
            lead,
            true,
            Next::Not(NotPrepared::Shared),
            false,
            Some(2),
            now
        ));
        assert_eq!(
            condition(&s).map(|c| (c.0, c.1)),
            Some(("False", "MultiCluster"))
        );

        // Lead 0: the condition goes.
        assert!(preparation(
            &mut s,
            SignedDuration::ZERO,
            false,
            Next::Not(NotPrepared::Off),
            false,
            Some(3),
            now
        ));
        assert_eq!(condition(&s), None);
        assert!(!preparation(
            &mut s,
            SignedDuration::ZERO,
            false,
            Next::Not(NotPrepared::Off),
            false,
            Some(3),
            now
        ));
    }
}
