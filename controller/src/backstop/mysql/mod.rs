//! The MariaDB/MySQL engine ([`super::engine::Engine`]): one connection per backstop, the schema
//! and its `<p>fence()` functions ([`schema`]), the claim transaction ([`claim`]), and the rest
//! of the operations ([`fence`], [`attempts`], [`outcomes`]), with the same meaning as the
//! PostgreSQL engine's (documented on the `Backstop` methods of the same names).
//!
//! Connecting: the host is checked against the allow-list before dialling (and dialled at the
//! address checked, the certificate still verified for the host's name); the driver never sends
//! the password in cleartext (`mysql_clear_password` is off), so over an unverified connection a
//! fake server gets at most a challenge's answer. Every session works in UTC, READ COMMITTED
//! (as PostgreSQL's default: a statement after a wait sees what the other committed), and is
//! told the operation timeout (`max_statement_time` on MariaDB, `max_execution_time` on MySQL)
//! and half of it as its lock wait, so a workload holding the fence row surfaces as
//! [`Error::FenceHeld`].

mod attempts;
mod claim;
mod error;
mod fence;
mod outcomes;
pub(crate) mod schema;
#[cfg(test)]
mod tests;
mod time;

use std::sync::Arc;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder, SslOpts};
use tokio::sync::{Mutex, MutexGuard};

use super::allow::{AllowedHosts, Dial};
use super::config::{ConnectionConfig, SslMode, TablePrefix};
use crate::{Error, Result};
use schema::Tables;

/// The oldest servers with everything the schema needs (enforced CHECK constraints, `SIGNAL`
/// with `MYSQL_ERRNO`, expression defaults): MariaDB 10.6 (the oldest maintained), MySQL 8.0.16.
const OLDEST_MARIADB: (u16, u16, u16) = (10, 6, 0);
const OLDEST_MYSQL: (u16, u16, u16) = (8, 0, 16);

/// A connection to one MariaDB/MySQL backstop database, with its schema ensured on first use.
pub(crate) struct Mysql {
    config: ConnectionConfig,
    prefix: TablePrefix,
    allowed: Arc<AllowedHosts>,
    slot: Mutex<Slot>,
}

/// The connection state, used by one operation at a time.
#[derive(Default)]
pub(crate) struct Slot {
    conn: Option<Conn>,
    /// False while an operation runs; still false at the next one means the last was cancelled
    /// by its timeout mid-flight (perhaps mid-transaction), so the connection is dropped.
    clean: bool,
    tables: Option<Tables>,
    version: i32,
    /// The server is MariaDB (else MySQL), read when connecting.
    mariadb: bool,
}

impl Mysql {
    /// No I/O: the connection opens on first use. Fails without a database name (the tables go
    /// there; `sslmode prefer` was refused when the Secret was read).
    pub(crate) fn new(
        config: ConnectionConfig,
        prefix: TablePrefix,
        allowed: Arc<AllowedHosts>,
    ) -> Result<Self> {
        if config.dbname.is_none() {
            return Err(Error::BackstopConfig(
                "no database: set the URL's path or key `dbname` (the controller creates its tables there)".into(),
            ));
        }
        Ok(Mysql {
            config,
            prefix,
            allowed,
            slot: Mutex::new(Slot::default()),
        })
    }

    /// Limits the hosts it may dial (see [`AllowedHosts`]).
    pub(crate) fn set_allowed_hosts(&mut self, allowed: Arc<AllowedHosts>) {
        self.allowed = allowed;
    }

    /// Connects if needed and creates or upgrades the schema; returns the schema version.
    pub(crate) async fn ensure_schema(&self) -> Result<i32> {
        let mut slot = self.session().await?;
        let v = slot.version;
        slot.clean = true;
        Ok(v)
    }

    /// The database answers and the schema is in place.
    pub(crate) async fn ping(&self) -> Result<()> {
        let mut slot = self.session().await?;
        let r = slot.conn()?.ping().await.map_err(Error::from_mysql);
        slot.settle(r)
    }

    /// Locks the slot, (re)connects and ensures the schema. The caller must `settle`.
    pub(crate) async fn session(&self) -> Result<MutexGuard<'_, Slot>> {
        let mut slot = self.slot.lock().await;
        if !slot.clean {
            slot.conn = None;
        }
        slot.clean = false;
        if slot.conn.is_none() {
            let (conn, mariadb) = self.connect().await?;
            slot.conn = Some(conn);
            slot.mariadb = mariadb;
        }
        if slot.tables.is_none() {
            let mariadb = slot.mariadb;
            let (version, tables) = schema::migrate(slot.conn()?, &self.prefix, mariadb).await?;
            slot.version = version;
            slot.tables = Some(tables);
        }
        Ok(slot)
    }

    /// A new session, and whether the server is MariaDB.
    async fn connect(&self) -> Result<(Conn, bool)> {
        let c = &self.config;
        let dial = self.allowed.check(&c.host.0, c.hostaddr, c.port).await?;
        let address = match dial {
            Dial::Address(addr) => Some(addr),
            Dial::AsConfigured => c.hostaddr,
        };
        let mut opts = OptsBuilder::default()
            .ip_or_hostname(address.map_or_else(|| c.host.0.clone(), |a| a.to_string()))
            .tcp_port(c.port)
            .user(Some(c.user.0.clone()))
            .pass(c.password.as_ref().map(|p| p.0.clone()))
            .db_name(c.dbname.as_ref().map(|d| d.0.clone()))
            .prefer_socket(false)
            .tcp_keepalive(Some(30_000u32))
            .ssl_opts(self.ssl_opts(address.is_some()));
        // The session's bounds and settings, before any statement of ours.
        let secs = c.operation_timeout.as_secs_f64().max(0.001);
        opts = opts.init(vec![
            "SET SESSION time_zone = '+00:00'".to_string(),
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".to_string(),
            format!(
                "SET SESSION innodb_lock_wait_timeout = {}",
                (secs / 2.0).ceil().max(1.0) as u64
            ),
        ]);
        let limit = c.connect_timeout.max(c.operation_timeout);
        let mut conn = tokio::time::timeout(limit, Conn::new(opts))
            .await
            .map_err(|_| Error::backstop_timeout("connect", limit))?
            .map_err(Error::from_mysql_connecting)?;
        let mariadb = statement_timeout(&mut conn, secs).await?;
        Ok((conn, mariadb))
    }

    /// TLS as `sslmode` says: none, unverified, chain only, or chain and name (against
    /// `sslrootcert`, else the driver's built-in roots). Dialled at a checked address, the name
    /// verified is still the host's.
    fn ssl_opts(&self, by_address: bool) -> Option<SslOpts> {
        let c = &self.config;
        if c.sslmode == SslMode::Disable {
            return None;
        }
        let mut ssl = SslOpts::default()
            .with_disable_built_in_roots(!c.root_certs.is_empty())
            // The driver takes a buffer that is not PEM as one DER certificate.
            .with_root_certs(
                c.root_certs
                    .iter()
                    .map(|der| der.as_ref().to_vec().into())
                    .collect(),
            );
        match c.sslmode {
            SslMode::Require => ssl = ssl.with_danger_accept_invalid_certs(true),
            SslMode::VerifyCa => ssl = ssl.with_danger_skip_domain_validation(true),
            _ => {}
        }
        if by_address {
            ssl = ssl.with_danger_tls_hostname_override(Some(c.host.0.clone()));
        }
        Some(ssl)
    }
}

/// The server's version is checked here (a clear error, not a failed migration), and the
/// statement bound set by the variable this server has. Returns whether it is MariaDB.
async fn statement_timeout(conn: &mut Conn, secs: f64) -> Result<bool> {
    let version: String = conn
        .query_first("SELECT VERSION()")
        .await
        .map_err(Error::from_mysql)?
        .unwrap_or_default();
    let mariadb = supported(&version, conn.server_version())?;
    let set = if mariadb {
        format!("SET SESSION max_statement_time = {secs:.3}")
    } else {
        format!(
            "SET SESSION max_execution_time = {}",
            (secs * 1000.0).ceil() as u64
        )
    };
    conn.query_drop(set).await.map_err(Error::from_mysql)?;
    Ok(mariadb)
}

/// Whether a server of this `VERSION()` text and version number can hold the backstop: Ok(true)
/// for MariaDB, Ok(false) for MySQL, an error naming both versions for an older one.
fn supported(version: &str, (major, minor, patch): (u16, u16, u16)) -> Result<bool> {
    let mariadb = version.contains("MariaDB");
    let (oldest, name) = if mariadb {
        (OLDEST_MARIADB, "MariaDB")
    } else {
        (OLDEST_MYSQL, "MySQL")
    };
    if (major, minor, patch) < oldest {
        return Err(Error::BackstopConfig(format!(
            "the server is {name} {major}.{minor}.{patch}; the backstop needs {name} {}.{}.{} or later",
            oldest.0, oldest.1, oldest.2
        )));
    }
    Ok(mariadb)
}

impl Slot {
    fn conn(&mut self) -> Result<&mut Conn> {
        self.conn
            .as_mut()
            .ok_or_else(|| Error::BackstopUnavailable("not connected".into()))
    }

    fn tables(&self) -> Result<&Tables> {
        self.tables
            .as_ref()
            .ok_or_else(|| Error::Backstop("schema not ensured".into()))
    }

    /// The connection and the table names together (one borrow of the slot).
    fn parts(&mut self) -> Result<(&mut Conn, Tables)> {
        let t = self.tables()?.clone();
        Ok((self.conn()?, t))
    }

    /// Records how an operation ended: a connection problem drops the connection; an
    /// unexpected SQL error re-runs the migration next time.
    fn settle<T>(&mut self, r: Result<T>) -> Result<T> {
        match &r {
            Err(Error::BackstopUnavailable(_)) => self.conn = None,
            Err(Error::Backstop(_)) => self.tables = None,
            _ => {}
        }
        self.clean = true;
        r
    }
}
