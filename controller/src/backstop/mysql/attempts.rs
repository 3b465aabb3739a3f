//! Attempts (the pods of a run) and the fence's holders on MariaDB/MySQL (see
//! postgres/attempts.rs for what each operation means).

use jiff::Timestamp;
use mysql_async::prelude::Queryable;
use mysql_async::{TxOpts, Value};

use super::Mysql;
use super::fence::{lock_fence, retire_locked};
use super::schema::Tables;
use super::time::{timestamp, timestamp_opt, value};
use crate::backstop::{AttemptRow, Holder, owner, to_i64};
use crate::{Error, Result};

impl Mysql {
    /// See [`crate::backstop::Backstop::attempts`].
    pub(crate) async fn attempts(&self, job: &str, token: i64) -> Result<Vec<AttemptRow>> {
        let mut slot = self.session().await?;
        let (conn, t) = slot.parts()?;
        let r = async {
            let rows: Vec<(i32, String, Value)> = conn
                .exec(
                    format!(
                        "SELECT seq, attempt, registered_at FROM {} WHERE job = ? AND token = ? ORDER BY seq",
                        t.attempts
                    ),
                    (job, token),
                )
                .await
                .map_err(Error::from_mysql)?;
            rows.into_iter()
                .map(|(seq, attempt, at)| {
                    Ok(AttemptRow {
                        seq,
                        attempt,
                        registered_at: timestamp(at)?,
                    })
                })
                .collect()
        }
        .await;
        slot.settle(r)
    }

    /// See [`crate::backstop::Backstop::retire_unstarted`].
    pub(crate) async fn retire_unstarted(
        &self,
        job: &str,
        token: u64,
        namespace: &str,
    ) -> Result<()> {
        let token_i = to_i64(token)?;
        let mut slot = self.session().await?;
        let (conn, t) = slot.parts()?;
        let r = async {
            let mut tx = conn
                .start_transaction(TxOpts::default())
                .await
                .map_err(Error::from_mysql)?;
            let (current, retired, recorded) = lock_fence(&mut tx, &t, job).await?;
            owner::check(job, recorded.as_deref(), namespace)?;
            if current > token_i || retired >= token_i {
                return tx.commit().await.map_err(Error::from_mysql);
            }
            not_started(&mut tx, &t, job, token).await?;
            retire_locked(&mut tx, &t, job, token_i, namespace).await?;
            tx.commit().await.map_err(Error::from_mysql)
        }
        .await;
        slot.settle(r)
    }

    /// See [`crate::backstop::Backstop::withdraw`].
    pub(crate) async fn withdraw(
        &self,
        job: &str,
        period: Timestamp,
        token: u64,
        namespace: &str,
        reason: &str,
    ) -> Result<()> {
        let token_i = to_i64(token)?;
        let mut slot = self.session().await?;
        let (conn, t) = slot.parts()?;
        let r = async {
            let mut tx = conn
                .start_transaction(TxOpts::default())
                .await
                .map_err(Error::from_mysql)?;
            let (_, _, recorded) = lock_fence(&mut tx, &t, job).await?;
            owner::check(job, recorded.as_deref(), namespace)?;
            not_started(&mut tx, &t, job, token).await?;
            // The move, as PostgreSQL's one statement (postgres/attempts.rs `move_sql`): archived
            // first, then gone from the live claims, in this transaction. A row archived before
            // (the same token withdrawn again) is kept as it was.
            tx.exec_drop(
                format!(
                    "INSERT INTO {w} (job, period, token, job_name, cluster, claimed_at, withdrawn_at, reason) \
                     SELECT c.job, c.period, c.token, c.job_name, c.cluster, c.claimed_at, UTC_TIMESTAMP(6), ? \
                     FROM {claims} AS c WHERE c.job = ? AND c.period = ? AND c.token = ? \
                     ON DUPLICATE KEY UPDATE {w}.reason = {w}.reason",
                    w = t.withdrawn_claims,
                    claims = t.claims
                ),
                (reason, job, value(period), token_i),
            )
            .await
            .map_err(Error::from_mysql)?;
            tx.exec_drop(
                format!(
                    "DELETE FROM {} WHERE job = ? AND period = ? AND token = ?",
                    t.claims
                ),
                (job, value(period), token_i),
            )
            .await
            .map_err(Error::from_mysql)?;
            tx.exec_drop(
                format!(
                    "UPDATE {} SET retired = GREATEST(retired, ?) WHERE job = ? AND token >= ?",
                    t.fences
                ),
                (token_i, job, token_i),
            )
            .await
            .map_err(Error::from_mysql)?;
            tx.commit().await.map_err(Error::from_mysql)
        }
        .await;
        slot.settle(r)
    }

    /// See [`crate::backstop::Backstop::fence_holders`]: the connections that fenced the job
    /// (recorded by `<p>fence_check`) and still have a transaction open. Seeing other users'
    /// sessions needs the PROCESS privilege; without it only the controller's own user's show.
    pub(crate) async fn fence_holders(&self, job: &str) -> Result<Vec<Holder>> {
        let mut slot = self.session().await?;
        let (conn, t) = slot.parts()?;
        let r = async {
            type Row = (u64, Option<String>, Option<String>, Option<String>, Value);
            let rows: Vec<Row> = conn
                .exec(
                    format!(
                        "SELECT h.connection, p.USER, p.DB, p.HOST, x.trx_started \
                         FROM {} AS h \
                         JOIN information_schema.PROCESSLIST AS p ON p.ID = h.connection \
                         JOIN information_schema.INNODB_TRX AS x ON x.trx_mysql_thread_id = h.connection \
                         WHERE h.job_hash = UNHEX(SHA2(?, 256)) AND h.job = ? \
                           AND h.connection <> CONNECTION_ID() ORDER BY h.connection",
                        t.holders
                    ),
                    (job, job),
                )
                .await
                .map_err(Error::from_mysql)?;
            rows.into_iter()
                .filter_map(|(id, user, db, host, since)| {
                    // Holder ids are PostgreSQL pids elsewhere; a connection id past i32 cannot
                    // be named (ended by a DBA: the Event says so).
                    let pid = i32::try_from(id).ok()?;
                    Some(timestamp_opt(since).map(|since| Holder {
                        pid,
                        role: user.unwrap_or_default(),
                        application: db.unwrap_or_default(),
                        client: host.unwrap_or_default(),
                        since,
                    }))
                })
                .collect()
        }
        .await;
        slot.settle(r)
    }

    /// See [`crate::backstop::Backstop::end_holder`]: `KILL CONNECTION` (its transaction rolls
    /// back). Needs the CONNECTION ADMIN privilege (or SUPER) for other users' connections.
    pub(crate) async fn end_holder(&self, pid: i32) -> Result<std::result::Result<(), String>> {
        let mut slot = self.session().await?;
        let r = match slot
            .conn()?
            .query_drop(format!("KILL CONNECTION {pid}"))
            .await
        {
            Ok(()) => Ok(Ok(())),
            Err(mysql_async::Error::Server(s)) if s.code == 1094 => {
                Ok(Err("the session was gone already".to_string()))
            }
            Err(mysql_async::Error::Server(s)) => Ok(Err(format!(
                "{} (error {}, SQLSTATE {})",
                crate::backstop::server_words(&s.message),
                s.code,
                s.state
            ))),
            Err(e) => Err(Error::from_mysql(e)),
        };
        slot.settle(r)
    }
}

/// A run with a registered attempt started: it is not withdrawn or retired as unstarted.
async fn not_started<Q: Queryable>(q: &mut Q, t: &Tables, job: &str, token: u64) -> Result<()> {
    let first: Option<String> = q
        .exec_first(
            format!(
                "SELECT attempt FROM {} WHERE job = ? AND token = ? ORDER BY seq LIMIT 1",
                t.attempts
            ),
            (job, to_i64(token)?),
        )
        .await
        .map_err(Error::from_mysql)?;
    match first {
        Some(attempt) => Err(Error::RunStarted {
            job: job.to_string(),
            token,
            attempt,
        }),
        None => Ok(()),
    }
}
