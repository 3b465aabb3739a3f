//! Which clock is trusted. The controller decides "is this period due?" with its own clock, but the
//! Job's creation time is stamped by the API server. If the two disagree by more than a bound, a
//! run could start before its instant by the API server's clock, so no run starts (G4) until they
//! agree again. The API server's time comes from the `Date` header of its responses (1 s
//! resolution, hence a bound of a few seconds): of any quick response the controller gets anyway
//! (Lease renewals, runs), and of a `GET /version` when a run may start and no verdict is recent.
//! So nothing is sent at rest, and a run is never decided on a verdict older than
//! `--clock-check-seconds`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

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

/// Where the verdicts go: the watch channel every reconcile reads, fed by the `Date` header of
/// any quick enough API response (see [`Samples::layer`]) and by [`Clock::fresh`]'s own check.
#[derive(Clone, Debug)]
pub struct Samples {
    inner: Arc<SamplesInner>,
}

#[derive(Debug)]
struct SamplesInner {
    bound: SignedDuration,
    tx: watch::Sender<ClockState>,
    /// When the last verdict was formed, by the monotonic clock.
    at: Mutex<Option<Instant>>,
}

/// A response that took longer than this says too little about the offset (the `Date` was
/// stamped somewhere inside the round trip): it is not used as a passive sample.
const PASSIVE_MAX_RTT: SignedDuration = SignedDuration::from_millis(500);

impl Samples {
    /// No verdict yet: runs wait for the first one.
    pub fn new(bound: SignedDuration) -> Self {
        Samples {
            inner: Arc::new(SamplesInner {
                bound,
                tx: watch::channel(ClockState::UNKNOWN).0,
                at: Mutex::new(None),
            }),
        }
    }

    /// The verdicts as they change.
    pub fn subscribe(&self) -> watch::Receiver<ClockState> {
        self.inner.tx.subscribe()
    }

    /// The latest verdict.
    pub fn current(&self) -> ClockState {
        *self.inner.tx.borrow()
    }

    fn age(&self) -> Option<Duration> {
        let at = *self.inner.at.lock().unwrap_or_else(PoisonError::into_inner);
        at.map(|t| t.elapsed())
    }

    /// Records one reading of the server's `Date` header taken over `[sent, received]`.
    fn observe(&self, date: &http::HeaderValue, sent: Timestamp, received: Timestamp) -> bool {
        let Some(server) = date
            .to_str()
            .ok()
            .and_then(|d| jiff::fmt::rfc2822::parse(d).ok())
        else {
            return false;
        };
        let state = judge(server.timestamp(), sent, received, self.inner.bound);
        *self.inner.at.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        crate::metrics::global().clock_offset(state.offset);
        let turned = self.inner.tx.send_if_modified(|old| {
            let changed = old.trusted != state.trusted;
            *old = state;
            changed
        });
        // Once when it turns, not at every response (each is a sample now).
        if turned && !state.trusted {
            tracing::warn!(
                offset_ms = state.offset.map(|o| o.as_millis()),
                "local clock disagrees with the API server; runs paused"
            );
        }
        true
    }

    /// A client whose every quick response is a clock sample: while this replica talks to the
    /// API server anyway (Lease renewals, runs), the verdict stays fresh at no extra request.
    pub async fn client(&self) -> kube::Result<Client> {
        let config = kube::Config::infer()
            .await
            .map_err(kube::Error::InferConfig)?;
        Ok(kube::client::ClientBuilder::try_from(config)?
            .with_layer(&self.layer())
            .build())
    }

    /// The layer that feeds this from the responses of the service below it.
    pub fn layer(&self) -> SampleLayer {
        SampleLayer(self.clone())
    }
}

/// See [`Samples::layer`].
#[derive(Clone, Debug)]
pub struct SampleLayer(Samples);

impl<S> tower::Layer<S> for SampleLayer {
    type Service = Sampled<S>;
    fn layer(&self, inner: S) -> Sampled<S> {
        Sampled {
            inner,
            samples: self.0.clone(),
        }
    }
}

/// A service whose responses' `Date` headers are clock samples.
#[derive(Clone, Debug)]
pub struct Sampled<S> {
    inner: S,
    samples: Samples,
}

impl<S, Req, B> tower::Service<Req> for Sampled<S>
where
    S: tower::Service<Req, Response = http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let sent = Timestamp::now();
        let fut = self.inner.call(req);
        let samples = self.samples.clone();
        Box::pin(async move {
            let resp = fut.await;
            let received = Timestamp::now();
            if let Ok(r) = &resp
                && received.duration_since(sent) <= PASSIVE_MAX_RTT
                && let Some(date) = r.headers().get(http::header::DATE)
            {
                samples.observe(date, sent, received);
            }
            resp
        })
    }
}

/// The verdict on demand. Nothing is measured at rest: a verdict is needed only when a reconcile
/// may start a run, and is then at most `max_age` old (the API server's responses refresh it as
/// a side effect; when none came, one `GET /version` does).
pub struct Clock {
    samples: Samples,
    client: Client,
    max_age: Duration,
    /// One check at a time: a burst of reconciles shares it. Holds when the last one failed.
    checking: tokio::sync::Mutex<Option<Instant>>,
    /// The instants (whole seconds) a check is prepared for; see [`Clock::prepare`].
    prepared: Mutex<std::collections::BTreeSet<i64>>,
}

/// How long before a due instant [`Clock::prepare`] compares the clocks.
const PREPARE_LEAD: SignedDuration = SignedDuration::from_secs(1);

/// Instants further away than this are not prepared for (their reconcile comes again before).
const PREPARE_HORIZON: SignedDuration = SignedDuration::from_mins(10);

/// While the clocks disagree, or before a first verdict, how stale a verdict may be; also how
/// long after a failed check the next one is tried.
const UNTRUSTED_MAX_AGE: Duration = Duration::from_secs(1);

/// A check that has not answered by then has failed (its verdict would say little anyway).
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

impl Clock {
    pub fn new(samples: Samples, client: Client, max_age: Duration) -> Self {
        Clock {
            samples,
            client,
            max_age,
            checking: tokio::sync::Mutex::new(None),
            prepared: Mutex::default(),
        }
    }

    /// The verdicts as they change.
    pub fn subscribe(&self) -> watch::Receiver<ClockState> {
        self.samples.subscribe()
    }

    fn stale(&self) -> bool {
        let max_age = if self.samples.current().trusted {
            self.max_age
        } else {
            UNTRUSTED_MAX_AGE.min(self.max_age)
        };
        self.samples.age().is_none_or(|age| age > max_age)
    }

    /// A verdict at most `max_age` old (1 s while not trusted), checking now if there is none. A
    /// failed check keeps the last verdict and is retried a second later, not by every waiting
    /// reconcile in turn: an unreachable API server stops runs anyway (every run starts with a
    /// write to it).
    pub async fn fresh(&self) -> ClockState {
        if self.stale() {
            let mut failed_at = self.checking.lock().await;
            // Another reconcile may have checked, or failed to, while this one waited.
            let failed_just_now = failed_at.is_some_and(|t| t.elapsed() < UNTRUSTED_MAX_AGE);
            if self.stale() && !failed_just_now {
                let ok = tokio::time::timeout(CHECK_TIMEOUT, self.check()).await;
                *failed_at = (ok != Ok(true)).then(Instant::now);
            }
        }
        self.samples.current()
    }

    /// Makes sure a verdict is fresh a second before `at`, when a run falls due: otherwise the
    /// first run after a quiet spell would ask for one at its instant, and, the idle connection to
    /// the API server having been closed meanwhile, pay a TLS handshake as well (60 ms instead
    /// of 15 in `make bench`). One check per instant however many runs share it; nothing when a
    /// recent response already gave a verdict.
    pub fn prepare(self: &Arc<Self>, at: Timestamp) {
        let lead = at.duration_since(Timestamp::now()) - PREPARE_LEAD;
        if lead <= SignedDuration::ZERO || lead > PREPARE_HORIZON {
            return;
        }
        let second = at.as_second();
        if !self
            .prepared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(second)
        {
            return;
        }
        let clock = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(lead.unsigned_abs()).await;
            clock
                .prepared
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&second);
            clock.fresh().await;
        });
    }

    /// One `GET /version`, its `Date` header judged whatever the round trip took.
    async fn check(&self) -> bool {
        let Ok(req) = http::Request::get("/version").body(Vec::new()) else {
            return false;
        };
        let sent = Timestamp::now();
        let Ok(resp) = self.client.send(req.map(Into::into)).await else {
            return false;
        };
        let received = Timestamp::now();
        resp.headers()
            .get(http::header::DATE)
            .is_some_and(|date| self.samples.observe(date, sent, received))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use http::{Request, Response};
    use kube::client::Body;
    use tower::Layer;

    /// A fake API server whose `Date` is `ahead` of ours (no `Date` and a 503 for None),
    /// answering after `delay` (real time); it records the path of each request.
    fn fake_server(
        ahead: Option<SignedDuration>,
        delay: Duration,
    ) -> (Client, Samples, Arc<Mutex<Vec<String>>>) {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let samples = Samples::new(SignedDuration::from_secs(2));
        let client = Client::new(samples.layer().layer(mock), "default");
        let paths = Arc::new(Mutex::new(Vec::new()));
        let p = paths.clone();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                p.lock().unwrap().push(req.uri().path().to_string());
                std::thread::sleep(delay);
                let resp = match ahead {
                    Some(ahead) => Response::builder()
                        .header(
                            http::header::DATE,
                            jiff::fmt::rfc2822::DateTimePrinter::new()
                                .timestamp_to_rfc9110_string(&(Timestamp::now() + ahead))
                                .unwrap(),
                        )
                        .body(Body::from(br#"{"major":"1","minor":"37"}"#.to_vec())),
                    None => Response::builder().status(503).body(Body::empty()),
                };
                send.send_response(resp.unwrap());
            }
        });
        (client, samples, paths)
    }

    fn server(ahead: SignedDuration) -> (Client, Samples, Arc<Mutex<Vec<String>>>) {
        fake_server(Some(ahead), Duration::ZERO)
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_check_is_retried_a_second_later_not_by_every_waiting_reconcile() {
        let (client, samples, paths) = fake_server(None, Duration::ZERO);
        let clock = Clock::new(samples, client, Duration::from_secs(30));
        let verdicts = futures::future::join_all((0..20).map(|_| clock.fresh())).await;
        assert!(verdicts.iter().all(|v| *v == ClockState::UNKNOWN));
        assert_eq!(paths.lock().unwrap().len(), 1);
        tokio::time::advance(Duration::from_millis(1100)).await;
        clock.fresh().await;
        assert_eq!(paths.lock().unwrap().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_sent_while_a_verdict_is_recent_and_one_check_serves_a_burst() {
        let (client, samples, paths) = server(SignedDuration::ZERO);
        let clock = Clock::new(samples, client, Duration::from_secs(30));
        // A burst of reconciles with no verdict yet: one check for all of them.
        let verdicts = futures::future::join_all((0..20).map(|_| clock.fresh())).await;
        assert!(verdicts.iter().all(|v| v.trusted), "{verdicts:?}");
        assert_eq!(*paths.lock().unwrap(), ["/version"]);
        // At rest (or within 30 s) nothing more.
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(clock.fresh().await.trusted);
        assert_eq!(paths.lock().unwrap().len(), 1);
        // Older than 30 s: checked again before it is used.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(clock.fresh().await.trusted);
        assert_eq!(paths.lock().unwrap().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn any_quick_response_is_a_sample() {
        let (client, samples, paths) = server(SignedDuration::ZERO);
        let clock = Clock::new(samples.clone(), client.clone(), Duration::from_secs(30));
        assert_eq!(samples.current(), ClockState::UNKNOWN);
        // A request the controller makes anyway (here: a Lease read) forms the verdict...
        let req = Request::get("/apis/coordination.k8s.io/v1/namespaces/x/leases/y")
            .body(Vec::new())
            .unwrap();
        client.send(req.map(Into::into)).await.unwrap();
        assert!(samples.current().trusted);
        // ...so deciding a run sends nothing of its own.
        assert!(clock.fresh().await.trusted);
        assert_eq!(paths.lock().unwrap().len(), 1);
        assert_eq!(
            paths.lock().unwrap()[0],
            "/apis/coordination.k8s.io/v1/namespaces/x/leases/y"
        );
    }

    #[tokio::test]
    async fn a_slow_response_is_no_sample_but_a_check_is_judged_whatever_its_round_trip() {
        let (client, samples, paths) =
            fake_server(Some(SignedDuration::ZERO), Duration::from_millis(600));
        let req = Request::get("/api/v1/namespaces").body(Vec::new()).unwrap();
        client.send(req.map(Into::into)).await.unwrap();
        assert_eq!(samples.current(), ClockState::UNKNOWN);
        let clock = Clock::new(samples.clone(), client, Duration::from_secs(30));
        assert!(clock.fresh().await.trusted);
        assert_eq!(paths.lock().unwrap().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_due_instant_is_prepared_for_a_second_before_once_for_all_its_runs() {
        let (client, samples, paths) = server(SignedDuration::ZERO);
        let clock = Arc::new(Clock::new(samples, client, Duration::from_secs(30)));
        let at = Timestamp::now() + SignedDuration::from_secs(5);
        for _ in 0..10 {
            clock.prepare(at);
        }
        // Too far or past: nothing.
        clock.prepare(Timestamp::now() + SignedDuration::from_hours(1));
        clock.prepare(Timestamp::now() - SignedDuration::from_secs(1));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(paths.lock().unwrap().is_empty(), "not before its time");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(*paths.lock().unwrap(), ["/version"]);
        // At the instant the verdict is fresh: the run itself asks for nothing.
        assert!(clock.fresh().await.trusted);
        assert_eq!(paths.lock().unwrap().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_disagreeing_server_is_rechecked_every_second_not_every_thirty() {
        let (client, samples, paths) = server(SignedDuration::from_secs(40));
        let clock = Clock::new(samples.clone(), client, Duration::from_secs(30));
        let v = clock.fresh().await;
        assert!(!v.trusted);
        assert!(v.offset.unwrap() > SignedDuration::from_secs(38), "{v:?}");
        tokio::time::advance(Duration::from_millis(1100)).await;
        assert!(!clock.fresh().await.trusted);
        assert_eq!(paths.lock().unwrap().len(), 2);
    }

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
