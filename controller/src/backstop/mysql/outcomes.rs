//! Each period's outcome beside its claim (bulk repair reads it), on MariaDB/MySQL.

use jiff::Timestamp;
use mysql_async::prelude::Queryable;
use mysql_async::{TxOpts, Value};

use super::Mysql;
use super::time::{timestamp, value};
use crate::backstop::to_u64;
use crate::decide::repair::ClaimFact;
use crate::{Error, Result};

impl Mysql {
    /// See [`crate::backstop::Backstop::record_outcomes`]: one transaction, a statement per
    /// period (there are few), each only for the row's own token.
    pub(crate) async fn record_outcomes(
        &self,
        job: &str,
        periods: &[Timestamp],
        tokens: &[i64],
        outcomes: &[&str],
    ) -> Result<()> {
        let mut slot = self.session().await?;
        let (conn, t) = slot.parts()?;
        let r = async {
            let mut tx = conn
                .start_transaction(TxOpts::default())
                .await
                .map_err(Error::from_mysql)?;
            let sql = format!(
                "UPDATE {} SET outcome = ? WHERE job = ? AND period = ? AND token = ? \
                 AND NOT (outcome <=> ?)",
                t.claims
            );
            for ((period, token), outcome) in periods.iter().zip(tokens).zip(outcomes) {
                tx.exec_drop(&sql, (*outcome, job, value(*period), *token, *outcome))
                    .await
                    .map_err(Error::from_mysql)?;
            }
            tx.commit().await.map_err(Error::from_mysql)
        }
        .await;
        slot.settle(r)
    }

    /// See [`crate::backstop::Backstop::claims_between`].
    pub(crate) async fn claims_between(
        &self,
        job: &str,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Vec<(Timestamp, ClaimFact)>> {
        let mut slot = self.session().await?;
        let (conn, t) = slot.parts()?;
        let r = async {
            let rows: Vec<(Value, i64, Option<String>)> = conn
                .exec(
                    format!(
                        "SELECT period, token, outcome FROM {} WHERE job = ? AND period BETWEEN ? AND ? ORDER BY period",
                        t.claims
                    ),
                    (job, value(from), value(to)),
                )
                .await
                .map_err(Error::from_mysql)?;
            rows.into_iter()
                .map(|(period, token, outcome)| {
                    Ok((
                        timestamp(period)?,
                        ClaimFact {
                            token: to_u64(token)?,
                            outcome: outcome.as_deref().and_then(crate::api::Outcome::named),
                        },
                    ))
                })
                .collect()
        }
        .await;
        slot.settle(r)
    }
}
