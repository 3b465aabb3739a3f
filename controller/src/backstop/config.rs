//! Connection settings built from a Secret's `data`, and the table prefix.
//!
//! Everything here is pure (no I/O), so every rule is unit-tested. Secret contents are secrets: no
//! error message, `Debug` or `Display` output here ever contains a value read from the Secret (not
//! the password, not the URL, not even the host or user). A target is identified in logs and
//! status by its Secret reference, which the caller knows; error messages name Secret *keys* only.

use crate::api::BackstopKind;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::ByteString;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// Default bound on establishing a connection (TCP connect; the TLS and startup handshake are
/// bounded by the operation timeout).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default bound on one operation, connecting included. Also sent to the server as
/// `statement_timeout`, so a query abandoned by the client does not run on for long.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

/// How the connection is encrypted and the server authenticated (libpq's `sslmode`). The
/// default is `VerifyFull`, not libpq's `prefer`: an unverified server could be a fake that
/// accepts every claim. Over the unverified modes the password is never sent in cleartext or as
/// MD5 (see `guard.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, plain otherwise; no verification.
    Prefer,
    /// TLS required; the certificate is not verified, unless `sslrootcert` is given, which then
    /// makes this `VerifyCa` (as libpq does when a root certificate file exists).
    Require,
    /// TLS required; the chain must lead to a root in `sslrootcert`; any host name is accepted.
    VerifyCa,
    /// TLS required; chain and host name verified, against `sslrootcert`, else the system roots.
    #[default]
    VerifyFull,
}

impl SslMode {
    /// Whether the server's certificate is checked against a trusted root, so the password may
    /// be sent in whatever form the server asks for.
    pub fn verifies_server(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyFull)
    }
}

impl SslMode {
    fn parse(s: &str) -> Result<Self, &'static str> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            // MySQL's names (`ssl-mode`), for a URL copied from a MySQL client's settings.
            "DISABLED" => SslMode::Disable,
            "PREFERRED" => SslMode::Prefer,
            "REQUIRED" => SslMode::Require,
            "VERIFY_CA" => SslMode::VerifyCa,
            "VERIFY_IDENTITY" => SslMode::VerifyFull,
            // `allow` (plain first, TLS as a fallback) is not worth the code; never echo the value.
            _ => {
                return Err(
                    "sslmode must be one of disable, prefer, require, verify-ca, verify-full",
                );
            }
        })
    }
}

/// The names of the Secret keys to read. Defaults: `url`, `host`, `port`, `dbname`, `user`,
/// `password`, `sslmode`, `sslrootcert` (`hostaddr` too, mostly for tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretKeys {
    pub url: String,
    pub host: String,
    pub hostaddr: String,
    pub port: String,
    pub dbname: String,
    pub user: String,
    pub password: String,
    pub sslmode: String,
    pub sslrootcert: String,
}

impl Default for SecretKeys {
    fn default() -> Self {
        SecretKeys {
            url: "url".into(),
            host: "host".into(),
            hostaddr: "hostaddr".into(),
            port: "port".into(),
            dbname: "dbname".into(),
            user: "user".into(),
            password: "password".into(),
            sslmode: "sslmode".into(),
            sslrootcert: "sslrootcert".into(),
        }
    }
}

/// A string that never prints.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Redacted(pub(crate) String);

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Where and how to connect to one backstop database. Built by [`ConnectionConfig::from_secret`];
/// its `Debug` output shows no value that came from the Secret.
#[derive(Clone, PartialEq)]
pub struct ConnectionConfig {
    /// Which engine the Secret connects to (the spec's kind; a URL of another engine is refused).
    pub(crate) kind: BackstopKind,
    pub(crate) host: Redacted,
    pub(crate) hostaddr: Option<IpAddr>,
    pub(crate) port: u16,
    pub(crate) dbname: Option<Redacted>,
    pub(crate) user: Redacted,
    pub(crate) password: Option<Redacted>,
    pub(crate) sslmode: SslMode,
    pub(crate) root_certs: Vec<CertificateDer<'static>>,
    pub(crate) application_name: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) operation_timeout: Duration,
}

impl fmt::Debug for ConnectionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Written by hand so that a later field cannot leak by being added to a derive.
        f.debug_struct("ConnectionConfig")
            .field("kind", &self.kind)
            .field("host", &self.host)
            .field("hostaddr", &self.hostaddr.map(|_| "<redacted>"))
            .field("port", &self.port)
            .field("dbname", &self.dbname)
            .field("user", &self.user)
            .field("password", &self.password)
            .field("sslmode", &self.sslmode)
            .field("root_certs", &self.root_certs.len())
            .field("connect_timeout", &self.connect_timeout)
            .field("operation_timeout", &self.operation_timeout)
            .finish()
    }
}

impl ConnectionConfig {
    /// Builds the settings from a Secret's `data`. Either `keys.url` holds a `postgres://` or
    /// `postgresql://` URL, or the discrete keys do (`host` and `user` required; `port` 5432 by
    /// default). When both are present, a discrete key overrides the URL's part, which lets the
    /// password and the PEM root certificate live in keys of their own. `sslrootcert` is the PEM
    /// text of the CA certificate(s), never a file path. Unknown keys are ignored.
    pub fn from_secret(data: &BTreeMap<String, ByteString>, keys: &SecretKeys) -> Result<Self> {
        Self::from_secret_as(BackstopKind::Postgres, data, keys)
    }

    /// [`Self::from_secret`] for the engine `kind`: for [`BackstopKind::Mysql`] the URL is
    /// `mysql://` or `mariadb://`, the port 3306 by default, and `sslmode` one of `disable`,
    /// `require`, `verify-ca`, `verify-full` (MySQL's `DISABLED`, `REQUIRED`, `VERIFY_CA`,
    /// `VERIFY_IDENTITY`): MySQL clients have no TLS-if-offered mode.
    pub fn from_secret_as(
        kind: BackstopKind,
        data: &BTreeMap<String, ByteString>,
        keys: &SecretKeys,
    ) -> Result<Self> {
        let (parts, root_certs) = read_secret(kind, data, keys)?;
        if kind == BackstopKind::Mysql && parts.sslmode == Some(SslMode::Prefer) {
            return Err(Error::BackstopConfig(format!(
                "key `{}`: sslmode prefer is not supported for MySQL/MariaDB: use disable, require, verify-ca or verify-full",
                keys.sslmode
            )));
        }
        Self::from_parts(kind, parts, root_certs, keys)
    }

    /// The settings from what the Secret said, with the defaults and the rules between them
    /// (host and user required; `require` with a CA verifies it, as in libpq).
    fn from_parts(
        kind: BackstopKind,
        parts: UrlParts,
        root_certs: Vec<CertificateDer<'static>>,
        keys: &SecretKeys,
    ) -> Result<Self> {
        let host = parts.host.ok_or_else(|| {
            Error::BackstopConfig(format!(
                "no host: set key `{}` or key `{}`",
                keys.url, keys.host
            ))
        })?;
        let user = parts.user.ok_or_else(|| {
            Error::BackstopConfig(format!(
                "no user: set key `{}` or key `{}`",
                keys.url, keys.user
            ))
        })?;
        let mut sslmode = parts.sslmode.unwrap_or_default();
        if sslmode == SslMode::Require && !root_certs.is_empty() {
            sslmode = SslMode::VerifyCa;
        }
        if sslmode == SslMode::VerifyCa && root_certs.is_empty() {
            return Err(Error::BackstopConfig(format!(
                "sslmode verify-ca needs the CA certificate in key `{}`",
                keys.sslrootcert
            )));
        }
        let connect_timeout = parts
            .connect_timeout
            .map_or(DEFAULT_CONNECT_TIMEOUT, |t| t.min(DEFAULT_CONNECT_TIMEOUT));
        let default_port = match kind {
            BackstopKind::Postgres => 5432,
            BackstopKind::Mysql => 3306,
        };
        Ok(ConnectionConfig {
            kind,
            host: Redacted(host),
            hostaddr: parts.hostaddr,
            port: parts.port.unwrap_or(default_port),
            dbname: parts.dbname.map(Redacted),
            user: Redacted(user),
            password: parts.password.map(Redacted),
            sslmode,
            root_certs,
            application_name: parts
                .application_name
                .unwrap_or_else(|| "singleton-controller".into()),
            connect_timeout,
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
        })
    }

    /// Overrides the timeouts (both must be non-zero; the connect timeout is capped by the
    /// operation timeout, which bounds every call including its connect).
    pub fn with_timeouts(mut self, connect: Duration, operation: Duration) -> Self {
        let operation = operation.max(Duration::from_millis(1));
        self.operation_timeout = operation;
        self.connect_timeout = connect.max(Duration::from_millis(1)).min(operation);
        self
    }

    pub fn sslmode(&self) -> SslMode {
        self.sslmode
    }

    pub fn operation_timeout(&self) -> Duration {
        self.operation_timeout
    }

    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
}

fn parse_root_certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, &'static str> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| "not valid PEM")?;
    if certs.is_empty() {
        return Err("no PEM CERTIFICATE block found");
    }
    Ok(certs)
}

fn parse_port(s: &str) -> Result<u16, &'static str> {
    match s.parse::<u16>() {
        Ok(0) | Err(_) => Err("port must be a number from 1 to 65535"),
        Ok(p) => Ok(p),
    }
}

/// What a URL said. Errors are static strings: they must never quote the input.
#[derive(Default)]
struct UrlParts {
    host: Option<String>,
    hostaddr: Option<IpAddr>,
    port: Option<u16>,
    dbname: Option<String>,
    user: Option<String>,
    password: Option<String>,
    sslmode: Option<SslMode>,
    application_name: Option<String>,
    connect_timeout: Option<Duration>,
}

/// What a Secret's keys say: the URL's parts, each overridden by a discrete key, and the root
/// certificates.
fn read_secret(
    kind: BackstopKind,
    data: &BTreeMap<String, ByteString>,
    keys: &SecretKeys,
) -> Result<(UrlParts, Vec<CertificateDer<'static>>)> {
    let get = |key: &str| -> Result<Option<String>> {
        match data.get(key) {
            None => Ok(None),
            Some(ByteString(bytes)) => String::from_utf8(bytes.clone())
                .map(Some)
                .map_err(|_| Error::BackstopConfig(format!("key `{key}` is not valid UTF-8"))),
        }
    };
    // Values written with `kubectl create secret --from-file` often end in a newline; the
    // password is taken verbatim because any byte may be part of it.
    let get_trimmed = |key: &str| -> Result<Option<String>> {
        Ok(get(key)?
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty()))
    };

    let scheme = match kind {
        BackstopKind::Postgres => "postgres://",
        BackstopKind::Mysql => "mysql://",
    };
    let mut parts = match get_trimmed(&keys.url)? {
        Some(url) => parse_url(kind, &url).map_err(|what| {
            Error::BackstopConfig(format!(
                "key `{}` is not a valid {scheme} URL: {what}",
                keys.url
            ))
        })?,
        None => UrlParts::default(),
    };
    if let Some(host) = get_trimmed(&keys.host)? {
        parts.host = Some(host);
    }
    if let Some(port) = get_trimmed(&keys.port)? {
        parts.port = Some(
            parse_port(&port)
                .map_err(|what| Error::BackstopConfig(format!("key `{}`: {what}", keys.port)))?,
        );
    }
    if let Some(hostaddr) = get_trimmed(&keys.hostaddr)? {
        parts.hostaddr = Some(hostaddr.parse().map_err(|_| {
            Error::BackstopConfig(format!("key `{}` is not an IP address", keys.hostaddr))
        })?);
    }
    if let Some(dbname) = get_trimmed(&keys.dbname)? {
        parts.dbname = Some(dbname);
    }
    if let Some(user) = get_trimmed(&keys.user)? {
        parts.user = Some(user);
    }
    if let Some(password) = get(&keys.password)? {
        parts.password = Some(password);
    }
    if let Some(mode) = get_trimmed(&keys.sslmode)? {
        parts.sslmode =
            Some(SslMode::parse(&mode).map_err(|what| {
                Error::BackstopConfig(format!("key `{}`: {what}", keys.sslmode))
            })?);
    }
    let root_certs = match get(&keys.sslrootcert)? {
        Some(pem) if !pem.trim().is_empty() => parse_root_certs(pem.as_bytes())
            .map_err(|what| Error::BackstopConfig(format!("key `{}`: {what}", keys.sslrootcert)))?,
        _ => Vec::new(),
    };
    Ok((parts, root_certs))
}

/// Parses `postgres[ql]://[user[:password]@]host[:port][/dbname][?param=value&...]` (one host;
/// IPv6 in brackets). Parsed here rather than by tokio-postgres so that no error can quote the
/// URL, and so that libpq's `sslmode=verify-ca|verify-full` are understood.
/// A `mysql://` or `mariadb://` URL has the same shape (`ssl-mode` is read as `sslmode`). A URL
/// of the other engine is refused by its scheme, before anything connects.
fn parse_url(kind: BackstopKind, url: &str) -> Result<UrlParts, &'static str> {
    let (postgres, mysql) = (
        url.strip_prefix("postgresql://")
            .or_else(|| url.strip_prefix("postgres://")),
        url.strip_prefix("mysql://")
            .or_else(|| url.strip_prefix("mariadb://")),
    );
    let rest = match (kind, postgres, mysql) {
        (BackstopKind::Postgres, Some(rest), _) | (BackstopKind::Mysql, _, Some(rest)) => rest,
        (BackstopKind::Postgres, None, Some(_)) => {
            return Err(
                "it is a MySQL/MariaDB URL, but spec.backstop.postgres needs postgres:// or postgresql:// (use spec.backstop.mysql)",
            );
        }
        (BackstopKind::Mysql, Some(_), None) => {
            return Err(
                "it is a PostgreSQL URL, but spec.backstop.mysql needs mysql:// or mariadb:// (use spec.backstop.postgres)",
            );
        }
        (BackstopKind::Postgres, None, None) => {
            return Err("it must start with postgres:// or postgresql://");
        }
        (BackstopKind::Mysql, None, None) => {
            return Err("it must start with mysql:// or mariadb://");
        }
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (rest, None),
    };
    // The password may contain '@' when not percent-encoded: split at the last one, like libpq.
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let mut parts = UrlParts::default();
    if let Some(userinfo) = userinfo {
        parse_userinfo(userinfo, &mut parts)?;
    }
    parse_hostport(hostport, &mut parts)?;
    if let Some(path) = path.filter(|p| !p.is_empty()) {
        parts.dbname = Some(decode(path).ok_or("invalid percent-encoding in the database name")?);
    }
    parse_query(query.unwrap_or_default(), &mut parts)?;
    Ok(parts)
}

/// `user[:password]` of a URL.
fn parse_userinfo(userinfo: &str, parts: &mut UrlParts) -> Result<(), &'static str> {
    let (user, password) = match userinfo.split_once(':') {
        Some((u, p)) => (u, Some(p)),
        None => (userinfo, None),
    };
    if !user.is_empty() {
        parts.user = Some(decode(user).ok_or("invalid percent-encoding in the user")?);
    }
    if let Some(p) = password {
        parts.password = Some(decode(p).ok_or("invalid percent-encoding in the password")?);
    }
    Ok(())
}

/// `host[:port]` of a URL (IPv6 in brackets; one host; no unix socket).
fn parse_hostport(hostport: &str, parts: &mut UrlParts) -> Result<(), &'static str> {
    if hostport.contains(',') {
        return Err("several hosts are not supported");
    }
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or("unclosed '[' in the host")?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or("unexpected text after the host")?,
            ),
        };
        (h.to_string(), port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (
                decode(h).ok_or("invalid percent-encoding in the host")?,
                Some(p),
            ),
            None => (
                decode(hostport).ok_or("invalid percent-encoding in the host")?,
                None,
            ),
        }
    };
    if !host.is_empty() {
        if host.starts_with('/') {
            return Err("unix sockets are not supported");
        }
        parts.host = Some(host);
    }
    if let Some(p) = port.filter(|p| !p.is_empty()) {
        parts.port = Some(parse_port(p)?);
    }
    Ok(())
}

/// The `?param=value&...` of a URL. Never names an unknown parameter: a malformed URL can put a
/// secret in that position.
fn parse_query(query: &str, parts: &mut UrlParts) -> Result<(), &'static str> {
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or("a query parameter has no '='")?;
        let v = decode(v).ok_or("invalid percent-encoding in a query parameter")?;
        match k {
            "sslmode" | "ssl-mode" => parts.sslmode = Some(SslMode::parse(&v)?),
            "host" => parts.host = Some(v),
            "hostaddr" => {
                parts.hostaddr = Some(v.parse().map_err(|_| "hostaddr is not an IP address")?)
            }
            "port" => parts.port = Some(parse_port(&v)?),
            "dbname" => parts.dbname = Some(v),
            "user" => parts.user = Some(v),
            "password" => parts.password = Some(v),
            "application_name" => parts.application_name = Some(v),
            "connect_timeout" => {
                let secs: u64 = v.parse().map_err(|_| "connect_timeout is not a number")?;
                if secs > 0 {
                    parts.connect_timeout = Some(Duration::from_secs(secs));
                }
            }
            "sslrootcert" => {
                return Err(
                    "sslrootcert in the URL would be a file path: put the PEM in the Secret's sslrootcert key",
                );
            }
            _ => return Err("unsupported query parameter"),
        }
    }
    Ok(())
}

/// Percent-decoding; `None` on a bad escape or a result that is not UTF-8.
fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A validated prefix for the backstop's table, sequence and function names (default
/// `singleton_`): lower-case ASCII letters, digits and `_`, starting with a letter or `_`, at most
/// [`TablePrefix::MAX_LEN`] bytes, so every derived name is a plain SQL identifier under
/// PostgreSQL's 63-byte limit and needs no quoting.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TablePrefix(String);

impl TablePrefix {
    /// 63 bytes minus the longest derived name's suffix (`claims_job_period_key`) and then some.
    pub const MAX_LEN: usize = 32;

    pub fn new(prefix: &str) -> Result<Self> {
        let ok_start = prefix
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        let ok_rest = prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        // The prefix is not a secret (it comes from the spec), so it may be quoted.
        if !ok_start || !ok_rest || prefix.len() > Self::MAX_LEN {
            return Err(Error::BackstopConfig(format!(
                "tablePrefix {prefix:?} must be 1 to {} characters of a-z, 0-9 and _, not starting with a digit",
                Self::MAX_LEN
            )));
        }
        Ok(TablePrefix(prefix.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TablePrefix {
    fn default() -> Self {
        TablePrefix("singleton_".into())
    }
}

impl fmt::Display for TablePrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
