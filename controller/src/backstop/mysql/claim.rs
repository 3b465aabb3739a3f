//! The claim transaction on MariaDB/MySQL: the same steps, and the same guarantees, as
//! PostgreSQL's (postgres/claim.rs). What differs is how a statement says "the row was there":
//! an INSERT of an existing (job, period) fails with a duplicate key (after waiting for a racing
//! claim's insert to commit or roll back), and an error does not end the transaction here, so
//! the claim goes on to judge the row.

use jiff::Timestamp;
use mysql_async::prelude::Queryable;
use mysql_async::{Transaction, TxOpts, Value};

use super::schema::Tables;
use super::time::{timestamp, timestamp_opt, value};
use super::{Mysql, error};
use crate::backstop::{Claim, ClaimOutcome, multi, owner, to_i64, to_u64};
use crate::{Error, Result};

impl Mysql {
    /// See [`crate::backstop::Backstop::claim_as`].
    pub(crate) async fn claim(&self, c: &Claim<'_>) -> Result<ClaimOutcome> {
        let mut slot = self.session().await?;
        let (conn, t) = slot.parts()?;
        let r = claim_tx(conn, &t, c).await;
        slot.settle(r)
    }
}

/// What a step of the claim decided.
enum Step {
    Next,
    End(Result<ClaimOutcome>),
}

async fn claim_tx(conn: &mut mysql_async::Conn, t: &Tables, c: &Claim<'_>) -> Result<ClaimOutcome> {
    let mut tx = conn
        .start_transaction(TxOpts::default())
        .await
        .map_err(Error::from_mysql)?;
    let mut outcome = ClaimOutcome::Claimed;
    let steps = async {
        // 1. N4: another namespace's claim learns nothing of the key's claims.
        if let Step::End(r) = owned_elsewhere(&mut tx, t, c).await? {
            return Ok(Step::End(r));
        }
        // 2. Multi-cluster (F7) and standbys: not before the database's clock says so.
        if let Step::End(r) = not_yet(&mut tx, c).await? {
            return Ok(Step::End(r));
        }
        // 3. G1: the period's one row, inserted, or judged where it exists.
        if !insert_row(&mut tx, t, c).await? {
            match judge_existing(&mut tx, t, c).await? {
                Ok(took_over) => outcome = took_over,
                Err(end) => return Ok(Step::End(end)),
            }
        }
        // 4. G3: the fence advances to the token, strictly; the owner checked under its lock.
        if let Step::End(r) = advance_fence(&mut tx, t, c).await? {
            return Ok(Step::End(r));
        }
        // 5. Tokens follow the periods across clusters.
        later_elsewhere(&mut tx, t, c).await
    }
    .await;
    match steps {
        Ok(Step::Next) => {
            tx.commit().await.map_err(Error::from_mysql)?;
            Ok(outcome)
        }
        Ok(Step::End(r)) => {
            tx.rollback().await.map_err(Error::from_mysql)?;
            r
        }
        Err(e) => {
            // A failed statement leaves the transaction open here: end it before the error.
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// N4 (see postgres/claim.rs): read unlocked for the early answer; decided under the lock later.
async fn owned_elsewhere(tx: &mut Transaction<'_>, t: &Tables, c: &Claim<'_>) -> Result<Step> {
    let owner: Option<Option<String>> = tx
        .exec_first(
            format!("SELECT namespace FROM {} WHERE job = ?", t.fences),
            (c.job,),
        )
        .await
        .map_err(Error::from_mysql)?;
    Ok(match owner.flatten() {
        Some(owner) if owner::refuses(Some(owner.as_str()), &c.claimer.namespace) => {
            Step::End(Ok(ClaimOutcome::NotOwner { owner }))
        }
        _ => Step::Next,
    })
}

/// The database's clock (F7, standbys), as in postgres/claim.rs.
async fn not_yet(tx: &mut Transaction<'_>, c: &Claim<'_>) -> Result<Step> {
    let shared = c.claimer.scheduled && !c.claimer.cluster.is_empty();
    if !(shared || c.claimer.standby_delay.is_some()) || c.takes_over.is_some() {
        return Ok(Step::Next);
    }
    let db_now = db_now(tx).await?;
    let until = match multi::standby_until(c.claimer, c.period, db_now) {
        Some(until) => Some(until),
        None => (shared && db_now < c.period).then_some(c.period),
    };
    Ok(match until {
        Some(until) => Step::End(Ok(ClaimOutcome::NotYet { until })),
        None => Step::Next,
    })
}

pub(super) async fn db_now<Q: Queryable>(q: &mut Q) -> Result<Timestamp> {
    let now: Option<Value> = q
        .query_first("SELECT UTC_TIMESTAMP(6)")
        .await
        .map_err(Error::from_mysql)?;
    timestamp(now.unwrap_or(Value::NULL))
}

/// Inserts the period's row; false when a row was there. A rerun moves the row from the token
/// it expects (compare-and-swap), or inserts it when there is none.
async fn insert_row(tx: &mut Transaction<'_>, t: &Tables, c: &Claim<'_>) -> Result<bool> {
    let cluster = c.claimer.cluster.as_str();
    if let Some(old) = c.takes_over {
        tx.exec_drop(
            format!(
                "UPDATE {} SET token = ?, job_name = ?, cluster = ?, claimed_at = UTC_TIMESTAMP(6), \
                 confirmed_at = NULL, outcome = NULL WHERE job = ? AND period = ? AND token = ?",
                t.claims
            ),
            (c.token, c.job_name, cluster, c.job, value(c.period), old),
        )
        .await
        .map_err(Error::from_mysql)?;
        if tx.affected_rows() == 1 {
            return Ok(true);
        }
    }
    let inserted = tx
        .exec_drop(
            format!(
                "INSERT INTO {} (job, period, token, job_name, claimed_at, cluster) \
                 VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6), ?)",
                t.claims
            ),
            (c.job, value(c.period), c.token, c.job_name, cluster),
        )
        .await;
    match inserted {
        Ok(()) => Ok(true),
        Err(e) if error::is_duplicate(&e) => Ok(false),
        Err(e) => Err(Error::from_mysql(e)),
    }
}

/// The period has a row: judged as in postgres/claim.rs ([`multi::judge`]), locked.
async fn judge_existing(
    tx: &mut Transaction<'_>,
    t: &Tables,
    c: &Claim<'_>,
) -> Result<std::result::Result<ClaimOutcome, Result<ClaimOutcome>>> {
    type Row = (i64, String, String, Value, Value, Value);
    let row: Option<Row> = tx
        .exec_first(
            format!(
                "SELECT token, job_name, cluster, claimed_at, confirmed_at, UTC_TIMESTAMP(6) \
                 FROM {} WHERE job = ? AND period = ? FOR UPDATE",
                t.claims
            ),
            (c.job, value(c.period)),
        )
        .await
        .map_err(Error::from_mysql)?;
    let (token, job_name_there, cluster, claimed_at, confirmed_at, now) =
        row.ok_or_else(|| Error::Backstop("the claim row conflicted but then vanished".into()))?;
    let existing = multi::Existing {
        token: to_u64(token)?,
        cluster,
        claimed_at: timestamp(claimed_at)?,
        confirmed: timestamp_opt(confirmed_at)?.is_some(),
    };
    let db_now = timestamp(now)?;
    let verdict = match c.takes_over {
        Some(_) => multi::Verdict::Duplicate,
        None => multi::judge(&existing, c.claimer, c.token.unsigned_abs(), db_now),
    };
    match multi::answer(verdict, &existing, job_name_there) {
        Some(end) => Ok(Err(Ok(end))),
        None => {
            take_over(tx, t, c, existing.token).await?;
            Ok(Ok(ClaimOutcome::TookOver {
                cluster: existing.cluster,
                token: existing.token,
            }))
        }
    }
}

/// Moves the locked row from `from` to this claim.
async fn take_over(tx: &mut Transaction<'_>, t: &Tables, c: &Claim<'_>, from: u64) -> Result<()> {
    tx.exec_drop(
        format!(
            "UPDATE {} SET token = ?, job_name = ?, cluster = ?, claimed_at = UTC_TIMESTAMP(6), \
             confirmed_at = NULL WHERE job = ? AND period = ? AND token = ?",
            t.claims
        ),
        (
            c.token,
            c.job_name,
            c.claimer.cluster.as_str(),
            c.job,
            value(c.period),
            to_i64(from)?,
        ),
    )
    .await
    .map_err(Error::from_mysql)?;
    if tx.affected_rows() != 1 {
        return Err(Error::Backstop(
            "a locked claim row moved during its takeover".into(),
        ));
    }
    Ok(())
}

/// G3: only upward, strictly, under the fence row's lock (which a workload's open fenced
/// transaction holds: then this waits, up to the lock wait, and ends as `FenceHeld`). The row is
/// made first when the job has none, owned by the controller's user; the owner namespace is
/// recorded by the first claim and checked under the lock.
async fn advance_fence(tx: &mut Transaction<'_>, t: &Tables, c: &Claim<'_>) -> Result<Step> {
    let namespace = c.claimer.namespace.as_str();
    let (current, _, owner) = super::fence::lock_fence(tx, t, c.job).await?;
    if owner::refuses(owner.as_deref(), namespace) {
        return Ok(Step::End(Ok(ClaimOutcome::NotOwner {
            owner: owner.unwrap_or_default(),
        })));
    }
    if current >= c.token {
        return Ok(Step::End(Err(Error::StaleToken {
            job: c.job.to_string(),
            token: c.token.unsigned_abs(),
            current: to_u64(current)?,
        })));
    }
    tx.exec_drop(
        format!(
            "UPDATE {} SET token = ?, namespace = COALESCE(namespace, ?) WHERE job = ?",
            t.fences
        ),
        (c.token, owner::recorded(namespace), c.job),
    )
    .await
    .map_err(Error::from_mysql)?;
    Ok(Step::Next)
}

/// F14, as in postgres/claim.rs: a scheduled claim older than another cluster's latest
/// scheduled one is superseded (manual periods, never on a whole second, do not count).
async fn later_elsewhere(tx: &mut Transaction<'_>, t: &Tables, c: &Claim<'_>) -> Result<Step> {
    if !c.claimer.scheduled || c.claimer.cluster.is_empty() || c.takes_over.is_some() {
        return Ok(Step::Next);
    }
    let row: Option<(Value, String, i64)> = tx
        .exec_first(
            format!(
                "SELECT period, cluster, token FROM {} \
                 WHERE job = ? AND period > ? AND cluster <> ? AND MICROSECOND(period) = 0 \
                 ORDER BY period DESC LIMIT 1",
                t.claims
            ),
            (c.job, value(c.period), c.claimer.cluster.as_str()),
        )
        .await
        .map_err(Error::from_mysql)?;
    Ok(match row {
        Some((period, cluster, token)) => Step::End(Ok(ClaimOutcome::Superseded {
            period: timestamp(period)?,
            cluster,
            token: to_u64(token)?,
        })),
        None => Step::Next,
    })
}
