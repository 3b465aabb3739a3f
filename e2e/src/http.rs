//! A controller's `/metrics` and probes as tests read them: the address it logged, a minimal
//! HTTP client (no HTTP library for one GET), and lookups in the OpenMetrics text.

use std::time::Duration;

use anyhow::{Context as _, Result};

/// The address in a "health server listening" log line, human (`addr=...`, with or without ANSI
/// colours) or JSON (`"addr":"..."`).
pub fn health_addr_in(log: &str) -> Option<std::net::SocketAddr> {
    let line = strip_ansi(
        log.lines()
            .find(|l| l.contains("health server listening"))?,
    );
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await?;
        anyhow::Ok(String::from_utf8_lossy(&raw).into_owned())
    };
    let raw = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .with_context(|| format!("GET {path} on {addr} timed out"))??;
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
