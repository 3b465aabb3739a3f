//! The MariaDB backstop (`spec.backstop.mysql`) end to end, on the real API server with the test
//! MariaDB (`MARIADB_URL`): each period claimed once in MariaDB, the fence at the status's token,
//! and a stale token refused by the workload's own transaction (SQLSTATE SF001, MYSQL_ERRNO
//! 31001, the transaction left open for the workload to roll back); across deletion and
//! re-creation of the SingletonJob a claimed period Deduplicated, the new tokens above the stored
//! fence, and the old run's pod refused; bad input (a PostgreSQL URL, a closed port, a database
//! that does not exist) reported on the SingletonJob with no Job and no claim, and a spec naming
//! both database kinds refused by the API server.

use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use e2e::{
    Env, backstop_secret, ensure, mariadb, mariadb_port, mariadb_url, mysql_backstop_spec,
    mysql_datetime, mysql_timestamp, never_scheduled, sj_yaml, table_prefix,
};
use jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, ServerError, Value};
use singleton::api::{Outcome, SingletonJobStatus};
use singleton::record::conditions::is_true;

#[tokio::test]
async fn mariadb_claims_each_period_once_and_refuses_a_stale_token() -> Result<()> {
    let mut env = Env::new("mariadb-claims").await?;
    let p = table_prefix(&env);
    backstop_secret(&env, "db", &mariadb_url()?, true).await?;
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml(
        "invoices",
        "*/2 * * * * *",
        &mysql_backstop_spec("db", &p, ""),
    ))
    .await?;
    env.wait_for(
        "three runs and BackstopReady",
        Duration::from_secs(60),
        || async {
            let s = status(&env, "invoices").await?;
            Ok((s.fencing_token >= 3 && is_true(&s.conditions, "BackstopReady")).then_some(()))
        },
    )
    .await?;

    // Every Job's period has its one claim row, with the Job's token and name.
    let key = format!("{}/invoices", env.ns);
    let mut db = mariadb().await?;
    let jobs = env.job_list().await?;
    for job in &jobs {
        let period: Timestamp = job.annotations()["singleton.dev/period"].parse()?;
        let token: i64 = job.annotations()["singleton.dev/fencing-token"].parse()?;
        let rows: Vec<(i64, String)> = db
            .exec(
                format!("SELECT token, job_name FROM {p}claims WHERE job = ? AND period = ?"),
                (&key, mysql_datetime(period)),
            )
            .await?;
        ensure(
            &env,
            rows == [(token, job.name_any())],
            ("the Job's claim row", job.name_any(), token, &rows),
        )
        .await?;
    }
    // The claims: a row per period (each period once, by its primary key), the tokens rising
    // with the periods; a Job per claimed period at most.
    let claims: Vec<(Value, i64)> = db
        .exec(
            format!("SELECT period, token FROM {p}claims WHERE job = ? ORDER BY period"),
            (&key,),
        )
        .await?;
    let claims: Vec<(Timestamp, i64)> = claims
        .into_iter()
        .map(|(period, token)| Ok((mysql_timestamp(period)?, token)))
        .collect::<Result<_>>()?;
    let rising = claims.windows(2).all(|w| w[0].1 < w[1].1);
    ensure(
        &env,
        claims.len() >= 3 && rising,
        ("claims in period order, tokens rising", &claims),
    )
    .await?;
    let periods = e2e::periods(&jobs);
    let distinct: std::collections::BTreeSet<_> = periods.iter().collect();
    ensure(
        &env,
        distinct.len() == periods.len() && periods.iter().all(|t| claims.iter().any(|c| c.0 == *t)),
        ("one Job per claimed period", &periods),
    )
    .await?;

    // The fence row holds the status's token. A claim moves both (the status first), so they
    // are read between claims: the same status token before and after the fence's.
    env.wait_for(
        "the fence row at the status's token",
        Duration::from_secs(30),
        || async {
            let before = status(&env, "invoices").await?;
            let fence = fence_of(&p, &key).await?;
            let after = status(&env, "invoices").await?;
            let settled =
                before.pending_claim.is_none() && before.fencing_token == after.fencing_token;
            match fence {
                Some(f) if settled && f as u64 == after.fencing_token => Ok(Some(())),
                _ => Err(anyhow!(
                    "fence {fence:?}, status token {} then {} (claim pending: {})",
                    before.fencing_token,
                    after.fencing_token,
                    before.pending_claim.is_some()
                )),
            }
        },
    )
    .await?;

    // A paused run wakes up with the first token and sends its transaction: the fence refuses
    // it (SF001, errno 31001), the transaction stays open until the workload rolls it back, and
    // its write never commits.
    let mut pod = mariadb().await?;
    create_ledger(&mut pod, &p).await?;
    let refused = fenced_write(&mut pod, &p, &key, 1, "paused-pod", "stale").await?;
    let notes = ledger(&mut pod, &p).await?;
    ensure(
        &env,
        refused.as_ref().is_some_and(|r| {
            r.state == "SF001" && r.code == 31001 && r.message.contains("stale fencing token 1 ")
        }) && notes.is_empty(),
        (
            "the stale token refused, nothing committed",
            &refused,
            &notes,
        ),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn after_recreation_a_claimed_period_is_deduplicated_and_the_old_run_refused() -> Result<()> {
    let mut env = Env::new("mariadb-dedup").await?;
    let p = table_prefix(&env);
    backstop_secret(&env, "db", &mariadb_url()?, true).await?;
    env.start_controller(&[]).await?;
    let key = format!("{}/d", env.ns);
    // Runs that never get a node stay active, so a run's token stays unretired (kwok would
    // complete its pod at once, and the controller then retires the token).
    let spec = |extra: &str| {
        never_scheduled(sj_yaml(
            "d",
            "*/2 * * * * *",
            &mysql_backstop_spec("db", &p, extra),
        ))
    };
    env.create_sj(&spec("")).await?;
    let old = env
        .wait_for("the first run, active", Duration::from_secs(30), || async {
            let s = status(&env, "d").await?;
            let fence = fence_of(&p, &key).await?;
            Ok((s.fencing_token >= 1
                && !s.active.is_empty()
                && fence == Some(s.fencing_token as i64))
            .then_some(s.fencing_token as i64))
        })
        .await?;
    // Its pod registers as the run's attempt and commits a fenced write, as a workload does.
    let mut old_pod = mariadb().await?;
    create_ledger(&mut old_pod, &p).await?;
    let seq: Option<i64> = old_pod
        .exec_first(
            format!("SELECT {p}attempt(?, ?, ?)"),
            (&key, old, "old-pod"),
        )
        .await?;
    let first = fenced_write(&mut old_pod, &p, &key, old, "old-pod", "old run").await?;
    ensure(
        &env,
        seq == Some(1) && first.is_none(),
        ("the first run's pod registered and wrote", seq, &first),
    )
    .await?;

    // The SingletonJob is deleted, its Jobs with it. Meanwhile an earlier object of the same
    // name claimed a period still to come, with a token above the fence (planted, as in
    // tests/backstop.rs). The new object runs every period (Allow).
    env.sjs().delete("d", &DeleteParams::foreground()).await?;
    env.wait_for(
        "the old object and its Jobs gone",
        Duration::from_secs(60),
        || async {
            let gone = env.sjs().get_opt("d").await?.is_none() && env.job_list().await?.is_empty();
            Ok(gone.then_some(()))
        },
    )
    .await?;
    let fence = fence_of(&p, &key).await?.context("no fence row")?;
    let planted = fence + 50;
    let soon = Timestamp::now() + SignedDuration::from_secs(6);
    let taken = Timestamp::from_second(soon.as_second() - soon.as_second() % 2)?;
    let mut db = mariadb().await?;
    db.exec_drop(
        format!(
            "INSERT INTO {p}claims (job, period, token, job_name, claimed_at) \
             VALUES (?, ?, ?, 'd-old', UTC_TIMESTAMP(6))"
        ),
        (&key, mysql_datetime(taken), planted),
    )
    .await?;
    db.exec_drop(
        format!("UPDATE {p}fences SET token = ? WHERE job = ?"),
        (planted, &key),
    )
    .await?;
    env.create_sj(&spec("  concurrencyPolicy: Allow\n")).await?;
    env.wait_for(
        "the claimed period Deduplicated and a later one run",
        Duration::from_secs(40),
        || async {
            let s = status(&env, "d").await?;
            let dedup = s
                .history
                .iter()
                .any(|h| h.outcome == Outcome::Deduplicated && h.period.0 == taken);
            let later = s
                .history
                .iter()
                .any(|h| h.job_name.is_some() && h.period.0 > taken);
            Ok((dedup && later).then_some(()))
        },
    )
    .await?;
    // Suspended, so that no claim moves the fence while the runs' pods write: its runs stay
    // active (no node), the newest one's token the job's current.
    env.sjs()
        .patch(
            "d",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"suspend": true}})),
        )
        .await?;
    let newest = env
        .wait_for(
            "no claim after the suspension",
            Duration::from_secs(30),
            || async {
                let s = status(&env, "d").await?;
                let fence = fence_of(&p, &key).await?;
                let settled = s.pending_claim.is_none() && fence == Some(s.fencing_token as i64);
                Ok(settled.then_some(s.fencing_token as i64))
            },
        )
        .await?;
    let jobs = env.job_list().await?;
    let taken_job = singleton::naming::job_name("d", taken);
    let tokens: Vec<u64> = jobs.iter().map(e2e::token_of).collect();
    ensure(
        &env,
        jobs.iter().all(|j| j.name_any() != taken_job)
            && !tokens.is_empty()
            && tokens.iter().all(|t| *t as i64 > planted)
            && newest > planted,
        (
            "no Job for the claimed period; every token above the fence",
            planted,
            &tokens,
            newest,
        ),
    )
    .await?;

    // The old run's pod, still alive, writes again: refused as stale, its transaction left open
    // until it rolls back. The newest run's pod registers and writes: committed.
    let refused = fenced_write(&mut old_pod, &p, &key, old, "old-pod", "old run, late").await?;
    let mut new_pod = mariadb().await?;
    let seq: Option<i64> = new_pod
        .exec_first(
            format!("SELECT {p}attempt(?, ?, ?)"),
            (&key, newest, "new-pod"),
        )
        .await?;
    let fresh = fenced_write(&mut new_pod, &p, &key, newest, "new-pod", "new run").await?;
    let notes = ledger(&mut new_pod, &p).await?;
    ensure(
        &env,
        refused
            .as_ref()
            .is_some_and(|r| r.state == "SF001" && r.code == 31001 && r.message.contains("stale"))
            && seq == Some(1)
            && fresh.is_none()
            && notes == ["new run", "old run"],
        (
            "the old run refused, the new one committed",
            &refused,
            seq,
            &fresh,
            &notes,
        ),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn bad_mariadb_backstops_are_reported_and_start_nothing() -> Result<()> {
    let mut env = Env::new("mariadb-bad").await?;
    let p = table_prefix(&env);
    let url = mariadb_url()?;
    // A port nothing listens on: bound, then released.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let port = mariadb_port()?;
    let cases = [
        ("pg-url", e2e::database_url()?, "spec.backstop.postgres"),
        (
            "closed-port",
            url.replace(&format!(":{port}/"), &format!(":{closed}/")),
            "refused",
        ),
        (
            "no-database",
            with_database(&url, &format!("{p}nowhere"))?,
            "the database does not exist",
        ),
    ];
    for (name, url, _) in &cases {
        backstop_secret(&env, name, url, true).await?;
    }
    env.start_controller(&[]).await?;
    for (name, _, _) in &cases {
        env.create_sj(&sj_yaml(
            name,
            "*/2 * * * * *",
            &mysql_backstop_spec(name, &p, ""),
        ))
        .await?;
    }
    for (name, _, says) in &cases {
        let what = format!("{name}: BackstopReady=False saying {says:?}");
        env.wait_for(&what, Duration::from_secs(40), || async {
            let s = status(&env, name).await?;
            let c = s.conditions.iter().find(|c| c.type_ == "BackstopReady");
            match c {
                Some(c) if c.status == "False" && c.message.contains(says) => {
                    Ok(Some(c.message.clone()))
                }
                _ => Err(anyhow!("{name}: BackstopReady is {c:?}")),
            }
        })
        .await
        .map(|message| eprintln!("{name}: BackstopReady=False: {message}"))?;
    }
    let pg = status(&env, "pg-url").await?;
    ensure(
        &env,
        pg.conditions
            .iter()
            .any(|c| c.type_ == "BackstopReady" && c.message.contains("mysql://")),
        (
            "the PostgreSQL URL's condition names mysql://",
            &pg.conditions,
        ),
    )
    .await?;
    // Three periods pass: no Job, and no claim (no claims table under the prefix, even).
    env.holds_for("no Job without a claim", Duration::from_secs(6), || async {
        Ok(env.job_list().await?.is_empty())
    })
    .await?;
    let mut db = mariadb().await?;
    let tables: Vec<String> = db
        .exec(
            "SELECT TABLE_NAME FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE ?",
            (format!("{p}%"),),
        )
        .await?;
    ensure(
        &env,
        tables.is_empty(),
        ("no backstop table, so no claim", &tables),
    )
    .await?;

    // Both kinds of database in one spec (or none): refused by the API server.
    for (name, kinds) in [
        (
            "both",
            "    postgres:\n      secretRef: {name: pg-url}\n    mysql:\n      secretRef: {name: pg-url}\n",
        ),
        ("neither", "    jobKey: e2e/neither\n"),
    ] {
        let yaml = sj_yaml(name, "*/2 * * * * *", &format!("  backstop:\n{kinds}"));
        match env.create_sj(&yaml).await {
            Ok(_) => bail!("a backstop with {name} database kinds was accepted"),
            Err(e) => {
                ensure(
                    &env,
                    format!("{e:#}").contains("backstop needs exactly one database kind"),
                    (name, format!("{e:#}")),
                )
                .await?
            }
        }
    }
    Ok(())
}

/// The SingletonJob's status (the default before the first write).
async fn status(env: &Env, name: &str) -> Result<SingletonJobStatus> {
    Ok(env.get_sj(name).await?.status.unwrap_or_default())
}

/// The job's fence row's token, if it has one.
async fn fence_of(p: &str, key: &str) -> Result<Option<i64>> {
    let mut db = mariadb().await?;
    let token = db
        .exec_first(format!("SELECT token FROM {p}fences WHERE job = ?"), (key,))
        .await?;
    db.disconnect().await?;
    Ok(token)
}

/// `url` naming database `db` instead.
fn with_database(url: &str, db: &str) -> Result<String> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let (server, _) = base
        .rsplit_once('/')
        .context("MARIADB_URL names no database")?;
    Ok(format!("{server}/{db}?{query}"))
}

/// The workload's own table.
async fn create_ledger(conn: &mut Conn, p: &str) -> Result<()> {
    conn.query_drop(format!(
        "CREATE TABLE IF NOT EXISTS {p}ledger (token BIGINT NOT NULL, note VARCHAR(64) NOT NULL)"
    ))
    .await?;
    Ok(())
}

/// What the workload's table holds, in order of the notes.
async fn ledger(conn: &mut Conn, p: &str) -> Result<Vec<String>> {
    Ok(conn
        .query(format!("SELECT note FROM {p}ledger ORDER BY note"))
        .await?)
}

/// A workload's transaction as docs/fencing.md has it: the fence first, then the write, then
/// COMMIT. A refusal leaves a MariaDB transaction open (checked: `@@in_transaction`), so the
/// workload rolls it back; the refusal is returned. None: committed.
async fn fenced_write(
    conn: &mut Conn,
    p: &str,
    key: &str,
    token: i64,
    attempt: &str,
    note: &str,
) -> Result<Option<ServerError>> {
    conn.query_drop("START TRANSACTION").await?;
    match conn
        .exec_drop(format!("SELECT {p}fence(?, ?, ?)"), (key, token, attempt))
        .await
    {
        Ok(()) => {}
        Err(mysql_async::Error::Server(refusal)) => {
            let open: Option<i64> = conn.query_first("SELECT @@in_transaction").await?;
            conn.query_drop("ROLLBACK").await?;
            if open != Some(1) {
                bail!("after the refusal {refusal:?} the transaction was not open ({open:?})");
            }
            return Ok(Some(refusal));
        }
        Err(e) => return Err(e.into()),
    }
    conn.exec_drop(
        format!("INSERT INTO {p}ledger (token, note) VALUES (?, ?)"),
        (token, note),
    )
    .await?;
    conn.query_drop("COMMIT").await?;
    Ok(None)
}
