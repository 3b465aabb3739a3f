//! Attempts and holders (schema 5, issue 31): what the controller reads and does about the pods of
//! a run in the backstop. The workload's side (`<p>attempt()` and the three-argument
//! `<p>fence()`) is SQL in [`super::schema`]; see docs/fencing.md.
//!
//! - [`Backstop::attempts`]: the attempts of a run that registered, in order (status, tests).
//! - [`Backstop::retire_unstarted`]: retires the token of a run decided without a Job, unless an
//!   attempt of it registered: then a Job of that token did run, and "decided without a Job" is
//!   a stale replica's mistake (F4), refused inside the database.
//! - [`Backstop::fence_holders`] and [`Backstop::end_fence_holders`]: the sessions holding a job's
//!   fence in an open transaction (a workload on a dead node), and ending them (break-lock, F6).

use jiff::Timestamp;

use super::schema::holder_key_sql;
use super::{Backstop, to_i64};
use crate::{Error, Result};

/// One registered attempt of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptRow {
    /// 1 for the first attempt of the run, then 2, ...
    pub seq: i32,
    /// The attempt's id: its pod's uid (`SINGLETON_ATTEMPT`).
    pub attempt: String,
    /// When it registered, by the database's clock.
    pub registered_at: Timestamp,
}

/// A database session holding a job's fence (inside a fenced transaction or a registration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: i32,
    /// The session's login role, application name and client address, for the operator.
    pub role: String,
    pub application: String,
    pub client: String,
    /// Since when its transaction is open.
    pub since: Option<Timestamp>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} (role {}", self.pid, self.role)?;
        if !self.application.is_empty() {
            write!(f, ", application {}", self.application)?;
        }
        if !self.client.is_empty() {
            write!(f, ", client {}", self.client)?;
        }
        if let Some(since) = self.since {
            write!(f, ", transaction open since {since}")?;
        }
        write!(f, ")")
    }
}

/// What became of one holder that [`Backstop::end_fence_holders`] tried to end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    pub holder: Holder,
    /// Ok: its session was terminated (its transaction rolled back); Err: why it could not be
    /// (typically: the controller's role may not signal that role's sessions).
    pub result: std::result::Result<(), String>,
}

impl Backstop {
    /// The attempts that registered for `job`'s run with `token`, oldest first.
    pub async fn attempts(&self, job: &str, token: u64) -> Result<Vec<AttemptRow>> {
        let token = to_i64(token)?;
        self.bounded("read attempts", async {
            let mut slot = self.session().await?;
            let sql = format!(
                "SELECT seq, attempt, registered_at FROM {} WHERE job = $1 AND token = $2 ORDER BY seq",
                slot.tables()?.attempts
            );
            let r = slot
                .client()?
                .query(&sql, &[&job, &token])
                .await
                .map_err(|e| Error::from_pg(e, false))
                .map(|rows| {
                    rows.iter()
                        .map(|r| AttemptRow {
                            seq: r.get(0),
                            attempt: r.get(1),
                            registered_at: r.get(2),
                        })
                        .collect()
                });
            slot.settle(r)
        })
        .await
    }

    /// Retires `token` of `job` for a period decided without a Job (rejected, name taken,
    /// missed), unless an attempt of that token registered: then a Job with the token ran (a
    /// replica that paused past its Lease decided the claim another replica had completed), and
    /// retiring would fence out a live run ([`Error::RunStarted`]). The check and the
    /// retirement happen under the fence row's lock, which every registration takes: a
    /// registration either precedes the check (and is seen) or follows the retirement (and is
    /// refused). Idempotent; a token already below the fence or retired changes nothing.
    pub async fn retire_unstarted(&self, job: &str, token: u64, namespace: &str) -> Result<()> {
        let token_i = to_i64(token)?;
        self.bounded("retire unstarted token", async {
            let mut slot = self.session().await?;
            let t = slot.tables()?.clone();
            let client = slot.client_mut()?;
            let r = async {
                let pg = |e| Error::from_pg(e, false);
                let tx = client.transaction().await.map_err(pg)?;
                let row = tx
                    .query_opt(
                        &format!(
                            "SELECT token, retired, namespace FROM {} WHERE job = $1 FOR UPDATE",
                            t.fences
                        ),
                        &[&job],
                    )
                    .await
                    .map_err(pg)?;
                if let Some(r) = &row {
                    super::owner::check(job, r.get(2), namespace)?;
                    if r.get::<_, i64>(0) > token_i || r.get::<_, i64>(1) >= token_i {
                        return Ok(());
                    }
                }
                // A fresh snapshot, taken after the row lock: a registration that held it has
                // committed and is seen here.
                not_started(&tx, &t, job, token).await?;
                tx.execute(
                    &super::retire_sql(&t),
                    &[&job, &token_i, &super::owner::recorded(namespace)],
                )
                .await
                .map_err(pg)?;
                tx.commit().await.map_err(pg)
            }
            .await;
            slot.settle(r)
        })
        .await
    }

    /// Withdraws the claim of (`job`, `period`) with `token`, if its row exists and still names
    /// that token, and retires the token: its period was decided without a Job while the
    /// database did not answer in the middle of the claim (F10c), so the row, if the claim did
    /// commit, names a Job that never existed. Refused ([`Error::RunStarted`]) if an attempt of
    /// the token registered. Idempotent.
    /// Refused ([`Error::NotOwner`]) when the job key belongs to a namespace other than
    /// `namespace` (empty: not checked): a planted `unsettledClaims` entry must not delete
    /// another tenant's claim.
    pub async fn withdraw(
        &self,
        job: &str,
        period: Timestamp,
        token: u64,
        namespace: &str,
    ) -> Result<()> {
        let token_i = to_i64(token)?;
        self.bounded("withdraw claim", async {
            let mut slot = self.session().await?;
            let t = slot.tables()?.clone();
            let client = slot.client_mut()?;
            let r = async {
                let pg = |e| Error::from_pg(e, false);
                let tx = client.transaction().await.map_err(pg)?;
                let row = tx
                    .query_opt(
                        &format!("SELECT namespace FROM {} WHERE job = $1 FOR UPDATE", t.fences),
                        &[&job],
                    )
                    .await
                    .map_err(pg)?;
                if let Some(r) = &row {
                    super::owner::check(job, r.get(0), namespace)?;
                }
                not_started(&tx, &t, job, token).await?;
                tx.execute(
                    &format!("DELETE FROM {} WHERE job = $1 AND period = $2 AND token = $3", t.claims),
                    &[&job, &period, &token_i],
                )
                .await
                .map_err(pg)?;
                tx.execute(
                    &format!(
                        "UPDATE {} SET retired = greatest(retired, $2) WHERE job = $1 AND token >= $2",
                        t.fences
                    ),
                    &[&job, &token_i],
                )
                .await
                .map_err(pg)?;
                tx.commit().await.map_err(pg)
            }
            .await;
            slot.settle(r)
        })
        .await
    }

    /// The sessions holding `job`'s fence now: each fenced transaction and registration holds a
    /// shared advisory lock keyed by the job (schema 5) until it ends. Empty before schema 5's
    /// functions are in use.
    pub async fn fence_holders(&self, job: &str) -> Result<Vec<Holder>> {
        self.bounded("read fence holders", async {
            let mut slot = self.session().await?;
            let sql = holders_sql(&holder_key_sql(slot.tables()?));
            let r = slot
                .client()?
                .query(&sql, &[&job])
                .await
                .map_err(|e| Error::from_pg(e, false))
                .map(|rows| {
                    rows.iter()
                        .map(|r| Holder {
                            pid: r.get(0),
                            role: r.get::<_, Option<String>>(1).unwrap_or_default(),
                            application: r.get::<_, Option<String>>(2).unwrap_or_default(),
                            client: r.get::<_, Option<String>>(3).unwrap_or_default(),
                            since: r.get(4),
                        })
                        .collect()
                });
            slot.settle(r)
        })
        .await
    }

    /// Ends the sessions holding `job`'s fence (`pg_terminate_backend`): their open transactions
    /// roll back, so nothing they wrote commits, and the fence row is free. Each holder is tried
    /// on its own: PostgreSQL lets the controller's role end only sessions of roles it is a
    /// member of (or with `pg_signal_backend`); the others are reported with the reason.
    pub async fn end_fence_holders(&self, job: &str) -> Result<Vec<Ended>> {
        let holders = self.fence_holders(job).await?;
        let mut ended = Vec::with_capacity(holders.len());
        for holder in holders {
            let pid = holder.pid;
            let result = self
                .bounded("end fence holder", async {
                    let mut slot = self.session().await?;
                    let r = match slot
                        .client()?
                        .query_one("SELECT pg_catalog.pg_terminate_backend($1)", &[&pid])
                        .await
                    {
                        Ok(row) if row.get::<_, bool>(0) => Ok(Ok(())),
                        Ok(_) => Ok(Err("the session was gone already".to_string())),
                        Err(e) => match e.as_db_error() {
                            Some(db) => Ok(Err(format!(
                                "{} (SQLSTATE {})",
                                db.message(),
                                db.code().code()
                            ))),
                            None => Err(Error::from_pg(e, false)),
                        },
                    };
                    slot.settle(r)
                })
                .await?;
            ended.push(Ended { holder, result });
        }
        Ok(ended)
    }
}

/// Refuses ([`Error::RunStarted`]) when an attempt of `job`'s run with `token` registered; to be
/// asked under the fence row's lock, which every registration takes.
async fn not_started(
    tx: &tokio_postgres::Transaction<'_>,
    t: &super::schema::Tables,
    job: &str,
    token: u64,
) -> Result<()> {
    let first = tx
        .query_opt(
            &format!(
                "SELECT attempt FROM {} WHERE job = $1 AND token = $2 ORDER BY seq LIMIT 1",
                t.attempts
            ),
            &[&job, &to_i64(token)?],
        )
        .await
        .map_err(|e| Error::from_pg(e, false))?;
    match first {
        Some(row) => Err(Error::RunStarted {
            job: job.to_string(),
            token,
            attempt: row.get(0),
        }),
        None => Ok(()),
    }
}

/// The holders of the advisory lock `key` (an expression of `$1`, the job) in this database,
/// other than this session.
fn holders_sql(key: &str) -> String {
    format!(
        "SELECT l.pid, a.usename::text, a.application_name, host(a.client_addr), a.xact_start \
         FROM pg_catalog.pg_locks AS l LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
           AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database()) \
           AND ((l.classid::bigint << 32) | l.objid::bigint) = {key} \
           AND l.pid <> pg_catalog.pg_backend_pid() \
         ORDER BY l.pid"
    )
}

#[cfg(test)]
mod tests;
