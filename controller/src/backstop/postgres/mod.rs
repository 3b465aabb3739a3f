//! The PostgreSQL engine ([`super::engine::Engine`]): one client per backstop, the schema and
//! its `<p>fence()` functions ([`schema`]), the claim transaction ([`claim`]), and the rest of the
//! operations as single statements. Connecting: the host is checked against the allow-list
//! before dialling, the password is never sent to a server nobody verified ([`guard`]), and the
//! session is told the operation timeout as its `statement_timeout`.

mod attempts;
mod claim;
mod error;
pub(crate) mod fence;
mod guard;
mod outcomes;
pub(crate) mod schema;
mod tls;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{Mutex, MutexGuard};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::allow::{AllowedHosts, Dial};
use super::config::{ConnectionConfig, SslMode, TablePrefix};
use crate::{Error, Result};
use schema::Tables;

/// A connection to one PostgreSQL backstop database, with its schema ensured on first use.
pub(crate) struct Postgres {
    config: ConnectionConfig,
    prefix: TablePrefix,
    tls: Option<rustls::ClientConfig>,
    /// The hosts it may dial (`--backstop-allowed-hosts`), checked before every connection.
    allowed: Arc<AllowedHosts>,
    slot: Mutex<Slot>,
}

/// The connection state, used by one operation at a time.
#[derive(Default)]
pub(crate) struct Slot {
    client: Option<Client>,
    /// False while an operation runs. Still false at the next operation means the last one was
    /// cancelled by its timeout mid-flight: the client may be mid-transaction, so it is dropped.
    pub(crate) clean: bool,
    tables: Option<Tables>,
    version: i32,
}

impl Postgres {
    /// No I/O: the connection opens on first use. Fails only on a TLS set-up problem (such as
    /// `verify-full` without `sslrootcert` on a host with no system CA certificates).
    pub(crate) fn new(
        config: ConnectionConfig,
        prefix: TablePrefix,
        allowed: Arc<AllowedHosts>,
    ) -> Result<Self> {
        let tls = tls::client_config(config.sslmode, &config.root_certs)?;
        Ok(Postgres {
            config,
            prefix,
            tls,
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
        let r = slot
            .client()?
            .simple_query("SELECT 1")
            .await
            .map(|_| ())
            .map_err(|e| Error::from_pg(e, false));
        slot.settle(r)
    }
    /// Locks the slot, (re)connects and ensures the schema. The caller must `settle` (or set
    /// `clean`) when done.
    pub(crate) async fn session(&self) -> Result<MutexGuard<'_, Slot>> {
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
    pub(crate) fn client(&self) -> Result<&Client> {
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
