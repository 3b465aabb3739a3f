//! `/healthz`, `/readyz`, and `/metrics` (OpenMetrics text of [`crate::metrics::global`]).
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
//!   (draining before a release) and after leadership is lost. The controller's own caches start
//!   on the leader only (see [`super::replica`]), so there is no standby cache to wait for.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::sync::watch;
use tokio::time::Instant;

use super::elector::{ElectionState, Role};
use crate::{Error, Result};

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

async fn metrics() -> ([(axum::http::header::HeaderName, &'static str); 1], String) {
    let body = crate::metrics::global().render();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            crate::metrics::CONTENT_TYPE,
        )],
        body,
    )
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
        .route("/metrics", get(metrics))
        .with_state(Arc::new(src));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "health server failed");
        }
    });
    tracing::info!(addr = %bound, "health server listening");
    Ok(bound)
}
