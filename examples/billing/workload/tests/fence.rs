//! The workload against a real PostgreSQL (`$DATABASE_URL`, as `make unit` sets it), with the
//! controller's own backstop code claiming the periods, advancing the fence and retiring tokens.
//! Each test has its own tables (a table prefix for the controller's, a schema for the
//! workload's), so the tests run in parallel and leave nothing behind that a rerun trips over.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use billing_workload::{Args, Error};
use jiff::Timestamp;
use k8s_openapi::ByteString;
use singleton::backstop::{Backstop, ConnectionConfig, SecretKeys, TablePrefix};

fn database_url() -> String {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "DATABASE_URL is not set: these tests need a real PostgreSQL. Run `make up`, then \
             `eval \"$(make -s env)\"` and rerun (`make unit` does both)."
        ),
    }
}

/// One test's world: the controller's tables under `prefix`, the billing tables in `schema`.
struct World {
    backstop: Backstop,
    prefix: String,
    schema: String,
    job: String,
}

impl World {
    async fn new(tag: &str) -> World {
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let id = (nanos ^ std::process::id().rotate_left(16))
            .wrapping_add(N.fetch_add(1, Ordering::Relaxed));
        let prefix = format!("t_bw{tag}_{id:08x}_");
        let schema = format!("bw{tag}_{id:08x}");
        let data: BTreeMap<String, ByteString> =
            [("url", database_url()), ("sslmode", "disable".into())]
                .into_iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.into_bytes())))
                .collect();
        let config = ConnectionConfig::from_secret(&data, &SecretKeys::default()).unwrap();
        let backstop = Backstop::new(config, TablePrefix::new(&prefix).unwrap()).unwrap();
        backstop.ensure_schema().await.unwrap();
        // The example's own tables, exactly as users create them.
        let (client, conn) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
            .batch_execute(&format!(
                "CREATE SCHEMA {schema}; SET search_path TO {schema}, public;\n{}",
                include_str!("../../schema.sql")
            ))
            .await
            .unwrap();
        World {
            backstop,
            prefix,
            schema,
            job: format!("billing/{tag}"),
        }
    }

    /// The workload's settings for `period` and `token`, with its tables found in this world.
    fn args(&self, period: Timestamp, token: u64) -> Args {
        let url = database_url();
        let sep = if url.contains('?') { '&' } else { '?' };
        Args {
            database_url: format!(
                "{url}{sep}options=-c%20search_path%3D{}%2Cpublic",
                self.schema
            ),
            sslrootcert: None,
            job: self.job.clone(),
            period,
            token,
            idempotency_key: format!("key-{period}"),
            fence_function: format!("{}fence", self.prefix),
            work_seconds: 0,
            attempt: None,
        }
    }

    /// The same settings as attempt (pod) `id`, working `work` seconds before its writes.
    fn attempt(&self, period: Timestamp, token: u64, id: &str, work: u64) -> Args {
        Args {
            attempt: Some(id.into()),
            work_seconds: work,
            ..self.args(period, token)
        }
    }

    /// The attempts that committed the period's writes (`run_attempts`), in commit order.
    async fn committed_attempts(&self, period: Timestamp) -> Vec<String> {
        let (client, conn) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
            .query(
                &format!(
                    "SELECT attempt FROM {}.run_attempts WHERE period = $1 ORDER BY committed_at",
                    self.schema
                ),
                &[&period],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    async fn claim(&self, period: Timestamp, token: u64) {
        self.backstop
            .claim(&self.job, period, token, &format!("invoices-{token}"), None)
            .await
            .unwrap();
    }

    /// Invoices of `period` in the table, with the tokens that wrote them.
    async fn invoices(&self, period: Timestamp) -> Vec<i64> {
        let (client, conn) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let rows = client
            .query(
                &format!(
                    "SELECT fencing_token FROM {}.invoices WHERE period = $1 ORDER BY customer",
                    self.schema
                ),
                &[&period],
            )
            .await
            .unwrap();
        rows.iter().map(|r| r.get(0)).collect()
    }
}

fn period(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn sqlstate(e: &Error) -> &str {
    match e {
        Error::Refused { sqlstate, .. } => sqlstate,
        other => panic!("expected a refusal by the fence, got {other}"),
    }
}

#[tokio::test]
async fn the_current_token_commits_once_and_a_retry_changes_nothing() {
    let w = World::new("cur").await;
    let jan = period("2025-01-01T02:00:00Z");
    w.claim(jan, 1).await;
    let done = billing_workload::run(w.args(jan, 1)).await.unwrap();
    assert_eq!(done.invoices, 3);
    // The same run again (a pod retried by the Job): the natural key keeps one invoice each.
    let again = billing_workload::run(w.args(jan, 1)).await.unwrap();
    assert_eq!(again.invoices, 3);
    assert_eq!(w.invoices(jan).await, vec![1, 1, 1]);
}

#[tokio::test]
async fn a_stale_token_commits_nothing() {
    let w = World::new("stale").await;
    let (jan, feb) = (
        period("2025-01-01T02:00:00Z"),
        period("2025-02-01T02:00:00Z"),
    );
    w.claim(jan, 1).await;
    // February's claim advances the fence to 2 before January's run (paused, say) writes.
    w.claim(feb, 2).await;
    let e = billing_workload::run(w.args(jan, 1)).await.unwrap_err();
    assert_eq!(sqlstate(&e), "SF001", "{e}");
    assert_eq!(e.exit_code(), 3);
    assert!(w.invoices(jan).await.is_empty(), "the stale run wrote");
    // The current run is unaffected.
    assert_eq!(
        billing_workload::run(w.args(feb, 2))
            .await
            .unwrap()
            .invoices,
        3
    );
}

#[tokio::test]
async fn a_retired_token_and_a_token_never_issued_are_refused() {
    let w = World::new("ret").await;
    let jan = period("2025-01-01T02:00:00Z");
    w.claim(jan, 1).await;
    // A token above the fence never came from the controller.
    let e = billing_workload::run(w.args(jan, 2)).await.unwrap_err();
    assert_eq!(sqlstate(&e), "SF003", "{e}");
    // January is decided: its token is retired although it is still the stored fence.
    w.backstop.retire(&w.job, 1, "").await.unwrap();
    let e = billing_workload::run(w.args(jan, 1)).await.unwrap_err();
    assert_eq!(sqlstate(&e), "SF001", "{e}");
    assert!(w.invoices(jan).await.is_empty());
}

/// The binary as a Job runs it: settings from the environment, the outcome in the exit code.
fn workload(w: &World, args: &Args) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_billing-workload"))
        .env_clear()
        .env("DATABASE_URL", &args.database_url)
        .env("SINGLETON_JOB", &args.job)
        .env("SINGLETON_PERIOD", args.period.to_string())
        .env("SINGLETON_FENCING_TOKEN", args.token.to_string())
        .env("SINGLETON_IDEMPOTENCY_KEY", &args.idempotency_key)
        .env("BILLING_FENCE_FUNCTION", format!("{}fence", w.prefix))
        .output()
        .unwrap()
}

#[tokio::test]
async fn the_binary_prints_its_run_and_exits_3_when_fenced_out() {
    let w = World::new("bin").await;
    let (jan, feb) = (
        period("2025-01-01T02:00:00Z"),
        period("2025-02-01T02:00:00Z"),
    );
    w.claim(jan, 1).await;
    let ok = workload(&w, &w.args(jan, 1));
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(out.contains("fencing token 1"), "{out}");
    assert!(out.contains("committed 3 invoice(s)"), "{out}");

    w.claim(feb, 2).await;
    let stale = workload(&w, &w.args(jan, 1));
    let err = String::from_utf8_lossy(&stale.stderr);
    assert_eq!(stale.status.code(), Some(3), "{err}");
    assert!(err.contains("SQLSTATE SF001"), "{err}");

    // Bad input: a clear message and exit code 2, nothing written.
    let good = w.args(feb, 2);
    for (var, value, says) in [
        ("SINGLETON_PERIOD", "not a time", "--period"),
        (
            "BILLING_FENCE_FUNCTION",
            "x; DROP TABLE invoices",
            "not a lower-case SQL identifier",
        ),
        ("SINGLETON_FENCING_TOKEN", "-1", "--token"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_billing-workload"))
            .env_clear()
            .env("DATABASE_URL", &good.database_url)
            .env("SINGLETON_JOB", &good.job)
            .env("SINGLETON_PERIOD", good.period.to_string())
            .env("SINGLETON_FENCING_TOKEN", "2")
            .env("SINGLETON_IDEMPOTENCY_KEY", "k")
            .env(var, value)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}={value}: {err}");
        assert!(err.contains(says), "{var}={value}: {err}");
    }
    assert!(w.invoices(feb).await.is_empty());
}

/// F1 with the example's own workload: a pod of a run that works while its replacement starts
/// (its node stopped answering, say) is fenced out by the replacement's registration; only the
/// replacement commits the period's writes, once.
#[tokio::test]
async fn an_older_pod_of_the_run_commits_nothing_once_its_replacement_registered() {
    let w = World::new("att").await;
    let jan = period("2025-01-01T02:00:00Z");
    w.claim(jan, 1).await;
    let old = tokio::spawn(billing_workload::run(w.attempt(jan, 1, "pod-a", 2)));
    // The old pod has registered and works; the replacement starts, registers and commits.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let new = billing_workload::run(w.attempt(jan, 1, "pod-b", 0))
        .await
        .unwrap();
    assert_eq!(new.attempt, Some(("pod-b".to_string(), 2)));
    let e = old.await.unwrap().unwrap_err();
    assert_eq!(sqlstate(&e), "SF004", "{e}");
    assert_eq!(e.exit_code(), 3);
    assert_eq!(w.committed_attempts(jan).await, ["pod-b"]);
    assert_eq!(w.invoices(jan).await, vec![1, 1, 1]);
}

/// The psql-only example (examples/billing/invoice-run.sh) registers its attempt and fences with
/// it as the Rust workload does: it commits as the newest attempt, and once a newer attempt of
/// the run registered it is refused and commits nothing.
#[tokio::test]
async fn the_psql_script_registers_its_attempt_and_is_fenced_out_by_a_newer_one() {
    let w = World::new("sh").await;
    let jan = period("2025-01-01T02:00:00Z");
    w.claim(jan, 1).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../invoice-run.sh");
    let run = |attempt: &str| {
        let args = w.args(jan, 1);
        Command::new("sh")
            .arg(script)
            .env("DATABASE_URL", &args.database_url)
            .env("SINGLETON_JOB", &args.job)
            .env("SINGLETON_PERIOD", args.period.to_string())
            .env("SINGLETON_FENCING_TOKEN", "1")
            .env("SINGLETON_IDEMPOTENCY_KEY", &args.idempotency_key)
            .env("SINGLETON_ATTEMPT", attempt)
            .env("BILLING_TABLE_PREFIX", &w.prefix)
            .output()
            .unwrap()
    };
    let ok = run("pod-a");
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(out.contains("registered as attempt #1"), "{out}");
    assert!(
        out.contains("committed 3 invoice(s) under fence 1"),
        "{out}"
    );
    // A newer attempt registers and commits; the older one, running again, is refused before
    // any write.
    billing_workload::run(w.attempt(jan, 1, "pod-b", 0))
        .await
        .unwrap();
    let stale = run("pod-a");
    let err = String::from_utf8_lossy(&stale.stderr);
    assert!(!stale.status.success());
    assert!(err.contains("superseded"), "{err}");
    assert_eq!(w.committed_attempts(jan).await, ["pod-a", "pod-b"]);
}
