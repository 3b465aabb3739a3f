//! Each period's outcome beside its claim (schema 8): what bulk repair
//! (`kubectl singleton rerun --from --to --only failed`, [`crate::decide::repair`]) reads to find
//! the periods whose run failed, since the status keeps only the newest twenty history entries.
//!
//! - [`Backstop::record_outcomes`]: the controller records how its runs ended, each on the row
//!   that still holds the run's token (a rerun that took the row over since keeps its own
//!   outcome, cleared by its claim: [`super::claim_sql`]).
//! - [`Backstop::claims_between`]: a range of one job's claim rows with their outcomes.

use jiff::Timestamp;

use super::{Backstop, to_i64, to_u64};
use crate::api::Outcome;
use crate::decide::repair::ClaimFact;
use crate::{Error, Result};

impl Backstop {
    /// Records how `job`'s runs ended: `(period, token, outcome)` each. A row whose token moved on
    /// (a rerun took it over) is left alone; a period without a row (the backstop was added
    /// later) records nothing. One statement, idempotent.
    pub async fn record_outcomes(
        &self,
        job: &str,
        runs: &[(Timestamp, u64, Outcome)],
    ) -> Result<()> {
        if runs.is_empty() {
            return Ok(());
        }
        let periods: Vec<Timestamp> = runs.iter().map(|r| r.0).collect();
        let tokens = runs
            .iter()
            .map(|r| to_i64(r.1))
            .collect::<Result<Vec<i64>>>()?;
        let outcomes: Vec<&str> = runs.iter().map(|r| r.2.name()).collect();
        self.bounded("record outcomes", async {
            let mut slot = self.session().await?;
            let sql = format!(
                "UPDATE {} AS c SET outcome = u.outcome \
                 FROM unnest($2::timestamptz[], $3::bigint[], $4::text[]) AS u(period, token, outcome) \
                 WHERE c.job = $1 AND c.period = u.period AND c.token = u.token \
                   AND c.outcome IS DISTINCT FROM u.outcome",
                slot.tables()?.claims
            );
            let r = slot
                .client()?
                .execute(&sql, &[&job, &periods, &tokens, &outcomes])
                .await
                .map(|_| ())
                .map_err(|e| Error::from_pg(e, false));
            slot.settle(r)
        })
        .await
    }

    /// `job`'s claim rows for the periods in `[from, to]`, oldest first: each period's token and
    /// the outcome recorded for it (None: running, or not recorded).
    pub async fn claims_between(
        &self,
        job: &str,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Vec<(Timestamp, ClaimFact)>> {
        self.bounded("read claims of a range", async {
            let mut slot = self.session().await?;
            let sql = format!(
                "SELECT period, token, outcome FROM {} WHERE job = $1 AND period BETWEEN $2 AND $3 ORDER BY period",
                slot.tables()?.claims
            );
            let r = match slot.client()?.query(&sql, &[&job, &from, &to]).await {
                Err(e) => Err(Error::from_pg(e, false)),
                Ok(rows) => rows
                    .iter()
                    .map(|row| {
                        let outcome: Option<String> = row.get(2);
                        Ok((
                            row.get::<_, Timestamp>(0),
                            ClaimFact {
                                token: to_u64(row.get(1))?,
                                outcome: outcome.as_deref().and_then(outcome_named),
                            },
                        ))
                    })
                    .collect(),
            };
            slot.settle(r)
        })
        .await
    }
}

/// The outcome a row names; None for a name this build does not know (a newer release's).
fn outcome_named(name: &str) -> Option<Outcome> {
    [
        Outcome::Running,
        Outcome::Succeeded,
        Outcome::Failed,
        Outcome::Skipped,
        Outcome::Missed,
        Outcome::Replaced,
        Outcome::Deduplicated,
    ]
    .into_iter()
    .find(|o| o.name() == name)
}
