//! The database a chaos row's backstop and workload use ([`Db`]): PostgreSQL (most rows) or
//! MariaDB (`spec.backstop.mysql`, the `*-mariadb` rows). For MariaDB, the simulated workload's
//! registration and fenced write, and the claims and committed attempts the checker reads, in
//! that database. A MariaDB error does not end the transaction it happened in: after a refusal
//! the workload rolls back, as docs/fencing.md asks of a workload.

use std::collections::HashMap;

use anyhow::{Context as _, Result};
use jiff::Timestamp;
use mysql_async::Value;
use mysql_async::prelude::Queryable;

use super::check::{Claim, CommittedAttempt, WriteResult};
use super::world;
use crate::{mariadb, mysql_datetime, mysql_timestamp};

/// The backstop database of a chaos world, which its workload writes to as well.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Db {
    /// `spec.backstop.postgres` at `DATABASE_URL`.
    #[default]
    Postgres,
    /// `spec.backstop.mysql` at `MARIADB_URL`.
    Mariadb,
}

impl Db {
    /// The URL the backstop Secret holds.
    pub fn url(self) -> Result<String> {
        match self {
            Db::Postgres => crate::database_url(),
            Db::Mariadb => crate::mariadb_url(),
        }
    }

    /// The `spec.backstop` lines (plus `extra` spec lines) for this database.
    pub fn backstop_spec(self, secret: &str, prefix: &str, extra: &str) -> String {
        match self {
            Db::Postgres => crate::backstop_spec(secret, prefix, extra),
            Db::Mariadb => crate::mysql_backstop_spec(secret, prefix, extra),
        }
    }

    /// Creates the workload's table of committed writes; whether the backstop registers attempts
    /// (MariaDB's always does: its schema has had `<p>attempt` from its first version).
    pub async fn prepare_workload(self, prefix: &str) -> Result<bool> {
        match self {
            Db::Postgres => {
                let db = crate::pg().await?;
                world::create_writes_table(&db, prefix).await?;
                world::has_attempts(&db, prefix).await
            }
            Db::Mariadb => {
                create_writes_table(prefix).await?;
                Ok(true)
            }
        }
    }

    /// [`world::register_with_retry`] in this database.
    pub async fn register_with_retry(
        self,
        prefix: &str,
        key: &str,
        token: u64,
        attempt: &str,
    ) -> std::result::Result<(), WriteResult> {
        match self {
            Db::Postgres => world::register_with_retry(prefix, key, token, attempt).await,
            Db::Mariadb => world::with_retry(|| register(prefix, key, token, attempt)).await,
        }
    }

    /// [`world::write_with_retry`] in this database (on MariaDB always with the attempt: it has
    /// no fence without one).
    pub async fn write_with_retry(
        self,
        prefix: &str,
        key: &str,
        period: Timestamp,
        token: u64,
        held: bool,
        attempt: Option<&str>,
    ) -> WriteResult {
        match (self, attempt) {
            (Db::Postgres, _) => {
                world::write_with_retry(prefix, key, period, token, held, attempt).await
            }
            (Db::Mariadb, Some(a)) => {
                world::with_retry(|| fenced_write(prefix, key, period, token, held, a))
                    .await
                    .unwrap_or_else(|r| r)
            }
            (Db::Mariadb, None) => WriteResult::Rejected {
                sqlstate: *b"22023",
            },
        }
    }

    /// The backstop's claim rows under `prefix`, by job key.
    pub async fn claims(self, prefix: &str) -> Result<HashMap<String, Vec<Claim>>> {
        match self {
            Db::Postgres => world::claims_in(&crate::pg().await?, prefix).await,
            Db::Mariadb => claims_in(prefix).await,
        }
    }

    /// The workload's committed attempts with their registrations ([`world::committed_attempts`]).
    pub async fn committed_attempts(self, prefix: &str) -> Result<Vec<CommittedAttempt>> {
        match self {
            Db::Postgres => world::committed_attempts(&crate::pg().await?, prefix).await,
            Db::Mariadb => committed_attempts(prefix).await,
        }
    }
}

/// What a MariaDB error says of a fence's verdict (its SQLSTATE, as on PostgreSQL); None for
/// anything else (the server unreachable, a deadlock): retried.
fn classify(e: &mysql_async::Error) -> Option<WriteResult> {
    match e {
        mysql_async::Error::Server(s) => world::classify_sqlstate(&s.state),
        _ => None,
    }
}

/// The simulated workload's table of committed writes in MariaDB (as PostgreSQL's: one row per
/// accepted fenced write, with its attempt and the database's time of the write).
async fn create_writes_table(prefix: &str) -> Result<()> {
    let mut conn = mariadb().await?;
    conn.query_drop(format!(
        "CREATE TABLE IF NOT EXISTS {prefix}chaos_writes (\
         id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
         job VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
         period DATETIME(6) NOT NULL, token BIGINT NOT NULL, held BOOLEAN NOT NULL, \
         attempt VARCHAR(253) CHARACTER SET ascii COLLATE ascii_bin NULL, \
         at DATETIME(6) NOT NULL) ENGINE=InnoDB"
    ))
    .await?;
    conn.disconnect().await?;
    Ok(())
}

/// A pod's registration (`<p>attempt`, autocommit): Ok(Err) when the fence refused it.
async fn register(
    prefix: &str,
    key: &str,
    token: u64,
    attempt: &str,
) -> Result<std::result::Result<(), WriteResult>> {
    let mut conn = mariadb().await?;
    let r = conn
        .exec_drop(
            format!("SELECT {prefix}attempt(?, ?, ?)"),
            (key, token as i64, attempt),
        )
        .await;
    let _ = conn.disconnect().await;
    match r {
        Ok(()) => Ok(Ok(())),
        Err(e) => match classify(&e) {
            Some(refused) => Ok(Err(refused)),
            None => Err(e.into()),
        },
    }
}

/// The workload's transaction: the fence first, then its write, then COMMIT; after a refusal,
/// ROLLBACK (MariaDB left the transaction open). Ok(Ok) is the fence's verdict; Err is retried.
async fn fenced_write(
    prefix: &str,
    key: &str,
    period: Timestamp,
    token: u64,
    held: bool,
    attempt: &str,
) -> Result<std::result::Result<WriteResult, WriteResult>> {
    let mut conn = mariadb().await?;
    conn.query_drop("START TRANSACTION").await?;
    let token_i = token as i64;
    let fenced = conn
        .exec_drop(
            format!("SELECT {prefix}fence(?, ?, ?)"),
            (key, token_i, attempt),
        )
        .await;
    if let Err(e) = fenced {
        // Nothing of this transaction may commit; a lost connection ends it on the server too.
        let _ = conn.query_drop("ROLLBACK").await;
        return match classify(&e) {
            Some(r) => Ok(Ok(r)),
            None => Err(e.into()),
        };
    }
    conn.exec_drop(
        format!(
            "INSERT INTO {prefix}chaos_writes (job, period, token, held, attempt, at) \
             VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6))"
        ),
        (key, mysql_datetime(period), token_i, held, attempt),
    )
    .await?;
    let seq = conn.last_insert_id().context("the write got no id")? as i64;
    conn.query_drop("COMMIT").await?;
    let _ = conn.disconnect().await;
    Ok(Ok(WriteResult::Accepted { seq }))
}

/// The MariaDB backstop's claim rows under `prefix`, by job key.
async fn claims_in(prefix: &str) -> Result<HashMap<String, Vec<Claim>>> {
    let mut conn = mariadb().await?;
    let rows: Vec<(String, Value, i64)> = conn
        .exec(format!("SELECT job, period, token FROM {prefix}claims"), ())
        .await?;
    let _ = conn.disconnect().await;
    let mut claims: HashMap<String, Vec<Claim>> = HashMap::new();
    for (job, period, token) in rows {
        claims.entry(job).or_default().push(Claim {
            period: mysql_timestamp(period)?,
            token: token as u64,
        });
    }
    Ok(claims)
}

/// The simulated workload's committed writes that name an attempt, with the attempt's
/// registration (`<p>attempts`: order and time) when there is one.
async fn committed_attempts(prefix: &str) -> Result<Vec<CommittedAttempt>> {
    type Row = (String, Value, i64, String, Option<i64>, Value, Value);
    let mut conn = mariadb().await?;
    let rows: Vec<Row> = conn
        .exec(
            format!(
                "SELECT w.job, w.period, w.token, w.attempt, a.seq, a.registered_at, w.at \
                 FROM {prefix}chaos_writes w LEFT JOIN {prefix}attempts a \
                   ON a.job = w.job AND a.token = w.token AND a.attempt = w.attempt \
                 WHERE w.attempt IS NOT NULL"
            ),
            (),
        )
        .await?;
    let _ = conn.disconnect().await;
    rows.into_iter()
        .map(|(job, period, token, attempt, seq, registered_at, at)| {
            Ok(CommittedAttempt {
                job,
                period: mysql_timestamp(period)?,
                token: token as u64,
                attempt,
                seq,
                registered_at: match registered_at {
                    Value::NULL => None,
                    v => Some(mysql_timestamp(v)?),
                },
                committed_at: mysql_timestamp(at)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_database_gets_its_own_backstop_kind() {
        for (db, mysql) in [(Db::Postgres, false), (Db::Mariadb, true)] {
            let yaml = crate::sj_yaml("x", "*/2 * * * * *", &db.backstop_spec("db", "p_", ""));
            let sj: singleton::api::SingletonJob = serde_yaml::from_str(&yaml).unwrap();
            let backstop = sj.spec.backstop.expect("a backstop");
            assert_eq!(backstop.mysql.is_some(), mysql, "{db:?}");
            assert_eq!(backstop.postgres.is_some(), !mysql, "{db:?}");
        }
    }

    #[test]
    fn mariadb_datetimes_round_trip() {
        let t: Timestamp = "2027-03-28T01:00:00.123456Z".parse().unwrap();
        assert_eq!(mysql_timestamp(mysql_datetime(t)).unwrap(), t);
        let text = Value::Bytes(b"2027-03-28 01:00:00.123456".to_vec());
        assert_eq!(mysql_timestamp(text).unwrap(), t);
        assert!(mysql_timestamp(Value::Int(3)).is_err());
    }
}
