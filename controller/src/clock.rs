//! Which clock is trusted. The controller decides "is this period due?" with its own clock, but the
//! Job's creation time is stamped by the API server. If the two disagree by more than a bound, a
//! run could start before its instant by the API server's clock, so no run starts (G4) until they
//! agree again. The API server's time comes from the `Date` header of its responses (1 s
//! resolution, hence a bound of a few seconds).

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use kube::Client;
use tokio::sync::watch;

/// The latest comparison of the local clock with the API server's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClockState {
    /// API server time minus local time (positive: the server is ahead), if measured.
    pub offset: Option<SignedDuration>,
    /// Whether runs may start.
    pub trusted: bool,
}

impl ClockState {
    /// Before the first measurement, trust nothing.
    pub const UNKNOWN: ClockState = ClockState {
        offset: None,
        trusted: false,
    };
}

/// Judges an offset measured over a request that took `rtt`: the `Date` header was produced at an
/// unknown moment within the request, and is truncated to the second.
pub fn judge(
    server: Timestamp,
    sent: Timestamp,
    received: Timestamp,
    bound: SignedDuration,
) -> ClockState {
    // The server stamped a time in [sent, received] by our clock, truncated down to a second.
    let lo = server.duration_since(received); // the least offset consistent with the reading
    let hi = (server + SignedDuration::from_secs(1)).duration_since(sent); // the greatest
    let offset = if lo > SignedDuration::ZERO {
        lo
    } else if hi < SignedDuration::ZERO {
        hi
    } else {
        SignedDuration::ZERO
    };
    ClockState {
        offset: Some(offset),
        trusted: offset.abs() <= bound,
    }
}

/// Measures the offset once, by a `GET /version`.
pub async fn measure(client: &Client, bound: SignedDuration) -> Option<ClockState> {
    let req = http::Request::get("/version").body(Vec::new()).ok()?;
    let sent = Timestamp::now();
    let resp = client.send(req.map(Into::into)).await.ok()?;
    let received = Timestamp::now();
    let date = resp.headers().get(http::header::DATE)?.to_str().ok()?;
    let server = jiff::fmt::rfc2822::parse(date).ok()?.timestamp();
    let state = judge(server, sent, received, bound);
    crate::metrics::global().clock_offset(state.offset);
    Some(state)
}

/// Keeps `tx` up to date, measuring every `every`. A failed measurement keeps the last verdict:
/// an unreachable API server stops runs anyway (every run starts with a write to it).
pub async fn watch_clock(
    client: Client,
    bound: SignedDuration,
    every: Duration,
    tx: watch::Sender<ClockState>,
) {
    loop {
        let measured = measure(&client, bound).await;
        if let Some(state) = measured {
            if !state.trusted {
                tracing::warn!(
                    offset_ms = state.offset.map(|o| o.as_millis()),
                    "local clock disagrees with the API server; runs paused"
                );
            }
            tx.send_if_modified(|old| {
                let changed = old.trusted != state.trusted;
                *old = state;
                changed
            });
        }
        // Until a first verdict exists no run may start, so retry quickly rather than wait a period.
        let unknown = tx.borrow().offset.is_none();
        let pause = if measured.is_none() && unknown {
            Duration::from_secs(1).min(every)
        } else {
            every
        };
        tokio::time::sleep(pause).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn agreeing_clocks_are_trusted_despite_date_truncation() {
        let bound = SignedDuration::from_secs(2);
        let s = judge(
            ts("2027-01-01T00:00:00Z"),
            ts("2027-01-01T00:00:00.700Z"),
            ts("2027-01-01T00:00:00.900Z"),
            bound,
        );
        assert_eq!(s.offset, Some(SignedDuration::ZERO));
        assert!(s.trusted);
    }

    #[test]
    fn a_server_far_ahead_or_behind_is_not_trusted() {
        let bound = SignedDuration::from_secs(2);
        let ahead = judge(
            ts("2027-01-01T00:00:10Z"),
            ts("2027-01-01T00:00:00Z"),
            ts("2027-01-01T00:00:00.100Z"),
            bound,
        );
        assert!(!ahead.trusted);
        assert!(ahead.offset.unwrap() > SignedDuration::from_secs(9));
        let behind = judge(
            ts("2027-01-01T00:00:00Z"),
            ts("2027-01-01T00:00:30Z"),
            ts("2027-01-01T00:00:30.100Z"),
            bound,
        );
        assert!(!behind.trusted);
        assert!(behind.offset.unwrap() < SignedDuration::from_secs(-28));
    }
}
