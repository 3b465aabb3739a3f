//! Each period's outcome on its claim row in PostgreSQL (schema 8): see
//! [`crate::backstop::outcomes`].

use jiff::Timestamp;

use super::Postgres;
use crate::api::Outcome;
use crate::backstop::to_u64;
use crate::decide::repair::ClaimFact;
use crate::{Error, Result};

impl Postgres {
    /// See [`crate::backstop::Backstop::record_outcomes`].
    pub(crate) async fn record_outcomes(
        &self,
        job: &str,
        periods: &[Timestamp],
        tokens: &[i64],
        outcomes: &[&str],
    ) -> Result<()> {
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
    }

    /// See [`crate::backstop::Backstop::claims_between`].
    pub(crate) async fn claims_between(
        &self,
        job: &str,
        from: Timestamp,
        to: Timestamp,
    ) -> Result<Vec<(Timestamp, ClaimFact)>> {
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
                            outcome: outcome.as_deref().and_then(Outcome::named),
                        },
                    ))
                })
                .collect(),
        };
        slot.settle(r)
    }
}
