//! The target-database backstop (DESIGN.md layers 4 and 5; G1, G3, G5): the database remembers
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
//!
//! Layout: this module and the files beside it are what every engine shares (claims' outcomes,
//! tokens, multi-cluster judgement [`multi`], tenant ownership [`owner`], health [`health`],
//! the allow-list (`allow.rs`), database-time shares [`share`], the fence's refusals
//! [`refusals`]); each engine is a folder (`engine.rs` names them: `postgres/`, `mysql/`).

mod allow;
mod attempts;
mod config;
pub(crate) mod engine;
pub mod health;
pub mod multi;
mod outcomes;
pub mod owner;
mod mysql;
mod postgres;
pub mod refusals;
pub mod share;
#[cfg(test)]
mod tests;

use crate::api::BackstopKind;
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use sha2::{Digest, Sha256};

pub use allow::{AllowedHosts, Dial, NOT_ALLOWED};
pub use attempts::{AttemptRow, Ended, Holder, withdrawal};
pub use config::{
    ConnectionConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_OPERATION_TIMEOUT, SecretKeys, SslMode,
    TablePrefix,
};
pub use postgres::schema::SCHEMA_VERSION;
pub use refusals::{
    ATTEMPT_SQLSTATE, NEVER_ISSUED_SQLSTATE, NOT_PERMITTED_SQLSTATE, STALE_TOKEN_SQLSTATE,
};

use engine::FenceColumn;
use engine::{Engine, engine};
pub use multi::Claimer;

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

/// One backstop database: the operations the run protocol needs, each bounded by the operation
/// timeout and timed against its namespace's share, carried out by its engine (`engine.rs`).
pub struct Backstop {
    config: ConnectionConfig,
    prefix: TablePrefix,
    /// Where its operations' durations go, and the namespace they count against ([`share`]).
    meter: Option<(Arc<share::Share>, String)>,
    engine: Engine,
}

impl std::fmt::Debug for Backstop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backstop")
            .field("config", &self.config)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Backstop {
    /// No I/O: the connection opens on first use. Fails only on a TLS set-up problem (such as
    /// `verify-full` without `sslrootcert` on a host with no system CA certificates).
    pub fn new(config: ConnectionConfig, prefix: TablePrefix) -> Result<Self> {
        let engine = match config.kind {
            BackstopKind::Postgres => Engine::Postgres(Box::new(postgres::Postgres::new(
                config.clone(),
                prefix.clone(),
                Arc::default(),
            )?)),
            BackstopKind::Mysql => Engine::Mysql(Box::new(mysql::Mysql::new(
                config.clone(),
                prefix.clone(),
                Arc::default(),
            )?)),
        };
        Ok(Backstop {
            config,
            prefix,
            meter: None,
            engine,
        })
    }

    /// Limits the hosts this backstop may dial (see [`AllowedHosts`]).
    pub fn with_allowed_hosts(mut self, allowed: Arc<AllowedHosts>) -> Self {
        match &mut self.engine {
            Engine::Postgres(e) => e.set_allowed_hosts(allowed),
            Engine::Mysql(e) => e.set_allowed_hosts(allowed),
        }
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
            engine!(self, e => e.ensure_schema().await)
        })
        .await
    }

    /// Health probe: the database answers and the schema is in place (for `BackstopReady`).
    pub async fn ping(&self) -> Result<()> {
        self.bounded("ping", async { engine!(self, e => e.ping().await) })
            .await
    }

    /// The highest fencing token stored for `job` (0 if none).
    pub async fn fence(&self, job: &str) -> Result<u64> {
        self.fence_column(job, FenceColumn::Token, "read fence")
            .await
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
        self.bounded("claim", async { engine!(self, e => e.claim(&claim).await) })
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
            engine!(self, e => e.confirm(job, period, token_i, cluster).await)
        })
        .await
    }

    /// The claim of (`job`, `period`), if any: whether that period has run.
    pub async fn claimed(&self, job: &str, period: Timestamp) -> Result<Option<ClaimRow>> {
        self.bounded("read claim", async {
            engine!(self, e => e.claimed(job, period).await)
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
            engine!(self, e => e.advance_fence(job, token_i).await)
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
            engine!(self, e => e.retire(job, token_i, namespace).await)
        })
        .await
    }

    /// The highest retired token of `job` (0 if none).
    pub async fn retired(&self, job: &str) -> Result<u64> {
        self.fence_column(job, FenceColumn::Retired, "read retired")
            .await
    }

    /// One column of `job`'s fence row (0 if there is none), measured as `what`.
    async fn fence_column(&self, job: &str, column: FenceColumn, what: &str) -> Result<u64> {
        self.bounded(what, async {
            engine!(self, e => e.fence_column(job, column).await)
        })
        .await
    }

    /// How many stale tokens `singleton_fence` has refused, ever, in this database and prefix.
    pub async fn rejections(&self) -> Result<u64> {
        self.bounded("read rejections", async {
            engine!(self, e => e.rejections().await)
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

    /// The PostgreSQL engine, for tests that look inside its session.
    #[cfg(test)]
    fn postgres(&self) -> &postgres::Postgres {
        match &self.engine {
            Engine::Postgres(p) => p,
            Engine::Mysql(_) => panic!("not a PostgreSQL backstop"),
        }
    }
}

impl Error {
    pub(crate) fn backstop_timeout(what: &str, after: std::time::Duration) -> Self {
        Error::BackstopUnavailable(format!("{what} timed out after {after:?}"))
    }
}

/// One claim, as [`Backstop::claim_as`] takes it and an engine carries it out.
pub(crate) struct Claim<'a> {
    pub(crate) job: &'a str,
    pub(crate) period: Timestamp,
    pub(crate) token: i64,
    pub(crate) job_name: &'a str,
    pub(crate) takes_over: Option<i64>,
    pub(crate) claimer: &'a Claimer,
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

pub(crate) fn to_i64(token: u64) -> Result<i64> {
    i64::try_from(token)
        .map_err(|_| Error::Backstop(format!("token {token} exceeds PostgreSQL's bigint")))
}

pub(crate) fn to_u64(v: i64) -> Result<u64> {
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

/// The most of a server's message that reaches status, Events and logs.
pub(crate) const SERVER_WORDS: usize = 200;

/// A server's message as the controller repeats it (review N10): the server is whatever host a
/// SingletonJob names, so its words are cut to [`SERVER_WORDS`] characters and cleared of control
/// characters before they reach a condition, which, unlike an Event, was shown as it came.
pub(crate) fn server_words(message: &str) -> String {
    let printable = crate::text::printable(message);
    match printable.char_indices().nth(SERVER_WORDS) {
        Some((cut, _)) => format!("{}...", &printable[..cut]),
        None => printable,
    }
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
        self.get_as(sj_key, BackstopKind::Postgres, data, keys, prefix)
    }

    /// [`Self::get`] for the database `kind` the SingletonJob names.
    pub fn get_as(
        &self,
        sj_key: &str,
        kind: BackstopKind,
        data: &BTreeMap<String, ByteString>,
        keys: &SecretKeys,
        prefix: &TablePrefix,
    ) -> Result<Arc<Backstop>> {
        let fp = fingerprint(kind, data, keys, prefix);
        let mut entries = crate::sync::lock(&self.entries);
        if let Some((seen, b)) = entries.get(sj_key)
            && *seen == fp
        {
            return Ok(b.clone());
        }
        let config = ConnectionConfig::from_secret_as(kind, data, keys)?;
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

/// The [`Fingerprint`] of a backstop's kind, Secret data, key names and prefix (names a target
/// for [`health`] without holding its values).
pub fn fingerprint(
    kind: BackstopKind,
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
    h.update(format!("{kind:?}|{keys:?}|{prefix}"));
    h.finalize().into()
}
