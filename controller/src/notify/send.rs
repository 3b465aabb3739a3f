//! One POST to a receiver, with a timeout: hyper's client over rustls (ring, like the rest of
//! the process) trusting the system's CA certificates.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::format::Request;

/// How long one try waits for the receiver's answer.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The client every delivery shares (its connection pool).
pub struct Http(Client<HttpsConnector<HttpConnector>, Full<Bytes>>);

impl Http {
    /// The client; an error (no TLS configuration) is said in every try's error.
    pub fn new() -> Result<Http, String> {
        let mut roots = rustls::RootCertStore::empty();
        // Without system CA certificates, https:// receivers fail (said in each try's error);
        // http:// ones still work.
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let https = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Http(Client::builder(TokioExecutor::new()).build(https)))
    }

    /// Sends `req` with `headers`; Ok on a 2xx answer. The error never holds the URL (it may be
    /// a credential) or the answer's body.
    pub async fn post(
        &self,
        req: &Request,
        headers: &[(&'static str, String)],
    ) -> Result<(), String> {
        let mut b = http::Request::post(&req.url)
            .header(http::header::CONTENT_TYPE, req.content_type)
            .header(
                http::header::USER_AGENT,
                concat!("singleton-controller/", env!("CARGO_PKG_VERSION")),
            );
        for (k, v) in headers {
            b = b.header(*k, v);
        }
        let r = b
            .body(Full::new(Bytes::from(req.body.clone())))
            .map_err(|_| "the URL is not a valid http:// or https:// URL".to_string())?;
        let answer = tokio::time::timeout(TIMEOUT, self.0.request(r))
            .await
            .map_err(|_| format!("no answer within {} s", TIMEOUT.as_secs()))?
            .map_err(|e| describe(&e))?;
        let status = answer.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("the receiver answered HTTP {}", status.as_u16()))
        }
    }
}

/// A connection error in words, without the URL: the chain of sources' messages.
fn describe(e: &hyper_util::client::legacy::Error) -> String {
    let mut text = if e.is_connect() {
        "could not connect".to_string()
    } else {
        "the request failed".to_string()
    };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
