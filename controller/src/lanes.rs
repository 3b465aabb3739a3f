//! Which of the controller's API requests go first when many wait.
//!
//! In a burst of due periods every run needs a claim (a status write) and a create before its Job
//! exists, and then a confirm (a second status write) and an Event that nobody waits for. Sent in
//! the order reconciles reach them, the confirms and Events of the first runs took the API
//! server's time from the claims and creates of the last ones: the last Job of a burst of 1,000
//! waited for 4,000 requests. Here at most [`IN_FLIGHT`] requests are in flight, and a free slot
//! goes to the waiting request of the most urgent lane: creates (a claimed run's Job) before
//! claims (a due period's run) before everything else. The last Job of a burst then waits only for
//! the claims and creates.
//!
//! Hand-written because tokio's semaphore is FIFO only and no well-kept crate offers an async
//! semaphore with priorities; it is a queue per lane and a counter.
//!
//! The lanes also measure the rate the API server sustains ([`Lanes::sustained_rate`]): the
//! requests completed per second while some request waited for a slot. Only then does the count
//! say how fast the API server goes; in a quiet second it says how little there was to do.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

/// Requests in flight to the API server at most, across all lanes. Enough to keep the API server
/// busy (a run spends about half its time between requests, and other runs fill the gap), few
/// enough that a Lease renewal, which does not queue here, is not stuck behind a burst.
pub const IN_FLIGHT: usize = 64;

/// How urgent a request is, most urgent first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Between a written claim and its Job: the create, a re-read before it, deleting the Jobs it
    /// replaces or a duplicate it must remove.
    Create = 0,
    /// A claim: the write that starts a due run.
    Claim = 1,
    /// Work ahead of an instant (issue 33): a period's claim, create and confirm before it is
    /// due, after every request a due run waits for.
    Prepare = 2,
    /// Everything nobody is waiting on: confirms, outcomes, conditions, Events, dry runs, pruning.
    Background = 3,
}

const LANES: usize = 4;

#[derive(Debug)]
struct State {
    capacity: usize,
    /// Slots handed out since start (to tell a burst of work from a few runs).
    granted: u64,
    free: usize,
    /// Invariant: a request waits only while `free` is 0.
    waiting: [VecDeque<oneshot::Sender<Permit>>; LANES],
    rate: Rate,
}

impl State {
    fn waits(&self) -> bool {
        self.waiting.iter().any(|q| !q.is_empty())
    }

    /// Closes the seconds of [`Rate`] that ended by `now`.
    fn roll(&mut self, now: Instant) {
        let waits = self.waits();
        self.rate.roll(now, waits);
    }
}

/// The weight a saturated second keeps one second later: a half-life of 60 s.
fn decay() -> f64 {
    0.5f64.powf(1.0 / 60.0)
}

/// Requests completed per second, counted in whole seconds from `since`, and averaged over the
/// saturated ones (a request waited for a slot in them) with a 60 s half-life.
#[derive(Debug)]
struct Rate {
    /// Start of the second being counted.
    since: Instant,
    /// Requests completed in it.
    done: u64,
    /// Whether a request waited for a slot in it.
    saturated: bool,
    /// The saturated seconds' counts and their weights, each decayed per saturated second after
    /// it: their quotient is the average, biased towards no starting value.
    sum: f64,
    weight: f64,
}

impl Rate {
    fn new(now: Instant) -> Self {
        Rate {
            since: now,
            done: 0,
            saturated: false,
            sum: 0.0,
            weight: 0.0,
        }
    }

    /// Ends the seconds past by `now`; `waits`: requests wait now, and have since the last
    /// change (nothing completed or arrived in between).
    fn roll(&mut self, now: Instant, waits: bool) {
        let past = now.saturating_duration_since(self.since).as_secs();
        if past == 0 {
            return;
        }
        if self.saturated {
            self.fold(self.done as f64, 1);
        }
        // Whole seconds in which requests waited and none completed: the API server stalled, and
        // that counts (at 0). Quiet seconds are left out: they say nothing of its speed.
        if waits && past > 1 {
            self.fold(0.0, past - 1);
        }
        self.since += Duration::from_secs(past);
        self.done = 0;
        self.saturated = waits;
    }

    /// Adds `seconds` saturated seconds that each completed `count` requests.
    fn fold(&mut self, count: f64, seconds: u64) {
        let kept = decay().powf(seconds as f64);
        // The sum of the weights of `seconds` new samples: 1 + d + ... + d^(seconds - 1).
        let added = (1.0 - kept) / (1.0 - decay());
        self.sum = self.sum * kept + count * added;
        self.weight = self.weight * kept + added;
    }

    fn average(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| self.sum / self.weight)
    }
}

/// The limiter; cheap to clone (shared state).
#[derive(Clone, Debug)]
pub struct Lanes {
    state: Arc<Mutex<State>>,
    quiet: Arc<Notify>,
}

/// A slot in flight; dropping it hands the slot to the most urgent waiting request.
#[derive(Debug)]
pub struct Permit {
    state: Arc<Mutex<State>>,
    quiet: Arc<Notify>,
    /// Dropping it ends a request (false for a slot handed to a waiter that had gone: no request
    /// was made with it).
    served: bool,
}

impl Lanes {
    pub fn new(in_flight: usize) -> Self {
        Lanes {
            state: Arc::new(Mutex::new(State {
                capacity: in_flight,
                granted: 0,
                free: in_flight,
                waiting: Default::default(),
                rate: Rate::new(Instant::now()),
            })),
            quiet: Arc::new(Notify::new()),
        }
    }

    fn permit(&self) -> Permit {
        Permit {
            state: self.state.clone(),
            quiet: self.quiet.clone(),
            served: true,
        }
    }

    /// The rate, in requests per second, at which the API server completed the controller's
    /// requests in the seconds when some request had to wait for a slot, averaged with a 60 s
    /// half-life; None before any such second. Seconds without a wait do not count: a quiet
    /// controller says nothing of how fast the API server goes.
    pub fn sustained_rate(&self) -> Option<f64> {
        let mut s = self.lock();
        s.roll(Instant::now());
        s.rate.average()
    }

    /// Waits for the next moment the last request in flight finishes with none waiting, and
    /// returns how many slots were handed out since start.
    pub async fn fell_quiet(&self) -> u64 {
        self.quiet.notified().await;
        self.lock().granted
    }

    /// Whether no request is in flight or waiting.
    pub fn is_quiet(&self) -> bool {
        let s = self.lock();
        s.free == s.capacity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// Waits for a slot in `lane`.
    pub async fn acquire(&self, lane: Lane) -> Permit {
        let rx = {
            let mut s = self.lock();
            s.granted += 1;
            if s.free > 0 {
                s.free -= 1;
                return self.permit();
            }
            s.roll(Instant::now());
            s.rate.saturated = true;
            let (tx, rx) = oneshot::channel();
            s.waiting[lane as usize].push_back(tx);
            rx
        };
        // A permit sent to a waiter that has gone is dropped with the channel, which hands it on,
        // so cancelling a wait loses no slot. The senders live in the state this holds, so the
        // channel cannot close unsent.
        match rx.await {
            Ok(p) => p,
            Err(_) => self.permit(),
        }
    }

    /// Runs the request `make` returns, holding a slot in `lane`. The request's future is made,
    /// on the heap, only once it has a slot: a kube request future is a few KiB, and a burst keeps
    /// a thousand reconciles waiting here.
    pub async fn run<F, Fut>(&self, lane: Lane, make: F) -> Fut::Output
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future,
    {
        let _slot = self.acquire(lane).await;
        Box::pin(make()).await
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let next = {
            let mut s = crate::sync::lock(&self.state);
            if self.served {
                s.roll(Instant::now());
                s.rate.done += 1;
            }
            match s.waiting.iter_mut().find_map(VecDeque::pop_front) {
                Some(tx) => tx,
                None => {
                    s.free += 1;
                    if s.free == s.capacity {
                        self.quiet.notify_waiters();
                    }
                    return;
                }
            }
        };
        // Outside the lock: a refused permit (its waiter gave up) is dropped here and hands on,
        // without counting a request.
        let sent = next.send(Permit {
            state: self.state.clone(),
            quiet: self.quiet.clone(),
            served: true,
        });
        if let Err(mut refused) = sent {
            refused.served = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Starts a task that waits for a slot in `lane` and records `tag` when it has one.
    fn waiter(
        lanes: &Lanes,
        lane: Lane,
        tag: &'static str,
        order: &Arc<Mutex<Vec<&'static str>>>,
    ) -> tokio::task::JoinHandle<()> {
        let (lanes, order) = (lanes.clone(), order.clone());
        tokio::spawn(async move {
            let _p = lanes.acquire(lane).await;
            order.lock().unwrap().push(tag);
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_free_slot_goes_to_the_most_urgent_lane_then_in_arrival_order() {
        let lanes = Lanes::new(1);
        let held = lanes.acquire(Lane::Background).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (lane, tag) in [
            (Lane::Background, "confirm-1"),
            (Lane::Claim, "claim-1"),
            (Lane::Background, "event-1"),
            (Lane::Create, "create-1"),
            (Lane::Claim, "claim-2"),
            (Lane::Create, "create-2"),
        ] {
            tasks.push(waiter(&lanes, lane, tag, &order));
            tokio::time::sleep(Duration::from_millis(1)).await; // arrival order
        }
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(
            *order.lock().unwrap(),
            [
                "create-1",
                "create-2",
                "claim-1",
                "claim-2",
                "confirm-1",
                "event-1"
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn never_more_in_flight_than_slots_and_a_cancelled_wait_loses_none() {
        let lanes = Lanes::new(3);
        let in_flight = Arc::new(Mutex::new((0usize, 0usize)));
        // A waiter that gives up must not take a slot with it.
        let gave_up = {
            let held: Vec<Permit> =
                futures::future::join_all((0..3).map(|_| lanes.acquire(Lane::Claim))).await;
            let t = tokio::time::timeout(Duration::from_millis(5), lanes.acquire(Lane::Create));
            let r = t.await.is_err();
            drop(held);
            r
        };
        assert!(gave_up);
        let tasks: Vec<_> = (0..50)
            .map(|i| {
                let (lanes, in_flight) = (lanes.clone(), in_flight.clone());
                let lane = [Lane::Create, Lane::Claim, Lane::Background][i % 3];
                tokio::spawn(async move {
                    lanes
                        .run(lane, || async {
                            {
                                let mut n = in_flight.lock().unwrap();
                                n.0 += 1;
                                n.1 = n.1.max(n.0);
                            }
                            tokio::time::sleep(Duration::from_millis(1 + (i as u64 % 7))).await;
                            in_flight.lock().unwrap().0 -= 1;
                        })
                        .await
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let (now, max) = *in_flight.lock().unwrap();
        assert_eq!((now, max), (0, 3));
        assert_eq!(lanes.lock().free, 3, "every slot came back");
    }

    /// `n` requests of `each` sent at once, so all but `slots` of them wait for a slot.
    async fn burst(lanes: &Lanes, n: usize, each: Duration) {
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let lanes = lanes.clone();
                tokio::spawn(
                    async move { lanes.run(Lane::Claim, || tokio::time::sleep(each)).await },
                )
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    }

    /// `n` requests of `each`, one after the other, `gap` apart: none ever waits.
    async fn trickle(lanes: &Lanes, n: usize, each: Duration, gap: Duration) {
        for _ in 0..n {
            lanes
                .run(Lane::Background, || tokio::time::sleep(each))
                .await;
            tokio::time::sleep(gap).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_rate_is_known_before_a_request_waited() {
        let lanes = Lanes::new(4);
        assert_eq!(lanes.sustained_rate(), None);
        trickle(
            &lanes,
            50,
            Duration::from_millis(20),
            Duration::from_millis(80),
        )
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(lanes.sustained_rate(), None, "no second was saturated");
    }

    #[tokio::test(start_paused = true)]
    async fn a_saturated_stretch_measures_its_rate_and_quiet_seconds_keep_it() {
        // 4 slots, 20 ms a request: 200 requests a second while requests wait.
        let lanes = Lanes::new(4);
        burst(&lanes, 2_000, Duration::from_millis(20)).await;
        let rate = lanes.sustained_rate().expect("saturated seconds");
        assert!((195.0..=201.0).contains(&rate), "{rate}/s");
        // Then a quiet minute at 5 requests a second: not what the API server can do.
        trickle(
            &lanes,
            300,
            Duration::from_millis(20),
            Duration::from_millis(180),
        )
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(lanes.sustained_rate(), Some(rate));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slower_minute_takes_the_rate_halfway_down() {
        // Five minutes at 50 requests a second (one slot, 20 ms a request), saturated.
        let lanes = Lanes::new(1);
        burst(&lanes, 15_000, Duration::from_millis(20)).await;
        let fast = lanes.sustained_rate().unwrap();
        assert!((49.0..=50.0).contains(&fast), "{fast}/s");
        // Then a minute at 12.5 a second (80 ms a request): a half-life later, about halfway.
        burst(&lanes, 750, Duration::from_millis(80)).await;
        let slow = lanes.sustained_rate().unwrap();
        assert!((29.0..=33.0).contains(&slow), "{fast}/s, then {slow}/s");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_handed_to_a_waiter_that_gave_up_counts_no_request() {
        let lanes = Lanes::new(1);
        let held = lanes.acquire(Lane::Claim).await;
        let gave_up = tokio::time::timeout(Duration::from_millis(5), lanes.acquire(Lane::Create));
        assert!(gave_up.await.is_err());
        drop(held);
        assert_eq!(lanes.lock().rate.done, 1);
    }
}
