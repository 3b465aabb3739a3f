//! The target-database backstop (DESIGN.md layers 4 and 5; G1, G3, G5): PostgreSQL remembers
//! every claimed (job, period) under a unique constraint and the highest fencing token per job,
//! and gives workloads `singleton_fence(job, token)` to reject a stale run inside their own
//! transaction. See docs/fencing.md for the workload side.
//!
//! How the run path uses it (for a SingletonJob with `spec.backstop`):
//!
//! ```text
//! token = max(status.fencingToken, backstop.fence(job)) + 1   // G3: survives re-creation
//! claim the period in status with that token                   // layer 2, as before
//! backstop.claim(job, period, token, job_name, None)?          // layer 4, before the Job exists
//!     Claimed                     -> create the Job
//!     Duplicate{token: same, ..}  -> our own earlier claim (retry after a crash): create the Job
//!     Duplicate{..}               -> the period already ran: record Deduplicated, create nothing
//! Replace: backstop.advance_fence(job, token) before deleting the old Job            // G5
//! Rerun: backstop.claim(.., takes_over: Some(old)) moves the period's row from the
//!     earlier run's token to the new one, in the same transaction as the fence advance
//!     (one row per period; the earlier token is below the fence from then on)
//! ```
//!
//! Connections: one client per SingletonJob target ([`Backstop`]), opened lazily, replaced when
//! it breaks. The controller issues a handful of short statements per period, so a pool would
//! only add idle connections to the user's database (whose connection limit is usually small) and
//! a dependency; a per-target client also keeps one slow database from touching any other.
//! Every operation, connecting included, is bounded by the operation timeout, and the server is
//! told the same `statement_timeout`, so an abandoned statement does not run on.

mod allow;
mod attempts;
mod config;
mod error;
mod guard;
pub mod health;
pub mod multi;
mod outcomes;
pub mod owner;
mod schema;
pub mod share;
#[cfg(test)]
mod tests;
mod tls;

use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use sha2::{Digest, Sha256};
use tokio::sync::{Mutex, MutexGuard};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

pub use allow::{AllowedHosts, Dial, NOT_ALLOWED};
pub use attempts::{AttemptRow, Ended, Holder};
pub use config::{
    ConnectionConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_OPERATION_TIMEOUT, SecretKeys, SslMode,
    TablePrefix,
};
pub use schema::{
    ATTEMPT_SQLSTATE, NEVER_ISSUED_SQLSTATE, NOT_PERMITTED_SQLSTATE, SCHEMA_VERSION,
    STALE_TOKEN_SQLSTATE,
};

pub use multi::Claimer;
use schema::Tables;

/// The label a Secret must carry (value `"true"`) before the controller reads it as a backstop
/// connection: whoever may create SingletonJobs must not be able to point the controller at any
/// Secret of the namespace.
pub const SECRET_OPT_IN_LABEL: &str = "singleton.dev/backstop";

/// A SingletonJob's backstop as a reconcile found it.
#[derive(Clone, Debug)]
pub enum Availability {
    /// The SingletonJob has no backstop.
    NotConfigured,
    /// Reachable, schema in place.
    Ready(Arc<Backstop>),
    /// Configured but unusable now; the reason names no secret value.
    Unavailable(String),
}

impl Availability {
    /// The backstop, if it is ready.
    pub fn ready(&self) -> Option<&Backstop> {
        match self {
            Availability::Ready(b) => Some(b),
            _ => None,
        }
    }
}

/// The result of [`Backstop::claim`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The claim row was inserted and the fence advanced to the token.
    Claimed,
    /// The period was claimed before; nothing changed. These are the existing row's token and
    /// Job name: when they equal the caller's, it is the caller's own earlier claim (a retry).
    Duplicate { token: u64, job_name: String },
    /// Another cluster claimed the period (its identity, token and Job name), and the claim may
    /// not be taken over: it ran or runs there. Nothing changed.
    ClaimedElsewhere {
        cluster: String,
        token: u64,
        job_name: String,
    },
    /// Another cluster's claim, unconfirmed past the takeover bound, now names this claim, and
    /// the fence is raised to its token: the other claimer's confirm and writes are refused.
    TookOver { cluster: String, token: u64 },
    /// Not this cluster's turn yet, by the database's clock: a standby before its delay, or
    /// another cluster's unconfirmed claim within the takeover bound. Ask again from `until`.
    NotYet { until: Timestamp },
    /// A scheduled claim of a period older than one another cluster has claimed already (its
    /// period, identity and token): refused so that tokens follow the periods across clusters.
    /// Nothing changed.
    Superseded {
        period: Timestamp,
        cluster: String,
        token: u64,
    },
    /// The job key belongs to another namespace in this backstop ([`owner`]): the namespace
    /// recorded by its first claim. Nothing changed.
    NotOwner { owner: String },
}

impl ClaimOutcome {
    /// The variant's name, for metric labels.
    pub fn kind(&self) -> &'static str {
        match self {
            ClaimOutcome::Claimed => "Claimed",
            ClaimOutcome::Duplicate { .. } => "Duplicate",
            ClaimOutcome::ClaimedElsewhere { .. } => "ClaimedElsewhere",
            ClaimOutcome::TookOver { .. } => "TookOver",
            ClaimOutcome::NotYet { .. } => "NotYet",
            ClaimOutcome::Superseded { .. } => "Superseded",
            ClaimOutcome::NotOwner { .. } => "NotOwner",
        }
    }

    /// Whether the run may go ahead with `token`: a fresh claim, or our own earlier one.
    pub fn is_ours(&self, token: u64) -> bool {
        match self {
            ClaimOutcome::Claimed | ClaimOutcome::TookOver { .. } => true,
            ClaimOutcome::Duplicate { token: t, .. } => *t == token,
            ClaimOutcome::ClaimedElsewhere { .. }
            | ClaimOutcome::NotYet { .. }
            | ClaimOutcome::Superseded { .. }
            | ClaimOutcome::NotOwner { .. } => false,
        }
    }
}

/// One row of the claims table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRow {
    pub job: String,
    pub period: Timestamp,
    pub token: u64,
    pub job_name: String,
    pub claimed_at: Timestamp,
    /// The claiming cluster's identity (empty: none).
    pub cluster: String,
    /// When the claimer confirmed it was starting the Job (database time).
    pub confirmed_at: Option<Timestamp>,
}

/// A connection to one backstop database, with its schema ensured on first use.
pub struct Backstop {
    config: ConnectionConfig,
    prefix: TablePrefix,
    tls: Option<rustls::ClientConfig>,
    /// The hosts it may dial (`--backstop-allowed-hosts`), checked before every connection.
    allowed: Arc<AllowedHosts>,
    /// Where its operations' durations go, and the namespace they count against ([`share`]).
    meter: Option<(Arc<share::Share>, String)>,
    slot: Mutex<Slot>,
}

impl std::fmt::Debug for Backstop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backstop")
            .field("config", &self.config)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The connection state, used by one operation at a time.
#[derive(Default)]
struct Slot {
    client: Option<Client>,
    /// False while an operation runs. Still false at the next operation means the last one was
    /// cancelled by its timeout mid-flight: the client may be mid-transaction, so it is dropped.
    clean: bool,
    tables: Option<Tables>,
    version: i32,
}

impl Backstop {
    /// No I/O: the connection opens on first use. Fails only on a TLS set-up problem (such as
    /// `verify-full` without `sslrootcert` on a host with no system CA certificates).
    pub fn new(config: ConnectionConfig, prefix: TablePrefix) -> Result<Self> {
        let tls = tls::client_config(config.sslmode, &config.root_certs)?;
        Ok(Backstop {
            config,
            prefix,
            tls,
            allowed: Arc::default(),
            meter: None,
            slot: Mutex::new(Slot::default()),
        })
    }

    /// Limits the hosts this backstop may dial (see [`AllowedHosts`]).
    pub fn with_allowed_hosts(mut self, allowed: Arc<AllowedHosts>) -> Self {
        self.allowed = allowed;
        self
    }

    /// Times its operations against `namespace`'s share of database time ([`share`]).
    pub fn with_meter(mut self, share: Arc<share::Share>, namespace: &str) -> Self {
        self.meter = Some((share, namespace.to_string()));
        self
    }

    pub fn config(&self) -> &ConnectionConfig {
        &self.config
    }

    pub fn prefix(&self) -> &TablePrefix {
        &self.prefix
    }

    /// Names the database and tables the claims go to (host, port, database, prefix), as a hash:
    /// status may say "the same target as before" without showing the connection's values.
    pub fn target_id(&self) -> String {
        let c = &self.config;
        let db = c.dbname.as_ref().map(|d| d.0.as_str()).unwrap_or_default();
        let text = format!("{}:{}/{db}/{}", c.host.0, c.port, self.prefix);
        format!("sha256:{}", crate::naming::short_hash(&text, 16))
    }

    /// Connects if needed and creates or upgrades the schema; returns the schema version.
    pub async fn ensure_schema(&self) -> Result<i32> {
        self.bounded("ensure schema", async {
            let mut slot = self.session().await?;
            let v = slot.version;
            slot.clean = true;
            Ok(v)
        })
        .await
    }

    /// Health probe: the database answers and the schema is in place (for `BackstopReady`).
    pub async fn ping(&self) -> Result<()> {
        self.bounded("ping", async {
            let mut slot = self.session().await?;
            let r = slot
                .client()?
                .simple_query("SELECT 1")
                .await
                .map(|_| ())
                .map_err(|e| Error::from_pg(e, false));
            slot.settle(r)
        })
        .await
    }

    /// The highest fencing token stored for `job` (0 if none).
    pub async fn fence(&self, job: &str) -> Result<u64> {
        self.fence_column(job, "token", "read fence").await
    }

    /// Claims `period` for `job` with `token`, in one transaction: inserts the claim row and
    /// advances the fence to `token`. A period claimed before gives
    /// [`ClaimOutcome::Duplicate`] and changes nothing. `token` must be above the stored fence
    /// (take `max(status.fencingToken, fence(job)) + 1`), else [`Error::StaleToken`].
    /// `period` is stored at microsecond precision.
    ///
    /// `takes_over` (a rerun, `kubectl singleton rerun`): the token of the period's existing
    /// row, which this claim takes over by compare-and-swap: the row (still the one row of the
    /// period) then names `token` and `job_name`, in the same transaction as the fence advance,
    /// so the earlier token is refused from then on. A row holding any other token is left alone
    /// ([`ClaimOutcome::Duplicate`]); a period with no row is claimed as usual.
    pub async fn claim(
        &self,
        job: &str,
        period: Timestamp,
        token: u64,
        job_name: &str,
        takes_over: Option<u64>,
    ) -> Result<ClaimOutcome> {
        self.claim_as(
            job,
            period,
            token,
            job_name,
            takes_over,
            &Claimer::default(),
        )
        .await
    }

    /// [`Self::claim`] by `claimer`, a cluster sharing this database with others
    /// (docs/multi-cluster.md): the row records its identity; another cluster's row is
    /// [`ClaimOutcome::ClaimedElsewhere`], or, unconfirmed past `claimer.takeover_after` by the
    /// database's clock, [`ClaimOutcome::TookOver`]; a standby's claim before its delay (again by
    /// the database's clock) is [`ClaimOutcome::NotYet`]; a scheduled claim of a period older
    /// than one another cluster claimed is [`ClaimOutcome::Superseded`]. All in the one claim
    /// transaction.
    pub async fn claim_as(
        &self,
        job: &str,
        period: Timestamp,
        token: u64,
        job_name: &str,
        takes_over: Option<u64>,
        claimer: &Claimer,
    ) -> Result<ClaimOutcome> {
        let token_i = to_i64(token)?;
        if token == 0 {
            return Err(Error::Backstop("a claim's token must be at least 1".into()));
        }
        let takes_over = takes_over.map(to_i64).transpose()?;
        let claim = Claim {
            job,
            period,
            token: token_i,
            job_name,
            takes_over,
            claimer,
        };
        self.bounded("claim", async {
            let mut slot = self.session().await?;
            let t = slot.tables()?.clone();
            let r = claim_tx(slot.client_mut()?, &t, &claim).await;
            slot.settle(r)
        })
        .await
    }

    /// Confirms the claim of (`job`, `period`) with `token` before its Job is created: a
    /// conditional update that fails (`false`) when the row no longer carries `token` (another
    /// cluster took it over; the row must name `cluster` too, as two clusters may choose the same
    /// token). A confirmed claim is never taken over. Idempotent.
    pub async fn confirm(
        &self,
        job: &str,
        period: Timestamp,
        token: u64,
        cluster: &str,
    ) -> Result<bool> {
        let token_i = to_i64(token)?;
        self.bounded("confirm claim", async {
            let mut slot = self.session().await?;
            let sql = format!(
                "UPDATE {} SET confirmed_at = coalesce(confirmed_at, now()) \
                 WHERE job = $1 AND period = $2 AND token = $3 AND cluster = $4 RETURNING 1",
                slot.tables()?.claims
            );
            let r = slot
                .client()?
                .query_opt(&sql, &[&job, &period, &token_i, &cluster])
                .await
                .map(|row| row.is_some())
                .map_err(|e| Error::from_pg(e, false));
            slot.settle(r)
        })
        .await
    }

    /// The claim of (`job`, `period`), if any: whether that period has run.
    pub async fn claimed(&self, job: &str, period: Timestamp) -> Result<Option<ClaimRow>> {
        self.bounded("read claim", async {
            let mut slot = self.session().await?;
            let sql = format!(
                "SELECT token, job_name, claimed_at, cluster, confirmed_at FROM {} WHERE job = $1 AND period = $2",
                slot.tables()?.claims
            );
            let r = match slot.client()?.query_opt(&sql, &[&job, &period]).await {
                Err(e) => Err(Error::from_pg(e, false)),
                Ok(None) => Ok(None),
                Ok(Some(row)) => to_u64(row.get(0)).map(|token| {
                    Some(ClaimRow {
                        job: job.to_string(),
                        period,
                        token,
                        job_name: row.get(1),
                        claimed_at: row.get(2),
                        cluster: row.get(3),
                        confirmed_at: row.get(4),
                    })
                }),
            };
            slot.settle(r)
        })
        .await
    }

    /// Raises the fence of `job` to `token` if it is lower (never lowers it); returns the fence
    /// now stored. For `Replace` and breaking a stuck lock: after it returns, a workload holding
    /// an older token is refused by `singleton_fence`. Waits for a workload transaction that
    /// holds the fence row, at most the lock timeout (then `Unavailable`: retry).
    pub async fn advance_fence(&self, job: &str, token: u64) -> Result<u64> {
        let token_i = to_i64(token)?;
        self.bounded("advance fence", async {
            let mut slot = self.session().await?;
            let t = slot.tables()?.clone();
            let client = slot.client()?;
            let r = async {
                let pg = |e| Error::from_pg(e, false);
                let advanced = client
                    .query_opt(&upsert_fence_sql(&t), &[&job, &token_i])
                    .await
                    .map_err(pg)?;
                match advanced {
                    Some(_) => Ok(token),
                    None => {
                        let row = client
                            .query_one(
                                &format!("SELECT token FROM {} WHERE job = $1", t.fences),
                                &[&job],
                            )
                            .await
                            .map_err(pg)?;
                        to_u64(row.get(0))
                    }
                }
            }
            .await;
            slot.settle(r)
        })
        .await
    }

    /// Retires `token` of `job`: its period is decided, so from now on `singleton_fence` refuses
    /// it (and every lower token) even while it equals the stored fence. Idempotent. Takes the
    /// fence row's lock only when there is something to change, so an open transaction of a
    /// newer run (Allow) does not hold up the retirement of an older token, which the fence
    /// refuses already.
    ///
    /// For a SingletonJob of `namespace` (empty: not checked): refused ([`Error::NotOwner`]) when
    /// the job key belongs to another namespace ([`owner`]), so that a SingletonJob naming another
    /// tenant's key cannot fence out that tenant's run by retiring its token (a break-lock).
    pub async fn retire(&self, job: &str, token: u64, namespace: &str) -> Result<()> {
        let token_i = to_i64(token)?;
        self.bounded("retire token", async {
            let mut slot = self.session().await?;
            let t = slot.tables()?.clone();
            let client = slot.client()?;
            let r = async {
                let pg = |e| Error::from_pg(e, false);
                let row = client
                    .query_opt(
                        &format!(
                            "SELECT token, retired, namespace FROM {} WHERE job = $1",
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
                // The owner is checked again under the row's lock (its WHERE).
                let changed = client
                    .execute(
                        &retire_sql(&t),
                        &[&job, &token_i, &owner::recorded(namespace)],
                    )
                    .await
                    .map_err(pg)?;
                if changed == 0 {
                    return Err(owner::not_owner(job));
                }
                Ok(())
            }
            .await;
            slot.settle(r)
        })
        .await
    }

    /// The highest retired token of `job` (0 if none).
    pub async fn retired(&self, job: &str) -> Result<u64> {
        self.fence_column(job, "retired", "read retired").await
    }

    /// One column of `job`'s fence row (0 if there is none), measured as `what`; `column` is a
    /// constant of ours.
    async fn fence_column(&self, job: &str, column: &'static str, what: &str) -> Result<u64> {
        self.bounded(what, async {
            let mut slot = self.session().await?;
            let sql = format!(
                "SELECT {column} FROM {} WHERE job = $1",
                slot.tables()?.fences
            );
            let r = slot
                .client()?
                .query_opt(&sql, &[&job])
                .await
                .map_err(|e| Error::from_pg(e, false))
                .and_then(|row| row.map_or(Ok(0), |row| to_u64(row.get(0))));
            slot.settle(r)
        })
        .await
    }

    /// How many stale tokens `singleton_fence` has refused, ever, in this database and prefix.
    pub async fn rejections(&self) -> Result<u64> {
        self.bounded("read rejections", async {
            let mut slot = self.session().await?;
            let sql = format!(
                "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {}",
                slot.tables()?.rejections
            );
            let r = match slot.client()?.query_one(&sql, &[]).await {
                Ok(row) => to_u64(row.get(0)),
                Err(e) => Err(Error::from_pg(e, false)),
            };
            slot.settle(r)
        })
        .await
    }

    /// Runs `op` within the operation timeout, and scrubs the Secret's values from any error.
    async fn bounded<T>(&self, what: &str, op: impl Future<Output = Result<T>>) -> Result<T> {
        let limit = self.config.operation_timeout;
        let started = std::time::Instant::now();
        let timed = self
            .meter
            .as_ref()
            .map(|(share, ns)| share.op(ns, tokio::time::Instant::now()));
        let r = match tokio::time::timeout(limit, op).await {
            Ok(r) => r.map_err(|e| self.scrub(e)),
            Err(_) => Err(Error::backstop_timeout(what, limit)),
        };
        if let Some(t) = timed {
            t.done(tokio::time::Instant::now());
        }
        crate::metrics::global().backstop_op(what, started.elapsed(), r.as_ref().err());
        r
    }

    /// Defence in depth: no message is built from Secret values, but a server or TLS library
    /// may quote them (a host name in a certificate error), so they are cut out here too.
    fn scrub(&self, err: Error) -> Error {
        let c = &self.config;
        // User and database names are only quoted by the server at startup, and those messages
        // are replaced whole (`from_pg`); scrubbing them here too would mangle ordinary words
        // (a database named `singleton`).
        let secrets: Vec<&str> = [Some(&c.host), c.password.as_ref()]
            .into_iter()
            .flatten()
            .map(|r| r.0.as_str())
            .filter(|s| s.len() >= 3)
            .collect();
        let clean = |m: String| secrets.iter().fold(m, |m, s| m.replace(s, "<redacted>"));
        match err {
            Error::BackstopUnavailable(m) => Error::BackstopUnavailable(clean(m)),
            Error::BackstopConfig(m) => Error::BackstopConfig(clean(m)),
            Error::Backstop(m) => Error::Backstop(clean(m)),
            other => other,
        }
    }

    /// Locks the slot, (re)connects and ensures the schema. The caller must `settle` (or set
    /// `clean`) when done.
    async fn session(&self) -> Result<MutexGuard<'_, Slot>> {
        let mut slot = self.slot.lock().await;
        if !slot.clean || slot.client.as_ref().is_some_and(Client::is_closed) {
            slot.client = None;
        }
        slot.clean = false;
        if slot.client.is_none() {
            slot.client = Some(self.connect().await?);
        }
        if slot.tables.is_none() {
            let (version, tables) = schema::migrate(slot.client_mut()?, &self.prefix).await?;
            slot.version = version;
            slot.tables = Some(tables);
        }
        Ok(slot)
    }

    async fn connect(&self) -> Result<Client> {
        let c = &self.config;
        // Before any connection: a host outside the allow-list is refused untried, and a name
        // the list judged by its addresses is dialled at the address checked (no second lookup).
        let dial = self.allowed.check(&c.host.0, c.hostaddr, c.port).await?;
        let mut pg = tokio_postgres::Config::new();
        pg.host(&c.host.0)
            .port(c.port)
            .user(&c.user.0)
            .application_name(&c.application_name)
            .ssl_mode(match c.sslmode {
                SslMode::Disable => tokio_postgres::config::SslMode::Disable,
                SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
                SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                    tokio_postgres::config::SslMode::Require
                }
            });
        if let Some(db) = &c.dbname {
            pg.dbname(&db.0);
        }
        if let Some(pw) = &c.password {
            pg.password(&pw.0);
        }
        // Our own socket, so the password guard (guard.rs) sees the server's bytes first.
        let address = match dial {
            Dial::Address(addr) => Some(addr),
            Dial::AsConfigured => c.hostaddr,
        };
        let tcp = self.open_socket(address).await?;
        let refused = guard::Refused::default();
        let stream = guard::AuthGuard::new(tcp, c.sslmode != SslMode::Disable, refused.clone());
        let connecting = |e| match refused.load(Ordering::Relaxed) {
            guard::NOT_POSTGRES => Error::BackstopUnavailable(guard::NOT_POSTGRES_MESSAGE.into()),
            code => match guard::refusal_message(code) {
                Some(why) => Error::BackstopConfig(why),
                None => Error::from_pg(e, true),
            },
        };
        let client = match &self.tls {
            None => {
                let (client, conn) = pg.connect_raw(stream, NoTls).await.map_err(connecting)?;
                tokio::spawn(drive(conn));
                client
            }
            Some(tls) => {
                let mut make = MakeRustlsConnect::new(tls.clone());
                let inner =
                    MakeTlsConnect::<guard::AuthGuard<tokio::net::TcpStream>>::make_tls_connect(
                        &mut make, &c.host.0,
                    )
                    .map_err(|_| {
                        Error::BackstopConfig("the host is not a valid TLS server name".into())
                    })?;
                let tls = guard::GuardedTls {
                    inner,
                    refused: (!c.sslmode.verifies_server()).then(|| refused.clone()),
                };
                let (client, conn) = pg.connect_raw(stream, tls).await.map_err(connecting)?;
                tokio::spawn(drive(conn));
                client
            }
        };
        // Server-side bounds for this session: a statement the client gave up on stops soon
        // after, and a lock wait (a workload holding the fence row) ends before the operation
        // timeout so it surfaces as that, not as a bare timeout.
        let ms = c.operation_timeout.as_millis().max(1);
        client
            .batch_execute(&format!(
                "SET statement_timeout = {ms}; SET lock_timeout = {}; SET idle_in_transaction_session_timeout = {}",
                (ms / 2).max(1),
                ms * 2
            ))
            .await
            .map_err(|e| Error::from_pg(e, false))?;
        Ok(client)
    }

    /// The TCP connection (to `address` when given: `hostaddr`, or the address the allow-list
    /// checked; else to each address of the host in turn), within the connect timeout, with
    /// keepalives so a dead peer is noticed.
    async fn open_socket(&self, address: Option<IpAddr>) -> Result<tokio::net::TcpStream> {
        let c = &self.config;
        let limit = c.connect_timeout;
        let connecting = async {
            match address {
                Some(addr) => tokio::net::TcpStream::connect((addr, c.port)).await,
                None => tokio::net::TcpStream::connect((c.host.0.as_str(), c.port)).await,
            }
        };
        let tcp = tokio::time::timeout(limit, connecting)
            .await
            .map_err(|_| Error::backstop_timeout("connect", limit))?
            // The io error names neither the host nor the address.
            .map_err(|e| Error::BackstopUnavailable(format!("error connecting to server: {e}")))?;
        let keepalive = socket2::TcpKeepalive::new().with_time(std::time::Duration::from_secs(30));
        // Best effort, as in the driver: a socket without them still works.
        let sock = socket2::SockRef::from(&tcp);
        let _ = sock.set_tcp_keepalive(&keepalive);
        let _ = tcp.set_nodelay(true);
        Ok(tcp)
    }
}

impl Slot {
    fn client(&self) -> Result<&Client> {
        self.client
            .as_ref()
            .ok_or_else(|| Error::BackstopUnavailable("not connected".into()))
    }

    fn client_mut(&mut self) -> Result<&mut Client> {
        self.client
            .as_mut()
            .ok_or_else(|| Error::BackstopUnavailable("not connected".into()))
    }

    fn tables(&self) -> Result<&Tables> {
        self.tables
            .as_ref()
            .ok_or_else(|| Error::Backstop("schema not ensured".into()))
    }

    /// Records how an operation ended: a connection problem drops the client; an unexpected SQL
    /// error (say, someone dropped a table) re-runs the migration next time.
    fn settle<T>(&mut self, r: Result<T>) -> Result<T> {
        match &r {
            Err(Error::BackstopUnavailable(_)) => self.client = None,
            Err(Error::Backstop(_)) => self.tables = None,
            _ => {}
        }
        self.clean = true;
        r
    }
}

async fn drive<S, T>(conn: tokio_postgres::Connection<S, T>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if let Err(e) = conn.await {
        // The driver's own texts name neither the host nor the credentials.
        tracing::debug!(error = %e, "backstop connection closed");
    }
}

fn upsert_fence_sql(t: &Tables) -> String {
    format!(
        "INSERT INTO {} AS f (job, token) VALUES ($1, $2) \
         ON CONFLICT ON CONSTRAINT {}fences_pkey \
         DO UPDATE SET token = EXCLUDED.token WHERE f.token < EXCLUDED.token \
         RETURNING f.token",
        t.fences, t.prefix
    )
}

/// The claim's fence advance ([`upsert_fence_sql`]) that also records the job key's owner
/// (`$3`, NULL for none) where none is recorded, and returns the owner now stored.
fn claim_fence_sql(t: &Tables) -> String {
    format!(
        "INSERT INTO {} AS f (job, token, namespace) VALUES ($1, $2, $3) \
         ON CONFLICT ON CONSTRAINT {}fences_pkey \
         DO UPDATE SET token = EXCLUDED.token, namespace = coalesce(f.namespace, EXCLUDED.namespace) \
         WHERE f.token < EXCLUDED.token \
         RETURNING f.token, f.namespace",
        t.fences, t.prefix
    )
}

/// The job key's recorded owner, unlocked: the claim transaction's early answer, so that a claim
/// from another namespace learns nothing of the key's claims (the check under the row's lock at
/// the fence advance decides).
async fn recorded_owner(
    tx: &tokio_postgres::Transaction<'_>,
    t: &Tables,
    job: &str,
) -> Result<Option<String>> {
    let row = tx
        .query_opt(
            &format!("SELECT namespace FROM {} WHERE job = $1", t.fences),
            &[&job],
        )
        .await
        .map_err(|e| Error::from_pg(e, false))?;
    Ok(row.and_then(|r| r.get(0)))
}

/// Retires the token `$2` of job `$1` (and raises the fence to it if it is lower): never lowers
/// either. Changes nothing (no row) when the job key belongs to a namespace other than `$3`.
fn retire_sql(t: &Tables) -> String {
    format!(
        "INSERT INTO {} AS f (job, token, retired, namespace) VALUES ($1, $2, $2, $3) \
         ON CONFLICT ON CONSTRAINT {}fences_pkey DO UPDATE \
         SET token = greatest(f.token, EXCLUDED.token), \
             retired = greatest(f.retired, EXCLUDED.retired), \
             namespace = coalesce(f.namespace, EXCLUDED.namespace) \
         WHERE EXCLUDED.namespace IS NULL OR f.namespace IS NULL \
            OR f.namespace IN (EXCLUDED.namespace, '{}')",
        t.fences,
        t.prefix,
        owner::SHARED
    )
}

/// One claim, as [`Backstop::claim_as`] takes it.
struct Claim<'a> {
    job: &'a str,
    period: Timestamp,
    token: i64,
    job_name: &'a str,
    takes_over: Option<i64>,
    claimer: &'a Claimer,
}

async fn claim_tx(client: &mut Client, t: &Tables, c: &Claim<'_>) -> Result<ClaimOutcome> {
    let Claim {
        job,
        period,
        token,
        job_name,
        takes_over,
        claimer,
    } = *c;
    let cluster = claimer.cluster.as_str();
    let namespace = claimer.namespace.as_str();
    let pg = |e| Error::from_pg(e, false);
    // Dropping the transaction without commit rolls it back (also on an early `?`).
    let tx = client.transaction().await.map_err(pg)?;
    // N4: a job key belongs to the namespace of its first claim; another namespace's claim is
    // refused before it reads or writes anything of the key's claims.
    if let Some(owner) = recorded_owner(&tx, t, job).await?
        && owner::refuses(Some(owner.as_str()), namespace)
    {
        tx.rollback().await.map_err(pg)?;
        return Ok(ClaimOutcome::NotOwner { owner });
    }
    // Across clusters a scheduled period is due by the database's clock, the one all clusters
    // share (F7: a cluster whose controller and API server agree but run ahead together must not
    // claim, and so win, early); and a standby's turn comes by it too.
    let shared = claimer.scheduled && !cluster.is_empty();
    if (shared || claimer.standby_delay.is_some()) && takes_over.is_none() {
        let db_now: Timestamp = tx.query_one("SELECT now()", &[]).await.map_err(pg)?.get(0);
        let until = match multi::standby_until(claimer, period, db_now) {
            Some(until) => Some(until),
            None => (shared && db_now < period).then_some(period),
        };
        if let Some(until) = until {
            tx.rollback().await.map_err(pg)?;
            return Ok(ClaimOutcome::NotYet { until });
        }
    }
    // The unique constraint decides between racing claimers: the loser waits for the winner's
    // insert to commit, then takes the DO NOTHING branch. A rerun takes the period's row over
    // instead, only from the token it expects (compare-and-swap): the row stays the one claim of
    // the period, and a row that moved meanwhile is left alone (Duplicate).
    let sql = match takes_over {
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
    let old = takes_over.unwrap_or_default();
    let params: &[&(dyn tokio_postgres::types::ToSql + Sync)] = match takes_over {
        None => &[&job, &period, &token, &job_name, &cluster],
        Some(_) => &[&job, &period, &token, &job_name, &cluster, &old],
    };
    let inserted = tx.query_opt(&sql, params).await.map_err(pg)?;
    let mut outcome = ClaimOutcome::Claimed;
    if inserted.is_none() {
        // A new statement in READ COMMITTED sees the winner's committed row; locked, so a
        // confirm and a takeover of it are serialised with this transaction.
        let row = tx
            .query_opt(
                &format!(
                    "SELECT token, job_name, cluster, claimed_at, confirmed_at IS NOT NULL, now() \
                     FROM {} WHERE job = $1 AND period = $2 FOR UPDATE",
                    t.claims
                ),
                &[&job, &period],
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
        let verdict = match takes_over {
            Some(_) => multi::Verdict::Duplicate,
            None => multi::judge(&existing, claimer, token.unsigned_abs(), db_now),
        };
        match verdict {
            multi::Verdict::Ours | multi::Verdict::Duplicate => {
                tx.rollback().await.map_err(pg)?;
                return Ok(ClaimOutcome::Duplicate {
                    token: existing.token,
                    job_name: job_name_there,
                });
            }
            multi::Verdict::WaitUntil(until) => {
                tx.rollback().await.map_err(pg)?;
                return Ok(ClaimOutcome::NotYet { until });
            }
            multi::Verdict::Elsewhere => {
                tx.rollback().await.map_err(pg)?;
                return Ok(ClaimOutcome::ClaimedElsewhere {
                    cluster: existing.cluster,
                    token: existing.token,
                    job_name: job_name_there,
                });
            }
            multi::Verdict::TakeOver => {
                // The row is locked: this compare-and-swap cannot miss. The fence advance below,
                // in the same transaction, refuses the earlier claimer's token from the commit on.
                let moved = tx
                    .execute(
                        &format!(
                            "UPDATE {} SET token = $3, job_name = $4, cluster = $5, \
                             claimed_at = now(), confirmed_at = NULL \
                             WHERE job = $1 AND period = $2 AND token = $6",
                            t.claims
                        ),
                        &[
                            &job,
                            &period,
                            &token,
                            &job_name,
                            &cluster,
                            &to_i64(existing.token)?,
                        ],
                    )
                    .await
                    .map_err(pg)?;
                if moved != 1 {
                    return Err(Error::Backstop(
                        "a locked claim row moved during its takeover".into(),
                    ));
                }
                outcome = ClaimOutcome::TookOver {
                    cluster: existing.cluster,
                    token: existing.token,
                };
            }
        }
    }
    // Only upward, and strictly: an equal token would mean two runs share it. The owner is
    // recorded by the first claim and checked again under the row's lock: two namespaces that
    // both found none recorded are serialised here, and the second is refused.
    let advanced = tx
        .query_opt(
            &claim_fence_sql(t),
            &[&job, &token, &owner::recorded(namespace)],
        )
        .await
        .map_err(pg)?;
    let (current, owner): (Option<i64>, Option<String>) = match advanced {
        Some(row) => (None, row.get(1)),
        None => {
            let row = tx
                .query_one(
                    &format!("SELECT token, namespace FROM {} WHERE job = $1", t.fences),
                    &[&job],
                )
                .await
                .map_err(pg)?;
            (Some(row.get(0)), row.get(1))
        }
    };
    if owner::refuses(owner.as_deref(), namespace) {
        tx.rollback().await.map_err(pg)?;
        return Ok(ClaimOutcome::NotOwner {
            owner: owner.unwrap_or_default(),
        });
    }
    if let Some(current) = current {
        tx.rollback().await.map_err(pg)?;
        return Err(Error::StaleToken {
            job: job.to_string(),
            token: token.unsigned_abs(),
            current: to_u64(current)?,
        });
    }
    // Tokens follow the periods across clusters. The fence advance above holds the fence row's
    // lock, which every claim of the job takes: a later period's claim that committed before it
    // is visible to this statement, and one that commits after this gets a higher token.
    if claimer.scheduled
        && !cluster.is_empty()
        && takes_over.is_none()
        && let Some(later) = later_elsewhere(&tx, t, c).await?
    {
        tx.rollback().await.map_err(pg)?;
        return Ok(later);
    }
    tx.commit().await.map_err(pg)?;
    Ok(outcome)
}

/// The latest claim of another cluster for a scheduled period after `c.period`, as
/// [`ClaimOutcome::Superseded`]. Manual runs (a trigger's period is never on a whole second,
/// [`crate::naming::manual_period`]) are outside the schedule's order: a trigger in one cluster
/// supersedes no scheduled period of another (F14).
async fn later_elsewhere(
    tx: &tokio_postgres::Transaction<'_>,
    t: &Tables,
    c: &Claim<'_>,
) -> Result<Option<ClaimOutcome>> {
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
        .map_err(|e| Error::from_pg(e, false))?;
    row.map(|r| {
        Ok(ClaimOutcome::Superseded {
            period: r.get(0),
            cluster: r.get(1),
            token: to_u64(r.get(2))?,
        })
    })
    .transpose()
}

/// The token after `highest`. Tokens are PostgreSQL bigints (also without a backstop: one may be
/// added later), so the last one is `i64::MAX`; past it this is an error, never a wrap or a panic.
/// `fence()` refuses tokens never issued, so only a hand-edited status can get here.
pub fn next_token(highest: u64) -> Result<u64> {
    highest
        .checked_add(1)
        .filter(|t| i64::try_from(*t).is_ok())
        .ok_or_else(|| {
            Error::Backstop(format!(
                "no fencing token after {highest}: tokens end at {} (PostgreSQL's bigint)",
                i64::MAX
            ))
        })
}

fn to_i64(token: u64) -> Result<i64> {
    i64::try_from(token)
        .map_err(|_| Error::Backstop(format!("token {token} exceeds PostgreSQL's bigint")))
}

fn to_u64(v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|_| Error::Backstop(format!("negative token {v} in the database")))
}

/// Reads a backstop Secret, refusing one without the opt-in label [`SECRET_OPT_IN_LABEL`]`=true`.
/// Errors name the Secret, never its contents.
pub async fn load_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> crate::Result<BTreeMap<String, ByteString>> {
    let api: kube::Api<Secret> = kube::Api::namespaced(client.clone(), namespace);
    let secret = match api.get_opt(name).await {
        Err(kube::Error::Api(e)) if e.code == 403 => {
            return Err(crate::Error::BackstopConfig(secret_forbidden(
                namespace, name, &e.message,
            )));
        }
        found => found?,
    };
    let secret = secret.ok_or_else(|| {
        crate::Error::BackstopConfig(format!("Secret {namespace}/{name} not found"))
    })?;
    secret_data(secret, namespace, name)
}

/// What to do when RBAC refuses the controller a Secret: Secret access is opt-in per namespace
/// (charts/singleton-controller/templates/backstop-secrets.yaml). The API server's message names
/// the controller's user, which makes the binding command exact.
pub fn secret_forbidden(namespace: &str, name: &str, api_message: &str) -> String {
    let user = api_message
        .split_once("User \"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(user, _)| user);
    let sa = user.and_then(|u| u.strip_prefix("system:serviceaccount:"));
    let grant = match sa.and_then(|sa| sa.split_once(':')) {
        Some((sa_ns, sa_name)) => format!(
            "kubectl create rolebinding singleton-backstop-secrets -n {namespace} --clusterrole={sa_name}-backstop-secrets --serviceaccount={sa_ns}:{sa_name} (the chart's ClusterRole is <release fullname>-backstop-secrets: kubectl get clusterroles -l singleton.dev/grants=backstop-secrets)"
        ),
        None => format!(
            "a RoleBinding in namespace {namespace} to the chart's ClusterRole <release fullname>-backstop-secrets (kubectl get clusterroles -l singleton.dev/grants=backstop-secrets) for {}",
            user.unwrap_or("the controller's ServiceAccount")
        ),
    };
    format!(
        "the controller may not read Secret {namespace}/{name}: Secret access is opt-in per namespace; a namespace admin grants it with {grant}, or the chart does with rbac.backstopNamespaces={{{namespace}}}"
    )
}

/// The pure half of [`load_secret`]: the label check.
pub fn secret_data(
    secret: Secret,
    namespace: &str,
    name: &str,
) -> crate::Result<BTreeMap<String, ByteString>> {
    let opted_in = secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SECRET_OPT_IN_LABEL))
        .is_some_and(|v| v == "true");
    if !opted_in {
        return Err(crate::Error::BackstopConfig(format!(
            "Secret {namespace}/{name} lacks the label {SECRET_OPT_IN_LABEL}=\"true\" that allows the controller to use it as a backstop connection"
        )));
    }
    Ok(secret.data.unwrap_or_default())
}

/// One [`Backstop`] per SingletonJob (key `namespace/name`), rebuilt when its Secret's contents
/// or prefix change (a rotated password takes effect on the next reconcile). Holds a fingerprint,
/// never the Secret data itself.
#[derive(Default)]
pub struct BackstopCache {
    entries: std::sync::Mutex<HashMap<String, (Fingerprint, Arc<Backstop>)>>,
    allowed: Arc<AllowedHosts>,
    /// This cluster's identity in the claims it writes (`--cluster-id`; empty: none).
    cluster: String,
    /// Every namespace's database time, which its backstops' operations are timed against.
    share: Arc<share::Share>,
}

impl BackstopCache {
    /// A cache whose backstops may dial only the hosts `allowed` allows.
    pub fn new(allowed: AllowedHosts) -> Self {
        BackstopCache {
            entries: Default::default(),
            allowed: Arc::new(allowed),
            cluster: String::new(),
            share: Arc::default(),
        }
    }

    /// Every namespace's share of database time ([`share`]).
    pub fn share(&self) -> &Arc<share::Share> {
        &self.share
    }

    /// Claims through this cache name the cluster `id` (docs/multi-cluster.md).
    pub fn with_cluster(mut self, id: String) -> Self {
        self.cluster = id;
        self
    }

    /// This cluster's identity (empty: none).
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The backstop of `sj_key` for this Secret data, building it (no I/O) when new or changed.
    pub fn get(
        &self,
        sj_key: &str,
        data: &BTreeMap<String, ByteString>,
        keys: &SecretKeys,
        prefix: &TablePrefix,
    ) -> Result<Arc<Backstop>> {
        let fp = fingerprint(data, keys, prefix);
        let mut entries = crate::sync::lock(&self.entries);
        if let Some((seen, b)) = entries.get(sj_key)
            && *seen == fp
        {
            return Ok(b.clone());
        }
        let config = ConnectionConfig::from_secret(data, keys)?;
        let namespace = sj_key.split_once('/').map_or("", |(ns, _)| ns);
        let b = Backstop::new(config, prefix.clone())?
            .with_allowed_hosts(self.allowed.clone())
            .with_meter(self.share.clone(), namespace);
        let b = Arc::new(b);
        entries.insert(sj_key.to_string(), (fp, b.clone()));
        Ok(b)
    }

    /// Drops the backstop of a deleted SingletonJob (its connection closes when the last user
    /// lets go).
    pub fn forget(&self, sj_key: &str) {
        crate::sync::lock(&self.entries).remove(sj_key);
    }
}

/// SHA-256 of a Secret's data, the key names and the prefix.
pub type Fingerprint = [u8; 32];

/// The [`Fingerprint`] of a backstop's Secret data, key names and prefix (names a target for
/// [`health`] without holding its values).
pub fn fingerprint(
    data: &BTreeMap<String, ByteString>,
    keys: &SecretKeys,
    prefix: &TablePrefix,
) -> Fingerprint {
    let mut h = Sha256::new();
    for (k, ByteString(v)) in data {
        // Length-prefixed, so no two different maps hash the same byte stream.
        h.update((k.len() as u64).to_be_bytes());
        h.update(k.as_bytes());
        h.update((v.len() as u64).to_be_bytes());
        h.update(v);
    }
    h.update(format!("{keys:?}|{prefix}"));
    h.finalize().into()
}
