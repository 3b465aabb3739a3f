//! A real HTTP receiver for the notifications' tests (tests/notify.rs): it records every request
//! and answers as told, and it can go down (its port refuses connections) and come back on the
//! same port. Its signature check is written apart from the controller's.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, Result};
use base64::Engine as _;
use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use sha2::Sha256;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// One request as received.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    /// The query string, if any.
    pub query: Option<String>,
    /// Header names lower-cased.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    /// The status it was answered with.
    pub status: u16,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    pub fn accepted(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// Whether its Standard Webhooks signature verifies with `key` (raw bytes).
    pub fn signed_with(&self, key: &[u8]) -> bool {
        let (Some(id), Some(ts), Some(sig)) = (
            self.header("webhook-id"),
            self.header("webhook-timestamp"),
            self.header("webhook-signature"),
        ) else {
            return false;
        };
        let Ok(mut mac) = <Hmac<Sha256> as KeyInit>::new_from_slice(key) else {
            return false;
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(ts.as_bytes());
        mac.update(b".");
        mac.update(&self.body);
        let want = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        sig.split(' ').any(|s| s == format!("v1,{want}"))
    }
}

#[derive(Default)]
struct State {
    got: Vec<Received>,
    /// Paths (by prefix) answered with a status other than 200.
    answers: Vec<(String, u16)>,
    /// Paths (by prefix) whose requests are held without an answer (a receiver that hangs).
    hangs: Vec<String>,
}

/// The receiver, serving until dropped or [`Receiver::down`].
pub struct Receiver {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    serving: Option<JoinHandle<()>>,
}

impl Receiver {
    /// Serves on a free loopback port.
    pub async fn start() -> Result<Receiver> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let serving = Some(tokio::spawn(serve(listener, state.clone())));
        Ok(Receiver {
            addr,
            state,
            serving,
        })
    }

    /// `http://127.0.0.1:PORT<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Requests to paths under `prefix` are answered with `status` from now on.
    pub fn answer(&self, prefix: &str, status: u16) {
        let mut s = self.state.lock().unwrap();
        s.answers.retain(|(p, _)| p != prefix);
        s.answers.push((prefix.to_string(), status));
    }

    /// Requests to paths under `prefix` get no answer (held until the client gives up).
    pub fn hang(&self, prefix: &str) {
        self.state.lock().unwrap().hangs.push(prefix.to_string());
    }

    /// Stops serving: the port refuses connections (the open ones are closed).
    pub fn down(&mut self) {
        if let Some(h) = self.serving.take() {
            h.abort();
        }
    }

    /// Serves again, on the same port.
    pub async fn up(&mut self) -> Result<()> {
        if self.serving.is_some() {
            return Ok(());
        }
        // The aborted task's listener is closed once the task is dropped; try for a while.
        let mut last = None;
        for _ in 0..50 {
            match TcpListener::bind(self.addr).await {
                Ok(l) => {
                    self.serving = Some(tokio::spawn(serve(l, self.state.clone())));
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Err(last.unwrap()).context("binding the receiver's port again")
    }

    /// Every request so far, in order.
    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().got.clone()
    }

    /// The requests to paths under `prefix`.
    pub fn under(&self, prefix: &str) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.path.starts_with(prefix))
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.down();
    }
}

async fn serve(listener: TcpListener, state: Arc<Mutex<State>>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        // Owned by this task: aborting it closes every connection (a receiver that went down).
        conns.spawn(async move {
            let svc = service_fn(move |req| handle(req, state.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
        while conns.try_join_next().is_some() {}
    }
}

async fn handle(
    req: hyper::Request<hyper::body::Incoming>,
    state: Arc<Mutex<State>>,
) -> Result<hyper::Response<Full<Bytes>>, hyper::Error> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                v.to_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let body = req.into_body().collect().await?.to_bytes().to_vec();
    let hangs = state
        .lock()
        .unwrap()
        .hangs
        .iter()
        .any(|p| path.starts_with(p.as_str()));
    if hangs {
        // Recorded, never answered: the client's timeout ends it.
        state.lock().unwrap().got.push(Received {
            path,
            query,
            headers,
            body,
            status: 0,
        });
        std::future::pending::<()>().await;
        unreachable!("a pending future never completes");
    }
    let mut s = state.lock().unwrap();
    let status = s
        .answers
        .iter()
        .find(|(p, _)| path.starts_with(p.as_str()))
        .map_or(200, |(_, st)| *st);
    s.got.push(Received {
        path,
        query,
        headers,
        body,
        status,
    });
    let mut resp = hyper::Response::new(Full::new(Bytes::from_static(b"ok")));
    *resp.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    Ok(resp)
}
