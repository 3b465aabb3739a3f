//! Which SingletonJobs are due at each upcoming instant, for the adaptive lead (issue 33, design
//! §2.3): `N(T)`, the leads their wake-ups were set with, and the stream that wakes them earlier
//! when a burst's lead grows.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::api::SingletonJob;
use crate::sync::lock;

/// A lead that grew by more than this since a SingletonJob's wake-up was set wakes it earlier:
/// leads are whole seconds, and a second is no reason for a reconcile.
const REWAKE_OVER: SignedDuration = SignedDuration::from_secs(1);

/// Which SingletonJobs have their next prepared period at each instant (design §2.3): `N(T)` of
/// the adaptive lead, and the leads their wake-ups were set with.
///
/// A SingletonJob reconciled early in a burst set its wake-up (the start of its preparation)
/// for the lead of a burst smaller than the one that came together since. When the lead for its
/// instant grows more than a second beyond the lead its wake-up was set with, it is sent, at
/// the moment the grown lead begins (at once if that has passed), to the stream
/// [`Due::new`] returns, which the controller reconciles. Sending it at once instead would
/// reconcile every SingletonJob of the burst again at each second the lead grows by while the
/// burst is registered: hundreds of times each for 10,000 runs.
#[derive(Clone)]
pub struct Due {
    state: Arc<Mutex<DueState>>,
    wake: mpsc::UnboundedSender<ObjectRef<SingletonJob>>,
}

#[derive(Default)]
struct DueState {
    /// The SingletonJobs due at each instant (the period's, before jitter).
    at: BTreeMap<Timestamp, Burst>,
    /// The instant each SingletonJob is due at: one at most.
    of: HashMap<ObjectRef<SingletonJob>, Timestamp>,
    /// The largest lead of [`DueState::at`], when known.
    largest: Option<SignedDuration>,
}

/// The SingletonJobs due at one instant, and its lead as last computed.
#[derive(Default)]
struct Burst {
    members: HashMap<ObjectRef<SingletonJob>, Member>,
    /// The requests the members' preparations cost together.
    requests: f64,
    /// The lead the burst asks for ([`crate::decide::prepare::lead::burst_lead`]), as last
    /// computed.
    burst: SignedDuration,
    /// A SingletonJob's whole lead (its base raised to `burst`), as last computed.
    lead: SignedDuration,
    /// No member's wake-up was set with a shorter lead than this (None: none waits).
    lowest: Option<SignedDuration>,
    /// The wake-up of the members set with a shorter lead, when one is scheduled.
    waking: Option<(Instant, tokio::task::AbortHandle)>,
}

struct Member {
    requests: f64,
    /// The lead its wake-up was set with; None: it has no wake-up to move (its preparation
    /// began, or its run is prepared).
    waits: Option<SignedDuration>,
}

impl Burst {
    /// The members to wake: set with a lead more than [`REWAKE_OVER`] shorter than the burst's.
    fn late(&self) -> bool {
        self.lowest.is_some_and(|l| self.burst > l + REWAKE_OVER)
    }
}

impl DueState {
    /// Removes `sj` from its instant, and the instant if it has no other.
    fn remove(&mut self, sj: &ObjectRef<SingletonJob>) {
        let Some(t) = self.of.remove(sj) else {
            return;
        };
        let Some(burst) = self.at.get_mut(&t) else {
            return;
        };
        if let Some(m) = burst.members.remove(sj) {
            burst.requests -= m.requests;
        }
        if burst.members.is_empty() {
            self.drop_instant(t);
        }
    }

    fn drop_instant(&mut self, t: Timestamp) {
        if let Some(burst) = self.at.remove(&t) {
            if let Some((_, task)) = &burst.waking {
                task.abort();
            }
            for sj in burst.members.keys() {
                self.of.remove(sj);
            }
            if Some(burst.lead) == self.largest {
                self.largest = None;
            }
        }
    }

    /// Forgets the instants before `now`: their runs were prepared, or are decided as without.
    fn prune(&mut self, now: Timestamp) {
        let past: Vec<Timestamp> = self.at.range(..now).map(|(t, _)| *t).collect();
        for t in past {
            self.drop_instant(t);
        }
    }
}

impl Due {
    /// The registry, and the stream of SingletonJobs to reconcile because the lead of their
    /// instant grew past the lead their wake-up was set with.
    pub fn new() -> (Self, UnboundedReceiverStream<ObjectRef<SingletonJob>>) {
        let (wake, rx) = mpsc::unbounded_channel();
        let due = Due {
            state: Arc::default(),
            wake,
        };
        (due, UnboundedReceiverStream::new(rx))
    }

    /// Registers `sj`'s next run as due at `instant`, its preparation costing `requests`
    /// requests (leaving any other instant), and forgets the instants before `now`. Returns how
    /// many runs are due then, `N(T)`, and the requests each costs on average, `W`.
    pub fn enter(
        &self,
        sj: &ObjectRef<SingletonJob>,
        instant: Timestamp,
        requests: f64,
        now: Timestamp,
    ) -> (usize, f64) {
        let mut s = lock(&self.state);
        s.prune(now);
        if s.of.get(sj) != Some(&instant) {
            s.remove(sj);
        }
        s.of.insert(sj.clone(), instant);
        let burst = s.at.entry(instant).or_default();
        let before = burst.members.insert(
            sj.clone(),
            Member {
                requests,
                waits: None,
            },
        );
        burst.requests += requests - before.map_or(0.0, |m| m.requests);
        let n = burst.members.len();
        (n, burst.requests / n as f64)
    }

    /// The leads `sj`'s reconcile computed for its instant (registered by [`Due::enter`]):
    /// `burst` for the burst, `lead` its own; `waits`: the lead its wake-up was set with, if it
    /// waits for one. Schedules the wake-up of the SingletonJobs due then whose wake-up was set
    /// with a lead more than a second shorter, at `instant − burst` (`now`: the time the
    /// instants are measured by).
    pub fn led(
        &self,
        sj: &ObjectRef<SingletonJob>,
        burst: SignedDuration,
        lead: SignedDuration,
        waits: Option<SignedDuration>,
        now: Timestamp,
    ) {
        let mut guard = lock(&self.state);
        let s = &mut *guard;
        let Some(&t) = s.of.get(sj) else {
            return;
        };
        let Some(b) = s.at.get_mut(&t) else {
            return;
        };
        if let Some(m) = b.members.get_mut(sj) {
            m.waits = waits;
        }
        if let Some(w) = waits {
            b.lowest = Some(b.lowest.map_or(w, |l| l.min(w)));
        }
        let was = std::mem::replace(&mut b.lead, lead);
        b.burst = burst;
        s.largest = match s.largest {
            Some(l) if lead >= l => Some(lead),
            Some(l) if was == l => None,
            known => known,
        };
        if !b.late() {
            return;
        }
        // When the grown lead begins, by this process's timers (as its requeues are).
        let ahead = t
            .checked_sub(burst)
            .map_or(SignedDuration::ZERO, |from| from.duration_since(now));
        let at = Instant::now() + Duration::try_from(ahead).unwrap_or_default();
        if b.waking.as_ref().is_some_and(|(w, _)| *w <= at) {
            return;
        }
        if let Some((_, task)) = b.waking.take() {
            task.abort();
        }
        let due = self.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            due.wake_late(t);
        });
        b.waking = Some((at, task.abort_handle()));
    }

    /// Sends the members of `instant` whose wake-up was set with a lead more than a second
    /// shorter than its lead to be reconciled (they set their wake-ups again).
    fn wake_late(&self, instant: Timestamp) {
        let mut s = lock(&self.state);
        let Some(b) = s.at.get_mut(&instant) else {
            return;
        };
        b.waking = None;
        let burst = b.burst;
        for (sj, m) in b.members.iter_mut() {
            if m.waits.is_some_and(|w| burst > w + REWAKE_OVER) {
                // Until its reconcile says otherwise: sent once.
                m.waits = Some(burst);
                // The controller may have stopped; then there is nobody to wake.
                let _ = self.wake.send(sj.clone());
            }
        }
        b.lowest = b.members.values().filter_map(|m| m.waits).min();
    }

    /// Forgets `sj` (its next run is not prepared, or it was deleted).
    pub fn leave(&self, sj: &ObjectRef<SingletonJob>) {
        lock(&self.state).remove(sj);
    }

    /// Forgets every SingletonJob but those in `live` (namespace, name): the others were
    /// deleted while the watch was down.
    pub fn keep_only(&self, live: &HashSet<(String, String)>) {
        let mut s = lock(&self.state);
        let gone: Vec<ObjectRef<SingletonJob>> =
            s.of.keys()
                .filter(|r| {
                    let ns = r.namespace.clone().unwrap_or_default();
                    !live.contains(&(ns, r.name.clone()))
                })
                .cloned()
                .collect();
        for sj in &gone {
            s.remove(sj);
        }
    }

    /// How many runs are due at `instant`.
    pub fn count(&self, instant: Timestamp) -> usize {
        lock(&self.state)
            .at
            .get(&instant)
            .map_or(0, |b| b.members.len())
    }

    /// The largest lead last computed for an instant not before `now` (0: none is due).
    pub fn largest_lead(&self, now: Timestamp) -> SignedDuration {
        let mut s = lock(&self.state);
        s.prune(now);
        if let Some(l) = s.largest {
            return l;
        }
        let l =
            s.at.values()
                .map(|b| b.lead)
                .max()
                .unwrap_or(SignedDuration::ZERO);
        s.largest = Some(l);
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sj_ref(name: &str) -> ObjectRef<SingletonJob> {
        ObjectRef::new(name).within("ns")
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn secs(n: i64) -> SignedDuration {
        SignedDuration::from_secs(n)
    }

    /// What the stream holds now, without waiting.
    fn sent(woken: &mut UnboundedReceiverStream<ObjectRef<SingletonJob>>) -> Vec<String> {
        use futures::{FutureExt, StreamExt};
        let mut out = Vec::new();
        while let Some(Some(r)) = woken.next().now_or_never() {
            out.push(r.name);
        }
        out.sort();
        out
    }

    #[test]
    fn a_singleton_job_is_due_at_one_instant_and_past_instants_are_forgotten() {
        let (due, _woken) = Due::new();
        let now = ts("2027-01-01T00:00:00Z");
        let (t1, t2) = (now + secs(60), now + secs(120));
        let (a, b, c) = (sj_ref("a"), sj_ref("b"), sj_ref("c"));
        assert_eq!(due.enter(&a, t1, 3.0, now), (1, 3.0));
        assert_eq!(due.enter(&b, t1, 4.0, now), (2, 3.5));
        // Entered again at the same instant: counted once, at its new cost.
        assert_eq!(due.enter(&b, t1, 3.0, now), (2, 3.0));
        // Its next period moved on: gone from the first instant.
        assert_eq!(due.enter(&a, t2, 3.0, now), (1, 3.0));
        assert_eq!((due.count(t1), due.count(t2)), (1, 1));
        due.enter(&c, t2, 3.0, now);
        due.leave(&c);
        assert_eq!(due.count(t2), 1);
        // Once t1 has passed, nothing is due at it.
        assert_eq!(due.enter(&c, t2, 3.0, t1 + secs(1)), (2, 3.0));
        assert_eq!(due.count(t1), 0);
        // Deleted while the watch was down: only the live ones stay.
        due.keep_only(&[("ns".to_string(), "a".to_string())].into());
        assert_eq!(due.count(t2), 1);
    }

    #[test]
    fn the_largest_lead_is_that_of_an_instant_still_to_come() {
        let (due, _woken) = Due::new();
        let now = ts("2027-01-01T00:00:00Z");
        let (t1, t2) = (now + secs(60), now + secs(600));
        let (a, b) = (sj_ref("a"), sj_ref("b"));
        assert_eq!(due.largest_lead(now), SignedDuration::ZERO);
        due.enter(&a, t1, 3.0, now);
        due.led(&a, secs(1), secs(57), None, now);
        due.enter(&b, t2, 3.0, now);
        due.led(&b, secs(1), secs(30), None, now);
        assert_eq!(due.largest_lead(now), secs(57));
        // The largest came down: the next largest.
        due.led(&a, secs(1), secs(20), None, now);
        assert_eq!(due.largest_lead(now), secs(30));
        due.led(&a, secs(1), secs(57), None, now);
        assert_eq!(due.largest_lead(t1 + secs(1)), secs(30), "t1 has passed");
        due.leave(&b);
        assert_eq!(due.largest_lead(t1 + secs(1)), SignedDuration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_up_set_for_a_shorter_lead_is_moved_to_where_the_grown_lead_begins() {
        let (due, mut woken) = Due::new();
        let now = ts("2027-01-01T00:00:00Z");
        let t = now + secs(300);
        let (a, b, c, d) = (sj_ref("a"), sj_ref("b"), sj_ref("c"), sj_ref("d"));
        // `a` waits to prepare 30 s ahead; `c` prepared already (nothing to wake).
        due.enter(&a, t, 3.0, now);
        due.led(&a, secs(1), secs(30), Some(secs(30)), now);
        due.enter(&c, t, 3.0, now);
        due.led(&c, secs(1), secs(30), None, now);
        // A second more is no reason to wake anyone.
        due.enter(&b, t, 3.0, now);
        due.led(&b, secs(31), secs(31), Some(secs(31)), now);
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert!(sent(&mut woken).is_empty());

        let (due, mut woken) = Due::new();
        due.enter(&a, t, 3.0, now);
        due.led(&a, secs(1), secs(30), Some(secs(30)), now);
        due.enter(&c, t, 3.0, now);
        due.led(&c, secs(1), secs(30), None, now);
        due.enter(&d, t, 3.0, now);
        due.led(&d, secs(1), secs(90), Some(secs(90)), now);
        // The burst grew to 100 s: `a` and `d` are woken 100 s before `t`, not now.
        due.enter(&b, t, 3.0, now);
        due.led(&b, secs(100), secs(100), Some(secs(100)), now);
        tokio::time::sleep(Duration::from_secs(199)).await;
        assert!(sent(&mut woken).is_empty());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(sent(&mut woken), ["a", "d"]);
        // Once each: the lead they are woken for is taken as theirs until they say otherwise.
        due.led(&b, secs(100), secs(100), Some(secs(100)), now);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(sent(&mut woken).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_grown_lead_that_began_already_wakes_at_once_and_a_leaver_is_not_woken() {
        let (due, mut woken) = Due::new();
        let now = ts("2027-01-01T00:00:00Z");
        let t = now + secs(50);
        let (a, b, c) = (sj_ref("a"), sj_ref("b"), sj_ref("c"));
        due.enter(&a, t, 3.0, now);
        due.led(&a, secs(30), secs(30), Some(secs(30)), now);
        due.enter(&c, t, 3.0, now);
        due.led(&c, secs(30), secs(30), Some(secs(30)), now);
        due.leave(&c);
        due.enter(&b, t, 3.0, now);
        due.led(&b, secs(120), secs(120), None, now);
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(sent(&mut woken), ["a"]);
    }
}
