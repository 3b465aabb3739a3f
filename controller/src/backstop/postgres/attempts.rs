//! Attempts and holders in PostgreSQL (schema 5): see [`crate::backstop::attempts`].

use jiff::Timestamp;

use super::Postgres;
use super::fence::retire_sql;
use super::schema::{Tables, holder_key_sql};
use crate::backstop::{AttemptRow, Holder, owner, to_i64};
use crate::{Error, Result};

impl Postgres {
    /// See [`crate::backstop::Backstop::attempts`].
    pub(crate) async fn attempts(&self, job: &str, token: i64) -> Result<Vec<AttemptRow>> {
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
                owner::check(job, r.get(2), namespace)?;
                if r.get::<_, i64>(0) > token_i || r.get::<_, i64>(1) >= token_i {
                    return Ok(());
                }
            }
            // A fresh snapshot, taken after the row lock: a registration that held it has
            // committed and is seen here.
            not_started(&tx, &t, job, token).await?;
            tx.execute(
                &retire_sql(&t),
                &[&job, &token_i, &owner::recorded(namespace)],
            )
            .await
            .map_err(pg)?;
            tx.commit().await.map_err(pg)
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
        let t = slot.tables()?.clone();
        let client = slot.client_mut()?;
        let r = async {
            let pg = |e| Error::from_pg(e, false);
            let tx = client.transaction().await.map_err(pg)?;
            let row = tx
                .query_opt(
                    &format!(
                        "SELECT namespace FROM {} WHERE job = $1 FOR UPDATE",
                        t.fences
                    ),
                    &[&job],
                )
                .await
                .map_err(pg)?;
            if let Some(r) = &row {
                owner::check(job, r.get(0), namespace)?;
            }
            not_started(&tx, &t, job, token).await?;
            tx.execute(&move_sql(&t), &[&job, &period, &token_i, &reason])
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
    }

    /// See [`crate::backstop::Backstop::fence_holders`].
    pub(crate) async fn fence_holders(&self, job: &str) -> Result<Vec<Holder>> {
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
    }

    /// Ends the session `pid` (`pg_terminate_backend`): Ok(Err(why)) when the server refuses.
    pub(crate) async fn end_holder(&self, pid: i32) -> Result<std::result::Result<(), String>> {
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
    }
}

/// Moves the claim row of (`$1` job, `$2` period, `$3` token) from `<p>claims` into
/// `<p>withdrawn_claims` with the reason `$4`, in one statement: the row leaves the live claims
/// in the statement that archives it. An archive row of the token already there (withdrawn
/// before) is kept as it was; a row gone, or naming another token, moves nothing.
fn move_sql(t: &Tables) -> String {
    format!(
        "WITH gone AS (\
             DELETE FROM {claims} WHERE job = $1 AND period = $2 AND token = $3 \
             RETURNING job, period, token, job_name, cluster, claimed_at) \
         INSERT INTO {withdrawn} (job, period, token, job_name, cluster, claimed_at, reason) \
         SELECT job, period, token, job_name, cluster, claimed_at, $4::text FROM gone \
         ON CONFLICT ON CONSTRAINT {p}withdrawn_claims_pkey DO NOTHING",
        claims = t.claims,
        withdrawn = t.withdrawn_claims,
        p = t.prefix,
    )
}

/// Refuses ([`Error::RunStarted`]) when an attempt of `job`'s run with `token` registered; to be
/// asked under the fence row's lock, which every registration takes.
async fn not_started(
    tx: &tokio_postgres::Transaction<'_>,
    t: &Tables,
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
