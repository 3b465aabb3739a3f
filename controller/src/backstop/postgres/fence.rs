//! The fence row and single claim rows: read, confirm, advance, retire (each one statement, or
//! a read and one conditional write).

use jiff::Timestamp;

use super::Postgres;
use super::schema::Tables;
use crate::backstop::engine::FenceColumn;
use crate::backstop::{ClaimRow, owner, to_u64};
use crate::{Error, Result};

impl Postgres {
    /// See [`crate::backstop::Backstop::confirm`].
    pub(crate) async fn confirm(
        &self,
        job: &str,
        period: Timestamp,
        token: i64,
        cluster: &str,
    ) -> Result<bool> {
        let mut slot = self.session().await?;
        let sql = format!(
            "UPDATE {} SET confirmed_at = coalesce(confirmed_at, now()) \
             WHERE job = $1 AND period = $2 AND token = $3 AND cluster = $4 RETURNING 1",
            slot.tables()?.claims
        );
        let r = slot
            .client()?
            .query_opt(&sql, &[&job, &period, &token, &cluster])
            .await
            .map(|row| row.is_some())
            .map_err(|e| Error::from_pg(e, false));
        slot.settle(r)
    }

    /// See [`crate::backstop::Backstop::claimed`].
    pub(crate) async fn claimed(&self, job: &str, period: Timestamp) -> Result<Option<ClaimRow>> {
        let mut slot = self.session().await?;
        let sql = format!(
            "SELECT token, job_name, claimed_at, cluster, confirmed_at FROM {} WHERE job = $1 AND period = $2",
            slot.tables()?.claims
        );
        let r = match slot.client()?.query_opt(&sql, &[&job, &period]).await {
            Err(e) => Err(Error::from_pg(e, false)),
            Ok(None) => Ok(None),
            Ok(Some(row)) => to_u64(row.get(0)).map(|token| {
                Some(ClaimRow {
                    job: job.to_string(),
                    period,
                    token,
                    job_name: row.get(1),
                    claimed_at: row.get(2),
                    cluster: row.get(3),
                    confirmed_at: row.get(4),
                })
            }),
        };
        slot.settle(r)
    }

    /// See [`crate::backstop::Backstop::advance_fence`].
    pub(crate) async fn advance_fence(&self, job: &str, token: i64) -> Result<u64> {
        let mut slot = self.session().await?;
        let t = slot.tables()?.clone();
        let client = slot.client()?;
        let r = async {
            let pg = |e| Error::from_pg(e, false);
            let advanced = client
                .query_opt(&upsert_fence_sql(&t), &[&job, &token])
                .await
                .map_err(pg)?;
            match advanced {
                Some(_) => Ok(token.unsigned_abs()),
                None => {
                    let row = client
                        .query_one(
                            &format!("SELECT token FROM {} WHERE job = $1", t.fences),
                            &[&job],
                        )
                        .await
                        .map_err(pg)?;
                    to_u64(row.get(0))
                }
            }
        }
        .await;
        slot.settle(r)
    }

    /// See [`crate::backstop::Backstop::retire`].
    pub(crate) async fn retire(&self, job: &str, token: i64, namespace: &str) -> Result<()> {
        let mut slot = self.session().await?;
        let t = slot.tables()?.clone();
        let client = slot.client()?;
        let r = async {
            let pg = |e| Error::from_pg(e, false);
            let row = client
                .query_opt(
                    &format!(
                        "SELECT token, retired, namespace FROM {} WHERE job = $1",
                        t.fences
                    ),
                    &[&job],
                )
                .await
                .map_err(pg)?;
            if let Some(r) = &row {
                owner::check(job, r.get(2), namespace)?;
                if r.get::<_, i64>(0) > token || r.get::<_, i64>(1) >= token {
                    return Ok(());
                }
            }
            // The owner is checked again under the row's lock (its WHERE).
            let changed = client
                .execute(
                    &retire_sql(&t),
                    &[&job, &token, &owner::recorded(namespace)],
                )
                .await
                .map_err(pg)?;
            if changed == 0 {
                return Err(owner::not_owner(job));
            }
            Ok(())
        }
        .await;
        slot.settle(r)
    }

    /// One column of `job`'s fence row (0 if there is none).
    pub(crate) async fn fence_column(&self, job: &str, column: FenceColumn) -> Result<u64> {
        let column = match column {
            FenceColumn::Token => "token",
            FenceColumn::Retired => "retired",
        };
        let mut slot = self.session().await?;
        let sql = format!(
            "SELECT {column} FROM {} WHERE job = $1",
            slot.tables()?.fences
        );
        let r = slot
            .client()?
            .query_opt(&sql, &[&job])
            .await
            .map_err(|e| Error::from_pg(e, false))
            .and_then(|row| row.map_or(Ok(0), |row| to_u64(row.get(0))));
        slot.settle(r)
    }

    /// See [`crate::backstop::Backstop::rejections`].
    pub(crate) async fn rejections(&self) -> Result<u64> {
        let mut slot = self.session().await?;
        let sql = format!(
            "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {}",
            slot.tables()?.rejections
        );
        let r = match slot.client()?.query_one(&sql, &[]).await {
            Ok(row) => to_u64(row.get(0)),
            Err(e) => Err(Error::from_pg(e, false)),
        };
        slot.settle(r)
    }
}

fn upsert_fence_sql(t: &Tables) -> String {
    format!(
        "INSERT INTO {} AS f (job, token) VALUES ($1, $2) \
         ON CONFLICT ON CONSTRAINT {}fences_pkey \
         DO UPDATE SET token = EXCLUDED.token WHERE f.token < EXCLUDED.token \
         RETURNING f.token",
        t.fences, t.prefix
    )
}

/// The claim's fence advance ([`upsert_fence_sql`]) that also records the job key's owner
/// (`$3`, NULL for none) where none is recorded, and returns the owner now stored.
pub(super) fn claim_fence_sql(t: &Tables) -> String {
    format!(
        "INSERT INTO {} AS f (job, token, namespace) VALUES ($1, $2, $3) \
         ON CONFLICT ON CONSTRAINT {}fences_pkey \
         DO UPDATE SET token = EXCLUDED.token, namespace = coalesce(f.namespace, EXCLUDED.namespace) \
         WHERE f.token < EXCLUDED.token \
         RETURNING f.token, f.namespace",
        t.fences, t.prefix
    )
}

/// Retires the token `$2` of job `$1` (and raises the fence to it if it is lower): never lowers
/// either. Changes nothing (no row) when the job key belongs to a namespace other than `$3`.
pub(super) fn retire_sql(t: &Tables) -> String {
    format!(
        "INSERT INTO {} AS f (job, token, retired, namespace) VALUES ($1, $2, $2, $3) \
         ON CONFLICT ON CONSTRAINT {}fences_pkey DO UPDATE \
         SET token = greatest(f.token, EXCLUDED.token), \
             retired = greatest(f.retired, EXCLUDED.retired), \
             namespace = coalesce(f.namespace, EXCLUDED.namespace) \
         WHERE EXCLUDED.namespace IS NULL OR f.namespace IS NULL \
            OR f.namespace IN (EXCLUDED.namespace, '{}')",
        t.fences,
        t.prefix,
        owner::SHARED
    )
}
