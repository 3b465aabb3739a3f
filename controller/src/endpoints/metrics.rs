//! `/metrics` on its own port, apart from the probes.
//!
//! - [`MetricsAuth::Kubernetes`] (the default): HTTPS, and only for a caller whose bearer token
//!   passes a TokenReview and whose user may `get` the non-resource URL `/metrics`
//!   ([`super::auth`]): 401 without a valid token, 403 without the permission. Like
//!   controller-runtime's secure metrics: Prometheus scrapes with its ServiceAccount token.
//! - [`MetricsAuth::None`]: plain HTTP, no checks, as the health port; for a loopback address
//!   (tests, a sidecar proxy) or a network that a NetworkPolicy already closes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kube::Client;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::auth::{Authorizer, CachePolicy, Decision, bearer_token};
use super::tls::{CertSource, server_config};
use crate::{Error, Result};

/// Who may read `/metrics` (`--metrics-auth`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricsAuth {
    /// HTTPS with a TokenReview and a SubjectAccessReview per (cached) token.
    Kubernetes,
    /// Plain HTTP, anyone who can connect.
    None,
}

impl std::str::FromStr for MetricsAuth {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "kubernetes" => Ok(MetricsAuth::Kubernetes),
            "none" => Ok(MetricsAuth::None),
            other => Err(format!("{other:?}: expected `kubernetes` or `none`")),
        }
    }
}

/// How the metrics server runs.
#[derive(Clone, Debug)]
pub struct MetricsOptions {
    pub addr: SocketAddr,
    pub auth: MetricsAuth,
    /// PEM certificate and key files (`--metrics-cert-file`, `--metrics-key-file`); None: a
    /// self-signed certificate. Only with [`MetricsAuth::Kubernetes`].
    pub cert: Option<(PathBuf, PathBuf)>,
}

impl MetricsOptions {
    /// Plain HTTP without checks on `addr` (tests, benchmarks).
    pub fn open(addr: SocketAddr) -> Self {
        MetricsOptions {
            addr,
            auth: MetricsAuth::None,
            cert: None,
        }
    }

    fn cert_source(&self) -> CertSource {
        match &self.cert {
            Some((cert, key)) => CertSource::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            None => CertSource::SelfSigned {
                hosts: vec!["localhost".into(), "127.0.0.1".into()],
            },
        }
    }
}

/// At most this many connections at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 64;
/// A TLS handshake, or a request's headers, must arrive within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds `opts.addr` and serves `/metrics` in the background; returns the bound address.
pub async fn serve(client: Client, opts: MetricsOptions) -> Result<SocketAddr> {
    if opts.auth == MetricsAuth::None && opts.cert.is_some() {
        return Err(Error::Config(
            "--metrics-cert-file/--metrics-key-file need --metrics-auth=kubernetes (none serves plain HTTP)".into(),
        ));
    }
    // Built before binding: a bad certificate fails start-up, not the first scrape.
    let tls = match opts.auth {
        MetricsAuth::Kubernetes => Some(server_config(&opts.cert_source())?),
        MetricsAuth::None => None,
    };
    let listener = TcpListener::bind(opts.addr).await.map_err(|e| {
        Error::Config(format!(
            "cannot listen on --metrics-addr {}: {e}",
            opts.addr
        ))
    })?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Config(format!("metrics address: {e}")))?;
    match tls {
        Some(tls) => {
            let auth = Arc::new(Authorizer::new(client, CachePolicy::default()));
            let app = Router::new()
                .route("/metrics", get(checked_metrics))
                .with_state(auth);
            tokio::spawn(serve_tls(listener, tls, app));
        }
        None => {
            if !bound.ip().is_loopback() {
                tracing::warn!(addr = %bound, "/metrics is served without authentication on a non-loopback address");
            }
            let app = Router::new().route("/metrics", get(metrics));
            tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, app).await {
                    tracing::error!(error = %e, "metrics server failed");
                }
            });
        }
    }
    let scheme = if opts.auth == MetricsAuth::Kubernetes {
        "https"
    } else {
        "http"
    };
    tracing::info!(addr = %bound, scheme, auth = ?opts.auth, "metrics server listening");
    Ok(bound)
}

/// Accepts TLS connections and serves HTTP/1.1 on each, a bounded number at a time.
async fn serve_tls(listener: TcpListener, tls: Arc<rustls::ServerConfig>, app: Router) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: pause rather than spin.
                tracing::warn!(error = %e, "metrics server: accept failed");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    return tracing::debug!(%peer, error = %e, "metrics TLS handshake failed");
                }
                Err(_) => return tracing::debug!(%peer, "metrics TLS handshake timed out"),
            };
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HANDSHAKE_TIMEOUT)
                .serve_connection(
                    hyper_util::rt::TokioIo::new(stream),
                    hyper_util::service::TowerToHyperService::new(app),
                );
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "metrics connection ended");
            }
        });
    }
}

fn metrics_body() -> Response {
    let body = crate::metrics::global().render();
    ([(CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body).into_response()
}

async fn metrics() -> Response {
    metrics_body()
}

async fn checked_metrics(State(auth): State<Arc<Authorizer>>, headers: HeaderMap) -> Response {
    let header = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok());
    let Some(token) = bearer_token(header) else {
        return unauthorized("a bearer token is required");
    };
    match auth.check(token).await {
        Ok(Decision::Allowed) => metrics_body(),
        Ok(Decision::Unauthenticated) => unauthorized("the bearer token is not valid"),
        Ok(Decision::Forbidden) => (
            StatusCode::FORBIDDEN,
            "forbidden: the token's user may not get /metrics\n",
        )
            .into_response(),
        Ok(Decision::Throttled) => (
            StatusCode::TOO_MANY_REQUESTS,
            [(RETRY_AFTER, "1")],
            "too many new tokens to review; try again in a second\n",
        )
            .into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot review a /metrics caller's token");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot review the token; see the controller's log\n",
            )
                .into_response()
        }
    }
}

fn unauthorized(why: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(WWW_AUTHENTICATE, "Bearer")],
        format!("unauthorized: {why}\n"),
    )
        .into_response()
}
