//! The test PostgreSQL behind the backstop: its URL, a client, and the Secrets and spec lines
//! that point a SingletonJob at it.

use anyhow::{Context as _, Result};
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
