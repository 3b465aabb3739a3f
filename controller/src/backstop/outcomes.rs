//! Each period's outcome beside its claim (schema 8): what bulk repair
//! (`kubectl singleton rerun --from --to --only failed`, [`crate::decide::repair`]) reads to find
//! the periods whose run failed, since the status keeps only the newest twenty history entries.
//!
//! - [`Backstop::record_outcomes`]: the controller records how its runs ended, each on the row
//!   that still holds the run's token (a rerun that took the row over since keeps its own
//!   outcome, cleared by its claim).
//! - [`Backstop::claims_between`]: a range of one job's claim rows with their outcomes.

use jiff::Timestamp;

use super::engine::engine;
use super::{Backstop, to_i64};
use crate::Result;
use crate::api::Outcome;
use crate::decide::repair::ClaimFact;

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
            engine!(self, e => e.record_outcomes(job, &periods, &tokens, &outcomes).await)
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
            engine!(self, e => e.claims_between(job, from, to).await)
        })
        .await
    }
}
