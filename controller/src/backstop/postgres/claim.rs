//! The claim transaction (layer 4; G1, G3, and multi-cluster arbitration): one transaction that
//! inserts the period's row under UNIQUE(job, period), or judges the row already there, then
//! advances the fence to the claim's token. Each step below returns early (rolled back) with the
//! outcome that ends the claim; a claim that passes them all commits.

use jiff::Timestamp;
use tokio_postgres::Transaction;

use super::Postgres;
use super::fence::claim_fence_sql;
use super::schema::Tables;
use crate::backstop::{Claim, ClaimOutcome, multi, owner, to_i64, to_u64};
use crate::{Error, Result};

impl Postgres {
    /// See [`crate::backstop::Backstop::claim_as`].
    pub(crate) async fn claim(&self, c: &Claim<'_>) -> Result<ClaimOutcome> {
        let mut slot = self.session().await?;
        let t = slot.tables()?.clone();
        let r = claim_tx(slot.client_mut()?, &t, c).await;
        slot.settle(r)
    }
}

fn pg(e: tokio_postgres::Error) -> Error {
    Error::from_pg(e, false)
}

/// What a step of the claim decided.
enum Step {
    /// Go on to the next step.
    Next,
    /// The claim ends here, rolled back, with this answer.
    End(Result<ClaimOutcome>),
}

async fn claim_tx(
    client: &mut tokio_postgres::Client,
    t: &Tables,
    c: &Claim<'_>,
) -> Result<ClaimOutcome> {
    // Dropping the transaction without commit rolls it back (also on an early `?`).
    let tx = client.transaction().await.map_err(pg)?;
    let mut outcome = ClaimOutcome::Claimed;
    let steps = async {
        // 1. N4: another namespace's claim learns nothing of the key's claims.
        if let Step::End(r) = owned_elsewhere(&tx, t, c).await? {
            return Ok(Step::End(r));
        }
        // 2. Multi-cluster (F7) and standbys: not before the database's clock says so.
        if let Step::End(r) = not_yet(&tx, c).await? {
            return Ok(Step::End(r));
        }
        // 3. G1: the period's one row, inserted, or judged where it exists (a takeover moves
        //    it to this claim and goes on).
        if !insert_row(&tx, t, c).await? {
            match judge_existing(&tx, t, c).await? {
                Ok(took_over) => outcome = took_over,
                Err(end) => return Ok(Step::End(end)),
            }
        }
        // 4. G3: the fence advances to the token, strictly; the owner is checked under its lock.
        if let Step::End(r) = advance_fence(&tx, t, c).await? {
            return Ok(Step::End(r));
        }
        // 5. Tokens follow the periods across clusters.
        later_elsewhere(&tx, t, c).await
    }
    .await?;
    match steps {
        Step::Next => {
            tx.commit().await.map_err(pg)?;
            Ok(outcome)
        }
        Step::End(r) => {
            tx.rollback().await.map_err(pg)?;
            r
        }
    }
}

/// N4: a job key belongs to the namespace of its first claim; another namespace's claim is
/// refused before it reads or writes anything of the key's claims. The owner is read unlocked
/// here (the early answer); the check under the row's lock at the fence advance decides.
async fn owned_elsewhere(tx: &Transaction<'_>, t: &Tables, c: &Claim<'_>) -> Result<Step> {
    let row = tx
        .query_opt(
            &format!("SELECT namespace FROM {} WHERE job = $1", t.fences),
            &[&c.job],
        )
        .await
        .map_err(pg)?;
    let owner: Option<String> = row.and_then(|r| r.get(0));
    Ok(match owner {
        Some(owner) if owner::refuses(Some(owner.as_str()), &c.claimer.namespace) => {
            Step::End(Ok(ClaimOutcome::NotOwner { owner }))
        }
        _ => Step::Next,
    })
}

/// Across clusters a scheduled period is due by the database's clock, the one all clusters
/// share (F7: a cluster whose controller and API server agree but run ahead together must not
/// claim, and so win, early); and a standby's turn comes by it too.
async fn not_yet(tx: &Transaction<'_>, c: &Claim<'_>) -> Result<Step> {
    let shared = c.claimer.scheduled && !c.claimer.cluster.is_empty();
    if !(shared || c.claimer.standby_delay.is_some()) || c.takes_over.is_some() {
        return Ok(Step::Next);
    }
    let db_now: Timestamp = tx.query_one("SELECT now()", &[]).await.map_err(pg)?.get(0);
    let until = match multi::standby_until(c.claimer, c.period, db_now) {
        Some(until) => Some(until),
        None => (shared && db_now < c.period).then_some(c.period),
    };
    Ok(match until {
        Some(until) => Step::End(Ok(ClaimOutcome::NotYet { until })),
        None => Step::Next,
    })
}

/// Inserts the period's row; false when a row was there. The unique constraint decides between
/// racing claimers: the loser waits for the winner's insert to commit, then takes the DO NOTHING
/// branch. A rerun takes the period's row over instead, only from the token it expects
/// (compare-and-swap): the row stays the one claim of the period, and a row that moved meanwhile
/// is left alone (false, then Duplicate).
async fn insert_row(tx: &Transaction<'_>, t: &Tables, c: &Claim<'_>) -> Result<bool> {
    let sql = match c.takes_over {
        None => format!(
            "INSERT INTO {} (job, period, token, job_name, cluster) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT ON CONSTRAINT {}claims_job_period_key DO NOTHING RETURNING token",
            t.claims, t.prefix
        ),
        Some(_) => format!(
            "INSERT INTO {} AS c (job, period, token, job_name, cluster) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT ON CONSTRAINT {}claims_job_period_key DO UPDATE \
             SET token = EXCLUDED.token, job_name = EXCLUDED.job_name, cluster = EXCLUDED.cluster, \
                 claimed_at = now(), confirmed_at = NULL, outcome = NULL \
             WHERE c.token = $6 RETURNING c.token",
            t.claims, t.prefix
        ),
    };
    let old = c.takes_over.unwrap_or_default();
    let cluster = c.claimer.cluster.as_str();
    let params: &[&(dyn tokio_postgres::types::ToSql + Sync)] = match c.takes_over {
        None => &[&c.job, &c.period, &c.token, &c.job_name, &cluster],
        Some(_) => &[&c.job, &c.period, &c.token, &c.job_name, &cluster, &old],
    };
    Ok(tx.query_opt(&sql, params).await.map_err(pg)?.is_some())
}

/// The period has a row: judges it ([`multi::judge`]). Ok(TookOver): the row now names this
/// claim, go on; Err(answer): the claim ends with it (Duplicate, NotYet, ClaimedElsewhere).
async fn judge_existing(
    tx: &Transaction<'_>,
    t: &Tables,
    c: &Claim<'_>,
) -> Result<std::result::Result<ClaimOutcome, Result<ClaimOutcome>>> {
    // A new statement in READ COMMITTED sees the winner's committed row; locked, so a confirm
    // and a takeover of it are serialised with this transaction.
    let row = tx
        .query_opt(
            &format!(
                "SELECT token, job_name, cluster, claimed_at, confirmed_at IS NOT NULL, now() \
                 FROM {} WHERE job = $1 AND period = $2 FOR UPDATE",
                t.claims
            ),
            &[&c.job, &c.period],
        )
        .await
        .map_err(pg)?
        .ok_or_else(|| Error::Backstop("the claim row conflicted but then vanished".into()))?;
    let existing = multi::Existing {
        token: to_u64(row.get(0))?,
        cluster: row.get(2),
        claimed_at: row.get(3),
        confirmed: row.get(4),
    };
    let job_name_there: String = row.get(1);
    let db_now: Timestamp = row.get(5);
    // A rerun's compare-and-swap lost: never a takeover, whatever the row.
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

/// Moves the locked row from `from` to this claim. The row is locked: this compare-and-swap
/// cannot miss. The fence advance that follows, in the same transaction, refuses the earlier
/// claimer's token from the commit on.
async fn take_over(tx: &Transaction<'_>, t: &Tables, c: &Claim<'_>, from: u64) -> Result<()> {
    let moved = tx
        .execute(
            &format!(
                "UPDATE {} SET token = $3, job_name = $4, cluster = $5, \
                 claimed_at = now(), confirmed_at = NULL \
                 WHERE job = $1 AND period = $2 AND token = $6",
                t.claims
            ),
            &[
                &c.job,
                &c.period,
                &c.token,
                &c.job_name,
                &c.claimer.cluster,
                &to_i64(from)?,
            ],
        )
        .await
        .map_err(pg)?;
    if moved != 1 {
        return Err(Error::Backstop(
            "a locked claim row moved during its takeover".into(),
        ));
    }
    Ok(())
}

/// Only upward, and strictly: an equal token would mean two runs share it. The owner is recorded
/// by the first claim and checked again under the row's lock: two namespaces that both found
/// none recorded are serialised here, and the second is refused.
async fn advance_fence(tx: &Transaction<'_>, t: &Tables, c: &Claim<'_>) -> Result<Step> {
    let namespace = c.claimer.namespace.as_str();
    let advanced = tx
        .query_opt(
            &claim_fence_sql(t),
            &[&c.job, &c.token, &owner::recorded(namespace)],
        )
        .await
        .map_err(pg)?;
    let (current, owner): (Option<i64>, Option<String>) = match advanced {
        Some(row) => (None, row.get(1)),
        None => {
            let row = tx
                .query_one(
                    &format!("SELECT token, namespace FROM {} WHERE job = $1", t.fences),
                    &[&c.job],
                )
                .await
                .map_err(pg)?;
            (Some(row.get(0)), row.get(1))
        }
    };
    if owner::refuses(owner.as_deref(), namespace) {
        return Ok(Step::End(Ok(ClaimOutcome::NotOwner {
            owner: owner.unwrap_or_default(),
        })));
    }
    Ok(match current {
        Some(current) => Step::End(Err(Error::StaleToken {
            job: c.job.to_string(),
            token: c.token.unsigned_abs(),
            current: to_u64(current)?,
        })),
        None => Step::Next,
    })
}

/// A scheduled claim of a period older than another cluster's latest scheduled claim is
/// [`ClaimOutcome::Superseded`]. The fence advance before this holds the fence row's lock, which
/// every claim of the job takes: a later period's claim that committed before it is visible to
/// this statement, and one that commits after this gets a higher token. Manual runs (a trigger's
/// period is never on a whole second, [`crate::naming::manual_period`]) are outside the
/// schedule's order: a trigger in one cluster supersedes no scheduled period of another (F14).
async fn later_elsewhere(tx: &Transaction<'_>, t: &Tables, c: &Claim<'_>) -> Result<Step> {
    if !c.claimer.scheduled || c.claimer.cluster.is_empty() || c.takes_over.is_some() {
        return Ok(Step::Next);
    }
    let row = tx
        .query_opt(
            &format!(
                "SELECT period, cluster, token FROM {} \
                 WHERE job = $1 AND period > $2 AND cluster <> $3 \
                   AND period = date_trunc('second', period) \
                 ORDER BY period DESC LIMIT 1",
                t.claims
            ),
            &[&c.job, &c.period, &c.claimer.cluster],
        )
        .await
        .map_err(pg)?;
    Ok(match row {
        Some(r) => Step::End(Ok(ClaimOutcome::Superseded {
            period: r.get(0),
            cluster: r.get(1),
            token: to_u64(r.get(2))?,
        })),
        None => Step::Next,
    })
}
