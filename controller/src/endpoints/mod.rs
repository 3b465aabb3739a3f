//! The probes, `/healthz` and `/readyz`, on the health port (plain HTTP: the kubelet sends no
//! credentials, and they say only whether this replica is alive and useful); and, on a port of
//! its own, `/metrics` with authentication ([`metrics`]).
//!
//! - `/healthz` (liveness): 200 while the elector's loop turns, as leader or standby: its last
//!   turn is more recent than one lease duration plus one renew deadline (the longest a healthy
//!   loop waits: a standby's retry, a leader's renew interval, plus one bounded request). A
//!   wedged loop makes the kubelet restart the pod. In single-replica mode: 200 while the process
//!   serves.
//! - `/readyz` (readiness): 200 when this replica is useful in its role: the leader while it may
//!   act, and a standby once its Lease watch has listed the Lease and is not failing, so it will
//!   see a release or an expiry at once. Standbys are ready on purpose: a rolling update waits for
//!   new pods to be ready, and would stall if only the leader could be. 503 while stepping down
//!   (draining before a release) and after leadership is lost. Readiness does not wait for the
//!   controller's caches: a standby's warm up behind the closed gate (see [`crate::replica`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::lease::{ElectionState, Role};
use crate::{Error, Result};

pub mod auth;
pub mod metrics;
pub mod tls;

pub use metrics::{MetricsAuth, MetricsOptions};

/// Where the verdicts come from.
#[derive(Clone)]
pub enum HealthSource {
    /// Single-replica mode: alive and ready while the process serves.
    Always,
    /// An elector's published state; a heartbeat older than `stale_after` means a wedged loop.
    Election {
        state: watch::Receiver<ElectionState>,
        stale_after: Duration,
    },
}

/// A probe's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub ok: bool,
    pub reason: String,
}

fn verdict(ok: bool, reason: impl Into<String>) -> Verdict {
    Verdict {
        ok,
        reason: reason.into(),
    }
}

/// Liveness of an elector in `state` at `now`.
pub fn live(state: &ElectionState, stale_after: Duration, now: Instant) -> Verdict {
    let age = now.saturating_duration_since(state.heartbeat);
    if state.role == Role::Stopped {
        verdict(false, "elector stopped")
    } else if age > stale_after {
        verdict(false, format!("elector loop silent for {age:?}"))
    } else {
        verdict(true, format!("{:?}", state.role))
    }
}

/// Readiness of an elector in `state` at `now`.
pub fn ready(state: &ElectionState, stale_after: Duration, now: Instant) -> Verdict {
    let alive = live(state, stale_after, now);
    if !alive.ok {
        return alive;
    }
    match state.role {
        Role::Leader => verdict(true, format!("leading, epoch {}", state.epoch)),
        Role::Standby if state.watching => verdict(
            true,
            format!("standby, watching the lease (holder {:?})", state.holder),
        ),
        Role::Standby => verdict(false, "standby, lease watch not established"),
        Role::SteppingDown => verdict(false, "stepping down"),
        Role::Stopped => verdict(false, "stopped"),
    }
}

impl HealthSource {
    fn check(&self, readiness: bool) -> Verdict {
        match self {
            HealthSource::Always => verdict(true, "single replica"),
            HealthSource::Election { state, stale_after } => {
                let s = state.borrow();
                if readiness {
                    ready(&s, *stale_after, Instant::now())
                } else {
                    live(&s, *stale_after, Instant::now())
                }
            }
        }
    }
}

fn respond(v: Verdict) -> (StatusCode, String) {
    let code = if v.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, format!("{}\n", v.reason))
}

async fn healthz(State(src): State<Arc<HealthSource>>) -> (StatusCode, String) {
    respond(src.check(false))
}

async fn readyz(State(src): State<Arc<HealthSource>>) -> (StatusCode, String) {
    respond(src.check(true))
}

/// Binds `addr` and serves the probes in the background; returns the bound address (useful
/// with port 0).
pub async fn serve(addr: SocketAddr, src: HealthSource) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Config(format!("cannot listen on --health-addr {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| Error::Config(format!("health address: {e}")))?;
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Arc::new(src));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "health server failed");
        }
    });
    tracing::info!(addr = %bound, "health server listening");
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{HealthSource, live, ready, serve};
    use crate::lease::{ElectionState, Role};

    fn state(role: Role, watching: bool, heartbeat: Instant) -> ElectionState {
        ElectionState {
            role,
            holder: "x".into(),
            epoch: 3,
            expires: None,
            watching,
            heartbeat,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn health_verdicts_for_each_role() {
        let now = Instant::now();
        let stale = Duration::from_secs(25);
        let check = |role, watching| {
            let s = state(role, watching, now);
            (live(&s, stale, now).ok, ready(&s, stale, now).ok)
        };
        assert_eq!(check(Role::Leader, true), (true, true));
        assert_eq!(
            check(Role::Standby, true),
            (true, true),
            "a watching standby is ready"
        );
        assert_eq!(check(Role::Standby, false), (true, false));
        assert_eq!(check(Role::SteppingDown, true), (true, false));
        assert_eq!(check(Role::Stopped, true), (false, false));
        let wedged = state(Role::Leader, true, now);
        let later = now + stale + Duration::from_millis(1);
        assert!(
            !live(&wedged, stale, later).ok,
            "a silent loop is not alive"
        );
        assert!(!ready(&wedged, stale, later).ok);
    }

    /// The probes over real HTTP, following an elector's state.
    #[tokio::test]
    async fn health_server_serves_the_elector_state() {
        let (tx, rx) = tokio::sync::watch::channel(state(Role::Standby, false, Instant::now()));
        let addr = serve(
            "127.0.0.1:0".parse().unwrap(),
            HealthSource::Election {
                state: rx,
                stale_after: Duration::from_secs(60),
            },
        )
        .await
        .unwrap();
        assert_eq!(get(addr, "/healthz").await, 200);
        assert_eq!(get(addr, "/readyz").await, 503, "watch not established");
        tx.send_replace(state(Role::Standby, true, Instant::now()));
        assert_eq!(get(addr, "/readyz").await, 200);
        tx.send_replace(state(Role::Leader, true, Instant::now()));
        assert_eq!(get(addr, "/readyz").await, 200);
        tx.send_replace(state(Role::SteppingDown, true, Instant::now()));
        assert_eq!(get(addr, "/readyz").await, 503);
        assert_eq!(get(addr, "/healthz").await, 200);
        tx.send_replace(state(Role::Stopped, true, Instant::now()));
        assert_eq!(get(addr, "/healthz").await, 503);
    }

    /// A minimal HTTP/1.1 GET; returns the status code.
    async fn get(addr: std::net::SocketAddr, path: &str) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}
