//! A fair share of database time between namespaces (issue 34, N3).
//!
//! A tenant's database that answers at once when probed but takes seconds per claim (a lock held
//! on its claims table, a trigger, a saturated server) passes every check of [`super::health`],
//! and each of its reconciles holds one of the controller's reconcile slots for as long as its
//! database takes: about 130 every-second SingletonJobs behind a 9 s claim held all 128 slots,
//! and every other namespace's runs waited. So each namespace has a budget of database time in
//! flight, [`BUDGET`]:
//!
//! - every backstop operation is timed ([`Share::op`]); a namespace's *cost* is the larger of
//!   its slowest recent operation (a peak that halves every [`HALF_LIFE`]) and the age of its
//!   oldest operation still in flight, so a database that turns slow is seen before its first
//!   slow answer, and fast answers in between (a probe's `SELECT 1`) do not hide slow claims;
//! - a reconcile that will use its backstop takes a [`Turn`] of its namespace first
//!   ([`Share::admit`]). A namespace holds at most [`MAX_TURNS`] at once (a quarter of the
//!   controller's reconcile slots), so even before its database is known to be slow, the first
//!   wave of its claims leaves the other slots to everyone else; from a cost of [`SLOW`], at
//!   most `BUDGET / cost` turns, at least one;
//! - a reconcile that finds no turn free is not kept waiting in its slot: it is looked at again
//!   after the namespace's cost (at least [`MIN_RETRY`], at most [`MAX_RETRY`]), a backoff that
//!   grows with the database's slowness; at the cap of a fast database, after [`FULL_RETRY`].
//!
//! A turn lasts the rest of its reconcile, API requests included, so the cap also bounds a burst
//! of backstopped runs due at once in one namespace to 32 reconciles at a time (128 before); its
//! cost is not measured yet (the burst bench runs without a backstop). A slow database delays
//! only its own namespace, whose periods are then decided late (or Missed past their starting
//! deadline), never lost. Once it answers fast again it is trusted again within about half a
//! minute (a 9 s peak falls below [`SLOW`] in a little over three half-lives).
//! Pure apart from the clock the caller passes: every rule is unit-tested.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::sync::lock;

/// The database time one namespace may have in flight: turns × its cost. At 9 s a claim this is
/// one turn; at 1 s, eight; at 50 ms, a hundred and sixty (more than the reconcile slots).
pub const BUDGET: Duration = Duration::from_secs(8);
/// Turns one namespace may hold at once however fast its database: a quarter of the
/// controller's 128 reconcile slots.
pub const MAX_TURNS: usize = 32;
/// How soon a reconcile refused at [`MAX_TURNS`] of a fast database asks again.
pub const FULL_RETRY: Duration = Duration::from_millis(250);
/// A namespace whose cost is below this is not limited (a connect with TLS and a schema check
/// on a loaded machine stays well under it).
pub const SLOW: Duration = Duration::from_secs(1);
/// How fast a slow operation is forgotten: its weight in the cost halves in this time.
pub const HALF_LIFE: Duration = Duration::from_secs(10);
/// The shortest wait of a reconcile that found no turn free.
pub const MIN_RETRY: Duration = Duration::from_secs(1);
/// The longest: a database slower than this is already past the operation timeout.
pub const MAX_RETRY: Duration = Duration::from_secs(30);
/// Namespaces remembered at most; idle ones are dropped first (a churn of namespaces must not
/// grow the map for ever).
const MAX_NAMESPACES: usize = 4096;

#[derive(Debug, Default)]
struct Namespace {
    turns: usize,
    /// The slowest finished operation (seconds) as it weighed at the instant, which decays.
    peak: Option<(f64, Instant)>,
    /// Operations in flight: id → when each began.
    in_flight: BTreeMap<u64, Instant>,
}

impl Namespace {
    /// The slowest recent operation's duration, halved for every [`HALF_LIFE`] since.
    fn peak(&self, now: Instant) -> f64 {
        self.peak.map_or(0.0, |(secs, at)| {
            let halves = now.saturating_duration_since(at).as_secs_f64() / HALF_LIFE.as_secs_f64();
            secs * 0.5f64.powf(halves)
        })
    }

    /// What one more turn is expected to cost: the recent peak, or the oldest operation's age
    /// when that is longer (the database has turned slow and has not answered yet).
    fn cost(&self, now: Instant) -> Duration {
        let peak = Duration::from_secs_f64(self.peak(now));
        let oldest = self
            .in_flight
            .values()
            .min()
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(*t));
        peak.max(oldest)
    }

    fn is_idle(&self) -> bool {
        self.turns == 0 && self.in_flight.is_empty()
    }
}

#[derive(Debug, Default)]
struct State {
    namespaces: HashMap<String, Namespace>,
    next_op: u64,
}

/// Every namespace's database time, shared by all reconciles.
#[derive(Debug)]
pub struct Share {
    state: Mutex<State>,
    budget: Duration,
}

impl Default for Share {
    fn default() -> Self {
        Share::new(BUDGET)
    }
}

/// A namespace's turn at its database, held for the rest of a reconcile; dropping it frees it.
#[derive(Debug)]
pub struct Turn {
    share: Arc<Share>,
    namespace: String,
}

/// One backstop operation being timed; [`Op::done`] records how long it took. Dropped without
/// it (cancelled), it records nothing but leaves the in-flight set.
#[derive(Debug)]
pub struct Op {
    share: Arc<Share>,
    namespace: String,
    id: u64,
}

impl Share {
    pub fn new(budget: Duration) -> Self {
        Share {
            state: Mutex::default(),
            budget,
        }
    }

    /// Turns `namespace` may hold at once when one costs `cost`.
    fn allowed(&self, cost: Duration) -> usize {
        if cost < SLOW {
            return MAX_TURNS;
        }
        let n = self.budget.as_secs_f64() / cost.as_secs_f64();
        (n.floor() as usize).clamp(1, MAX_TURNS)
    }

    /// A turn of `namespace` at `now`, or how long to wait before asking again.
    pub fn admit(self: &Arc<Self>, namespace: &str, now: Instant) -> Result<Turn, Duration> {
        let mut s = lock(&self.state);
        if !s.namespaces.contains_key(namespace) && s.namespaces.len() >= MAX_NAMESPACES {
            s.namespaces.retain(|_, n| !n.is_idle());
        }
        let ns = s.namespaces.entry(namespace.to_string()).or_default();
        let cost = ns.cost(now);
        if ns.turns >= self.allowed(cost) {
            return Err(if cost < SLOW {
                FULL_RETRY
            } else {
                cost.clamp(MIN_RETRY, MAX_RETRY)
            });
        }
        ns.turns += 1;
        Ok(Turn {
            share: self.clone(),
            namespace: namespace.to_string(),
        })
    }

    /// Starts timing an operation of `namespace`'s database at `now`.
    pub fn op(self: &Arc<Self>, namespace: &str, now: Instant) -> Op {
        let mut s = lock(&self.state);
        s.next_op += 1;
        let id = s.next_op;
        s.namespaces
            .entry(namespace.to_string())
            .or_default()
            .in_flight
            .insert(id, now);
        Op {
            share: self.clone(),
            namespace: namespace.to_string(),
            id,
        }
    }

    /// The cost of one turn of `namespace` at `now`.
    #[cfg(test)]
    fn cost(&self, namespace: &str, now: Instant) -> Duration {
        lock(&self.state)
            .namespaces
            .get(namespace)
            .map_or(Duration::ZERO, |n| n.cost(now))
    }
}

impl Op {
    /// The operation ended at `now`: it is the namespace's new peak if it took longer than
    /// the old peak weighs now.
    pub fn done(self, now: Instant) {
        let mut s = lock(&self.share.state);
        if let Some(ns) = s.namespaces.get_mut(&self.namespace)
            && let Some(began) = ns.in_flight.get(&self.id)
        {
            let took = now.saturating_duration_since(*began).as_secs_f64();
            ns.peak = Some((ns.peak(now).max(took), now));
        }
    }
}

impl Drop for Op {
    fn drop(&mut self) {
        let mut s = lock(&self.share.state);
        if let Some(ns) = s.namespaces.get_mut(&self.namespace) {
            ns.in_flight.remove(&self.id);
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut s = lock(&self.share.state);
        if let Some(ns) = s.namespaces.get_mut(&self.namespace) {
            ns.turns = ns.turns.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    /// Runs one operation of `ns` taking `took`, from `at`.
    fn op(share: &Arc<Share>, ns: &str, at: Instant, took: Duration) {
        share.op(ns, at).done(at + took);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_namespace_holds_a_quarter_of_the_slots_and_asks_again_soon() {
        let share = Arc::new(Share::default());
        let now = Instant::now();
        // A slow connect (TLS, the schema) among fast claims is still fast.
        op(&share, "fast", now, Duration::from_millis(600));
        for _ in 0..20 {
            op(&share, "fast", now, Duration::from_millis(5));
        }
        let turns: Vec<Turn> = (0..1000)
            .map_while(|_| share.admit("fast", now).ok())
            .collect();
        assert_eq!(turns.len(), MAX_TURNS);
        assert_eq!(share.admit("fast", now).unwrap_err(), FULL_RETRY);
        // A new namespace, its database not known yet: the same cap.
        let first: Vec<Turn> = (0..1000)
            .map_while(|_| share.admit("new", now).ok())
            .collect();
        assert_eq!(first.len(), MAX_TURNS);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_namespace_holds_its_budget_and_waits_by_its_cost() {
        let share = Arc::new(Share::default());
        let now = Instant::now();
        op(&share, "slow", now, 9 * SEC);
        // Fast answers in between (probes) do not hide the slow claims.
        for _ in 0..10 {
            op(&share, "slow", now, Duration::from_millis(2));
        }
        let t = share.admit("slow", now).expect("one turn at least");
        assert_eq!(share.admit("slow", now).unwrap_err(), 9 * SEC);
        // Another namespace is not affected.
        let _other: Vec<Turn> = (0..MAX_TURNS)
            .map(|_| share.admit("other", now).expect("its own budget"))
            .collect();
        drop(t);
        assert!(
            share.admit("slow", now).is_ok(),
            "a freed turn is taken again"
        );

        let share = Arc::new(Share::default());
        op(&share, "1s", now, SEC);
        let held: Vec<Turn> = (0..9).map_while(|_| share.admit("1s", now).ok()).collect();
        assert_eq!(held.len(), 8, "8 s of budget at 1 s a turn");
        assert_eq!(share.admit("1s", now).unwrap_err(), MIN_RETRY);
    }

    #[tokio::test(start_paused = true)]
    async fn a_database_turning_slow_is_seen_before_it_answers() {
        let share = Arc::new(Share::default());
        let now = Instant::now();
        op(&share, "ns", now, Duration::from_millis(2));
        let _hanging = share.op("ns", now);
        let held: Vec<Turn> = (0..3).map(|_| share.admit("ns", now).unwrap()).collect();
        // Four seconds on, the hanging operation makes a turn cost 4 s: two fit, three are held.
        let later = now + 4 * SEC;
        assert_eq!(share.cost("ns", later), 4 * SEC);
        assert_eq!(share.admit("ns", later).unwrap_err(), 4 * SEC);
        drop(held);
        let _a = share.admit("ns", later).unwrap();
        let _b = share.admit("ns", later).unwrap();
        assert!(share.admit("ns", later).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_peak_is_forgotten_by_half_lives() {
        let share = Arc::new(Share::default());
        let began = Instant::now();
        op(&share, "ns", began, 8 * SEC);
        // It counts from its answer.
        let now = began + 8 * SEC;
        assert_eq!(share.cost("ns", now), 8 * SEC);
        assert_eq!(share.cost("ns", now + HALF_LIFE), 4 * SEC);
        let _t = share.admit("ns", now + HALF_LIFE).unwrap();
        let _u = share.admit("ns", now + HALF_LIFE).unwrap();
        assert!(share.admit("ns", now + HALF_LIFE).is_err());
        // Just before three half-lives, a turn costs a little over 1 s: seven fit (two held).
        let almost = now + 3 * HALF_LIFE - SEC;
        let more: Vec<Turn> = (0..100)
            .map_while(|_| share.admit("ns", almost).ok())
            .collect();
        assert_eq!(more.len(), 5);
        drop(more);
        let free = now + 3 * HALF_LIFE + SEC;
        let many: Vec<Turn> = (0..100)
            .map_while(|_| share.admit("ns", free).ok())
            .collect();
        assert_eq!(many.len(), MAX_TURNS - 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_is_bounded_and_a_cancelled_operation_counts_no_longer() {
        let share = Arc::new(Share::default());
        let now = Instant::now();
        op(&share, "ns", now, 300 * SEC);
        let _t = share.admit("ns", now).unwrap();
        assert_eq!(share.admit("ns", now).unwrap_err(), MAX_RETRY);

        let share = Arc::new(Share::default());
        let cancelled = share.op("ns", now);
        assert_eq!(share.cost("ns", now + 5 * SEC), 5 * SEC);
        drop(cancelled);
        assert_eq!(share.cost("ns", now + 5 * SEC), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn the_map_of_namespaces_stays_bounded() {
        let share = Arc::new(Share::default());
        let now = Instant::now();
        for i in 0..(MAX_NAMESPACES + 10) {
            drop(share.admit(&format!("ns-{i}"), now).unwrap());
        }
        assert!(lock(&share.state).namespaces.len() <= MAX_NAMESPACES);
    }
}
