//! A controller's `/metrics` and probes as tests read them: the addresses it logged, a minimal
//! HTTP(S) client (no HTTP library for one GET), and lookups in the OpenMetrics text.

use std::time::Duration;

use anyhow::{Context as _, Result};

/// The address in a "health server listening" log line, human (`addr=...`, with or without ANSI
/// colours) or JSON (`"addr":"..."`).
pub fn health_addr_in(log: &str) -> Option<std::net::SocketAddr> {
    addr_in(log, "health server listening")
}

/// The address in a "metrics server listening" log line (the `/metrics` port).
pub fn metrics_addr_in(log: &str) -> Option<std::net::SocketAddr> {
    addr_in(log, "metrics server listening")
}

fn addr_in(log: &str, message: &str) -> Option<std::net::SocketAddr> {
    let line = strip_ansi(log.lines().find(|l| l.contains(message))?);
    let rest = line
        .split_once("\"addr\":\"")
        .or_else(|| line.split_once("addr="))?
        .1;
    rest.split(|c: char| c == '"' || c.is_whitespace())
        .next()?
        .parse()
        .ok()
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-byte (a letter).
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// An HTTP response as [`http_get`] reads it.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == &name.to_ascii_lowercase())
            .map(|(_, v)| v.as_str())
    }
}

/// GET `path` on `addr`: a minimal HTTP/1.1 client (`Connection: close`, no chunked bodies),
/// bounded to 5 s.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> Result<HttpResponse> {
    let fetch = async {
        let s = tokio::net::TcpStream::connect(addr).await?;
        exchange(s, addr, path, None).await
    };
    let raw = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .with_context(|| format!("GET {path} on {addr} timed out"))??;
    parse(&raw)
}

/// GET `path` on `addr` over TLS, with `Authorization: Bearer <token>` when given. The server's
/// certificate is not verified: the controller's default one is self-signed, made at start-up
/// (controller/src/endpoints/tls.rs has the test that a given certificate is served).
pub async fn https_get(
    addr: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> Result<HttpResponse> {
    let fetch = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let connector = tokio_rustls::TlsConnector::from(crate::tls::no_verification()?);
        let name = rustls::pki_types::ServerName::try_from("localhost")?;
        let s = connector.connect(name, tcp).await?;
        exchange(s, addr, path, token).await
    };
    let raw = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .with_context(|| format!("GET https://{addr}{path} timed out"))??;
    parse(&raw)
}

async fn exchange<S>(
    mut s: S,
    addr: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> Result<String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut raw = Vec::new();
    // A TLS peer may close without close_notify once the response is complete.
    if let Err(e) = s.read_to_end(&mut raw).await
        && raw.is_empty()
    {
        return Err(e.into());
    }
    Ok(String::from_utf8_lossy(&raw).into_owned())
}

fn parse(raw: &str) -> Result<HttpResponse> {
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .context("no end of HTTP headers")?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .context("no HTTP status")?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(HttpResponse {
        status,
        headers,
        body: body.to_string(),
    })
}

/// The sum of the samples of `name` (the full series name, e.g. `singleton_runs_started_total`)
/// whose labels include every pair of `labels`; 0 when there is none (an absent counter is 0).
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, lbls) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            if n != name {
                return None;
            }
            let have: Vec<(&str, &str)> = lbls
                .split("\",")
                .filter(|p| !p.is_empty())
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    Some((k.trim(), v.trim_matches('"')))
                })
                .collect();
            labels
                .iter()
                .all(|want| have.contains(want))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}
