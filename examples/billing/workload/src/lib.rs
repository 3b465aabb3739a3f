//! The billing example's workload, and the reference for yours: a run that proves its fencing
//! token inside the transaction that does its writes, so a stale run (a pod paused past a
//! Replace, a copy started twice) commits nothing.
//!
//! The steps, as in examples/billing/invoice-run.sh (the same run with psql only):
//!
//! ```text
//! 1. Read the run: SINGLETON_JOB, SINGLETON_PERIOD, SINGLETON_FENCING_TOKEN,
//!    SINGLETON_IDEMPOTENCY_KEY and SINGLETON_ATTEMPT (the pod's uid), set by the controller on
//!    every container of a run.
//! 2. Register this pod as the run's newest attempt: SELECT singleton_attempt(job, token,
//!    attempt), in a transaction of its own. From then on no older pod of this run (one whose
//!    node stopped answering, say) commits a fenced write.
//! 3. Work (BILLING_WORK_SECONDS, 0 by default): what takes time before the writes.
//! 4. BEGIN; SELECT singleton_fence(job, token, attempt): refused (SQLSTATE SF001 to SF004)
//!    unless this run's token is the job's current one and this pod its newest attempt; holds
//!    the fence row's lock until COMMIT.
//! 5. The writes: the invoices, keyed by (period, customer), so a retry changes nothing; and one
//!    row in run_attempts, the run's ledger entry, which is not idempotent on purpose (as a
//!    debit of a balance is not): only the fence keeps two pods of the run from both making it.
//! 6. COMMIT.
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use tokio_postgres::{Client, NoTls};

/// What can go wrong, by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The run's settings are unusable: fix them, a retry cannot help.
    #[error("bad input: {0}")]
    Input(String),
    /// The database refused this run's token: a newer run holds the job, or this one's period is
    /// decided. Stop without retrying: the token never becomes current again.
    #[error("refused by the fence (SQLSTATE {sqlstate}): {message}")]
    Refused { sqlstate: String, message: String },
    /// Connecting or writing failed; nothing committed, and a retry may succeed.
    #[error("database: {0}")]
    Database(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The process's exit code: 2 bad input, 3 refused by the fence, 1 otherwise. A Job's
    /// `podFailurePolicy` can fail the Job at once on 2 and 3 instead of retrying.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Input(_) => 2,
            Error::Refused { .. } => 3,
            Error::Database(_) => 1,
        }
    }
}

/// The SQLSTATEs of `singleton_fence()` and `singleton_attempt()`: stale token, caller not
/// entitled to the job, token never issued, attempt superseded (docs/fencing.md).
const FENCE_SQLSTATES: [&str; 4] = ["SF001", "SF002", "SF003", "SF004"];

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        match e.as_db_error() {
            Some(db) if FENCE_SQLSTATES.contains(&db.code().code()) => Error::Refused {
                sqlstate: db.code().code().to_string(),
                message: db.message().to_string(),
            },
            Some(db) => {
                Error::Database(format!("{} (SQLSTATE {})", db.message(), db.code().code()))
            }
            None => Error::Database(e.to_string()),
        }
    }
}

/// The command line; every flag can come from the environment instead, as in a Job.
#[derive(Clone, Debug, clap::Parser)]
#[command(version, about)]
pub struct Args {
    /// The billing database, a `postgres://` URL. `sslmode=disable` connects in plain TCP; any
    /// other value (and none) connects over TLS and verifies the server's certificate and name.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// PEM file of the CA that signed the server's certificate (else the system's CAs).
    #[arg(long, env = "PGSSLROOTCERT")]
    pub sslrootcert: Option<PathBuf>,
    /// `namespace/name` of the SingletonJob: the fence's key.
    #[arg(long, env = "SINGLETON_JOB")]
    pub job: String,
    /// The run's scheduled instant (RFC 3339).
    #[arg(long, env = "SINGLETON_PERIOD")]
    pub period: Timestamp,
    /// The run's fencing token.
    #[arg(long, env = "SINGLETON_FENCING_TOKEN")]
    pub token: u64,
    /// Stable per job and period: the key for external calls.
    #[arg(long, env = "SINGLETON_IDEMPOTENCY_KEY")]
    pub idempotency_key: String,
    /// The fence function: `<tablePrefix>fence` of the SingletonJob's backstop.
    #[arg(
        long,
        env = "BILLING_FENCE_FUNCTION",
        default_value = "singleton_fence"
    )]
    pub fence_function: String,
    /// Seconds of work before the fenced transaction (the demo and the chaos tests use it to
    /// hold a run open).
    #[arg(long, env = "BILLING_WORK_SECONDS", default_value_t = 0)]
    pub work_seconds: u64,
    /// This attempt's id: the pod's uid, which the controller passes on every container. Without
    /// it the run is fenced by its token alone (`singleton_fence(job, token)`), which cannot tell
    /// two pods of one run apart.
    #[arg(long, env = "SINGLETON_ATTEMPT")]
    pub attempt: Option<String>,
}

/// A run that committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Committed {
    pub job: String,
    pub period: Timestamp,
    pub token: u64,
    /// This attempt and its number in the run (1 for the run's first pod), when it registered.
    pub attempt: Option<(String, i32)>,
    /// Invoices of the period in the table after the commit (this run's and any earlier run's of
    /// the same period).
    pub invoices: i64,
}

impl fmt::Display for Committed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "committed {} invoice(s) for {} period {} under fencing token {}",
            self.invoices, self.job, self.period, self.token
        )?;
        if let Some((attempt, seq)) = &self.attempt {
            write!(f, ", attempt #{seq} ({attempt})")?;
        }
        Ok(())
    }
}

/// Steps 1 to 5.
pub async fn run(args: Args) -> Result<Committed> {
    let fence = fence_function(&args.fence_function)?;
    let token = i64::try_from(args.token)
        .ok()
        .filter(|t| *t > 0)
        .ok_or_else(|| Error::Input(format!("fencing token {} is out of range", args.token)))?;
    if args.job.trim().is_empty() || args.idempotency_key.trim().is_empty() {
        return Err(Error::Input(
            "SINGLETON_JOB and SINGLETON_IDEMPOTENCY_KEY must not be empty".into(),
        ));
    }
    println!(
        "invoice run for {}, period {}, fencing token {}",
        args.job, args.period, args.token
    );
    let attempt = match args.attempt.as_deref().filter(|a| !a.trim().is_empty()) {
        Some(id) => {
            let register = attempt_function(&fence)?;
            let client = connect(&args.database_url, args.sslrootcert.as_deref()).await?;
            let seq: i32 = client
                .query_one(
                    &format!("SELECT {register}($1, $2, $3)"),
                    &[&args.job, &token, &id],
                )
                .await?
                .get(0);
            println!("registered as attempt #{seq} ({id}) of this run");
            Some((id.to_string(), seq))
        }
        None => None,
    };
    if args.work_seconds > 0 {
        println!(
            "working for {} s before the fenced writes",
            args.work_seconds
        );
        tokio::time::sleep(Duration::from_secs(args.work_seconds)).await;
    }
    let mut client = connect(&args.database_url, args.sslrootcert.as_deref()).await?;
    let invoices = invoice(&mut client, &fence, &args, token, attempt.as_ref()).await?;
    Ok(Committed {
        job: args.job,
        period: args.period,
        token: args.token,
        attempt,
        invoices,
    })
}

/// Steps 4 to 6: one transaction, fenced first. Returns the period's invoices.
async fn invoice(
    client: &mut Client,
    fence: &str,
    args: &Args,
    token: i64,
    attempt: Option<&(String, i32)>,
) -> Result<i64> {
    let tx = client.transaction().await?;
    // 4. The fence, first. A function name cannot be a parameter; it was checked to be a plain
    //    identifier.
    match attempt {
        Some((id, _)) => {
            tx.execute(
                &format!("SELECT {fence}($1, $2, $3)"),
                &[&args.job, &token, id],
            )
            .await?
        }
        None => {
            tx.execute(&format!("SELECT {fence}($1, $2)"), &[&args.job, &token])
                .await?
        }
    };
    let count = "SELECT count(*) FROM invoices WHERE period = $1";
    // 5. The writes. The natural key (period, customer) makes a retry of this run a no-op.
    tx.execute(
        "INSERT INTO invoices (period, customer, amount_cents, fencing_token, idempotency_key)
         SELECT $1, customer, monthly_cents, $2, $3 || '/' || customer FROM customers
         ON CONFLICT (period, customer) DO NOTHING",
        &[&args.period, &token, &args.idempotency_key],
    )
    .await?;
    // The conditional-update pattern, for stores without a fence function.
    let id = attempt.map(|(id, _)| id.as_str());
    tx.execute(
        "INSERT INTO invoice_runs AS r (period, token, invoices, attempt)
         SELECT $1, $2, count(*), $3 FROM invoices WHERE period = $1
         ON CONFLICT (period) DO UPDATE
           SET token = EXCLUDED.token, invoices = EXCLUDED.invoices, finished_at = now(),
               attempt = EXCLUDED.attempt
           WHERE r.token <= EXCLUDED.token",
        &[&args.period, &token, &id],
    )
    .await?;
    // The run's ledger entry: which attempt (pod) committed, at the database's time. Not
    // idempotent on purpose, as a debit is not: a second pod of the run committing would add a
    // second row. The chaos suite counts these rows per period.
    tx.execute(
        "INSERT INTO run_attempts (period, token, attempt, seq) VALUES ($1, $2, $3, $4)",
        &[&args.period, &token, &id, &attempt.map(|(_, seq)| *seq)],
    )
    .await?;
    let n: i64 = tx.query_one(count, &[&args.period]).await?.get(0);
    // 6. Everything above commits, or nothing does.
    tx.commit().await?;
    Ok(n)
}

/// The registration function beside the fence function `fence` (`<p>fence` → `<p>attempt`).
fn attempt_function(fence: &str) -> Result<String> {
    fence
        .strip_suffix("fence")
        .map(|prefix| format!("{prefix}attempt"))
        .ok_or_else(|| {
            Error::Input(format!(
                "fence function {fence:?} does not end in `fence`: cannot name its attempt function"
            ))
        })
}

/// `name` if it is a plain SQL identifier (letters, digits, `_`, `$`; not starting with a digit).
fn fence_function(name: &str) -> Result<String> {
    let ok = name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '$');
    if ok {
        Ok(name.to_string())
    } else {
        Err(Error::Input(format!(
            "fence function {name:?} is not a lower-case SQL identifier"
        )))
    }
}

/// How the connection is protected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Plain,
    /// TLS, the certificate verified against the CA and the host name.
    Verified,
}

/// The URL without its `sslmode` parameter (tokio-postgres knows only disable, prefer and
/// require, and verifies nothing itself), and what that parameter asked for.
fn split_sslmode(url: &str) -> Result<(String, Transport)> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), Transport::Verified));
    };
    let mut transport = Transport::Verified;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("sslmode", "disable")) => transport = Transport::Plain,
            Some(("sslmode", "prefer" | "require" | "verify-ca" | "verify-full")) => {
                transport = Transport::Verified;
            }
            Some(("sslmode", other)) => {
                return Err(Error::Input(format!(
                    "DATABASE_URL: unknown sslmode {other:?}"
                )));
            }
            _ => kept.push(pair),
        }
    }
    let url = match kept.is_empty() {
        true => base.to_string(),
        false => format!("{base}?{}", kept.join("&")),
    };
    Ok((url, transport))
}

/// Connects; the connection's task runs until the client is dropped.
pub async fn connect(url: &str, root_cert: Option<&Path>) -> Result<Client> {
    let (url, transport) = split_sslmode(url)?;
    let mut config: tokio_postgres::Config = url
        .parse()
        .map_err(|e| Error::Input(format!("DATABASE_URL: {e}")))?;
    let client = match transport {
        Transport::Plain => {
            let (client, conn) = config.connect(NoTls).await?;
            tokio::spawn(conn);
            client
        }
        Transport::Verified => {
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
            let tls = tokio_postgres_rustls::MakeRustlsConnect::new(tls_config(root_cert)?);
            let (client, conn) = config.connect(tls).await?;
            tokio::spawn(conn);
            client
        }
    };
    Ok(client)
}

fn tls_config(root_cert: Option<&Path>) -> Result<rustls::ClientConfig> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let certs: Vec<CertificateDer<'static>> = match root_cert {
        Some(path) => CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect())
            .map_err(|e| Error::Input(format!("sslrootcert {}: {e}", path.display())))?,
        None => rustls_native_certs::load_native_certs().certs,
    };
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(Error::Input(
            "no CA certificate to verify the database with: set PGSSLROOTCERT, or sslmode=disable"
                .into(),
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Input(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_is_taken_out_of_the_url_and_judged() {
        let (url, t) = split_sslmode("postgres://u@h:5/db?sslmode=disable").unwrap();
        assert_eq!((url.as_str(), t), ("postgres://u@h:5/db", Transport::Plain));
        let (url, t) =
            split_sslmode("postgres://u@h/db?application_name=x&sslmode=verify-full").unwrap();
        assert_eq!(
            (url.as_str(), t),
            ("postgres://u@h/db?application_name=x", Transport::Verified)
        );
        // No sslmode: verified, as the controller's default.
        assert_eq!(
            split_sslmode("postgres://u@h/db").unwrap().1,
            Transport::Verified
        );
        // "require" does not mean "encrypt but trust anyone" here.
        assert_eq!(
            split_sslmode("postgres://u@h/db?sslmode=require")
                .unwrap()
                .1,
            Transport::Verified
        );
        assert!(matches!(
            split_sslmode("postgres://u@h/db?sslmode=allow-anything"),
            Err(Error::Input(_))
        ));
    }

    #[test]
    fn only_a_plain_identifier_names_the_fence_function() {
        assert!(fence_function("singleton_fence").is_ok());
        assert!(fence_function("t_ab12_fence").is_ok());
        for bad in [
            "",
            "1x",
            "fence; DROP TABLE x",
            "Fence",
            "a.b",
            "f()",
            &"x".repeat(64),
        ] {
            assert!(matches!(fence_function(bad), Err(Error::Input(_))), "{bad}");
        }
    }

    #[test]
    fn exit_codes_say_whether_to_retry() {
        assert_eq!(Error::Input(String::new()).exit_code(), 2);
        let refused = Error::Refused {
            sqlstate: "SF001".into(),
            message: String::new(),
        };
        assert_eq!(refused.exit_code(), 3);
        assert_eq!(Error::Database(String::new()).exit_code(), 1);
    }
}
