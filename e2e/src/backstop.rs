//! The test databases behind the backstop, PostgreSQL and MariaDB: their URLs, a client of each,
//! and the Secrets and spec lines that point a SingletonJob at them.

use anyhow::{Context as _, Result};
use jiff::Timestamp;
use kube::api::{Api, PostParams};

use crate::{Env, Proxy};

/// `DATABASE_URL` (set by `make e2e`), the test PostgreSQL.
pub fn database_url() -> Result<String> {
    std::env::var("DATABASE_URL")
        .context("DATABASE_URL is unset: run `make up` and `eval \"$(make -s env)\"`")
}

/// The port of the test PostgreSQL, from `DATABASE_URL`.
pub fn database_port() -> Result<u16> {
    let url = database_url()?;
    url.rsplit(':')
        .next()
        .and_then(|s| s.split('/').next())
        .and_then(|s| s.parse().ok())
        .with_context(|| "DATABASE_URL has no port".to_string())
}

/// A client of the test PostgreSQL.
pub async fn pg() -> Result<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::connect(&database_url()?, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

/// A Secret holding a backstop connection `url`; `opted_in` sets the label the controller requires.
pub async fn backstop_secret(env: &Env, name: &str, url: &str, opted_in: bool) -> Result<()> {
    let mut s = k8s_openapi::api::core::v1::Secret::default();
    s.metadata.name = Some(name.into());
    if opted_in {
        s.metadata.labels =
            Some([("singleton.dev/backstop".to_string(), "true".to_string())].into());
    }
    s.string_data = Some([("url".to_string(), url.to_string())].into());
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &s)
        .await?;
    Ok(())
}

/// The test PostgreSQL behind a test-owned [`Proxy`], and an opted-in backstop Secret `name`
/// pointing through it: cutting the proxy is a database outage for this test alone.
pub async fn proxied_backstop_secret(env: &Env, name: &str) -> Result<Proxy> {
    let port = database_port()?;
    let proxy = Proxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let url = database_url()?.replace(&format!(":{port}/"), &format!(":{}/", proxy.port));
    backstop_secret(env, name, &url, true).await?;
    Ok(proxy)
}

/// A backstop table prefix of this test's own, so parallel tests never share claims, fences or
/// refusal counts.
pub fn table_prefix(env: &Env) -> String {
    format!("e2e_{}_", env.ns.rsplit('-').next().unwrap_or("x"))
}

/// The `spec.backstop` lines (plus `extra` spec lines) for [`sj_yaml`](crate::sj_yaml).
pub fn backstop_spec(secret: &str, prefix: &str, extra: &str) -> String {
    format!(
        "  backstop:\n    postgres:\n      secretRef: {{name: {secret}}}\n      tablePrefix: {prefix}\n{extra}"
    )
}

/// `MARIADB_URL` (set by `make e2e`), the test MariaDB: `mysql://user:password@host:port/db?...`.
pub fn mariadb_url() -> Result<String> {
    std::env::var("MARIADB_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .context("MARIADB_URL is unset: run `make up` and `eval \"$(make -s env)\"`")
}

/// The port of the test MariaDB, from `MARIADB_URL`.
pub fn mariadb_port() -> Result<u16> {
    let url = mariadb_url()?;
    url.split('?')
        .next()
        .and_then(|u| u.rsplit(':').next())
        .and_then(|s| s.split('/').next())
        .and_then(|s| s.parse().ok())
        .context("MARIADB_URL has no port")
}

/// A client of the test MariaDB, as the URL's user, in UTC, over TCP (the driver knows none of
/// the URL's query parameters, such as `ssl-mode`, so they are left off; the server takes
/// plain connections on loopback).
pub async fn mariadb() -> Result<mysql_async::Conn> {
    let url = mariadb_url()?;
    let base = url.split('?').next().unwrap_or(&url);
    let opts = mysql_async::Opts::from_url(base).context("MARIADB_URL does not parse")?;
    let opts = mysql_async::OptsBuilder::from_opts(opts)
        .prefer_socket(false)
        .init(vec!["SET SESSION time_zone = '+00:00'"]);
    Ok(mysql_async::Conn::new(opts).await?)
}

/// `t` as a MariaDB DATETIME(6) parameter (UTC, microseconds, as the backstop stores instants).
pub fn mysql_datetime(t: Timestamp) -> mysql_async::Value {
    let dt = t.to_zoned(jiff::tz::TimeZone::UTC).datetime();
    mysql_async::Value::Date(
        dt.year() as u16,
        dt.month() as u8,
        dt.day() as u8,
        dt.hour() as u8,
        dt.minute() as u8,
        dt.second() as u8,
        (dt.subsec_nanosecond() / 1000) as u32,
    )
}

/// A DATETIME read back from MariaDB (UTC): a prepared statement's date, or the text protocol's
/// `YYYY-MM-DD hh:mm:ss[.ffffff]`.
pub fn mysql_timestamp(v: mysql_async::Value) -> Result<Timestamp> {
    use mysql_async::Value;
    let dt =
        match v {
            Value::Date(y, mo, d, h, mi, s, us) => jiff::civil::date(y as i16, mo as i8, d as i8)
                .at(h as i8, mi as i8, s as i8, us as i32 * 1000),
            Value::Bytes(b) => String::from_utf8_lossy(&b)
                .replacen(' ', "T", 1)
                .parse::<jiff::civil::DateTime>()?,
            other => anyhow::bail!("expected a DATETIME, got {other:?}"),
        };
    Ok(dt.to_zoned(jiff::tz::TimeZone::UTC)?.timestamp())
}

/// The `spec.backstop` lines for MariaDB/MySQL (plus `extra` spec lines) for
/// [`sj_yaml`](crate::sj_yaml).
pub fn mysql_backstop_spec(secret: &str, prefix: &str, extra: &str) -> String {
    format!(
        "  backstop:\n    mysql:\n      secretRef: {{name: {secret}}}\n      tablePrefix: {prefix}\n{extra}"
    )
}
