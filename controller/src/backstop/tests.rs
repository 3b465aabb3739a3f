//! Backstop tests. The database tests run against a real PostgreSQL at `$DATABASE_URL` (`make up`,
//! then `eval "$(make -s env)"`); without it they fail and say so. Each test uses its own table
//! prefix, so they run in parallel and never see each other's rows.
//!
//! The TLS tests need the server of `hack/postgres.sh` (ssl = on, CA at `hack/postgres.sh ca`, or
//! `$SINGLETON_PG_CA`).
//!
//! An outage (PostgreSQL stopped for longer than a period, then started) belongs in an e2e test,
//! because it is the run path's handling that matters. With the local server it goes like this:
//!
//! ```sh
//! data=$(readlink -f .cache/postgres/server)/data
//! bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
//! runuser -u postgres -- "$bin/pg_ctl" -D "$data" -m fast -w stop    # outage starts
//! # ... let a period fall due: expect BackstopReady=False, no Job, retries ...
//! hack/postgres.sh up                                                  # outage ends
//! # ... expect the period started once (within its deadline) or Missed/BackstopUnavailable
//! ```
//!
//! Here, [`unavailable_closed_port_fails_within_timeout`] and
//! [`unavailable_silent_server_times_out`] cover the client side: a down or hung database costs
//! one bounded timeout and an `Unavailable` error, never a hang.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::ByteString;
use tokio_postgres::NoTls;

use super::postgres::schema;
use super::*;

pub(super) fn database_url() -> String {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "DATABASE_URL is not set: these backstop tests need a real PostgreSQL. Run `make up`, \
             then `eval \"$(make -s env)\"` (or export DATABASE_URL=postgres://...) and rerun."
        ),
    }
}

fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, ByteString> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect()
}

/// A prefix no other test (or earlier run) uses.
pub(crate) fn unique_prefix(tag: &str) -> TablePrefix {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let n = N.fetch_add(1, Ordering::Relaxed);
    let id = (nanos ^ std::process::id().rotate_left(16)).wrapping_add(n);
    TablePrefix::new(&format!("t_{tag}_{id:08x}_")).unwrap()
}

pub(super) fn backstop(prefix: &TablePrefix) -> Backstop {
    let config = ConnectionConfig::from_secret(
        &data(&[("url", &database_url()), ("sslmode", "disable")]),
        &SecretKeys::default(),
    )
    .unwrap();
    Backstop::new(config, prefix.clone()).unwrap()
}

/// A workload's own connection (not the controller's).
pub(super) async fn workload() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&database_url(), NoTls)
        .await
        .expect("connect to DATABASE_URL");
    tokio::spawn(conn);
    client
}

/// Drops what a test created (best effort; a failed test leaves uniquely named leftovers).
pub(super) async fn cleanup(prefix: &TablePrefix) {
    let c = workload().await;
    let p = prefix.as_str();
    let _ = c
        .batch_execute(&format!(
            "DROP FUNCTION IF EXISTS {p}fence(text, bigint); \
             DROP FUNCTION IF EXISTS {p}fence(text, bigint, text); \
             DROP FUNCTION IF EXISTS {p}attempt(text, bigint, text); \
             DROP FUNCTION IF EXISTS {p}fence_check(text, bigint); \
             DROP TABLE IF EXISTS {p}claims, {p}withdrawn_claims, {p}fences, {p}attempts, {p}schema_version, {p}invoices; \
             DROP SEQUENCE IF EXISTS {p}fence_rejections;"
        ))
        .await;
}

pub(super) fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

pub(super) fn sqlstate(e: &tokio_postgres::Error) -> Option<&str> {
    e.code().map(|c| c.code())
}

pub(super) fn db_message(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_default()
}

// ---------------------------------------------------------------- configuration (no database)

const PW: &str = "s3cretPW-9f2";

fn assert_no_secret(text: &str, secrets: &[&str]) {
    for s in secrets {
        assert!(!text.contains(s), "{s:?} leaked into {text:?}");
    }
}

#[test]
fn url_and_discrete_keys_parse() {
    let keys = SecretKeys::default();
    let c = ConnectionConfig::from_secret(
        &data(&[(
            "url",
            "postgresql://app%40x:p%3Aw@db.example:6432/billing?sslmode=verify-full&application_name=sj\n",
        )]),
        &keys,
    )
    .unwrap();
    assert_eq!(c.host.0, "db.example");
    assert_eq!(c.port, 6432);
    assert_eq!(c.user.0, "app@x");
    assert_eq!(c.password.as_ref().unwrap().0, "p:w");
    assert_eq!(c.dbname.as_ref().unwrap().0, "billing");
    assert_eq!(c.sslmode, SslMode::VerifyFull);
    assert_eq!(c.application_name, "sj");

    let c = ConnectionConfig::from_secret(
        &data(&[
            ("host", "10.0.0.7"),
            ("user", "app"),
            ("password", "pw with spaces "),
            ("dbname", "billing"),
        ]),
        &keys,
    )
    .unwrap();
    assert_eq!((c.host.0.as_str(), c.port), ("10.0.0.7", 5432));
    assert_eq!(c.password.as_ref().unwrap().0, "pw with spaces ");
    assert_eq!(
        c.sslmode,
        SslMode::VerifyFull,
        "verified by default, unlike libpq"
    );

    // IPv6, and a discrete key overriding the URL's part.
    let c = ConnectionConfig::from_secret(
        &data(&[
            ("url", "postgres://u:old@[::1]:5433/db"),
            ("password", "new"),
        ]),
        &keys,
    )
    .unwrap();
    assert_eq!((c.host.0.as_str(), c.port), ("::1", 5433));
    assert_eq!(c.password.as_ref().unwrap().0, "new");

    // Custom key names.
    let keys = SecretKeys {
        url: "uri".into(),
        password: "postgres-password".into(),
        ..SecretKeys::default()
    };
    let c = ConnectionConfig::from_secret(
        &data(&[("uri", "postgres://app@h/db"), ("postgres-password", "x")]),
        &keys,
    )
    .unwrap();
    assert_eq!(c.password.as_ref().unwrap().0, "x");
}

#[test]
fn sslmode_rules() {
    let keys = SecretKeys::default();
    let ca = include_str!("testdata/unrelated-ca.pem");
    let build = |pairs: &[(&str, &str)]| ConnectionConfig::from_secret(&data(pairs), &keys);
    let base = [("host", "h"), ("user", "u")];
    for (mode, want) in [
        ("disable", SslMode::Disable),
        ("prefer", SslMode::Prefer),
        ("require", SslMode::Require),
        ("verify-full", SslMode::VerifyFull),
    ] {
        let c = build(&[base[0], base[1], ("sslmode", mode)]).unwrap();
        assert_eq!(c.sslmode, want);
    }
    // require with a root certificate verifies the chain, as libpq does.
    let c = build(&[
        base[0],
        base[1],
        ("sslmode", "require"),
        ("sslrootcert", ca),
    ])
    .unwrap();
    assert_eq!((c.sslmode, c.root_certs.len()), (SslMode::VerifyCa, 1));
    let e = build(&[base[0], base[1], ("sslmode", "verify-ca")]).unwrap_err();
    assert!(
        matches!(e, Error::BackstopConfig(ref m) if m.contains("sslrootcert")),
        "{e}"
    );
    let e = build(&[base[0], base[1], ("sslmode", "allow")]).unwrap_err();
    assert!(matches!(e, Error::BackstopConfig(_)), "{e}");
    let e = build(&[base[0], base[1], ("sslrootcert", "not a certificate")]).unwrap_err();
    assert!(e.to_string().contains("sslrootcert"), "{e}");
    // Every mode builds a TLS configuration (or none, for disable).
    for mode in ["disable", "prefer", "require", "verify-full"] {
        let c = build(&[base[0], base[1], ("sslmode", mode), ("sslrootcert", ca)]).unwrap();
        Backstop::new(c, TablePrefix::default()).unwrap();
    }
}

#[test]
fn missing_parts_are_config_errors() {
    let keys = SecretKeys::default();
    for pairs in [
        vec![],
        vec![("user", "u")],
        vec![("host", "h")],
        vec![("host", "h"), ("user", "u"), ("port", "0")],
        vec![("host", "h"), ("user", "u"), ("hostaddr", "not-an-ip")],
    ] {
        let e = ConnectionConfig::from_secret(&data(&pairs), &keys).unwrap_err();
        assert!(matches!(e, Error::BackstopConfig(_)), "{pairs:?}: {e}");
        assert_eq!(e.kind(), "BackstopConfig");
    }
    let mut bad = data(&[("host", "h"), ("user", "u")]);
    bad.insert("password".into(), ByteString(vec![0xff, 0xfe]));
    let e = ConnectionConfig::from_secret(&bad, &keys).unwrap_err();
    assert_eq!(
        e.to_string(),
        "backstop configuration: key `password` is not valid UTF-8"
    );
}

#[test]
fn secrets_never_appear_in_errors_or_debug() {
    let keys = SecretKeys::default();
    let malformed = [
        format!("postgres://app:{PW}@db.example:notaport/billing"),
        format!("postgres://app:{PW}@[::1/billing"),
        format!("mysql://app:{PW}@db.example/billing"),
        format!("postgres://app:{PW}@db.example/billing?{PW}=1"),
        format!("postgres://app:{PW}@db.example/billing?{PW}"),
        format!("postgres://app:{PW}%ZZ@db.example/billing"),
        format!("postgres://app:{PW}@db.example/billing?sslmode={PW}"),
        format!("postgres://app:{PW}@db1.example,db2.example/billing"),
        format!("postgres://app:{PW}@db.example/billing?sslrootcert=/etc/{PW}"),
        format!("postgres://app:{PW}@db.example/billing?connect_timeout={PW}"),
        format!("postgres://app:{PW}@/tmp/{PW}/billing"),
        format!("postgres://app:{PW}@db.example:{PW}/billing"),
    ];
    for url in &malformed {
        let e = ConnectionConfig::from_secret(&data(&[("url", url)]), &keys).unwrap_err();
        assert!(matches!(e, Error::BackstopConfig(_)), "{e}");
        for text in [e.to_string(), format!("{e:?}")] {
            assert_no_secret(&text, &[PW, url, "db.example", "app:"]);
        }
    }
    // Discrete keys with bad values: the value is never echoed.
    for (k, v) in [
        ("port", PW),
        ("sslmode", PW),
        ("hostaddr", PW),
        ("sslrootcert", PW),
    ] {
        let e = ConnectionConfig::from_secret(
            &data(&[("host", "h"), ("user", "u"), ("password", PW), (k, v)]),
            &keys,
        )
        .unwrap_err();
        assert_no_secret(&format!("{e} {e:?}"), &[PW]);
    }
    // A good configuration's Debug shows no value from the Secret.
    let url = format!("postgres://app:{PW}@db.example:5432/billing?sslmode=require");
    let c = ConnectionConfig::from_secret(&data(&[("url", &url)]), &keys).unwrap();
    let debug = format!("{c:?}");
    assert_no_secret(&debug, &[PW, &url, "db.example", "app", "billing"]);
    assert!(
        debug.contains("<redacted>") && debug.contains("Require"),
        "{debug}"
    );
    let b = Backstop::new(c, TablePrefix::default()).unwrap();
    assert_no_secret(&format!("{b:?}"), &[PW, &url, "db.example"]);
}

#[test]
fn table_prefix_is_a_safe_identifier() {
    assert_eq!(TablePrefix::default().as_str(), "singleton_");
    for ok in ["singleton_", "billing_", "_x", "a1"] {
        TablePrefix::new(ok).unwrap();
    }
    for bad in [
        "",
        "1abc",
        "Upper_",
        "a-b",
        "a;drop table x;",
        "a\"b",
        "päck",
        "a_very_long_prefix_that_is_too_long_",
    ] {
        let e = TablePrefix::new(bad).unwrap_err();
        assert!(matches!(e, Error::BackstopConfig(_)), "{bad:?}");
    }
}

#[test]
fn secret_must_opt_in_with_the_label() {
    use k8s_openapi::api::core::v1::Secret;
    let mut s = Secret {
        data: Some(data(&[("url", "postgres://u@h/db")])),
        ..Secret::default()
    };
    let e = secret_data(s.clone(), "ns", "db").unwrap_err();
    assert_eq!(e.kind(), "BackstopConfig");
    assert!(e.to_string().contains("singleton.dev/backstop"), "{e}");
    assert!(!e.to_string().contains("postgres://"), "{e}");
    s.metadata.labels = Some([(SECRET_OPT_IN_LABEL.to_string(), "false".to_string())].into());
    assert!(secret_data(s.clone(), "ns", "db").is_err());
    s.metadata.labels = Some([(SECRET_OPT_IN_LABEL.to_string(), "true".to_string())].into());
    assert_eq!(secret_data(s, "ns", "db").unwrap().len(), 1);
}

#[test]
fn cache_rebuilds_on_changed_secret_only() {
    let cache = BackstopCache::default();
    let keys = SecretKeys::default();
    let p = TablePrefix::default();
    let d1 = data(&[("url", "postgres://u:a@h/db")]);
    let a = cache.get("ns/a", &d1, &keys, &p).unwrap();
    let a2 = cache.get("ns/a", &d1, &keys, &p).unwrap();
    assert!(Arc::ptr_eq(&a, &a2));
    let d2 = data(&[("url", "postgres://u:b@h/db")]);
    let a3 = cache.get("ns/a", &d2, &keys, &p).unwrap();
    assert!(!Arc::ptr_eq(&a, &a3));
    cache.forget("ns/a");
    let a4 = cache.get("ns/a", &d2, &keys, &p).unwrap();
    assert!(!Arc::ptr_eq(&a3, &a4));
}

#[test]
fn errors_map_to_metric_labels() {
    let cases = [
        (
            Error::BackstopUnavailable("x".into()),
            "BackstopUnavailable",
        ),
        (
            Error::StaleToken {
                job: "ns/a".into(),
                token: 1,
                current: 2,
            },
            "StaleToken",
        ),
        (Error::BackstopConfig("x".into()), "BackstopConfig"),
        (Error::Backstop("x".into()), "Backstop"),
    ];
    for (e, label) in cases {
        assert_eq!(e.kind(), label);
        assert_eq!(e.kind(), label);
    }
}

// ---------------------------------------------------------------- against PostgreSQL

/// Many rounds of 8 claimers, each on its own connection, racing for one period: exactly one
/// Claimed, every other one Duplicate with the winner's token and Job name.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_race_exactly_one_wins() {
    let prefix = unique_prefix("race");
    const CLAIMERS: u64 = 8;
    const ROUNDS: usize = 25;
    let claimers: Vec<Arc<Backstop>> = (0..CLAIMERS).map(|_| Arc::new(backstop(&prefix))).collect();
    claimers[0].ensure_schema().await.unwrap();
    let period = ts("2025-01-01T00:00:00Z");
    for round in 0..ROUNDS {
        let job = format!("ns/race-{round}");
        let barrier = Arc::new(tokio::sync::Barrier::new(CLAIMERS as usize));
        let tasks: Vec<_> = claimers
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let (b, barrier, job) = (b.clone(), barrier.clone(), job.clone());
                tokio::spawn(async move {
                    let token = i as u64 + 1;
                    barrier.wait().await;
                    let r = b
                        .claim(&job, period, token, &format!("run-{token}"), None)
                        .await
                        .unwrap();
                    (token, r)
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for t in tasks {
            outcomes.push(t.await.unwrap());
        }
        let winners: Vec<u64> = outcomes
            .iter()
            .filter(|(_, r)| *r == ClaimOutcome::Claimed)
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        let w = winners[0];
        for (t, r) in &outcomes {
            if *t != w {
                assert_eq!(
                    *r,
                    ClaimOutcome::Duplicate {
                        token: w,
                        job_name: format!("run-{w}")
                    },
                    "round {round}"
                );
                assert!(!r.is_ours(*t));
            }
        }
        let row = claimers[0].claimed(&job, period).await.unwrap().unwrap();
        assert_eq!(
            (row.token, row.job_name.as_str()),
            (w, format!("run-{w}").as_str())
        );
        assert_eq!(claimers[0].fence(&job).await.unwrap(), w);
    }
    cleanup(&prefix).await;
}

/// A stale token is refused (SF001) once a newer one committed, and also while the newer one's
/// transaction is still open: the older call blocks, then fails; its own writes never commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stale_token_is_refused_even_behind_an_open_newer_transaction() {
    let prefix = unique_prefix("stale");
    let p = prefix.as_str();
    let b = backstop(&prefix);
    let job = "billing/invoices";
    assert_eq!(b.rejections().await.unwrap(), 0);
    assert_eq!(
        b.claim(job, ts("2025-01-01T00:00:00Z"), 1, "invoices-1", None)
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        b.claim(job, ts("2025-02-01T00:00:00Z"), 2, "invoices-2", None)
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    let admin = workload().await;
    admin
        .batch_execute(&format!("CREATE TABLE {p}invoices (id text PRIMARY KEY)"))
        .await
        .unwrap();
    let insert = format!("INSERT INTO {p}invoices (id) VALUES ($1)");
    let fence = format!("SELECT {p}fence($1, $2)");

    // 1. After the newer token committed: refused at once.
    let mut old = workload().await;
    let tx = old.transaction().await.unwrap();
    tx.execute(&insert, &[&"stale-1"]).await.unwrap();
    let e = tx.query_one(&fence, &[&job, &1i64]).await.unwrap_err();
    assert_eq!(sqlstate(&e), Some("SF001"), "{e}");
    assert_eq!(
        db_message(&e),
        format!("stale fencing token 1 for job {job}: current is 2")
    );
    drop(tx);
    assert_eq!(b.rejections().await.unwrap(), 1);

    // The current token passes, as often as the run likes.
    let mut cur = workload().await;
    for id in ["current-2a", "current-2b"] {
        let tx = cur.transaction().await.unwrap();
        let got: i64 = tx.query_one(&fence, &[&job, &2i64]).await.unwrap().get(0);
        assert_eq!(got, 2);
        tx.execute(&insert, &[&id]).await.unwrap();
        tx.commit().await.unwrap();
    }

    // 2. Behind an open newer transaction: the newer run (token 3, claimed) has fenced but not
    // committed.
    b.claim(job, ts("2025-03-01T00:00:00Z"), 3, "invoices-3", None)
        .await
        .unwrap();
    let mut newer = workload().await;
    let newer_tx = newer.transaction().await.unwrap();
    newer_tx.query_one(&fence, &[&job, &3i64]).await.unwrap();
    newer_tx.execute(&insert, &[&"new-3"]).await.unwrap();

    let older = workload().await;
    let older_pid: i32 = older
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let (fence2, insert2) = (fence.clone(), insert.clone());
    let older_task = tokio::spawn(async move {
        let mut older = older;
        let tx = older.transaction().await.unwrap();
        tx.execute(&insert2, &[&"old-2"]).await.unwrap();
        let fenced = tx.query_one(&fence2, &[&"billing/invoices", &2i64]).await;
        // Whatever happened, try to commit: an aborted transaction commits nothing.
        let _ = tx.commit().await;
        fenced
    });
    // The older call must be waiting on the fence row's lock, not done.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let waiting: Option<String> = admin
            .query_one(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1",
                &[&older_pid],
            )
            .await
            .unwrap()
            .get(0);
        if waiting.as_deref() == Some("Lock") {
            break;
        }
        assert!(!older_task.is_finished(), "the stale call did not block");
        assert!(
            Instant::now() < deadline,
            "the stale call never waited on the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!older_task.is_finished(), "the stale call slipped through");
    newer_tx.commit().await.unwrap();

    let e = older_task.await.unwrap().unwrap_err();
    assert_eq!(sqlstate(&e), Some("SF001"), "{e}");
    assert_eq!(
        db_message(&e),
        format!("stale fencing token 2 for job {job}: current is 3")
    );
    assert_eq!(b.rejections().await.unwrap(), 2);
    assert_eq!(b.fence(job).await.unwrap(), 3);

    let mut ids: Vec<String> = admin
        .query(&format!("SELECT id FROM {p}invoices ORDER BY id"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    ids.sort();
    assert_eq!(ids, ["current-2a", "current-2b", "new-3"]);
    cleanup(&prefix).await;
}

/// `advance_fence` (Replace, break-lock) waits for a workload transaction that holds the fence,
/// then fences it out; it never lowers the fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn advance_fence_waits_for_the_running_transaction_then_fences_it() {
    let prefix = unique_prefix("adv");
    let p = prefix.as_str();
    let b = Arc::new(backstop(&prefix));
    let job = "ns/replace";
    b.claim(job, ts("2025-03-01T00:00:00Z"), 5, "r-5", None)
        .await
        .unwrap();
    let fence = format!("SELECT {p}fence($1, $2)");
    let mut run5 = workload().await;
    let tx = run5.transaction().await.unwrap();
    tx.query_one(&fence, &[&job, &5i64]).await.unwrap();

    let b2 = b.clone();
    let advance = tokio::spawn(async move { b2.advance_fence("ns/replace", 6).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !advance.is_finished(),
        "advance_fence did not wait for the open transaction"
    );
    tx.commit().await.unwrap();
    assert_eq!(advance.await.unwrap().unwrap(), 6);

    let e = run5.query_one(&fence, &[&job, &5i64]).await.unwrap_err();
    assert_eq!(sqlstate(&e), Some("SF001"));
    // Only upward: a lower or equal token is a no-op that reports the stored fence.
    assert_eq!(b.advance_fence(job, 4).await.unwrap(), 6);
    assert_eq!(b.advance_fence(job, 6).await.unwrap(), 6);
    assert_eq!(b.advance_fence("ns/fresh", 3).await.unwrap(), 3);
    assert_eq!(b.fence(job).await.unwrap(), 6);
    cleanup(&prefix).await;
}

/// A session holding the schema's migration lock (a replica frozen inside its migration, as in
/// the burst-pause stall) makes a new connection's first use fail as an outage within the lock
/// timeout, worded as what it is: no workload holds a fence row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_schema_lock_is_an_outage_not_a_held_fence() {
    let prefix = unique_prefix("schemalock");
    let config = backstop(&prefix)
        .config()
        .clone()
        .with_timeouts(Duration::from_secs(1), Duration::from_secs(2));
    let b = Backstop::new(config, prefix.clone()).unwrap();
    let mut frozen = workload().await;
    let schema: String = frozen
        .query_one("SELECT current_schema()", &[])
        .await
        .unwrap()
        .get(0);
    let tx = frozen.transaction().await.unwrap();
    tx.execute(
        "SELECT pg_advisory_xact_lock($1)",
        &[&schema::lock_key(&schema, &prefix)],
    )
    .await
    .unwrap();
    let e = b.ping().await.unwrap_err();
    assert!(
        matches!(&e, Error::BackstopUnavailable(m) if m.contains("migration lock")),
        "{e:?}"
    );
    // Let go, the same backstop connects and migrates.
    tx.rollback().await.unwrap();
    b.ping().await.unwrap();
    cleanup(&prefix).await;
}

/// A workload that holds the fence longer than the controller's lock timeout makes the
/// controller's claim fail as Unavailable (retryable) within the timeout, not hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claim_behind_a_long_workload_transaction_is_bounded() {
    let prefix = unique_prefix("lockto");
    let p = prefix.as_str();
    let b = backstop(&prefix);
    let config = b
        .config()
        .clone()
        .with_timeouts(Duration::from_secs(1), Duration::from_secs(2));
    let b = Backstop::new(config, prefix.clone()).unwrap();
    let job = "ns/long";
    b.claim(job, ts("2025-04-01T00:00:00Z"), 1, "l-1", None)
        .await
        .unwrap();
    let mut run1 = workload().await;
    let tx = run1.transaction().await.unwrap();
    tx.query_one(&format!("SELECT {p}fence($1, $2)"), &[&job, &1i64])
        .await
        .unwrap();
    let started = Instant::now();
    let e = b
        .claim(job, ts("2025-05-01T00:00:00Z"), 2, "l-2", None)
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(e.is_retryable(), "{e}");
    assert!(
        matches!(e, Error::FenceHeld(_)),
        "its own kind, not an outage: {e:?}"
    );
    assert!(
        e.to_string().contains("lock timeout (SQLSTATE 55P03)"),
        "{e}"
    );
    assert!(took < Duration::from_millis(2500), "took {took:?}");
    // Nothing of the failed claim stuck.
    tx.commit().await.unwrap();
    assert_eq!(
        b.claimed(job, ts("2025-05-01T00:00:00Z")).await.unwrap(),
        None
    );
    assert_eq!(
        b.claim(job, ts("2025-05-01T00:00:00Z"), 2, "l-2", None)
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    cleanup(&prefix).await;
}

/// Deleting and re-creating a SingletonJob (same namespace/name, status back at token 0) finds
/// the old fence and claims: old periods stay deduplicated and tokens keep increasing.
#[tokio::test]
async fn recreation_keeps_claims_and_fence() {
    let prefix = unique_prefix("recreate");
    let job = "ns/monthly";
    let (p1, p2, p3) = (
        ts("2025-01-01T00:00:00Z"),
        ts("2025-02-01T00:00:00Z"),
        ts("2025-03-01T00:00:00Z"),
    );
    {
        let first = backstop(&prefix);
        assert_eq!(first.fence(job).await.unwrap(), 0);
        assert_eq!(
            first.claim(job, p1, 1, "m-1", None).await.unwrap(),
            ClaimOutcome::Claimed
        );
        assert_eq!(
            first.claim(job, p2, 2, "m-2", None).await.unwrap(),
            ClaimOutcome::Claimed
        );
    }
    // A new controller process, and a new SingletonJob object whose status says token 0.
    let second = backstop(&prefix);
    let status_token = 0u64;
    let fence = second.fence(job).await.unwrap();
    assert_eq!(fence, 2);
    assert_eq!(
        second.claim(job, p1, 3, "m-new", None).await.unwrap(),
        ClaimOutcome::Duplicate {
            token: 1,
            job_name: "m-1".into()
        },
        "an old period stays claimed"
    );
    for stale in [1, 2] {
        let e = second.claim(job, p3, stale, "m-3", None).await.unwrap_err();
        assert!(
            matches!(&e, Error::StaleToken { job: j, token, current: 2 } if j == job && *token == stale),
            "{e:?}"
        );
        assert_eq!(e.kind(), "StaleToken");
    }
    assert_eq!(
        second.claimed(job, p3).await.unwrap(),
        None,
        "refused claims leave no row"
    );
    let token = status_token.max(fence) + 1;
    assert_eq!(
        second.claim(job, p3, token, "m-3", None).await.unwrap(),
        ClaimOutcome::Claimed
    );
    // A retry of the same claim (the controller died before creating the Job) is ours.
    let retry = second.claim(job, p3, token, "m-3", None).await.unwrap();
    assert!(retry.is_ours(token), "{retry:?}");
    let row = second.claimed(job, p1).await.unwrap().unwrap();
    assert_eq!((row.job.as_str(), row.period, row.token), (job, p1, 1));
    assert!(row.claimed_at <= Timestamp::now());
    assert_eq!(second.fence(job).await.unwrap(), 3);
    // The claim's StaleToken is the controller's own check: not counted as a workload rejection.
    assert_eq!(second.rejections().await.unwrap(), 0);
    cleanup(&prefix).await;
}

/// A closed port: Unavailable, quickly, and the password is nowhere in the error.
#[tokio::test]
async fn unavailable_closed_port_fails_within_timeout() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("postgres://app:{PW}@127.0.0.1:{port}/db?sslmode=disable");
    let config = ConnectionConfig::from_secret(&data(&[("url", &url)]), &SecretKeys::default())
        .unwrap()
        .with_timeouts(Duration::from_secs(1), Duration::from_secs(2));
    let b = Backstop::new(config, unique_prefix("down")).unwrap();
    let started = Instant::now();
    let e = b.ping().await.unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(2500));
    assert!(matches!(e, Error::BackstopUnavailable(_)), "{e}");
    assert!(e.is_retryable());
    assert_eq!(e.kind(), "BackstopUnavailable");
    assert_no_secret(&format!("{e} {e:?}"), &[PW, &url]);
    let e = b.fence("ns/x").await.unwrap_err();
    assert!(matches!(e, Error::BackstopUnavailable(_)), "{e}");
}

/// A server that accepts TCP and never answers (a hung database, a black-holing proxy): the
/// operation timeout ends the wait.
#[tokio::test]
async fn unavailable_silent_server_times_out() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    let config = ConnectionConfig::from_secret(
        &data(&[
            ("host", "127.0.0.1"),
            ("port", &port.to_string()),
            ("user", "app"),
            ("password", PW),
            ("sslmode", "disable"),
        ]),
        &SecretKeys::default(),
    )
    .unwrap()
    .with_timeouts(Duration::from_millis(500), Duration::from_secs(1));
    let b = Backstop::new(config, unique_prefix("hung")).unwrap();
    let started = Instant::now();
    let e = b
        .claim("ns/x", ts("2025-01-01T00:00:00Z"), 1, "x-1", None)
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1500), "took {took:?}");
    assert!(
        matches!(e, Error::BackstopUnavailable(ref m) if m.contains("timed out")),
        "{e}"
    );
    hold.abort();
}

/// The server's startup errors quote the database and user names: they are replaced.
#[tokio::test]
async fn connect_errors_do_not_quote_secret_values() {
    let url = database_url();
    let secret_db = "no_such_db_s3cret";
    let config = ConnectionConfig::from_secret(
        &data(&[("url", &url), ("dbname", secret_db), ("sslmode", "disable")]),
        &SecretKeys::default(),
    )
    .unwrap();
    let b = Backstop::new(config, unique_prefix("nodb")).unwrap();
    let e = b.ping().await.unwrap_err();
    assert!(
        matches!(&e, Error::BackstopConfig(m) if m == "the database does not exist (SQLSTATE 3D000)"),
        "{e:?}"
    );
    assert_no_secret(&format!("{e} {e:?}"), &[secret_db]);
}

/// `database_url()` logged in as `role` (the local server trusts loopback logins).
fn url_as(role: &str) -> String {
    let url = database_url();
    let (scheme, rest) = url.split_once("://").unwrap();
    let host = rest.split_once('@').map_or(rest, |(_, h)| h);
    format!("{scheme}://{role}@{host}")
}

/// N7 (review): another role plants the backstop's objects in the controller's schema before
/// its first connection: a version table at the newest version, so no migration runs, and a
/// fence that accepts every token. The controller (a role of its own, not a superuser) refuses
/// the backstop and names what is foreign; once the objects are its own, or their owner is a role
/// it is a member of, it goes on. Fails without the ownership check: ensure_schema succeeds on
/// the planted objects.
#[tokio::test]
async fn a_schema_planted_by_another_role_is_refused() {
    let prefix = unique_prefix("plant");
    let p = prefix.as_str();
    let (ctl, planter) = (format!("{p}ctl"), format!("{p}planter"));
    let admin = workload().await;
    admin
        .batch_execute(&format!(
            "CREATE ROLE {ctl} LOGIN; CREATE ROLE {planter} LOGIN; \
             CREATE SCHEMA {ctl} AUTHORIZATION {ctl}; GRANT USAGE, CREATE ON SCHEMA {ctl} TO {planter};"
        ))
        .await
        .unwrap();
    let (planted, conn) = tokio_postgres::connect(&url_as(&planter), NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    planted
        .batch_execute(&format!(
            "SET search_path = {ctl}; \
             CREATE TABLE {p}schema_version (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now(), needs integer NOT NULL DEFAULT 0); \
             INSERT INTO {p}schema_version (version) VALUES ({SCHEMA_VERSION}); \
             GRANT ALL ON {p}schema_version TO PUBLIC; \
             CREATE FUNCTION {p}fence(job text, token bigint) RETURNS bigint LANGUAGE sql AS 'SELECT $2';"
        ))
        .await
        .unwrap();
    let as_ctl = || {
        let config = ConnectionConfig::from_secret(
            &data(&[("url", &url_as(&ctl)), ("sslmode", "disable")]),
            &SecretKeys::default(),
        )
        .unwrap();
        Backstop::new(config, prefix.clone()).unwrap()
    };
    let e = as_ctl().ensure_schema().await.unwrap_err();
    let said = e.to_string();
    assert!(matches!(e, Error::BackstopConfig(_)), "{e:?}");
    for name in ["fence", "schema_version"] {
        assert!(
            said.contains(&format!("{p}{name} (owner {planter})")),
            "{said}"
        );
    }
    // The planter's role made the controller's (a DBA's that ran the migrations): trusted.
    admin
        .batch_execute(&format!("GRANT {planter} TO {ctl}"))
        .await
        .unwrap();
    assert_eq!(as_ctl().ensure_schema().await.unwrap(), SCHEMA_VERSION);
    // Without the planted objects the controller creates and owns its own.
    admin
        .batch_execute(&format!(
            "REVOKE {planter} FROM {ctl}; DROP SCHEMA {ctl} CASCADE; CREATE SCHEMA {ctl} AUTHORIZATION {ctl};"
        ))
        .await
        .unwrap();
    assert_eq!(as_ctl().ensure_schema().await.unwrap(), SCHEMA_VERSION);
    admin
        .batch_execute(&format!(
            "DROP SCHEMA {ctl} CASCADE; DROP ROLE {planter}; DROP OWNED BY {ctl}; DROP ROLE {ctl};"
        ))
        .await
        .unwrap();
}

/// Four replicas creating the schema at once: no error, one row per migration, all see the
/// newest version.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schema_creation_race() {
    let prefix = unique_prefix("schema");
    for round in 0..3 {
        let barrier = Arc::new(tokio::sync::Barrier::new(4));
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (b, barrier) = (backstop(&prefix), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    b.ensure_schema().await
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap().ok(), Some(SCHEMA_VERSION), "round {round}");
        }
    }
    let admin = workload().await;
    let rows: i64 = admin
        .query_one(
            &format!("SELECT count(*) FROM {}schema_version", prefix.as_str()),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, i64::from(SCHEMA_VERSION));
    // Re-created after someone dropped a table: an unexpected error re-runs the migration check.
    cleanup(&prefix).await;
}

/// Each refused stale write adds exactly one, although its transaction aborted; accepted calls
/// and the controller's own StaleToken add nothing.
#[tokio::test]
async fn rejection_counter_counts_each_refusal() {
    let prefix = unique_prefix("reject");
    let p = prefix.as_str();
    let b = backstop(&prefix);
    let job = "ns/counted";
    b.claim(job, ts("2025-01-01T00:00:00Z"), 7, "c-7", None)
        .await
        .unwrap();
    let mut w = workload().await;
    let fence = format!("SELECT {p}fence($1, $2)");
    for n in 1..=3u64 {
        let tx = w.transaction().await.unwrap();
        let e = tx.query_one(&fence, &[&job, &6i64]).await.unwrap_err();
        assert_eq!(sqlstate(&e), Some(STALE_TOKEN_SQLSTATE));
        tx.rollback().await.unwrap();
        assert_eq!(b.rejections().await.unwrap(), n);
        // Accepted calls do not count.
        w.query_one(&fence, &[&job, &7i64]).await.unwrap();
        assert_eq!(b.rejections().await.unwrap(), n);
    }
    let e = b
        .claim(job, ts("2025-02-01T00:00:00Z"), 7, "c-7b", None)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::StaleToken { current: 7, .. }), "{e}");
    assert_eq!(b.rejections().await.unwrap(), 3);
    cleanup(&prefix).await;
}

// ---------------------------------------------------------------- TLS (hack/postgres.sh)

fn ca_pem() -> String {
    let path = std::env::var("SINGLETON_PG_CA").unwrap_or_else(|_| {
        format!(
            "{}/../.cache/postgres/tls/ca.crt",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read the test server's CA certificate at {path} ({e}): run `make up` \
             (hack/postgres.sh creates it) or set SINGLETON_PG_CA"
        )
    })
}

/// The URL's host and port, as discrete keys with an sslmode and an optional CA.
fn tls_backstop(mode: &str, ca: Option<&str>, extra: &[(&str, &str)]) -> Backstop {
    let mut pairs = vec![("url", database_url()), ("sslmode", mode.to_string())];
    if let Some(ca) = ca {
        pairs.push(("sslrootcert", ca.to_string()));
    }
    for (k, v) in extra {
        pairs.push((k, v.to_string()));
    }
    let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let config = ConnectionConfig::from_secret(&data(&refs), &SecretKeys::default())
        .unwrap()
        .with_timeouts(Duration::from_secs(2), Duration::from_secs(5));
    Backstop::new(config, unique_prefix("tls")).unwrap()
}

/// Whether the backstop's own session is encrypted (pg_stat_ssl of its backend).
async fn session_tls(b: &Backstop) -> Result<bool> {
    let mut slot = b.postgres().session().await?;
    let ssl: bool = slot
        .client()?
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .map_err(|e| Error::from_pg(e, false))?
        .get(0);
    slot.clean = true;
    Ok(ssl)
}

#[tokio::test]
async fn tls_require_verify_ca_and_verify_full() {
    let ca = ca_pem();
    let cases = [
        ("disable", None, false),
        ("prefer", None, true),
        ("require", None, true),
        ("require", Some(ca.as_str()), true), // = verify-ca
        ("verify-ca", Some(ca.as_str()), true),
        ("verify-full", Some(ca.as_str()), true),
    ];
    for (mode, ca, want_tls) in cases {
        let b = tls_backstop(mode, ca, &[]);
        assert_eq!(
            session_tls(&b)
                .await
                .unwrap_or_else(|e| panic!("{mode}: {e}")),
            want_tls,
            "{mode}"
        );
        b.ping().await.unwrap();
        cleanup(b.prefix()).await;
    }
}

#[tokio::test]
async fn tls_verification_failures_are_refused() {
    let ca = ca_pem();
    let other_ca = include_str!("testdata/unrelated-ca.pem");
    // A CA that did not sign the server's certificate.
    for mode in ["verify-ca", "verify-full"] {
        let e = tls_backstop(mode, Some(other_ca), &[])
            .ping()
            .await
            .unwrap_err();
        assert!(
            matches!(e, Error::BackstopUnavailable(ref m) if m.contains("certificate")),
            "{mode}: {e}"
        );
    }
    // The right CA, but a host name the certificate does not name (connecting to 127.0.0.1
    // through hostaddr): verify-full refuses, verify-ca accepts.
    let wrong_name = [("host", "db.wrong-name.invalid"), ("hostaddr", "127.0.0.1")];
    let e = tls_backstop("verify-full", Some(&ca), &wrong_name)
        .ping()
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::BackstopUnavailable(ref m) if m.contains("certificate")),
        "{e}"
    );
    assert_no_secret(&format!("{e} {e:?}"), &["wrong-name"]);
    let b = tls_backstop("verify-ca", Some(&ca), &wrong_name);
    assert!(session_tls(&b).await.unwrap());
    cleanup(b.prefix()).await;
}

/// Once a period is decided its token is retired: a run re-created with it (a paused claimer
/// resuming after the period completed) is refused although its token equals the stored fence,
/// and the next token passes.
#[tokio::test]
async fn a_retired_token_is_refused_although_it_equals_the_fence() {
    let prefix = unique_prefix("retire");
    let p = prefix.as_str();
    let b = backstop(&prefix);
    let job = "billing/payouts";
    b.claim(job, ts("2025-01-01T00:00:00Z"), 7, "payouts-7", None)
        .await
        .unwrap();
    let fence = format!("SELECT {p}fence($1, $2)");
    let mut w = workload().await;
    let tx = w.transaction().await.unwrap();
    assert_eq!(
        tx.query_one(&fence, &[&job, &7i64])
            .await
            .unwrap()
            .get::<_, i64>(0),
        7
    );
    tx.commit().await.unwrap();

    b.retire(job, 7, "").await.unwrap();
    b.retire(job, 7, "").await.unwrap(); // idempotent
    assert_eq!(
        (b.fence(job).await.unwrap(), b.retired(job).await.unwrap()),
        (7, 7)
    );
    let tx = w.transaction().await.unwrap();
    let e = tx.query_one(&fence, &[&job, &7i64]).await.unwrap_err();
    assert_eq!(sqlstate(&e), Some("SF001"), "{e}");
    assert_eq!(
        db_message(&e),
        format!("fencing token 7 for job {job} is retired: its period was decided")
    );
    drop(tx);
    assert_eq!(b.rejections().await.unwrap(), 1);
    // Older tokens stay refused as stale; the next claim's token passes.
    let tx = w.transaction().await.unwrap();
    let e = tx.query_one(&fence, &[&job, &6i64]).await.unwrap_err();
    assert!(db_message(&e).starts_with("stale fencing token 6"), "{e}");
    drop(tx);
    assert_eq!(
        b.claim(job, ts("2025-02-01T00:00:00Z"), 8, "payouts-8", None)
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    let tx = w.transaction().await.unwrap();
    assert_eq!(
        tx.query_one(&fence, &[&job, &8i64])
            .await
            .unwrap()
            .get::<_, i64>(0),
        8
    );
    tx.commit().await.unwrap();
    // Retiring a token no claim reached (a run without its claim row) still fences it out.
    b.retire("billing/other", 3, "").await.unwrap();
    let tx = w.transaction().await.unwrap();
    let e = tx
        .query_one(&fence, &[&"billing/other", &3i64])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), Some("SF001"), "{e}");
    drop(tx);
    cleanup(&prefix).await;
}

/// A workload's write guarded by `fence` (`SELECT <p>fence($1, $2)`), committed when it passes.
async fn fenced_write(
    w: &mut tokio_postgres::Client,
    fence: &str,
    job: &str,
    token: i64,
) -> std::result::Result<(), tokio_postgres::Error> {
    let tx = w.transaction().await.unwrap();
    tx.query_one(fence, &[&job, &token]).await?;
    tx.commit().await
}

/// A rerun takes the period's claim row over by compare-and-swap from the earlier run's token:
/// still one row for the period, the fence at the new token in the same transaction, the earlier
/// token refused by `fence()` from then on (also while its run was still writing). A retry is
/// ours; a row that moved meanwhile, or a token not above the fence, changes nothing.
#[tokio::test]
async fn a_rerun_takes_the_period_claim_over() {
    let prefix = unique_prefix("rerun");
    let p = prefix.as_str();
    let b = backstop(&prefix);
    let job = "billing/ledger";
    let period = ts("2025-06-01T00:00:00Z");
    let fence = format!("SELECT {p}fence($1, $2)");
    let mut w = workload().await;
    assert_eq!(
        b.claim(job, period, 1, "ledger-1", None).await.unwrap(),
        ClaimOutcome::Claimed
    );
    fenced_write(&mut w, &fence, job, 1)
        .await
        .expect("the earlier run holds the fence");

    assert_eq!(
        b.claim(job, period, 2, "ledger-1-r2", Some(1))
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    let r = b.claimed(job, period).await.unwrap().unwrap();
    assert_eq!((r.token, r.job_name.as_str()), (2, "ledger-1-r2"));
    let rows: i64 = w
        .query_one(
            &format!("SELECT count(*) FROM {p}claims WHERE job = $1 AND period = $2"),
            &[&job, &period],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 1, "one claim per (job, period)");
    assert_eq!(b.fence(job).await.unwrap(), 2);
    let e = fenced_write(&mut w, &fence, job, 1).await.unwrap_err();
    assert_eq!(sqlstate(&e), Some("SF001"), "{e}");
    assert!(db_message(&e).starts_with("stale fencing token 1"), "{e}");
    fenced_write(&mut w, &fence, job, 2)
        .await
        .expect("the rerun's token writes");

    // A retry of the same claim (its completer died) finds its own row.
    let retry = b
        .claim(job, period, 2, "ledger-1-r2", Some(1))
        .await
        .unwrap();
    assert!(retry.is_ours(2), "{retry:?}");
    // Expecting a token the row no longer holds: left alone, nothing issued.
    assert_eq!(
        b.claim(job, period, 3, "ledger-1-r3", Some(1))
            .await
            .unwrap(),
        ClaimOutcome::Duplicate {
            token: 2,
            job_name: "ledger-1-r2".into()
        }
    );
    assert_eq!(b.fence(job).await.unwrap(), 2);
    // Not above the fence: refused, and the row rolls back to what it held.
    let e = b
        .claim(job, period, 2, "ledger-1-x", Some(2))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::StaleToken { current: 2, .. }), "{e:?}");
    assert_eq!(
        b.claimed(job, period).await.unwrap().unwrap().job_name,
        "ledger-1-r2"
    );
    // A period without a row (decided without a claim): claimed as usual.
    let other = ts("2025-07-01T00:00:00Z");
    assert_eq!(
        b.claim(job, other, 4, "ledger-2-r4", Some(9))
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(b.claimed(job, other).await.unwrap().unwrap().token, 4);
    cleanup(&prefix).await;
}

/// Schema 8: each run's outcome beside its claim, written only on the row that still holds the
/// run's token, cleared when a rerun takes the row over, read back for a range.
#[tokio::test]
async fn outcomes_are_recorded_on_the_row_of_their_token() {
    use crate::api::Outcome;
    use crate::decide::repair::ClaimFact;
    let prefix = unique_prefix("outcome");
    let b = backstop(&prefix);
    let job = "billing/ledger";
    let (p1, p2, p3) = (
        ts("2025-06-01T00:00:00Z"),
        ts("2025-06-02T00:00:00Z"),
        ts("2025-06-03T00:00:00Z"),
    );
    for (p, t) in [(p1, 1), (p2, 2)] {
        assert_eq!(
            b.claim(job, p, t, "ledger", None).await.unwrap(),
            ClaimOutcome::Claimed
        );
    }
    b.record_outcomes(
        job,
        &[(p1, 1, Outcome::Failed), (p2, 2, Outcome::Succeeded)],
    )
    .await
    .unwrap();
    // A period without a row and an old token record nothing; repeating is harmless.
    b.record_outcomes(job, &[(p3, 9, Outcome::Failed), (p2, 1, Outcome::Failed)])
        .await
        .unwrap();
    b.record_outcomes(job, &[(p1, 1, Outcome::Failed)])
        .await
        .unwrap();
    let fact = |token, outcome| ClaimFact { token, outcome };
    assert_eq!(
        b.claims_between(job, p1, p3).await.unwrap(),
        vec![
            (p1, fact(1, Some(Outcome::Failed))),
            (p2, fact(2, Some(Outcome::Succeeded)))
        ]
    );
    // A rerun takes p1's row over: its outcome is unknown until the rerun's own is recorded,
    // and the earlier run's late report does not overwrite it.
    b.claim(job, p1, 3, "ledger-r3", Some(1)).await.unwrap();
    assert_eq!(
        b.claims_between(job, p1, p1).await.unwrap(),
        vec![(p1, fact(3, None))]
    );
    b.record_outcomes(job, &[(p1, 1, Outcome::Failed)])
        .await
        .unwrap();
    b.record_outcomes(job, &[(p1, 3, Outcome::Succeeded)])
        .await
        .unwrap();
    assert_eq!(
        b.claims_between(job, p1, p2).await.unwrap()[0],
        (p1, fact(3, Some(Outcome::Succeeded)))
    );
    assert!(b.claims_between(job, p3, p3).await.unwrap().is_empty());
    cleanup(&prefix).await;
}

/// Retiring an older token needs no lock when the fence is above it: a newer run's open
/// transaction (concurrencyPolicy Allow) does not hold up the decision of the older period.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retiring_an_older_token_does_not_wait_for_a_newer_run() {
    let prefix = unique_prefix("retirelk");
    let p = prefix.as_str();
    let b = backstop(&prefix);
    let job = "ns/allow";
    b.claim(job, ts("2025-01-01T00:00:00Z"), 5, "a-5", None)
        .await
        .unwrap();
    b.claim(job, ts("2025-01-02T00:00:00Z"), 6, "a-6", None)
        .await
        .unwrap();
    let mut newer = workload().await;
    let tx = newer.transaction().await.unwrap();
    tx.query_one(&format!("SELECT {p}fence($1, $2)"), &[&job, &6i64])
        .await
        .unwrap();
    let started = Instant::now();
    b.retire(job, 5, "").await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    tx.commit().await.unwrap();
    cleanup(&prefix).await;
}

/// A database the previous version set up (schema 1, fences without `retired`) is upgraded in
/// place: its fence rows keep their tokens, and the new function refuses retired ones.
#[tokio::test]
async fn schema_1_is_upgraded_in_place() {
    let prefix = unique_prefix("upgrade");
    let p = prefix.as_str();
    let admin = workload().await;
    let schema: String = admin
        .query_one("SELECT current_schema()", &[])
        .await
        .unwrap()
        .get(0);
    let tables = schema::Tables::new(&schema, &prefix);
    admin
        .batch_execute(&format!(
            "CREATE TABLE {} (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now()); {} INSERT INTO {} (version) VALUES (1); INSERT INTO {} (job, token) VALUES ('ns/old', 4);",
            tables.version,
            schema::migration_sql(1, &tables).unwrap(),
            tables.version,
            tables.fences
        ))
        .await
        .unwrap();
    let b = backstop(&prefix);
    assert_eq!(b.ensure_schema().await.unwrap(), SCHEMA_VERSION);
    assert_eq!(
        (
            b.fence("ns/old").await.unwrap(),
            b.retired("ns/old").await.unwrap()
        ),
        (4, 0)
    );
    b.retire("ns/old", 4, "").await.unwrap();
    let e = admin
        .query_one(&format!("SELECT {p}fence($1, $2)"), &[&"ns/old", &4i64])
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), Some("SF001"), "{e}");
    cleanup(&prefix).await;
}

/// A database the previous release set up (schema 8) is upgraded to schema 9 by the start-up
/// path (the first operation's migration), with a claim it made in place: that claim's period is
/// then withdrawn into the new archive and claimed again. What the previous release still does
/// against schema 9 works too: its claim (the same statements) and its withdrawal, which deletes
/// the row without archiving it.
#[tokio::test]
async fn schema_8_is_upgraded_to_the_withdrawn_claims_archive() {
    let prefix = unique_prefix("upgr9");
    let p = prefix.as_str();
    let job = "billing/upgrade";
    let admin = workload().await;
    let current: String = admin
        .query_one("SELECT current_schema()", &[])
        .await
        .unwrap()
        .get(0);
    let tables = schema::Tables::new(&current, &prefix);
    let mut setup = format!(
        "CREATE TABLE {} (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());",
        tables.version
    );
    for version in 1..=8 {
        setup.push_str(&schema::migration_sql(version, &tables).unwrap());
        setup.push_str(&if version >= 7 {
            format!(
                "INSERT INTO {} (version, needs) VALUES ({version}, 0);",
                tables.version
            )
        } else {
            format!(
                "INSERT INTO {} (version) VALUES ({version});",
                tables.version
            )
        });
    }
    // The previous release's claim of a period, as its claim transaction leaves it.
    setup.push_str(&format!(
        "INSERT INTO {p}claims (job, period, token, job_name) VALUES ('{job}', '2025-01-01T00:00:00Z', 1, 'upgrade-1'); \
         INSERT INTO {p}fences (job, token) VALUES ('{job}', 1);"
    ));
    admin.batch_execute(&setup).await.unwrap();
    let archive = |v: &str| {
        format!(
            "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = current_schema() AND tablename = '{v}withdrawn_claims'"
        )
    };
    let there: i64 = admin.query_one(&archive(p), &[]).await.unwrap().get(0);
    assert_eq!(there, 0, "schema 8 has no archive");

    let b = backstop(&prefix);
    let period = ts("2025-01-01T00:00:00Z");
    assert_eq!(b.claimed(job, period).await.unwrap().unwrap().token, 1);
    assert_eq!(b.ensure_schema().await.unwrap(), SCHEMA_VERSION);
    let there: i64 = admin.query_one(&archive(p), &[]).await.unwrap().get(0);
    assert_eq!(there, 1, "migrated on first use");
    b.withdraw(job, period, 1, "", withdrawal::BACKSTOP_OUTAGE)
        .await
        .unwrap();
    let moved: (i64, String, String) = admin
        .query_one(
            &format!("SELECT token, job_name, reason FROM {p}withdrawn_claims WHERE job = $1"),
            &[&job],
        )
        .await
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .unwrap();
    assert_eq!(
        moved,
        (1, "upgrade-1".to_string(), "BackstopOutage".to_string())
    );
    assert_eq!(
        b.claim(job, period, 2, "upgrade-1-again", None)
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    // The previous release against schema 9: its withdrawal deletes the row without archiving
    // it (harmless: the audit row only), and its claims are the same statements.
    admin
        .execute(
            &format!("DELETE FROM {p}claims WHERE job = $1 AND period = $2 AND token = 2"),
            &[&job, &period],
        )
        .await
        .unwrap();
    assert_eq!(
        b.claim(job, period, 3, "upgrade-1-third", None)
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    cleanup(&prefix).await;
}

// ---------------------------------------------------------------- who gets the password

/// A fake PostgreSQL server for one connection: answers SSLRequest with `N` (no TLS), then asks
/// for a password with authentication request `code` (3 cleartext, 5 MD5). Returns its port and
/// what the client sent after the request.
async fn fake_server(code: u32) -> (u16, tokio::task::JoinHandle<Vec<u8>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        // Untyped startup packets: length, then a code (SSLRequest's is 80877103).
        let read_packet = async |sock: &mut tokio::net::TcpStream| {
            let len = sock.read_u32().await.ok()? as usize;
            let mut body = vec![0; len - 4];
            sock.read_exact(&mut body).await.ok()?;
            Some(body)
        };
        let mut first = read_packet(&mut sock).await.unwrap();
        if first[..4] == 80877103u32.to_be_bytes() {
            sock.write_all(b"N").await.unwrap();
            match read_packet(&mut sock).await {
                Some(startup) => first = startup,
                // A client that needs TLS hangs up here.
                None => return Vec::new(),
            }
        }
        assert_eq!(
            first[..4],
            196608u32.to_be_bytes(),
            "a protocol 3.0 startup message"
        );
        let mut request = vec![b'R'];
        let salt: &[u8] = if code == 5 { b"salt" } else { b"" };
        request.extend_from_slice(&(8 + salt.len() as u32).to_be_bytes());
        request.extend_from_slice(&code.to_be_bytes());
        request.extend_from_slice(salt);
        sock.write_all(&request).await.unwrap();
        let mut sent = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(1), sock.read_to_end(&mut sent)).await;
        sent
    });
    (port, task)
}

/// Over a connection whose server nobody verified (plain TCP, or TLS that the server declined),
/// a request for a cleartext or MD5 password is refused and the password is never sent: not in
/// clear, not hashed. The default mode (verify-full) does not even get that far.
#[tokio::test]
async fn a_fake_server_never_gets_the_password() {
    for mode in [Some("disable"), Some("prefer"), None] {
        for code in [3u32, 5] {
            let (port, fake) = fake_server(code).await;
            let mut pairs = vec![
                ("host", "127.0.0.1".to_string()),
                ("port", port.to_string()),
                ("user", "app".to_string()),
                ("password", PW.to_string()),
            ];
            if let Some(mode) = mode {
                pairs.push(("sslmode", mode.to_string()));
            }
            let refs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let config = ConnectionConfig::from_secret(&data(&refs), &SecretKeys::default())
                .unwrap()
                .with_timeouts(Duration::from_secs(2), Duration::from_secs(3));
            let e = Backstop::new(config, unique_prefix("fake"))
                .unwrap()
                .ping()
                .await
                .unwrap_err();
            let case = format!("sslmode {mode:?}, request {code}");
            let sent = fake.await.unwrap();
            let text = String::from_utf8_lossy(&sent);
            assert!(
                sent.first() != Some(&b'p') && !text.contains(PW) && !text.contains("md5"),
                "{case}: the client answered the password request: {text:?}"
            );
            if mode.is_some() {
                assert!(
                    matches!(e, Error::BackstopConfig(ref m) if m.contains("not verified") && m.contains("not sent")),
                    "{case}: {e}"
                );
            } else {
                assert!(
                    matches!(e, Error::BackstopUnavailable(ref m) if m.contains("TLS")),
                    "{case}: {e}"
                );
            }
        }
    }
}

/// Without `sslmode` the server must prove its name with a certificate from `sslrootcert` (or
/// the system roots): the test server's certificate passes with its CA; a certificate for another
/// host, or from another CA, fails.
#[tokio::test]
async fn the_default_verifies_the_server() {
    let ca = ca_pem();
    let port = e2e_port();
    let build = |extra: &[(&str, &str)]| {
        let port = port.to_string();
        let mut pairs = vec![
            ("host", "127.0.0.1"),
            ("port", port.as_str()),
            ("user", "postgres"),
            ("dbname", "singleton"),
        ];
        pairs.extend_from_slice(extra);
        let config = ConnectionConfig::from_secret(&data(&pairs), &SecretKeys::default())
            .unwrap()
            .with_timeouts(Duration::from_secs(2), Duration::from_secs(5));
        assert_eq!(config.sslmode(), SslMode::VerifyFull);
        Backstop::new(config, unique_prefix("dflt"))
    };
    let b = build(&[("sslrootcert", &ca)]).unwrap();
    assert!(session_tls(&b).await.unwrap(), "encrypted and verified");
    cleanup(b.prefix()).await;
    let refused =
        |e: &Error| matches!(e, Error::BackstopUnavailable(m) if m.contains("certificate"));
    // A certificate for another host: the right CA, a name the certificate does not hold.
    let wrong_name = [
        ("sslrootcert", ca.as_str()),
        ("host", "db.wrong-name.invalid"),
        ("hostaddr", "127.0.0.1"),
    ];
    let e = build(&wrong_name).unwrap().ping().await.unwrap_err();
    assert!(refused(&e), "{e}");
    let e = build(&[("sslrootcert", include_str!("testdata/unrelated-ca.pem"))])
        .unwrap()
        .ping()
        .await
        .unwrap_err();
    assert!(refused(&e), "{e}");
    // No sslrootcert: the system roots, which never signed the test CA (or, on a host without
    // any, a configuration error before connecting).
    match build(&[]) {
        Ok(b) => {
            let e = b.ping().await.unwrap_err();
            assert!(refused(&e), "{e}");
        }
        Err(e) => assert!(matches!(e, Error::BackstopConfig(_)), "{e}"),
    }
}

/// The port of the test server, from `$DATABASE_URL`.
fn e2e_port() -> u16 {
    let url = database_url();
    let after = url.rsplit_once(':').unwrap().1;
    after
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

// ---------------------------------------------------------------- fence per tenant (schema 3)

/// A client of the test server logged in as `role` (trust authentication).
async fn role_client(role: &str) -> tokio_postgres::Client {
    let mut config: tokio_postgres::Config = database_url().parse().unwrap();
    config.user(role);
    let (client, conn) = config.connect(NoTls).await.expect("connect as a role");
    tokio::spawn(conn);
    client
}

/// The controller's connection as `role`.
fn backstop_as(prefix: &TablePrefix, role: &str) -> Backstop {
    let config = ConnectionConfig::from_secret(
        &data(&[
            ("url", &database_url()),
            ("user", role),
            ("sslmode", "disable"),
        ]),
        &SecretKeys::default(),
    )
    .unwrap();
    Backstop::new(config, prefix.clone()).unwrap()
}

/// Creates login roles `names` (dropped by [`drop_roles`]).
async fn create_roles(admin: &tokio_postgres::Client, names: &[&str]) {
    for r in names {
        admin
            .batch_execute(&format!("CREATE ROLE {r} LOGIN"))
            .await
            .unwrap();
    }
}

async fn drop_roles(names: &[&str]) {
    let admin = workload().await;
    let list = names.join(", ");
    let _ = admin
        .batch_execute(&format!("DROP OWNED BY {list}; DROP ROLE {list}"))
        .await;
}

/// Two tenants share a database and a table prefix; EXECUTE on the fence function is granted
/// to everyone. Tenant X can neither fence tenant B's job (with its current token, its next
/// one, or the maximum bigint) nor create a fence row for a job of B's that no claim created.
/// B's workload role, a member of B's controller role, fences as before; a token the controller
/// never issued is refused even to B; B's next claim and run are unaffected.
#[tokio::test]
async fn fence_is_per_tenant() {
    let prefix = unique_prefix("tenant");
    let p = prefix.as_str();
    let (ctl_b, ctl_x, app_b) = (format!("{p}b"), format!("{p}x"), format!("{p}app"));
    let roles = [ctl_b.as_str(), ctl_x.as_str(), app_b.as_str()];
    let admin = workload().await;
    create_roles(&admin, &roles).await;
    admin
        .batch_execute(&format!(
            "GRANT CREATE ON SCHEMA public TO {ctl_b}; GRANT {ctl_b} TO {app_b}"
        ))
        .await
        .unwrap();
    let b = backstop_as(&prefix, &ctl_b);
    let job = "tenant-b/payouts";
    b.claim(job, ts("2025-01-01T00:00:00Z"), 1, "payouts-1", None)
        .await
        .unwrap();
    admin
        .batch_execute(&format!(
            "GRANT EXECUTE ON FUNCTION {p}fence(text, bigint) TO PUBLIC"
        ))
        .await
        .unwrap();
    let owner: String = admin
        .query_one(
            &format!("SELECT owner::text FROM {p}fences WHERE job = $1"),
            &[&job],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(owner, ctl_b, "the row names the login role that claimed it");
    let fence = format!("SELECT {p}fence($1, $2)");

    let mut x = role_client(&ctl_x).await;
    for token in [1i64, 2, i64::MAX] {
        let e = fenced_write(&mut x, &fence, job, token).await.unwrap_err();
        assert_eq!(sqlstate(&e), Some(NOT_PERMITTED_SQLSTATE), "{token}: {e}");
        assert_eq!(
            db_message(&e),
            format!("role {ctl_x} may not fence job {job}")
        );
    }
    let e = fenced_write(&mut x, &fence, "tenant-b/later", 5)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), Some(NEVER_ISSUED_SQLSTATE), "{e}");
    assert_eq!(
        b.fence("tenant-b/later").await.unwrap(),
        0,
        "no row squatted"
    );
    assert_eq!(b.fence(job).await.unwrap(), 1);

    let mut w = role_client(&app_b).await;
    fenced_write(&mut w, &fence, job, 1)
        .await
        .expect("B's workload fences with its token");
    for token in [2i64, i64::MAX] {
        let e = fenced_write(&mut w, &fence, job, token).await.unwrap_err();
        assert_eq!(sqlstate(&e), Some(NEVER_ISSUED_SQLSTATE), "{token}: {e}");
    }
    assert_eq!(b.fence(job).await.unwrap(), 1);
    // Counted: the never-issued tokens (X's squat and B's two); X's refusals for lack of right
    // are not.
    assert_eq!(b.rejections().await.unwrap(), 3);
    assert_eq!(
        b.claim(job, ts("2025-02-01T00:00:00Z"), 2, "payouts-2", None)
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    fenced_write(&mut w, &fence, job, 2)
        .await
        .expect("B's next run fences");
    assert_eq!(
        b.claim(
            "tenant-b/later",
            ts("2025-02-01T00:00:00Z"),
            1,
            "later-1",
            None
        )
        .await
        .unwrap(),
        ClaimOutcome::Claimed
    );
    cleanup(&prefix).await;
    drop_roles(&roles).await;
}

/// A database at schema 2 (fence rows without an owner) is upgraded in place: its rows belong
/// to the role that ran the upgrade (the controller's), whose members fence as before, and to
/// no one else. The claim statements are unchanged, so an older controller's rows get their
/// owner from the column default.
#[tokio::test]
async fn schema_2_is_upgraded_to_per_tenant_fences() {
    let prefix = unique_prefix("upgr3");
    let p = prefix.as_str();
    let other = format!("{p}other");
    let admin = workload().await;
    let schema: String = admin
        .query_one("SELECT current_schema()", &[])
        .await
        .unwrap()
        .get(0);
    let tables = schema::Tables::new(&schema, &prefix);
    admin
        .batch_execute(&format!(
            "CREATE TABLE {} (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now()); {} {} INSERT INTO {} (version) VALUES (1), (2); INSERT INTO {} (job, token) VALUES ('ns/old', 4);",
            tables.version,
            schema::migration_sql(1, &tables).unwrap(),
            schema::migration_sql(2, &tables).unwrap(),
            tables.version,
            tables.fences
        ))
        .await
        .unwrap();
    create_roles(&admin, &[&other]).await;
    admin
        .batch_execute(&format!(
            "GRANT EXECUTE ON FUNCTION {p}fence(text, bigint) TO {other}"
        ))
        .await
        .unwrap();
    let b = backstop(&prefix);
    assert_eq!(b.ensure_schema().await.unwrap(), SCHEMA_VERSION);
    assert_eq!(b.fence("ns/old").await.unwrap(), 4);
    let fence = format!("SELECT {p}fence($1, $2)");
    let mut w = workload().await;
    fenced_write(&mut w, &fence, "ns/old", 4)
        .await
        .expect("the upgrading role's own job fences");
    let mut o = role_client(&other).await;
    let e = fenced_write(&mut o, &fence, "ns/old", 4).await.unwrap_err();
    assert_eq!(sqlstate(&e), Some(NOT_PERMITTED_SQLSTATE), "{e}");
    // What an older controller does against the newer schema: its INSERT names no owner.
    admin
        .batch_execute(&format!(
            "INSERT INTO {p}fences (job, token) VALUES ('ns/by-old-controller', 1)"
        ))
        .await
        .unwrap();
    fenced_write(&mut w, &fence, "ns/by-old-controller", 1)
        .await
        .expect("a row without an explicit owner belongs to its writer");
    cleanup(&prefix).await;
    drop_roles(&[&other]).await;
}

#[test]
fn token_allocation_never_wraps() {
    assert_eq!(next_token(0).unwrap(), 1);
    assert_eq!(next_token(i64::MAX as u64 - 1).unwrap(), i64::MAX as u64);
    for highest in [i64::MAX as u64, u64::MAX] {
        let e = next_token(highest).unwrap_err();
        assert!(e.to_string().contains("no fencing token after"), "{e}");
    }
}

/// The same over TLS that verifies nothing (`prefer`, `require` without `sslrootcert`), against
/// the real server: roles that log in with a cleartext password or MD5 (pg_hba lines of
/// `hack/postgres.sh`) are refused before the password is sent; with the server verified
/// (`verify-full` and the CA) the same roles connect.
#[tokio::test]
async fn an_unverified_tls_server_never_gets_the_password() {
    let admin = workload().await;
    let rules: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_hba_file_rules WHERE 'singleton_pw_md5' = ANY(user_name)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        rules, 1,
        "the test server lacks the password roles' pg_hba lines: run `hack/postgres.sh up`"
    );
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN CREATE ROLE singleton_pw_cleartext LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$; \
             DO $$ BEGIN CREATE ROLE singleton_pw_md5 LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$; \
             ALTER ROLE singleton_pw_cleartext PASSWORD '{PW}'; \
             SET password_encryption = 'md5'; ALTER ROLE singleton_pw_md5 PASSWORD '{PW}'; \
             GRANT CREATE ON SCHEMA public TO singleton_pw_cleartext, singleton_pw_md5"
        ))
        .await
        .unwrap();
    let ca = ca_pem();
    for (role, what) in [
        ("singleton_pw_cleartext", "cleartext"),
        ("singleton_pw_md5", "MD5"),
    ] {
        let login = [("user", role), ("password", PW)];
        for mode in ["prefer", "require"] {
            let e = tls_backstop(mode, None, &login).ping().await.unwrap_err();
            assert!(
                matches!(e, Error::BackstopConfig(ref m) if m.contains(what) && m.contains("not sent")),
                "{role} over {mode}: {e}"
            );
        }
        let b = tls_backstop("verify-full", Some(&ca), &login);
        assert!(session_tls(&b).await.unwrap(), "{role} over verify-full");
        cleanup(b.prefix()).await;
    }
}

#[test]
fn a_forbidden_secret_says_how_to_grant_it() {
    let api = r#"secrets "db" is forbidden: User "system:serviceaccount:sys:sc-singleton-controller" cannot get resource "secrets" in API group "" in the namespace "team-a""#;
    let m = secret_forbidden("team-a", "db", api);
    assert!(
        m.starts_with("the controller may not read Secret team-a/db:"),
        "{m}"
    );
    assert!(
        m.contains("kubectl create rolebinding singleton-backstop-secrets -n team-a --clusterrole=sc-singleton-controller-backstop-secrets --serviceaccount=sys:sc-singleton-controller"),
        "{m}"
    );
    assert!(m.contains("rbac.backstopNamespaces={team-a}"), "{m}");
    // Not a ServiceAccount (a user's kubeconfig): the user is named, the binding described.
    let m = secret_forbidden("team-a", "db", r#"User "alice" cannot get"#);
    assert!(m.contains("for alice") && m.contains("RoleBinding"), "{m}");
    let m = secret_forbidden("team-a", "db", "forbidden");
    assert!(m.contains("the controller's ServiceAccount"), "{m}");
}

// ---------------------------------------------------------------- multi-cluster (schema 4)

pub(super) fn cluster(id: &str, takeover_secs: Option<i64>, standby_secs: Option<i64>) -> Claimer {
    Claimer {
        cluster: id.into(),
        takeover_after: takeover_secs.map(jiff::SignedDuration::from_secs),
        standby_delay: standby_secs.map(jiff::SignedDuration::from_secs),
        scheduled: true,
        namespace: String::new(),
    }
}

/// Two clusters share one database. Cluster a claims a period and pauses before confirming;
/// within the bound b is told NotYet (ask again when it ends), without a bound ClaimedElsewhere
/// (with a's identity); past the bound, by the
/// database's clock, b takes the claim over in one transaction that raises the fence. Then a's
/// confirm is refused (so it creates no Job), a's token is refused by `fence()`, b's confirm
/// wins, and once confirmed the claim is never taken over again.
#[tokio::test]
async fn an_unconfirmed_claim_is_taken_over_and_its_claimer_fenced_out() {
    let prefix = unique_prefix("takeover");
    let p = prefix.as_str();
    let (job, period) = ("shared/billing", ts("2026-03-01T00:00:00Z"));
    let a = backstop(&prefix);
    let b = backstop(&prefix);
    let ca = cluster("east", Some(1), None);
    // b's bound is long at first: a's claim is still within it.
    let cb_patient = cluster("west", Some(3600), None);
    let cb = cluster("west", Some(1), None);

    let first = a
        .claim_as(job, period, 1, "billing-a", None, &ca)
        .await
        .unwrap();
    assert_eq!(first, ClaimOutcome::Claimed);
    let row = a.claimed(job, period).await.unwrap().unwrap();
    assert_eq!((row.cluster.as_str(), row.confirmed_at), ("east", None));

    let within = b
        .claim_as(job, period, 2, "billing-b", None, &cb_patient)
        .await
        .unwrap();
    assert_eq!(
        within,
        ClaimOutcome::NotYet {
            until: row.claimed_at + jiff::SignedDuration::from_secs(3600)
        },
        "within the bound: ask again when it ends"
    );
    // Without a bound: the period is the other cluster's.
    let no_bound = b
        .claim_as(
            job,
            period,
            2,
            "billing-b",
            None,
            &cluster("west", None, None),
        )
        .await
        .unwrap();
    assert_eq!(
        no_bound,
        ClaimOutcome::ClaimedElsewhere {
            cluster: "east".into(),
            token: 1,
            job_name: "billing-a".into()
        }
    );
    assert_eq!(
        b.fence(job).await.unwrap(),
        1,
        "a refused claim changes nothing"
    );

    // Past the bound by the database's clock (claimed_at is the database's now()).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let over = b
        .claim_as(job, period, 2, "billing-b", None, &cb)
        .await
        .unwrap();
    assert_eq!(
        over,
        ClaimOutcome::TookOver {
            cluster: "east".into(),
            token: 1
        }
    );
    assert!(over.is_ours(2));
    assert_eq!(
        b.fence(job).await.unwrap(),
        2,
        "the takeover raised the fence"
    );
    let row = b.claimed(job, period).await.unwrap().unwrap();
    assert_eq!(
        (row.cluster.as_str(), row.token, row.job_name.as_str()),
        ("west", 2, "billing-b")
    );

    // a resumes: its confirm fails (no Job), its writes are refused.
    assert!(
        !a.confirm(job, period, 1, "east").await.unwrap(),
        "a's late confirm must be refused"
    );
    let mut w = workload().await;
    let fence = format!("SELECT {p}fence($1, $2)");
    let e = fenced_write(&mut w, &fence, job, 1).await.unwrap_err();
    assert_eq!(sqlstate(&e), Some(STALE_TOKEN_SQLSTATE), "{e}");
    // a claiming again (a retry of its reconcile) must wait: b's claim is within a's bound.
    let again = a
        .claim_as(job, period, 1, "billing-a", None, &ca)
        .await
        .unwrap();
    assert!(matches!(again, ClaimOutcome::NotYet { .. }), "{again:?}");

    // b confirms and runs; its token passes the fence.
    assert!(b.confirm(job, period, 2, "west").await.unwrap());
    assert!(
        b.confirm(job, period, 2, "west").await.unwrap(),
        "confirm is idempotent"
    );
    fenced_write(&mut w, &fence, job, 2).await.unwrap();
    // Confirmed: never taken over, however long ago.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let late = a
        .claim_as(job, period, 3, "billing-a", None, &ca)
        .await
        .unwrap();
    assert!(
        matches!(late, ClaimOutcome::ClaimedElsewhere { ref cluster, token: 2, .. } if cluster == "west"),
        "{late:?}"
    );
    assert_eq!(a.fence(job).await.unwrap(), 2);
    cleanup(&prefix).await;
}

/// The confirm and the takeover race on the row lock: whichever commits first wins, never both.
/// Many rounds of a's confirm against b's takeover of an overdue claim.
#[tokio::test]
async fn confirm_and_takeover_never_both_win() {
    let prefix = unique_prefix("confrace");
    let a = backstop(&prefix);
    let b = backstop(&prefix);
    let ca = cluster("east", Some(1), None);
    let cb = cluster("west", Some(1), None);
    let job = "shared/race";
    let mut periods = Vec::new();
    // Periods in the past: across clusters a scheduled period is claimed only once it is due by
    // the database's clock.
    for i in 0..8i64 {
        let period = Timestamp::from_second(1_700_000_000 + i * 60).unwrap();
        let token = (2 * i + 1) as u64;
        a.claim_as(job, period, token, "a", None, &ca)
            .await
            .unwrap();
        periods.push((period, token));
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for (period, token) in periods {
        let fence = b.fence(job).await.unwrap();
        let (confirmed, taken) = tokio::join!(
            a.confirm(job, period, token, "east"),
            b.claim_as(job, period, fence + 1, "b", None, &cb)
        );
        let confirmed = confirmed.unwrap();
        let taken = taken.unwrap();
        let took = matches!(taken, ClaimOutcome::TookOver { .. });
        assert!(
            confirmed != took,
            "period {period}: confirmed={confirmed} taken={taken:?}"
        );
        let row = a.claimed(job, period).await.unwrap().unwrap();
        assert_eq!(row.cluster, if took { "west" } else { "east" });
    }
    cleanup(&prefix).await;
}

/// A standby claims a period only once the database's clock is `standbyDelaySeconds` past it;
/// the primary's claim meanwhile makes it ClaimedElsewhere. Claims of a controller without an
/// identity (an older one, or a single cluster) are never taken over.
#[tokio::test]
async fn standby_waits_by_the_database_clock_and_anonymous_claims_stay() {
    let prefix = unique_prefix("standby");
    let a = backstop(&prefix);
    let job = "shared/report";
    let standby = cluster("west", Some(1), Some(3600));
    // The database's now, not ours.
    let db_now: Timestamp = workload()
        .await
        .query_one("SELECT now()", &[])
        .await
        .unwrap()
        .get(0);
    let period = db_now - jiff::SignedDuration::from_secs(10);
    let r = a
        .claim_as(job, period, 1, "s", None, &standby)
        .await
        .unwrap();
    match r {
        ClaimOutcome::NotYet { until } => {
            assert_eq!(until, period + jiff::SignedDuration::from_secs(3600))
        }
        other => panic!("expected NotYet, got {other:?}"),
    }
    assert_eq!(
        a.fence(job).await.unwrap(),
        0,
        "a standby's early claim writes nothing"
    );
    assert_eq!(a.claimed(job, period).await.unwrap(), None);
    // Past its delay (a period an hour and more ago): it claims.
    let old = db_now - jiff::SignedDuration::from_secs(3700);
    assert_eq!(
        a.claim_as(job, old, 1, "s", None, &standby).await.unwrap(),
        ClaimOutcome::Claimed
    );

    // An anonymous claim, unconfirmed and overdue, is never taken over.
    let anon_period = ts("2026-05-01T00:00:00Z");
    a.claim(job, anon_period, 2, "anon", None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = a
        .claim_as(
            job,
            anon_period,
            3,
            "w",
            None,
            &cluster("west", Some(1), None),
        )
        .await
        .unwrap();
    assert_eq!(
        r,
        ClaimOutcome::Duplicate {
            token: 2,
            job_name: "anon".into()
        }
    );
    cleanup(&prefix).await;
}

/// Two clusters may choose the same token (it is chosen before the claim transaction, from the
/// fence each read): the other cluster's row with our token is not ours. Within the bound we
/// wait; past it the takeover needs a token above the fence (StaleToken: claim again higher), and
/// the row stays as it was; confirming with the same token from the wrong cluster fails.
#[tokio::test]
async fn the_same_token_from_another_cluster_is_not_ours() {
    let prefix = unique_prefix("sametoken");
    let b = backstop(&prefix);
    let (job, period) = ("shared/same", ts("2026-06-01T00:00:00Z"));
    let east = cluster("east", Some(1), None);
    let west = cluster("west", Some(1), None);
    assert_eq!(
        b.claim_as(job, period, 1, "same-1", None, &east)
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    let r = b
        .claim_as(job, period, 1, "same-1", None, &west)
        .await
        .unwrap();
    assert!(matches!(r, ClaimOutcome::NotYet { .. }), "{r:?}");
    assert!(!b.confirm(job, period, 1, "west").await.unwrap());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let e = b
        .claim_as(job, period, 1, "same-1", None, &west)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::StaleToken { current: 1, .. }), "{e}");
    let row = b.claimed(job, period).await.unwrap().unwrap();
    assert_eq!(
        (row.cluster.as_str(), row.token),
        ("east", 1),
        "rolled back"
    );
    assert_eq!(
        b.claim_as(job, period, 2, "same-1", None, &west)
            .await
            .unwrap(),
        ClaimOutcome::TookOver {
            cluster: "east".into(),
            token: 1
        }
    );
    assert!(!b.confirm(job, period, 1, "east").await.unwrap());
    assert!(b.confirm(job, period, 2, "west").await.unwrap());
    cleanup(&prefix).await;
}

/// Tokens follow the periods across clusters. A scheduled claim of a period older than one
/// another cluster has claimed is refused (Superseded, naming the later claim) and changes
/// nothing; a later period is claimed as usual; a cluster's own later claim, and a run a user
/// asked for (a trigger or backfill, not scheduled), are not refused.
#[tokio::test]
async fn a_period_older_than_another_clusters_claim_is_superseded() {
    let prefix = unique_prefix("periodorder");
    let b = backstop(&prefix);
    let job = "shared/order";
    let (p1, p2, p3) = (
        ts("2026-07-01T00:00:00Z"),
        ts("2026-07-01T00:01:00Z"),
        ts("2026-07-01T00:02:00Z"),
    );
    let east = cluster("east", Some(60), None);
    let west = cluster("west", Some(60), Some(30));
    // East (the primary, back from an outage) claims p2 and folds p1 into it.
    let claimed = b.claim_as(job, p2, 1, "order-2", None, &east).await;
    assert_eq!(claimed.unwrap(), ClaimOutcome::Claimed);
    // West (the standby, after its delay) comes to p1 later.
    let late = b.claim_as(job, p1, 2, "order-1", None, &west).await;
    assert_eq!(
        late.unwrap(),
        ClaimOutcome::Superseded {
            period: p2,
            cluster: "east".into(),
            token: 1
        }
    );
    assert_eq!(b.fence(job).await.unwrap(), 1, "refused: nothing changed");
    assert_eq!(b.claimed(job, p1).await.unwrap(), None);
    // A later period is claimed as usual.
    let next = b.claim_as(job, p3, 2, "order-3", None, &west).await;
    assert_eq!(next.unwrap(), ClaimOutcome::Claimed);
    // A backfill of p1 (a user's request, not scheduled) is not refused.
    let backfill = Claimer {
        scheduled: false,
        ..west.clone()
    };
    let asked = b.claim_as(job, p1, 3, "order-1", None, &backfill).await;
    assert_eq!(asked.unwrap(), ClaimOutcome::Claimed);
    // Within one cluster the order is the controller's: its own later claim refuses nothing.
    let own = "shared/own";
    assert_eq!(
        b.claim_as(own, p2, 1, "own-2", None, &east).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        b.claim_as(own, p1, 2, "own-1", None, &east).await.unwrap(),
        ClaimOutcome::Claimed
    );
    // Without an identity (one cluster) nothing is ever superseded.
    let anon = "shared/anon";
    let nobody = Claimer {
        scheduled: true,
        ..Claimer::default()
    };
    b.claim_as(anon, p2, 1, "anon-2", None, &east)
        .await
        .unwrap();
    let r = b.claim_as(anon, p1, 2, "anon-1", None, &nobody).await;
    assert_eq!(r.unwrap(), ClaimOutcome::Claimed);
    cleanup(&prefix).await;
}

/// Two clusters claim adjacent periods at the same moment, the later period with the lower
/// token, many times over. Whichever commits first, the committed claims' tokens rise with their
/// periods: the fence row's lock orders the claim transactions, and the second sees the first.
#[tokio::test]
async fn racing_claims_of_adjacent_periods_keep_tokens_in_period_order() {
    let prefix = unique_prefix("orderrace");
    let east = backstop(&prefix);
    let west = backstop(&prefix);
    let (ce, cw) = (cluster("east", None, None), cluster("west", None, None));
    let (p1, p2) = (ts("2026-07-01T00:00:00Z"), ts("2026-07-01T00:01:00Z"));
    let mut superseded = 0;
    for i in 0..40 {
        let job = format!("shared/race-{i}");
        let (newer, older) = tokio::join!(
            east.claim_as(&job, p2, 1, "race-2", None, &ce),
            west.claim_as(&job, p1, 2, "race-1", None, &cw),
        );
        match newer {
            Ok(ClaimOutcome::Claimed) => {}
            // West committed first with the higher token: east claims again above it.
            Err(Error::StaleToken { current: 2, .. }) => {
                let again = east.claim_as(&job, p2, 3, "race-2", None, &ce).await;
                assert_eq!(again.unwrap(), ClaimOutcome::Claimed);
            }
            other => panic!("east: {other:?}"),
        }
        match older.unwrap() {
            ClaimOutcome::Claimed => {}
            ClaimOutcome::Superseded { period, .. } => {
                assert_eq!(period, p2);
                superseded += 1;
            }
            other => panic!("west: {other:?}"),
        }
        let first = east.claimed(&job, p1).await.unwrap().map(|r| r.token);
        let second = east.claimed(&job, p2).await.unwrap().map(|r| r.token);
        if let (Some(t1), Some(t2)) = (first, second) {
            assert!(
                t1 < t2,
                "{job}: token {t1} of {p1} not below token {t2} of {p2}"
            );
        }
    }
    eprintln!("superseded in {superseded} of 40 races");
    cleanup(&prefix).await;
}

/// Version skew (issue 36): a newer release's schema that only added is claimed against as
/// before; one whose migration a newer release marked as changing what the tables mean (its
/// `needs`) refuses this controller's claims with a reason that says what to do, and the claims
/// table gains no row.
#[tokio::test]
async fn a_newer_schema_is_claimed_against_only_when_it_only_added() {
    let prefix = unique_prefix("skew");
    let p = prefix.as_str();
    let job = "billing/skew";
    let b = backstop(&prefix);
    assert_eq!(b.ensure_schema().await.unwrap(), SCHEMA_VERSION);
    let admin = workload().await;
    // This release's own migrations only added (schema 9: the withdrawn claims' archive): the
    // previous release, which knows schema 8, claims against them.
    let needed: i32 = admin
        .query_one(
            &format!("SELECT coalesce(max(needs), 0) FROM {p}schema_version"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        needed <= 8,
        "a controller of schema 8 refuses: needs {needed}"
    );
    let (added, changed) = (SCHEMA_VERSION + 1, SCHEMA_VERSION + 2);
    admin
        .execute(
            &format!("INSERT INTO {p}schema_version (version, needs) VALUES ($1, 0)"),
            &[&added],
        )
        .await
        .unwrap();
    let older = backstop(&prefix);
    assert_eq!(older.ensure_schema().await.unwrap(), added);
    assert_eq!(
        older
            .claim(job, ts("2025-01-01T00:00:00Z"), 1, "skew-1", None)
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    admin
        .execute(
            &format!("INSERT INTO {p}schema_version (version, needs) VALUES ($1, $1)"),
            &[&changed],
        )
        .await
        .unwrap();
    let refused = backstop(&prefix);
    let e = refused.ensure_schema().await.unwrap_err();
    let said = e.to_string();
    assert!(matches!(e, Error::BackstopConfig(_)), "{e:?}");
    for part in [
        format!("version {changed}"),
        format!("knows schema {changed} or newer"),
        format!("this controller knows schema {SCHEMA_VERSION}"),
        "upgrade the controller".to_string(),
    ] {
        assert!(said.contains(&part), "{part:?} not in {said:?}");
    }
    let e = refused
        .claim(job, ts("2025-02-01T00:00:00Z"), 2, "skew-2", None)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::BackstopConfig(_)), "{e:?}");
    let rows: i64 = admin
        .query_one(&format!("SELECT count(*) FROM {p}claims"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        rows, 1,
        "only the claim made before the incompatible schema"
    );
    cleanup(&prefix).await;
}

/// The schema the client libraries' tests load (clients/testdata/) is the one the controller
/// makes: regenerate it with `SINGLETON_BLESS=1 cargo test -p singleton-controller --lib
/// client_testdata` after a migration changes.
#[test]
fn client_testdata_is_the_controllers_schema() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../clients/testdata/postgres.sql"
    );
    let want = format!(
        "-- Generated from controller/src/backstop/postgres/schema.rs (table prefix singleton_): the\n\
         -- schema the controller creates, for the client libraries' tests. Do not edit.\n{}",
        schema::script(&TablePrefix::default())
    );
    if std::env::var_os("SINGLETON_BLESS").is_some() {
        std::fs::create_dir_all(std::path::Path::new(path).parent().unwrap()).unwrap();
        std::fs::write(path, &want).unwrap();
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        have == want,
        "{path} is not the controller's schema: run SINGLETON_BLESS=1 cargo test -p singleton-controller --lib client_testdata"
    );
}
