//! The fence row and the claim row's other operations on MariaDB/MySQL (see postgres/fence.rs
//! for what each means): confirm, read, advance, retire, and the counters.

use jiff::Timestamp;
use mysql_async::prelude::Queryable;
use mysql_async::{TxOpts, Value};

use super::Mysql;
use super::schema::Tables;
use super::time::{timestamp, timestamp_opt, value};
use crate::backstop::engine::FenceColumn;
use crate::backstop::{ClaimRow, owner, to_u64};
use crate::{Error, Result};

impl Mysql {
    /// See [`crate::backstop::Backstop::confirm`].
    pub(crate) async fn confirm(
        &self,
        job: &str,
        period: Timestamp,
        token: i64,
        cluster: &str,
    ) -> Result<bool> {
        let mut slot = self.session().await?;
        let (conn, t) = slot.parts()?;
        let r = async {
            conn.exec_drop(
                format!(
                    "UPDATE {} SET confirmed_at = COALESCE(confirmed_at, UTC_TIMESTAMP(6)) \
                     WHERE job = ? AND period = ? AND token = ? AND cluster = ?",
                    t.claims
                ),
                (job, value(period), token, cluster),
            )
            .await
            .map_err(Error::from_mysql)?;
            if conn.affected_rows() == 1 {
                return Ok(true);
            }
            // Already confirmed: the row matched without changing (MySQL counts changed rows).
            let there: Option<i64> = conn
                .exec_first(
                    format!(
                        "SELECT 1 FROM {} WHERE job = ? AND period = ? AND token = ? AND cluster = ?",
                        t.claims
                    ),
                    (job, value(period), token, cluster),
                )
                .await
                .map_err(Error::from_mysql)?;
            Ok(there.is_some())
        }
        .await;
        slot.settle(r)
    }

    /// See [`crate::backstop::Backstop::claimed`].
    pub(crate) async fn claimed(&self, job: &str, period: Timestamp) -> Result<Option<ClaimRow>> {
        let mut slot = self.session().await?;
        let (conn, t) = slot.parts()?;
        let r = async {
            let row: Option<(i64, String, Value, String, Value)> = conn
                .exec_first(
                    format!(
                        "SELECT token, job_name, claimed_at, cluster, confirmed_at FROM {} \
                         WHERE job = ? AND period = ?",
                        t.claims
                    ),
                    (job, value(period)),
                )
                .await
                .map_err(Error::from_mysql)?;
            let Some((token, job_name, claimed_at, cluster, confirmed_at)) = row else {
                return Ok(None);
            };
            Ok(Some(ClaimRow {
                job: job.to_string(),
                period,
                token: to_u64(token)?,
                job_name,
                claimed_at: timestamp(claimed_at)?,
                cluster,
                confirmed_at: timestamp_opt(confirmed_at)?,
            }))
        }
        .await;
        slot.settle(r)
    }

    /// See [`crate::backstop::Backstop::advance_fence`]: raises the fence to `token` unless it
    /// is there or higher; returns the fence after.
    pub(crate) async fn advance_fence(&self, job: &str, token: i64) -> Result<u64> {
        let mut slot = self.session().await?;
        let (conn, t) = slot.parts()?;
        let r = async {
            let mut tx = conn
                .start_transaction(TxOpts::default())
                .await
                .map_err(Error::from_mysql)?;
            let (current, _, _) = lock_fence(&mut tx, &t, job).await?;
            let after = if current < token {
                tx.exec_drop(
                    format!("UPDATE {} SET token = ? WHERE job = ?", t.fences),
                    (token, job),
                )
                .await
                .map_err(Error::from_mysql)?;
                token
            } else {
                current
            };
            tx.commit().await.map_err(Error::from_mysql)?;
            to_u64(after)
        }
        .await;
        slot.settle(r)
    }

    /// See [`crate::backstop::Backstop::retire`].
    pub(crate) async fn retire(&self, job: &str, token: i64, namespace: &str) -> Result<()> {
        let mut slot = self.session().await?;
        let (conn, t) = slot.parts()?;
        let r = async {
            // Unlocked first: a retirement that changes nothing must not wait behind a newer
            // run's open fenced transaction.
            let row: Option<(i64, i64, Option<String>)> = conn
                .exec_first(
                    format!(
                        "SELECT token, retired, namespace FROM {} WHERE job = ?",
                        t.fences
                    ),
                    (job,),
                )
                .await
                .map_err(Error::from_mysql)?;
            if let Some((current, retired, owner)) = &row {
                owner::check(job, owner.as_deref(), namespace)?;
                if *current > token || *retired >= token {
                    return Ok(());
                }
            }
            let mut tx = conn
                .start_transaction(TxOpts::default())
                .await
                .map_err(Error::from_mysql)?;
            retire_locked(&mut tx, &t, job, token, namespace).await?;
            tx.commit().await.map_err(Error::from_mysql)
        }
        .await;
        slot.settle(r)
    }

    /// See [`crate::backstop::Backstop::retired`] and [`crate::backstop::Backstop::fence`].
    pub(crate) async fn fence_column(&self, job: &str, column: FenceColumn) -> Result<u64> {
        let column = match column {
            FenceColumn::Token => "token",
            FenceColumn::Retired => "retired",
        };
        let mut slot = self.session().await?;
        let (conn, t) = slot.parts()?;
        let r = async {
            let v: Option<i64> = conn
                .exec_first(
                    format!("SELECT {column} FROM {} WHERE job = ?", t.fences),
                    (job,),
                )
                .await
                .map_err(Error::from_mysql)?;
            to_u64(v.unwrap_or(0))
        }
        .await;
        slot.settle(r)
    }

    /// The fences' refusals so far (a MyISAM counter: never rolled back with the refused
    /// statement).
    pub(crate) async fn rejections(&self) -> Result<u64> {
        let mut slot = self.session().await?;
        let (conn, t) = slot.parts()?;
        let r = async {
            let n: Option<u64> = conn
                .query_first(format!("SELECT n FROM {} WHERE id = 1", t.rejections))
                .await
                .map_err(Error::from_mysql)?;
            Ok(n.unwrap_or(0))
        }
        .await;
        slot.settle(r)
    }
}

/// Locks the job's fence row, making it (token 0, owned by the controller's database user)
/// when the job has none; returns its token, retired token and owner namespace. The lock is the
/// one a workload's `<p>fence()` takes, so this waits for an open fenced transaction.
pub(super) async fn lock_fence<Q: Queryable>(
    q: &mut Q,
    t: &Tables,
    job: &str,
) -> Result<(i64, i64, Option<String>)> {
    q.exec_drop(
        format!(
            "INSERT INTO {} (job, token, owner) VALUES (?, 0, SUBSTRING_INDEX(SESSION_USER(), '@', 1)) \
             ON DUPLICATE KEY UPDATE job = job",
            t.fences
        ),
        (job,),
    )
    .await
    .map_err(Error::from_mysql)?;
    let row: Option<(i64, i64, Option<String>)> = q
        .exec_first(
            format!(
                "SELECT token, retired, namespace FROM {} WHERE job = ? FOR UPDATE",
                t.fences
            ),
            (job,),
        )
        .await
        .map_err(Error::from_mysql)?;
    row.ok_or_else(|| Error::Backstop("the fence row vanished under its lock".into()))
}

/// Raises the fence and the retired token to `token` (never lowers either), recording the owner
/// namespace when there is none; refuses another namespace's job. Under the fence row's lock.
pub(super) async fn retire_locked<Q: Queryable>(
    q: &mut Q,
    t: &Tables,
    job: &str,
    token: i64,
    namespace: &str,
) -> Result<()> {
    let (_, _, owner) = lock_fence(q, t, job).await?;
    if owner::refuses(owner.as_deref(), namespace) {
        return Err(owner::not_owner(job));
    }
    q.exec_drop(
        format!(
            "UPDATE {} SET token = GREATEST(token, ?), retired = GREATEST(retired, ?), \
             namespace = COALESCE(namespace, ?) WHERE job = ?",
            t.fences
        ),
        (token, token, owner::recorded(namespace), job),
    )
    .await
    .map_err(Error::from_mysql)
}
