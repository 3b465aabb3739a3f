//! The MariaDB engine against a real MariaDB at `$MARIADB_URL` (`make up` starts one:
//! hack/mariadb.sh); without it they fail and say so. Each test uses its own table prefix.
//! The workload's side is plain SQL over a connection of its own, as a run would make it.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::ByteString;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder};

use super::schema::SCHEMA_VERSION;
use crate::api::BackstopKind;
use crate::backstop::tests::unique_prefix;
use crate::backstop::{
    Backstop, ClaimOutcome, ConnectionConfig, SecretKeys, TablePrefix, withdrawal,
};
use crate::{Error, Result};

fn mariadb_url() -> String {
    match std::env::var("MARIADB_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "MARIADB_URL is not set: these backstop tests need a real MariaDB. Run `make up`, \
             then `eval \"$(make -s env)\"` (or export MARIADB_URL=$(hack/mariadb.sh url)) and rerun."
        ),
    }
}

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect()
}

fn config(timeout: Duration) -> ConnectionConfig {
    ConnectionConfig::from_secret_as(
        BackstopKind::Mysql,
        &data(&[("url", &mariadb_url())]),
        &SecretKeys::default(),
    )
    .unwrap()
    .with_timeouts(timeout, timeout)
}

fn backstop(prefix: &TablePrefix) -> Backstop {
    Backstop::new(config(Duration::from_secs(10)), prefix.clone()).unwrap()
}

/// A workload's own connection, as `user` (the URL's when `None`).
async fn workload_as(user: Option<(&str, &str)>) -> Conn {
    let c = config(Duration::from_secs(10));
    let (name, password) = match user {
        Some((u, p)) => (u.to_string(), p.to_string()),
        None => (
            c.user.0.clone(),
            c.password.map(|p| p.0).unwrap_or_default(),
        ),
    };
    let opts = OptsBuilder::default()
        .ip_or_hostname(c.host.0.clone())
        .tcp_port(c.port)
        .user(Some(name))
        .pass(Some(password))
        .db_name(c.dbname.map(|d| d.0))
        .prefer_socket(false);
    Conn::new(opts).await.expect("connect to MARIADB_URL")
}

async fn workload() -> Conn {
    workload_as(None).await
}

async fn cleanup(prefix: &TablePrefix) {
    let mut c = workload().await;
    let p = prefix.as_str();
    for s in [
        format!("DROP FUNCTION IF EXISTS {p}fence"),
        format!("DROP FUNCTION IF EXISTS {p}attempt"),
        format!("DROP PROCEDURE IF EXISTS {p}fence_check"),
        format!(
            "DROP TABLE IF EXISTS {p}claims, {p}withdrawn_claims, {p}fences, {p}attempts, \
             {p}schema_version, {p}fence_members, {p}fence_rejections, {p}fence_holders, {p}invoices"
        ),
    ] {
        let _ = c.query_drop(s).await;
    }
}

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// The server's refusal of a statement: (SQLSTATE, errno, message).
fn refusal(r: std::result::Result<(), mysql_async::Error>) -> (String, u16, String) {
    match r {
        Err(mysql_async::Error::Server(s)) => (s.state, s.code, s.message),
        other => panic!("expected a refusal from the server, got {other:?}"),
    }
}

/// `SELECT <p>fence(...)` inside a transaction that then writes a row: the write commits only
/// when the fence lets it. Returns the fence's refusal, if any, after rolling back.
async fn fenced_write(
    conn: &mut Conn,
    p: &TablePrefix,
    job: &str,
    token: i64,
    attempt: &str,
) -> std::result::Result<(), mysql_async::Error> {
    conn.query_drop(format!(
        "CREATE TABLE IF NOT EXISTS {p}invoices (token BIGINT NOT NULL, attempt VARCHAR(253) NOT NULL)"
    ))
    .await?;
    conn.query_drop("START TRANSACTION").await?;
    let fenced = conn
        .exec_drop(format!("SELECT {p}fence(?, ?, ?)"), (job, token, attempt))
        .await;
    if let Err(e) = fenced {
        // MySQL leaves the transaction open after an error: the workload must end it.
        conn.query_drop("ROLLBACK").await?;
        return Err(e);
    }
    conn.exec_drop(
        format!("INSERT INTO {p}invoices (token, attempt) VALUES (?, ?)"),
        (token, attempt),
    )
    .await?;
    conn.query_drop("COMMIT").await
}

async fn register(
    conn: &mut Conn,
    p: &TablePrefix,
    job: &str,
    token: i64,
    attempt: &str,
) -> std::result::Result<i32, mysql_async::Error> {
    let seq: Option<i32> = conn
        .exec_first(format!("SELECT {p}attempt(?, ?, ?)"), (job, token, attempt))
        .await?;
    Ok(seq.unwrap_or_default())
}

#[tokio::test]
async fn the_schema_is_made_once_by_racing_replicas_and_again_safely() -> Result<()> {
    let p = unique_prefix("my_schema");
    let (a, b) = (backstop(&p), backstop(&p));
    let (va, vb) = tokio::join!(a.ensure_schema(), b.ensure_schema());
    assert_eq!((va?, vb?), (SCHEMA_VERSION, SCHEMA_VERSION));
    assert_eq!(backstop(&p).ensure_schema().await?, SCHEMA_VERSION);
    let mut c = workload().await;
    let versions: Vec<(i32, i32)> = c
        .query(format!(
            "SELECT version, needs FROM {p}schema_version ORDER BY version"
        ))
        .await
        .unwrap();
    assert_eq!(
        versions,
        vec![(1, 0), (2, 0)],
        "one row per migration, each only adding"
    );
    cleanup(&p).await;
    Ok(())
}

#[tokio::test]
async fn a_period_is_claimed_once_and_the_fence_only_rises() -> Result<()> {
    let p = unique_prefix("my_claim");
    let b = backstop(&p);
    let job = "billing/invoices";
    let period = ts("2027-01-01T00:00:00Z");
    assert_eq!(b.fence(job).await?, 0);
    assert_eq!(
        b.claim(job, period, 1, "invoices-1", None).await?,
        ClaimOutcome::Claimed
    );
    // The same claim again (a retry after a crash), and another run of the same period.
    for token in [1, 2] {
        assert_eq!(
            b.claim(job, period, token, "invoices-x", None).await?,
            ClaimOutcome::Duplicate {
                token: 1,
                job_name: "invoices-1".into()
            }
        );
    }
    assert_eq!(b.fence(job).await?, 1);
    let row = b.claimed(job, period).await?.expect("the period's row");
    assert_eq!((row.token, row.job_name.as_str()), (1, "invoices-1"));
    // A token not above the fence never claims (two runs would share it).
    let next = ts("2027-01-02T00:00:00Z");
    assert!(matches!(
        b.claim(job, next, 1, "invoices-2", None).await,
        Err(Error::StaleToken { current: 1, .. })
    ));
    assert_eq!(b.claimed(job, next).await?, None, "rolled back whole");
    // A rerun moves the period's row to its token, only from the token it read.
    assert_eq!(
        b.claim(job, period, 3, "invoices-1-rerun", Some(1)).await?,
        ClaimOutcome::Claimed
    );
    assert_eq!(b.claimed(job, period).await?.unwrap().token, 3);
    assert!(matches!(
        b.claim(job, period, 4, "invoices-1-again", Some(1)).await?,
        ClaimOutcome::Duplicate { token: 3, .. }
    ));
    assert_eq!(b.advance_fence(job, 9).await?, 9);
    assert_eq!(b.advance_fence(job, 5).await?, 9, "never lowered");
    cleanup(&p).await;
    Ok(())
}

#[tokio::test]
async fn the_fence_refuses_stale_retired_unissued_superseded_and_foreign_callers() -> Result<()> {
    let p = unique_prefix("my_fence");
    let b = backstop(&p);
    let job = "billing/invoices";
    b.claim(job, ts("2027-01-01T00:00:00Z"), 1, "invoices-1", None)
        .await?;
    let before = b.rejections().await?;
    let mut w = workload().await;
    assert_eq!(register(&mut w, &p, job, 1, "pod-a").await.unwrap(), 1);
    assert_eq!(register(&mut w, &p, job, 1, "pod-a").await.unwrap(), 1);
    fenced_write(&mut w, &p, job, 1, "pod-a").await.unwrap();

    // A newer pod of the run registers: the older one is refused, and cannot come back.
    assert_eq!(register(&mut w, &p, job, 1, "pod-b").await.unwrap(), 2);
    let (state, errno, msg) = refusal(fenced_write(&mut w, &p, job, 1, "pod-a").await);
    assert_eq!((state.as_str(), errno), ("SF004", 31004), "{msg}");
    assert!(msg.contains("superseded by attempt #2 (pod-b)"), "{msg}");
    let (state, _, _) = refusal(register(&mut w, &p, job, 1, "pod-a").await.map(|_| ()));
    assert_eq!(state, "SF004");
    let (state, _, msg) = refusal(fenced_write(&mut w, &p, job, 1, "pod-never").await);
    assert_eq!(state, "SF004");
    assert!(msg.contains("is not registered"), "{msg}");

    // The next period's run: the first run's token is stale; one above was never issued.
    b.claim(job, ts("2027-01-02T00:00:00Z"), 2, "invoices-2", None)
        .await?;
    let (state, errno, msg) = refusal(fenced_write(&mut w, &p, job, 1, "pod-b").await);
    assert_eq!((state.as_str(), errno), ("SF001", 31001));
    assert_eq!(
        msg,
        "stale fencing token 1 for job billing/invoices: current is 2"
    );
    let (state, errno, msg) = refusal(fenced_write(&mut w, &p, job, 3, "pod-c").await);
    assert_eq!((state.as_str(), errno), ("SF003", 31003));
    assert!(msg.contains("was never issued: the newest is 2"), "{msg}");
    let (state, _, _) = refusal(fenced_write(&mut w, &p, "billing/other", 1, "x").await);
    assert_eq!(state, "SF003", "a job with no fence row");

    // Its period decided: the run's token is retired, although it is still the newest.
    register(&mut w, &p, job, 2, "pod-c").await.unwrap();
    fenced_write(&mut w, &p, job, 2, "pod-c").await.unwrap();
    b.retire(job, 2, "").await?;
    assert_eq!(b.retired(job).await?, 2);
    let (state, _, msg) = refusal(fenced_write(&mut w, &p, job, 2, "pod-c").await);
    assert_eq!(state, "SF001");
    assert!(msg.ends_with("is retired: its period was decided"), "{msg}");

    // Another database user may not fence the job, whatever the token, until a DBA says so.
    let user = format!("{}u", p.as_str());
    w.query_drop(format!("DROP USER IF EXISTS '{user}'@'%'"))
        .await
        .unwrap();
    w.query_drop(format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'"))
        .await
        .unwrap();
    w.query_drop(format!(
        "GRANT EXECUTE, SELECT, INSERT, CREATE ON singleton.* TO '{user}'@'%'"
    ))
    .await
    .unwrap();
    let b3 = b
        .claim(job, ts("2027-01-03T00:00:00Z"), 3, "invoices-3", None)
        .await?;
    assert_eq!(b3, ClaimOutcome::Claimed);
    let mut other = workload_as(Some((&user, "pw"))).await;
    let (state, errno, msg) = refusal(register(&mut other, &p, job, 3, "pod-d").await.map(|_| ()));
    assert_eq!((state.as_str(), errno), ("SF002", 31002));
    assert_eq!(
        msg,
        format!("user {user} may not fence job billing/invoices")
    );
    w.query_drop(format!(
        "INSERT INTO {p}fence_members (owner, member) VALUES (SUBSTRING_INDEX(CURRENT_USER(), '@', 1), '{user}')"
    ))
    .await
    .unwrap();
    register(&mut other, &p, job, 3, "pod-d").await.unwrap();
    fenced_write(&mut other, &p, job, 3, "pod-d").await.unwrap();
    drop(other);
    let _ = w.query_drop(format!("DROP USER '{user}'@'%'")).await;

    // Only the allowed writes committed; every refusal but SF002 was counted, despite rollbacks.
    let written: Vec<(i64, String)> = w
        .query(format!(
            "SELECT token, attempt FROM {p}invoices ORDER BY token"
        ))
        .await
        .unwrap();
    assert_eq!(
        written,
        vec![
            (1, "pod-a".to_string()),
            (2, "pod-c".to_string()),
            (3, "pod-d".to_string())
        ]
    );
    assert_eq!(b.rejections().await? - before, 7);
    cleanup(&p).await;
    Ok(())
}

#[tokio::test]
async fn an_open_fenced_transaction_holds_the_next_claim_until_it_ends() -> Result<()> {
    let p = unique_prefix("my_held");
    let b = Backstop::new(config(Duration::from_secs(2)), p.clone())?;
    let job = "billing/invoices";
    b.claim(job, ts("2027-01-01T00:00:00Z"), 1, "invoices-1", None)
        .await?;
    let mut w = workload().await;
    register(&mut w, &p, job, 1, "pod-a").await.unwrap();
    w.query_drop("START TRANSACTION").await.unwrap();
    w.exec_drop(format!("SELECT {p}fence(?, 1, 'pod-a')"), (job,))
        .await
        .unwrap();
    // The controller's next claim waits for the run's transaction, then gives up as FenceHeld
    // (never slipping past it: the run is not fenced out half-way).
    let next = ts("2027-01-02T00:00:00Z");
    let held = b.claim(job, next, 2, "invoices-2", None).await;
    assert!(matches!(held, Err(Error::FenceHeld(_))), "{held:?}");
    assert_eq!(b.claimed(job, next).await?, None);
    // break-lock finds the session and ends it; its transaction rolls back.
    let holders = b.fence_holders(job).await?;
    assert_eq!(holders.len(), 1, "{holders:?}");
    let ended = b.end_fence_holders(job).await?;
    assert_eq!(ended.len(), 1);
    assert_eq!(
        b.claim(job, next, 2, "invoices-2", None).await?,
        ClaimOutcome::Claimed
    );
    assert!(
        w.query_drop("COMMIT").await.is_err(),
        "its session was ended"
    );

    // A run whose transaction commits before the claim's wait ends: the claim then goes on,
    // and the run's next transaction is refused.
    let mut w = workload().await;
    register(&mut w, &p, job, 2, "pod-b").await.unwrap();
    w.query_drop("START TRANSACTION").await.unwrap();
    w.exec_drop(format!("SELECT {p}fence(?, 2, 'pod-b')"), (job,))
        .await
        .unwrap();
    let claim = b.claim(job, ts("2027-01-03T00:00:00Z"), 3, "invoices-3", None);
    let commit = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        w.query_drop("COMMIT").await.unwrap();
    };
    let (claimed, ()) = tokio::join!(claim, commit);
    assert_eq!(claimed?, ClaimOutcome::Claimed);
    let (state, _, _) = refusal(fenced_write(&mut w, &p, job, 2, "pod-b").await);
    assert_eq!(state, "SF001");
    cleanup(&p).await;
    Ok(())
}

#[tokio::test]
async fn attempts_withdrawal_outcomes_and_namespaces() -> Result<()> {
    let p = unique_prefix("my_more");
    let b = backstop(&p);
    let job = "billing/invoices";
    let (p1, p2) = (ts("2027-01-01T00:00:00Z"), ts("2027-01-02T00:00:00Z"));
    let claimer = crate::backstop::Claimer {
        namespace: "billing".into(),
        ..Default::default()
    };
    b.claim_as(job, p1, 1, "invoices-1", None, &claimer).await?;
    let mut w = workload().await;
    register(&mut w, &p, job, 1, "pod-a").await.unwrap();
    let attempts = b.attempts(job, 1).await?;
    assert_eq!(attempts.len(), 1);
    assert_eq!(
        (attempts[0].seq, attempts[0].attempt.as_str()),
        (1, "pod-a")
    );
    // A started run is neither withdrawn nor retired as unstarted.
    assert!(matches!(
        b.withdraw(job, p1, 1, "billing", withdrawal::BACKSTOP_OUTAGE)
            .await,
        Err(Error::RunStarted { .. })
    ));
    // One that never started is withdrawn: its row goes, its token is retired.
    b.claim_as(job, p2, 2, "invoices-2", None, &claimer).await?;
    b.withdraw(job, p2, 2, "billing", withdrawal::BACKSTOP_OUTAGE)
        .await?;
    assert_eq!(b.claimed(job, p2).await?, None);
    assert_eq!(b.retired(job).await?, 2);
    // Outcomes beside the claims, for bulk repair.
    b.record_outcomes(job, &[(p1, 1, crate::api::Outcome::Failed)])
        .await?;
    let facts = b.claims_between(job, p1, p2).await?;
    assert_eq!(facts.len(), 1);
    assert_eq!(facts[0].0, p1);
    assert_eq!(facts[0].1.outcome, Some(crate::api::Outcome::Failed));
    // The key belongs to its first claim's namespace.
    let intruder = crate::backstop::Claimer {
        namespace: "other".into(),
        ..Default::default()
    };
    let out = b
        .claim_as(job, ts("2027-01-05T00:00:00Z"), 5, "x", None, &intruder)
        .await?;
    assert_eq!(
        out,
        ClaimOutcome::NotOwner {
            owner: "billing".into()
        }
    );
    assert!(matches!(
        b.retire(job, 1, "other").await,
        Err(Error::NotOwner { .. })
    ));
    cleanup(&p).await;
    Ok(())
}

/// The archive's rows of `job`: (period, token, job name, cluster, reason), by token; every
/// row's `withdrawn_at` is not before its `claimed_at`.
async fn archived(p: &TablePrefix, job: &str) -> Vec<(Timestamp, i64, String, String, String)> {
    let mut c = workload().await;
    let rows: Vec<(mysql_async::Value, i64, String, String, String)> = c
        .exec(
            format!(
                "SELECT period, token, job_name, cluster, reason FROM {p}withdrawn_claims \
                 WHERE job = ? AND withdrawn_at >= claimed_at ORDER BY token"
            ),
            (job,),
        )
        .await
        .unwrap();
    rows.into_iter()
        .map(|(period, token, name, cluster, reason)| {
            let period = super::time::timestamp(period).unwrap();
            (period, token, name, cluster, reason)
        })
        .collect()
}

/// As PostgreSQL's `a_withdrawn_claim_is_archived_and_its_period_claimed_again`
/// (attempts/tests.rs): a withdrawn claim moves from `<p>claims` into `<p>withdrawn_claims`
/// (INSERT ... SELECT, then DELETE, under the fence row's lock) with its reason, its token is
/// retired (the fence refuses it), the period is claimed again as a new claim, a second
/// withdrawal changes nothing, the period withdrawn again keeps two archive rows, and a run
/// whose attempt registered is refused with RunStarted and moves nothing. Fails without the
/// archive's INSERT: the archive stays empty.
#[tokio::test]
async fn a_withdrawn_claim_is_archived_and_its_period_claimed_again() -> Result<()> {
    let p = unique_prefix("my_withdraw");
    let b = backstop(&p);
    let job = "billing/invoices";
    let period = ts("2025-01-01T06:00:00Z");
    let west = crate::backstop::Claimer {
        cluster: "west".into(),
        scheduled: true,
        ..Default::default()
    };
    assert_eq!(
        b.claim_as(job, period, 1, "invoices-1", None, &west)
            .await?,
        ClaimOutcome::Claimed
    );
    b.withdraw(job, period, 1, "", withdrawal::BACKSTOP_OUTAGE)
        .await?;
    assert_eq!(b.claimed(job, period).await?, None, "the row left");
    assert!(b.claims_between(job, period, period).await?.is_empty());
    let first = (
        period,
        1,
        "invoices-1".to_string(),
        "west".to_string(),
        "BackstopOutage".to_string(),
    );
    assert_eq!(archived(&p, job).await, vec![first.clone()], "moved");
    assert_eq!(b.retired(job).await?, 1);
    let mut w = workload().await;
    let (state, _, msg) = refusal(register(&mut w, &p, job, 1, "pod-a").await.map(|_| ()));
    assert_eq!(state, "SF001", "the withdrawn token is retired: {msg}");

    // Again: harmless, archived once, as it was.
    b.withdraw(job, period, 1, "", "Suspended").await?;
    assert_eq!(archived(&p, job).await, vec![first.clone()]);

    // Claimed again with a higher token: a claim like any other.
    assert_eq!(
        b.claim_as(job, period, 2, "invoices-1-again", None, &west)
            .await?,
        ClaimOutcome::Claimed
    );
    assert_eq!(b.claimed(job, period).await?.map(|r| r.token), Some(2));
    // The withdrawn token's withdrawal again leaves the new claim alone.
    b.withdraw(job, period, 1, "", withdrawal::BACKSTOP_OUTAGE)
        .await?;
    assert_eq!(b.claimed(job, period).await?.map(|r| r.token), Some(2));

    // Withdrawn a second time, with its new token: two archive rows for the one period.
    b.withdraw(job, period, 2, "", "Suspended").await?;
    assert_eq!(b.claimed(job, period).await?, None);
    let second = (
        period,
        2,
        "invoices-1-again".to_string(),
        "west".to_string(),
        "Suspended".to_string(),
    );
    assert_eq!(archived(&p, job).await, vec![first.clone(), second.clone()]);

    // A run that started is never withdrawn: refused, nothing moved, its token still fences.
    assert_eq!(
        b.claim(job, period, 3, "invoices-1-third", None).await?,
        ClaimOutcome::Claimed
    );
    register(&mut w, &p, job, 3, "pod-c").await.unwrap();
    assert!(matches!(
        b.withdraw(job, period, 3, "", withdrawal::BACKSTOP_OUTAGE)
            .await,
        Err(Error::RunStarted { .. })
    ));
    assert_eq!(b.claimed(job, period).await?.map(|r| r.token), Some(3));
    assert_eq!(archived(&p, job).await, vec![first, second]);
    assert_eq!(b.retired(job).await?, 2);
    fenced_write(&mut w, &p, job, 3, "pod-c").await.unwrap();
    let (state, _, _) = refusal(fenced_write(&mut w, &p, job, 2, "pod-b").await);
    assert_eq!(state, "SF001", "the second withdrawn token");
    cleanup(&p).await;
    Ok(())
}

/// A database the previous release set up (schema 1) is upgraded to schema 2 by the start-up
/// path (the first operation's migration), with a claim it made in place, which is then
/// withdrawn into the new archive and its period claimed again.
#[tokio::test]
async fn schema_1_is_upgraded_to_the_withdrawn_claims_archive() -> Result<()> {
    let p = unique_prefix("my_upgr2");
    let job = "billing/upgrade";
    let period = ts("2025-01-01T00:00:00Z");
    let tables = super::schema::Tables::new(&p);
    let mut w = workload().await;
    w.query_drop(super::schema::version_table(&tables))
        .await
        .unwrap();
    for statement in super::schema::migration(1, &tables).unwrap() {
        w.query_drop(statement).await.unwrap();
    }
    for statement in [
        format!("INSERT INTO {p}schema_version (version, needs) VALUES (1, 0)"),
        format!(
            "INSERT INTO {p}fences (job, token, owner) VALUES ('{job}', 1, SUBSTRING_INDEX(CURRENT_USER(), '@', 1))"
        ),
        format!(
            "INSERT INTO {p}claims (job, period, token, job_name, claimed_at) \
             VALUES ('{job}', '2025-01-01 00:00:00', 1, 'upgrade-1', UTC_TIMESTAMP(6))"
        ),
    ] {
        w.query_drop(statement).await.unwrap();
    }
    let archive = format!(
        "SELECT COUNT(*) FROM information_schema.TABLES \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{p}withdrawn_claims'"
    );
    let there: Option<i64> = w.query_first(&archive).await.unwrap();
    assert_eq!(there, Some(0), "schema 1 has no archive");

    let b = backstop(&p);
    assert_eq!(b.claimed(job, period).await?.map(|r| r.token), Some(1));
    let there: Option<i64> = w.query_first(&archive).await.unwrap();
    assert_eq!(there, Some(1), "migrated on first use");
    let versions: Vec<i32> = w
        .query(format!(
            "SELECT version FROM {p}schema_version ORDER BY version"
        ))
        .await
        .unwrap();
    assert_eq!(versions, vec![1, 2]);
    b.withdraw(job, period, 1, "", withdrawal::BACKSTOP_OUTAGE)
        .await?;
    assert_eq!(
        archived(&p, job).await,
        vec![(
            period,
            1,
            "upgrade-1".to_string(),
            String::new(),
            "BackstopOutage".to_string()
        )]
    );
    assert_eq!(
        b.claim(job, period, 2, "upgrade-1-again", None).await?,
        ClaimOutcome::Claimed
    );
    cleanup(&p).await;
    Ok(())
}

#[tokio::test]
async fn another_clusters_unconfirmed_claim_is_taken_over_after_its_bound() -> Result<()> {
    let p = unique_prefix("my_multi");
    let b = backstop(&p);
    let job = "billing/invoices";
    let period = ts("2020-01-01T00:00:00Z");
    let east = crate::backstop::Claimer {
        cluster: "east".into(),
        scheduled: true,
        ..Default::default()
    };
    let west = crate::backstop::Claimer {
        cluster: "west".into(),
        scheduled: true,
        takeover_after: Some(jiff::SignedDuration::from_secs(1)),
        ..Default::default()
    };
    assert_eq!(
        b.claim_as(job, period, 1, "a", None, &east).await?,
        ClaimOutcome::Claimed
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        b.claim_as(job, period, 2, "b", None, &west).await?,
        ClaimOutcome::TookOver {
            cluster: "east".into(),
            token: 1
        }
    );
    // The first claimer's confirm now finds nothing of its own: it must not start.
    assert!(!b.confirm(job, period, 1, "east").await?);
    assert!(b.confirm(job, period, 2, "west").await?);
    assert!(b.confirm(job, period, 2, "west").await?, "confirming twice");
    cleanup(&p).await;
    Ok(())
}

#[test]
fn a_url_of_the_other_engine_is_refused_by_name() {
    let keys = SecretKeys::default();
    let err = ConnectionConfig::from_secret_as(
        BackstopKind::Mysql,
        &data(&[("url", "postgres://u:secretpw@db/x")]),
        &keys,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("spec.backstop.mysql needs mysql://"), "{err}");
    assert!(!err.contains("secretpw"));
    let err = ConnectionConfig::from_secret(&data(&[("url", "mysql://u:secretpw@db/x")]), &keys)
        .unwrap_err()
        .to_string();
    assert!(err.contains("use spec.backstop.mysql"), "{err}");
    let c = ConnectionConfig::from_secret_as(
        BackstopKind::Mysql,
        &data(&[
            ("url", "mariadb://u:pw@db/billing?ssl-mode=VERIFY_CA"),
            ("sslrootcert", ""),
        ]),
        &keys,
    );
    assert!(c.is_err(), "verify-ca without a CA");
    let c = ConnectionConfig::from_secret_as(
        BackstopKind::Mysql,
        &data(&[("host", "db"), ("user", "u"), ("dbname", "billing")]),
        &keys,
    )
    .unwrap();
    assert_eq!(c.port, 3306);
    let err = ConnectionConfig::from_secret_as(
        BackstopKind::Mysql,
        &data(&[("url", "mysql://u@db/b?sslmode=prefer")]),
        &keys,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("prefer is not supported"), "{err}");
    let no_db = ConnectionConfig::from_secret_as(
        BackstopKind::Mysql,
        &data(&[("url", "mysql://u:pw@db:3306")]),
        &keys,
    )
    .unwrap();
    let err = Backstop::new(no_db, TablePrefix::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("no database"), "{err}");
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable_within_the_timeout() {
    let c = ConnectionConfig::from_secret_as(
        BackstopKind::Mysql,
        &data(&[("url", "mysql://u:pw@127.0.0.1:9/db?sslmode=disable")]),
        &SecretKeys::default(),
    )
    .unwrap()
    .with_timeouts(Duration::from_secs(1), Duration::from_secs(2));
    let b = Backstop::new(c, TablePrefix::default()).unwrap();
    let started = std::time::Instant::now();
    let r = b.ensure_schema().await;
    assert!(matches!(r, Err(Error::BackstopUnavailable(_))), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(4));
}

/// clients/testdata/mariadb.sql is the schema the controller makes (regenerate it with
/// `SINGLETON_BLESS=1 cargo test -p singleton-controller --lib client_testdata`).
#[test]
fn client_testdata_is_the_controllers_mariadb_schema() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../clients/testdata/mariadb.sql"
    );
    let want = format!(
        "-- Generated from controller/src/backstop/mysql/schema.rs (table prefix singleton_): the\n\
         -- schema the controller creates, for the client libraries' tests. Do not edit.\n\
         -- Statements end with a line '//': load with `mariadb` as is, or split on that line.\n{}",
        super::schema::script(&TablePrefix::default())
    );
    if std::env::var_os("SINGLETON_BLESS").is_some() {
        std::fs::write(path, &want).unwrap();
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == want,
        "{path} is not the controller's schema: run SINGLETON_BLESS=1 cargo test -p singleton-controller --lib client_testdata"
    );
}

/// A refusal naming the longest job key and attempts is still a refusal: a `MESSAGE_TEXT` over
/// the server's limit would be an error of its own (1648) and hide it.
#[tokio::test]
async fn a_refusal_with_the_longest_names_keeps_its_sqlstate() -> Result<()> {
    let p = unique_prefix("my_long");
    let b = backstop(&p);
    let job = format!("{}/{}", "n".repeat(63), "j".repeat(253));
    b.claim(&job, ts("2027-01-01T00:00:00Z"), 1, "invoices-1", None)
        .await?;
    let mut w = workload().await;
    let (a, bb) = ("a".repeat(253), "b".repeat(253));
    register(&mut w, &p, &job, 1, &a).await.unwrap();
    register(&mut w, &p, &job, 1, &bb).await.unwrap();
    let (state, errno, msg) = refusal(fenced_write(&mut w, &p, &job, 1, &a).await);
    assert_eq!((state.as_str(), errno), ("SF004", 31004));
    assert!(msg.starts_with(&format!("attempt {a} of job")), "{msg}");
    assert!(msg.chars().count() <= 512, "{}", msg.len());
    cleanup(&p).await;
    Ok(())
}

#[test]
fn servers_too_old_for_the_schema_are_refused_by_name() {
    use super::supported;
    assert!(supported("10.11.19-MariaDB-0+deb12u1", (10, 11, 19)).unwrap());
    assert!(!supported("8.0.36", (8, 0, 36)).unwrap());
    let old = supported("10.5.2-MariaDB", (10, 5, 2))
        .unwrap_err()
        .to_string();
    assert!(
        old.contains("the server is MariaDB 10.5.2; the backstop needs MariaDB 10.6.0 or later"),
        "{old}"
    );
    let old = supported("8.0.15", (8, 0, 15)).unwrap_err().to_string();
    assert!(old.contains("needs MySQL 8.0.16 or later"), "{old}");
    assert!(matches!(
        supported("5.7.44-log", (5, 7, 44)),
        Err(Error::BackstopConfig(_))
    ));
}
