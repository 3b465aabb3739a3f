//! Backstop health, remembered across reconciles, and a bound on probes per namespace (issue 19,
//! noisy neighbours).
//!
//! Every reconcile of a SingletonJob with a backstop probes it (connect, schema, `SELECT 1`), and
//! a probe of a database that never answers holds one of the controller's reconcile slots for the
//! operation timeout. A namespace with a hundred SingletonJobs pointing at a black hole would hold
//! all of them. So:
//!
//! - a target that failed is not probed again until its backoff has passed (1 s, doubling to
//!   30 s); until then its SingletonJobs see the last error at once, without a connection;
//! - a target not known to be healthy (new, or failing with its backoff passed) is probed by one
//!   reconcile at a time, and at most [`PROBES_PER_NAMESPACE`] such probes of one namespace run
//!   at once: a reconcile that finds no room is not kept waiting in its slot but tried again
//!   shortly ([`Admission::Busy`]).
//!
//! A target is one connection Secret's contents in one namespace: (namespace, Secret name, a hash
//! of the Secret's data, which names the host). A changed Secret is a new target, probed at once.
//! Pure apart from the clock the caller passes: every rule is unit-tested.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::sync::lock;

/// Probes of targets not known to be healthy that one namespace may run at once.
pub const PROBES_PER_NAMESPACE: usize = 4;
/// The wait after a target's first failure; it doubles with each failure in a row.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between probes of a failing target (also how long a fixed database, behind an
/// unchanged Secret, may go unnoticed).
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How soon a reconcile that found no room to probe is tried again.
pub const BUSY_RETRY: Duration = Duration::from_secs(2);

/// One backstop target: the Secret's contents in a namespace. Its `Debug` shows only the hash.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Target {
    pub namespace: String,
    pub secret: String,
    /// A hash of the Secret's data (host, port, credentials...), never the data.
    pub contents: [u8; 32],
}

/// What a reconcile may do about its backstop now.
#[derive(Debug)]
pub enum Admission<'a> {
    /// Probe it; report the result with [`Probe::done`].
    Probe(Probe<'a>),
    /// It failed lately: this was its last error; no connection now, nor before `retry_at`
    /// (a SingletonJob that waits for it need not be looked at sooner).
    Failing { error: String, retry_at: Instant },
    /// Another probe of it, or too many of its namespace, are in flight: look again shortly,
    /// without holding a reconcile slot.
    Busy,
}

#[derive(Debug)]
struct Failing {
    failures: u32,
    retry_at: Instant,
    error: String,
}

#[derive(Debug, Default)]
struct State {
    /// The target each (namespace, Secret) named when last read.
    by_secret: HashMap<(String, String), Target>,
    failing: HashMap<Target, Failing>,
    healthy: HashSet<Target>,
    /// Targets being probed while not known healthy, and how many per namespace.
    probing: HashSet<Target>,
    per_namespace: HashMap<String, usize>,
}

/// The health of every backstop target, shared by all reconciles.
#[derive(Debug)]
pub struct Health {
    state: Mutex<State>,
    per_namespace: usize,
    /// SingletonJobs recorded as waiting for a failing backstop: uid → (not before, what they
    /// looked like then).
    waiting: Mutex<HashMap<String, (Instant, u64)>>,
}

impl Default for Health {
    fn default() -> Self {
        Health::new(PROBES_PER_NAMESPACE)
    }
}

/// A probe admitted by [`Health::admit`]. Dropped without [`Probe::done`] (the reconcile was
/// cancelled), it frees its room and records nothing.
#[derive(Debug)]
pub struct Probe<'a> {
    health: &'a Health,
    target: Target,
    /// Counted against its namespace (the target was not known healthy).
    metered: bool,
}

/// Bounds the maps: a churn of Secrets must not grow them for ever.
const MAX_TARGETS: usize = 4096;

impl Health {
    pub fn new(per_namespace: usize) -> Self {
        Health {
            state: Mutex::default(),
            per_namespace: per_namespace.max(1),
            waiting: Mutex::default(),
        }
    }

    /// Records that the SingletonJob `uid`, as `seen` (see [`Health::is_hushed`]), waits for
    /// its backstop until `until`: its status was just written with what that wait means.
    ///
    /// The write comes back through the watch as a change and would be reconciled at once; for
    /// an every-second schedule that reconcile records the next missed period and writes again,
    /// a loop of one write a second per SingletonJob. A namespace of them behind a dead database
    /// would fill the controller's request lanes and delay every other namespace's runs.
    pub fn hush(&self, uid: &str, seen: u64, until: Instant) {
        let mut w = lock(&self.waiting);
        if w.len() >= MAX_TARGETS {
            let now = Instant::now();
            w.retain(|_, (at, _)| now < *at);
        }
        w.insert(uid.to_string(), (until, seen));
    }

    /// Until when the SingletonJob `uid` need not be reconciled: it waits for its backstop and
    /// nothing a user can change (`seen`: its generation and operation annotations, hashed by
    /// the caller) changed since. A period due meanwhile is recorded at that next look, a
    /// little late, never lost (G2), as when it is requeued for the backstop's next probe.
    pub fn is_hushed(&self, uid: &str, seen: u64, now: Instant) -> Option<Instant> {
        let mut w = lock(&self.waiting);
        match w.get(uid) {
            Some(&(until, was)) if was == seen && now < until => Some(until),
            Some(_) => {
                w.remove(uid);
                None
            }
            None => None,
        }
    }

    /// Forgets a deleted SingletonJob.
    pub fn forget(&self, uid: &str) {
        lock(&self.waiting).remove(uid);
    }

    /// Before the Secret is read: when the target the Secret `secret` of `namespace` named last
    /// time is failing within its backoff, or its first probe is in flight, the answer needs no
    /// read (a Secret fixed meanwhile is read when the backoff ends). None: read it and
    /// [`Health::admit`] its target.
    pub fn before_reading(
        &self,
        namespace: &str,
        secret: &str,
        now: Instant,
    ) -> Option<Admission<'_>> {
        let s = lock(&self.state);
        let target = s
            .by_secret
            .get(&(namespace.to_string(), secret.to_string()))?;
        if let Some(f) = s.failing.get(target) {
            return (now < f.retry_at).then(|| Admission::Failing {
                error: f.error.clone(),
                retry_at: f.retry_at,
            });
        }
        (s.probing.contains(target) && !s.healthy.contains(target)).then_some(Admission::Busy)
    }

    /// Whether the reconcile may probe `target` now.
    pub fn admit(&self, target: &Target, now: Instant) -> Admission<'_> {
        let mut s = lock(&self.state);
        let secret = (target.namespace.clone(), target.secret.clone());
        if s.by_secret.get(&secret) != Some(target) {
            if s.by_secret.len() >= MAX_TARGETS {
                s.by_secret.clear();
            }
            s.by_secret.insert(secret, target.clone());
        }
        let in_ns = s.per_namespace.get(&target.namespace).copied().unwrap_or(0);
        let no_room = s.probing.contains(target) || in_ns >= self.per_namespace;
        if let Some(f) = s.failing.get(target)
            && (now < f.retry_at || no_room)
        {
            // Within its backoff, or its next probe must wait (another reconcile probes it now,
            // or its namespace's room is full): the last error stands until a probe says
            // otherwise, so a SingletonJob behind it is told, not left waiting. Waiting for room,
            // it is looked at again after the longest backoff, not every BUSY_RETRY: its failures
            // cannot grow its backoff while it is not probed, and a namespace of SingletonJobs
            // behind failing targets would otherwise reconcile (and write status) many times a
            // second while its probes queue, and crowd out everyone else.
            return Admission::Failing {
                error: f.error.clone(),
                retry_at: if now < f.retry_at {
                    f.retry_at
                } else {
                    now + MAX_BACKOFF
                },
            };
        }
        if s.healthy.contains(target) {
            return Admission::Probe(Probe {
                health: self,
                target: target.clone(),
                metered: false,
            });
        }
        if no_room {
            return Admission::Busy;
        }
        s.probing.insert(target.clone());
        *s.per_namespace.entry(target.namespace.clone()).or_default() += 1;
        Admission::Probe(Probe {
            health: self,
            target: target.clone(),
            metered: true,
        })
    }

    /// Keeps the maps bounded under a churn of Secrets: failures long past their backoff go
    /// first; the healthy set is only a shortcut, so it may be dropped whole.
    fn prune(s: &mut State, now: Instant) {
        if s.failing.len() >= MAX_TARGETS {
            s.failing.retain(|_, f| now < f.retry_at + MAX_BACKOFF);
        }
        if s.healthy.len() >= MAX_TARGETS {
            s.healthy.clear();
        }
    }
}

impl Probe<'_> {
    /// Whether the target is not known healthy (new, or failing with its backoff passed): such
    /// probes are bounded per namespace here ([`PROBES_PER_NAMESPACE`]).
    pub fn is_bounded(&self) -> bool {
        self.metered
    }

    /// Records how the probe ended (`Err`: the reason the SingletonJobs are shown); on a
    /// failure, returns when the target will be probed again.
    pub fn done(self, result: Result<(), String>, now: Instant) -> Option<Instant> {
        let mut s = lock(&self.health.state);
        Health::prune(&mut s, now);
        match result {
            Ok(()) => {
                s.failing.remove(&self.target);
                s.healthy.insert(self.target.clone());
                None
            }
            Err(error) => {
                s.healthy.remove(&self.target);
                let failures = s.failing.get(&self.target).map_or(0, |f| f.failures) + 1;
                let retry_at = now + backoff(failures);
                s.failing.insert(
                    self.target.clone(),
                    Failing {
                        failures,
                        retry_at,
                        error,
                    },
                );
                Some(retry_at)
            }
        }
    }
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        if !self.metered {
            return;
        }
        let mut s = lock(&self.health.state);
        s.probing.remove(&self.target);
        if let Some(n) = s.per_namespace.get_mut(&self.target.namespace) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.per_namespace.remove(&self.target.namespace);
            }
        }
    }
}

/// The wait after `failures` failures in a row: 1 s, 2 s, 4 s, ... at most [`MAX_BACKOFF`].
pub fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (FIRST_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(ns: &str, n: u8) -> Target {
        Target {
            namespace: ns.into(),
            secret: "db".into(),
            contents: [n; 32],
        }
    }

    #[test]
    fn backoff_doubles_from_one_second_to_thirty() {
        let secs: Vec<u64> = (1..=7).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_target_is_not_probed_again_until_its_backoff_passes() {
        let h = Health::default();
        let t = target("bad", 1);
        let now = Instant::now();
        let Admission::Probe(p) = h.admit(&t, now) else {
            panic!("a new target is probed");
        };
        let retry = p.done(Err("timed out".into()), now);
        assert_eq!(retry, Some(now + Duration::from_secs(1)));
        for _ in 0..3 {
            match h.admit(&t, now + Duration::from_millis(900)) {
                Admission::Failing { error, retry_at } => {
                    assert_eq!(error, "timed out");
                    assert_eq!(retry_at, now + Duration::from_secs(1));
                }
                other => panic!("within the backoff: {other:?}"),
            }
        }
        let later = now + Duration::from_secs(1);
        let Admission::Probe(p) = h.admit(&t, later) else {
            panic!("after the backoff, probed again");
        };
        // While that probe runs, the others keep the last error rather than wait.
        assert!(matches!(h.admit(&t, later), Admission::Failing { .. }));
        p.done(Err("timed out again".into()), later);
        // Second failure in a row: 2 s.
        assert!(matches!(
            h.admit(&t, later + Duration::from_millis(1999)),
            Admission::Failing { error, .. } if error == "timed out again"
        ));
        let Admission::Probe(p) = h.admit(&t, later + Duration::from_secs(2)) else {
            panic!("probed after 2 s");
        };
        p.done(Ok(()), later + Duration::from_secs(2));
        assert!(matches!(
            h.admit(&t, later + Duration::from_secs(2)),
            Admission::Probe(_)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_secret_is_answered_without_reading_it_until_its_backoff_ends() {
        let h = Health::default();
        let t = target("bad", 1);
        let now = Instant::now();
        assert!(
            h.before_reading("bad", "db", now).is_none(),
            "never read: read it"
        );
        let Admission::Probe(p) = h.admit(&t, now) else {
            panic!("a new target is probed");
        };
        assert!(matches!(
            h.before_reading("bad", "db", now),
            Some(Admission::Busy)
        ));
        p.done(Err("timed out".into()), now);
        assert!(matches!(
            h.before_reading("bad", "db", now + Duration::from_millis(500)),
            Some(Admission::Failing { .. })
        ));
        assert!(
            h.before_reading("bad", "db", now + Duration::from_secs(1))
                .is_none()
        );
        assert!(h.before_reading("bad", "other", now).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn one_probe_per_unproven_target_and_a_few_per_namespace_others_untouched() {
        let h = Health::new(2);
        let now = Instant::now();
        let a = h.admit(&target("bad", 1), now);
        assert!(matches!(a, Admission::Probe(_)));
        // The same target: one probe at a time.
        assert!(matches!(h.admit(&target("bad", 1), now), Admission::Busy));
        let b = h.admit(&target("bad", 2), now);
        assert!(matches!(b, Admission::Probe(_)));
        // The namespace's room is full...
        assert!(matches!(h.admit(&target("bad", 3), now), Admission::Busy));
        // ...but not another namespace's.
        let Admission::Probe(good) = h.admit(&target("good", 1), now) else {
            panic!("another namespace is not held up");
        };
        good.done(Ok(()), now);
        // A healthy target is probed by every reconcile, unmetered.
        let many: Vec<_> = (0..10).map(|_| h.admit(&target("good", 1), now)).collect();
        assert!(many.iter().all(|a| matches!(a, Admission::Probe(_))));
        // A target that failed before is answered with its last error while the room is full.
        let one = Health::new(1);
        let Admission::Probe(p) = one.admit(&target("ns", 1), now) else {
            panic!("first");
        };
        p.done(Err("refused".into()), now);
        let later = now + Duration::from_secs(5);
        let busy = one.admit(&target("ns", 2), later);
        assert!(matches!(busy, Admission::Probe(_)), "room for one");
        assert!(matches!(
            one.admit(&target("ns", 1), later),
            Admission::Failing { error, .. } if error == "refused"
        ));
        drop(busy);
        // A probe dropped unfinished (a cancelled reconcile) frees its room.
        drop(a);
        assert!(matches!(
            h.admit(&target("bad", 3), now),
            Admission::Probe(_)
        ));
        drop(b);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_target_waiting_for_room_is_looked_at_after_its_backoff_not_sooner() {
        // One probe at a time in the namespace; target 1 has failed once (a 1 s backoff).
        let h = Health::new(1);
        let Admission::Probe(p) = h.admit(&target("bad", 1), Instant::now()) else {
            panic!("a new target is probed");
        };
        let now = p
            .done(Err("timed out".into()), Instant::now())
            .expect("a failure has a retry time");
        // Its backoff has passed, but another target holds the namespace's one probe: its
        // SingletonJobs keep the last error and wait the longest backoff, not BUSY_RETRY (nor
        // its own 1 s, which cannot grow while it is not probed), so a namespace of them does
        // not reconcile many times a second while its probes queue.
        let Admission::Probe(other) = h.admit(&target("bad", 2), now) else {
            panic!("room for one");
        };
        match h.admit(&target("bad", 1), now) {
            Admission::Failing { retry_at, .. } => assert_eq!(retry_at, now + MAX_BACKOFF),
            other => panic!("waiting for room: {other:?}"),
        }
        drop(other);
    }

    #[tokio::test(start_paused = true)]
    async fn a_singletonjob_waiting_for_its_backstop_is_hushed_until_then_unless_changed() {
        let h = Health::default();
        let now = Instant::now();
        let until = now + Duration::from_secs(30);
        assert_eq!(h.is_hushed("uid", 7, now), None, "nothing recorded");
        h.hush("uid", 7, until);
        assert_eq!(h.is_hushed("uid", 7, now), Some(until));
        assert_eq!(h.is_hushed("other", 7, now), None);
        // A change a user made (a new generation, an operation asked for) is looked at now.
        assert_eq!(h.is_hushed("uid", 8, now), None);
        assert_eq!(h.is_hushed("uid", 7, now), None, "and the memory is gone");
        // Past its time, it is reconciled as usual.
        h.hush("uid", 7, until);
        assert_eq!(h.is_hushed("uid", 7, until), None);
        h.hush("uid", 7, until);
        h.forget("uid");
        assert_eq!(h.is_hushed("uid", 7, now), None);
    }
}
