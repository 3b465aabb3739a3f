//! The billing example's workload, and the reference for writing one: a run reads the variables
//! the controller sets on its containers and does all its writes in one transaction that first
//! calls `singleton_fence(job, token)`. A run whose token is stale (a newer run of the job was
//! started, say after this pod was frozen past a Replace) fails there with SQLSTATE `SF001`, and
//! nothing it wrote commits. See docs/fencing.md and examples/billing/README.md.
//!
//! Environment: `DATABASE_URL` (the workload's own connection; the example's tables from
//! examples/billing/schema.sql), `SINGLETON_JOB`, `SINGLETON_PERIOD`, `SINGLETON_FENCING_TOKEN`,
//! `SINGLETON_IDEMPOTENCY_KEY` (the last four set by the controller).
//! `BILLING_WORK_SECONDS` (default 0) stands for the time computing the invoices takes before the
//! write: the window in which the tests freeze a run.
//! Exit status: 0 committed, 2 bad environment, 3 refused by the fence, 1 any other failure.
//!
//! SIGTERM (the pod deleted, e.g. by a `Replace`) does not stop a run half-way: it goes on to its
//! one transaction, and the fence decides whether that commits. A run that was frozen or paused
//! past the start of a newer run is refused there, which is the point of the example.
//!
//! The connection is plain TCP (`NoTls`): the example's database is reached over the node's pod
//! bridge. A real deployment adds TLS (tokio-postgres-rustls, as the controller's backstop does).

use std::process::ExitCode;

use tokio_postgres::NoTls;

/// SQLSTATE raised by `singleton_fence` for a stale token (controller/src/backstop/schema.rs).
const STALE_TOKEN: &str = "SF001";

#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("{0} is not set")]
    Missing(&'static str),
    #[error("SINGLETON_FENCING_TOKEN is not a number: {0:?}")]
    BadToken(String),
    #[error("refused by the fence (SQLSTATE {code}): {message}")]
    Fenced { code: String, message: String },
    #[error("database: {}", describe(.0))]
    Db(tokio_postgres::Error),
}

/// The server's own words (SQLSTATE and message) when it said something; tokio-postgres' Display
/// alone says only "db error".
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("SQLSTATE {}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        match e.as_db_error() {
            Some(db) if db.code().code() == STALE_TOKEN => Error::Fenced {
                code: db.code().code().to_owned(),
                message: db.message().to_owned(),
            },
            _ => Error::Db(e),
        }
    }
}

type Result<T, E = Error> = std::result::Result<T, E>;

/// One run, as the controller describes it.
struct Run {
    job: String,
    period: String,
    token: i64,
    idempotency_key: String,
}

fn var(name: &'static str) -> Result<String> {
    std::env::var(name).map_err(|_| Error::Missing(name))
}

impl Run {
    fn from_env() -> Result<Self> {
        let token = var("SINGLETON_FENCING_TOKEN")?;
        Ok(Run {
            job: var("SINGLETON_JOB")?,
            period: var("SINGLETON_PERIOD")?,
            token: token.parse().map_err(|_| Error::BadToken(token))?,
            idempotency_key: var("SINGLETON_IDEMPOTENCY_KEY")?,
        })
    }
}

/// The run's one transaction; returns the number of invoices of its period.
async fn invoice(url: &str, run: &Run) -> Result<i64> {
    let (mut client, connection) = tokio_postgres::connect(url, NoTls).await?;
    let connection = tokio::spawn(connection);
    let tx = client.transaction().await?;
    // 1. The fence, first: SF001 if a newer run holds it; otherwise it holds the fence row's lock
    //    until COMMIT, so no newer run is fenced in half-way through these writes.
    tx.execute("SELECT singleton_fence($1, $2)", &[&run.job, &run.token])
        .await?;
    // 2. The writes. The natural key (period, customer) makes a retry of this run a no-op.
    tx.execute(
        "INSERT INTO invoices (period, customer, amount_cents, fencing_token, idempotency_key)
         SELECT $1::text::timestamptz, customer, monthly_cents, $2, $3 || '/' || customer
         FROM customers
         ON CONFLICT (period, customer) DO NOTHING",
        &[&run.period, &run.token, &run.idempotency_key],
    )
    .await?;
    // 3. The period's summary with its token: what the e2e test reads back.
    let row = tx
        .query_one(
            "INSERT INTO invoice_runs AS r (period, token, invoices)
             SELECT $1::text::timestamptz, $2, count(*) FROM invoices
             WHERE period = $1::text::timestamptz
             ON CONFLICT (period) DO UPDATE
               SET token = EXCLUDED.token, invoices = EXCLUDED.invoices, finished_at = now()
               WHERE r.token <= EXCLUDED.token
             RETURNING invoices::bigint",
            &[&run.period, &run.token],
        )
        .await?;
    tx.commit().await?;
    drop(client);
    // The connection task ends when the client is dropped; its error, if any, is already ours.
    let _ = connection.await;
    Ok(row.get(0))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let run = match Run::from_env() {
        Ok(run) => run,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let url = match var("DATABASE_URL") {
        Ok(url) => url,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "invoice run for {}, period {}, fencing token {}",
        run.job, run.period, run.token
    );
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::spawn(async move {
                while term.recv().await.is_some() {
                    println!("SIGTERM: finishing this run; the fence decides whether it commits");
                }
            });
        }
        Err(e) => eprintln!("cannot handle SIGTERM: {e}"),
    }
    let work = std::env::var("BILLING_WORK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0u64);
    if work > 0 {
        println!("computing invoices for {work}s");
        tokio::time::sleep(std::time::Duration::from_secs(work)).await;
    }
    match invoice(&url, &run).await {
        Ok(n) => {
            println!("committed {n} invoice(s) under fence {}", run.token);
            ExitCode::SUCCESS
        }
        Err(e @ Error::Fenced { .. }) => {
            eprintln!("{e}");
            ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
